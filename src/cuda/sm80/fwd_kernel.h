// FlashAttention-2-class forward kernel for sm80+ (mma.sync, ldmatrix, cp.async).
//
// One CTA per (query block, head, batch). Warps split the query rows, so each warp owns whole
// rows: its online-softmax statistics never leave the warp. Per key block:
//   wait K_j -> prefetch V_j -> S = Q K_j^T -> scores (scale, softcap, ALiBi, mask)
//   -> wait V_j -> prefetch K_{j-1} -> online softmax (rescale O) -> O += P V_j
// so each tile's copy overlaps the other operand's matrix product. Key blocks are visited from
// the last to the first, blocks wholly outside the window are skipped, and only blocks that
// straddle a boundary pay for the mask. With attn_bias, attn_mask or a block mask
// (ScoreMods::kBiasMask) the bias and masks join the score modifiers, and under a block mask the
// CTA visits only the key blocks its list names (cuda/block_tiles.h). O is normalised once, at
// the end, and LSE written.
// Decode shapes (few query rows) use the split-key variant: the warps share 16 rows and each
// takes a quarter of every K/V tile's keys, then they merge (FwdTraits::kSplitKeys).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/params.h"
#include "core/philox.h"
#include "core/sink.h"
#include "cuda/common/cta_order.h"
#include "cuda/common/mask.h"
#include "cuda/common/score_tensors.h"
#include "cuda/common/seq_extent.h"
#include "cuda/common/smem_layout.h"
#include "cuda/common/tile_copy.h"
#include "cuda/common/tile_size.h"
#include "cuda/common/variants.h"
#include "cuda/common/warp_gemm.h"
#include "cuda/common/warp_gemm_e4m3.h"
#include "cuda/ptx/cluster.h"
#include "cuda/ptx/cp_async.h"
#include "cuda/ptx/ldmatrix.h"
#include "cuda/ptx/load.h"
#include "cuda/ptx/math.h"
#include "cuda/ptx/mma.h"

namespace flashattn::cuda {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// Lazy rescaling threshold in log2 units: unnormalised P stays below 2^8 = 256, far from the
// f16 limit (65504), while most key blocks skip rescaling O.
constexpr float kRescaleThreshold = 8.0f;

// kSplitKeys_: the decode shape (tile_size.h fwd_decode_tile): every warp takes all kBlockM
// rows and its own kBlockN / kWarps keys of each tile; the warps merge their results at the end.
// kCache_: forward_kvcache; K and V are a KV cache (params.kv): dense (a fixed row stride from
// the sequence's cache row, as without a cache) or paged (rows located per page, PageFetch).
// KVElement_: the cache's element type, Element_ or __nv_fp8_e4m3 (an e4m3 cache read by 16-bit
// queries, docs/SEMANTICS.md "FP8 KV cache": K and V tiles stay one byte per element in shared
// memory and are widened on their way into the fragments, common/warp_gemm_e4m3.h).
template <typename Element_, int kHeadDim_, MaskMode kMask_, ScoreMods kMods_, bool kSplitKeys_ = false,
          bool kCache_ = false, typename KVElement_ = Element_>
struct FwdTraits {
  using Element = Element_;
  using KVElement = KVElement_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr MaskMode kMask = kMask_;
  static constexpr ScoreMods kMods = kMods_;
  static constexpr bool kSplitKeys = kSplitKeys_;
  static constexpr bool kCache = kCache_;
  static constexpr bool kFp8Cache = sizeof(KVElement_) == 1;
  // The same options with the decode shape, reading a KV cache, and reading an e4m3 KV cache.
  using Decode = FwdTraits<Element_, kHeadDim_, kMask_, kMods_, true, kCache_, KVElement_>;
  using Cache = FwdTraits<Element_, kHeadDim_, kMask_, kMods_, kSplitKeys_, true, KVElement_>;
  using Fp8Cache = FwdTraits<Element_, kHeadDim_, kMask_, kMods_, kSplitKeys_, true, __nv_fp8_e4m3>;

  static constexpr FwdTile kTile = kSplitKeys && kFp8Cache ? fwd_fp8_cache_decode_tile(kHeadDim, kMods != ScoreMods::kNone,
                                                                                      kMask == MaskMode::kWindow)
                                   : kSplitKeys ? fwd_decode_tile(kHeadDim, kMods == ScoreMods::kBiasMask)
                                   : kFp8Cache  ? fwd_fp8_cache_tile(kHeadDim)
                                   : kMods == ScoreMods::kBiasMask ? fwd_bias_mask_tile(kHeadDim)
                                                                   : fwd_tile(kHeadDim, kMods == ScoreMods::kAny);
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kWarps = kTile.warps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowsPerWarp = kSplitKeys ? kBlockM : kBlockM / kWarps;
  static constexpr int kWarpKeys = kSplitKeys ? kBlockN / kWarps : kBlockN;  // keys of a tile per warp
  static constexpr int kMTiles = kRowsPerWarp / 16;  // 16-row MMA tiles per warp
  static constexpr int kNTiles = kWarpKeys / 8;      // 8-key MMA tiles of this warp's S
  static constexpr int kDTiles = kHeadDim / 8;       // 8-column MMA tiles of O
  // Copied tiles use SwizzledRows (smem_layout.h) where rows are whole 128-byte lines and one
  // copy pass covers a multiple of 4 rows: 16-byte chunks are XOR-permuted within each 8-row
  // group, so the eight row addresses of every ldmatrix hit distinct banks and every cp.async
  // writes whole lines (measured on H200: forward 4-10% faster than padded rows, and the
  // padded layout's excess L2 sectors are gone; dev/results/h200-2026-11-29-ab-s4-*.json).
  // Other head dims (32, 96) pad rows by 16 bytes, which keeps ldmatrix conflict-free too.
  static constexpr bool kSwizzle = kHeadDim % 64 == 0 && (kThreads / (kHeadDim / 8)) % 4 == 0;
  using SmemLayout = std::conditional_t<kSwizzle, SwizzledRows<kHeadDim>, PaddedRows<kHeadDim + 8>>;
  static constexpr int kSmemStride = SmemLayout::kStride;
  static constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks
  static constexpr int kSmemQ = kBlockM * kSmemStride;
  // K and V tiles: 16-bit rows as Q's; an e4m3 cache's rows of kHeadDim bytes are laid out as
  // 16-bit rows of kHeadDim / 2 (swizzled when those are whole 128-byte lines, d128 / d256, and
  // a copy pass covers a multiple of 4 rows; else padded by 16 bytes, conflict-free too).
  static constexpr int kKVRowElems = kFp8Cache ? kHeadDim / 2 : kHeadDim;  // 16-bit units
  static constexpr int kKVChunksPerRow = kKVRowElems / 8;
  static constexpr bool kKVSwizzle = kFp8Cache ? kKVRowElems % 64 == 0 && (kThreads / kKVChunksPerRow) % 4 == 0
                                               : kSwizzle;
  using KVLayout = std::conditional_t<!kFp8Cache, SmemLayout,
                                      std::conditional_t<kKVSwizzle, SwizzledRows<kKVRowElems>,
                                                         PaddedRows<kKVRowElems + 8>>>;
  static constexpr int kSmemKV = kBlockN * KVLayout::kStride;  // Element units
  // Paged KV cache: the K and V row offsets of two key blocks (the one whose V tile is next, and
  // the next K; PageFetch).
  static constexpr size_t kPageOffsetBytes = kCache_ ? 2 * 2 * kBlockN * sizeof(int64_t) : 0;
  // The bias tile of the current (query block, key block), kBlockM rows of kBlockN 16-bit
  // elements, after V (score_tensors.h load_bias_tile), copied with the K tile: the per-element
  // bias reads waited one global latency each (dev/NOTES.md "Bias tiles through shared memory").
  // H200, d128 bf16, 8 x 16 x 2k: 57.7 -> 80.9 TFLOP/s, outputs bitwise equal to the per-element
  // reads on 13 cases (dev/results/h200-2026-12-02-bias-*). Rows of whole groups of 8 chunks
  // (kBlockN % 64 == 0) allow d <= 192; only d128 has run on a GPU, so only d128 takes it.
  static constexpr bool kBiasSmem =
      kMods == ScoreMods::kBiasMask && !kSplitKeys && kBlockN % 64 == 0 && kHeadDim == 128;
  static constexpr int kSmemBias = kBiasSmem ? kBlockM * kBlockN : 0;  // Element units
  static constexpr size_t kSmemBytes = sizeof(Element) * (kSmemQ + 2 * kSmemKV + kSmemBias) + kPageOffsetBytes;
  // An e4m3 cache's kernels launch with less: no page offsets for a dense cache, and one set
  // (K's, shared with V) when K and V have the same page and row strides (page_offsets_shared;
  // the usual case), so that the decode tiles' 256 keys at d128 keep three CTAs per SM.
  static constexpr size_t smem_bytes(bool paged, bool shared_offsets) {
    if constexpr (!kFp8Cache) return kSmemBytes;
    return kSmemBytes - (!paged ? kPageOffsetBytes : shared_offsets ? kPageOffsetBytes / 2 : 0);
  }

