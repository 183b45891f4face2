// FlashAttention-2-class backward kernel for sm80+ (mma.sync, ldmatrix, cp.async).
//
// Data flow of one backward call (run_bwd in bwd_launch.h):
//   1. bwd_preprocess_kernel: D_i = sum_d dO_i O_i and LSE_i * log2(e) per query row, into the
//      f32 workspace (padding rows: D = 0, LSE = +inf, so their P is exactly 0); the f32 dQ
//      accumulator is zeroed.
//   2. bwd_kernel (this file): one CTA per (key block j, kv head [, query-head chunk], batch).
//      K_j and V_j stay in shared memory; dK_j and dV_j accumulate in registers (f32) over every
//      (query head of the chunk, query block i) whose rows see a key of block j. Per step:
//
//        [wait Q_i, dO_i, stats; barrier A]  prefetch the next step's Q, dO, stats (cp.async)
//        S  = Q_i K_j^T                 registers, warp grid over (i, j)
//        P  = exp2(S' - LSE log2 e)     S' = scores in log2 units (scale, softcap, ALiBi, mask)
//        Pd = P * keep        -> sP     16-bit, row-major [query row][key]
//        dP = dO_i V_j^T                same warp grid
//        dS = P * (keep * dP / (1-p) - D) * (softcap: 1 - tanh^2)   -> sdS (like sP)
//        [barrier B]
//        dV += Pd^T dO_i   A = Pd^T: .trans ldmatrix of sP;   B = dO_i: .trans ldmatrix of sdO
//        dK += dS^T Q_i    A = dS^T: .trans ldmatrix of sdS;  B = Q_i: .trans ldmatrix of sQ
//        dQ_i += dS K_j    A = dS: ldmatrix of sdS;  B = K_j: .trans ldmatrix of sK
//                          -> f32 atomicAdd into the (unscaled) dQ accumulator
//
//      With score modifiers (softcap, ALiBi, dropout) the S/dP part may run in row slices of
//      the warp tile (BwdTile::mods_splits) to leave registers for their temporaries.
//      The transposes P^T and dS^T never exist in memory: they are row-major P and dS read
//      with ldmatrix.trans, which hands each lane the A fragment of the transposed tile. Barrier
//      A of the next step orders that step's writes of sP/sdS and its prefetch into the other
//      Q/dO buffer after every warp's reads of this step, so two barriers per step suffice.
//      Where a GPU cannot hold two Q/dO step buffers (A100 at head dim >= 64), one is used: the
//      next step's copies then wait for a third barrier at the end of the step
//      (BwdKernelParams::step_buffers).
//      In deterministic mode the dQ product is skipped here (dq_accum == nullptr).
//      Epilogue: dK * scale and dV * (1/(1-p)) staged through shared memory as 16-bit and
//      stored with 16-byte writes; or, when a kv head's query heads are split over several CTAs
//      (GQA with few key blocks), unscaled f32 partials that bwd_reduce_dkv_kernel sums in a
//      fixed order.
//   3. bwd_convert_dq_kernel: dQ = scale * accumulator -> element type (strided). Deterministic
//      mode instead runs bwd_dq_kernel (bwd_dq_kernel.h), which recomputes S, P, dP and dS per
//      query block over all visible key blocks and keeps dQ in registers: no atomics.
//
// Padding and masking: rows of Q/dO past seqlen_q and keys past seqlen_k are zero-filled by
// cp.async (src-size 0), so no garbage enters an MMA. Padding rows have LSE = +inf (P = 0, dS = 0,
// their atomics add zeros into rows the workspace reserves for this sequence); keys past
// seqlen_k are masked to -inf (P = 0) and their dK/dV rows are not stored. A query row with no
// visible key (LSE = -inf, stored as +inf) gets P = 0 everywhere: zero gradients, never NaN.
//
// Query blocks that see no key of block j are skipped (query_block_range); blocks that straddle
// the window or the end of the keys pay for the element-wise mask.
//
// attn_bias, attn_mask and block masks (ScoreMods::kBiasMask, kAny's modifiers included): pass 1
// adds the bias to each score after softcap and ALiBi and hides masked ones, exactly as the
// forward (score_tensors.h). Under a block mask, this key-block-major CTA needs the query tiles
// of its key block that touch a kept block. Before the kernels, one device pass classifies every
// (plane, query tile, key tile) pair of this kernel's tiling into a byte table (build_tile_kinds:
// the forward's tile_kind, so the same kinds and element checks); before each step the CTA reads
// the next pairs of its walk order there (step_kind) and moves past absent ones before issuing
// that step's prefetch: an absent step costs one byte read (the same for every thread, L1/L2-
// resident) and no load or math. Why a dense table rather than a transposed list per key tile
// like the forward's per query tile: this kernel walks (query head, query block) pairs from a
// rotated start (m_rot), and under a head-varying mask the lists would be per head anyway; the
// table serves any walk order (the deterministic dQ kernel reads its own tiling's table the
// other way round), costs planes x tiles bytes, a quarter of the forward's int32 lists, and its
// skip loop is cheaper than a list walk with its binary search. dbias (bwd_dbias.h): each step
// stores its dS at params.dbias_out (plain stores: every (b, h, i, j) belongs to one step of one
// CTA; store_dbias), or, for a dbias broadcast over the query rows, adds its sum over the warp's
// rows into column sums in sP's padding that the head's last step sums over the warps and
// stores (add_dbias_cols, flush_dbias_cols).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm80/bwd_common.h"

