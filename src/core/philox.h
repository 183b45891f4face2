// Philox4x32-10 counter-based generator and the dropout keep-mask built on it. One header for
// the CPU backend, the CUDA kernels and the tests, so that every backend draws the same mask.
//
// Keep-mask contract (docs/SEMANTICS.md):
//   key     = (lo32(seed), hi32(seed) ^ hi32(offset))
//   counter = (col / 4, row, batch * heads + head, lo32(offset))
//   draw    = philox(counter, key)[col % 4]
//   keep    = draw >= threshold,  threshold = floor(p * 2^32) (saturated)
// Rows and columns are positions inside one sequence (varlen: relative to its start).
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace flashattn {

struct Philox4 {
  uint32_t x, y, z, w;
};

namespace philox_detail {
constexpr uint32_t kMul0 = 0xD2511F53u;
constexpr uint32_t kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1
constexpr int kRounds = 10;

FLASHATTN_HOST_DEVICE void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
#if defined(__CUDA_ARCH__)
  lo = a * b;
  hi = __umulhi(a, b);
#else
  const uint64_t p = static_cast<uint64_t>(a) * b;
  lo = static_cast<uint32_t>(p);
  hi = static_cast<uint32_t>(p >> 32);
#endif
}
}  // namespace philox_detail

// Philox4x32 with 10 rounds (Salmon et al., SC'11).
FLASHATTN_HOST_DEVICE Philox4 philox4x32_10(Philox4 ctr, uint32_t key0, uint32_t key1) {
  using namespace philox_detail;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < kRounds; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kMul0, ctr.x, hi0, lo0);
    mulhilo(kMul1, ctr.z, hi1, lo1);
    ctr = Philox4{hi1 ^ ctr.y ^ key0, lo1, hi0 ^ ctr.w ^ key1, lo0};
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return ctr;
}

// The four draws covering columns [4 * (col / 4), 4 * (col / 4) + 4) of one (batch, head, row).
// The 64-bit offset is split: its low word is the fourth counter word and its high word is
// folded into the second key word, so distinct (seed, offset) pairs give distinct streams.
FLASHATTN_HOST_DEVICE Philox4 dropout_draws(uint64_t seed, uint64_t offset, uint32_t batch_head,
                                            uint32_t row, uint32_t col_group) {
  const Philox4 ctr{col_group, row, batch_head, static_cast<uint32_t>(offset)};
  return philox4x32_10(ctr, static_cast<uint32_t>(seed),
                       static_cast<uint32_t>(seed >> 32) ^ static_cast<uint32_t>(offset >> 32));
}

// threshold = floor(p * 2^32), saturated to 0xFFFFFFFF; keep iff draw >= threshold.
FLASHATTN_HOST_DEVICE uint32_t dropout_threshold(float p) {
  const double t = static_cast<double>(p) * 4294967296.0;
  return t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(t);
}

FLASHATTN_HOST_DEVICE uint32_t philox_word(const Philox4& r, int i) {
  return i == 0 ? r.x : i == 1 ? r.y : i == 2 ? r.z : r.w;
}

// Whether element (row, col) of (batch, head) survives dropout.
FLASHATTN_HOST_DEVICE bool dropout_keep(uint64_t seed, uint64_t offset, uint32_t batch_head,
                                        uint32_t row, uint32_t col, uint32_t threshold) {
  const Philox4 r = dropout_draws(seed, offset, batch_head, row, col >> 2);
  return philox_word(r, static_cast<int>(col & 3u)) >= threshold;
}

}  // namespace flashattn
