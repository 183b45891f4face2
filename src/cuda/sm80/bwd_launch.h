// Host side of the sm80-class backward for one traits: workspace, then the kernel sequence
// preprocess -> main -> (dQ convert | deterministic dQ) -> (GQA reduction), all on `stream`.
// Included only by the generated src/cuda/instantiations/bwd_*.cu files.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "cuda/block_tiles.h"
#include "cuda/bwd_dbias.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/workspace.h"
#include "cuda/sm80/bwd_common.h"
#include "cuda/sm80/bwd_dq_kernel.h"
#include "cuda/sm80/bwd_kernel.h"
#include "cuda/sm80/bwd_preprocess.h"

namespace flashattn::cuda {

namespace bwd_detail {

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
constexpr int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
constexpr size_t kWsAlign = 256;  // byte alignment of each workspace array

// Query-head chunks per kv head (GQA). One chunk keeps all of a kv head's dK/dV in one CTA's
// registers (no partials); more chunks add CTAs when key blocks x kv heads x batch would leave
// SMs idle, at the price of f32 partials and a reduction. Picks the smallest divisor of the
// group size that fills the SMs once.
inline int kv_splits_for(const BackwardParams& p, int block_n, int num_sms) {
  const int group = p.heads / p.heads_k;
  const int64_t ctas = ceil_div(p.seqlen_k, block_n) * p.heads_k * p.batch;
  int splits = 1;
  while (splits < group && ctas * splits < num_sms) {
    ++splits;
    while (group % splits != 0) ++splits;
  }
  return splits;
}

// FLASHATTN_DEV_BWD_SINGLE_BUFFER=1 forces one step buffer on any GPU (tests of that variant).
inline bool dev_bwd_single_buffer() {
  const char* v = std::getenv("FLASHATTN_DEV_BWD_SINGLE_BUFFER");
  return v != nullptr && v[0] == '1';
}

// Whether dbias can take the main kernel's stores itself: no two (sequence, head, query row)
// share one of its elements (bwd_dbias.h).
inline bool dbias_is_direct(const BackwardParams& p) {
  const Broadcast4& d = p.dbias;
  return d.size[0] == p.batch && d.size[1] == p.heads && d.size[2] == p.seqlen_q;
}

// Launches the kernels; the workspace pointers in kp are set.
template <typename Traits>
Status launch_bwd_kernels(const BwdKernelParams& kp, cudaStream_t stream) {
  using Element = typename Traits::Element;
  using DqTraits = BwdDqTraits<Traits>;
  constexpr int kHeadDim = Traits::kHeadDim;

  if (kp.seqlen_q > 0) {
    constexpr int kRows = bwd_preprocess_rows_per_cta<kHeadDim>();
    const dim3 grid(unsigned(ceil_div(round_up(kp.seqlen_q, Traits::kBlockM), kRows)), kp.heads, kp.batch);
    bwd_preprocess_kernel<Element, kHeadDim><<<grid, kBwdAuxThreads, 0, stream>>>(kp);
    FLASHATTN_CUDA_TRY(cudaGetLastError());
  }
  if (kp.dsink != nullptr) {
    bwd_sink_grad_kernel<Element><<<kp.heads, 32, 0, stream>>>(kp);
    FLASHATTN_CUDA_TRY(cudaGetLastError());
  }
  if (kp.dq_accum != nullptr) {
    FLASHATTN_CUDA_TRY(cudaMemsetAsync(kp.dq_accum, 0, sizeof(float) * size_t(kp.heads) * kp.ws_rows * kHeadDim,
                                       stream));
  }
  if (kp.seqlen_k > 0) {
    const auto kernel = bwd_kernel<Traits>;
    const size_t smem = kp.step_buffers == 1 ? Traits::kSmemBytesSingle : Traits::kSmemBytes;
    // The kernel's limit is the same for every call on a device (the largest variant that fits),
    // so calls of either variant from several host threads never lower it under one another.
    if (kp.smem_limit > 48 * 1024) {
      FLASHATTN_CUDA_TRY(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kp.smem_limit)));
    }
    const dim3 grid(unsigned(ceil_div(kp.seqlen_k, Traits::kBlockN)), kp.heads_k * kp.kv_splits, kp.batch);
    kernel<<<grid, Traits::kThreads, smem, stream>>>(kp);
    FLASHATTN_CUDA_TRY(cudaGetLastError());
  }
  if (kp.seqlen_q > 0) {
    if (kp.deterministic) {
      const auto kernel = bwd_dq_kernel<DqTraits>;
      constexpr size_t kSmem = DqTraits::kSmemBytes;
      if constexpr (kSmem > 48 * 1024) {
        FLASHATTN_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
      }
      const dim3 grid(unsigned(ceil_div(kp.seqlen_q, DqTraits::kBlockM)), kp.heads, kp.batch);
      kernel<<<grid, DqTraits::kThreads, kSmem, stream>>>(kp);
    } else {
      const dim3 grid(unsigned(ceil_div(kp.seqlen_q, kBwdAuxRows)), kp.heads, kp.batch);
      bwd_convert_dq_kernel<Element, kHeadDim><<<grid, kBwdAuxThreads, 0, stream>>>(kp);
    }
    FLASHATTN_CUDA_TRY(cudaGetLastError());
  }
  if (kp.kv_splits > 1 && kp.seqlen_k > 0) {
    const dim3 grid(unsigned(ceil_div(kp.seqlen_k, kBwdAuxRows)), kp.heads_k, kp.batch);
    bwd_reduce_dkv_kernel<Element, kHeadDim><<<grid, kBwdAuxThreads, 0, stream>>>(kp);
    FLASHATTN_CUDA_TRY(cudaGetLastError());
  }
  return Status::Ok();
}

