// 2^x on the FMA units: the exponentials of a softmax split between the special-function unit
// (MUFU.EX2, 16 results per clock per SM on sm90) and the FP32 pipes, which are otherwise idle
// while a warp waits on the MUFU queue (FlashAttention-4 does the same on Blackwell). Used by the
// FP8 Hopper forward, where the exponentials take as long as the tensor-core work
// (fwd8_kernel.h softmax_block8; dev/NOTES.md "FP8 forward on Hopper").
//
// Method: x = j + f with j = round(x) and f in [-1/2, 1/2]; 2^f by a degree-5 polynomial with
// p(0) = 1 exactly; 2^j added to the result's exponent field as an integer.
//  - round(x) without a rounding instruction (FRND runs on the MUFU's own pipe): t = x + 1.5 * 2^23
//    rounds x to the nearest integer in t's low mantissa bits for |x| < 2^22; t - 1.5 * 2^23 and
//    x - that are exact.
//  - the exponent: t's mantissa holds 2^22 + j, so (bits(t) << 23) is j << 23 modulo 2^32 (the
//    2^22 and t's exponent shift out), and bits(p) + (j << 23) multiplies p by 2^j while the
//    result stays normal.
//  - range: x is clamped below at -127, so -inf (a masked score) gives p(0) * 2^-127 with
//    bits(1.0) - (127 << 23) = +0 exactly, as ex2.approx gives; x in (-127, -125.5] gives a value
//    below 2^-125 (a subnormal pattern, not 2^x itself, where ex2.approx.ftz gives 0) that no
//    caller can tell from zero: the FP8 softmax's largest P of a row is above 2^7. Above, the
//    result is 2^x within the polynomial's error for x < 128.
// Error: the coefficients are a relative-error fit of (2^f - 1) / f on [-1/2, 1/2] (p(0) fixed
// at 1); in float32 Horner form the relative error is below 2^-22 over the whole range, the
// same as ex2.approx.f32's (the PTX ISA's bound, 2^-22.5 on its normal range); checked on the
// host against std::exp2 by tests/cpp/test_fp8_sm90_layout.cpp (Exp2Fma).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace flashattn::cuda {

FLASHATTN_HOST_DEVICE uint32_t float_bits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}

FLASHATTN_HOST_DEVICE float bits_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

// Exact float32 additions (no contraction into an FMA, no reassociation) on either side.
FLASHATTN_HOST_DEVICE float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  volatile float s = a + b;
  return s;
#endif
}

FLASHATTN_HOST_DEVICE float exp2_fma(float x) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  x = x > -127.0f ? x : -127.0f;         // also -inf (and NaN) to -127
  const float t = add_rn(x, kRound);
  const float f = add_rn(x, -add_rn(t, -kRound));
  float p = 1.326472731e-03f;
  p = fmaf(p, f, 9.671512991e-03f);
  p = fmaf(p, f, 5.550733581e-02f);
  p = fmaf(p, f, 2.402224243e-01f);
  p = fmaf(p, f, 6.931470037e-01f);
  p = fmaf(p, f, 1.0f);
  return bits_float(float_bits(p) + (float_bits(t) << 23));
}

}  // namespace flashattn::cuda
