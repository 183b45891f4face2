// Pieces shared by the sm80-class backward kernels (bwd_kernel.h, bwd_dq_kernel.h,
// bwd_preprocess.h): compile-time traits, the kernel parameters with the workspace, and the
// element-wise step that turns S and dP into the dropped probabilities and the score gradients.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/params.h"
#include "core/philox.h"
#include "cuda/common/cta_order.h"
#include "cuda/common/dq_layout.h"
#include "cuda/common/mask.h"
#include "cuda/common/score_tensors.h"
#include "cuda/common/seq_extent.h"
#include "cuda/common/smem_layout.h"
#include "cuda/common/tile_copy.h"
#include "cuda/common/tile_kind.h"
#include "cuda/common/tile_size.h"
#include "cuda/ptx/cp_async.h"
#include "cuda/ptx/ldmatrix.h"
#include "cuda/ptx/math.h"
#include "cuda/ptx/mma.h"
#include "cuda/common/warp_gemm.h"
#include "cuda/sm80/fwd_kernel.h"  // MaskMode, ScoreMods, kLog2e, RowPtr, row_ptr

namespace flashattn::cuda {

// Backward parameters as the kernels see them: the validated BackwardParams plus the workspace
// that run_bwd allocates (stream-ordered) for one call.
//
// Workspace rows. Per-row f32 data (LSE, D, the dQ accumulator) is indexed by a workspace row:
// sequence b's query row i lives at ws_row0(b) + i, and every sequence owns the rows
// [ws_row0(b), ws_row0(b) + round_up(seqlen_b, ws_block)) exclusively, so kernels may read and
// write whole block_m tiles without bounds checks. Dense: ws_row0(b) = b * round_up(seqlen_q,
// ws_block). Varlen: ws_row0(b) = round_down(cu_seqlens_q[b], 16) + b * (ws_block + 16), which
// is a multiple of 16 (whole dQ fragment groups; 16-byte aligned statistics for
// cp.async) and at least round_up(seqlen_b, ws_block) past the previous sequence's start.
struct BwdKernelParams : BackwardParams {
  int64_t ws_rows = 0;       // workspace rows per head
  int32_t ws_block = 0;      // = the main kernel's block_m
  int32_t ws_seq_rows = 0;   // dense: round_up(seqlen_q, ws_block)
  float* lse_log2 = nullptr;  // (heads, ws_rows): LSE * log2(e); +inf where LSE = -inf and on padding
  float* dsum = nullptr;      // (heads, ws_rows): D = rowsum(dO * O); 0 on padding
  float* dq_accum = nullptr;  // (heads, ws_rows, head_dim) f32 in fragment order (dq_frag_offset),
                              // unscaled; null when deterministic
  // GQA: the query heads of one kv head are split into kv_splits chunks, one CTA per chunk and key
  // block. With kv_splits > 1 each chunk writes unscaled f32 partials, summed by a reduction:
  //   dk_partial, dv_partial (kv_splits, total_k, heads_k, head_dim), row = k_row0(b) + j.
  int32_t kv_splits = 1;
  float* dk_partial = nullptr;
  float* dv_partial = nullptr;
  // Q/dO step buffers of the main kernel: 2, or 1 where the GPU's shared memory is too small
  // (run_bwd picks; see BwdTraits).
  int32_t step_buffers = 2;
  size_t smem_limit = 0;  // the main kernel's dynamic shared-memory limit on this device
  // Causal launches of BwdTraits::kInterleave kernels start the main kernel's CTAs in groups
  // of this many (kv head [, split], batch) planes (cuda/common/cta_order.h); 1 = plain order.
  int32_t cta_group_planes = 1;
  // dsink: one partial sum per preprocess CTA, (heads, batch, sink_partials_per_head / batch),
  // summed in that order by bwd_sink_grad_kernel. Null when dsink is not requested.
  float* sink_partial = nullptr;
  int32_t sink_partials_per_head = 0;
  // ScoreMods::kBiasMask under a block mask: the table of block states (build_block_states,
  // cuda/block_tiles.h; no tile lists) and the kinds of the main kernel's and (deterministic
  // mode) the dQ kernel's (query tile, key tile) steps (build_tile_kinds); off otherwise.
  BlockTilePlan block_tiles;
  TileKinds step_kinds, dq_step_kinds;
  // ScoreMods::kBiasMask with dbias (DbiasPlan, bwd_dbias.h): where the main kernel puts the f32
  // values of (sequence b, head h), at data + b * batch + h * head + i * row + j: dS of query i,
  // key j (store_dbias), or with dbias_row_sum its sum over the query rows at i = 0
  // (flush_dbias_cols). data: dbias itself when no two (b, h) share one of its elements, else
  // the (batch, heads, 1 or seqlen_q, seqlen_k) partials that reduce_dbias sums into dbias.
  // Null data: no dbias.
  Broadcast4 dbias_out;
  bool dbias_row_sum = false;