// launch_bwd_kernels with ScoreMods::kBiasMask's passes around it: under a block mask, the
// block states and the tables of tile kinds (into states_ws), and dbias zeroed before the
// kernels (stored into directly) or its workspace (dbias_ws, dbias_ws_elems floats) zeroed
// before and reduced into dbias after.
template <typename Traits>
Status launch_bias_mask_bwd(BwdKernelParams* kp, void* states_ws, void* dbias_ws, int64_t dbias_ws_elems,
                            cudaStream_t stream) {
  if constexpr (Traits::kMods == ScoreMods::kBiasMask) {
    using DqTraits = BwdDqTraits<Traits>;
    if (kp->block_mask.defined() || kp->has_block_lists()) {
      char* ws = static_cast<char*>(states_ws);
      if (Status s = build_block_states(*kp, ws, stream, &kp->block_tiles); !s.ok()) return s;
      ws += block_states_bytes(*kp);
      if (Status s = build_tile_kinds(*kp, kp->block_tiles, Traits::kBlockM, Traits::kBlockN, ws, stream,
                                      &kp->step_kinds);
          !s.ok()) {
        return s;
      }
      ws += tile_kinds_bytes(*kp, Traits::kBlockM, Traits::kBlockN);
      if (kp->deterministic) {
        if (Status s = build_tile_kinds(*kp, kp->block_tiles, DqTraits::kBlockM, DqTraits::kBlockN, ws, stream,
                                        &kp->dq_step_kinds);
            !s.ok()) {
          return s;
        }
      }
    }
    if (kp->dbias.defined()) {
      if (dbias_ws_elems == 0) {
        kp->dbias_out = kp->dbias;
        if (Status s = zero_dbias(kp->dbias, kp->seqlen_k, stream); !s.ok()) return s;
      } else {
        Broadcast4& o = kp->dbias_out;
        o.data = dbias_ws;
        o.row = kp->seqlen_k;
        o.head = int64_t(kp->seqlen_q) * kp->seqlen_k;
        o.batch = int64_t(kp->heads) * o.head;
        FLASHATTN_CUDA_TRY(cudaMemsetAsync(dbias_ws, 0, sizeof(float) * size_t(dbias_ws_elems), stream));
      }
    }
    if (Status s = launch_bwd_kernels<Traits>(*kp, stream); !s.ok()) return s;
    if (dbias_ws_elems == 0) return Status::Ok();
    return reduce_dbias(kp->dbias, static_cast<const float*>(dbias_ws), kp->batch, kp->heads, kp->seqlen_q,
                        kp->seqlen_k, stream);
  } else {
    (void)states_ws, (void)dbias_ws, (void)dbias_ws_elems;
    return launch_bwd_kernels<Traits>(*kp, stream);
  }
}

}  // namespace bwd_detail