namespace flashattn::cuda {

// This CTA's (key block, kv head, query-head split, batch, first key) in the main backward.
template <typename Index>
struct BwdCtaIndex {
  Index n_block, kv_head, split, batch, n0;
};

// kInSmem: the interleaved causal order (cta_order.h). Thread 0 writes the indices into `slot`
// (the caller syncs before any use) and every use reads them there (SmemInt, a volatile
// ld.shared). Computed in registers they spilled (28 bytes at d128) and cost 2-7% (dev/results/
// h200-2026-11-29-ab-s8-order.json): blockIdx reads cost nothing, as ptxas re-reads them
// instead of keeping them live, and the shared-memory reads are the same trade. Otherwise the
// plain order, straight from blockIdx.
template <bool kInSmem, int kBlockN>
__device__ __forceinline__ auto bwd_cta_index(const BwdKernelParams& params, int (&slot)[5]) {
  if constexpr (kInSmem) {
    if (threadIdx.x == 0) {
      const CtaSlot s = this_cta_slot(params.cta_group_planes);
      slot[0] = s.block;
      slot[1] = int(s.plane % gridDim.y) / params.kv_splits;
      slot[2] = int(s.plane % gridDim.y) % params.kv_splits;
      slot[3] = int(s.plane / gridDim.y);
      slot[4] = s.block * kBlockN;
    }
    return BwdCtaIndex<SmemInt>{{&slot[0]}, {&slot[1]}, {&slot[2]}, {&slot[3]}, {&slot[4]}};
  } else {
    return BwdCtaIndex<int>{int(blockIdx.x), int(blockIdx.y) / params.kv_splits,
                            int(blockIdx.y) % params.kv_splits, int(blockIdx.z), int(blockIdx.x) * kBlockN};
  }
}

// kFactorLater: the kBiasMask instantiation for calls with softcap and dbias (launch_bwd_kernels
// picks it), whose dS takes softcap's factor only after dbias has taken P (dP - D)
// (scores_to_probs, softcap_factor); a kernel of its own so that the others' code stays as it was
// (with the factor as a run-time choice ptxas spilled more in every biasmask kernel on sm_90a).
template <typename Traits, bool kFactorLater = false>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    bwd_kernel(const __grid_constant__ BwdKernelParams params) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kPStride = Traits::kPStride;
  using RowLayout = typename Traits::RowLayout;  // sK, sV, sQ, sdO
  using PLayout = typename Traits::PLayout;      // sP, sdS
  constexpr uint32_t kElem = sizeof(Element);

  extern __shared__ __align__(128) unsigned char smem_raw[];
  Element* sK = reinterpret_cast<Element*>(smem_raw);  // (kBlockN, kStride)
  Element* sV = sK + Traits::kSmemKV;                  // (kBlockN, kStride)
  Element* sP = sV + Traits::kSmemKV;                  // (kBlockM, kPStride)
  Element* sdS = sP + Traits::kSmemP;                  // (kBlockM, kPStride)
  // Step buffer b (BwdTraits): sQ, then sdO, then (lse_log2, dsum) x kBlockM floats.
  unsigned char* step_bufs = reinterpret_cast<unsigned char*>(sdS + Traits::kSmemP);
  Element* sQ = reinterpret_cast<Element*>(step_bufs);  // buffer 0; buffer b adds kStepBufBytes
  constexpr uint32_t kStatsOffset = kElem * 2 * Traits::kSmemQ;  // step buffer -> its stats