  __device__ __forceinline__ int64_t ws_row0(int b, int64_t row0_q) const {
    return is_varlen() ? (row0_q & ~int64_t(kWsRowAlign - 1)) + int64_t(b) * (ws_block + kWsRowAlign)
                       : int64_t(b) * ws_seq_rows;
  }
  // Global row of key j = 0 of sequence b in the (total_k, ...) partials.
  __device__ __forceinline__ int64_t k_row0(int b, int64_t row0_k) const {
    return is_varlen() ? row0_k : int64_t(b) * seqlen_k;
  }
};

// An int kept in shared memory and read there at every use (volatile, so never hoisted into a
// register that lives across a loop): for per-CTA values that would otherwise spill.
struct SmemInt {
  const int* p;
  __device__ __forceinline__ operator int() const {
    int v;
    asm volatile("ld.shared.s32 %0, [%1];\n" : "=r"(v) : "r"(ptx::smem_addr(p)));
    return v;
  }
};

// Compile-time configuration of the main backward kernel (one CTA per key block).
template <typename Element_, int kHeadDim_, MaskMode kMask_, ScoreMods kMods_>
struct BwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr MaskMode kMask = kMask_;
  static constexpr ScoreMods kMods = kMods_;

  static constexpr BwdTile kTile = bwd_tile(kHeadDim);
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kWarps = kTile.warps;
  static constexpr int kThreads = kWarps * 32;

  // S = Q K^T and dP = dO V^T: warp tile kSdpRows x kSdpCols of the kBlockM x kBlockN block.
  static constexpr int kSdpWarpsM = kTile.sdp_warps_m;
  static constexpr int kSdpWarpsN = kWarps / kSdpWarpsM;
  static constexpr int kSdpRows = kBlockM / kSdpWarpsM;
  static constexpr int kSdpCols = kBlockN / kSdpWarpsN;
  static constexpr int kSdpMTiles = kSdpRows / 16;
  static constexpr int kSdpNTiles = kSdpCols / 8;
  // With score modifiers the warp tile may be processed in row slices: the softcap, ALiBi and
  // dropout temporaries need the registers that part of S and dP gives back (at the price of
  // reading the K / V fragments once per slice).
  // kBiasMask: at least two slices where the warp tile has two 16-row tiles (its per-row
  // pointers into attn_bias, attn_mask and the block states need more registers still; see
  // the ptxas figures in sm80/bwd_kernel.h).
  static constexpr int kSdpSplits = kMods == ScoreMods::kBiasMask && kSdpMTiles >= 2
                                        ? (kTile.mods_splits > 2 ? kTile.mods_splits : 2)
                                    : kMods != ScoreMods::kNone ? kTile.mods_splits
                                                                : 1;
  static constexpr int kSdpSubMTiles = kSdpMTiles / kSdpSplits;
  // dV += P^T dO and dK += dS^T Q: warp tile kKvRows keys x kKvCols columns.
  static constexpr int kKvWarpsN = kTile.kv_warps_n;
  static constexpr int kKvWarpsD = kWarps / kKvWarpsN;
  static constexpr int kKvRows = kBlockN / kKvWarpsN;
  static constexpr int kKvCols = kHeadDim / kKvWarpsD;
  static constexpr int kKvMTiles = kKvRows / 16;
  static constexpr int kKvDTiles = kKvCols / 8;
  // dQ = dS K: warp tile kDqRows x kDqCols per column pass of kDqPassCols columns.
  static constexpr int kDqWarpsM = kTile.dq_warps_m;
  static constexpr int kDqWarpsD = kWarps / kDqWarpsM;
  static constexpr int kDqPasses = kTile.dq_chunks;
  static constexpr int kDqPassCols = kHeadDim / kDqPasses;
  static constexpr int kDqRows = kBlockM / kDqWarpsM;
  static constexpr int kDqCols = kDqPassCols / kDqWarpsD;
  static constexpr int kDqMTiles = kDqRows / 16;
  static constexpr int kDqDTiles = kDqCols / 8;

  // Causal launches start their CTAs in the interleaved order of cta_order.h, the CTA's indices
  // kept in shared memory (bwd_kernel.h). Plain kernels where the tile says so: with modifiers
  // the shared-memory reads cost registers elsewhere (ptxas sm90, d128 window: 20 -> 60 bytes
  // of spills), and kernels without a mask have nothing to reorder.
  static constexpr bool kInterleave =
      kTile.interleave && kMask == MaskMode::kWindow && kMods == ScoreMods::kNone;

