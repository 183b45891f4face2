// Storage types of the CPU backend: float16, bfloat16 and float8_e4m3 <-> float32 conversion
// (round to nearest even), and row/tile copies between the caller's tensors and float32 scratch.
//
// The widening conversions are branch-free so that loops over them vectorise; they are
// always_inline so that inside an ISA-specific kernel they compile for that ISA.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>

#include "cpu/simd.h"
#include "flashattn/types.h"

namespace flashattn::cpu {

FLASHATTN_CPU_INLINE uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
FLASHATTN_CPU_INLINE float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// IEEE binary16 -> float32, exact for every input (subnormals, infinities, NaN payloads).
FLASHATTN_CPU_INLINE float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;  // exponent and mantissa
  // Normal: move the fields into place and re-bias the exponent by 127 - 15 = 112.
  const uint32_t normal = (em << 13) + (112u << 23);
  // Subnormal (exponent 0): the value is mantissa * 2^-24, exact in float32.
  const uint32_t subnormal = float_bits(static_cast<float>(em) * 0x1p-24f);
  // Infinity / NaN (exponent 31): float exponent all ones, mantissa carried over.
  const uint32_t special = (em << 13) | 0x7f800000u;
  const uint32_t mag = em < 0x0400u ? subnormal : (em >= 0x7c00u ? special : normal);
  return bits_float(sign | mag);
}

// The magnitude bits of finite |f| (float32 bits `a`, below the format's overflow threshold) in
// a narrower IEEE-like format with kMant mantissa bits and exponent bias kBias, round to nearest
// even. Normal results re-bias the exponent and round away the low 23 - kMant mantissa bits; a
// subnormal result (or zero) rounds |f| * 2^(kBias - 1 + kMant) (exact, below 2^kMant) to an
// integer by adding and subtracting 2^23, and 2^kMant correctly becomes the smallest normal.
template <int kMant, int kBias>
inline uint32_t narrow_magnitude(uint32_t a) {
  constexpr int kShift = 23 - kMant;
  if (a >= (127u - kBias + 1) << 23) {  // >= 2^(1 - bias), the smallest normal
    const uint32_t rebiased = a - ((127u - kBias) << 23);
    return (rebiased + ((1u << (kShift - 1)) - 1u) + ((rebiased >> kShift) & 1u)) >> kShift;
  }
  const float scaled = bits_float(a) * bits_float((127u + kBias - 1 + kMant) << 23);
  return static_cast<uint32_t>((scaled + 0x1p23f) - 0x1p23f);
}

// float32 -> IEEE binary16, round to nearest even; overflow gives infinity, NaN stays NaN.
inline uint16_t float_to_half(float f) {
  const uint32_t x = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) {  // NaN: quiet, keep the top of the payload
    return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x03ffu));
  }
  // 65520 = 0x477ff000 is halfway between the largest half (65504) and 2^16; ties go to the
  // even neighbour, which is infinity.
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  return static_cast<uint16_t>(sign | narrow_magnitude<10, 15>(a));
}

FLASHATTN_CPU_INLINE float bf16_to_float(uint16_t b) {
  return bits_float(static_cast<uint32_t>(b) << 16);
}

// float32 -> bfloat16, round to nearest even; NaN stays (quiet) NaN.
inline uint16_t float_to_bf16(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// float8_e4m3 (OCP E4M3FN: sign, 4 exponent bits biased by 7, 3 mantissa bits; no infinities,
// S.1111.111 is NaN) -> float32, exact for every code. constexpr, so the decode table below is
// built by the compiler.
constexpr float e4m3_to_float(uint8_t x) {
  const uint32_t sign = static_cast<uint32_t>(x & 0x80u) << 24;
  const uint32_t em = x & 0x7fu;  // exponent and mantissa
  // Normal: the mantissa moves to the top of float's 23 bits and the exponent is re-biased by
  // 127 - 7 = 120 (em << 20 carries the exponent into bits 23..26).
  const uint32_t normal = (em << 20) + (120u << 23);
  // Subnormal (exponent 0): the value is mantissa * 2^-9, exact in float32.
  const uint32_t subnormal = std::bit_cast<uint32_t>(static_cast<float>(em) * 0x1p-9f);
  const uint32_t nan = 0x7fc00000u;
  const uint32_t mag = em < 0x08u ? subnormal : (em == 0x7fu ? nan : normal);
  return std::bit_cast<float>(sign | mag);
}

// Every e4m3 code decoded once: loads of FP8 operands are one table lookup per element.
inline constexpr std::array<float, 256> kE4M3ToFloat = [] {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = e4m3_to_float(static_cast<uint8_t>(c));
  return t;
}();

// float32 -> float8_e4m3, round to nearest even, saturating: |f| >= 448 and infinities become
// +-448 (PTX cvt.rn.satfinite, the conversion the CUDA kernels use); NaN stays NaN.
inline uint8_t float_to_e4m3(float f) {
  const uint32_t x = float_bits(f);
  const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);
  if (a >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 448: saturate
  return static_cast<uint8_t>(sign | narrow_magnitude<3, 7>(a));
}

// f rounded to the nearest e4m3 value (as float32), as float_to_e4m3 rounds it.
inline float round_to_e4m3(float f) { return kE4M3ToFloat[float_to_e4m3(f)]; }

// dst[i] = src[i] (src of dtype dt, dst float32), n elements.
FLASHATTN_CPU_INLINE void load_row(DType dt, const void* src, int64_t n, float* __restrict dst) {
  if (dt == DType::kFloat32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  } else if (dt == DType::kFloat16) {
    const uint16_t* __restrict s = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(s[i]);
  } else if (dt == DType::kFloat8E4M3) {
    const uint8_t* __restrict s = static_cast<const uint8_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = kE4M3ToFloat[s[i]];
  } else {
    const uint16_t* __restrict s = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(s[i]);
  }
}

// dst[i] = scale * src[i] converted to dtype dt, n elements.
inline void store_row(DType dt, const float* src, float scale, int64_t n, void* dst) {
  if (dt == DType::kFloat32) {
    float* d = static_cast<float*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = scale * src[i];
  } else if (dt == DType::kFloat16) {
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = float_to_half(scale * src[i]);
  } else if (dt == DType::kFloat8E4M3) {
    uint8_t* d = static_cast<uint8_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = float_to_e4m3(scale * src[i]);
  } else {
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16(scale * src[i]);
  }
}

// Writes n zeros of dtype dt.
inline void zero_row(DType dt, int64_t n, void* dst) {
  std::memset(dst, 0, static_cast<size_t>(n) * static_cast<size_t>(dtype_size(dt)));
}

}  // namespace flashattn::cpu
