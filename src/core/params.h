// Validated, resolved parameters handed from src/core to a backend. Built once on the host by
// make_forward_params / make_backward_params (validate.cpp); backends never re-check arguments.
//
// Indexing convention (dense and varlen alike): the row of sequence b at position i is
//   ptr + b * batch_stride + (row_offset(b) + i) * row_stride + head * head_stride
// where row_offset(b) = cu_seqlens[b] in varlen mode and 0 otherwise (batch_stride is then 0).
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "flashattn/types.h"

namespace flashattn {

// Strides of one (batch, seq, head, dim) operand, in elements; the dim stride is 1.
struct Strides3 {
  int64_t batch = 0;
  int64_t row = 0;
  int64_t head = 0;
};

struct QKVParams {
  DType dtype = DType::kFloat16;
  Device device{};

  const void* q = nullptr;  // (batch, seqlen_q, heads, head_dim)
  const void* k = nullptr;  // (batch, seqlen_k, heads_k, head_dim)
  const void* v = nullptr;  // (batch, seqlen_k, heads_k, head_dim_v)
  Strides3 q_strides, k_strides, v_strides;

  int32_t batch = 0;
  int32_t heads = 0;
  int32_t heads_k = 0;
  int32_t head_dim = 0;
  int32_t head_dim_v = 0;
  // Dense: the sequence lengths. Varlen: the largest ones (max_seqlen_*).
  int32_t seqlen_q = 0;
  int32_t seqlen_k = 0;
  int64_t total_q = 0;  // rows of q in varlen mode (= batch * seqlen_q when dense)
  int64_t total_k = 0;

  // Varlen: int32 (batch + 1), on the tensors' device. Null when dense.
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  FLASHATTN_HOST_DEVICE bool is_varlen() const { return cu_seqlens_q != nullptr; }

  float scale = 0.0f;       // softmax_scale
  float scale_log2 = 0.0f;  // softmax_scale * log2(e) (softcap == 0), used with exp2
  float softcap = 0.0f;     // 0 = off

  // Window around the bottom-right diagonal; -1 = unbounded. Causal is (-1, 0).
  int32_t window_left = -1;
  int32_t window_right = -1;
  bool is_causal = false;  // window == (-1, 0)
  FLASHATTN_HOST_DEVICE bool has_window() const { return window_left >= 0 || window_right >= 0; }

  // ALiBi slopes, float32: slope(b, h) = alibi[b * alibi_batch_stride + h]. Null when off.
  const float* alibi = nullptr;
  int64_t alibi_batch_stride = 0;

  float dropout_p = 0.0f;
  uint32_t dropout_threshold = 0;  // keep iff philox draw >= threshold (see philox.h)
  float dropout_rescale = 1.0f;    // 1 / (1 - p)
  uint64_t seed = 0;
  uint64_t offset = 0;
  FLASHATTN_HOST_DEVICE bool has_dropout() const { return dropout_p > 0.0f; }

  // float32 log-sum-exp: lse[b * lse_batch_stride + h * lse_head_stride + row_offset(b) + i].
  float* lse = nullptr;
  int64_t lse_batch_stride = 0;
  int64_t lse_head_stride = 0;

  void* stream = nullptr;
  int32_t num_threads = 0;

  // Learnable sink logits, float32 (heads), natural log (core/sink.h). Null when off.
  const float* learnable_sink = nullptr;
};

struct ForwardParams : QKVParams {
  void* out = nullptr;  // (batch, seqlen_q, heads, head_dim_v)
  Strides3 out_strides;
  // Requested key/value splits (0 = heuristic). The CUDA backend resolves it to >= 1 and, when
  // > 1, points split_out / split_lse at its workspace:
  //   split_out (num_splits, total_q, heads, head_dim_v) f32, normalised per split
  //   split_lse (num_splits, heads, total_q) f32
  // where a row's global index is cu_seqlens_q[b] + i (varlen) or b * seqlen_q + i (dense).
  int32_t num_splits = 0;
  float* split_out = nullptr;
  float* split_lse = nullptr;
  // Set by the CUDA backend: causal launches start their CTAs in groups of this many
  // (head, batch[, split]) planes, heaviest blocks first (cuda/common/cta_order.h); 1 = plain order.
  int32_t cta_group_planes = 1;
  // Set by the CUDA backend when it folds a GQA group of query heads into the query rows
  // (decode): row i of head h belongs to query head h * sink_fold + i % sink_fold, whose
  // learnable sink that row uses. 1 = no folding.
  int32_t sink_fold = 1;
};

struct BackwardParams : QKVParams {
  const void* out = nullptr;
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  Strides3 out_strides, dout_strides, dq_strides, dk_strides, dv_strides;
  bool deterministic = false;
  // float32 (heads): the gradient of learnable_sink; null when not requested.
  float* dsink = nullptr;
};

// Converts/validates public arguments. On error the params are unspecified.
Status make_forward_params(const struct ForwardArgs& args, ForwardParams* params);
Status make_backward_params(const struct BackwardArgs& args, BackwardParams* params);

}  // namespace flashattn