  static_assert(kRowsPerWarp % 16 == 0, "each warp owns whole 16-row tiles");
  static_assert(!kSwizzle || (sizeof(Element) * kSmemQ % 128 == 0 && sizeof(Element) * kSmemKV % 128 == 0),
                "swizzled tiles start on 128-byte boundaries");
  static_assert(kNTiles % 2 == 0 && kDTiles % 2 == 0, "x4 ldmatrix loads two 8-wide tiles");
  // Merging split-key warps: warps 1.. leave O, row max and row sum for warp 0 in the K/V buffers.
  static constexpr size_t kMergeBytes = kSplitKeys ? sizeof(float) * (kWarps - 1) * 32 * (kMTiles * kDTiles * 4 + 4 * kMTiles) : 0;
  static_assert(kMergeBytes <= sizeof(Element) * 2 * kSmemKV, "the merge fits in the K/V buffers");
  static_assert(kHeadDim % 16 == 0, "head_dim must be a multiple of 16");
  static_assert(!kBiasSmem || sizeof(Element) * (kSmemQ + 2 * kSmemKV) % 128 == 0,
                "the bias tile starts on a 128-byte line (its swizzle XORs address bits 4-6)");
  static_assert(!(kCache && kMods == ScoreMods::kBiasMask), "forward_kvcache takes no bias or masks");
  static_assert(!kFp8Cache || (kCache && kHeadDim % 32 == 0 && kDTiles % 4 == 0),
                "an e4m3 cache: forward_kvcache, x4 ldmatrix of 32 columns");
  static_assert(!kKVSwizzle || sizeof(Element) * kSmemQ % 128 == 0, "swizzled K/V tiles start on 128-byte lines");
  // The e4m3 decode tiles are sized to keep min_ctas CTAs on an sm90 SM (228 KB, 1 KB reserved
  // per CTA; tile_size.h fwd_fp8_cache_decode_tile) with shared page offsets.
  static_assert(!(kFp8Cache && kSplitKeys) || kTile.min_ctas * (smem_bytes(true, true) + 1024) <= 228 * 1024,
                "the e4m3 decode tile keeps its CTAs per SM");
};

// Row addressing of one (batch, head) slice of a (batch, seq, head, dim) operand.
struct RowPtr {
  const char* base;    // first element of row 0 of this sequence and head
  int64_t row_bytes;   // stride between rows

  __device__ __forceinline__ const void* row(int r) const { return base + r * row_bytes; }
};

template <typename Element>
__device__ __forceinline__ RowPtr row_ptr(const void* p, const Strides3& s, int b, int64_t row0,
                                          int head) {
  const char* base = static_cast<const char*>(p) +
                     sizeof(Element) * (b * s.batch + row0 * s.row + int64_t(head) * s.head);
  return {base, int64_t(sizeof(Element)) * s.row};
}

// The query head whose learnable sink row `pos` (its position in the sequence, or its global
// row: with folding seqlen_q is a multiple of sink_fold, so both agree) of kernel head `head`
// uses: the head itself unless fwd_dispatch folded a GQA group into the rows
// (ForwardParams::sink_fold).
__device__ __forceinline__ int sink_head(const ForwardParams& p, int head, int64_t pos) {
  return p.sink_fold == 1 ? head : head * p.sink_fold + int(pos % p.sink_fold);
}

// Where the rows of a decode tile lie when fwd_dispatch folded a GQA group's query tokens (1-16)
// into them (ForwardParams::q_fold > 1): row r is token r / fold of the group's query
// head r % fold, so its element offset from the tile's (batch, kv head) origin is
// (r / fold) * row + (r % fold) * head, and the mask sees token r / fold. fold == 1: rows are
// rows. Only the decode kernels (FwdTraits::kSplitKeys) read it; the others keep fold 1.
struct FoldedRows {
  int fold = 1;
  __device__ __forceinline__ int token(int r) const { return fold == 1 ? r : r / fold; }
  // r < 2^31 (a position in a sequence): 32-bit division.
  __device__ __forceinline__ int64_t offset(int64_t r, int64_t row, int64_t head) const {
    return fold == 1 ? r * row : int64_t(int(r) / fold) * row + int64_t(int(r) % fold) * head;
  }
};

// Reduces v[0..n) pairwise (depth log2 n instead of a chain of n - 1 dependent operations);
// overwrites v.
template <int n, typename Op>
__device__ __forceinline__ float tree_reduce(float (&v)[n], Op op) {
#pragma unroll
  for (int w = 1; w < n; w *= 2) {
#pragma unroll
    for (int i = 0; i + w < n; i += 2 * w) v[i] = op(v[i], v[i + w]);
  }
  return v[0];
}

// Copies rows [0, kRows) of a Q, K or V tile into shared memory (tile_copy.h): kFull when every
// row exists, else rows at or beyond `valid_rows` are zero-filled.
template <typename Traits, int kRows, bool kFull>
__device__ __forceinline__ void load_tile(typename Traits::Element* smem, const RowPtr& src,
                                          int valid_rows, int tid) {
  load_rows<typename Traits::Element, kRows, Traits::kThreads, Traits::kChunksPerRow, typename Traits::SmemLayout, kFull>(
      smem, src.base, src.row_bytes, valid_rows, tid);
}

// The kBlockN rows of a K or V tile (KVLayout; an e4m3 cache's rows copied as 16-bit rows of
// half the width): kFull when every row exists, else rows >= valid_rows are zero-filled.
template <typename Traits, bool kFull>
__device__ __forceinline__ void load_kv_rows(typename Traits::Element* smem, const RowPtr& src, int valid_rows,
                                             int tid) {
  load_rows<typename Traits::Element, Traits::kBlockN, Traits::kThreads, Traits::kKVChunksPerRow,
            typename Traits::KVLayout, kFull>(smem, src.base, src.row_bytes, valid_rows, tid);
}

// A K or V tile starting at key n0: the unpredicated copy when all kBlockN keys exist.
template <typename Traits>
__device__ __forceinline__ void load_kv_tile(typename Traits::Element* smem, const RowPtr& src, int n0,
                                             int seqlen_k, int tid) {
  const RowPtr tile{static_cast<const char*>(src.row(n0)), src.row_bytes};
  if (n0 + Traits::kBlockN <= seqlen_k) {
    load_kv_rows<Traits, true>(smem, tile, Traits::kBlockN, tid);
  } else {
    load_kv_rows<Traits, false>(smem, tile, seqlen_k - n0, tid);
  }
}

// The pages of one forward_kvcache sequence's paged cache (params.h KVCacheParams, with its
// accessors hoisted: the block-table row is found once per CTA, and a power-of-two page size
// locates a row with a shift and a mask).
struct CachePages {
  const int32_t* table = nullptr;  // this sequence's block-table row; null = dense cache
  int32_t page_size = 1;
  int32_t page_shift = -1;  // log2(page_size) when a power of two, else -1
  int32_t last_page = 0;    // num_blocks - 1: pages are clamped into the cache
};

__device__ __forceinline__ CachePages cache_pages(const KVCacheParams& kv, int b) {
  CachePages c;
  if (kv.paged()) {
    c.table = kv.block_table + int64_t(b) * kv.block_table_stride;
    c.page_size = kv.page_size;
    c.page_shift = (kv.page_size & (kv.page_size - 1)) == 0 ? __ffs(kv.page_size) - 1 : -1;
    c.last_page = kv.num_blocks - 1;
  }
  return c;
}

// Paged cache: where every key of one key block lives. The block table is read into registers
// (load) one key block before the CTA turns the pages into the keys' K and V element offsets in
// shared memory (store), so the table read's latency passes under a whole iteration instead of
// stalling the loop, and each copy pass of the K and V tiles then costs one shared-memory read
// and an add, like the dense copies' pointer step (page ids instead of offsets left paged
// caches at 0.87-0.91x dense on H200). No per-row state occupies registers across the loop (the
// decode tile has none to spare: one page per copy pass kept in registers spilled 36 bytes at
// d128). Keys past the sequence are not looked up (their table entries may lie outside the
// table's row).
template <typename Traits>
struct PageFetch {
  static constexpr int kPerThread = (Traits::kBlockN + Traits::kThreads - 1) / Traits::kThreads;
  int32_t page[kPerThread];