  const int tid = threadIdx.x;
  // The shuffle tells the compiler the warp index is warp-uniform, so everything derived from
  // it (warp tile offsets) can live in uniform registers.
  const int warp = __shfl_sync(0xffffffffu, tid / 32, 0);
  const int lane = tid % 32;
  // Block 0 first: under a causal mask it sees the most rows. Where BwdTraits::kInterleave,
  // causal launches also interleave their planes; only in the sm_90 binary, as the A100's 163 KB
  // of shared memory per block are exactly the d128 double buffer (BwdTraits).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool kInterleave = Traits::kInterleave;
#else
  constexpr bool kInterleave = false;
#endif
  __shared__ int cta_slot[5];  // used only where kInterleave
  const auto [n_block, kv_head, split, batch, n0] = bwd_cta_index<kInterleave, kBlockN>(params, cta_slot);
  if constexpr (kInterleave) __syncthreads();
  const int group = params.heads / params.heads_k;
  const int heads_per_split = group / params.kv_splits;
  const int head_begin = kv_head * group + split * heads_per_split;

  const SeqExtent seq = seq_extent(params, batch);
  if (n0 >= seq.seqlen_k) return;  // past this sequence's keys (varlen)
  const int keys_here = min(kBlockN, seq.seqlen_k - n0);

  const WindowMask mask{seq.seqlen_q, seq.seqlen_k, params.window_left, params.window_right};
  int m_lo = 0, m_hi = (seq.seqlen_q + kBlockM - 1) / kBlockM;
  if constexpr (Traits::kMask == MaskMode::kWindow) {
    query_block_range(mask, n0, n0 + keys_here, kBlockM, &m_lo, &m_hi);
  }
  const int n_m = max(m_hi - m_lo, 0);
  const int head_end = n_m > 0 ? head_begin + heads_per_split : head_begin;
  // Steps walk (query head, query block) pairs: every query block of head_begin, then of the
  // next head, and so on. Key blocks start at different query blocks (m_rot) so that they do
  // not all add into the same dQ rows at once; the order is fixed per CTA, so dK/dV stay
  // reproducible.
  const int m_rot = n_m > 0 ? n_block % n_m : 0;
  const int64_t ws_row0 = params.ws_row0(batch, seq.row0_q);

  // kBiasMask under a block mask: the first step (head, mi) at or after the given one in the
  // walk order whose tiles touch a kept block, and its kind; (head_end, *) when none is left.
  constexpr bool kBiasMask = Traits::kMods == ScoreMods::kBiasMask;
  const bool planned = kBiasMask && params.step_kinds.on();
  const auto skip_absent = [&](int& head, int& mi, int& kind) {
    while (head < head_end &&
           (kind = step_kind(params, params.step_kinds, batch, head, m_lo + mi, int(n_block))) == kTileSkipped) {
      mi = mi + 1 == n_m ? 0 : mi + 1;
      if (mi == m_rot) ++head;
    }
  };
  int first_head = head_begin, first_mi = m_rot, first_kind = kBiasMask ? unplanned_kind(params) : kTileClean;
  if (planned) skip_absent(first_head, first_mi, first_kind);
  const bool any_step = first_head < head_end;