  // Shared memory (smem_layout.h):
  //   sK, sV      (kBlockN, kSmemStride)        loaded once
  //   sP, sdS     (kBlockM, kPStride)           dropped P and dS of the current step
  //   step buffers, 2 (double-buffered: the next step's copies overlap this step) or 1 (where
  //   the GPU's shared memory cannot hold two, e.g. A100 at head dim >= 64), each
  //     sQ, sdO   (kBlockM, kSmemStride)
  //     stats     (2, kBlockM) f32              LSE * log2(e) and D
  // sP and sdS are written from registers and use PaddedRows. The copied tiles (K, V, Q, dO)
  // use SwizzledRows where kSwizzle says (whole 128-byte rows, and warp column offsets that the
  // swizzle's XOR steps reach without carries; measured on H200: backward 2-5% faster than
  // padded rows), else PaddedRows.
  static constexpr bool kSwizzle = kHeadDim % 64 == 0 && kBlockM % 8 == 0 && kBlockN % 8 == 0 &&
                                   (kThreads / (kHeadDim / 8)) % 8 == 0 &&
                                   swizzle_steps_ok(kKvCols / 8, kKvWarpsD, kKvDTiles) &&
                                   swizzle_steps_ok(kDqCols / 8, kDqWarpsD, kDqDTiles) &&
                                   kDqPassCols % 64 == 0;
  using RowLayout = std::conditional_t<kSwizzle, SwizzledRows<kHeadDim>, PaddedRows<kHeadDim + 8>>;
  using PLayout = PaddedRows<kBlockN + 8>;
  static constexpr int kSmemStride = RowLayout::kStride;
  static constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks
  static constexpr int kPStride = PLayout::kStride;
  static constexpr int kSmemKV = kBlockN * kSmemStride;
  static constexpr int kSmemQ = kBlockM * kSmemStride;
  static constexpr int kSmemP = kBlockM * kPStride;
  // Each step buffer also holds the step's (query tile, key tile) bias tile after the stats
  // (score_tensors.h load_bias_tile), copied with the step's Q and dO (dev/NOTES.md "Bias tiles
  // through shared memory"; H200 d128 bf16: 55.1 -> 63.0 TFLOP/s, dQ/dK/dV/dBias bitwise equal to
  // the per-element reads). d96 / d128 fit (64 x 128 steps: +16 KB per buffer): d64's 128 x 128
  // steps would add 32 KB per buffer and lose the double buffer on H200, and at d192 the sm_80
  // binary's spills grew (ptxas, bytes of stores / loads: 56 / 88 -> 88 / 148). Only d128 has
  // run on a GPU, so only d128 takes it.
  static constexpr bool kBiasSmem = kMods == ScoreMods::kBiasMask && kBlockM == 64 && kBlockN % 64 == 0 &&
                                    kHeadDim == 128;
  // A step buffer: sQ, sdO, stats, then (kBiasSmem) the bias tile.
  static constexpr uint32_t kBiasOffset = sizeof(Element) * 2 * kSmemQ + sizeof(float) * 2 * kBlockM;
  static constexpr uint32_t kStepBufBytes = kBiasOffset + (kBiasSmem ? 2 * kBlockM * kBlockN : 0);
  static constexpr size_t kSmemFixedBytes = sizeof(Element) * (2 * kSmemKV + 2 * kSmemP);
  static constexpr size_t kSmemBytes = kSmemFixedBytes + 2 * kStepBufBytes;        // double-buffered
  static constexpr size_t kSmemBytesSingle = kSmemFixedBytes + kStepBufBytes;      // one step buffer
  static_assert(kSmemFixedBytes % 16 == 0 && kStepBufBytes % 16 == 0, "16-byte aligned cp.async targets");
  // The interleaved order's static shared memory (20 bytes, sm_90 binary only) must fit next to
  // the double buffer in sm_90's 227 KB per block (A100's 163 KB is exactly d128's double
  // buffer, which is why the sm_80 binary keeps the plain order).
  static_assert(!kInterleave || kSmemBytes + 128 <= 227 * 1024, "interleave's indices fit in sm_90 shared memory");
  static_assert(!kSwizzle || (sizeof(Element) * kSmemKV % 128 == 0 && sizeof(Element) * kSmemQ % 128 == 0 &&
                              sizeof(Element) * kSmemP % 128 == 0 && kStepBufBytes % 128 == 0),
                "swizzled tiles start on 128-byte boundaries");

  static_assert(kHeadDim % 32 == 0, "head_dim must be a multiple of 32");
  static_assert(!kBiasSmem || (kSmemFixedBytes % 128 == 0 && kBiasOffset % 128 == 0 && kStepBufBytes % 128 == 0),
                "bias tiles start on 128-byte lines (their swizzle XORs address bits 4-6)");
  static_assert(kSdpRows % 16 == 0 && kSdpCols % 16 == 0, "S/dP warp tiles are whole 16 x 16 tiles");
  static_assert(kSdpMTiles % kSdpSplits == 0, "S/dP slices are whole 16-row tiles");
  static_assert(kKvRows % 16 == 0 && kKvCols % 16 == 0, "dK/dV warp tiles are whole 16 x 16 tiles");
  static_assert(kDqRows % 16 == 0 && kDqCols % 16 == 0, "dQ warp tiles are whole 16 x 16 tiles");
  static_assert(kBlockM % 16 == 0 && kBlockN % 16 == 0, "blocks are whole MMA tiles");
  static_assert(kThreads >= kBlockM / 2, "one 16-byte statistics chunk per thread at most");
};

// Compile-time configuration of the deterministic dQ kernel (one CTA per query block, warps
// own 16-row slices like the forward).
template <typename Traits>
struct BwdDqTraits {
  using Element = typename Traits::Element;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr MaskMode kMask = Traits::kMask;
  static constexpr ScoreMods kMods = Traits::kMods;

  static constexpr BwdDqTile kTile = bwd_dq_tile(kHeadDim);
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kWarps = kTile.warps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowsPerWarp = kBlockM / kWarps;
  static constexpr int kMTiles = kRowsPerWarp / 16;
  static constexpr int kNTiles = kBlockN / 8;
  static constexpr int kDTiles = kHeadDim / 8;

