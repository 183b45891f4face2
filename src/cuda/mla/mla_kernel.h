// MLA decode (DeepSeek-V3 multi-head latent attention) on a KV cache: q/k head dim 576, v head
// dim 512, sm80-class code (mma.sync m16n8k16, ldmatrix, cp.async; it runs on Hopper as well).
//
// One CTA per (row block, KV head, sequence[, key split]). Its rows are the kBlockM rows of the
// (query token t, query head of the KV head's group) space, row = t * group + head_in_group, so
// every query head of a GQA group and every query token share the K/V tiles the CTA reads (with
// one latent KV head, the whole cache is read once per row block). Per tile of kBlockN keys:
//   S = Q K^T         the 8 warps split the tile's keys (8 each, over the full depth 576), or
//                     keys and depth with the partial sums exchanged (MlaTraits::kSplitDepth);
//   softmax           each warp's partial row maxima and sums meet in shared memory, so every
//                     warp holds the same row statistics (same values, same order);
//   O += P V          P goes through shared memory (16-bit, like the other kernels' P), and
//                     each warp owns 64 of O's 512 columns for all rows.
// V is the first 512 columns of the K tile when v_cache aliases k_cache (the shared latent
// cache; MlaTraits::kSeparateV false): those bytes are read once. A separate v_cache gets its
// own tile next to K's.
// K/V tiles stream through kStages shared-memory stages with cp.async: with 2 stages the copy of
// tile j + 1 runs under the products of tile j. Or, MlaTraits::kTma (sm90, a dense latent cache),
// thread 0 has the copy engine bring each K tile (nine 64-column boxes, an mbarrier per stage);
// the rows past the sequence's end in its last tile are then zeroed in shared memory (the copy
// reads whatever the cache holds there, where cp.async's zero fill wrote zeros: a NaN there
// would reach O through P V's 0 x NaN). With splits, each CTA writes float32 partials that
// mla_combine_kernel (below) merges, adding the learnable sink there.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "core/params.h"
#include "core/sink.h"
#include "cuda/common/smem_layout.h"
#include "cuda/mla/mla_traits.h"
#include "cuda/common/warp_gemm.h"
#include "cuda/ptx/cp_async.h"
#include "cuda/ptx/ldmatrix.h"
#include "cuda/ptx/math.h"
#include "cuda/ptx/mma.h"
#include "cuda/ptx/tma.h"
#include "cuda/ptx/warpgroup.h"  // fence_proxy_async_smem

