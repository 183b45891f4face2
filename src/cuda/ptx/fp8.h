// float8 e4m3 conversions (OCP E4M3FN, docs/SEMANTICS.md "FP8"): the widening of two cache
// elements to the queries' 16-bit type, and the rounding of float32 to e4m3 for the append.
// sm89+ (the H200 included) has both as single cvt instructions; older GPUs (sm80) take
// cuda_fp8.h's software forms, which round identically.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

namespace flashattn::ptx {

// Two e4m3 codes (bits 0..7 = the low element, 8..15 the high) -> f16x2 (low half = the low
// element). Exact for every code: e4m3's 3 mantissa bits and exponents 2^-9..2^8 are all f16
// values (its subnormals become f16 normals); NaN stays NaN.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint16_t x) {
  uint32_t r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(x));
#else
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(x), __NV_E4M3);
  r = uint32_t(h.x) | (uint32_t(h.y) << 16);
#endif
  return r;
}

// Two e4m3 codes -> a 16-bit pair of Element (__half or __nv_bfloat16), exactly (e4m3 values are
// bf16 values too). bf16 goes through f16 and float32: Hopper has no e4m3 -> bf16 conversion,
// and a bit-level re-bias would mishandle zero and e4m3's subnormals.
template <typename Element>
__device__ __forceinline__ uint32_t widen_e4m3x2(uint16_t x) {
  const uint32_t h = e4m3x2_to_f16x2(x);
  if constexpr (std::is_same_v<Element, __half>) {
    return h;
  } else {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);  // exact: f holds an e4m3 value
    return *reinterpret_cast<uint32_t*>(&b);
  }
}

// float32 -> e4m3, round to nearest even, saturating to +-448 (cvt.rn.satfinite; NaN stays
// NaN): bit for bit the CPU backend's float_to_e4m3 (cpu/convert.h) on every finite input and
// infinity.
__device__ __forceinline__ uint8_t float_to_e4m3(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(0.0f), "f"(x));
  return static_cast<uint8_t>(r & 0xffu);
#else
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
#endif
}

}  // namespace flashattn::ptx
