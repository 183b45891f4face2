// The dynamic tile feed of the persistent Hopper kernels' masked launches (the forward's
// FwdTraits::kDynamicTiles, the FP8 forward's, and the fused backward's kPersistent window
// kernels): a CTA's producer takes its next tile from a global counter (atomicAdd) as soon as it
// has issued the last copies of the current one, and hands the index to the reading warps
// through a two-slot ring in shared memory (full: the producer's arrival; empty: one per reading
// warp). Tiles are taken in the launch's tile order, heaviest first, so under a causal mask the
// CTAs balance as the hardware's dispatch of one CTA per tile would, while keeping the persistent
// kernel's overlap of one tile's tail with the next tile's loads.
#pragma once

#include <cstdint>

#include "cuda/ptx/mbarrier.h"

namespace flashattn::cuda::sm90 {

struct TileFeed {
  int* slot;        // [2] in shared memory
  uint64_t* full;   // [2]
  uint64_t* empty;  // [2]
};

__device__ __forceinline__ void publish_tile(const TileFeed& feed, int k, int tile) {
  const int s = k & 1;
  ptx::mbarrier_wait(&feed.empty[s], ((k >> 1) & 1) ^ 1);
  feed.slot[s] = tile;
  ptx::mbarrier_arrive(&feed.full[s]);  // release: the slot's value is visible to the waiters
}

// A shared-memory word the producer rewrites once every reading warp has arrived (lane 0
// arrives): lane 0 alone reads it and redux.sync spreads it, so the reader is the lane whose
// arrival frees the word. redux.sync writes a uniform register: the compiler then keeps what is
// derived from the word (a tile's coordinates, loop bounds, ring counters) on the uniform
// datapath, as it does for blockIdx (a plain shared-memory load moved them, and every descriptor
// of the forward's main loop, to vector registers: 5-10% lost). With every lane reading,
// racecheck reported the producer's next write against the other lanes' reads (their order
// before lane 0's arrival goes only through the redux, which it does not track): 1381 hazards on
// the sparse forward's words, 32 on the dense forward's feed (H200, 2026-12-02,
// dev/results/h200-2026-12-02-san-racecheck-sparse-*.txt, -san-call5-*); lane 0 alone, none.
// Values >= 0.
__device__ __forceinline__ unsigned uniform_word(const int* word, int lane) {
  return __reduce_max_sync(0xffffffffu, lane == 0 ? unsigned(*word) : 0u);
}

__device__ __forceinline__ int take_tile(const TileFeed& feed, int k, int lane) {
  const int s = k & 1;
  ptx::mbarrier_wait(&feed.full[s], (k >> 1) & 1);
  const int tile = int(uniform_word(&feed.slot[s], lane));
  if (lane == 0) ptx::mbarrier_arrive(&feed.empty[s]);
  return tile;
}

}  // namespace flashattn::cuda::sm90