  // sQ, sdO (kBlockM, kSmemStride); sK, sV 2 x (kBlockN, kSmemStride); sStats (2, kBlockM) f32.
  using RowLayout = PaddedRows<kHeadDim + 8>;
  static constexpr int kSmemStride = RowLayout::kStride;
  static constexpr int kChunksPerRow = kHeadDim / 8;
  static constexpr int kSmemQ = kBlockM * kSmemStride;
  static constexpr int kSmemKV = kBlockN * kSmemStride;
  static constexpr size_t kSmemBytes =
      sizeof(Element) * (2 * kSmemQ + 4 * kSmemKV) + sizeof(float) * 2 * kBlockM;

  static_assert(kRowsPerWarp % 16 == 0, "each warp owns whole 16-row tiles");
  static_assert(kNTiles % 2 == 0 && kDTiles % 2 == 0, "x4 ldmatrix loads two 8-wide tiles");
  // The workspace is laid out in Traits::kBlockM rows; whole kBlockM tiles must stay inside it.
  static_assert(Traits::kBlockM % kBlockM == 0, "dQ kernel blocks tile the workspace blocks");
  static_assert(kThreads >= kBlockM / 2, "one 16-byte statistics chunk per thread at most");
};

// Query blocks [lo, hi) holding at least one row that sees a key of [col_begin, col_end) (the
// transpose of WindowMask::block_range). Row i sees keys [i + off - left, i + off + right] with
// off = seqlen_k - seqlen_q, so it meets the block iff i >= col_begin - off - right and
// i <= col_end - 1 - off + left.
__device__ __forceinline__ void query_block_range(const WindowMask& mask, int col_begin, int col_end,
                                                  int block_m, int* lo, int* hi) {
  const int64_t off = int64_t(mask.seqlen_k) - mask.seqlen_q;
  int64_t row_begin = 0, row_end = mask.seqlen_q;
  if (mask.right >= 0) row_begin = max(row_begin, int64_t(col_begin) - off - mask.right);
  if (mask.left >= 0) row_end = min(row_end, int64_t(col_end) - off + mask.left);
  if (row_end <= row_begin) {
    *lo = *hi = 0;
    return;
  }
  *lo = int(row_begin / block_m);
  *hi = int((row_end + block_m - 1) / block_m);
}

// Run-time state of the score modifiers for one (batch, head).
struct BwdScoreState {
  float scale_log2;         // plain path: exponent = s * scale_log2 - lse_log2
  bool use_softcap;
  float softcap_in;         // scale / softcap
  float softcap_out;        // softcap * log2(e)
  float alibi_slope_log2;   // 0 when off
  bool use_dropout;
  uint32_t dropout_threshold;
  float dropout_rescale;
  uint64_t seed, offset;
  uint32_t batch_head;      // Philox counter word: batch * heads + head
};

template <ScoreMods kMods>
__device__ __forceinline__ BwdScoreState score_state(const BackwardParams& p, int batch, int head) {
  constexpr bool kAny = kMods != ScoreMods::kNone;  // kBiasMask includes kAny's modifiers
  BwdScoreState st;
  st.scale_log2 = p.scale_log2;
  st.use_softcap = kAny && p.softcap > 0.0f;
  st.softcap_in = st.use_softcap ? p.scale / p.softcap : 0.0f;
  st.softcap_out = st.use_softcap ? p.softcap * kLog2e : 0.0f;
  st.alibi_slope_log2 =
      kAny && p.alibi != nullptr ? p.alibi[batch * p.alibi_batch_stride + head] * kLog2e : 0.0f;
  st.use_dropout = kAny && p.has_dropout();
  st.dropout_threshold = p.dropout_threshold;
  st.dropout_rescale = p.dropout_rescale;
  st.seed = p.seed;
  st.offset = p.offset;
  st.batch_head = uint32_t(batch) * uint32_t(p.heads) + uint32_t(head);
  return st;
}

// The element-wise heart of the backward, in two passes over one warp's accumulator tiles.
// Element (mt, nt, e) sits at block row row0 + mt*16 + g + 8*(e/2) and block column
// col0 + nt*8 + 2t + e%2 (g = lane/4, t = lane%4); m0 and n0 place the block in the sequence;
// stat_* arrays are indexed by block row. With x the score in log2 units (scale, softcap, ALiBi
// as in the forward; -inf where masked), keep the forward's dropout mask and r = 1/(1-p):
//
//   pass 1 (S = Q K^T in s):  P = exp2(x - LSE*log2(e))   (LSE*log2(e) = +inf for rows without
//                             keys: P = 0, never NaN)
//                             Pd = keep ? P : 0 -> stored to sP (dV = r * Pd^T dO; r is applied
//                             in the epilogue)
//                             s <- P * (softcap ? 1 - tanh^2 : 1)
//   pass 2 (dP = dO V^T in dp): dp <- s * ((keep ? r * dP : 0) - D)
//
// dp then holds dS with respect to the raw product q.k divided by the softmax scale (the scale
// is applied once to dK and dQ at the end). Splitting the passes around the dP product keeps
// the dropout and softcap temporaries out of the region where S and dP are both live.