  // The step buffers' bias tiles (BwdTraits::kBiasSmem), used where the call's bias passes
  // bias_tile_copyable.
  const bool bias_smem = Traits::kBiasSmem && bias_tile_copyable(params);
  // Issues the cp.async copies of one step's Q, dO (zero-filled past seqlen_q) and stats (and
  // with kBiasSmem its bias tile).
  auto load_step = [&](int head, int m0, int buf) {
    const int64_t row = seq.row0_q + m0;
    const RowPtr gq = row_ptr<Element>(params.q, params.q_strides, batch, row, head);
    const RowPtr gdo = row_ptr<Element>(params.dout, params.dout_strides, batch, row, head);
    unsigned char* b = step_bufs + buf * Traits::kStepBufBytes;
    load_rows<Element, kBlockM, Traits::kThreads, Traits::kChunksPerRow, RowLayout>(
        reinterpret_cast<Element*>(b), gq.base, gq.row_bytes, seq.seqlen_q - m0, tid);
    load_rows<Element, kBlockM, Traits::kThreads, Traits::kChunksPerRow, RowLayout>(
        reinterpret_cast<Element*>(b) + Traits::kSmemQ, gdo.base, gdo.row_bytes, seq.seqlen_q - m0, tid);
    const int64_t ws = int64_t(head) * params.ws_rows + ws_row0 + m0;
    load_stats<kBlockM, Traits::kThreads>(reinterpret_cast<float*>(b + kStatsOffset), params.lse_log2 + ws,
                                          params.dsum + ws, tid);
    if constexpr (Traits::kBiasSmem) {
      if (bias_smem) {
        // The thread index rebuilt from %laneid (volatile): from `tid`, ptxas kept the copy's
        // per-thread source offset across the loop and spilled.
        load_bias_tile<kBlockM, kBlockN, Traits::kThreads>(ptx::smem_addr(b + Traits::kBiasOffset), params, batch,
                                                           head, m0, n0, seq.seqlen_q, seq.seqlen_k,
                                                           warp * 32 + int(ptx::lane_id()));
      }
    }
  };

  // Warp tiles of the three products (see BwdTraits).
  const int sdp_row0 = (warp % Traits::kSdpWarpsM) * Traits::kSdpRows;
  const int sdp_col0 = (warp / Traits::kSdpWarpsM) * Traits::kSdpCols;
  const int kv_row0 = (warp % Traits::kKvWarpsN) * Traits::kKvRows;
  const int kv_col0 = (warp / Traits::kKvWarpsN) * Traits::kKvCols;
  const int dq_row0 = (warp % Traits::kDqWarpsM) * Traits::kDqRows;
  const int dq_col0 = (warp / Traits::kDqWarpsM) * Traits::kDqCols;

  // This lane's ldmatrix addresses (buffer 0 of Q/dO; the other buffer adds kQBufBytes). Operand
  // pairs that share an addressing (Q/dO, K/V, P/dS) differ by a compile-time offset, which
  // ends up in the instructions' immediates instead of in registers.
  constexpr uint32_t kQBufBytes = Traits::kStepBufBytes;  // Q/dO buffer 0 -> 1
  constexpr uint32_t kDoOffset = kElem * Traits::kSmemQ;   // sQ -> sdO
  constexpr uint32_t kVOffset = kElem * Traits::kSmemKV;      // sK -> sV
  constexpr uint32_t kDsOffset = kElem * Traits::kSmemP;      // sP -> sdS
  const uint32_t q_a_addr = RowLayout::smem_at(sQ, sdp_row0 + ldsm_row_a(lane), ldsm_col_a(lane));
  const uint32_t k_b_addr = RowLayout::smem_at(sK, sdp_col0 + ldsm_row_b(lane), ldsm_col_b(lane));
  const uint32_t pt_a_addr = PLayout::smem_at(sP, ldsm_row_b(lane), kv_row0, ldsm_col_b(lane));
  // (PaddedRows: the expression the measured kernels were compiled from; the layout call is the
  // same address but moves ptxas's schedule, 8 instructions and a 4-byte spill at d128.)
  const uint32_t q_b_addr =
      RowLayout::kSwizzled ? RowLayout::smem_at(sQ, ldsm_row_a(lane), kv_col0 + ldsm_col_a(lane))
                           : ptx::smem_addr(sQ + ldsm_row_a(lane) * Traits::kSmemStride + kv_col0 + ldsm_col_a(lane));
  const uint32_t ds_a_addr = PLayout::smem_at(sdS, dq_row0 + ldsm_row_a(lane), ldsm_col_a(lane));
  const uint32_t k_bt_addr = RowLayout::smem_at(sK, ldsm_row_a(lane), dq_col0, ldsm_col_a(lane));

  float dk_acc[Traits::kKvMTiles][Traits::kKvDTiles][4];
  float dv_acc[Traits::kKvMTiles][Traits::kKvDTiles][4];
  zero_acc(dk_acc);
  zero_acc(dv_acc);
  // kBiasMask, dbias summed over the query rows: column sums of dS in sP's padding columns
  // (add_dbias_cols, flush_dbias_cols).
  static_assert(!kBiasMask || dbias_cols_fit<kBlockN, kPStride, Traits::kSdpWarpsM, kBlockM, Element>(),
                "the dbias column sums fit in sP's padding");
  if constexpr (kBiasMask) {
    if (params.dbias_row_sum) zero_dbias_cols<kBlockN, kPStride, Traits::kSdpWarpsM>(sP, tid);
  }

