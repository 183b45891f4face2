// The shared-memory layouts of src/cuda/common/smem_layout.h, checked on the host: the swizzle
// is a permutation of each row's 16-byte chunks, ldmatrix reads stay free of bank conflicts,
// a row's cp.async copy fills whole 128-byte lines, and the one-register-plus-immediate address
// steps (advance) land where offset() says, for every step the kernels take.
#include <gtest/gtest.h>

#include <cstdint>
#include <algorithm>
#include <set>
#include <vector>

#include "cuda/common/smem_layout.h"
#include "cuda/mla/mla_traits.h"

namespace {

using flashattn::cuda::PaddedRows;
using flashattn::cuda::SwizzledPanels;
using flashattn::cuda::SwizzledRows;
using flashattn::cuda::swizzle_steps_ok;

// ldmatrix lane rows / chunks of kinds A and B (src/cuda/common/warp_gemm.h).
int row_a(int lane) { return lane % 8 + ((lane / 8) % 2) * 8; }
int chunk_a(int lane) { return lane / 16; }
int row_b(int lane) { return lane % 8 + (lane / 16) * 8; }
int chunk_b(int lane) { return (lane / 8) % 2; }

template <typename Layout>
void check_permutation(int rows) {
  constexpr int kChunks = Layout::kStride / 8;
  for (int r = 0; r < rows; ++r) {
    std::set<uint32_t> seen;
    for (int c = 0; c < kChunks; ++c) {
      const uint32_t off = Layout::offset(r, 8 * c);
      EXPECT_EQ(off % 16, 0u);
      EXPECT_GE(off, uint32_t(r * Layout::kRowBytes)) << "row " << r << " chunk " << c;
      EXPECT_LT(off, uint32_t((r + 1) * Layout::kRowBytes)) << "row " << r << " chunk " << c;
      seen.insert(off);
      for (int e = 0; e < 8; ++e) EXPECT_EQ(Layout::offset(r, 8 * c + e), off + 2 * e);
    }
    EXPECT_EQ(int(seen.size()), kChunks) << "row " << r;
  }
}

// An 8x8 ldmatrix phase: eight rows at one logical chunk must use eight distinct 16-byte bank
// groups (address / 16 mod 8).
template <typename Layout>
void check_ldmatrix_banks() {
  constexpr int kChunks = Layout::kStride / 8;
  for (int r0 = 0; r0 < 64; r0 += 8) {
    for (int c = 0; c < kChunks; ++c) {
      std::set<uint32_t> groups;
      for (int i = 0; i < 8; ++i) groups.insert((Layout::offset(r0 + i, 8 * c) / 16) % 8);
      EXPECT_EQ(groups.size(), 8u) << "rows " << r0 << ".. chunk " << c;
    }
  }
}

TEST(SmemLayout, SwizzleIsAPermutationOfEachRow) {
  check_permutation<SwizzledRows<64>>(32);
  check_permutation<SwizzledRows<128>>(32);
  check_permutation<SwizzledRows<256>>(32);
  check_permutation<SwizzledRows<576>>(32);
}

TEST(SmemLayout, LdmatrixIsConflictFreeInBothLayouts) {
  check_ldmatrix_banks<SwizzledRows<64>>();
  check_ldmatrix_banks<SwizzledRows<128>>();
  check_ldmatrix_banks<SwizzledRows<256>>();
  check_ldmatrix_banks<PaddedRows<64 + 8>>();
  check_ldmatrix_banks<PaddedRows<128 + 8>>();
  check_ldmatrix_banks<PaddedRows<256 + 8>>();
}

// Eight threads copy one 128-byte logical segment of a row: swizzled, their 16-byte chunks fill
// exactly one 128-byte line; padded, most rows straddle two (the excess ncu measured).
TEST(SmemLayout, SwizzledCopyGroupsFillWholeLines) {
  using L = SwizzledRows<128>;
  using P = PaddedRows<136>;
  int padded_straddles = 0;
  for (int r = 0; r < 64; ++r) {
    for (int seg = 0; seg < 2; ++seg) {
      std::set<uint32_t> lines, padded_lines;
      for (int i = 0; i < 8; ++i) {
        lines.insert(L::offset(r, 64 * seg + 8 * i) / 128);
        padded_lines.insert(P::offset(r, 64 * seg + 8 * i) / 128);
      }
      EXPECT_EQ(lines.size(), 1u) << "row " << r << " segment " << seg;
      padded_straddles += padded_lines.size() > 1;
    }
  }
  EXPECT_EQ(padded_straddles, 2 * 64 - 2 * 8);  // every row but those 1024 bytes apart
}

// advance(offset(r, c), dr, dc) == offset(r + dr, c + dc) for the lane bases of ldmatrix kinds
// A and B at warp column offsets c0 = w * step and every step the warp products take, whenever
// swizzle_steps_ok accepts (step, warps, span); and the predicate rejects what would break.
template <typename Layout>
bool advance_agrees(int step_chunks, int warps, int span_chunks, int row_steps) {
  for (int w = 0; w < warps; ++w) {
    for (int lane = 0; lane < 32; ++lane) {
      for (int kind = 0; kind < 2; ++kind) {
        const int r = kind == 0 ? row_a(lane) : row_b(lane);
        const int c = 8 * (w * step_chunks + (kind == 0 ? chunk_a(lane) : chunk_b(lane)));
        const uint32_t base = Layout::offset(r, c);
        for (int d = 0; d < span_chunks; d += 2) {
          for (int dr = 0; dr < row_steps; dr += 16) {
            if (Layout::advance(base, dr, 8 * d) != Layout::offset(r + dr, c + 8 * d)) return false;
          }
        }
      }
    }
  }
  return true;
}

TEST(SmemLayout, AdvanceMatchesOffsetWhereverTheTraitsAllowIt) {
  // The backward's uses (BwdTraits): S/dP over the whole row from column 0; dK/dV and dQ with
  // per-warp column offsets. Brute force over plausible tile shapes.
  int accepted = 0, rejected = 0;
  for (int step : {0, 2, 4, 6, 8, 12, 16, 24, 32}) {
    for (int warps : {1, 2, 4, 8}) {
      for (int span : {2, 4, 6, 8, 16, 32}) {
        if (!swizzle_steps_ok(step, warps, span)) {
          ++rejected;
          continue;
        }
        ++accepted;
        EXPECT_TRUE((advance_agrees<SwizzledRows<256>>(step, warps, span, 64)))
            << "step " << step << " warps " << warps << " span " << span;
      }
    }
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 0);
  // A case the predicate must reject: warp columns at chunk 2 with steps of 2 chunks carry.
  EXPECT_FALSE(swizzle_steps_ok(2, 2, 4));
  EXPECT_FALSE((advance_agrees<SwizzledRows<128>>(2, 2, 4, 16)));
  // Padded rows: advance is plain addition, always.
  EXPECT_TRUE((advance_agrees<PaddedRows<136>>(2, 2, 4, 64)));
}

// load_rows (tile_copy.h) steps a thread's swizzled destination by whole passes of rows: a pass
// of 4 rows (d256 with 4 warps) moves the swizzle phase row % 8 by 4, which the copy applies as
// an XOR of chunk bit 2 on top of the row step. Check that against offset() for every start.
TEST(SmemLayout, FourRowCopyPassesStepByXor) {
  using L = SwizzledRows<256>;
  for (int rows_per_pass : {4, 8, 12, 16}) {
    for (int r0 = 0; r0 < rows_per_pass; ++r0) {
      for (int c = 0; c < 32; ++c) {
        for (int p = 0; p < 6; ++p) {
          const uint32_t step = uint32_t(p * rows_per_pass * L::kRowBytes);
          const uint32_t dst = (L::offset(r0, 8 * c) + step) ^ uint32_t(((p * rows_per_pass) & 7) << 4);
          EXPECT_EQ(dst, L::offset(r0 + p * rows_per_pass, 8 * c))
              << "pass " << rows_per_pass << " rows, r0 " << r0 << " chunk " << c << " p " << p;
        }
      }
    }
  }
  // Two-row passes are not an XOR step (rows 2 -> 4 move the phase by a carry): rejected by the
  // copy's static_assert.
  EXPECT_NE(L::offset(2, 0) + 2 * L::kRowBytes, L::offset(4, 0));
}

// The MLA decode kernel (src/cuda/mla/mla_kernel.h) steps its swizzled addresses with advance():
// every (lane base, step) it takes must land where offset() says. Q and K rows are 576 wide, P
// 64, a separate V 512; 8 warps.
// K is the K tile's layout (and the latent V's): SwizzledRows<576>, or with the copy engine
// (MlaTraits::kTma) SwizzledPanels<576, 64>; Q keeps SwizzledRows<576>.
template <typename K>
void check_mla_address_steps() {
  using Q = SwizzledRows<576>;
  using V = SwizzledRows<512>;
  using P = SwizzledRows<64>;
  for (int lane = 0; lane < 32; ++lane) {
    for (int kk2 = 0; kk2 < 576 / 32; ++kk2) {
      // Q, A of S (kind A), two k steps per iteration: columns 32 kk2 and 32 kk2 + 16.
      for (int half : {0, 16}) {
        const uint32_t base = Q::offset(row_a(lane), 8 * chunk_a(lane));
        EXPECT_EQ(Q::advance(base, 0, 32 * kk2 + half), Q::offset(row_a(lane), 8 * chunk_a(lane) + 32 * kk2 + half));
      }
      // K, B of S: warp w's keys 8 w + lane % 8, chunk lane / 8 of each 32-column step.
      for (int warp = 0; warp < 8; ++warp) {
        const int r = 8 * warp + lane % 8, c = 8 * (lane / 8);
        EXPECT_EQ(K::advance(K::offset(r, c), 0, 32 * kk2), K::offset(r, c + 32 * kk2));
      }
    }
    // S by depth (MlaTraits::kSplitDepth): warp (key group kg, depth part dq) reads Q (kind A)
    // and its 32 keys of K (kind B, two 16-key halves) at k steps dq + 4 i: 64 i columns on.
    for (int dq = 0; dq < 4; ++dq) {
      for (int i = 0; i < 9; ++i) {
        const int qc = 16 * dq + 8 * chunk_a(lane);
        for (int mt = 0; mt < 2; ++mt) {  // 16- and 32-row blocks
          EXPECT_EQ(Q::advance(Q::offset(row_a(lane), qc), 16 * mt, 64 * i),
                    Q::offset(row_a(lane) + 16 * mt, qc + 64 * i));
        }
        for (int kg = 0; kg < 2; ++kg) {
          const int kr = 32 * kg + row_b(lane), kc = 16 * dq + 8 * chunk_b(lane);
          for (int np = 0; np < 2; ++np) {
            EXPECT_EQ(K::advance(K::offset(kr, kc), 16 * np, 64 * i), K::offset(kr + 16 * np, kc + 64 * i));
          }
        }
      }
    }
    // P, A of O (kind A), 4 k steps of 16 keys.
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t base = P::offset(row_a(lane), 8 * chunk_a(lane));
      for (int mt = 0; mt < 2; ++mt) {
        EXPECT_EQ(P::advance(base, 16 * mt, 16 * kk), P::offset(row_a(lane) + 16 * mt, 8 * chunk_a(lane) + 16 * kk));
      }
    }
    // V, B of O read transposed (kind A): warp w's 64 columns, 16-key steps, pairs of 8 columns.
    for (int warp = 0; warp < 8; ++warp) {
      const int r = row_a(lane), c = 64 * warp + 8 * chunk_a(lane);
      for (int kk = 0; kk < 4; ++kk) {
        for (int nt = 0; nt < 8; nt += 2) {
          EXPECT_EQ(K::advance(K::offset(r, c), 16 * kk, 8 * nt), K::offset(r + 16 * kk, c + 8 * nt));
          EXPECT_EQ(V::advance(V::offset(r, c), 16 * kk, 8 * nt), V::offset(r + 16 * kk, c + 8 * nt));
        }
      }
    }
  }
  // The cache copy: thread tid writes row tid / 4, chunks tid % 4 + 4 i.
  for (int tid = 0; tid < 256; ++tid) {
    for (int i = 0; i < 576 / 32; ++i) {
      EXPECT_EQ(K::advance(K::offset(tid / 4, 8 * (tid % 4)), 0, 32 * i), K::offset(tid / 4, 8 * (tid % 4 + 4 * i)));
    }
    for (int i = 0; i < 512 / 32; ++i) {
      EXPECT_EQ(V::advance(V::offset(tid / 4, 8 * (tid % 4)), 0, 32 * i), V::offset(tid / 4, 8 * (tid % 4 + 4 * i)));
    }
  }
}