  // The key block whose first key is cache row row0, with `valid` keys.
  __device__ __forceinline__ void load(const CachePages& pages, int row0, int valid, int tid) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int r = tid + i * Traits::kThreads;
      const int row = row0 + r;
      const int block = pages.page_shift >= 0 ? row >> pages.page_shift : row / pages.page_size;
      page[i] = r < valid && r < Traits::kBlockN ? __ldg(pages.table + block) : 0;
    }
  }
  // offsets[r] and offsets[v_slots + r]: key r's K and V element offsets (without the head);
  // v_slots = kBlockN, or 0 where K's offsets are V's too (page_offsets_shared).
  __device__ __forceinline__ void store(int64_t* offsets, int v_slots, const CachePages& pages, int row0,
                                        const Strides3& ks, const Strides3& vs, int tid) const {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int r = tid + i * Traits::kThreads;
      if (r < Traits::kBlockN) {
        const int row = row0 + r;
        const int64_t pg = min(max(page[i], 0), pages.last_page);
        const int64_t in = pages.page_shift >= 0 ? row & (pages.page_size - 1) : row % pages.page_size;
        offsets[r] = pg * ks.batch + in * ks.row;
        offsets[v_slots + r] = pg * vs.batch + in * vs.row;
      }
    }
  }
};

// Copies the K or V rows of a key block (cache `cache`, head stride head_stride) whose element
// offsets PageFetch wrote to `offsets` into shared memory; keys >= valid are zero-filled.
template <typename Traits>
__device__ __forceinline__ void load_paged_tile(typename Traits::Element* smem, const void* cache, int64_t head_stride,
                                                int head_k, const int64_t* offsets, int valid, int tid) {
  using Element = typename Traits::Element;
  constexpr int64_t kKVBytes = sizeof(typename Traits::KVElement);
  const char* base = static_cast<const char*>(cache) + kKVBytes * int64_t(head_k) * head_stride;
  constexpr int kRowsPerPass = Traits::kThreads / Traits::kKVChunksPerRow;
  const int r0 = tid / Traits::kKVChunksPerRow;
  const auto row_src = [&](int p) { return base + kKVBytes * offsets[r0 + p * kRowsPerPass]; };
  load_rows_gather<Element, Traits::kBlockN, Traits::kThreads, Traits::kKVChunksPerRow, typename Traits::KVLayout>(
      smem, row_src, base, valid, tid);
}

// Whether a forward_kvcache call's K and V pages share their row offsets (an e4m3 cache whose
// K and V have the same page and row strides): the launcher's shared-memory size and the
// kernel's offset slots follow it. Always false for 16-bit caches (their kernels are unchanged).
template <typename Traits>
__host__ __device__ __forceinline__ bool page_offsets_shared(const ForwardParams& p) {
  if constexpr (!Traits::kFp8Cache) return false;
  return p.k_strides.batch == p.v_strides.batch && p.k_strides.row == p.v_strides.row;
}

// Where combine_split_row reads one row's split partials: the workspace in global memory
// (params.split_out / split_lse), written by other SMs and read from L2 (__ldcg).
template <int kHeadDim>
struct GlobalPartials {
  const float* lse_s;  // split 0's LSE of the row
  int64_t lse_split_stride;
  const float* o;  // split 0's first column of this lane
  int64_t o_split_stride;

  __device__ __forceinline__ GlobalPartials(const ForwardParams& params, int64_t row, int head, int lane)
      : lse_s(params.split_lse + int64_t(head) * params.split_rows() + row),
        lse_split_stride(int64_t(params.heads) * params.split_rows()),
        o(params.split_out + (row * params.heads + head) * kHeadDim + lane * (kHeadDim / 32)),
        o_split_stride(params.split_rows() * params.heads * kHeadDim) {}
  __device__ __forceinline__ float lse(int s) const { return __ldcg(lse_s + s * lse_split_stride); }
  // kVec floats of split s from this lane's column e on.
  template <int kVec>
  __device__ __forceinline__ void cols(int s, int e, float* v) const {
    const float* src = o + s * o_split_stride + e;
    if constexpr (kVec == 4) {
      const float4 x = __ldcg(reinterpret_cast<const float4*>(src));
      v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
    } else if constexpr (kVec == 2) {
      const float2 x = __ldcg(reinterpret_cast<const float2*>(src));
      v[0] = x.x, v[1] = x.y;
    } else {
      v[0] = __ldcg(src);
    }
  }
};

// Merges the split-KV partials of one global row (`parts`: GlobalPartials, or ClusterPartials
// for the splits of a thread-block cluster) into O and LSE:
// LSE = log sum_s exp(LSE_s) and O = sum_s exp(LSE_s - LSE) O_s, run by one warp (`lane`).
// Splits whose LSE is -inf (no visible key) weigh 0, and a row with no visible key anywhere gets
// O = 0, LSE = -inf. The lanes read the splits' LSEs side by side (lane l: splits l, l + 32, ...)
// and reduce them with shuffles; each lane then owns kHeadDim / 32 adjacent columns of O and
// reads them as one vector per split, the split's weight coming from the lane that read that
// split's LSE (with 32 splits, batch 1 and 4k keys, the decode step went from 22.6 to 15.4 us;
// the LSEs had been read one split after the other). The splits are added in split order
// whoever calls it (fwd_combine_kernel, the last split CTA of a decode row group, or a cluster's
// CTAs), so all give the same bits.
// kBatchRegs: registers of loaded columns the merge may hold (kBatch splits' columns are loaded
// before any is added): 64 in the combine kernel; 32 inside the decode kernels, under their
// register cap (64 spilled 16-28 bytes in two d128 KV-cache kernels, ptxas sm_90a).
template <typename Element, int kHeadDim, int kBatchRegs, typename Partials>
__device__ __forceinline__ void combine_split_row(const ForwardParams& params, const Partials& parts, int64_t row,
                                                  int head, int lane) {
  static_assert(kHeadDim % 32 == 0, "whole columns per lane");
  constexpr int kPerLane = kHeadDim / 32;
  constexpr int kVec = kPerLane % 4 == 0 ? 4 : (kPerLane % 2 == 0 ? 2 : 1);  // floats per load
  constexpr int kBatch = kBatchRegs / kPerLane < 1 ? 1 : (kBatchRegs / kPerLane > 16 ? 16 : kBatchRegs / kPerLane);
  const int splits = params.num_splits;
  // This lane's columns of splits [j0, j0 + kBatch) (past the last split: the last one again).
  float v[kBatch][kPerLane];
  const auto load_batch = [&](int j0) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int s = min(j0 + u, splits - 1);
#pragma unroll
      for (int e = 0; e < kPerLane; e += kVec) parts.template cols<kVec>(s, e, &v[u][e]);
    }
  };
  // The first batch's columns travel with the LSEs (they do not depend on them), so the merge
  // waits for one L2 round trip per kBatch splits (two at 32 splits in the combine kernel at
  // d <= 128, four inside the decode kernels), where reading the LSEs, then each weight, then
  // four splits at a time had waited for about eleven. Each lane's first LSE (split `lane`) is
  // read once and kept for the three passes below.
  load_batch(0);
  const float lse_lane = lane < splits ? parts.lse(lane) : -INFINITY;
  const auto split_lse = [&](int s) { return s < 32 ? lse_lane : parts.lse(s); };
  float mx = -INFINITY;
  bool nan = false;  // a split's NaN (from NaN or infinite inputs) makes the row NaN, as in torch
  for (int s = lane; s < splits; s += 32) {
    const float x = split_lse(s);
    mx = fmaxf(mx, x);
    nan |= isnan(x);
  }
#pragma unroll
  for (int m = 16; m > 0; m /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, m));
  // The learnable sink joins here, once per row (the split partials exclude it): one more term
  // of the LSE with no O. A sink of -inf changes nothing.
  const float sink =
      params.learnable_sink != nullptr ? params.learnable_sink[sink_head(params, head, row)] : -INFINITY;
  mx = fmaxf(mx, sink);
  if (__any_sync(0xffffffffu, nan)) mx = NAN;
  float sum = 0.0f;
  if (mx != -INFINITY) {
    for (int s = lane; s < splits; s += 32) sum += __expf(split_lse(s) - mx);
  }
#pragma unroll
  for (int m = 16; m > 0; m /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, m);
  if (sink != -INFINITY) sum += __expf(sink - mx);
  const float lse = mx == -INFINITY ? -INFINITY : mx + __logf(sum);
  float acc[kPerLane];
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) acc[e] = 0.0f;
  if (lse != -INFINITY) {
    for (int s0 = 0; s0 < splits; s0 += 32) {
      const int mine = s0 + lane;
      const float my_weight = mine < splits ? __expf(split_lse(mine) - lse) : 0.0f;
      const int n = min(32, splits - s0);
      for (int j0 = 0; j0 < n; j0 += kBatch) {
        if (s0 + j0 > 0) load_batch(s0 + j0);
        // Split order; a split past the last adds nothing (not even 0 x v: -0 would become +0).
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const float w = __shfl_sync(0xffffffffu, my_weight, (j0 + u) % 32);
          if (j0 + u < n) {
#pragma unroll
            for (int e = 0; e < kPerLane; ++e) acc[e] += w * v[u][e];
          }
        }
      }
    }
  }
  // Global row -> (batch, position) for the strided output and LSE (a folded position is a
  // (token, query head) pair: FoldedRows).
  int64_t b = 0, pos = row;
  if (!params.is_varlen()) {
    b = row / params.seqlen_q;
    pos = row % params.seqlen_q;
  }
  // A varlen row is global: (token row) * fold + j, below split_rows(), so 64-bit here.
  const int fold = params.q_fold;
  const int64_t tok = fold == 1 ? pos : pos / fold, j = fold == 1 ? 0 : pos % fold;
  Element* out = static_cast<Element*>(params.out) + b * params.out_strides.batch + tok * params.out_strides.row +
                 j * params.out_fold_head + int64_t(head) * params.out_strides.head + lane * kPerLane;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) out[e] = Element(acc[e]);
  if (params.lse != nullptr && lane == 0) {
    params.lse[b * params.lse_batch_stride + int64_t(head) * params.lse_head_stride + tok +
               j * params.lse_fold_head] = lse;
  }
}