  if (any_step) {
    const RowPtr gk = row_ptr<Element>(params.k, params.k_strides, batch, seq.row0_k + n0, kv_head);
    const RowPtr gv = row_ptr<Element>(params.v, params.v_strides, batch, seq.row0_k + n0, kv_head);
    load_rows<Element, kBlockN, Traits::kThreads, Traits::kChunksPerRow, RowLayout>(sK, gk.base, gk.row_bytes,
                                                                                  keys_here, tid);
    load_rows<Element, kBlockN, Traits::kThreads, Traits::kChunksPerRow, RowLayout>(sV, gv.base, gv.row_bytes,
                                                                                  keys_here, tid);
    load_step(first_head, (m_lo + first_mi) * kBlockM, 0);
    ptx::cp_async_commit();
  }

  // d <= 64 (FA2's choice): this warp's B fragments of dP = dO V^T are the same every step, so
  // they are read from shared memory once per CTA. The d64 backward is bound by shared-memory
  // reads (ldmatrix bytes per step exceed the mma.sync time); this removes 5.6% of them. H200,
  // bf16, d64 4k-16k: backward +1-2% (dev/results/h200-2026-11-29-ab-s7-vreg.json); ptxas sm_90:
  // plain 253 registers without spills, with modifiers 28 -> 12 bytes of spills.
  constexpr bool kVInRegs = kHeadDim <= 64;
  uint32_t v_frags[kVInRegs ? kHeadDim / 16 : 1][kVInRegs ? Traits::kSdpNTiles / 2 : 1][4];
  if constexpr (kVInRegs) {
    if (any_step) {
      ptx::cp_async_wait<0>();
      __syncthreads();  // K, V (and the first step) landed
      load_b_frags<Element, Traits::kSdpNTiles, kHeadDim / 16, RowLayout>(v_frags, k_b_addr + kVOffset);
    }
  }

