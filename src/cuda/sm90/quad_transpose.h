// The butterfly form of the 4 x 4 transpose of 32-bit words across a quad (lanes 4i .. 4i + 3)
// that the Hopper forward's epilogue uses to store O in 16-byte chunks (fwd_kernel.h,
// store_tile). On entry word j of lane t is piece t of chunk j; after the two rounds lane t holds
// chunk t, its pieces in order. Round `bit` (1, then 2) pairs lane t with lane t ^ bit: each
// sends the two words whose index differs from its lane number in that bit and puts what it
// receives in their places, so every select depends on one bit of the lane number (the
// select-based form indexes by (t4 +- r) & 3 and compares per word). Host-device, so that
// tests/cpp/test_sm90_layout.cpp checks the permutation with the rounds played out on the host.
#pragma once

#include <cstdint>

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

}  // namespace flashattn::cuda::sm90