// The fused split-KV combine of the decode kernels (params.split_counters set; FwdTraits::kSplitKeys,
// num_splits > 1): every thread of the CTA calls it once warp 0 has stored this split's partials
// (rows [row0, row0 + rows) of `head`), each thread after a __threadfence. Thread 0
// counts the split in on the row group's counter; the CTA that arrives last sets the counter back
// to 0 (so the next launch, or the next replay of a CUDA graph, finds it zeroed without a memset)
// and merges the group's rows with combine_split_row, one warp per row, in place of the second
// kernel (fwd_combine_kernel) and its launch. `flag` is one int of shared memory that nothing
// reads any more (Q's tile).
template <typename Traits>
__device__ __forceinline__ void merge_if_last_split(const ForwardParams& params, int* flag, int group, int64_t row0,
                                                    int rows, int head, int tid) {
  __syncthreads();  // warp 0's partials are stored and fenced
  if (tid == 0) {
    uint32_t* counter = params.split_counters + group;
    // Release (cumulative: the partials this thread saw stored through the barrier), count, and
    // for the last split acquire: every other split's partials were released before its count,
    // which this count follows; the barrier below passes that on to the CTA's other threads.
    __threadfence();
    const bool last = atomicAdd(counter, 1u) == uint32_t(params.num_splits - 1);
    if (last) {
      atomicExch(counter, 0u);
      __threadfence();
    }
    *flag = last;
  }
  __syncthreads();
  if (*flag == 0) return;
  const int warp = tid / 32;
  for (int r = warp; r < rows; r += Traits::kWarps) {
    combine_split_row<typename Traits::Element, Traits::kHeadDim, 32>(
        params, GlobalPartials<Traits::kHeadDim>(params, row0 + r, head, tid % 32), row0 + r, head, tid % 32);
  }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Where combine_split_row reads one row's split partials when the splits of a row group run as
// one thread-block cluster: split s is cluster rank s, and its partial rows lie in its own shared
// memory (merge_splits_in_cluster), read through distributed shared memory.
template <int kHeadDim>
struct ClusterPartials {
  uint32_t lse_addr;  // shared::cta address of the row's LSE
  uint32_t o_addr;    // ... of this lane's first column of the row

  __device__ __forceinline__ float lse(int s) const { return ptx::ld_cluster_f32(ptx::cluster_map(lse_addr, s)); }
  template <int kVec>
  __device__ __forceinline__ void cols(int s, int e, float* v) const {
    const uint32_t src = ptx::cluster_map(o_addr, s) + 4u * uint32_t(e);
    if constexpr (kVec == 4) {
      const float4 x = ptx::ld_cluster_v4f32(src);
      v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
    } else if constexpr (kVec == 2) {
      const float2 x = ptx::ld_cluster_v2f32(src);
      v[0] = x.x, v[1] = x.y;
    } else {
      v[0] = ptx::ld_cluster_f32(src);
    }
  }
};

// The split-KV merge of the decode kernels when launch_fwd ran the num_splits CTAs of each row
// group as one cluster (sm90): every CTA has left its normalised partial rows ([kBlockM][kHeadDim]
// float32, then kBlockM LSEs) at `part` in its own shared memory; after the cluster barrier row
// r is merged by warp r / splits % kWarps of rank r % splits, reading every split's row from its
// CTA, in split order (combine_split_row: the combine kernel's bits), and written to O and LSE.
// No workspace, counter, fence or second kernel: at batch 1 x 4k keys the last CTA's merge from
// L2 and the stores and count before it had taken ~6 us after the key loop (dev/NOTES.md "Decode
// latency"). The second barrier keeps every CTA (and its shared memory) alive until the others
// have read it. Every thread of the CTA calls this.
template <typename Traits>
__device__ __forceinline__ void merge_splits_in_cluster(const ForwardParams& params, const float* part, int64_t row0,
                                                        int rows, int head, int tid) {
  constexpr int kHeadDim = Traits::kHeadDim;
  ptx::cluster_sync();  // every split's partial rows are in its shared memory
  const int splits = params.num_splits;
  const int rank = int(ptx::cluster_ctarank());
  const int warp = tid / 32;
  const int lane = tid % 32;
  const uint32_t lse0 = uint32_t(__cvta_generic_to_shared(part + Traits::kBlockM * kHeadDim));
  const uint32_t o0 = uint32_t(__cvta_generic_to_shared(part)) + 4u * uint32_t(lane * (kHeadDim / 32));
  for (int r = rank + splits * warp; r < rows; r += splits * Traits::kWarps) {
    const ClusterPartials<kHeadDim> parts{lse0 + 4u * uint32_t(r), o0 + 4u * uint32_t(r * kHeadDim)};
    combine_split_row<typename Traits::Element, kHeadDim, 32>(params, parts, row0 + r, head, lane);
  }
  ptx::cluster_sync();  // no CTA leaves while another may still read its shared memory
}
#endif

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kTile.min_ctas)
    fwd_kernel(const __grid_constant__ ForwardParams params) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kMTiles = Traits::kMTiles;
  constexpr int kNTiles = Traits::kNTiles;
  constexpr int kDTiles = Traits::kDTiles;
  using Layout = typename Traits::SmemLayout;
  using KVLayout = typename Traits::KVLayout;
  using KVElement = typename Traits::KVElement;
  constexpr bool kMods = Traits::kMods != ScoreMods::kNone;
  // attn_bias, attn_mask and block masks (score_tensors.h, block_tiles.h), on top of kMods.
  constexpr bool kBiasMask = Traits::kMods == ScoreMods::kBiasMask;
  // The decode shape copies its first V tile in the prologue, next to Q and the first K tile,
  // instead of after K has landed: a split of one or two key blocks (batch 1, 4k keys: 32 splits
  // of one 128-key block) waits for one DRAM round trip instead of two before its first O += P V.
  constexpr bool kPrefetchV = Traits::kSplitKeys;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  Element* sQ = reinterpret_cast<Element*>(smem_raw);  // kBlockM rows (Layout)
  Element* sK = sQ + Traits::kSmemQ;                   // kBlockN rows
  Element* sV = sK + Traits::kSmemKV;                  // kBlockN rows
  // Paged cache: the K and V row offsets of key block j at page_offsets(j) and page_offsets(j) +
  // v_offsets (PageFetch); an e4m3 cache's K and V share one set when their strides allow
  // (page_offsets_shared, as the launcher sized shared memory).
  // v_offsets: V's slots after K's, or K's own (PageFetch::store then writes V's offsets over
  // K's equal ones). Read from the parameters where used, so that no register holds it.
  // The bias tile (FwdTraits::kBiasSmem), used where the call's bias passes bias_tile_copyable.
  [[maybe_unused]] unsigned char* const s_bias_bytes = reinterpret_cast<unsigned char*>(sV + Traits::kSmemKV);
  const bool bias_smem = Traits::kBiasSmem && bias_tile_copyable(params);
  const auto v_offsets = [&] { return page_offsets_shared<Traits>(params) ? 0 : kBlockN; };
  int64_t* const page_offset_base = reinterpret_cast<int64_t*>(sV + Traits::kSmemKV + Traits::kSmemBias);
  const auto page_offsets = [&](int j) {
    if constexpr (!Traits::kFp8Cache) return page_offset_base + (j & 1) * 2 * kBlockN;
    return page_offset_base + ((j & 1) ? kBlockN + v_offsets() : 0);
  };

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
#if defined(FLASHATTN_DEV_DECODE_TRACE)
  // dev/ probe (dev/decode_trace.py): thread 0 of each split-key CTA stamps its phases with
  // clock64 (entry, first K landed, loop done, partials stored, counted / merged; within the
  // store phase: past the warps' merge (4: its barriers wait for every warp), the partials'
  // stores issued (5)) and the entry and exit with %globaltimer, printed at the end.
  long long trace_clk[6] = {};
  unsigned long long trace_ns0 = 0;
  if (Traits::kSplitKeys && tid == 0) {
    trace_clk[0] = clock64();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(trace_ns0));
  }
#define FLASHATTN_DECODE_TRACE(i) \
  if (Traits::kSplitKeys && tid == 0 && trace_clk[i] == 0) trace_clk[i] = clock64();
