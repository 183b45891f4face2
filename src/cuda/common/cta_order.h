// Start order of the CTAs of a causal launch, shared by the forward and the main backward kernel
// and checked on the host (tests/cpp/test_cta_order.cpp).
//
// Both kernels' grids are (blocks of one head, planes), a plane being one (head [, split], batch)
// pair. Under a causal mask the CTAs of a plane differ in work: the forward's last query block
// sees every key, its first one key block; the backward's first key block sees every query
// block. The kernels already take a plane's blocks heaviest first. But the hardware starts CTAs
// in blockIdx order, plane after plane, so the heaviest CTA of the last plane starts when
// little work is left and runs on alone: at d128, 16k (128 blocks of 128 rows per plane, 132
// SMs) a plane is about 63 block-steps per SM and its heaviest CTA 128, about 6% of the whole
// run past the rest (8% at 8k, 11% at 4k in the backward).
//
// group_planes planes are therefore interleaved: the CTAs of a group of G planes start as block
// 0 of each of the G planes, then block 1 of each, and so on. With G large enough that a group
// carries at least its heaviest CTA's worth of work per SM (causal_group_planes), the heaviest
// CTA of the last group starts with a group's work still ahead of it. G stays as small as that
// allows, since the L2 then serves G planes' rows (Q, dO, the dQ accumulator) at once.
#pragma once

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
// `blocks` x `planes` -> its slot when planes are interleaved in groups of `group` (the last
// group may be smaller). A bijection for every group >= 1; group 1 is the plain order. 32-bit
// arithmetic (a 64-bit division is a subroutine call, which cost the kernels spills): the
// launchers use group 1 where blocks * planes reaches 2^31.
FLASHATTN_CTA_HD inline CtaSlot grouped_cta_slot(unsigned linear, unsigned blocks, unsigned planes, unsigned group) {
  const unsigned per_group = group * blocks;
  const unsigned g = linear / per_group;
  const unsigned r = linear - g * per_group;
  const unsigned rest = planes - g * group;
  const unsigned size = rest < group ? rest : group;
  return {int(r / size), g * group + r % size};
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