// ScoreMods::kBiasMask: what pass 1 needs, besides the kernel parameters, to read attn_bias,
// attn_mask and the block states for one step: the step's (sequence, head), the kind of its
// (query tile, key tile) pair (tile_kind.h: which element check it needs) and the sequence's
// lengths (reads are clamped there, score_tensors.h). Unused by the other variants.
struct StepScores {
  int batch, head, kind, seqlen_q, seqlen_k;
  // The byte offset of the step's bias tile (BwdTraits::kBiasSmem) from the kernel's dynamic
  // shared memory, or -1 where the call's bias is not copied (bias_tile_copyable; the dQ kernel)
  // and is read per element. One register: a pointer and a flag spilled more.
  int bias_tile = -1;
};

// The kind of the step (query tile m, key tile n) of (sequence batch, query head head) under a
// block mask, from `kinds`, the table of the kernel's tiling (build_tile_kinds): a TileKind, or
// kTileSkipped when the tile touches no kept block. One byte read: classifying in the loop from
// the block states instead (tile_kind over the user blocks a tile touches) cost the main
// kernel's d128 hot loop 70 more bytes of spills (ptxas sm_90: 40 -> 112 bytes of stores).
__device__ __forceinline__ int32_t step_kind(const BwdKernelParams& p, const TileKinds& kinds, int batch, int head,
                                             int m, int n) {
  const int64_t plane = p.block_tiles.plane(batch, head, p.heads);
  return __ldg(kinds.kinds + (plane * kinds.m_tiles + m) * kinds.n_tiles + n);
}

// The element check of a step without a block mask: attn_mask's where given.
__device__ __forceinline__ int32_t unplanned_kind(const BwdKernelParams& p) {
  return p.mask.defined() ? kTileMask : kTileClean;
}

// One bit per element of a warp's kMT x kNT accumulator tiles (at most 64).
template <int kMT, int kNT>
struct KeepBits {
  static_assert(kMT * kNT * 4 <= 64, "keep bits fit one 64-bit word");
  uint64_t bits;
  __device__ __forceinline__ static int bit(int mt, int nt, int e) { return (mt * kNT + nt) * 4 + e; }
  __device__ __forceinline__ bool get(int mt, int nt, int e) const { return (bits >> bit(mt, nt, e)) & 1u; }
};

// Calls f(mt, nt, h, hide0, hide1) for each pair of adjacent elements (columns 2t, 2t + 1 of an
// 8-column tile) of a lane's kMT x kNT accumulator tiles whose first row is `row` and first key
// `col` (absolute indices): hide = the key is outside the row's window or past seqlen_k.
template <int kMT, int kNT, typename F>
__device__ __forceinline__ void for_each_masked_pair(const WindowMask& mask, int row, int col, int lane, F&& f) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int lo, hi;
      mask.row_range(row + mt * 16 + lane / 4 + 8 * h, &lo, &hi);
      lo -= col + 2 * (lane % 4);  // as column offsets of this lane's element e = 0
      hi -= col + 2 * (lane % 4);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const int c = nt * 8;
        f(mt, nt, h, c < lo || c >= hi, c + 1 < lo || c + 1 >= hi);
      }
    }
  }
}

// Pass 1. Also records the dropout keep mask in `keep` for pass 2 (written only when dropout is
// on). kPStride = 0: Pd is not stored (the deterministic dQ kernel needs dS only).
// kFactorLater (kBiasMask with softcap and dbias: bwd_kernel's own instantiation): softcap's
// factor (1 - tanh^2) is left out of P, so that probs_to_grads gives dbias's term P (dP - D), and
// the kernel applies it to dS afterwards (softcap_factor).
template <ScoreMods kMods, typename Element, int kMT, int kNT, int kPStride, int kBiasKeys = 64,
          bool kFactorLater = false>