template <typename Traits>
Status run_bwd(const BackwardParams& params, cudaStream_t stream) {
  using namespace bwd_detail;
  using DqTraits = BwdDqTraits<Traits>;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kBlockM = Traits::kBlockM;

  int device = 0;
  FLASHATTN_CUDA_TRY(cudaGetDevice(&device));
  int smem_optin = 0;
  FLASHATTN_CUDA_TRY(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  // Two Q/dO step buffers where they fit. One step buffer (BwdTraits) is what fits an A100 at
  // head dim >= 64; the GPU tests force it on any GPU (FLASHATTN_DEV_BWD_SINGLE_BUFFER=1,
  // tests/cpp/test_special.cpp), where it passed at every head dim with masks, modifiers,
  // dropout and deterministic mode (H200, 2026-11-29). Not yet run on an A100 itself.
  const bool force_single = dev_bwd_single_buffer();
  int step_buffers = 2;
  if (force_single ||
      (Traits::kSmemBytes > size_t(smem_optin) &&
       Traits::kSmemBytesSingle <= size_t(smem_optin))) {
    step_buffers = 1;
  }
  const size_t main_smem = step_buffers == 1 ? Traits::kSmemBytesSingle : Traits::kSmemBytes;
  const size_t smem_needed = std::max(main_smem, params.deterministic ? DqTraits::kSmemBytes : size_t(0));
  if (smem_needed > size_t(smem_optin)) {
    return Status::NotSupported("the CUDA backward for head_dim " + std::to_string(kHeadDim) + " needs " +
                                std::to_string(smem_needed) + " bytes of shared memory per block; device " +
                                std::to_string(device) + " allows " + std::to_string(smem_optin));
  }
  int num_sms = 0;
  FLASHATTN_CUDA_TRY(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));

  BwdKernelParams kp;
  static_cast<BackwardParams&>(kp) = params;
  kp.ws_block = kBlockM;
  kp.ws_seq_rows = int32_t(round_up(params.seqlen_q, kBlockM));
  kp.ws_rows = params.is_varlen() ? round_up(params.total_q, kWsRowAlign) +
                                        int64_t(params.batch) * (kBlockM + kWsRowAlign)
                                  : int64_t(params.batch) * kp.ws_seq_rows;
  kp.kv_splits = kv_splits_for(params, Traits::kBlockN, num_sms);
  kp.step_buffers = step_buffers;
  kp.smem_limit = Traits::kSmemBytes <= size_t(smem_optin) ? Traits::kSmemBytes : Traits::kSmemBytesSingle;
  if constexpr (Traits::kInterleave) {  // one CTA per SM (the main kernel's shared memory)
    kp.cta_group_planes = causal_group_planes(params.is_causal, int(ceil_div(params.seqlen_k, Traits::kBlockN)),
                                              static_cast<long long>(params.heads_k) * kp.kv_splits * params.batch,
                                              num_sms);
  }

  // Workspace, O(rows * head_dim): LSE*log2(e) and D per (head, row); the f32 dQ accumulator
  // (atomics path only); f32 dK/dV partials when query heads are split.
  const size_t stat_bytes = round_up(sizeof(float) * size_t(params.heads) * kp.ws_rows, kWsAlign);
  const size_t dq_bytes =
      params.deterministic ? 0 : round_up(sizeof(float) * size_t(params.heads) * kp.ws_rows * kHeadDim, kWsAlign);
  const size_t part_bytes =
      kp.kv_splits > 1
          ? round_up(sizeof(float) * size_t(kp.kv_splits) * params.total_k * params.heads_k * kHeadDim, kWsAlign)
          : 0;
  // dsink: one f32 partial per preprocess CTA (launch_bwd_kernels' grid) and head.
  const int64_t pre_ctas = ceil_div(round_up(params.seqlen_q, kBlockM), bwd_preprocess_rows_per_cta<kHeadDim>());
  kp.sink_partials_per_head = params.dsink != nullptr ? int32_t(pre_ctas * params.batch) : 0;
  const size_t sink_bytes = round_up(sizeof(float) * size_t(params.heads) * kp.sink_partials_per_head, kWsAlign);
  // ScoreMods::kBiasMask: the block states of a block mask; dbias's workspace where it broadcasts.
  // The tables of tile kinds follow the states (main kernel's tiling, then the dQ kernel's).
  const bool states = Traits::kMods == ScoreMods::kBiasMask && (params.block_mask.defined() || params.has_block_lists());
  const size_t states_bytes =
      states ? round_up(block_states_bytes(params) + tile_kinds_bytes(params, Traits::kBlockM, Traits::kBlockN) +
                            (params.deterministic ? tile_kinds_bytes(params, DqTraits::kBlockM, DqTraits::kBlockN) : 0),
                        kWsAlign)
             : 0;
  const bool dbias_ws = Traits::kMods == ScoreMods::kBiasMask && params.dbias.defined() && !dbias_is_direct(params);
  const int64_t dbias_ws_elems = dbias_ws ? int64_t(params.batch) * params.heads * params.seqlen_q * params.seqlen_k : 0;
  const size_t dbias_bytes = round_up(sizeof(float) * size_t(dbias_ws_elems), kWsAlign);
  const size_t fixed_bytes = 2 * stat_bytes + dq_bytes + 2 * part_bytes + sink_bytes;
  const size_t total = std::max<size_t>(fixed_bytes + states_bytes + dbias_bytes, kWsAlign);
  void* ws = nullptr;
  if (Status s = workspace_alloc(&ws, total, stream); !s.ok()) return s;
  char* base = static_cast<char*>(ws);
  kp.lse_log2 = reinterpret_cast<float*>(base);
  kp.dsum = reinterpret_cast<float*>(base + stat_bytes);
  kp.dq_accum = params.deterministic ? nullptr : reinterpret_cast<float*>(base + 2 * stat_bytes);
  if (kp.kv_splits > 1) {
    kp.dk_partial = reinterpret_cast<float*>(base + 2 * stat_bytes + dq_bytes);
    kp.dv_partial = reinterpret_cast<float*>(base + 2 * stat_bytes + dq_bytes + part_bytes);
  }
  if (params.dsink != nullptr) {
    kp.sink_partial = reinterpret_cast<float*>(base + 2 * stat_bytes + dq_bytes + 2 * part_bytes);
  }

  const Status launched = launch_bias_mask_bwd<Traits>(&kp, base + fixed_bytes, base + fixed_bytes + states_bytes,
                                                       dbias_ws_elems, stream);
  const Status freed = workspace_free(ws, stream);
  return launched.ok() ? freed : launched;
}

}  // namespace flashattn::cuda
