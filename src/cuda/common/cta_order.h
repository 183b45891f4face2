// Start order of the CTAs of a causal launch (the forward at every head dim; the backward where
// BwdTile::interleave says so), checked on the host (tests/cpp/test_cta_order.cpp).
//
// The forward's grid is (query blocks of one head, planes), a plane being one (head, batch
// [, split]). Under a causal mask the CTAs of a plane differ in work: the last query block sees
// every key, the first one key block. The kernel takes a plane's blocks heaviest first, but the
// hardware starts CTAs in blockIdx order, plane after plane, so the heaviest CTA of the last
// plane starts when little work is left and runs on alone: at d128, 16k (128 blocks per plane,
// 132 SMs x 2 CTAs) a plane is about 32 block-steps per slot and its heaviest CTA 128.
//
// Planes are therefore interleaved: the CTAs of a group of G planes start as block 0 of each of
// the G planes, then block 1 of each, and so on. With G large enough that a group carries at
// least its heaviest CTA's worth of work per slot (causal_group_planes), the heaviest CTA of the
// last group starts with a group's work still ahead of it.
//
// Measured (H200, bf16, 1k-16k, dev/results/h200-2026-11-29-ab-s10-*.json, against the plain
// order): forward causal +4-10% at d128 and d256 (d256 16k: 0%), 0-4% at d64; non-causal
// unchanged (group 1). An earlier layout whose last group was small lost 2-5% there (ab-s8,
// ab-s9): the last group to start must be a whole one. The backward keeps its CTA's indices in
// shared memory (bwd_kernel.h): causal d128 +1-6%, d64 and d256 none (BwdTile::interleave). The
// Hopper backward's dK/dV kernel computes them in registers (no spills there): causal d128
// +3-4% at 2k/4k, d64 +1-3% (sm90/bwd_kernel.h).
#pragma once

#include "cuda/common/fast_div.h"

#if defined(__CUDACC__)
#define FLASHATTN_CTA_HD __host__ __device__
#else
#define FLASHATTN_CTA_HD
#endif

namespace flashattn::cuda {

struct CtaSlot {
  int block;  // the kernel's block index within its plane (before its own heaviest-first flip)
  unsigned plane;  // blockIdx.y + gridDim.y * blockIdx.z of the unordered grid
};

// CTA `linear` (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)) of a grid of
// `blocks` x `planes` -> its slot when planes are interleaved in groups of `group`. Where
// `group` does not divide `planes`, the one smaller group (planes % group planes) starts first,
// so that the last group to start is a whole one: a small last group leaves its heaviest CTAs
// running alone at the end, which is what the order is for (measured: groups of 5, 5, 5 and 1
// planes made the d128 16k causal forward 4% slower, ab-s8; 3, 3, 3, 3, 3, 1 as much, ab-s9).
// A bijection for every group >= 1; group 1 is the plain order. 32-bit arithmetic (a 64-bit
// division is a subroutine call, which cost the kernels spills): the launchers use group 1
// where blocks * planes reaches 2^31.
// The divisions go through `Div` objects (fast_div.h): the hardware's (PlainDiv) or
// multiply-shift divisors the host built for the launch (FastDiv, sm90/tile_order.h).
// by_first divides by planes % group (unused when that is 0), by_group_blocks by group * blocks.
template <typename Div>
FLASHATTN_CTA_HD inline CtaSlot grouped_cta_slot(unsigned linear, unsigned blocks, unsigned first, unsigned group,
                                                 const Div& by_first, const Div& by_group_blocks, const Div& by_group) {
  if (linear < first * blocks) return {int(by_first.div(linear)), by_first.mod(linear)};
  linear -= first * blocks;
  const unsigned g = by_group_blocks.div(linear);
  const unsigned r = linear - g * group * blocks;
  return {int(by_group.div(r)), first + g * group + by_group.mod(r)};
}

FLASHATTN_CTA_HD inline CtaSlot grouped_cta_slot(unsigned linear, unsigned blocks, unsigned planes, unsigned group) {
  const unsigned first = planes % group;
  return grouped_cta_slot(linear, blocks, first, group, PlainDiv{first}, PlainDiv{group * blocks}, PlainDiv{group});
}

#if defined(__CUDACC__)
// This CTA's slot in a launch whose planes start in groups of `group` (1: blockIdx as it is).
__device__ __forceinline__ CtaSlot this_cta_slot(int group) {
  if (group <= 1) return {int(blockIdx.x), blockIdx.y + gridDim.y * blockIdx.z};
  return grouped_cta_slot(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z), gridDim.x,
                          gridDim.y * gridDim.z, unsigned(group));
}
#endif

// Planes per group for a causal launch of `blocks` blocks per plane on `slots` concurrent CTAs
// (SMs x CTAs per SM): a plane's triangle of work is about blocks * heaviest / 2 block-steps,
// so G planes give each slot G * blocks * heaviest / (2 * slots), at least one heaviest CTA when
// G >= 2 * slots / blocks. 1 when masks do not make the blocks of a plane unequal, and for grids
// of 2^31 CTAs or more.
inline int causal_group_planes(bool causal, int blocks, long long planes, int slots) {
  if (!causal || blocks <= 1 || planes <= 1 || static_cast<long long>(blocks) * planes >= (1LL << 31)) return 1;
  const int g = (2 * slots + blocks - 1) / blocks;
  return g < 1 ? 1 : (g > planes ? static_cast<int>(planes) : g);
}

}  // namespace flashattn::cuda

#undef FLASHATTN_CTA_HD