__device__ __forceinline__ void scores_to_probs(float (&s)[kMT][kNT][4], KeepBits<kMT, kNT>& keep,
                                                Element* sP, int row0, int col0, int m0, int n0,
                                                const float* stat_lse, bool needs_mask, const WindowMask& mask,
                                                const BwdScoreState& st, int lane, const BwdKernelParams& params,
                                                const StepScores& step) {
  constexpr bool kAny = kMods != ScoreMods::kNone;  // kBiasMask includes kAny's modifiers
  constexpr bool kBiasMask = kMods == ScoreMods::kBiasMask;
  const int g = lane / 4;
  const int t = lane % 4;
  keep.bits = 0;
  // kBiasMask: this lane's first key, from the lane index read here (%laneid, volatile): derived
  // from `t`, the clamped keys of its 2 kNT columns are loop-invariant, and ptxas kept them
  // across the main kernel's loop, spilled. ptxas sm_90, d128 main kernel: 80 -> 40 bytes of
  // spill stores (36 with the dbias row sums), none left inside the loop.
  const int j_lane = kBiasMask ? n0 + col0 + 2 * int(ptx::lane_id() % 4) : 0;
  // Plain kernels mask in a pass of its own under one warp-uniform branch, so that blocks inside
  // the mask run none of its arithmetic (like the forward). As a select per element inside the
  // loop below, ptxas computed the compares on every block: ncu, d64 bf16 16k without a mask,
  // about 290 of 1,420 instructions per warp and step (ISETP, PLOP3, FSEL), where FA2 has none.
  // Measured against that (H200, bf16, dev/results/h200-2026-11-29-ab-s11-*.json): backward
  // +1-3.5% at d64 and d128, +0-1% at d256. The modifiers cannot mask first (softcap maps -inf
  // to a finite score); they zero hidden P after the loop, under the same kind of branch.
  if constexpr (!kAny) {
    if (needs_mask) {
      for_each_masked_pair<kMT, kNT>(mask, m0 + row0, n0 + col0, lane, [&](int mt, int nt, int h, bool hide0, bool hide1) {
        if (hide0) s[mt][nt][2 * h] = -INFINITY;
        if (hide1) s[mt][nt][2 * h + 1] = -INFINITY;
      });
    }
  }
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row0 + mt * 16 + g + 8 * h;
      const int i = m0 + r;
      const float lse2 = stat_lse[r];
      ScoreRow mods_row{};
      if constexpr (kBiasMask) mods_row = score_row(params, step.batch, step.head, min(i, step.seqlen_q - 1));
      // This lane's word of chunk col0 / 8 in row r of the step's bias tile (bias_smem_offset);
      // col0 / 8 is a multiple of kNT, so chunk col0 / 8 + nt is one XOR away.
      static_assert((kNT & (kNT - 1)) == 0, "col0 / 8 + nt == col0 / 8 ^ nt");
      extern __shared__ __align__(128) unsigned char bias_smem_base[];
      const bool bias_in_smem = kBiasMask && step.bias_tile >= 0;
      // sm_80 reads the lane from %laneid (volatile, as j_lane), sm_90 uses `lane`: ptxas d128,
      // bytes of spill stores / loads against main's 24 / 48 (sm_80) and 36 / 60 (sm_90a):
      // %laneid 20 / 36 and 96 / 128, `lane` 36 / 52 and 32 / 40.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      const int bias_lane = lane;
#else
      const int bias_lane = int(ptx::lane_id());
#endif
      const int bias_row = step.bias_tile +
                           int(bias_smem_offset<kBiasKeys>(row0 + mt * 16 + bias_lane / 4 + 8 * h, col0 / 8)) +
                           4 * (bias_lane % 4);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const int j = n0 + col0 + nt * 8 + 2 * t;  // key of element e = 0; e = 1 is j + 1
        // One word at a time: the row's kNT words read ahead of the branches spilled (ptxas
        // d128: sm_90a 36 -> 68 bytes of spill stores, sm_80 24 -> 32).
        const float2 bias_pair = bias_pair_log2<Element>(
            bias_in_smem ? *reinterpret_cast<const uint32_t*>(bias_smem_base + (bias_row ^ (nt << 4))) : 0u);
        float p[2], dtanh[2] = {1.0f, 1.0f};
        bool kept[2] = {true, true};
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float x = s[mt][nt][2 * h + e];
          if constexpr (kAny) {
            if (st.use_softcap) {
              const float th = ptx::tanh_approx(x * st.softcap_in);
              x = th * st.softcap_out;
              dtanh[e] = kFactorLater ? 1.0f : fmaf(-th, th, 1.0f);
            } else {
              x *= st.scale_log2;
            }
            x -= st.alibi_slope_log2 * fabsf(float(mask.diag(i) - (j + e)));
            if constexpr (kBiasMask) {
              // As the forward: after softcap and ALiBi, attn_bias, then the element mask of the
              // step's kind (hidden: -inf, so P = 0 and dS = 0).
              const int jc = min(j_lane + nt * 8 + e, step.seqlen_k - 1);
              if (bias_in_smem) {
                x += e == 0 ? bias_pair.x : bias_pair.y;
              } else if (params.bias.defined()) {
                x += bias_log2(params, mods_row, jc);
              }
              if (score_hidden(params, mods_row, step.kind, jc)) x = -INFINITY;
            }
            p[e] = ptx::exp2_approx(x - lse2);
          } else {
            p[e] = ptx::exp2_approx(fmaf(x, st.scale_log2, -lse2));  // masked before the loop
          }
        }
        if (kAny && st.use_dropout) {
          // Columns 2t and 2t + 1 share one Philox call (four draws per four columns).
          const Philox4 rnd = dropout_draws(st.seed, st.offset, st.batch_head, uint32_t(i), uint32_t(j) >> 2);
          const bool upper = (j & 2) != 0;
          kept[0] = (upper ? rnd.z : rnd.x) >= st.dropout_threshold;
          kept[1] = (upper ? rnd.w : rnd.y) >= st.dropout_threshold;
          const uint64_t two = uint64_t(kept[0]) | uint64_t(kept[1]) << 1;
          keep.bits |= two << KeepBits<kMT, kNT>::bit(mt, nt, 2 * h);
        }
        if constexpr (kPStride > 0) {
          *reinterpret_cast<uint32_t*>(sP + r * kPStride + col0 + nt * 8 + 2 * t) =
              ptx::pack2<Element>(kept[0] ? p[0] : 0.0f, kept[1] ? p[1] : 0.0f);
        }
        s[mt][nt][2 * h] = p[0] * dtanh[0];
        s[mt][nt][2 * h + 1] = p[1] * dtanh[1];
      }
    }
  }
  if constexpr (kAny) {
    // Hidden elements get P = 0 after the loop (their P may have been anything, even inf: LSE
    // covers visible keys only), in the registers and in the half of sP's pair this lane wrote.
    // Against a select per element in the loop (H200, bf16, softcap 30, 2k/16k; dev/results/
    // h200-2026-11-29-ab-s13-*.json): backward +6-9% at d64, +6-13% at d128, +2-4% at d256.
    if (needs_mask) {
      for_each_masked_pair<kMT, kNT>(mask, m0 + row0, n0 + col0, lane, [&](int mt, int nt, int h, bool hide0, bool hide1) {
        if (!hide0 && !hide1) return;
        if (hide0) s[mt][nt][2 * h] = 0.0f;
        if (hide1) s[mt][nt][2 * h + 1] = 0.0f;
        if constexpr (kPStride > 0) {
          uint32_t* pair = reinterpret_cast<uint32_t*>(sP + (row0 + mt * 16 + lane / 4 + 8 * h) * kPStride + col0 +
                                                      nt * 8 + 2 * (lane % 4));
          *pair &= (hide0 ? 0xffff0000u : 0xffffffffu) & (hide1 ? 0x0000ffffu : 0xffffffffu);
        }
      });
    }
  }
}

