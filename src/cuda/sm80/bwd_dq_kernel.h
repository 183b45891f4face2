// Deterministic dQ for the sm80-class backward (BackwardParams::deterministic).
//
// One CTA per (query block, head, batch) walks the key blocks its rows can see, recomputes
// S = Q K_j^T and dP = dO V_j^T, turns them into dS exactly like the main kernel
// (scores_to_probs, probs_to_grads), and accumulates dQ += dS K_j in registers: no atomics, a fixed order, so
// dQ is bitwise reproducible. It costs the S and dP products a second time (the main kernel
// skips its dQ product in this mode). Warps own 16-row slices, as in the forward: dS leaves the
// S/dP accumulators as an A fragment without touching shared memory. K_j and V_j are
// double-buffered; Q, dO and the row statistics are loaded once. With attn_bias, attn_mask or a
// block mask (ScoreMods::kBiasMask) pass 1 reads them as the main kernel does, and under a block
// mask the key tiles that touch no kept block are passed over before their prefetch (step_kind
// on this kernel's own table of tile kinds, as in bwd_kernel.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm80/bwd_common.h"

namespace flashattn::cuda {

template <typename Traits>  // BwdDqTraits
__global__ void __launch_bounds__(Traits::kThreads, 1)
    bwd_dq_kernel(const __grid_constant__ BwdKernelParams params) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kMTiles = Traits::kMTiles;
  constexpr int kNTiles = Traits::kNTiles;
  constexpr int kDTiles = Traits::kDTiles;
  constexpr int kStride = Traits::kSmemStride;
  using Layout = typename Traits::RowLayout;
  constexpr uint32_t kElem = sizeof(Element);

  extern __shared__ __align__(128) unsigned char smem_raw[];
  Element* sQ = reinterpret_cast<Element*>(smem_raw);  // (kBlockM, kStride)
  Element* sdO = sQ + Traits::kSmemQ;                  // (kBlockM, kStride)
  Element* sK = sdO + Traits::kSmemQ;                  // 2 x (kBlockN, kStride)
  Element* sV = sK + 2 * Traits::kSmemKV;              // 2 x (kBlockN, kStride)
  float* sStats = reinterpret_cast<float*>(sV + 2 * Traits::kSmemKV);  // (lse_log2, dsum) x kBlockM

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  // Heavier query blocks first: under a causal mask the last blocks see the most keys.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int head_k = head / (params.heads / params.heads_k);

  const SeqExtent seq = seq_extent(params, batch);
  const int m0 = m_block * kBlockM;
  if (m0 >= seq.seqlen_q) return;
  const int rows_here = min(kBlockM, seq.seqlen_q - m0);

  const WindowMask mask{seq.seqlen_q, seq.seqlen_k, params.window_left, params.window_right};
  int n_lo = 0, n_hi = (seq.seqlen_k + kBlockN - 1) / kBlockN;
  if constexpr (Traits::kMask == MaskMode::kWindow) {
    mask.block_range(m0, m0 + rows_here, kBlockN, &n_lo, &n_hi);
  }

  // kBiasMask under a block mask: the first key tile at or after n that touches a kept block
  // (n_hi when none is left), and its kind.
  constexpr bool kBiasMask = Traits::kMods == ScoreMods::kBiasMask;
  const bool planned = kBiasMask && params.dq_step_kinds.on();
  const auto skip_absent = [&](int& n, int& kind) {
    while (n < n_hi && (kind = step_kind(params, params.dq_step_kinds, batch, head, m_block, n)) == kTileSkipped) ++n;
  };
  int n_first = n_lo, first_kind = kBiasMask ? unplanned_kind(params) : kTileClean;
  if (planned) skip_absent(n_first, first_kind);

  const RowPtr gK = row_ptr<Element>(params.k, params.k_strides, batch, seq.row0_k, head_k);
  const RowPtr gV = row_ptr<Element>(params.v, params.v_strides, batch, seq.row0_k, head_k);
  auto load_kv = [&](int n_block, int buf) {
    const int n = n_block * kBlockN;
    load_rows<Element, kBlockN, Traits::kThreads, Traits::kChunksPerRow, Layout>(
        sK + buf * Traits::kSmemKV, static_cast<const char*>(gK.row(n)), gK.row_bytes, seq.seqlen_k - n, tid);
    load_rows<Element, kBlockN, Traits::kThreads, Traits::kChunksPerRow, Layout>(
        sV + buf * Traits::kSmemKV, static_cast<const char*>(gV.row(n)), gV.row_bytes, seq.seqlen_k - n, tid);
  };

  const int warp_row0 = warp * Traits::kRowsPerWarp;
  const uint32_t q_a_addr = ptx::smem_addr(sQ + (warp_row0 + ldsm_row_a(lane)) * kStride + ldsm_col_a(lane));
  const uint32_t do_a_addr = ptx::smem_addr(sdO + (warp_row0 + ldsm_row_a(lane)) * kStride + ldsm_col_a(lane));
  const uint32_t k_b_addr = ptx::smem_addr(sK + ldsm_row_b(lane) * kStride + ldsm_col_b(lane));
  const uint32_t v_b_addr = ptx::smem_addr(sV + ldsm_row_b(lane) * kStride + ldsm_col_b(lane));
  const uint32_t k_bt_addr = ptx::smem_addr(sK + ldsm_row_a(lane) * kStride + ldsm_col_a(lane));
  constexpr uint32_t kKVBufBytes = kElem * Traits::kSmemKV;