#else
#define FLASHATTN_DECODE_TRACE(i)
#endif
  // Heavier query blocks first: under a causal mask the last blocks see the most keys. Causal
  // launches also interleave the blocks of cta_group_planes planes (cta_order.h).
  const int num_splits = params.num_splits;  // resolved by the launcher, >= 1
  const CtaSlot slot = this_cta_slot(params.cta_group_planes);
  const int m_block = gridDim.x - 1 - slot.block;
  const int head = slot.plane % gridDim.y;
  const int batch = slot.plane / gridDim.y / num_splits;
  const int split = slot.plane / gridDim.y % num_splits;
  const int head_k = head / (params.heads / params.heads_k);

  // Sequence extents (varlen: this sequence's rows inside the packed tensors; KV cache: the
  // cache rows [first, end) of this sequence: row first of cache batch row kv_batch when dense;
  // a varlen call with a block table: its query rows, and keys at rows [0, count) of its pages).
  SeqExtent extent;
  int kv_batch = batch;
  CachePages pages;
  if constexpr (Traits::kCache) {
    extent = cache_seq_extent(params, batch);
    pages = cache_pages(params.kv, batch);
    if (pages.table == nullptr) kv_batch = params.kv.cache_batch(batch);
  } else {
    extent = seq_extent(params, batch);
  }
  // Folded rows (FoldedRows): a varlen sequence's token count becomes its rows, its tokens at
  // most max_seqlen_q (params.seqlen_q counts rows then); a dense call's seqlen_q counts rows.
  const FoldedRows fold{Traits::kSplitKeys ? params.q_fold : 1};
  if constexpr (Traits::kSplitKeys) {
    if (fold.fold > 1 && params.is_varlen()) {
      extent.seqlen_q = min(extent.seqlen_q, params.seqlen_q / fold.fold) * fold.fold;
    }
  }
  const auto [row0_q, row0_k, seqlen_q, seqlen_k] = extent;
  const bool paged = Traits::kCache && pages.table != nullptr;
  PageFetch<Traits> fetch;  // paged: the pages of the key block after the next one
  const int m0 = m_block * kBlockM;
  if (m0 >= seqlen_q) return;
  const int rows_here = min(kBlockM, seqlen_q - m0);
  // The decode kernels' rows may be (token, query head) pairs (FoldedRows); the mask and its
  // block ranges then see the tokens, [tok_begin, tok_end) for this tile's rows.
  const int tok_begin = Traits::kSplitKeys ? fold.token(m0) : m0;
  const int tok_end = Traits::kSplitKeys ? fold.token(m0 + rows_here - 1) + 1 : m0 + rows_here;

  const WindowMask mask = make_window_mask<Traits::kMask == MaskMode::kWindow>(
      Traits::kSplitKeys ? fold.token(seqlen_q) : seqlen_q, seqlen_k, params.window_left, params.window_right);
  int n_lo = 0, n_hi = (seqlen_k + kBlockN - 1) / kBlockN;
  if constexpr (Traits::kMask == MaskMode::kWindow) {
    mask.block_range(tok_begin, tok_end, kBlockN, &n_lo, &n_hi);
  }
  if (num_splits > 1) {
    // Split-KV: this CTA takes an equal share of the key blocks of the longest sequence (KV
    // cache: of its own sequence, whose length the host does not know; the number of splits
    // comes from the cache's shape only, so a captured CUDA graph stays valid).
    const int split_keys = Traits::kCache ? seqlen_k : params.seqlen_k;
    const int per_split = ((split_keys + kBlockN - 1) / kBlockN + num_splits - 1) / num_splits;
    n_lo = max(n_lo, split * per_split);
    n_hi = min(n_hi, (split + 1) * per_split);
  }

  const RowPtr gQ = row_ptr<Element>(params.q, params.q_strides, batch, row0_q + m0, head);
  const RowPtr gK = row_ptr<KVElement>(params.k, params.k_strides, kv_batch, row0_k, head_k);
  const RowPtr gV = row_ptr<KVElement>(params.v, params.v_strides, kv_batch, row0_k, head_k);
  // This tile's O rows, from the tile's first query row in the packed tensors (a cache call's
  // are formed again after the key loop: row0_q_out below).
  const auto out_tile = [&](int64_t out_row0) {
    return static_cast<char*>(params.out) +
           sizeof(Element) * (batch * params.out_strides.batch + (out_row0 + m0) * params.out_strides.row +
                              int64_t(head) * params.out_strides.head);
  };
  char* gO = out_tile(row0_q);
  const int64_t o_row_bytes = sizeof(Element) * params.out_strides.row;

  // Per-thread fragment coordinates: rows g and g + 8 of each 16-row tile, columns 2t, 2t + 1.
  const int g = lane / 4;
  const int t = lane % 4;
  // This warp's first row of the tile and first key of each K/V tile.
  const int warp_row0 = Traits::kSplitKeys ? 0 : warp * Traits::kRowsPerWarp;
  const int warp_key0 = Traits::kSplitKeys ? warp * Traits::kWarpKeys : 0;
  // Shared-memory byte addresses of this lane's ldmatrix rows (warp_gemm.h): Q is an A operand
  // stored [m][k] (kind A), K a B operand stored [n][k] (kind B), V a B operand stored [k][n]
  // read with .trans (kind A). The products add compile-time offsets to these.
  const uint32_t q_frag_addr = Layout::smem_at(sQ, warp_row0 + ldsm_row_a(lane), ldsm_col_a(lane));
  // An e4m3 cache's tiles take the same addressing in their 16-bit view (warp_gemm_e4m3.h).
  const uint32_t k_frag_addr = KVLayout::smem_at(sK, warp_key0 + ldsm_row_b(lane), ldsm_col_b(lane));
  const uint32_t v_frag_addr = KVLayout::smem_at(sV, warp_key0 + ldsm_row_a(lane), ldsm_col_a(lane));

  float o_acc[kMTiles][kDTiles][4];
  float row_max[kMTiles][2];
  float row_sum[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o_acc[mt][dt][e] = 0.0f;
    }
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.0f;
  }

  // Scores live in log2 units after `to_log2`: the lean path folds scale * log2(e) into the
  // exponent's FMA; the modifier path converts each score explicitly (softcap needs the tanh of
  // the scaled score) and then uses a unit factor.
  // An e4m3 cache: k_descale joins the softmax scale here and v_descale the output's
  // normalisation in the epilogue (read there: no register held across the loop), once per
  // (sequence, kv head) (docs/SEMANTICS.md, "FP8 KV cache"); both are 1 otherwise.
  const float k_descale = Traits::kFp8Cache ? params.k_descale.at(batch, head_k) : 1.0f;
  const float scale_log2 = params.scale_log2 * k_descale;
  const bool use_softcap = kMods && params.softcap > 0.0f;
  const float exp_scale = kMods ? 1.0f : scale_log2;
  const float softcap_in = use_softcap ? params.scale * k_descale / params.softcap : 0.0f;
  const float softcap_out = use_softcap ? params.softcap * kLog2e : 0.0f;
  const float alibi_slope_log2 =
      kMods && params.alibi != nullptr
          ? params.alibi[batch * params.alibi_batch_stride + head] * kLog2e
          : 0.0f;
  const bool use_dropout = kMods && params.has_dropout();
  const uint32_t dropout_bh = uint32_t(batch) * uint32_t(params.heads) + uint32_t(head);

  // Key tiles are visited from the last: every one of [n_lo, n_hi), or under a block mask the
  // ones its list names for this query tile (block_tiles.h), each with the element check its
  // kind needs. Without a block mask every tile is kTileMask (attn_mask given) or kTileClean.
  int n_first = n_hi - 1;
  TileWalk walk;
  const bool walk_list = kBiasMask && params.block_tiles.on();
  int kind = kTileClean;
  if constexpr (kBiasMask) {
    if (params.mask.defined()) kind = kTileMask;
    if (walk_list) {
      walk = tile_walk(params.block_tiles, batch, head, params.heads, m_block, n_hi);
      n_first = walk.next(&kind);
    }
  }

  // (The plain kernels keep their original expressions, which compile to the same code as
  // before this walk existed: verified on the SASS.)
  if (kBiasMask ? n_first >= n_lo : n_hi > n_lo) {
    if (Traits::kSplitKeys && fold.fold > 1) {
      // Folded rows (FoldedRows): each thread's row from its own offset; gQ is row 0's.
      const char* q0 = static_cast<const char*>(gQ.row(-m0));
      constexpr int kRowsPerPass = Traits::kThreads / Traits::kChunksPerRow;
      load_rows_gather<Element, kBlockM, Traits::kThreads, Traits::kChunksPerRow, typename Traits::SmemLayout>(
          sQ,
          [&](int p) {
            const int r = m0 + tid / Traits::kChunksPerRow + p * kRowsPerPass;
            return q0 + sizeof(Element) * fold.offset(r, params.q_strides.row, params.q_fold_head);
          },
          q0, rows_here, tid);
    } else if (rows_here == kBlockM) {
      load_tile<Traits, kBlockM, true>(sQ, gQ, kBlockM, tid);
    } else {
      load_tile<Traits, kBlockM, false>(sQ, gQ, rows_here, tid);
    }
    if (paged) {
      const int n0 = (n_hi - 1) * kBlockN;
      fetch.load(pages, int(row0_k) + n0, seqlen_k - n0, tid);
      fetch.store(page_offsets(n_hi - 1), v_offsets(), pages, int(row0_k) + n0, params.k_strides, params.v_strides,
                  tid);
      __syncthreads();
      load_paged_tile<Traits>(sK, params.k, params.k_strides.head, head_k, page_offsets(n_hi - 1), seqlen_k - n0, tid);
      if (n_hi - 2 >= n_lo) fetch.load(pages, int(row0_k) + n0 - kBlockN, kBlockN, tid);
    } else {
      load_kv_tile<Traits>(sK, gK, (kBiasMask ? n_first : n_hi - 1) * kBlockN, seqlen_k, tid);
      // The first bias tile travels with the first K tile (one commit group).
      if constexpr (Traits::kBiasSmem) {
        if (bias_smem) {
          load_bias_tile<kBlockM, kBlockN, Traits::kThreads>(ptx::smem_addr(s_bias_bytes), params, batch, head, m0,
                                                             n_first * kBlockN, seqlen_q, seqlen_k, tid);
        }
      }
    }
    ptx::cp_async_commit();
    if constexpr (kPrefetchV) {
      // The first V tile too, while its buffer is free (the loop's first iteration copies none).
      const int n0 = n_first * kBlockN;
      if (paged) {
        load_paged_tile<Traits>(sV, params.v, params.v_strides.head, head_k, page_offsets(n_first) + v_offsets(),
                                seqlen_k - n0, tid);
      } else {
        load_kv_tile<Traits>(sV, gV, n0, seqlen_k, tid);
      }
      ptx::cp_async_commit();
    }
    if constexpr (Traits::kFp8Cache) {
      // Q's columns into K's fragment order (warp_gemm_e4m3.h), once; the loop's first barrier
      // orders this before any read. The first K tile's copy is in flight meanwhile.
      ptx::cp_async_wait<kPrefetchV ? 1 : 0>();
      __syncthreads();
      permute_q_e4m3<kBlockM, Traits::kHeadDim, Traits::kThreads, Layout>(sQ, tid);
    }
  }

  int n_next = -1;
  bool v_prefetched = kPrefetchV;
  for (int n_block = n_first; n_block >= n_lo; n_block = kBiasMask ? n_next : n_block - 1) {
    const int n0 = n_block * kBlockN;
    // The tile after this one (below n_lo: none); its kind is read ahead of its use.
    const int this_kind = kind;
    if constexpr (kBiasMask) n_next = walk_list ? walk.next(&kind) : n_block - 1;
    const int key0 = n0 + warp_key0;  // this warp's first key
    const bool v_ahead = v_prefetched;  // V_j in flight since the prologue
    v_prefetched = false;
    if (v_ahead) {
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    __syncthreads();  // K_j (and Q) landed; every warp is done with the V buffer
    FLASHATTN_DECODE_TRACE(1)
    if (paged) {
      // K_j's keys; then the next K block's (fetched during the last iteration), read by the
      // threads after the barrier below (the buffer it overwrites was last read by V_{j+1},
      // before the barrier above); then the table read for the block after it.
      if (!v_ahead) {
        load_paged_tile<Traits>(sV, params.v, params.v_strides.head, head_k, page_offsets(n_block) + v_offsets(),
                                seqlen_k - n0, tid);
      }
      if (n_block > n_lo) {
        fetch.store(page_offsets(n_block - 1), v_offsets(), pages, int(row0_k) + n0 - kBlockN, params.k_strides,
                    params.v_strides, tid);
        if (n_block - 2 >= n_lo) fetch.load(pages, int(row0_k) + n0 - 2 * kBlockN, kBlockN, tid);
      }
    } else if (!v_ahead) {
      load_kv_tile<Traits>(sV, gV, n0, seqlen_k, tid);
    }
    ptx::cp_async_commit();

    // S = Q K^T for this warp's rows.
    float s[kMTiles][kNTiles][4];
    zero_acc(s);
    if constexpr (Traits::kFp8Cache) {
      warp_gemm_qk_e4m3<Element, kMTiles, kNTiles, Traits::kHeadDim, Layout, KVLayout>(s, q_frag_addr, k_frag_addr);
    } else {
      warp_gemm_abt<Element, kMTiles, kNTiles, Traits::kHeadDim / 16, Layout, Layout>(s, q_frag_addr, k_frag_addr);
    }

    // Score modifiers, then the mask (only on blocks that straddle a boundary).
    const bool needs_mask = mask.block_needs_mask(tok_begin, tok_end, key0, key0 + Traits::kWarpKeys);
    if (kMods || needs_mask) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int i = m0 + warp_row0 + mt * 16 + g + 8 * h;
          // Visible keys of row i relative to this lane's first column key0 + 2t: one interval,
          // so each element costs two compares and a select.
          int lo, hi;
          mask.row_range(Traits::kSplitKeys ? fold.token(i) : i, &lo, &hi);
          lo -= key0 + 2 * t;
          hi -= key0 + 2 * t;
          ScoreRow mods_row{};
          if constexpr (kBiasMask) mods_row = score_row(params, batch, head, min(i, seqlen_q - 1));
          // This lane's bias word of chunk 0 in row i's tile row (bias_smem_offset): row r has
          // r % 8 == g; chunk nt is one XOR away.
          // The row's kNTiles words are read together, ahead of the per-element branches below
          // (read inside them, each waited for its own shared-memory latency). Only kernels with
          // a bias tile instantiate the offset (it needs 64-key rows; the modifier kernels' tiles
          // may be narrower).
          uint32_t bias_words[kNTiles] = {};
          if constexpr (Traits::kBiasSmem) {
            const int bias_r = warp_row0 + mt * 16 + g + 8 * h;
            const uint32_t bias_off0 = bias_smem_offset<kBlockN>(bias_r, 0) + 4 * t;
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt) {
              bias_words[nt] =
                  bias_smem ? *reinterpret_cast<const uint32_t*>(s_bias_bytes + (bias_off0 ^ uint32_t(nt << 4))) : 0u;
            }
          }
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) {
            const float2 bias_pair = bias_pair_log2<Element>(bias_words[nt]);
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int c = nt * 8 + e;  // column offset from key0 + 2t
              float x = s[mt][nt][2 * h + e];
              if constexpr (kMods) {
                x = use_softcap ? ptx::tanh_approx(x * softcap_in) * softcap_out : x * scale_log2;
                x -= alibi_slope_log2 * fabsf(float(mask.diag(i) - (key0 + 2 * t + c)));
              }
              if constexpr (kBiasMask) {
                // After softcap and ALiBi (both additions: the order is rounding only, and the
                // CPU backend's), then the element mask of the tile's kind.
                const int j = min(key0 + 2 * t + c, seqlen_k - 1);
                if (Traits::kBiasSmem && bias_smem) {
                  x += e == 0 ? bias_pair.x : bias_pair.y;
                } else if (params.bias.defined()) {
                  x += bias_log2(params, mods_row, j);
                }
                if (score_hidden(params, mods_row, this_kind, j)) x = -INFINITY;
              }
              if (needs_mask && (c < lo || c >= hi)) x = -INFINITY;
              s[mt][nt][2 * h + e] = x;
            }
          }
        }
      }
    }

    ptx::cp_async_wait<0>();
    __syncthreads();  // V_j landed; every warp is done with the K buffer
    if (kBiasMask ? n_next >= n_lo : n_block > n_lo) {
      // Blocks below the last are whole: no predicate.
      if (paged) {
        load_paged_tile<Traits>(sK, params.k, params.k_strides.head, head_k, page_offsets(n_block - 1), kBlockN, tid);
      } else {
        const RowPtr tile{static_cast<const char*>(gK.row(kBiasMask ? n_next * kBlockN : n0 - kBlockN)), gK.row_bytes};
        load_kv_rows<Traits, true>(sK, tile, kBlockN, tid);
        // The next bias tile with the next K tile: every warp read this one before the barrier.
        if constexpr (Traits::kBiasSmem) {
          if (bias_smem) {
            load_bias_tile<kBlockM, kBlockN, Traits::kThreads>(ptx::smem_addr(s_bias_bytes), params, batch, head,
                                                               m0, n_next * kBlockN, seqlen_q, seqlen_k, tid);
          }
        }
      }
      ptx::cp_async_commit();
    }

    // Online softmax with lazy rescaling (FlashAttention-4): a row adopts a new maximum only
    // when it exceeds the kept one by more than kRescaleThreshold (log2 units), so most blocks
    // skip the O rescale; P = exp2(S - kept max) then stays below 2^threshold, and the result is
    // exact because the final normalisation uses the same kept maximum.
    bool any_rescale = false;
    float correction[kMTiles][2];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float part[kNTiles];
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) part[nt] = fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]);
        float mx = tree_reduce(part, [](float a, float b) { return fmaxf(a, b); });
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float kept = row_max[mt][h];
        // From -inf, any finite maximum is adopted ((mx - -inf) = +inf); -inf stays (NaN > x).
        const bool adopt = (mx - kept) * exp_scale > kRescaleThreshold;
        correction[mt][h] = adopt ? ptx::exp2_approx((kept - mx) * exp_scale) : 1.0f;
        row_max[mt][h] = adopt ? mx : kept;
        any_rescale |= adopt;
      }
    }
    if (__any_sync(0xffffffffu, any_rescale)) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          row_sum[mt][h] *= correction[mt][h];