template <ScoreMods kMods, int kMT, int kNT>
__device__ __forceinline__ void probs_to_grads(const float (&s)[kMT][kNT][4], float (&dp)[kMT][kNT][4],
                                               const KeepBits<kMT, kNT>& keep_bits, int row0,
                                               const float* stat_dsum, const BwdScoreState& st, int lane) {
  constexpr bool kAny = kMods != ScoreMods::kNone;
  const int g = lane / 4;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float dsum = stat_dsum[row0 + mt * 16 + g + 8 * h];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float dpv = dp[mt][nt][2 * h + e];
          if (kAny && st.use_dropout) dpv = keep_bits.get(mt, nt, 2 * h + e) ? dpv * st.dropout_rescale : 0.0f;
          dp[mt][nt][2 * h + e] = s[mt][nt][2 * h + e] * (dpv - dsum);
        }
      }
    }
  }
}

// kFactorLater (scores_to_probs): softcap's factor (1 - tanh^2 of the raw score times softcap_in,
// the tanh scores_to_probs took) applied to dS = dp after dbias took P (dP - D). s holds S = Q K^T
// of the same slice computed again (the same product on the same operands: the same bits, so the
// same tanh as in scores_to_probs). Hidden scores have dS = 0 already.
template <int kMT, int kNT>
__device__ __forceinline__ void softcap_factor(float (&dp)[kMT][kNT][4], const float (&s)[kMT][kNT][4],
                                               const BwdScoreState& st) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float th = ptx::tanh_approx(s[mt][nt][i] * st.softcap_in);
        dp[mt][nt][i] *= fmaf(-th, th, 1.0f);
      }
    }
  }
}

// ScoreMods::kBiasMask with dbias: stores this lane's dS (dp after probs_to_grads: P (dP - D),
// before the softmax scale and without softcap's factor: scores_to_probs' kFactorLater) at
// params.dbias_out for the rows and keys inside the sequence. Element (mt, nt, e) as in
// scores_to_probs; m0 + row0 and n0 + col0 are the warp tile's first query and key.
// Scalar stores: a row of dbias starts at any float (seqlen_k odd), so pairs may be misaligned.
template <int kMT, int kNT>
__device__ __forceinline__ void store_dbias(const float (&ds)[kMT][kNT][4], const BwdKernelParams& params,
                                            const StepScores& step, int i0, int j0, int lane) {
  const Broadcast4& d = params.dbias_out;
  float* base = static_cast<float*>(d.data) + step.batch * d.batch + step.head * d.head;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = i0 + mt * 16 + lane / 4 + 8 * h;
      if (i >= step.seqlen_q) continue;
      float* row = base + i * d.row;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = j0 + nt * 8 + 2 * (lane % 4) + e;
          if (j < step.seqlen_k) row[j] = ds[mt][nt][2 * h + e];
        }
      }
    }
  }
}

// ScoreMods::kBiasMask, dbias summed over the query rows (BwdKernelParams::dbias_row_sum): the
// main kernel's column sums of dS live in shared memory that is otherwise unused, the padding
// columns of sP (PaddedRows: kPStride - kBlockN 16-bit elements after each row's kBlockN, never
// read by ldmatrix nor written by store_acc_16bit). Float f = warp_m * kBlockN + key holds the
// sum over the rows of the warps at S/dP warp row warp_m, over the current head's steps so far;
// each such float is written by one lane of one warp only, so no barrier orders the adds.
template <int kBlockN, int kPStride, typename Element>
__device__ __forceinline__ float* dbias_col_slot(Element* sP, int f) {
  constexpr int kPerRow = (kPStride - kBlockN) * int(sizeof(Element)) / int(sizeof(float));
  return reinterpret_cast<float*>(sP + (f / kPerRow) * kPStride + kBlockN) + f % kPerRow;
}

