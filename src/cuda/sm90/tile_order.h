// The order in which the persistent Hopper forward visits its tiles (query block, plane), a plane
// being one (head, batch), and which of them each CTA takes.
//
// Planes go in groups of `group`; within a group the heaviest query blocks come first (under a
// causal mask the last block sees every key) and the planes of the group alternate, so the tiles
// in flight at once cover few planes: their K and V stay in L2 (a 16k-key d128 plane holds 8 MB
// of K and V; 132 tiles of 132 different planes would stream 1 GB from memory per wave). The
// grouping is cta_order.h's (the smaller group first, so that the last group is a whole one):
// group 1 without a causal mask, causal_group_planes() with one.
#pragma once

#include <cstdint>

#include "cuda/common/cta_order.h"
#include "cuda/common/fast_div.h"

#if defined(__CUDACC__)
#define FLASHATTN_TILE_HD __host__ __device__
#else
#define FLASHATTN_TILE_HD
#endif

namespace flashattn::cuda::sm90 {

struct TileCoord {
  int m_block;
  int plane;  // head + heads * batch
};

struct TileOrder {
  int tiles;     // m_blocks * planes (< 2^31: the launcher checks)
  int m_blocks;  // query blocks per plane
  int planes;
  int group;     // planes per group
  int first;     // planes % group: the smaller group, which starts first (cta_order.h)
  // The divisions of at() and head_batch() as multiply-shifts (fast_div.h): by first (1 when
  // first is 0: unused then), group * m_blocks, group, and the heads of a plane's (head, batch).
  // Against the hardware's divisions, H200 bf16 forward: +3-4% at d64 512-1k (causal 1k 0.86 ->
  // 0.89x cuDNN), +1-2% at d128 512, the rest within noise (dev/results/
  // h200-2026-12-04-s32-fastdiv-ab-a207ccf.json).
  FastDiv by_first, by_group_blocks, by_group, by_heads;

  TileOrder() = default;
  // Host: m_blocks, planes, group >= 1 with tiles = m_blocks * planes < 2^31; heads divides planes.
  TileOrder(int tiles_, int m_blocks_, int planes_, int group_, int heads)
      : tiles(tiles_), m_blocks(m_blocks_), planes(planes_), group(group_), first(planes_ % group_),
        by_first(uint32_t(first == 0 ? 1 : first)), by_group_blocks(uint32_t(group_) * uint32_t(m_blocks_)),
        by_group(uint32_t(group_)), by_heads(uint32_t(heads)) {}

  FLASHATTN_TILE_HD TileCoord at(int t) const {
    const CtaSlot s = grouped_cta_slot(unsigned(t), unsigned(m_blocks), unsigned(first), unsigned(group), by_first,
                                       by_group_blocks, by_group);
    return {m_blocks - 1 - s.block, int(s.plane)};
  }

  // A plane's head and batch (plane = head + heads * batch).
  FLASHATTN_TILE_HD void head_batch(int plane, int* head, int* batch) const {
    const uint32_t b = by_heads.div(uint32_t(plane));
    *batch = int(b);
    *head = plane - int(b * by_heads.divisor);
  }

  // The tile CTA `cta` of `ctas` takes in round r (>= tiles: none, in this or any later round).
  // Rounds alternate direction (r even: cta, r odd: ctas - 1 - cta), so a CTA that took one of
  // the heaviest tiles of a round takes one of the lightest of the next (varlen batches; masked
  // launches take tiles from the dynamic feed instead, fwd_kernel.h). Under a causal mask the
  // plain stride had given CTA 0 the heaviest tile of every round: 532 against 660 TFLOP/s at
  // d128 16k; alternating, 571 (dev/results/h200-2026-12-01-ab-sm90{b,c}-*.json).
  FLASHATTN_TILE_HD int cta_tile(int r, int cta, int ctas) const {
    return r * ctas + ((r & 1) ? ctas - 1 - cta : cta);
  }
};

}  // namespace flashattn::cuda::sm90

#undef FLASHATTN_TILE_HD