namespace flashattn::cuda::mla {

// Where this thread's cache row of one key tile lives: thread tid copies row tid / 4 of every
// tile (chunks tid % 4 + 4 i), so one page look-up per thread and tile, and a warp's copy
// instruction covers 8 rows x 64 contiguous bytes. Looked up one iteration before the copy
// (paged caches: the block-table read's latency passes under a whole tile's work).
struct TileRow {
  int64_t k_offset = 0;  // elements from the cache's start (head included)
  int64_t v_offset = 0;
  bool valid = false;    // the row exists (< key_end); else zero-filled, never read
};

template <typename Traits>
__device__ __forceinline__ TileRow tile_row(const ForwardParams& p, int b, int hk, int n0, int key_end, int tid) {
  TileRow t;
  const int row = n0 + tid / 4;
  t.valid = row < key_end;
  if (t.valid) {
    t.k_offset = p.kv.row_offset(p.k_strides, b, row) + int64_t(hk) * p.k_strides.head;
    if constexpr (Traits::kSeparateV) t.v_offset = p.kv.row_offset(p.v_strides, b, row) + int64_t(hk) * p.v_strides.head;
  }
  return t;
}

// Copies this thread's chunks of its row (kWidth columns, from element `offset` of `cache`) into
// a tile of Layout.
template <typename Traits, int kWidth, typename Layout>
__device__ __forceinline__ void copy_tile_row(typename Traits::Element* smem, const void* cache, int64_t offset,
                                              bool valid, int tid) {
  static_assert(Traits::kThreads == 4 * Traits::kBlockN, "four threads per row");
  constexpr int kChunks = kWidth / 8;
  const auto* src = static_cast<const char*>(cache) + 2 * offset;
  const int c0 = tid % 4;
  const uint32_t dst0 = Layout::smem_at(smem, tid / 4, 8 * c0);
#pragma unroll
  for (int i = 0; i < kChunks / 4; ++i) {
    ptx::cp_async_16(Layout::advance(dst0, 0, 32 * i), src + 16 * (c0 + 4 * i), valid);
  }
}

// kmap: kTma's map of the cache, (576 columns, capacity rows, heads_k, batch_cache), boxes of 64
// columns x kBlockN rows (mla_launch.h); unused otherwise.
template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    mla_decode_kernel(const __grid_constant__ ForwardParams p, const __grid_constant__ MlaPlan plan,
                      const __grid_constant__ CUtensorMap kmap) {
  using Element = typename Traits::Element;
  using QKLayout = typename Traits::QKLayout;
  using KLayout = typename Traits::KLayout;
  using VLayout = typename Traits::VLayout;
  using PLayout = typename Traits::PLayout;
  // The copy engine's path where the device code has it (a kTma kernel compiled for an older
  // target takes the cp.async path, into the same layout; the host launches kTma kernels on
  // sm90 only).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  constexpr bool kTma = false;
#else
  constexpr bool kTma = Traits::kTma;
#endif
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kMT = Traits::kMTiles;
  constexpr int kRows = 2 * kMT;  // rows per thread: g and g + 8 of each m16 tile
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kStages = Traits::kStages;
  constexpr int kWarps = Traits::kWarps;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // kTma: the map from a 1024-byte boundary (the copy engine's 128-byte swizzle repeats every 8
  // rows of 128 bytes; kSmemBytes has the 1024 bytes of slack).
  unsigned char* const smem = Traits::kTma ? ptx::align_shared<1024>(smem_raw) : smem_raw;
  auto* sQ = reinterpret_cast<Element*>(smem + Traits::kQOffset);     // (kBlockM, 576)
  auto* sP = reinterpret_cast<Element*>(smem + Traits::kPOffset);     // (kBlockM, kBlockN)
  auto* sMax = reinterpret_cast<float*>(smem + Traits::kStatOffset);  // (kWarps, kBlockM)
  float* sSum = sMax + kWarps * kBlockM;                               // (kWarps, kBlockM)
  const auto k_stage = [&](int s) { return reinterpret_cast<Element*>(smem + Traits::k_stage_offset(s)); };
  // The latent cache: V is the K tile's first 512 columns (v_stage(s) == k_stage(s)).
  const auto v_stage = [&](int s) { return reinterpret_cast<Element*>(smem + Traits::v_stage_offset(s)); };

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;  // the mma fragment's row group and column pair
  const int m0 = blockIdx.x * kBlockM;
  const int hk = blockIdx.y;
  const int b = blockIdx.z / p.num_splits, split = blockIdx.z % p.num_splits;
  const KVCacheParams& kv = p.kv;

  // Keys: cache rows [key_first, key_end). Causal: row (t, .) sees keys up to
  // key_end - seqlen_q + t (bottom-right aligned), so the CTA's last row bounds its tiles.
  const int key_first = kv.first(b), key_end = kv.end(b);
  int visible_end = key_end;
  if (p.is_causal) {
    const int t_last = (min(m0 + kBlockM, plan.rows) - 1) / plan.group;
    visible_end = min(key_end, key_end - p.seqlen_q + t_last + 1);
  }
  const int n_tiles = visible_end > key_first ? (visible_end - key_first + kBlockN - 1) / kBlockN : 0;
  const int tile_begin = split * plan.tiles_per_split;
  const int tiles = max(0, min(n_tiles, tile_begin + plan.tiles_per_split) - tile_begin);

  // This thread's rows r = 2 mt + h (CTA row mt * 16 + g + 8 h): query token, query head, last
  // visible key.
  int row_t[kRows], row_head[kRows], row_last_key[kRows];
  bool row_in[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int row = m0 + (r / 2) * 16 + g + 8 * (r % 2);
    row_in[r] = row < plan.rows;
    row_t[r] = row_in[r] ? row / plan.group : 0;
    row_head[r] = hk * plan.group + (row_in[r] ? row % plan.group : 0);
    row_last_key[r] = p.is_causal ? key_end - p.seqlen_q + row_t[r] : key_end - 1;
  }

  // kTma: the stages' "full" barriers, and thread 0's request for tile j's nine boxes (its rows
  // from the split's first key on; rows past the capacity read as zeros).
  [[maybe_unused]] uint64_t* full = reinterpret_cast<uint64_t*>(smem + Traits::kBarOffset);
  // kTmaPaged: the page of tile j (its rows lie in one page: page_size % kBlockN == 0 and the
  // tiles start at row 0 without leftpad, mla_launch.h), clamped as row_offset clamps it.
  const auto page_of = [&](int j) {
    int page = 0;
    if constexpr (Traits::kTmaPaged) {
      const int row = key_first + (tile_begin + j) * kBlockN;
      page = kv.block_table[b * kv.block_table_stride + row / kv.page_size];
      page = page < 0 ? 0 : (page >= kv.num_blocks ? kv.num_blocks - 1 : page);
    }
    return page;
  };
  // page: kTmaPaged's page_of(j), read one tile ahead (its latency off the copy's issue).
  const auto issue_tile = [&](int j, [[maybe_unused]] int page) {
    if constexpr (kTma) {
      const int s = j % kStages;
      // The stage's last generic accesses (ldmatrix reads, the tail's zeros), ordered before this
      // thread by the loop's CTA barrier, before the copy engine's writes.
      ptx::fence_proxy_async_smem();
      ptx::mbarrier_arrive_expect_tx(&full[s], Traits::kKBytes);
      const int row = key_first + (tile_begin + j) * kBlockN;
      // Dense: (row, the sequence's cache batch row); paged: (row within the page, the page).
      const int row_c = Traits::kTmaPaged ? row % kv.page_size : row;
      const int batch_c = Traits::kTmaPaged ? page : kv.cache_batch(b);
#pragma unroll
      for (int panel = 0; panel < kHeadDim / 64; ++panel) {
        ptx::tma_load_4d(reinterpret_cast<unsigned char*>(k_stage(s)) + panel * KLayout::kPanelBytes, &kmap, &full[s],
                         64 * panel, row_c, hk, batch_c);
      }
    }
  };
  [[maybe_unused]] int next_page = 0;  // kTmaPaged, thread 0: the page of the next tile to issue
  if constexpr (kTma) {
    if (tid == 0) {
      for (int st = 0; st < kStages; ++st) ptx::mbarrier_init(&full[st], 1);
      ptx::mbarrier_init_fence();
      for (int j = 0; j < kStages - 1 && j < tiles; ++j) issue_tile(j, page_of(j));
      if (kStages - 1 < tiles) next_page = page_of(kStages - 1);
    }
  }

  // Q: (kBlockM, 576), rows past plan.rows zero-filled.
  {
    constexpr int kChunks = kHeadDim / 8;
    for (int c = tid; c < kBlockM * kChunks; c += Traits::kThreads) {
      const int r = c / kChunks, col = (c % kChunks) * 8;
      const int row = m0 + r;
      const bool valid = row < plan.rows;
      const int t = valid ? row / plan.group : 0, head = hk * plan.group + (valid ? row % plan.group : 0);
      const auto* src = static_cast<const Element*>(p.q) + b * p.q_strides.batch + t * p.q_strides.row +
                        int64_t(head) * p.q_strides.head + col;
      ptx::cp_async_16(QKLayout::smem_at(sQ, r, col), src, valid);
    }
    ptx::cp_async_commit();
  }
  const auto row_of = [&](int j) {
    return tile_row<Traits>(p, b, hk, key_first + (tile_begin + j) * kBlockN, key_end, tid);
  };
  const auto load_tile = [&](int j, const TileRow& r) {
    const int s = j % kStages;
    copy_tile_row<Traits, kHeadDim, KLayout>(k_stage(s), p.k, r.k_offset, r.valid, tid);
    if constexpr (Traits::kSeparateV) copy_tile_row<Traits, kHeadDimV, VLayout>(v_stage(s), p.v, r.v_offset, r.valid, tid);
  };
  TileRow next_row;  // !kTma: the row of the next tile to copy
  if constexpr (kTma) {
    ptx::cp_async_wait<0>();
    __syncthreads();  // Q and the barriers' initialisation, for every warp
  } else {
#pragma unroll
    for (int j = 0; j < kStages - 1; ++j) {
      if (j < tiles) load_tile(j, row_of(j));
      ptx::cp_async_commit();
    }
    next_row = row_of(kStages - 1);
  }
  // kTma: rows [valid, kBlockN) of stage s to zero (past the sequence's end).
  const auto zero_tail = [&](int s, int valid) {
    constexpr int kChunks = kHeadDim / 8;
    for (int c = tid; c < (kBlockN - valid) * kChunks; c += Traits::kThreads) {
      *reinterpret_cast<uint4*>(KLayout::at(k_stage(s), valid + c / kChunks, (c % kChunks) * 8)) = make_uint4(0, 0, 0, 0);
    }
  };

  // ldmatrix addresses of this lane. Q (A of S, [m][k]): kind A. K (B of S, [n][k]) by depth:
  // kind B; by keys: the warp's 8 keys, lane / 8 picking one of four 8-column chunks, so one x4
  // load serves two k steps. P (A of O, [m][k]): kind A. V (B of O, [k][n], read transposed):
  // kind A at the warp's columns.
  const uint32_t p_addr = PLayout::smem_at(sP, ldsm_row_a(lane), ldsm_col_a(lane));
  const int warp_key0 = warp * Traits::kKeysPerWarp;
  const int warp_col0 = warp * Traits::kColsPerWarp;

  float o[kMT][Traits::kONTiles][4];  // O: (kBlockM, the warp's 64 columns), unnormalised
  zero_acc(o);
  float row_max[kRows], row_sum[kRows];  // log2 units (scores * scale * log2 e)
#pragma unroll
  for (int r = 0; r < kRows; ++r) row_max[r] = -INFINITY, row_sum[r] = 0.0f;

  for (int j = 0; j < tiles; ++j) {
    __syncthreads();  // every warp is done with tile j - 1: its stage, P and the statistics
    if constexpr (kTma) {
      if (tid == 0 && j + kStages - 1 < tiles) {
        issue_tile(j + kStages - 1, next_page);
        if (j + kStages < tiles) next_page = page_of(j + kStages);
      }
      ptx::mbarrier_wait(&full[j % kStages], (j / kStages) & 1);  // tile j, for this thread
      const int valid = key_end - (key_first + (tile_begin + j) * kBlockN);
      if (valid < kBlockN) {  // the sequence's last tile (uniform)
        zero_tail(j % kStages, valid);
        __syncthreads();
      }
    } else {
      if (j + kStages - 1 < tiles) {
        load_tile(j + kStages - 1, next_row);
        next_row = row_of(j + kStages);
      }
      ptx::cp_async_commit();
      ptx::cp_async_wait<kStages - 1>();
      __syncthreads();  // tile j (and Q) in shared memory for every warp
    }
    const int s = j % kStages;
    const int n0 = key_first + (tile_begin + j) * kBlockN;

    // S of the warp's 8 keys: sc[mt][e] is row mt * 16 + g + 8 (e / 2), key 2 t4 + e % 2 of
    // them (the mma C layout); see kSplitDepth.
    float sc[kMT][4];
    if constexpr (Traits::kSplitDepth) {
      // Key group kg, depth part dq: 4 n8 tiles, 4 kMT independent accumulators of 9 k steps.
      const int kg = warp % Traits::kKeyGroups, dq = warp / Traits::kKeyGroups;
      auto* sS = reinterpret_cast<float*>(smem + Traits::kSOffset);  // (kDepthParts, kBlockM, kSStride)
      float part[kMT][Traits::kGroupKeys / 8][4];
      zero_acc(part);
      const uint32_t q_part = QKLayout::smem_at(sQ, ldsm_row_a(lane), 16 * dq + ldsm_col_a(lane));
      const uint32_t k_part =
          KLayout::smem_at(k_stage(s), Traits::kGroupKeys * kg + ldsm_row_b(lane), 16 * dq + ldsm_col_b(lane));
#pragma unroll
      for (int i = 0; i < kHeadDim / (16 * Traits::kDepthParts); ++i) {
        // k step dq + kDepthParts i: 64 i columns on, a whole number of 128-byte groups.
        uint32_t a[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          ptx::ldmatrix_x4(a[mt], QKLayout::advance(q_part, 16 * mt, 16 * Traits::kDepthParts * i));
        }
#pragma unroll
        for (int np = 0; np < Traits::kGroupKeys / 16; ++np) {
          uint32_t bk[4];
          ptx::ldmatrix_x4(bk, KLayout::advance(k_part, 16 * np, 16 * Traits::kDepthParts * i));
          mma_b_pair<Element>(part, a, bk, 2 * np);
        }
      }
      float* mine = sS + dq * kBlockM * Traits::kSStride;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < Traits::kGroupKeys / 8; ++nt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = mt * 16 + g + 8 * h, key = Traits::kGroupKeys * kg + 8 * nt + 2 * t4;
            *reinterpret_cast<float2*>(mine + row * Traits::kSStride + key) =
                make_float2(part[mt][nt][2 * h], part[mt][nt][2 * h + 1]);
          }
        }
      }
      __syncthreads();  // every depth part of every key
      static_assert(Traits::kDepthParts == 4, "the sums below add four parts");
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float2 sum[Traits::kDepthParts];
#pragma unroll
          for (int d = 0; d < Traits::kDepthParts; ++d) {
            sum[d] = *reinterpret_cast<const float2*>(sS + (d * kBlockM + mt * 16 + g + 8 * h) * Traits::kSStride +
                                                      warp_key0 + 2 * t4);
          }
          sc[mt][2 * h] = (sum[0].x + sum[1].x) + (sum[2].x + sum[3].x);
          sc[mt][2 * h + 1] = (sum[0].y + sum[1].y) + (sum[2].y + sum[3].y);
        }
      }
    } else {
      // 36 k steps in 4 independent accumulator chains.
      static_assert(kMT == 1, "by keys: one m16 tile");
      float chain[4][4];
#pragma unroll
      for (int c = 0; c < 4; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) chain[c][e] = 0.0f;
      const uint32_t q_addr = QKLayout::smem_at(sQ, ldsm_row_a(lane), ldsm_col_a(lane));
      const uint32_t k_addr = KLayout::smem_at(k_stage(s), warp_key0 + lane % 8, 8 * (lane / 8));
#pragma unroll
      for (int kk2 = 0; kk2 < kHeadDim / 32; ++kk2) {
        uint32_t kb[4], qa0[4], qa1[4];
        ptx::ldmatrix_x4(kb, KLayout::advance(k_addr, 0, 32 * kk2));
        ptx::ldmatrix_x4(qa0, QKLayout::advance(q_addr, 0, 32 * kk2));
        ptx::ldmatrix_x4(qa1, QKLayout::advance(q_addr, 0, 32 * kk2 + 16));
        const uint32_t b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
        ptx::mma_m16n8k16<Element>(chain[(2 * kk2) % 4], qa0, b0);
        ptx::mma_m16n8k16<Element>(chain[(2 * kk2 + 1) % 4], qa1, b1);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[0][e] = (chain[0][e] + chain[1][e]) + (chain[2][e] + chain[3][e]);
    }
    // Scale to log2 units and mask: keys past the sequence, and (causal) past the row's last.
    float x[kMT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = n0 + warp_key0 + 2 * t4 + (e & 1);
        x[mt][e] = key <= row_last_key[2 * mt + e / 2] ? sc[mt][e] * p.scale_log2 : -INFINITY;
      }
    }
    // Row maxima across the quad, then across the warps through shared memory.
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int mt = r / 2, h = r % 2;
      float part_max = fmaxf(x[mt][2 * h], x[mt][2 * h + 1]);
      part_max = fmaxf(part_max, __shfl_xor_sync(0xffffffffu, part_max, 1));
      part_max = fmaxf(part_max, __shfl_xor_sync(0xffffffffu, part_max, 2));
      if (t4 == 0) sMax[warp * kBlockM + mt * 16 + g + 8 * h] = part_max;
    }
    __syncthreads();
    float ref[kRows], alpha[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int row = (r / 2) * 16 + g + 8 * (r % 2);
      float mx = row_max[r];
#pragma unroll
      for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sMax[w * kBlockM + row]);
      // A row with no visible key yet keeps -inf; exponents are then taken against 0 (all 0).
      ref[r] = mx == -INFINITY ? 0.0f : mx;
      alpha[r] = ptx::exp2_approx(row_max[r] - ref[r]);
      row_max[r] = mx;
    }
    float pr[kMT][1][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) pr[mt][0][e] = ptx::exp2_approx(x[mt][e] - ref[2 * mt + e / 2]);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int mt = r / 2, h = r % 2;
      float sum = pr[mt][0][2 * h] + pr[mt][0][2 * h + 1];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (t4 == 0) sSum[warp * kBlockM + mt * 16 + g + 8 * h] = sum;
    }
    store_acc_16bit<Element, kMT, 1, PLayout>(sP, pr, 0, warp_key0, lane);
    __syncthreads();  // P and the row sums of every warp
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int row = (r / 2) * 16 + g + 8 * (r % 2);
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += sSum[w * kBlockM + row];
      row_sum[r] = row_sum[r] * alpha[r] + sum;
    }
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < Traits::kONTiles; ++nt) {
        o[mt][nt][0] *= alpha[2 * mt], o[mt][nt][1] *= alpha[2 * mt];
        o[mt][nt][2] *= alpha[2 * mt + 1], o[mt][nt][3] *= alpha[2 * mt + 1];
      }
    }
    // O[:, warp's 64 columns] += P V; V is the first 512 columns of the K tile unless separate.
    const uint32_t v_addr = VLayout::smem_at(v_stage(s), ldsm_row_a(lane), warp_col0 + ldsm_col_a(lane));
    warp_gemm_ab<Element, kMT, Traits::kONTiles, kBlockN / 16, PLayout, VLayout>(o, p_addr, v_addr);
  }
  ptx::cp_async_wait<0>();  // nothing may be left in flight at exit (no tiles: the Q copy)

  // Epilogue. Unsplit: fold the learnable sink into the row statistics (core/sink.h), write out
  // and LSE. Split: float32 partials normalised by the split's own sum, LSE without the sink
  // (fwd_combine_kernel adds it); a split that saw no key writes O = 0, LSE = -inf.
  const bool unsplit = p.num_splits == 1;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (!row_in[r]) continue;
    const int mt = r / 2, h = r % 2;
    float m = row_max[r], l = row_sum[r], factor = 1.0f;
    if (unsplit && p.learnable_sink != nullptr) {
      factor = fold_sink(p.learnable_sink[row_head[r]] * kLog2e, &m, &l, [](float v) { return ptx::exp2_approx(v); });
    }
    const float inv = l > 0.0f ? factor / l : 0.0f;
    const float lse = l > 0.0f ? (m + __log2f(l)) * kLn2 : (l == 0.0f ? -INFINITY : l);
    const int64_t grow = int64_t(b) * p.seqlen_q + row_t[r];  // the row's global index
    const int col0 = warp_col0 + 2 * t4;
    if (unsplit) {
      auto* out = static_cast<Element*>(p.out) + b * p.out_strides.batch + row_t[r] * p.out_strides.row +
                  int64_t(row_head[r]) * p.out_strides.head + col0;
#pragma unroll
      for (int nt = 0; nt < Traits::kONTiles; ++nt) {
        *reinterpret_cast<uint32_t*>(out + nt * 8) =
            ptx::pack2<Element>(o[mt][nt][2 * h] * inv, o[mt][nt][2 * h + 1] * inv);
      }
      if (p.lse != nullptr && warp == 0 && t4 == 0) {
        p.lse[b * p.lse_batch_stride + int64_t(row_head[r]) * p.lse_head_stride + row_t[r]] = lse;
      }
    } else {
      // A row that saw no key here (LSE -inf) writes no O: mla_combine_kernel gives it weight 0
      // and does not read it (splits past a short sequence's end, under a capacity-sized plan).
      float* out = p.split_out + ((int64_t(split) * p.total_q + grow) * p.heads + row_head[r]) * kHeadDimV + col0;
      if (l != 0.0f) {
#pragma unroll
        for (int nt = 0; nt < Traits::kONTiles; ++nt) {
          *reinterpret_cast<float2*>(out + nt * 8) =
              make_float2(o[mt][nt][2 * h] * inv, o[mt][nt][2 * h + 1] * inv);
        }
      }
      if (warp == 0 && t4 == 0) p.split_lse[(int64_t(split) * p.heads + row_head[r]) * p.total_q + grow] = lse;
    }
  }
}

