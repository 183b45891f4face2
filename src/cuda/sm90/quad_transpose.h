// The butterfly form of the 4 x 4 transpose of 32-bit words across a quad (lanes 4i .. 4i + 3)
// that the Hopper forward's epilogue uses to store O in 16-byte chunks (fwd_kernel.h,
// store_tile) and the backward's dQ conversion to store dQ the same way (bwd_kernel.h). On entry word j of lane t is piece t of chunk j; after the two rounds lane t holds
// chunk t, its pieces in order. Round `bit` (1, then 2) pairs lane t with lane t ^ bit: each
// sends the two words whose index differs from its lane number in that bit and puts what it
// receives in their places, so every select depends on one bit of the lane number (the
// select-based form indexes by (t4 +- r) & 3 and compares per word). Host-device, so that
// tests/cpp/test_sm90_layout.cpp checks the permutation with the rounds played out on the host.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#include <cuda_runtime.h>
#endif

#include "core/host_device.h"

namespace flashattn::cuda::sm90 {

// The words lane t4 sends in round `bit`: those at index j with (j & bit) != (t4 & bit), in
// order of j.
FLASHATTN_HOST_DEVICE void quad_round_send(const uint32_t (&x)[4], int t4, int bit, uint32_t (&send)[2]) {
  const bool high = (t4 & bit) != 0;
  send[0] = high ? x[0] : x[bit];
  send[1] = high ? x[bit == 1 ? 2 : 1] : x[3];
}

// Puts the partner's words (its quad_round_send) in the places of the ones sent.
FLASHATTN_HOST_DEVICE void quad_round_take(uint32_t (&x)[4], int t4, int bit, const uint32_t (&got)[2]) {
  const bool high = (t4 & bit) != 0;
  const int a = bit, b = 3;               // the places a low lane sends from (index bit set)
  const int c = 0, d = bit == 1 ? 2 : 1;  // the places a high lane sends from (index bit clear)
  x[c] = high ? got[0] : x[c];
  x[d] = high ? got[1] : x[d];
  x[a] = high ? x[a] : got[0];
  x[b] = high ? x[b] : got[1];
}

#ifdef __CUDACC__
// A 4 x 4 transpose of 32-bit words across a quad (lanes 4i .. 4i + 3): on entry word j of
// lane t is piece t of chunk j; on return lane t holds chunk t, its pieces in order. The
// butterfly form (the rounds above): two rounds of two xor shuffles whose selects each depend on
// one bit of the lane number. Against the form that indexes by (t4 +- r) & 3 (three shuffles,
// a compare per word and round): d128 kernel 3296 -> 3000 SASS instructions, and on the H200
// (bf16 forward, same process, dev/results/h200-2026-12-02-ab-xor-{base,x}.json) d128 +10/+13%
// at 512, +5.5/+9.6% at 1k, +3/+5% at 2k, +0.5/+1.6% at 16k (unmasked/causal). Every lane of
// the warp must call it (full-mask shuffles).
__device__ __forceinline__ uint4 quad_transpose(const uint32_t (&x)[4], int t4) {
  uint32_t y[4] = {x[0], x[1], x[2], x[3]};
#pragma unroll
  for (int bit = 1; bit <= 2; bit *= 2) {
    uint32_t send[2], got[2];
    quad_round_send(y, t4, bit, send);
    got[0] = __shfl_xor_sync(0xffffffffu, send[0], bit);
    got[1] = __shfl_xor_sync(0xffffffffu, send[1], bit);
    quad_round_take(y, t4, bit, got);
  }
  return make_uint4(y[0], y[1], y[2], y[3]);
}
#endif

}  // namespace flashattn::cuda::sm90
