// Host-side algebra of the Hopper forward (src/cuda/sm90, src/cuda/ptx/smem_desc.h), checked
// without a GPU: the wgmma shared-memory descriptor fields, the persistent tile order (every
// tile visited exactly once, heaviest query blocks first within a group of planes, and every
// tile taken by exactly one CTA over the alternating rounds), and the tiles of fwd_tile.h (every
// instantiated (head_dim, head_dim_v, mask) fits shared memory and registers; 192 / 128 takes the
// largest key block that fits), the butterfly quad transpose of the epilogue (quad_transpose.h),
// the bias and mask tiles' slots (bias_layout.h) and attn_mask packed into bits (mask_bits.h).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/ptx/smem_desc.h"
#include "cuda/sm90/bias_layout.h"
#include "cuda/sm90/fwd_tile.h"
#include "cuda/sm90/mask_bits.h"
#include "cuda/sm90/quad_transpose.h"
#include "cuda/sm90/tile_order.h"

namespace {

using flashattn::ptx::desc_advance;
using flashattn::ptx::smem_desc;
using flashattn::ptx::SmemSwizzle;
using flashattn::cuda::sm90::FwdTile;
using flashattn::cuda::sm90::TileCoord;
using flashattn::cuda::sm90::TileOrder;
namespace sm90 = flashattn::cuda::sm90;

TEST(Sm90QuadTranspose, ButterflyRoundsTransposeTheQuad) {
  // Lane t starts with piece t of chunk j in word j; the two rounds played out on four lanes
  // (each lane's sends taken from the partner t ^ bit) must leave lane t with chunk t in order.
  const auto word = [](int chunk, int piece) { return uint32_t(0x1000u * (chunk + 1) + 0x10u * piece + 7u); };
  uint32_t x[4][4];
  for (int t = 0; t < 4; ++t) {
    for (int j = 0; j < 4; ++j) x[t][j] = word(j, t);
  }
  for (int bit = 1; bit <= 2; bit *= 2) {
    uint32_t sent[4][2];
    for (int t = 0; t < 4; ++t) sm90::quad_round_send(x[t], t, bit, sent[t]);
    for (int t = 0; t < 4; ++t) sm90::quad_round_take(x[t], t, bit, sent[t ^ bit]);
  }
  for (int t = 0; t < 4; ++t) {
    for (int j = 0; j < 4; ++j) EXPECT_EQ(x[t][j], word(t, j)) << "lane " << t << " word " << j;
  }
}

TEST(Sm90Descriptor, FieldsSitWhereThePtxIsaPutsThem) {
  // Start address 0x2400 (bits 0-13, 16-byte units), leading offset 16 (bits 16-29), stride
  // offset 1024 (bits 32-45), 128-byte swizzle (bits 62-63 = 1).
  const uint64_t d = smem_desc(0x2400, 16, 1024, SmemSwizzle::k128B);
  EXPECT_EQ(d & 0x3FFF, 0x2400u >> 4);
  EXPECT_EQ((d >> 16) & 0x3FFF, 1u);
  EXPECT_EQ((d >> 32) & 0x3FFF, 64u);
  EXPECT_EQ((d >> 49) & 0x7, 0u);  // base offset: tiles start on the 1024-byte swizzle period
  EXPECT_EQ(d >> 62, 1u);
  // The MN-major V operand: the leading offset steps one panel of 176 rows of 128 bytes.
  const uint64_t v = smem_desc(0x10000, 176 * 128, 1024, SmemSwizzle::k128B);
  EXPECT_EQ((v >> 16) & 0x3FFF, 176u * 128 / 16);
  // Shared addresses above 16 bits keep their bits 4..17.
  EXPECT_EQ(smem_desc(0x3FFF0, 16, 1024, SmemSwizzle::kNone) & 0x3FFF, 0x3FFFu);
}

TEST(Sm90Descriptor, AdvanceMovesOnlyTheStartAddress) {
  const uint64_t d = smem_desc(0x8000, 16, 1024, SmemSwizzle::k128B);
  for (uint32_t bytes : {32u, 64u, 96u, 2048u, 128u * 176u}) {
    const uint64_t a = desc_advance(d, bytes);
    EXPECT_EQ(a & 0x3FFF, (0x8000u + bytes) >> 4) << bytes;
    EXPECT_EQ(a >> 14, d >> 14) << bytes;  // every other field unchanged
    EXPECT_EQ(a, smem_desc(0x8000 + bytes, 16, 1024, SmemSwizzle::k128B)) << bytes;
  }
}

TEST(Sm90TileOrder, VisitsEveryTileOnceHeaviestFirstInEachGroup) {
  for (int m_blocks : {1, 3, 8, 128}) {
    for (int planes : {1, 2, 7, 32}) {
      for (int group : {1, 2, 3, 33}) {
        const TileOrder order(m_blocks * planes, m_blocks, planes, group, 1);
        std::vector<int> hits(size_t(m_blocks) * planes, 0);
        std::vector<int> last_m(size_t(planes), m_blocks);
        for (int t = 0; t < order.tiles; ++t) {
          const TileCoord c = order.at(t);
          ASSERT_GE(c.m_block, 0);
          ASSERT_LT(c.m_block, m_blocks);
          ASSERT_GE(c.plane, 0);
          ASSERT_LT(c.plane, planes);
          ++hits[size_t(c.plane) * m_blocks + c.m_block];
          // A plane's query blocks come heaviest (last) first.
          ASSERT_LT(c.m_block, last_m[size_t(c.plane)]) << "plane " << c.plane;
          last_m[size_t(c.plane)] = c.m_block;
        }
        for (int h : hits) ASSERT_EQ(h, 1);
      }
    }
  }
}

TEST(Sm90TileOrder, HeadAndBatchOfAPlane) {
  for (int heads : {1, 3, 16, 128}) {
    const int planes = heads * 7;
    const TileOrder order(planes * 4, 4, planes, 1, heads);
    for (int plane = 0; plane < planes; ++plane) {
      int head = -1, batch = -1;
      order.head_batch(plane, &head, &batch);
      ASSERT_EQ(head, plane % heads) << plane;
      ASSERT_EQ(batch, plane / heads) << plane;
    }
  }
}

TEST(Sm90TileOrder, AlternatingRoundsGiveEveryTileToOneCta) {
  for (int tiles : {1, 5, 132, 133, 1000}) {
    for (int ctas : {1, 7, 132}) {
      const TileOrder order(tiles, tiles, 1, 1, 1);
      std::vector<int> hits(size_t(tiles), 0);
      for (int cta = 0; cta < ctas; ++cta) {
        for (int r = 0;; ++r) {
          const int t = order.cta_tile(r, cta, ctas);
          if (t >= tiles) break;
          ++hits[size_t(t)];
        }
      }
      for (int h : hits) ASSERT_EQ(h, 1) << "tiles " << tiles << " ctas " << ctas;
    }
  }
  // Round 1 runs backwards: the CTA that took the first (heaviest) tile takes the round's last.
  const TileOrder order(264, 264, 1, 1, 1);
  EXPECT_EQ(order.cta_tile(0, 0, 132), 0);
  EXPECT_EQ(order.cta_tile(1, 0, 132), 263);
  EXPECT_EQ(order.cta_tile(1, 131, 132), 132);
}

// The (head_dim, head_dim_v) pairs tools/gen_instantiations.py writes sm90 forward kernels for.
constexpr int kFwdPairs[][2] = {{64, 64}, {128, 128}, {192, 192}, {256, 256}, {192, 128}};

// setmaxnreg moves registers only inside what the launch gave the CTA: the __launch_bounds__
// cap (65536 / threads in steps of 8) times its threads, 64512 for 384 threads. Asking for more
// (the FP8 sweep's 32 + 2 x 240 = 65536) leaves a setmaxnreg.inc waiting forever.
TEST(Sm90FwdTile, SetmaxnregPoolIsTheLaunchRegisters) {
  EXPECT_EQ(sm90::setmaxnreg_pool(384, 1), 168 * 384);
  EXPECT_EQ(sm90::setmaxnreg_pool(512, 1), 128 * 512);
  EXPECT_EQ(sm90::setmaxnreg_pool(256, 2), 128 * 256);
  EXPECT_EQ(sm90::setmaxnreg_pool(128, 1), 248 * 128);  // 255 registers at most, in steps of 8
  EXPECT_FALSE(sm90::setmaxnreg_fits(32, 2, 240, 1));
  EXPECT_TRUE(sm90::setmaxnreg_fits(24, 2, 240, 1));
  EXPECT_TRUE(sm90::setmaxnreg_fits(40, 2, 232, 1));
  EXPECT_TRUE(sm90::setmaxnreg_fits(32, 3, 160, 1));
  EXPECT_FALSE(sm90::setmaxnreg_fits(40, 1, 224, 2));
}

TEST(Sm90FwdTile, EveryInstantiatedTileFitsSharedMemoryAndRegisters) {
  for (const auto& pair : kFwdPairs) {
    for (bool windowed : {false, true}) {
      const int d = pair[0], dv = pair[1];
      SCOPED_TRACE(std::to_string(d) + "/" + std::to_string(dv) + (windowed ? " window" : " no mask"));
      const FwdTile t = sm90::fwd_tile(d, dv, windowed);
      EXPECT_EQ(t.block_n % 16, 0) << "P V takes 16 keys per k-step";
      EXPECT_EQ(t.block_n * 128 % 1024, 0) << "K/V panels start on the swizzle period";
      EXPECT_LE(sm90::fwd_smem_bound(t, d, dv), sm90::fwd_smem_limit(t.ctas_per_sm));
      // The accumulators leave at least 32 registers for addresses, row statistics and loop state.
      EXPECT_LE(sm90::fwd_accumulator_regs(t, dv) + 32, sm90::fwd_consumer_regs(t));
      // setmaxnreg: the producer warpgroup and the consumers within the launch's registers.
      EXPECT_TRUE(sm90::setmaxnreg_fits(sm90::fwd_producer_regs(t), t.consumers, sm90::fwd_consumer_regs(t), t.ctas_per_sm));
    }
  }
}

// The block-sparse forward's tiles (FwdSparseTraits): the same limits, and whole tiles inside
// user blocks of 128 x 128 (FlexAttention's default), so that a block mask of those maps to
// clean tiles at every head dim.
TEST(Sm90FwdTile, SparseTilesFitAndDivideBlocksOf128) {
  for (const auto& pair : kFwdPairs) {
    const int d = pair[0], dv = pair[1];
    SCOPED_TRACE(std::to_string(d) + "/" + std::to_string(dv) + " sparse");
    const FwdTile t = sm90::fwd_sparse_tile(d, dv);
    EXPECT_EQ(t.block_n % 16, 0);
    EXPECT_EQ(t.block_n * 128 % 1024, 0);
    EXPECT_LE(sm90::fwd_smem_bound(t, d, dv), sm90::fwd_smem_limit(t.ctas_per_sm));
    EXPECT_LE(sm90::fwd_accumulator_regs(t, dv) + 32, sm90::fwd_consumer_regs(t));
    EXPECT_TRUE(sm90::setmaxnreg_fits(sm90::fwd_producer_regs(t), t.consumers, sm90::fwd_consumer_regs(t), t.ctas_per_sm));
    EXPECT_EQ(128 % (64 * t.consumers), 0) << "query tiles inside 128-row blocks";
    EXPECT_EQ(128 % t.block_n, 0) << "key tiles inside 128-key blocks";
  }
  EXPECT_EQ(sm90::fwd_sparse_tile(128, 128).block_n, 128);
}

// The cache kernel's copies (fwd_kernel.h cache_producer, the plan in fwd_tile.h): over the 128
// producer threads, their block_n / 16 rows and every panel, each 16-byte chunk of a K/V tile is
// copied exactly once; each cp.async of a warp covers four whole 128-byte rows (eight lanes each,
// chunks 0-7 once); and the lane a thread takes its row's cache offset from is in the same warp
// and looks up exactly that row. At the cache kernel's tiles (the sparse ones: 128 keys at d64 /
// d128, 64 at d256).
TEST(Sm90FwdTile, CacheCopiesCoverTheTileOnceInWholeRows) {
  for (int d : {64, 128, 256}) {
    const FwdTile t = sm90::fwd_sparse_tile(d, d);
    const int panels = d / 64, rows_per_group = t.block_n / 16;
    SCOPED_TRACE(std::to_string(d) + " head dim, block_n " + std::to_string(t.block_n));
    ASSERT_EQ(t.block_n % 16, 0);
    ASSERT_LE(t.block_n / 4, 32) << "a warp's rows have a lane each to look them up";
    std::vector<int> copies(static_cast<size_t>(t.block_n) * panels * 8, 0);
    for (int tid = 0; tid < 128; ++tid) {
      const int warp = tid / 32;
      for (int q = 0; q < rows_per_group; ++q) {
        const int row = sm90::cache_copy_row(tid, q), chunk = sm90::cache_copy_chunk(tid);
        ASSERT_GE(row, 0);
        ASSERT_LT(row, t.block_n);
        for (int p = 0; p < panels; ++p) ++copies[(static_cast<size_t>(row) * panels + p) * 8 + chunk];
        const int src = sm90::cache_lookup_lane(tid, q);
        ASSERT_GE(src, 0);
        ASSERT_LT(src, t.block_n / 4) << "only the looking-up lanes hold an offset";
        EXPECT_EQ(sm90::cache_lookup_row(src, warp), row) << "tid " << tid << " q " << q;
      }
    }
    for (size_t i = 0; i < copies.size(); ++i) ASSERT_EQ(copies[i], 1) << "chunk " << i;
    // One warp's cp.async (fixed q and panel): four rows, each row's chunks 0-7 once.
    for (int warp = 0; warp < 4; ++warp) {
      for (int q = 0; q < rows_per_group; ++q) {
        std::vector<int> per_row(static_cast<size_t>(t.block_n), 0);
        for (int lane = 0; lane < 32; ++lane) per_row[sm90::cache_copy_row(32 * warp + lane, q)] |= 1 << sm90::cache_copy_chunk(32 * warp + lane);
        int rows = 0;
        for (int m : per_row) {
          if (m != 0) {
            EXPECT_EQ(m, 0xff);
            ++rows;
          }
        }
        EXPECT_EQ(rows, 4);
      }
    }
  }
}

// A varlen call's tile list (cache_tiles.h) holds every (sequence, query block) pair of the
// sequences the cache kernel takes: those of rows_min rows or more among ragged batches whose
// rows add up to total_q, at every block size and row minimum the launcher may pass, boundary
// lengths (rows_min, rows_min + 1, multiples of block_m) included.
TEST(Sm90FwdTile, CacheTileCapHoldsEveryListedPair) {
  uint64_t state = 12345;
  const auto next = [&](int64_t n) {  // [0, n)
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return int64_t((state >> 33) % uint64_t(n));
  };
  for (int block_m : {64, 128}) {
    for (int rows_min : {0, 1, 13, 64, 128, 129, 300}) {
      for (int trial = 0; trial < 2000; ++trial) {
        const int batch = 1 + int(next(300));
        int64_t total = 0, listed = 0;
        for (int b = 0; b < batch; ++b) {
          const int64_t pick = next(6);
          const int64_t rows = pick == 0   ? rows_min
                               : pick == 1 ? rows_min + 1
                               : pick == 2 ? block_m * (1 + next(8))
                               : pick == 3 ? next(4)
                                           : next(3000);
          total += rows;
          if (rows >= rows_min) listed += (rows + block_m - 1) / block_m;
        }
        ASSERT_LE(listed, sm90::cache_tile_cap(total, batch, block_m, rows_min))
            << "block_m " << block_m << " rows_min " << rows_min << " trial " << trial;
      }
    }
  }
  EXPECT_EQ(sm90::cache_tile_cap(0, 4, 128, 128), 1);
  // The batch bounds the sequences listed: 1000 one-row sequences at rows_min 0, 1000 pairs.
  EXPECT_EQ(sm90::cache_tile_cap(1000, 1000, 128, 0), 1000 / 128 + 1000 + 1);
  EXPECT_EQ(sm90::cache_tile_cap(100000, 3, 128, 0), 100000 / 128 + 3 + 1);
  EXPECT_EQ(sm90::cache_tiles_bytes(3), 32u);
}

// The bias forward (FwdBiasTraits, head dims 64 and 128): the sparse tile plus one 16-bit bias
// slot of block_m x block_n per stage within the 227 KB, whole 64-key panels, and its register
// split (producer 40, two consumers 232) within the 384 threads' pool of 168 each, with room
// for O, S, P and the 32 bias words of a block.
TEST(Sm90FwdTile, BiasTilesFit) {
  for (int d : {64, 128}) {
    SCOPED_TRACE(std::to_string(d) + " bias");
    const FwdTile t = sm90::fwd_sparse_tile(d, d);
    EXPECT_EQ(t.consumers, 2);
    EXPECT_EQ(t.block_n % 64, 0);
    EXPECT_LE(sm90::fwd_smem_bound(t, d, d) + sm90::fwd_bias_bytes(t), sm90::kFwdSmemLimit);
    EXPECT_TRUE(sm90::setmaxnreg_fits(sm90::kFwdBiasProducerRegs, t.consumers, sm90::kFwdBiasConsumerRegs, 1));
    EXPECT_LE(sm90::fwd_accumulator_regs(t, d) + t.block_n / 4 + 32, sm90::kFwdBiasConsumerRegs);
  }
}

// The bias slot played out on the host (sm90/bias_layout.h): the copy engine writes element
// (row r, key j) of a 128 x 128 tile at panel j / 64, byte r * 128 + ((j % 64 / 8) ^ (r % 8)) *
// 16 + (j % 8) * 2 (128-byte swizzle on 1024-byte aligned panels; a row-broadcast bias: row 0
// only, every row reading it); each ldmatrix.x4 step gives lane l the 4-byte word at
// address[8 m + l / 4] + 4 (l % 4) of matrix m, address[i] the one lane i gave. Every consumer
// thread's word 2c + h must be the pair (keys 8c + 2t, 8c + 2t + 1) of its row g + 8h (the S
// accumulator's layout), and the 8 row addresses of a matrix must cover 8 distinct 16-byte bank
// groups (no conflict) or be one address.
TEST(Sm90FwdTile, BiasSlotWordsAreTheAccumulatorPairs) {
  constexpr int kRows = 128, kKeys = 128, kPanelBytes = kRows * 128;
  for (bool broadcast : {false, true}) {
    SCOPED_TRACE(broadcast ? "row broadcast" : "full tile");
    // The element each 16-bit slot position holds, as (row << 16) | key; -1 where nothing is.
    std::vector<int32_t> slot(kKeys / 64 * kPanelBytes / 2, -1);
    for (int r = 0; r < (broadcast ? 1 : kRows); ++r) {
      for (int j = 0; j < kKeys; ++j) {
        const int byte = j / 64 * kPanelBytes + r * 128 + ((j % 64 / 8) ^ (r % 8)) * 16 + (j % 8) * 2;
        slot[static_cast<size_t>(byte / 2)] = (r << 16) | j;
      }
    }
    for (int warp = 0; warp < 8; ++warp) {  // two consumer warpgroups of 4 warps
      const int warp_row0 = warp * 16;
      sm90::BiasLane lanes[32];
      for (int l = 0; l < 32; ++l) lanes[l] = sm90::bias_lane(warp_row0, l, broadcast);
      for (int q = 0; q < kKeys / 16; ++q) {
        uint32_t addr[32];
        for (int l = 0; l < 32; ++l) addr[l] = sm90::bias_step_offset(q, lanes[l], kPanelBytes);
        for (int m = 0; m < 4; ++m) {
          bool distinct = true, same = true;
          for (int i = 0; i < 8; ++i) {
            EXPECT_EQ(addr[8 * m + i] % 16, 0u);
            same = same && addr[8 * m + i] == addr[8 * m];
            for (int i2 = 0; i2 < i; ++i2) distinct = distinct && (addr[8 * m + i] / 16) % 8 != (addr[8 * m + i2] / 16) % 8;
          }
          EXPECT_TRUE(broadcast ? same : distinct) << "warp " << warp << " step " << q << " matrix " << m;
          for (int l = 0; l < 32; ++l) {
            const int g = l / 4, t = l % 4;
            const uint32_t word = addr[8 * m + g] + 4 * t;
            const int word_index = 4 * q + m;  // 2c + h
            const int c = word_index / 2, h = word_index % 2;
            const int row = broadcast ? 0 : warp_row0 + g + 8 * h;
            for (int e = 0; e < 2; ++e) {
              ASSERT_EQ(slot[word / 2 + static_cast<uint32_t>(e)], (row << 16) | (8 * c + 2 * t + e))
                  << "warp " << warp << " lane " << l << " step " << q << " matrix " << m << " element " << e;
            }
          }
        }
      }
    }
  }
}

// The backward's bias slot (sm90/bias_layout.h bias_t_lane_offset): the copy engine writes
// element (query row r, key j) of a 64 x 128 tile as above (panels of 64 rows); ldmatrix.trans
// gives lane l in register m the 4-byte word whose 16-bit halves are column l / 4 of rows
// 2 (l % 4) and 2 (l % 4) + 1 of matrix m, rows at address[8 m + i] (i = 0..7). Every consumer
// thread's pair 4j + m = 2c + h must be (queries 8c + 2t, 8c + 2t + 1; key 64 consumer + 16 warp
// + 8h + g), its S^T accumulator's layout, and a matrix's 8 row addresses must hit 8 distinct
// 16-byte bank groups (or be one address for a row-broadcast bias).
TEST(Sm90BwdBias, BiasSlotWordsAreTheTransposedAccumulatorPairs) {
  constexpr int kRows = 64, kKeys = 128, kPanelBytes = kRows * 128;
  for (bool broadcast : {false, true}) {
    SCOPED_TRACE(broadcast ? "row broadcast" : "full tile");
    std::vector<int32_t> slot(kKeys / 64 * kPanelBytes / 2, -1);  // (row << 16) | key, -1 = empty
    for (int r = 0; r < (broadcast ? 1 : kRows); ++r) {
      for (int j = 0; j < kKeys; ++j) {
        const int byte = j / 64 * kPanelBytes + r * 128 + ((j % 64 / 8) ^ (r % 8)) * 16 + (j % 8) * 2;
        slot[static_cast<size_t>(byte / 2)] = (r << 16) | j;
      }
    }
    for (int consumer = 0; consumer < 2; ++consumer) {
      for (int warp = 0; warp < 4; ++warp) {
        uint32_t lane_off[32];
        for (int l = 0; l < 32; ++l) lane_off[l] = sm90::bias_t_lane_offset(consumer, warp, l, broadcast, kPanelBytes);
        for (int j = 0; j < 4; ++j) {
          for (int m = 0; m < 4; ++m) {
            bool distinct = true, same = true;
            uint32_t addr[8];
            for (int i = 0; i < 8; ++i) {
              addr[i] = lane_off[8 * m + i] + uint32_t(j) * sm90::bias_t_step(broadcast);
              EXPECT_EQ(addr[i] % 16, 0u);
              same = same && addr[i] == addr[0];
              for (int i2 = 0; i2 < i; ++i2) distinct = distinct && (addr[i] / 16) % 8 != (addr[i2] / 16) % 8;
            }
            EXPECT_TRUE(broadcast ? same : distinct) << "consumer " << consumer << " warp " << warp << " step " << j;
            for (int l = 0; l < 32; ++l) {
              const int g = l / 4, t = l % 4;
              const int pair = 4 * j + m, c = pair / 2, h = pair % 2;
              const int key = 64 * consumer + 16 * warp + 8 * h + g;
              for (int e = 0; e < 2; ++e) {
                // Row 2t + e of the matrix, column g: 2 bytes at that row's address + 2 g.
                const uint32_t byte = addr[2 * t + e] + 2 * uint32_t(g);
                const int row = broadcast ? 0 : 8 * c + 2 * t + e;
                ASSERT_EQ(slot[byte / 2], (row << 16) | key)
                    << "consumer " << consumer << " warp " << warp << " lane " << l << " step " << j << " matrix " << m;
              }
            }
          }
        }
      }
    }
  }
}

// attn_mask packed into bits (sm90/mask_bits.h, mask_bits.cu, fwd_kernel.h mask_bits_scores)
// played out on the host: the pack's warps over a mask row of 300 keys (not a multiple of 16 or
// 128; bytes 0, 1, 2 and 255), each lane's 8 bytes per 256 keys, the eight ballots and the words
// lanes 0..7 store (mask_bits_word_of_ballots); then every consumer lane (t = lane % 4) of every
// key block reads word t of its row's group and tests bit (c, e) (mask_bits_keep) for its score
// pair (keys 8c + 2t + e, the S accumulator's s[4c + 2h + e]): it must be the byte's "nonzero"
// exactly, 0 past seqlen_k, and the layout functions must place every key of a group once, in
// the word of the lane that reads it. Fails if the pack's or the consumer's bit index is wrong.
TEST(Sm90FwdTile, MaskBitsWordsAreTheLanesPairs) {
  constexpr int kKeys = 300, kGroups = (kKeys + 127) / 128;
  std::vector<uint8_t> row(kKeys);
  uint32_t x = 12345u;
  for (int j = 0; j < kKeys; ++j) {
    x = x * 1664525u + 1013904223u;
    const uint8_t values[4] = {0, 1, 2, 255};
    row[static_cast<size_t>(j)] = values[(x >> 24) % 4];
  }
  // The pack: two groups a warp step, lane l the 8 bytes at 256 p + 8 l.
  std::vector<uint32_t> words(kGroups * sm90::kMaskBitsGroupWords, 0xdeadbeefu);
  for (int p = 0; p < (kGroups + 1) / 2; ++p) {
    uint32_t ballot[8] = {};
    for (int l = 0; l < 32; ++l) {
      for (int i = 0; i < 8; ++i) {
        const int key = 256 * p + 8 * l + i;
        if (key < kKeys && row[static_cast<size_t>(key)] != 0) ballot[i] |= 1u << l;
      }
    }
    for (int l = 0; l < 8; ++l) {
      const int half = l / 4, t = l % 4, group = 2 * p + half;
      if (group < kGroups) {
        words[static_cast<size_t>(group * 4 + t)] = sm90::mask_bits_word_of_ballots(ballot[2 * t], ballot[2 * t + 1], half);
      }
    }
  }
  // The consumers.
  for (int n = 0; n < kGroups; ++n) {
    for (int l = 0; l < 32; ++l) {
      const int t = l % 4;
      const uint32_t w = words[static_cast<size_t>(n * 4 + t)];
      for (int c = 0; c < 16; ++c) {
        for (int e = 0; e < 2; ++e) {
          const int key = 128 * n + 8 * c + 2 * t + e;
          const bool kept = key < kKeys && row[static_cast<size_t>(key)] != 0;
          ASSERT_EQ(sm90::mask_bits_keep(w, c, e), kept) << "block " << n << " lane " << l << " c " << c << " e " << e;
        }
      }
    }
  }
  // The mask kernel's 64-key blocks (d256): block n reads its group's word, shifted to its half.
  for (int n = 0; n < (kKeys + 63) / 64; ++n) {
    for (int t = 0; t < 4; ++t) {
      const uint32_t w = sm90::mask_bits_block_word(
          words[static_cast<size_t>(sm90::mask_bits_block_group(n, 64) * 4 + t)], n, 64);
      for (int c = 0; c < 8; ++c) {
        for (int e = 0; e < 2; ++e) {
          const int key = 64 * n + 8 * c + 2 * t + e;
          const bool kept = key < kKeys && row[static_cast<size_t>(key)] != 0;
          ASSERT_EQ(sm90::mask_bits_keep(w, c, e), kept) << "64-key block " << n << " t " << t << " c " << c << " e " << e;
        }
      }
    }
  }
  // The layout functions: a bijection of a group's keys onto its 128 bits, each in its reader's word.
  std::vector<int> seen(128, 0);
  for (int t = 0; t < 4; ++t) {
    for (int c = 0; c < 16; ++c) {
      for (int e = 0; e < 2; ++e) {
        const int key = 8 * c + 2 * t + e;
        EXPECT_EQ(sm90::mask_bits_word(key), t);
        EXPECT_EQ(sm90::mask_bits_bit(key), 16 * e + c);
        ++seen[static_cast<size_t>(32 * sm90::mask_bits_word(key) + sm90::mask_bits_bit(key))];
      }
    }
  }
  for (int b = 0; b < 128; ++b) EXPECT_EQ(seen[static_cast<size_t>(b)], 1) << "bit " << b;
}

// The packed mask's extents and strides (mask_bits_shape, mask_bits_strides, mask_bits_row_word):
// the pack writes row (b, h, i) of its own extents (1 where the mask broadcasts) at ((b H + h) R
// + i) groups x 4 words; the kernel finds it from the call's (b, h, i) through the strides (0
// where the mask broadcasts). Both must agree for every broadcast pattern, and the words must
// be exactly the rows' groups.
TEST(Sm90FwdTile, MaskBitsStridesFindThePackedRows) {
  constexpr int kBatch = 3, kHeads = 5, kSeqQ = 7, kSeqK = 300;
  for (int pattern = 0; pattern < 8; ++pattern) {
    flashattn::Broadcast4 m;
    m.batch = (pattern & 1) ? 0 : int64_t(kHeads) * kSeqQ * 304;  // nonzero: varies
    m.head = (pattern & 2) ? 0 : int64_t(kSeqQ) * 304;
    m.row = (pattern & 4) ? 0 : 304;
    m.size[0] = (pattern & 1) ? 1 : kBatch, m.size[1] = (pattern & 2) ? 1 : kHeads, m.size[2] = kSeqQ;
    const sm90::MaskBitsShape s = sm90::mask_bits_shape(m, kSeqQ, kSeqK);
    SCOPED_TRACE("broadcast pattern " + std::to_string(pattern));
    EXPECT_EQ(s.groups, 3);
    EXPECT_EQ(s.batch, (pattern & 1) ? 1 : kBatch);
    EXPECT_EQ(s.heads, (pattern & 2) ? 1 : kHeads);
    EXPECT_EQ(s.rows, (pattern & 4) ? 1 : kSeqQ);
    EXPECT_EQ(s.words(), s.batch * s.heads * s.rows * s.groups * 4);
    const sm90::MaskBits bits = sm90::mask_bits_strides(m, s, nullptr);
    for (int b = 0; b < kBatch; ++b) {
      for (int h = 0; h < kHeads; ++h) {
        for (int i = 0; i < kSeqQ; ++i) {
          const int64_t pb = s.batch == 1 ? 0 : b, ph = s.heads == 1 ? 0 : h, pi = s.rows == 1 ? 0 : i;
          const int64_t packed = ((pb * s.heads + ph) * s.rows + pi) * s.groups * 4;
          for (int t = 0; t < 4; ++t) ASSERT_EQ(sm90::mask_bits_row_word(bits, b, h, i, t), packed + t);
          ASSERT_LT(packed + 4 * (s.groups - 1) + 3, s.words());
        }
      }
    }
  }
}

// The backward's attn_mask read (bwd_kernel.h): the pack's group-major layout, a step's 64 rows of
// one group copied as one block of 1 KB (the producer's bulk copy), two ldmatrix.x4.trans per lane
// (played out here from the lanes' row addresses), or without the copy the 16 halfword loads from
// the packed words, then mask_bits_fold_t: every thread of both consumers must get the keep bit
// of each of its 32 transposed scores, in the first and in a padded last query block, with the
// mask per row and broadcast over the rows. Fails if the layout, the lane offsets, the ldmatrix
// pairing or the fold's bit order is wrong.
TEST(Sm90BwdMask, GroupMajorStepGivesEachLaneItsKeepBits) {
  constexpr int kRows = 70, kKeys = 300, kHeads = 2;
  for (const bool row_broadcast : {false, true}) {
    SCOPED_TRACE(row_broadcast ? "mask broadcast over the rows" : "mask per row");
    const int rows = row_broadcast ? 1 : kRows;
    std::vector<uint8_t> mask(size_t(kHeads) * rows * kKeys);
    uint32_t x = 777u;
    for (uint8_t& m : mask) {
      x = x * 1664525u + 1013904223u;
      m = (x >> 27) % 3 == 0 ? 0 : 1;
    }
    flashattn::Broadcast4 m;
    m.batch = 0;
    m.head = int64_t(rows) * kKeys;
    m.row = row_broadcast ? 0 : kKeys;
    m.size[0] = 1, m.size[1] = kHeads, m.size[2] = rows;
    const sm90::MaskBitsShape s = sm90::mask_bits_shape(m, kRows, kKeys, sm90::MaskBitsOrder::kGroupMajor);
    ASSERT_EQ(s.rows_stored, row_broadcast ? 1 : 128);
    std::vector<uint32_t> words(size_t(s.words()), 0u);
    const sm90::MaskBits bits = sm90::mask_bits_strides(m, s, nullptr);
    // The pack's result (padding rows and keys past kKeys stay 0).
    for (int h = 0; h < kHeads; ++h) {
      for (int i = 0; i < rows; ++i) {
        for (int key = 0; key < kKeys; ++key) {
          if (mask[(size_t(h) * rows + i) * kKeys + key] == 0) continue;
          const int64_t at = sm90::mask_bits_row_word(bits, 0, h, i, sm90::mask_bits_word(key % 128)) +
                             bits.group * (key / 128);
          words[size_t(at)] |= 1u << sm90::mask_bits_bit(key % 128);
        }
      }
    }
    const auto kept = [&](int h, int i, int key) {
      const int r = row_broadcast ? 0 : i;
      return i < kRows && key < kKeys && mask[(size_t(h) * rows + r) * kKeys + key] != 0;
    };
    for (int h = 0; h < kHeads; ++h) {
      for (int m0 = 0; m0 < kRows; m0 += 64) {
        for (int n = 0; n < s.groups; ++n) {
          const int64_t first = sm90::mask_bits_row_word(bits, 0, h, m0, 0) + bits.group * n;
          const int step_rows = row_broadcast ? 1 : 64;
          ASSERT_LE(first + 4 * step_rows, s.words());
          // The bulk copy: 16-byte rows, row r at 16 r, as 16-bit halves.
          std::vector<uint16_t> slot(size_t(step_rows) * 8);
          for (int r = 0; r < step_rows; ++r) {
            for (int t = 0; t < 8; ++t) {
              const uint32_t w = words[size_t(first + 4 * r + t / 2)];
              slot[size_t(r) * 8 + t] = uint16_t(t % 2 == 0 ? w & 0xffffu : w >> 16);
            }
          }
          for (int consumer = 0; consumer < 2; ++consumer) {
            for (int warp = 0; warp < 4; ++warp) {
              for (int lane = 0; lane < 32; ++lane) {
                const int g = lane / 4, t = lane % 4;
                uint32_t from_smem[8], from_global[8];
                for (int j = 0; j < 2; ++j) {
                  for (int i = 0; i < 4; ++i) {
                    // Matrix i of read j: rows given by lanes 8i .. 8i + 7; this lane gets column g
                    // of its rows 2t and 2t + 1.
                    uint32_t v = 0u;
                    for (int e = 0; e < 2; ++e) {
                      const uint32_t addr = sm90::mask_bits_t_lane_offset(8 * i + 2 * t + e, row_broadcast) +
                                            uint32_t(j) * sm90::mask_bits_t_read_step(row_broadcast);
                      ASSERT_EQ(addr % 16, 0u);
                      v |= uint32_t(slot[addr / 2 + size_t(g)]) << (16 * e);
                    }
                    from_smem[4 * j + i] = v;
                  }
                }
                for (int c = 0; c < 8; ++c) {
                  uint32_t v = 0u;
                  for (int e = 0; e < 2; ++e) {
                    const int64_t half = 2 * (first + (8 * c + 2 * t + e) * bits.row) + g;
                    const uint32_t w = words[size_t(half / 2)];
                    v |= (half % 2 == 0 ? w & 0xffffu : w >> 16) << (16 * e);
                  }
                  from_global[c] = v;
                }
                const int hbit0 = 8 * consumer + 2 * warp;
                const uint32_t keep = sm90::mask_bits_fold_t(from_smem, hbit0);
                ASSERT_EQ(sm90::mask_bits_fold_t(from_global, hbit0), keep);
                for (int c = 0; c < 8; ++c) {
                  for (int hh = 0; hh < 2; ++hh) {
                    for (int e = 0; e < 2; ++e) {
                      const int key = 128 * n + 64 * consumer + 16 * warp + g + 8 * hh;
                      const int row = m0 + 8 * c + 2 * t + e;
                      if (row >= kRows) continue;  // past the queries: P is 0 whatever the bit
                      ASSERT_EQ(((keep >> (4 * c + 2 * hh + e)) & 1u) != 0u, kept(h, row, key))
                          << "head " << h << " row " << row << " key " << key << " lane " << lane;
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

// d64's tile for short masked rows (FwdShortRowsTraits): one consumer at three CTAs per SM, so that
// 1024 rows are sixteen whole tiles (the three-consumer tile leaves a 64-row sixth), within each
// CTA's third of the SM's shared memory and registers; 64-key blocks, since 128 keys' accumulators
// do not fit a third of the registers.
TEST(Sm90FwdTile, ShortRowsTileFitsAndDividesTheThreshold) {
  EXPECT_TRUE(sm90::fwd_has_short_rows(64, 64, true));
  const FwdTile t = sm90::fwd_short_rows_tile(64, true);
  EXPECT_EQ(t.consumers, 1);
  EXPECT_EQ(t.ctas_per_sm, 3);
  EXPECT_EQ(t.block_n, 64);
  EXPECT_GT(sm90::fwd_accumulator_regs(FwdTile{1, 128, 2, false, false, 3}, 64), sm90::fwd_consumer_regs(t));
  EXPECT_LT(t.consumers, sm90::fwd_tile(64, 64, true).consumers);
  EXPECT_EQ(sm90::kFwdShortRowsMaxSeqlen % (64 * t.consumers), 0);
  EXPECT_NE(sm90::kFwdShortRowsMaxSeqlen % (64 * sm90::fwd_tile(64, 64, true).consumers), 0);
  // With the shared ones panel (64 keys x 64 columns) and the second Q slot (fwd_traits.h kQSlots).
  const size_t ones = size_t(t.block_n) * 128, q2 = size_t(64 * t.consumers) * 64 * 2 + 16;
  EXPECT_LE(sm90::fwd_smem_bound(t, 64, 64) + ones + q2, sm90::fwd_smem_limit(t.ctas_per_sm));
  EXPECT_LE(sm90::fwd_accumulator_regs(t, 64) + 32, sm90::fwd_consumer_regs(t));
  EXPECT_TRUE(sm90::setmaxnreg_fits(sm90::fwd_producer_regs(t), t.consumers, sm90::fwd_consumer_regs(t), t.ctas_per_sm));
}

// Without a mask d64's short rows keep the three-consumer tile; their kernel differs by the row
// sums on the tensor cores alone (fwd_traits.h kRowSumMma). d128's (masked or not) take the
// masked 128 x 128 tile, whose stages fit a ones panel beside each V (kOnesPerStage) and a second
// Q slot (fwd_traits.h kQSlots): 2 x Q + stages x (K + V + ones).
TEST(Sm90FwdTile, UnmaskedShortRowsTiles) {
  const FwdTile t = sm90::fwd_short_rows_tile(64, false), u = sm90::fwd_tile(64, 64, false);
  EXPECT_TRUE(sm90::fwd_has_short_rows(64, 64, false));
  EXPECT_EQ(t.consumers, u.consumers);
  EXPECT_EQ(t.block_n, u.block_n);
  EXPECT_EQ(t.stages, u.stages);
  EXPECT_EQ(t.cross_tile, u.cross_tile);
  EXPECT_EQ(t.ctas_per_sm, 1);
  EXPECT_TRUE(sm90::fwd_has_short_rows(128, 128, false));
  EXPECT_FALSE(sm90::fwd_has_short_rows(256, 256, false));
  const FwdTile w = sm90::fwd_short_rows_tile(128, false);
  EXPECT_EQ(w.block_n, 128);
  EXPECT_EQ(w.consumers, 2);
  EXPECT_FALSE(w.cross_tile);
  EXPECT_TRUE(sm90::fwd_has_short_rows(128, 128, true));  // masked d128 too (s38)
  EXPECT_FALSE(sm90::fwd_has_short_rows(128, 64, true));
  EXPECT_FALSE(sm90::fwd_has_short_rows(192, 128, true));
  const size_t ones = size_t(w.stages) * w.block_n * 128;    // one 64-column panel per stage
  const size_t q2 = size_t(64 * w.consumers) * 128 * 2 + 16;  // the second Q slot and its barriers
  EXPECT_LE(sm90::fwd_smem_bound(w, 128, 128) + ones + q2, sm90::fwd_smem_limit(w.ctas_per_sm));
  EXPECT_EQ(sm90::fwd_short_rows_max_seqlen(64), sm90::kFwdShortRowsMaxSeqlen);
  EXPECT_EQ(sm90::fwd_short_rows_max_seqlen(128), sm90::kFwdShortRowsMaxSeqlen128);
  EXPECT_EQ(sm90::kFwdShortRowsMaxSeqlen128 % (64 * w.consumers), 0);
}

// d256's short masked rows: 64-key blocks, so that a 128-row tile's diagonal is two whole key
// blocks and 512 / 1024 / 2048 rows are whole blocks; it fits two stages beside Q, and the row sums
// stay on the FMA units (m64n264 would pass wgmma's N of 256). Unmasked d256 keeps 128 x 80.
TEST(Sm90FwdTile, MaskedShortRowsTileAtD256) {
  EXPECT_TRUE(sm90::fwd_has_short_rows(256, 256, true));
  EXPECT_FALSE(sm90::fwd_has_short_rows(256, 256, false));
  EXPECT_FALSE(sm90::fwd_has_short_rows(192, 192, true));
  const FwdTile t = sm90::fwd_short_rows_tile(256, true);
  EXPECT_EQ(t.block_n, 64);
  EXPECT_EQ(t.consumers, 2);
  EXPECT_EQ(t.ctas_per_sm, 1);
  EXPECT_LT(t.block_n, sm90::fwd_tile(256, 256, true).block_n);
  EXPECT_EQ((64 * t.consumers) % t.block_n, 0);
  EXPECT_EQ(sm90::fwd_short_rows_max_seqlen(256), sm90::kFwdShortRowsMaxSeqlen256);
  EXPECT_EQ(sm90::kFwdShortRowsMaxSeqlen256 % t.block_n, 0);
  EXPECT_LE(sm90::fwd_smem_bound(t, 256, 256), sm90::fwd_smem_limit(t.ctas_per_sm));
}

TEST(Sm90FwdTile, HeadDim192V128TakesTheLargestKeyBlockThatFits) {
  for (bool windowed : {false, true}) {
    const FwdTile t = sm90::fwd_tile(192, 128, windowed);
    EXPECT_EQ(t.consumers, 2);
    EXPECT_EQ(t.block_n, 128);
    EXPECT_EQ(t.stages, 2);
    EXPECT_TRUE(t.ping_pong);
    // Q 128 x 192, two stages of K 128 x 192 and V 128 x 128, 16-bit: 48 + 2 x (48 + 32) KB.
    EXPECT_EQ(sm90::fwd_smem_bytes(t, 192, 128, 0, 0), 1024u + 49152u + 2u * (49152u + 32768u));
    // 16 more keys, or a third stage, do not fit.
    EXPECT_GT(sm90::fwd_smem_bytes(FwdTile{2, t.block_n + 16, 2, true}, 192, 128, 0, 0), sm90::kFwdSmemLimit);
    EXPECT_GT(sm90::fwd_smem_bytes(FwdTile{2, t.block_n, 3, true}, 192, 128, 0, 0), sm90::kFwdSmemLimit);
    // O 64 + S 64 + P 32, fewer than the padded d192 tile's O 96 + S 56 + P 28.
    EXPECT_EQ(sm90::fwd_accumulator_regs(t, 128), 160);
    EXPECT_LT(sm90::fwd_accumulator_regs(t, 128), sm90::fwd_accumulator_regs(sm90::fwd_tile(192, 192, windowed), 192));
  }
  // The same-d tiles are those of their head dim, whatever the 192 / 128 entry says.
  EXPECT_EQ(sm90::fwd_tile(192, 192, false).block_n, 112);
  EXPECT_EQ(sm90::fwd_tile(128, 128, false).block_n, 176);
  EXPECT_EQ(sm90::fwd_tile(128, 128, true).block_n, 128);
}

}  // namespace
