// The order in which the persistent Hopper backward (bwd_kernel.h, bwd_kv_kernel with
// BwdTraitsBody::kPersistent) visits its tiles (key block, plane), a plane being one (kv head,
// split, batch) as in the one-CTA-per-tile launch, and which of them each CTA takes. Checked on
// the host (tests/cpp/test_bwd_tile_order.cpp).
//
// Tile t is the slot that CTA t of the one-CTA-per-tile launch has (cta_order.h's
// grouped_cta_slot over blocks x planes, in groups of `group` planes: 1 without a causal mask):
// under a causal mask the heaviest key blocks (block 0 sees every query block) of a group of
// planes come first and the planes of a group alternate, so the tiles in flight at once share
// few planes' Q and dO in L2, as in that launch. CTA `cta` of `ctas` takes tile cta_tile(r, cta,
// ctas) in round r, rounds alternating direction as the persistent forward's (tile_order.h): the
// CTA that took one of a round's heaviest tiles takes one of the next round's lightest.
#pragma once

#include "cuda/common/cta_order.h"

#if defined(__CUDACC__)
#define FLASHATTN_BWD_TILE_HD __host__ __device__
#else
#define FLASHATTN_BWD_TILE_HD
#endif

namespace flashattn::cuda::sm90 {

struct BwdTileCoord {
  int n_block;   // key block within the plane
  int kv_head;
  int split;     // chunk of the kv head's query heads (kv_splits)
  int batch;
};

struct BwdTileOrder {
  int tiles;     // blocks * planes (< 2^31: the launcher checks)
  int blocks;    // key blocks per plane (of the longest sequence)
  int planes_y;  // heads_k * kv_splits (the one-CTA-per-tile grid's gridDim.y)
  int planes;    // planes_y * batch
  int group;     // planes per group (cta_group_planes)
  int kv_splits;

  FLASHATTN_BWD_TILE_HD BwdTileCoord at(int t) const {
    const CtaSlot s = grouped_cta_slot(unsigned(t), unsigned(blocks), unsigned(planes), unsigned(group));
    const int y = int(s.plane % unsigned(planes_y));
    return {s.block, y / kv_splits, y % kv_splits, int(s.plane / unsigned(planes_y))};
  }

  // The tile CTA `cta` of `ctas` takes in round r (>= tiles: none, in this or any later round).
  FLASHATTN_BWD_TILE_HD static int cta_tile(int r, int cta, int ctas) {
    return r * ctas + ((r & 1) ? ctas - 1 - cta : cta);
  }
};

}  // namespace flashattn::cuda::sm90

#undef FLASHATTN_BWD_TILE_HD
