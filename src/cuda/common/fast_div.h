// Division by a divisor fixed for a whole launch, as a multiply-high, an add and a shift
// (Granlund and Montgomery's round-up method). The persistent Hopper forward turns each tile's
// index into its coordinates with a few divisions per tile on the uniform datapath; as integer
// divisions (a reciprocal through the float pipe, conversions back, fix-ups) they took ~1000
// cycles per tile on the consumers' critical path at 512-1k rows (H200, dev/fwd_trace.py, s32).
// Host-built (the launcher), device-read; checked on the host (tests/cpp/test_cta_order.cpp).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FLASHATTN_FASTDIV_HD __host__ __device__
#else
#define FLASHATTN_FASTDIV_HD
#endif

namespace flashattn::cuda {

struct FastDiv {
  uint32_t divisor = 1;
  uint32_t mul = 1;    // floor(2^(32 + shift) / divisor) + 1 - 2^32
  uint32_t shift = 0;  // ceil(log2(divisor))

  FastDiv() = default;
  // divisor in [1, 2^31]; the quotients are exact for every n < 2^31.
  explicit FastDiv(uint32_t d) : divisor(d) {
    shift = 0;
    while ((uint64_t(1) << shift) < d) ++shift;
    mul = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d)) / d + 1);
  }

  // n / divisor for n < 2^31 (umulhi(n, mul) <= n, so the sum stays below 2^32).
  FLASHATTN_FASTDIV_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, mul);
#else
    const uint32_t hi = uint32_t((uint64_t(n) * mul) >> 32);
#endif
    return (hi + n) >> shift;
  }
  FLASHATTN_FASTDIV_HD uint32_t mod(uint32_t n) const { return n - div(n) * divisor; }
};

// The same interface over the hardware's division (host code, tests, and the places whose
// divisor is not known to the host).
struct PlainDiv {
  uint32_t divisor = 1;
  FLASHATTN_FASTDIV_HD uint32_t div(uint32_t n) const { return n / divisor; }
  FLASHATTN_FASTDIV_HD uint32_t mod(uint32_t n) const { return n % divisor; }
};

}  // namespace flashattn::cuda

#undef FLASHATTN_FASTDIV_HD
