// 2^x on the FMA units, for kernels bound by the special-function unit's throughput (one ex2
// per 8 cycles per warp scheduler). Host-side too: tests/cpp/test_sm90_layout.cpp checks it
// against exp2 in double.
#pragma once

#include <bit>
#include <cstdint>

#if defined(__CUDACC__)
#define FLASHATTN_EXP2_HD __host__ __device__
#else
#define FLASHATTN_EXP2_HD
#endif

namespace flashattn::ptx {

// x = n + f with n = round(x) taken from the low mantissa bits of x + 1.5 * 2^23 and f in
// [-0.5, 0.5]; 2^f by a degree-5 polynomial with constant term 1, so integers are exact
// (coefficients fitted for relative error by iteratively reweighted least squares: 2.1e-7 in
// float32 Horner form, ex2.approx's 2 ulp); then n is added to the exponent bits. x below -126 (and -inf) gives +0, as ex2.approx.ftz
// does for -inf; valid up to x = 127 (the kernels' x is at most 8). 12 instructions on the FMA
// and integer pipes where ex2.approx is one MUFU.EX2.
FLASHATTN_EXP2_HD inline float exp2_fma(float x) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  const float t = x + kRound;
  const float f = x - (t - kRound);
  float p = 1.32647110e-3f;
  p = fmaf(p, f, 9.67150740e-3f);
  p = fmaf(p, f, 5.55073358e-2f);
  p = fmaf(p, f, 2.40222424e-1f);
  p = fmaf(p, f, 6.93147004e-1f);
  p = fmaf(p, f, 1.0f);
  const uint32_t bits = std::bit_cast<uint32_t>(p) + (std::bit_cast<uint32_t>(t) << 23);
  return x < -126.0f ? 0.0f : std::bit_cast<float>(bits);
}

}  // namespace flashattn::ptx

#undef FLASHATTN_EXP2_HD