#pragma unroll
          for (int dt = 0; dt < kDTiles; ++dt) {
            o_acc[mt][dt][2 * h] *= correction[mt][h];
            o_acc[mt][dt][2 * h + 1] *= correction[mt][h];
          }
        }
      }
    }
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // A row that has seen no visible key keeps max -inf; subtract 0 instead so that
        // exp2(-inf - (-inf)) never forms a NaN.
        const float m_scaled = row_max[mt][h] == -INFINITY ? 0.0f : row_max[mt][h] * exp_scale;
        const int i = m0 + warp_row0 + mt * 16 + g + 8 * h;
        float part[kNTiles];
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          float p0 = ptx::exp2_approx(fmaf(s[mt][nt][2 * h], exp_scale, -m_scaled));
          float p1 = ptx::exp2_approx(fmaf(s[mt][nt][2 * h + 1], exp_scale, -m_scaled));
          part[nt] = p0 + p1;
          if (use_dropout) {
            // Columns 2t and 2t + 1 share one Philox call (four draws per four columns).
            const int j = key0 + nt * 8 + 2 * t;
            const Philox4 r = dropout_draws(params.seed, params.offset, dropout_bh, uint32_t(i),
                                            uint32_t(j) >> 2);
            const bool upper = (j & 2) != 0;
            p0 = (upper ? r.z : r.x) >= params.dropout_threshold ? p0 : 0.0f;
            p1 = (upper ? r.w : r.y) >= params.dropout_threshold ? p1 : 0.0f;
          }
          s[mt][nt][2 * h] = p0;
          s[mt][nt][2 * h + 1] = p1;
        }
        row_sum[mt][h] += tree_reduce(part, [](float a, float b) { return a + b; });
      }
    }

    // O += P V: P stays in registers (two adjacent S tiles form one A fragment).
    if constexpr (Traits::kFp8Cache) {
      warp_gemm_pv_e4m3<kMTiles, kDTiles, Traits::kWarpKeys / 16, KVLayout>(o_acc, s, v_frag_addr);
    } else {
      warp_gemm_rs<Element, kMTiles, kDTiles, Traits::kWarpKeys / 16, Layout>(o_acc, s, v_frag_addr);
    }
  }

  FLASHATTN_DECODE_TRACE(2)
  // Split-KV decode with the fused combine (merge_if_last_split): this CTA's row group
  // (batch, head, query block) and the first global row of its partials.
  const bool fused_combine = Traits::kSplitKeys && num_splits > 1 && params.split_counters != nullptr;
  // Split-KV decode launched as clusters of its num_splits CTAs (launch_fwd, sm90): the partials
  // stay in shared memory and the cluster merges them (merge_splits_in_cluster).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const bool cluster_merge = Traits::kSplitKeys && num_splits > 1 && ptx::cluster_nctarank() == uint32_t(num_splits);