  float dq_acc[kMTiles][kDTiles][4];
  zero_acc(dq_acc);

  if (n_hi > n_first) {
    const int64_t row = seq.row0_q + m0;
    const RowPtr gq = row_ptr<Element>(params.q, params.q_strides, batch, row, head);
    const RowPtr gdo = row_ptr<Element>(params.dout, params.dout_strides, batch, row, head);
    load_rows<Element, kBlockM, Traits::kThreads, Traits::kChunksPerRow, Layout>(sQ, gq.base, gq.row_bytes,
                                                                                  rows_here, tid);
    load_rows<Element, kBlockM, Traits::kThreads, Traits::kChunksPerRow, Layout>(sdO, gdo.base, gdo.row_bytes,
                                                                                  rows_here, tid);
    const int64_t ws = int64_t(head) * params.ws_rows + params.ws_row0(batch, seq.row0_q) + m0;
    load_stats<kBlockM, Traits::kThreads>(sStats, params.lse_log2 + ws, params.dsum + ws, tid);
    load_kv(n_first, 0);
    ptx::cp_async_commit();
  }
  const BwdScoreState st = score_state<Traits::kMods>(params, batch, head);

  for (int n_block = n_first, kind = first_kind, visited = 0; n_block < n_hi; ++visited) {
    const int buf = kBiasMask ? visited & 1 : (n_block - n_lo) & 1;
    const int n0 = n_block * kBlockN;
    int n_next = n_block + 1, next_kind = kind;
    if (planned) skip_absent(n_next, next_kind);
    ptx::cp_async_wait<0>();
    __syncthreads();  // K_j, V_j (and Q, dO, stats) landed; every warp is done with the other buffer
    if (n_next < n_hi) {
      load_kv(n_next, buf ^ 1);
      ptx::cp_async_commit();
    }

    const bool needs_mask = mask.block_needs_mask(m0, m0 + rows_here, n0, n0 + kBlockN);
    KeepBits<kMTiles, kNTiles> keep;
    float s[kMTiles][kNTiles][4];
    zero_acc(s);
    warp_gemm_abt<Element, kMTiles, kNTiles, kHeadDim / 16, Layout, Layout>(s, q_a_addr, k_b_addr + buf * kKVBufBytes);
    const StepScores step{batch, head, kind, seq.seqlen_q, seq.seqlen_k};
    scores_to_probs<Traits::kMods, Element, kMTiles, kNTiles, 0>(s, keep, nullptr, warp_row0, 0, m0, n0, sStats,
                                                                 needs_mask, mask, st, lane, params, step);
    float dp[kMTiles][kNTiles][4];
    zero_acc(dp);
    warp_gemm_abt<Element, kMTiles, kNTiles, kHeadDim / 16, Layout, Layout>(dp, do_a_addr, v_b_addr + buf * kKVBufBytes);
    probs_to_grads<Traits::kMods>(s, dp, keep, warp_row0, sStats + kBlockM, st, lane);

    // dQ += dS K_j: dS stays in registers (A operand); K_j is stored [key][d] = [k][n], read
    // with ldmatrix.trans.
    warp_gemm_rs<Element, kMTiles, kDTiles, kBlockN / 16, Layout>(dq_acc, dp, k_bt_addr + buf * kKVBufBytes);
    n_block = n_next;
    kind = next_kind;
  }

  // Epilogue: dQ * scale, staged through this warp's own rows of sQ (no other warp reads them;
  // every copy into sQ completed at the last wait), stored as 16-byte chunks.
  __syncwarp();
  store_acc_16bit<Element, kMTiles, kDTiles, Layout>(sQ, dq_acc, warp_row0, 0, lane, params.scale);
  __syncwarp();
  char* gdQ = static_cast<char*>(params.dq) +
              kElem * (batch * params.dq_strides.batch + (seq.row0_q + m0) * params.dq_strides.row +
                       int64_t(head) * params.dq_strides.head);
  const int64_t dq_row_bytes = kElem * params.dq_strides.row;
  constexpr int kWarpChunks = Traits::kRowsPerWarp * Traits::kChunksPerRow;
#pragma unroll
  for (int c = lane; c < kWarpChunks; c += 32) {
    const int r = warp_row0 + c / Traits::kChunksPerRow;
    const int col = (c % Traits::kChunksPerRow) * 8;
    if (r < rows_here) {
      *reinterpret_cast<uint4*>(gdQ + r * dq_row_bytes + col * kElem) =
          *reinterpret_cast<const uint4*>(sQ + r * kStride + col);
    }
  }
}

}  // namespace flashattn::cuda