TEST(SmemLayout, MlaDecodeAddressSteps) { check_mla_address_steps<SwizzledRows<576>>(); }
TEST(SmemLayout, MlaDecodeAddressStepsTmaPanels) { check_mla_address_steps<SwizzledPanels<576, 64>>(); }

// SwizzledPanels is where the copy engine puts boxes of 64 columns x 64 rows under the 128-byte
// swizzle, box p at p x 8 KB (1024-byte aligned): byte b of row r of the box at r x 128 + (b / 16
// ^ r % 8) x 16 + b % 16 (the CU_TENSOR_MAP_SWIZZLE_128B pattern: address bits 4-6 XOR bits 7-9).
TEST(SmemLayout, SwizzledPanelsAreTheCopyEnginesBoxes) {
  using L = SwizzledPanels<576, 64>;
  for (int r = 0; r < 64; ++r) {
    for (int c = 0; c < 576; ++c) {
      const uint32_t linear = uint32_t((c / 64) * 8192 + r * 128 + (c % 64) * 2);  // box p, unswizzled
      const uint32_t swizzled = linear ^ (((linear >> 7) & 7) << 4);
      ASSERT_EQ(L::offset(r, c), swizzled) << "row " << r << " column " << c;
    }
  }
}

// The MLA decode kernel's shared-memory map (src/cuda/mla/mla_traits.h), for every instantiation
// mla_launch.h picks: each region inside kSmemBytes and apart from the others, every byte an
// operand read or a tile copy touches inside its own region, and the latent cache's V (the K
// tile's first 512 columns) read from the K tile of the same stage. The first GPU run
// (2026-12-01) read the latent V one K tile further on (s * kStageBytes + kKBytes): the next
// stage, which the copy of tile j + 1 was filling (racecheck), or for the last stage Q, P, the
// statistics and the S partials, past kSmemBytes for 16-row blocks (illegal address).
template <typename T>
void check_mla_smem_map(const char* name) {
  SCOPED_TRACE(name);
  using QK = typename T::QKLayout;
  using K = typename T::KLayout;
  using V = typename T::VLayout;
  using P = typename T::PLayout;
  // Regions in order, each ending where the next starts.
  EXPECT_EQ(T::k_stage_offset(0), 0);
  EXPECT_EQ(T::kQOffset, T::k_stage_offset(T::kStages));
  EXPECT_EQ(T::kPOffset, T::kQOffset + T::kQBytes);
  EXPECT_EQ(T::kStatOffset, T::kPOffset + T::kPBytes);
  EXPECT_EQ(T::kSOffset, T::kStatOffset + T::kStatBytes);
  EXPECT_EQ(T::kBarOffset, T::kSOffset + T::kSBytes);
  EXPECT_EQ(T::kSmemUsed, T::kBarOffset + T::kBarBytes);
  EXPECT_EQ(T::kSmemBytes, T::kSmemUsed + (T::kTma ? 1024 : 0)) << "kTma: the 1024-byte alignment's slack";
  EXPECT_LE(T::kSmemBytes, 227 * 1024) << "sm90's opt-in shared memory per block";
  if (T::kTma) {
    EXPECT_EQ(T::kBarBytes, 8 * T::kStages);
    for (int s = 0; s < T::kStages; ++s) EXPECT_EQ(T::k_stage_offset(s) % 1024, 0) << "stage " << s;
  }
  for (int s = 0; s < T::kStages; ++s) {
    const int64_t k0 = T::k_stage_offset(s), k1 = k0 + T::kKBytes, stage_end = k0 + T::kStageBytes;
    int64_t k_lo = INT64_MAX, k_hi = -1, v_lo = INT64_MAX, v_hi = -1;
    for (int r = 0; r < T::kBlockN; ++r) {
      for (int c = 0; c < flashattn::cuda::mla::kHeadDim; c += 8) {
        const int64_t a = k0 + K::offset(r, c);
        k_lo = std::min(k_lo, a), k_hi = std::max(k_hi, a + 15);
      }
      for (int c = 0; c < flashattn::cuda::mla::kHeadDimV; c += 8) {
        const int64_t a = T::v_stage_offset(s) + V::offset(r, c);
        v_lo = std::min(v_lo, a), v_hi = std::max(v_hi, a + 15);
        if (!T::kSeparateV) {
          ASSERT_EQ(a, k0 + K::offset(r, c)) << "latent V is K's column " << c << " of row " << r << ", stage " << s;
        }
      }
    }
    EXPECT_EQ(k_lo, k0);
    EXPECT_EQ(k_hi, k1 - 1);
    EXPECT_GE(v_lo, T::kSeparateV ? k1 : k0) << "stage " << s;
    EXPECT_LT(v_hi, T::kSeparateV ? stage_end : k1) << "stage " << s;
  }
  // Q rows and P rows of the block; the S partials (kDepthParts, kBlockM, kSStride floats, keys
  // < kBlockN) and the statistics (2 x kWarps x kBlockM floats).
  EXPECT_EQ(int64_t(QK::offset(T::kBlockM - 1, 576 - 8)) + 16 <= T::kQBytes, true);
  EXPECT_EQ(int64_t(P::offset(T::kBlockM - 1, T::kBlockN - 8)) + 16 <= T::kPBytes, true);
  if (T::kSplitDepth) {
    const int64_t last = ((T::kDepthParts - 1) * T::kBlockM + T::kBlockM - 1) * T::kSStride + T::kBlockN - 1;
    EXPECT_LT(4 * last + 3, T::kSBytes);
  }
  EXPECT_EQ(2 * T::kWarps * T::kBlockM * 4, T::kStatBytes);
  // The 2-stage loop copies tile j + kStages - 1 while it reads tile j: different stages.
  for (int j = 0; j < 8 && T::kStages > 1; ++j) EXPECT_NE((j + T::kStages - 1) % T::kStages, j % T::kStages);
}