#else
  constexpr bool cluster_merge = false;
#endif
  // The cluster's partial rows: V's buffer, free after the loop ([kBlockM][kHeadDim], then LSEs).
  float* const part = reinterpret_cast<float*>(sV);
  static_assert(!Traits::kSplitKeys || Traits::kBlockM * (Traits::kHeadDim + 1) * sizeof(float) <=
                                           Traits::kSmemKV * sizeof(Element),
                "the cluster's partial rows fit in V's buffer");
  const int group = (batch * int(gridDim.y) + head) * int(gridDim.x) + m_block;
  int* const flag = reinterpret_cast<int*>(sQ);
  // This tile's first query row in the packed tensors, for the epilogue. A cache call's is 0;
  // a varlen one's (with a block table) is read again here rather than held across the key loop.
  int64_t row0_q_out = row0_q;
  if constexpr (Traits::kCache) {
    row0_q_out =
        params.is_varlen() ? clamp_row0(ptx::ld_global_nc_here(params.cu_seqlens_q + batch), rows_limit(params.total_q))
                           : 0;
    gO = out_tile(row0_q_out);
  }
  // (Folded varlen rows: the sequence's first token row times the fold, FoldedRows.)
  const int64_t global_row0 = params.is_varlen() ? (Traits::kSplitKeys ? row0_q_out * fold.fold : row0_q_out) + m0
                                                 : int64_t(batch) * params.seqlen_q + m0;
  if constexpr (Traits::kSplitKeys) {
    // The warps hold partial results for the same rows over disjoint keys. Warps 1.. leave O,
    // their kept row maxima and their lane's partial row sums in the K/V buffers, laid out
    // [warp - 1][value][lane] (conflict-free); warp 0 rescales every part to the largest kept
    // maximum, adds them and alone runs the epilogue.
    constexpr int kStats = kMTiles * kDTiles * 4;  // O first, then (max, sum) per row
    constexpr int kValues = kStats + 4 * kMTiles;
    // The parts fill K's buffer and, where they are larger (d256, the e4m3 cache's 128-key tiles,
    // the bias tiles), the start of V's, where warp 0 then writes the cluster's partial rows.
    constexpr size_t kMergeBytes = size_t(Traits::kWarps - 1) * kValues * 32 * sizeof(float);
    constexpr bool kMergeReachesV = kMergeBytes > Traits::kSmemKV * sizeof(Element);
    static_assert(kMergeBytes <= 2 * Traits::kSmemKV * sizeof(Element), "the warps' parts fit in K's and V's buffers");
    float* merge = reinterpret_cast<float*>(sK);
    __syncthreads();  // every warp is done reading K and V (no copy is in flight after the loop)
    if (warp > 0) {
      float* dst = merge + (warp - 1) * kValues * 32 + lane;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          dst[(kStats + 4 * mt + 2 * h) * 32] = row_max[mt][h];
          dst[(kStats + 4 * mt + 2 * h + 1) * 32] = row_sum[mt][h];
        }
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) dst[((mt * kDTiles + dt) * 4 + e) * 32] = o_acc[mt][dt][e];
        }
      }
    }
    __syncthreads();
    // With the fused combine warps 1.. stay for merge_if_last_split or merge_splits_in_cluster
    // (they pass the epilogue without storing anything: split_writer).
    if (warp > 0 && !fused_combine && !cluster_merge) return;
    if (warp == 0) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float* part = merge + (kStats + 4 * mt + 2 * h) * 32 + lane;
          float mx = row_max[mt][h];
#pragma unroll
          for (int w = 1; w < Traits::kWarps; ++w) mx = fmaxf(mx, part[(w - 1) * kValues * 32]);
          // A part whose kept maximum is -inf saw no visible key and weighs 0 (its O and sum are
          // 0); this also keeps exp2(-inf - -inf) from forming a NaN.
          const auto weight = [&](float m) { return m == -INFINITY ? 0.0f : ptx::exp2_approx((m - mx) * exp_scale); };
          const float self = weight(row_max[mt][h]);
          row_sum[mt][h] *= self;
#pragma unroll
          for (int dt = 0; dt < kDTiles; ++dt) {
            o_acc[mt][dt][2 * h] *= self;
            o_acc[mt][dt][2 * h + 1] *= self;
          }