template <int kBlockN, int kPStride, int kWarpsM, int kRows, typename Element>
constexpr bool dbias_cols_fit() {
  return (kPStride - kBlockN) * sizeof(Element) % sizeof(float) == 0 && kBlockN * sizeof(Element) % 16 == 0 &&
         size_t(kRows) * (kPStride - kBlockN) * sizeof(Element) >= sizeof(float) * kWarpsM * kBlockN;
}

// Adds this warp's dS of one slice (as store_dbias: dp after probs_to_grads) summed over its
// rows into the column sums: per lane over its rows, then over the warp's (shuffles over the
// row bits of the lane, lane / 4), then lanes 0..3 add their keys col0 + nt * 8 + 2 * lane + e
// into the slots. Rows past the sequence add 0 (their LSE is +inf, so P = 0). The slots of a
// lane are one address plus compile-time offsets (col0 is a multiple of 8: key pairs 2 lane,
// 2 lane + 1 share a 4-float row of padding); the lane index is read here (%laneid) so that
// address is rebuilt per call rather than held across the loop (as the dQ atomics' pointer).
template <int kBlockN, int kPStride, int kMT, int kNT, typename Element>
__device__ __forceinline__ void add_dbias_cols(const float (&ds)[kMT][kNT][4], Element* sP, int warp_m, int col0) {
  constexpr int kPerRow = (kPStride - kBlockN) * int(sizeof(Element)) / int(sizeof(float));
  static_assert(kPerRow == 4, "a lane pair's keys fill one row of padding");
  float v[kNT][2];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      v[nt][e] = 0.0f;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) v[nt][e] += ds[mt][nt][e] + ds[mt][nt][2 + e];
      v[nt][e] += __shfl_xor_sync(0xffffffffu, v[nt][e], 4);
      v[nt][e] += __shfl_xor_sync(0xffffffffu, v[nt][e], 8);
      v[nt][e] += __shfl_xor_sync(0xffffffffu, v[nt][e], 16);
    }
  }
  const int lane = int(ptx::lane_id());
  if (lane < 4) {
    // Key col0 + nt * 8 + 2 * lane + e: float (warp_m * kBlockN + col0) / 4 + 2 nt + lane / 2 of
    // the rows, at 2 * (lane % 2) + e in the row.
    float* slot = reinterpret_cast<float*>(sP + ((warp_m * kBlockN + col0) / 4 + lane / 2) * kPStride + kBlockN) +
                  2 * (lane % 2);
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      float2* pair = reinterpret_cast<float2*>(slot + nt * 2 * kPStride * int(sizeof(Element)) / int(sizeof(float)));
      const float2 old = *pair;
      *pair = make_float2(old.x + v[nt][0], old.y + v[nt][1]);
    }
  }
}

// Sets every column sum to 0 (before the first step; the loop's first barrier orders it).
template <int kBlockN, int kPStride, int kWarpsM, typename Element>
__device__ __forceinline__ void zero_dbias_cols(Element* sP, int tid) {
  if (tid < kBlockN) {
#pragma unroll
    for (int w = 0; w < kWarpsM; ++w) *dbias_col_slot<kBlockN, kPStride>(sP, w * kBlockN + tid) = 0.0f;
  }
}

// Ends one (sequence, head): called by every thread after barrier B of the head's last step
// (every warp's adds are done and visible). Thread tid < kBlockN sums key tid's column sums over
// the warp rows in order, zeroes them for the next head (whose first adds follow the next
// step's barrier A) and stores the sum at row (batch, head) of params.dbias_out, which belongs
// to this CTA alone (its key block; a head is in one query-head split).
template <int kBlockN, int kPStride, int kWarpsM, typename Element>
__device__ __forceinline__ void flush_dbias_cols(Element* sP, const BwdKernelParams& params, int batch, int head,
                                                 int n0, int seqlen_k, int tid) {
  if (tid < kBlockN) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarpsM; ++w) {
      float* slot = dbias_col_slot<kBlockN, kPStride>(sP, w * kBlockN + tid);
      sum += *slot;
      *slot = 0.0f;
    }
    const Broadcast4& d = params.dbias_out;
    if (n0 + tid < seqlen_k) static_cast<float*>(d.data)[batch * d.batch + head * d.head + n0 + tid] = sum;
  }
}

// Copies one step's LSE*log2(e) and D (kRows floats each, 16-byte chunks) into
// stats[0 .. kRows) and stats[kRows .. 2 kRows). Workspace rows are padded, so no bounds.
template <int kRows, int kThreads>
__device__ __forceinline__ void load_stats(float* stats, const float* lse_log2, const float* dsum, int tid) {
  constexpr int kChunks = kRows / 4;
  static_assert(2 * kChunks <= kThreads, "one chunk per thread");
  if (tid < 2 * kChunks) {
    const bool second = tid >= kChunks;
    const int c = second ? tid - kChunks : tid;
    const float* src = (second ? dsum : lse_log2) + 4 * c;
    ptx::cp_async_16(ptx::smem_addr(stats + (second ? kRows : 0) + 4 * c), src, true);
  }
}

}  // namespace flashattn::cuda