// Merges the MLA decode's split partials (split_out (splits, total_q, heads, 512) f32 normalised
// per split, split_lse (splits, heads, total_q)): LSE = log(sum_s exp(LSE_s) + exp(sink)), O =
// sum_s exp(LSE_s - LSE) O_s. fwd_combine_kernel (sm80/fwd_kernel.h) gives one warp a whole row
// and walks the splits one after the other; at 512 columns and up to kMaxSplits (128) splits,
// with batch 1 x 16 heads (16 warps on the GPU), that walk was most of the H200 run's 27 us
// (64 splits) and 43 us (128 splits) (dev/NOTES.md). Here one CTA per (row, head, 128 columns):
// its 8 warps take the splits w, w + 8, ... (each lane a float4 of the columns, a warp reading
// 512 contiguous bytes per split), and the 8 partial sums meet in shared memory in warp order
// (deterministic). Every warp computes the same LSE (the lanes read splits l, l + 32, ...). NaN
// in a split's LSE makes the row NaN; a row with no visible key anywhere and no sink gets O = 0,
// LSE = -inf; the sink (per query head, as the unsplit epilogue takes it) is one more LSE term.
// (kCombineWarps, kCombineCols, combine_pass_splits: mla_traits.h.)

template <typename Element>
__global__ void __launch_bounds__(32 * kCombineWarps) mla_combine_kernel(const __grid_constant__ ForwardParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // A programmatic dependent of the decode kernel (mla_launch.h): wait for its partials (a
  // no-op for an ordinary launch).
  cudaGridDependencySynchronize();
#endif
  __shared__ float4 s_acc[kCombineWarps][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x;  // global row b * seqlen_q + t (total_q = batch * seqlen_q)
  const int head = blockIdx.y;
  const int col = blockIdx.z * kCombineCols + 4 * lane;
  const int splits = p.num_splits;
  const float* lse_s = p.split_lse + int64_t(head) * p.total_q + row;
  const int64_t lse_stride = int64_t(p.heads) * p.total_q;
  float mx = -INFINITY;
  bool nan = false;
  for (int s = lane; s < splits; s += 32) {
    const float x = lse_s[s * lse_stride];
    mx = fmaxf(mx, x);
    nan |= isnan(x);
  }
#pragma unroll
  for (int m = 16; m > 0; m /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, m));
  const float sink = p.learnable_sink != nullptr ? p.learnable_sink[head] : -INFINITY;
  mx = fmaxf(mx, sink);
  if (__any_sync(0xffffffffu, nan)) mx = NAN;
  float sum = 0.0f;
  if (mx != -INFINITY) {
    for (int s = lane; s < splits; s += 32) sum += __expf(lse_s[s * lse_stride] - mx);
  }
#pragma unroll
  for (int m = 16; m > 0; m /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, m);
  if (sink != -INFINITY) sum += __expf(sink - mx);
  const float lse = mx == -INFINITY ? -INFINITY : mx + __logf(sum);

  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (lse != -INFINITY) {
    const float* o = p.split_out + (row * p.heads + head) * kHeadDimV + col;
    const int64_t o_stride = int64_t(p.total_q) * p.heads * kHeadDimV;
    // This warp's splits k0 + 8 j, 32 at a time, lane j holding split k0 + 8 j's weight.
    for (int k0 = warp; k0 < splits; k0 += 32 * kCombineWarps) {
      const int mine = k0 + kCombineWarps * lane;
      const float my_weight = mine < splits ? __expf(lse_s[mine * lse_stride] - lse) : 0.0f;
      const int n = combine_pass_splits(splits, k0);
      // Eight loads issued before their sums (a plain unrolled loop kept only ~3 in flight). A
      // split of weight 0 (LSE -inf: no visible key; the decode kernel then writes no O) is
      // not read: the weight is the same for the whole warp, so the predicate is uniform.
      int j = 0;
      for (; j + kCombineBatch <= n; j += kCombineBatch) {
        float w[kCombineBatch];
        float4 v[kCombineBatch];
#pragma unroll
        for (int u = 0; u < kCombineBatch; ++u) {
          w[u] = __shfl_sync(0xffffffffu, my_weight, j + u);
          v[u] = w[u] != 0.0f ? *reinterpret_cast<const float4*>(o + (k0 + kCombineWarps * (j + u)) * o_stride)
                              : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < kCombineBatch; ++u) {
          acc.x += w[u] * v[u].x, acc.y += w[u] * v[u].y, acc.z += w[u] * v[u].z, acc.w += w[u] * v[u].w;
        }
      }
      for (; j < n; ++j) {
        const float w = __shfl_sync(0xffffffffu, my_weight, j);
        if (w == 0.0f) continue;
        const float4 v = *reinterpret_cast<const float4*>(o + (k0 + kCombineWarps * j) * o_stride);
        acc.x += w * v.x, acc.y += w * v.y, acc.z += w * v.z, acc.w += w * v.w;
      }
    }
  }
  s_acc[warp][lane] = acc;
  __syncthreads();
  if (warp != 0) return;
  float4 t = s_acc[0][lane];
#pragma unroll
  for (int w = 1; w < kCombineWarps; ++w) {
    const float4 u = s_acc[w][lane];
    t.x += u.x, t.y += u.y, t.z += u.z, t.w += u.w;
  }
  const int64_t b = row / p.seqlen_q, pos = row % p.seqlen_q;
  Element* out = static_cast<Element*>(p.out) + b * p.out_strides.batch + pos * p.out_strides.row +
                 int64_t(head) * p.out_strides.head + col;
  *reinterpret_cast<uint32_t*>(out) = ptx::pack2<Element>(t.x, t.y);
  *reinterpret_cast<uint32_t*>(out + 2) = ptx::pack2<Element>(t.z, t.w);
  if (p.lse != nullptr && blockIdx.z == 0 && lane == 0) {
    p.lse[b * p.lse_batch_stride + int64_t(head) * p.lse_head_stride + pos] = lse;
  }
}

}  // namespace flashattn::cuda::mla
