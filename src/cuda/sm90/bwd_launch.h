// Host side of the Hopper backward for one traits: workspace, then preprocess (sm80's) -> dK/dV
// kernel -> dQ kernel -> (GQA reduction of split query heads, sm80's), all on `stream`.
// Included only by the generated src/cuda/instantiations/sm90bwd_*.cu files.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cuda/common/cuda_check.h"
#include "cuda/common/workspace.h"
#include "cuda/sm80/bwd_launch.h"  // bwd_detail::kv_splits_for, ceil_div, round_up, kWsAlign
#include "cuda/sm80/bwd_preprocess.h"
#include "cuda/sm90/bwd.h"
#include "cuda/sm90/bwd_kernel.h"
#include "cuda/sm90/tensor_map.h"

namespace flashattn::cuda::sm90 {

template <typename Traits>
Status run_bwd(const BackwardParams& params, cudaStream_t stream) {
  using namespace ::flashattn::cuda::bwd_detail;
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kWsBlock = Traits::kWsBlock;

  BwdKernelArgs args;
  BwdKernelParams& kp = args.p;
  static_cast<BackwardParams&>(kp) = params;
  const bool varlen = params.is_varlen();
  const int map_batch = varlen ? 1 : params.batch;
  const int64_t rows_q = varlen ? params.total_q : params.seqlen_q;
  const int64_t rows_k = varlen ? params.total_k : params.seqlen_k;
  const struct {
    CUtensorMap* map;
    const void* ptr;
    const Strides3& strides;
    int64_t rows;
    int heads;
    int box;
    const char* name;
  } maps[] = {
      {&args.kv.q, params.q, params.q_strides, rows_q, params.heads, Traits::kKvBlockM, "q"},
      {&args.kv.dout, params.dout, params.dout_strides, rows_q, params.heads, Traits::kKvBlockM, "dout"},
      {&args.kv.k, params.k, params.k_strides, rows_k, params.heads_k, Traits::kKvBlockN, "k"},
      {&args.kv.v, params.v, params.v_strides, rows_k, params.heads_k, Traits::kKvBlockN, "v"},
      {&args.dq.q, params.q, params.q_strides, rows_q, params.heads, Traits::kDqBlockM, "q"},
      {&args.dq.dout, params.dout, params.dout_strides, rows_q, params.heads, Traits::kDqBlockM, "dout"},
      {&args.dq.k, params.k, params.k_strides, rows_k, params.heads_k, Traits::kDqBlockN, "k"},
      {&args.dq.v, params.v, params.v_strides, rows_k, params.heads_k, Traits::kDqBlockN, "v"},
  };
  for (const auto& m : maps) {
    if (Status s = make_operand_map(m.map, m.ptr, params.dtype, kHeadDim, m.rows, m.heads, map_batch, m.strides, m.box);
        !s.ok()) {
      return Status::NotSupported(std::string(m.name) + ": " + s.message());
    }
  }

  int device = 0, num_sms = 0;
  FLASHATTN_CUDA_TRY(cudaGetDevice(&device));
  FLASHATTN_CUDA_TRY(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));

  // Workspace (BwdKernelParams): LSE*log2(e) and D per (head, row) in whole kWsBlock blocks;
  // f32 dK/dV partials when query heads are split; the sink gradient's partials.
  kp.ws_block = kWsBlock;
  kp.ws_seq_rows = int32_t(round_up(params.seqlen_q, kWsBlock));
  kp.ws_rows = varlen ? round_up(params.total_q, kWsRowAlign) + int64_t(params.batch) * (kWsBlock + kWsRowAlign)
                      : int64_t(params.batch) * kp.ws_seq_rows;
  kp.kv_splits = kv_splits_for(params, Traits::kKvBlockN, num_sms);
  kp.deterministic = true;
  const size_t stat_bytes = round_up(sizeof(float) * size_t(params.heads) * kp.ws_rows, kWsAlign);
  const size_t part_bytes =
      kp.kv_splits > 1
          ? round_up(sizeof(float) * size_t(kp.kv_splits) * params.total_k * params.heads_k * kHeadDim, kWsAlign)
          : 0;
  const int64_t pre_ctas = ceil_div(round_up(params.seqlen_q, kWsBlock), bwd_preprocess_rows_per_cta<kHeadDim>());
  kp.sink_partials_per_head = params.dsink != nullptr ? int32_t(pre_ctas * params.batch) : 0;
  const size_t sink_bytes = round_up(sizeof(float) * size_t(params.heads) * kp.sink_partials_per_head, kWsAlign);
  const size_t total = std::max<size_t>(2 * stat_bytes + 2 * part_bytes + sink_bytes, kWsAlign);
  void* ws = nullptr;
  if (Status s = workspace_alloc(&ws, total, stream); !s.ok()) return s;
  char* base = static_cast<char*>(ws);
  kp.lse_log2 = reinterpret_cast<float*>(base);
  kp.dsum = reinterpret_cast<float*>(base + stat_bytes);
  kp.dq_accum = nullptr;
  if (kp.kv_splits > 1) {
    kp.dk_partial = reinterpret_cast<float*>(base + 2 * stat_bytes);
    kp.dv_partial = reinterpret_cast<float*>(base + 2 * stat_bytes + part_bytes);
  }
  if (params.dsink != nullptr) kp.sink_partial = reinterpret_cast<float*>(base + 2 * stat_bytes + 2 * part_bytes);

  const auto launch = [&]() -> Status {
    {
      constexpr int kRows = bwd_preprocess_rows_per_cta<kHeadDim>();
      const dim3 grid(unsigned(ceil_div(kp.ws_seq_rows, kRows)), kp.heads, kp.batch);
      bwd_preprocess_kernel<Element, kHeadDim><<<grid, kBwdAuxThreads, 0, stream>>>(kp);
      FLASHATTN_CUDA_TRY(cudaGetLastError());
    }
    if (kp.dsink != nullptr) {
      bwd_sink_grad_kernel<Element><<<kp.heads, 32, 0, stream>>>(kp);
      FLASHATTN_CUDA_TRY(cudaGetLastError());
    }
    {
      const auto kernel = bwd_kv_kernel<Traits>;
      constexpr size_t kSmem = Traits::kKvSmemBytes;
      FLASHATTN_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
      const dim3 grid(unsigned(ceil_div(kp.seqlen_k, Traits::kKvBlockN)), kp.heads_k * kp.kv_splits, kp.batch);
      kernel<<<grid, Traits::kThreads, kSmem, stream>>>(args);
      FLASHATTN_CUDA_TRY(cudaGetLastError());
    }
    {
      const auto kernel = bwd_dq_kernel<Traits>;
      constexpr size_t kSmem = Traits::kDqSmemBytes;
      FLASHATTN_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
      const dim3 grid(unsigned(ceil_div(kp.seqlen_q, Traits::kDqBlockM)), kp.heads, kp.batch);
      kernel<<<grid, Traits::kThreads, kSmem, stream>>>(args);
      FLASHATTN_CUDA_TRY(cudaGetLastError());
    }
    if (kp.kv_splits > 1) {
      const dim3 grid(unsigned(ceil_div(kp.seqlen_k, kBwdAuxRows)), kp.heads_k, kp.batch);
      bwd_reduce_dkv_kernel<Element, kHeadDim><<<grid, kBwdAuxThreads, 0, stream>>>(kp);
      FLASHATTN_CUDA_TRY(cudaGetLastError());
    }
    return Status::Ok();
  };
  const Status launched = launch();
  const Status freed = workspace_free(ws, stream);
  return launched.ok() ? freed : launched;
}

}  // namespace flashattn::cuda::sm90
