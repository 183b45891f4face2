// Tile order of the persistent Hopper backward (src/cuda/sm90/bwd_tile_order.h; bwd_kv_kernel
// with BwdTraitsBody::kPersistent), checked on the host: every tile is taken exactly once over
// the CTAs' rounds, tile t is the slot of CTA t of the one-CTA-per-tile launch (same key block,
// kv head, split and batch as bwd_kv_kernel derives from this_cta_slot), and a work model of the
// static rounds against the hardware's dispatch, which is why masked launches take tiles from a
// dynamic feed instead.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <queue>
#include <vector>

#include "cuda/common/cta_order.h"
#include "cuda/sm90/bwd_tile_order.h"

namespace {

using flashattn::cuda::causal_group_planes;
using flashattn::cuda::CtaSlot;
using flashattn::cuda::grouped_cta_slot;
using flashattn::cuda::sm90::BwdTileCoord;
using flashattn::cuda::sm90::BwdTileOrder;

BwdTileOrder make_order(int blocks, int heads_k, int kv_splits, int batch, int group) {
  BwdTileOrder o;
  o.blocks = blocks;
  o.kv_splits = kv_splits;
  o.planes_y = heads_k * kv_splits;
  o.planes = o.planes_y * batch;
  o.tiles = blocks * o.planes;
  o.group = group;
  return o;
}

TEST(BwdTileOrder, EveryTileOnceOverTheRounds) {
  for (int blocks : {1, 3, 8, 33}) {
    for (int planes_y : {1, 4}) {
      for (int batch : {1, 5}) {
        for (int ctas : {1, 7, 132}) {
          const BwdTileOrder o = make_order(blocks, planes_y, 1, batch, 1);
          const int used = std::min(ctas, o.tiles);  // the launcher's min(tiles, SMs)
          std::vector<int> hits(size_t(o.tiles), 0);
          for (int cta = 0; cta < used; ++cta) {
            for (int r = 0;; ++r) {
              const int t = BwdTileOrder::cta_tile(r, cta, used);
              if (t >= o.tiles) {
                // No later round has a tile for this CTA either (the kernel stops at the first).
                EXPECT_GE(BwdTileOrder::cta_tile(r + 1, cta, used), o.tiles);
                break;
              }
              ASSERT_GE(t, 0);
              ++hits[size_t(t)];
            }
          }
          for (int t = 0; t < o.tiles; ++t) ASSERT_EQ(hits[size_t(t)], 1) << "tile " << t << " ctas " << used;
        }
      }
    }
  }
}

TEST(BwdTileOrder, TileIsTheSlotOfTheOneCtaPerTileLaunch) {
  for (int kv_splits : {1, 2, 4}) {
    for (int group : {1, 2, 3, 7}) {
      const int blocks = 6, heads_k = 3, batch = 4;
      const BwdTileOrder o = make_order(blocks, heads_k, kv_splits, batch, group);
      std::vector<int> seen(size_t(o.tiles), 0);
      for (int t = 0; t < o.tiles; ++t) {
        // bwd_kv_kernel: slot = this_cta_slot(group) of CTA linear t; kv_head = (plane % gridDim.y) /
        // kv_splits, split = (plane % gridDim.y) % kv_splits, batch = plane / gridDim.y.
        const CtaSlot s = grouped_cta_slot(unsigned(t), unsigned(blocks), unsigned(o.planes), unsigned(group));
        const int y = int(s.plane % unsigned(o.planes_y));
        const BwdTileCoord c = o.at(t);
        ASSERT_EQ(c.n_block, s.block);
        ASSERT_EQ(c.kv_head, y / kv_splits);
        ASSERT_EQ(c.split, y % kv_splits);
        ASSERT_EQ(c.batch, int(s.plane / unsigned(o.planes_y)));
        ASSERT_LT(c.kv_head, heads_k);
        ASSERT_LT(c.batch, batch);
        ++seen[size_t(((c.batch * heads_k + c.kv_head) * kv_splits + c.split) * blocks + c.n_block)];
      }
      for (int v : seen) ASSERT_EQ(v, 1);
    }
  }
}

// Work model of bench.py's full suite (batch 16k / n, 2048 / d heads, MHA; 128-key tiles, 64-query
// steps): a tile's work is its step count (causal: key block j sees the query blocks from 2j). The
// largest CTA load over the mean: static rounds (cta_tile) against greedy dispatch in tile order
// (the hardware's one CTA per tile, and the dynamic feed's atomic counter).
struct Balance {
  double static_rounds, greedy;
};

Balance balance(int n, int d, bool causal, int sms = 132) {
  const int batch = 16384 / n, heads = 2048 / d;
  const int blocks = (n + 127) / 128, m_blocks = (n + 63) / 64;
  const int group = causal_group_planes(causal, blocks, static_cast<long long>(heads) * batch, sms);
  const BwdTileOrder o = make_order(blocks, heads, 1, batch, group);
  const auto work = [&](int t) { return double(m_blocks - (causal ? 2 * o.at(t).n_block : 0)); };
  const int ctas = std::min(o.tiles, sms);
  double total = 0;
  for (int t = 0; t < o.tiles; ++t) total += work(t);
  const double mean = total / ctas;
  double worst = 0;
  for (int cta = 0; cta < ctas; ++cta) {
    double load = 0;
    for (int r = 0;; ++r) {
      const int t = BwdTileOrder::cta_tile(r, cta, ctas);
      if (t >= o.tiles) break;
      load += work(t);
    }
    worst = std::max(worst, load);
  }
  std::priority_queue<double, std::vector<double>, std::greater<double>> free_at;
  for (int c = 0; c < ctas; ++c) free_at.push(0.0);
  double greedy = 0;
  for (int t = 0; t < o.tiles; ++t) {
    const double start = free_at.top();
    free_at.pop();
    free_at.push(start + work(t));
    greedy = std::max(greedy, start + work(t));
  }
  return {worst / mean, greedy / mean};
}

TEST(BwdTileOrder, StaticRoundsBalanceUnmaskedButNotCausal) {
  for (int d : {64, 128}) {
    for (int n : {512, 1024, 2048, 4096, 8192, 16384}) {
      const Balance full = balance(n, d, false);
      // Equal tiles: both are the rounding of tiles / CTAs up (16 of 15.5 at d128: 1.03).
      EXPECT_NEAR(full.static_rounds, full.greedy, 1e-9) << "d" << d << " n" << n;
      EXPECT_LT(full.static_rounds, 1.04);
      const Balance causal = balance(n, d, true);
      std::printf("d%d n%5d causal: busiest CTA / mean, static rounds %.3f, greedy %.3f\n", d, n,
                  causal.static_rounds, causal.greedy);
      EXPECT_LT(causal.greedy, 1.03) << "d" << d << " n" << n;
    }
  }
  // The reason for the masked kernels' dynamic feed: static rounds leave the busiest CTA with
  // 18-55% more than the mean at d128 causal 512..4k (printed above).
  EXPECT_GT(balance(512, 128, true).static_rounds, 1.4);
  EXPECT_GT(balance(1024, 128, true).static_rounds, 1.4);
  EXPECT_GT(balance(4096, 128, true).static_rounds, 1.1);
}

}  // namespace