  // Two step buffers: the next step's copies are issued at the top and overlap the whole step.
  // One: they are issued at the end of the step, after barrier C (every warp is done with this
  // step's Q, dO and stats), and overlap nothing; the double-buffered loop stays as it was.
  const bool single = params.step_buffers == 1;
  const int buf_flip = single ? 0 : 1;
  int buf = 0;
  for (int head = first_head, mi = first_mi, kind = first_kind; head < head_end; buf ^= buf_flip) {
    const int m0 = (m_lo + mi) * kBlockM;
    int next_mi = mi + 1 == n_m ? 0 : mi + 1;
    int next_head = next_mi == m_rot ? head + 1 : head;
    int next_kind = kind;
    if (planned) skip_absent(next_head, next_mi, next_kind);
    ptx::cp_async_wait<0>();
    __syncthreads();  // A: this step's Q, dO, stats (and K, V) landed; the previous step is done
    if (!single && next_head < head_end) {
      load_step(next_head, (m_lo + next_mi) * kBlockM, buf ^ 1);
      ptx::cp_async_commit();
    }

    // S = Q K^T -> P (Pd to sP), then dP = dO V^T -> dS (to sdS), on this warp's
    // (kSdpRows x kSdpCols) tile.
    const bool needs_mask = mask.block_needs_mask(m0, min(m0 + kBlockM, seq.seqlen_q), n0, n0 + kBlockN);
    const float* stats = reinterpret_cast<const float*>(step_bufs + buf * Traits::kStepBufBytes + kStatsOffset);
    const BwdScoreState st = score_state<Traits::kMods>(params, batch, head);
    const StepScores step{batch, head, kind, seq.seqlen_q, seq.seqlen_k,
                          Traits::kBiasSmem && bias_smem
                              ? int(step_bufs - smem_raw) + buf * int(Traits::kStepBufBytes) + int(Traits::kBiasOffset)
                              : -1};
#pragma unroll
    for (int half = 0; half < Traits::kSdpSplits; ++half) {
      constexpr int kMT = Traits::kSdpSubMTiles;
      constexpr int kNT = Traits::kSdpNTiles;
      const int row0 = sdp_row0 + half * kMT * 16;
      const uint32_t q_addr = RowLayout::advance(q_a_addr + buf * kQBufBytes, half * kMT * 16, 0);
      float s[kMT][kNT][4];
      zero_acc(s);
      warp_gemm_abt<Element, kMT, kNT, kHeadDim / 16, RowLayout, RowLayout>(s, q_addr, k_b_addr);
      KeepBits<kMT, kNT> keep;
      scores_to_probs<Traits::kMods, Element, kMT, kNT, kPStride, kBlockN, kBiasMask && kFactorLater>(
          s, keep, sP, row0, sdp_col0, m0, n0, stats, needs_mask, mask, st, lane, params, step);
      float dp[kMT][kNT][4];
      zero_acc(dp);
      if constexpr (kVInRegs) {
        warp_gemm_abt_breg<Element, kMT, kNT, kHeadDim / 16, RowLayout>(dp, q_addr + kDoOffset, v_frags);
      } else {
        warp_gemm_abt<Element, kMT, kNT, kHeadDim / 16, RowLayout, RowLayout>(dp, q_addr + kDoOffset, k_b_addr + kVOffset);
      }
      probs_to_grads<Traits::kMods>(s, dp, keep, row0, stats + kBlockM, st, lane);
      if constexpr (kBiasMask) {
        if (params.dbias_row_sum) {
          add_dbias_cols<kBlockN, kPStride>(dp, sP, warp % Traits::kSdpWarpsM, sdp_col0);
        } else if (params.dbias_out.defined()) {
          store_dbias(dp, params, step, m0 + row0, n0 + sdp_col0, lane);
        }
        if constexpr (kFactorLater) {  // dbias with softcap: S again for softcap's factor
          zero_acc(s);
          warp_gemm_abt<Element, kMT, kNT, kHeadDim / 16, RowLayout, RowLayout>(s, q_addr, k_b_addr);
          softcap_factor(dp, s, st);
        }
      }
      store_acc_16bit<Element, kMT, kNT, PLayout>(sdS, dp, row0, sdp_col0, lane);
    }
    __syncthreads();  // B: sP and sdS are complete

    // dV += Pd^T dO and dK += dS^T Q: k runs over the kBlockM query rows of the step.
    warp_gemm_atb<Element, Traits::kKvMTiles, Traits::kKvDTiles, kBlockM / 16, PLayout, RowLayout>(
        dv_acc, pt_a_addr, q_b_addr + buf * kQBufBytes + kDoOffset);
    warp_gemm_atb<Element, Traits::kKvMTiles, Traits::kKvDTiles, kBlockM / 16, PLayout, RowLayout>(
        dk_acc, pt_a_addr + kDsOffset, q_b_addr + buf * kQBufBytes);

    // dQ_i += dS K_j into the f32 accumulator (rows of this sequence's workspace block).
    if (params.dq_accum != nullptr) {
      // This lane's first fragment (dq_frag_offset: fragment order); every other one is a
      // compile-time offset from it.
      // The lane index is read here (%laneid, volatile, so not hoisted out of the loop): the
      // 64-bit per-lane pointer is then rebuilt each step instead of living across it, which
      // took d128 plain from 16 bytes of spills (4 LDL per step) to none and the window kernel
      // from 24 to 16 bytes (ptxas sm_90); backward +0-2% at d128 (ab-s7-lane.json).
      const int dq_lane_idx = int(ptx::lane_id());
      float* dq_lane = params.dq_accum + (int64_t(head) * params.ws_rows + ws_row0 + m0) * kHeadDim +
                       dq_frag_offset(dq_row0, dq_col0, kHeadDim) + 4 * dq_lane_idx;
#pragma unroll 1
      for (int pass = 0; pass < Traits::kDqPasses; ++pass) {
        float dq[Traits::kDqMTiles][Traits::kDqDTiles][4];
        zero_acc(dq);
        warp_gemm_ab<Element, Traits::kDqMTiles, Traits::kDqDTiles, kBlockN / 16, PLayout, RowLayout>(
            dq, ds_a_addr, RowLayout::advance(k_bt_addr, 0, pass * Traits::kDqPassCols));
#pragma unroll
        for (int mt = 0; mt < Traits::kDqMTiles; ++mt) {
#pragma unroll
          for (int dt = 0; dt < Traits::kDqDTiles; ++dt) {
            float* dst = dq_lane + dq_frag_offset(mt * 16, pass * Traits::kDqPassCols + dt * 8, kHeadDim);
            // sm90: one red.global.add.v4.f32 per fragment. The row-major accumulator needed two
            // float2 ones; scalar ones (FA2) made the backward 15-30% slower on H200
            // (dev/results/*-ab-s4-red1.json).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            atomicAdd(reinterpret_cast<float4*>(dst), make_float4(dq[mt][dt][0], dq[mt][dt][1], dq[mt][dt][2], dq[mt][dt][3]));
#else
#pragma unroll
            for (int e = 0; e < 4; ++e) atomicAdd(dst + e, dq[mt][dt][e]);
#endif
          }
        }
      }
    }
    if (single && next_head < head_end) {
      __syncthreads();  // C: every warp is done with this step's Q, dO and stats
      load_step(next_head, (m_lo + next_mi) * kBlockM, 0);
      ptx::cp_async_commit();
    }
    if constexpr (kBiasMask) {
      if (params.dbias_row_sum && next_head != head) {  // the head's last step (after barrier B)
        flush_dbias_cols<kBlockN, kPStride, Traits::kSdpWarpsM>(sP, params, batch, head, n0, seq.seqlen_k, tid);
      }
    }
    head = next_head;
    mi = next_mi;
    kind = next_kind;
  }