TEST(SmemLayout, MlaSmemMap) {
  using flashattn::cuda::mla::MlaTraits;
  using E = uint16_t;  // the map does not depend on which 16-bit type
  check_mla_smem_map<MlaTraits<E, 1, true>>("separate v_cache, 1 stage");
  check_mla_smem_map<MlaTraits<E, 1, false>>("latent, 1 stage (A100)");
  check_mla_smem_map<MlaTraits<E, 2, false>>("latent, 2 stages, 16 rows");
  check_mla_smem_map<MlaTraits<E, 2, false, 32>>("latent, 2 stages, 32 rows");
  check_mla_smem_map<MlaTraits<E, 2, false, 16, true>>("latent by TMA, 2 stages, 16 rows");
  check_mla_smem_map<MlaTraits<E, 2, false, 32, true>>("latent by TMA, 2 stages, 32 rows");
  check_mla_smem_map<MlaTraits<E, 2, false, 16, true, true>>("paged latent by TMA, 16 rows");
  check_mla_smem_map<MlaTraits<E, 2, false, 32, true, true>>("paged latent by TMA, 32 rows");
  // A100 (163 KB opt-in) runs the 1-stage instantiations.
  EXPECT_LE((MlaTraits<E, 1, true>::kSmemBytes), 163 * 1024);
  EXPECT_LE((MlaTraits<E, 1, false>::kSmemBytes), 163 * 1024);
}

// The MLA split combine's walk (mla_combine_kernel, mla_traits.h): warp w's passes k0 = w,
// w + 256, ... and their combine_pass_splits(splits, k0) splits k0 + 8 j merge every split exactly
// once, for every split count the launcher can ask for (up to 65535 / batch).
TEST(SmemLayout, MlaCombineCoversEverySplit) {
  using namespace flashattn::cuda::mla;
  for (int splits = 1; splits <= 2100; ++splits) {
    std::vector<int> seen(splits, 0);
    for (int w = 0; w < kCombineWarps; ++w) {
      for (int k0 = w; k0 < splits; k0 += 32 * kCombineWarps) {
        const int n = combine_pass_splits(splits, k0);
        ASSERT_GT(n, 0);
        ASSERT_LE(n, 32);
        for (int j = 0; j < n; ++j) {
          const int s = k0 + kCombineWarps * j;
          ASSERT_LT(s, splits) << "splits " << splits << " warp " << w;
          ++seen[s];
        }
      }
    }
    for (int s = 0; s < splits; ++s) ASSERT_EQ(seen[s], 1) << "split " << s << " of " << splits;
  }
}

}  // namespace