#pragma unroll
          for (int w = 1; w < Traits::kWarps; ++w) {
            const float* src = merge + (w - 1) * kValues * 32 + lane;
            const float wt = weight(part[(w - 1) * kValues * 32]);
            row_sum[mt][h] += wt * part[(w - 1) * kValues * 32 + 32];
#pragma unroll
            for (int dt = 0; dt < kDTiles; ++dt) {
              o_acc[mt][dt][2 * h] += wt * src[((mt * kDTiles + dt) * 4 + 2 * h) * 32];
              o_acc[mt][dt][2 * h + 1] += wt * src[((mt * kDTiles + dt) * 4 + 2 * h + 1) * 32];
            }
          }
          row_max[mt][h] = mx;
        }
      }
      // Every lane's reads of the parts before any lane writes a partial row over them (V's
      // buffer; compute-sanitizer racecheck reported the cross-lane order as a hazard on the
      // e4m3 cache's window kernel, H200, 2026-12-04).
      if constexpr (kMergeReachesV) __syncwarp();
    }
  }

  FLASHATTN_DECODE_TRACE(4)
  // Epilogue: finish the row sums across the quad, fold in the learnable sink (core/sink.h),
  // normalise, write LSE, stage O through this warp's own rows of sQ (no other warp reads them)
  // and store 16-byte chunks. Split-KV CTAs write float32 partials without the sink instead,
  // merged by the group's last split CTA (merge_if_last_split) or by fwd_combine_kernel, which
  // add it.
  const float v_descale = Traits::kFp8Cache ? params.v_descale.at(batch, head_k) : 1.0f;
  const float out_scale = (use_dropout ? params.dropout_rescale : 1.0f) * v_descale;
  const bool sink_here = params.learnable_sink != nullptr && num_splits == 1;
  const bool split_writer = !Traits::kSplitKeys || warp == 0;  // the split-key warps merged into warp 0
  const int64_t split_rows = Traits::kSplitKeys ? params.split_rows() : params.total_q;  // (q_fold 1 there)
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = row_sum[mt][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      // The kept maximum in log2 units; __fmul_rn keeps it one rounding whatever follows, so a
      // sink of -inf leaves the LSE bitwise unchanged.
      float m_log2 = __fmul_rn(row_max[mt][h], exp_scale);
      float o_factor = 1.0f;
      if (sink_here) {
        const float sink = params.learnable_sink[sink_head(params, head, m0 + warp_row0 + mt * 16 + g + 8 * h)];
        o_factor = fold_sink(sink * kLog2e, &m_log2, &l, [](float x) { return ptx::exp2_approx(x); });
      }
      // No visible key and no sink (or nothing processed); a NaN sum (non-finite inputs) stays NaN.
      const bool empty = l == 0.0f;
      const float inv = empty ? 0.0f : out_scale * o_factor / l;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        o_acc[mt][dt][2 * h] *= inv;
        o_acc[mt][dt][2 * h + 1] *= inv;
      }
      const int r = warp_row0 + mt * 16 + g + 8 * h;
      const float lse = empty ? -INFINITY : (m_log2 + __log2f(l)) * kLn2;
      if (num_splits > 1) {
        if (r < rows_here && split_writer) {
          const int64_t row = global_row0 + r;
          float* lse_dst = cluster_merge ? part + kBlockM * Traits::kHeadDim + r
                                         : params.split_lse + (int64_t(split) * params.heads + head) * split_rows + row;
          if (t == 0) *lse_dst = lse;
          float* dst = cluster_merge ? part + r * Traits::kHeadDim
                                     : params.split_out + ((int64_t(split) * split_rows + row) * params.heads + head) *
                                                              Traits::kHeadDim;
          if constexpr (Traits::kFp8Cache) {
            // Tiles 2c and 2c + 1 hold chunk c's even and odd columns (o_col_e4m3): four adjacent.
#pragma unroll
            for (int dt = 0; dt < kDTiles; dt += 2) {
              *reinterpret_cast<float4*>(dst + o_col_e4m3(dt, 0, t)) =
                  make_float4(o_acc[mt][dt][2 * h], o_acc[mt][dt + 1][2 * h], o_acc[mt][dt][2 * h + 1],
                              o_acc[mt][dt + 1][2 * h + 1]);
            }
          } else {
#pragma unroll
            for (int dt = 0; dt < kDTiles; ++dt) {
              *reinterpret_cast<float2*>(dst + dt * 8 + 2 * t) =
                  make_float2(o_acc[mt][dt][2 * h], o_acc[mt][dt][2 * h + 1]);
            }
          }
        }
      } else if (params.lse != nullptr && t == 0 && r < rows_here) {
        float* lse_row = params.lse + batch * params.lse_batch_stride + int64_t(head) * params.lse_head_stride;
        if constexpr (Traits::kSplitKeys) {
          lse_row[row0_q_out + fold.offset(m0 + r, 1, params.lse_fold_head)] = lse;  // FoldedRows
        } else {
          lse_row[row0_q_out + m0 + r] = lse;
        }
      }
    }
  }
  if (num_splits > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (cluster_merge) {
      FLASHATTN_DECODE_TRACE(5)
      FLASHATTN_DECODE_TRACE(3)
#if defined(FLASHATTN_DEV_DECODE_TRACE)
      if (tid == 0) *flag = 1;  // the trace's "merged" column: every CTA of a cluster merges rows
#endif
      merge_splits_in_cluster<Traits>(params, part, global_row0, rows_here, head, tid);
    }
#endif
    if (fused_combine) {
      FLASHATTN_DECODE_TRACE(5)
      __threadfence();  // release: this thread's partials before thread 0's count
      FLASHATTN_DECODE_TRACE(3)
      merge_if_last_split<Traits>(params, flag, group, global_row0, rows_here, head, tid);
    }
    if (fused_combine || cluster_merge) {
#if defined(FLASHATTN_DEV_DECODE_TRACE)
      if (tid == 0) {
        unsigned long long ns1 = 0;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns1));
        printf("decode_trace cta %d split %d last %d ns0 %llu ns1 %llu clk %lld %lld %lld %lld sub %lld %lld\n",
               int(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)), split, *flag, trace_ns0, ns1,
               trace_clk[1] - trace_clk[0], trace_clk[2] - trace_clk[0], trace_clk[3] - trace_clk[0],
               clock64() - trace_clk[0], trace_clk[4] - trace_clk[0], trace_clk[5] - trace_clk[0]);
      }
#endif
    }
    return;
  }
  __syncwarp();  // this warp's last reads of its own Q rows are done before they hold O
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    const int r = warp_row0 + mt * 16 + g;
    if constexpr (Traits::kFp8Cache) {
      // Columns 16c + 4t .. 4t + 3 of chunk c are (tile 2c, tile 2c + 1) x (e, e + 1) (o_col_e4m3).
#pragma unroll
      for (int dt = 0; dt < kDTiles; dt += 2) {
        const int c = o_col_e4m3(dt, 0, t);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          *reinterpret_cast<uint32_t*>(Layout::at(sQ, r + 8 * h, c)) =
              ptx::pack2<Element>(o_acc[mt][dt][2 * h], o_acc[mt][dt + 1][2 * h]);
          *reinterpret_cast<uint32_t*>(Layout::at(sQ, r + 8 * h, c + 2)) =
              ptx::pack2<Element>(o_acc[mt][dt][2 * h + 1], o_acc[mt][dt + 1][2 * h + 1]);
        }
      }
    } else {
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const int c = dt * 8 + 2 * t;
        *reinterpret_cast<uint32_t*>(Layout::at(sQ, r, c)) = ptx::pack2<Element>(o_acc[mt][dt][0], o_acc[mt][dt][1]);
        *reinterpret_cast<uint32_t*>(Layout::at(sQ, r + 8, c)) =
            ptx::pack2<Element>(o_acc[mt][dt][2], o_acc[mt][dt][3]);
      }
    }
  }
  __syncwarp();
  constexpr int kWarpChunks = Traits::kRowsPerWarp * Traits::kChunksPerRow;
#pragma unroll
  for (int c = lane; c < kWarpChunks; c += 32) {
    const int r = warp_row0 + c / Traits::kChunksPerRow;
    const int col = (c % Traits::kChunksPerRow) * 8;
    if (r < rows_here) {
      const uint4 v = *reinterpret_cast<const uint4*>(Layout::at(sQ, r, col));
      // gO is row m0's; a folded row lies elsewhere (FoldedRows).
      const int64_t row_off =
          Traits::kSplitKeys && fold.fold > 1
              ? int64_t(sizeof(Element)) *
                    (fold.offset(m0 + r, params.out_strides.row, params.out_fold_head) - m0 * params.out_strides.row)
              : r * o_row_bytes;
      *reinterpret_cast<uint4*>(gO + row_off + col * sizeof(Element)) = v;
    }
  }
}

#undef FLASHATTN_DECODE_TRACE

// Merges split-KV partials (combine_split_row), one warp per (row, head), as a second kernel
// after the split kernel: used where the split CTAs do not merge themselves (params.split_counters
// null: the row-split tile, the kSplitCombineKernel switch, more row groups than counters).
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(128) fwd_combine_kernel(const __grid_constant__ ForwardParams params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent of the split kernel (fwd_launch.h): wait here for its
  // partials (a no-op for an ordinary launch).
  cudaGridDependencySynchronize();
#endif
  const int64_t row = int64_t(blockIdx.x) * 4 + threadIdx.x / 32;  // global row
  // Varlen rows past cu_seqlens_q[batch] belong to no sequence: leave them untouched.
  const int64_t rows =
      params.is_varlen()
          ? int64_t(clamp_row0(params.cu_seqlens_q[params.batch], rows_limit(params.total_q))) * params.q_fold
          : params.split_rows();
  if (row >= rows) return;
  combine_split_row<Element, kHeadDim, 64>(params, GlobalPartials<kHeadDim>(params, row, blockIdx.y, threadIdx.x % 32),
                                           row, blockIdx.y, threadIdx.x % 32);
}

}  // namespace flashattn::cuda