  // Epilogue. dK = scale * sum dS^T Q; dV = sum Pd^T dO / (1 - p).
  const float dk_scale = params.scale;
  const float dv_scale = Traits::kMods != ScoreMods::kNone && params.has_dropout() ? params.dropout_rescale : 1.0f;
  if (params.kv_splits > 1) {
    // Unscaled f32 partials of this chunk of query heads, written straight from registers.
    const int g = lane / 4;
    const int t = lane % 4;
    const int64_t row_base = int64_t(split) * params.total_k + params.k_row0(batch, seq.row0_k) + n0;
#pragma unroll
    for (int mt = 0; mt < Traits::kKvMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = kv_row0 + mt * 16 + g + 8 * h;
        if (r >= keys_here) continue;
        const int64_t off = ((row_base + r) * params.heads_k + kv_head) * kHeadDim + kv_col0 + 2 * t;
#pragma unroll
        for (int dt = 0; dt < Traits::kKvDTiles; ++dt) {
          *reinterpret_cast<float2*>(params.dk_partial + off + dt * 8) =
              make_float2(dk_acc[mt][dt][2 * h], dk_acc[mt][dt][2 * h + 1]);
          *reinterpret_cast<float2*>(params.dv_partial + off + dt * 8) =
              make_float2(dv_acc[mt][dt][2 * h], dv_acc[mt][dt][2 * h + 1]);
        }
      }
    }
    return;
  }
  __syncthreads();  // every warp is done reading sK and sV; they now stage dK and dV
  store_acc_16bit<Element, Traits::kKvMTiles, Traits::kKvDTiles, RowLayout>(sK, dk_acc, kv_row0, kv_col0, lane, dk_scale);
  store_acc_16bit<Element, Traits::kKvMTiles, Traits::kKvDTiles, RowLayout>(sV, dv_acc, kv_row0, kv_col0, lane, dv_scale);
  __syncthreads();
  char* gdK = static_cast<char*>(params.dk) +
              kElem * (batch * params.dk_strides.batch + (seq.row0_k + n0) * params.dk_strides.row +
                       int64_t(kv_head) * params.dk_strides.head);
  char* gdV = static_cast<char*>(params.dv) +
              kElem * (batch * params.dv_strides.batch + (seq.row0_k + n0) * params.dv_strides.row +
                       int64_t(kv_head) * params.dv_strides.head);
  const int64_t dk_row_bytes = kElem * params.dk_strides.row;
  const int64_t dv_row_bytes = kElem * params.dv_strides.row;
  constexpr int kChunks = kBlockN * Traits::kChunksPerRow;
#pragma unroll
  for (int c = tid; c < kChunks; c += Traits::kThreads) {
    const int r = c / Traits::kChunksPerRow;
    const int col = (c % Traits::kChunksPerRow) * 8;
    if (r < keys_here) {
      *reinterpret_cast<uint4*>(gdK + r * dk_row_bytes + col * kElem) =
          *reinterpret_cast<const uint4*>(RowLayout::at(sK, r, col));
      *reinterpret_cast<uint4*>(gdV + r * dv_row_bytes + col * kElem) =
          *reinterpret_cast<const uint4*>(RowLayout::at(sV, r, col));
    }
  }
}

}  // namespace flashattn::cuda
