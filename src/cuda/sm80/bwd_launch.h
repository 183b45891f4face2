// Host side of the sm80-class backward for one traits: workspace, then the kernel sequence
// preprocess -> main -> (dQ convert | deterministic dQ) -> (GQA reduction), all on `stream`.
// Included only by the generated src/cuda/instantiations/bwd_*.cu files.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/switches.h"
#include "cuda/block_tiles.h"
#include "cuda/bwd_dbias.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/kernel_facts.h"
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

// The workspace rows of kp (BwdKernelParams) for query blocks of ws_block rows.
inline void set_workspace_rows(BwdKernelParams* kp, int ws_block) {
  kp->ws_block = ws_block;
  kp->ws_seq_rows = int32_t(round_up(kp->seqlen_q, ws_block));
  kp->ws_rows = kp->is_varlen() ? round_up(kp->total_q, kWsRowAlign) + int64_t(kp->batch) * (ws_block + kWsRowAlign)
                                : int64_t(kp->batch) * kp->ws_seq_rows;
}

// Allocates (stream-ordered) and carves the workspace, O(rows * head_dim), for kp's rows
// (set_workspace_rows), kv_splits and deterministic flag: LSE*log2(e) and D per (head, row); the
// f32 dQ accumulator (atomics path only); f32 dK/dV partials when query heads are split; the
// sink gradient's partials, one per preprocess CTA (launch_bwd_preprocess's grid) and head;
// then extra_bytes for the caller (*extra, 256-byte aligned; the sm80 kBiasMask passes).
// *ws is the allocation to free.
template <int kHeadDim>
Status alloc_workspace(BwdKernelParams* kp, cudaStream_t stream, void** ws, size_t extra_bytes = 0,
                       void** extra = nullptr) {
  const size_t stat_bytes = round_up(sizeof(float) * size_t(kp->heads) * kp->ws_rows, kWsAlign);
  const size_t dq_bytes =
      kp->deterministic ? 0 : round_up(sizeof(float) * size_t(kp->heads) * kp->ws_rows * kHeadDim, kWsAlign);
  const size_t part_bytes =
      kp->kv_splits > 1
          ? round_up(sizeof(float) * size_t(kp->kv_splits) * kp->total_k * kp->heads_k * kHeadDim, kWsAlign)
          : 0;
  const int64_t pre_ctas = ceil_div(kp->ws_seq_rows, bwd_preprocess_rows_per_cta<kHeadDim>());
  kp->sink_partials_per_head = kp->dsink != nullptr ? int32_t(pre_ctas * kp->batch) : 0;
  const size_t sink_bytes = round_up(sizeof(float) * size_t(kp->heads) * kp->sink_partials_per_head, kWsAlign);
  const size_t fixed_bytes = 2 * stat_bytes + dq_bytes + 2 * part_bytes + sink_bytes;
  const size_t total = std::max<size_t>(fixed_bytes + round_up(extra_bytes, kWsAlign), kWsAlign);
  if (Status s = workspace_alloc(ws, total, stream); !s.ok()) return s;
  char* base = static_cast<char*>(*ws);
  kp->lse_log2 = reinterpret_cast<float*>(base);
  kp->dsum = reinterpret_cast<float*>(base + stat_bytes);
  kp->dq_accum = kp->deterministic ? nullptr : reinterpret_cast<float*>(base + 2 * stat_bytes);
  if (kp->kv_splits > 1) {
    kp->dk_partial = reinterpret_cast<float*>(base + 2 * stat_bytes + dq_bytes);
    kp->dv_partial = reinterpret_cast<float*>(base + 2 * stat_bytes + dq_bytes + part_bytes);
  }
  if (kp->dsink != nullptr) kp->sink_partial = reinterpret_cast<float*>(base + 2 * stat_bytes + dq_bytes + 2 * part_bytes);
  if (extra != nullptr) *extra = extra_bytes > 0 ? base + fixed_bytes : nullptr;
  return Status::Ok();
}

// The statistics every backward kernel reads (LSE*log2(e), D), and dsink when requested.
template <typename Element, int kHeadDim>
Status launch_bwd_preprocess(const BwdKernelParams& kp, cudaStream_t stream) {
  if (kp.seqlen_q > 0) {
    constexpr int kRows = bwd_preprocess_rows_per_cta<kHeadDim>();
    const dim3 grid(unsigned(ceil_div(kp.ws_seq_rows, kRows)), kp.heads, kp.batch);
    bwd_preprocess_kernel<Element, kHeadDim><<<grid, kBwdAuxThreads, 0, stream>>>(kp);
    FLASHATTN_CUDA_TRY(cudaGetLastError());
  }
  if (kp.dsink != nullptr) {
    bwd_sink_grad_kernel<Element><<<kp.heads, 32, 0, stream>>>(kp);
    FLASHATTN_CUDA_TRY(cudaGetLastError());
  }
  return Status::Ok();
}

// GQA with split query heads: dK, dV = the sums of the f32 partials (dV's kHeadDimV wide).
template <typename Element, int kHeadDim, int kHeadDimV = kHeadDim>
Status launch_bwd_reduce_dkv(const BwdKernelParams& kp, cudaStream_t stream) {
  if (kp.kv_splits > 1 && kp.seqlen_k > 0) {
    const dim3 grid(unsigned(ceil_div(kp.seqlen_k, kBwdAuxRows)), kp.heads_k, kp.batch);
    bwd_reduce_dkv_kernel<Element, kHeadDim, kHeadDimV><<<grid, kBwdAuxThreads, 0, stream>>>(kp);
    FLASHATTN_CUDA_TRY(cudaGetLastError());
  }
  return Status::Ok();
}

// Launches the kernels; the workspace pointers in kp are set.
template <typename Traits>
Status launch_bwd_kernels(const BwdKernelParams& kp, cudaStream_t stream) {
  using Element = typename Traits::Element;
  using DqTraits = BwdDqTraits<Traits>;
  constexpr int kHeadDim = Traits::kHeadDim;

  if (Status s = launch_bwd_preprocess<Element, kHeadDim>(kp, stream); !s.ok()) return s;
  if (kp.dq_accum != nullptr) {
    FLASHATTN_CUDA_TRY(cudaMemsetAsync(kp.dq_accum, 0, sizeof(float) * size_t(kp.heads) * kp.ws_rows * kHeadDim,
                                       stream));
  }
  if (kp.seqlen_k > 0) {
    // dbias with softcap: the instantiation that applies softcap's factor after dbias.
    auto kernel = bwd_kernel<Traits>;
    if constexpr (Traits::kMods == ScoreMods::kBiasMask) {
      if (kp.softcap > 0.0f && kp.dbias_out.defined()) kernel = bwd_kernel<Traits, true>;
    }
    const size_t smem = kp.step_buffers == 1 ? Traits::kSmemBytesSingle : Traits::kSmemBytes;
    // The kernel's limit is the same for every call on a device (the largest variant that fits),
    // so calls of either variant from several host threads never lower it under one another.
    if (kp.smem_limit > 48 * 1024) {
      if (Status s = raise_dynamic_smem(kernel, kp.smem_limit); !s.ok()) return s;
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
        if (Status s = raise_dynamic_smem(kernel, kSmem); !s.ok()) return s;
      }
      const dim3 grid(unsigned(ceil_div(kp.seqlen_q, DqTraits::kBlockM)), kp.heads, kp.batch);
      kernel<<<grid, DqTraits::kThreads, kSmem, stream>>>(kp);
    } else {
      const dim3 grid(unsigned(ceil_div(kp.seqlen_q, kBwdAuxRows)), kp.heads, kp.batch);
      bwd_convert_dq_kernel<Element, kHeadDim><<<grid, kBwdAuxThreads, 0, stream>>>(kp);
    }
    FLASHATTN_CUDA_TRY(cudaGetLastError());
  }
  return launch_bwd_reduce_dkv<Element, kHeadDim>(kp, stream);
}

// ScoreMods::kBiasMask under a block mask: the bytes of the block states and the tables of
// tile kinds (the main kernel's tiling, then in deterministic mode the dQ kernel's); 0 otherwise.
template <typename Traits>
size_t block_tiles_ws_bytes(const BackwardParams& p) {
  using DqTraits = BwdDqTraits<Traits>;
  if (Traits::kMods != ScoreMods::kBiasMask || !(p.block_mask.defined() || p.has_block_lists())) return 0;
  return round_up(block_states_bytes(p) + tile_kinds_bytes(p, Traits::kBlockM, Traits::kBlockN) +
                      (p.deterministic ? tile_kinds_bytes(p, DqTraits::kBlockM, DqTraits::kBlockN) : 0),
                  kWsAlign);
}

// dbias before the kernels (DbiasPlan, cuda/bwd_dbias.h): kp->dbias_out is dbias itself (float32,
// or 16-bit for the sm90 per-element stores), zeroed
// (the elements no step writes stay 0), or `partials` (the plan's ws_floats of workspace, laid out
// (batch, heads, ws_rows, seqlen_k)), zeroed; and after them the partials reduced into dbias. The
// sm80 bias/mask kernels and the sm90 bias kernels (sm90/bwd_launch.h) both write dbias_out.
// every_written: the kernels store every element of dbias_out (the sm90 bias kernel without a
// window or varlen sequences: each (b, h, i < seqlen_q, j < seqlen_k) is one step's), so nothing
// is zeroed first (at 8 x 16 x 2k x 2k a 2 GB memset); under a causal mask only the hidden
// elements are (zero_dbias_hidden: about half the bytes).
inline Status begin_dbias(BwdKernelParams* kp, const DbiasPlan& dbias, float* partials, cudaStream_t stream,
                          bool every_written = false) {
  if (!kp->dbias.defined()) return Status::Ok();
  kp->dbias_row_sum = dbias.row_sum;
  // Causal (no left bound), one row per query row, no varlen and no block mask: the steps store
  // every element of the tiles they visit, so only the hidden ones (j > r + offset) need zeros.
  const bool hidden_only = !kp->is_varlen() && kp->window_left < 0 && kp->window_right >= 0 &&
                           !dbias.row_sum && kp->seqlen_q > 1 && !kp->block_mask.defined() &&
                           !kp->has_block_lists();
  const int64_t offset = int64_t(kp->seqlen_k) - kp->seqlen_q + kp->window_right;
  if (partials == nullptr) {
    kp->dbias_out = kp->dbias;
    if (every_written) return Status::Ok();
    return hidden_only ? zero_dbias_hidden(kp->dbias, kp->seqlen_k, offset, stream)
                       : zero_dbias(kp->dbias, kp->seqlen_k, stream);
  }
  Broadcast4& o = kp->dbias_out;
  o.data = partials;
  o.dtype = DType::kFloat32;
  o.row = kp->seqlen_k;
  o.head = dbias.ws_rows * kp->seqlen_k;
  o.batch = int64_t(kp->heads) * o.head;
  o.size[0] = kp->batch, o.size[1] = kp->heads, o.size[2] = dbias.ws_rows;
  if (every_written) return Status::Ok();
  if (hidden_only) return zero_dbias_hidden(o, kp->seqlen_k, offset, stream);
  FLASHATTN_CUDA_TRY(cudaMemsetAsync(partials, 0, sizeof(float) * size_t(dbias.ws_floats), stream));
  return Status::Ok();
}
inline Status end_dbias(const BwdKernelParams& kp, const DbiasPlan& dbias, const float* partials,
                        cudaStream_t stream) {
  if (partials == nullptr) return Status::Ok();
  return reduce_dbias(kp.dbias, partials, kp.batch, kp.heads, dbias.ws_rows, kp.seqlen_k, stream);
}

// launch_bwd_kernels with ScoreMods::kBiasMask's passes around it: under a block mask, the
// block states and the tables of tile kinds (block_tiles_ws_bytes of ws), then dbias's partials
// (dbias.ws_floats; the workspace alloc_workspace appended for both); dbias zeroed
// before the kernels (stored into directly) or its partials zeroed before and reduced into
// dbias after (DbiasPlan).
template <typename Traits>
Status launch_bias_mask_bwd(BwdKernelParams* kp, const DbiasPlan& dbias, void* ws, cudaStream_t stream) {
  if constexpr (Traits::kMods == ScoreMods::kBiasMask) {
    using DqTraits = BwdDqTraits<Traits>;
    char* next = static_cast<char*>(ws);
    if (kp->block_mask.defined() || kp->has_block_lists()) {
      char* w = next;
      if (Status s = build_block_states(*kp, w, stream, &kp->block_tiles); !s.ok()) return s;
      w += block_states_bytes(*kp);
      if (Status s = build_tile_kinds(*kp, kp->block_tiles, Traits::kBlockM, Traits::kBlockN, w, stream,
                                      &kp->step_kinds);
          !s.ok()) {
        return s;
      }
      w += tile_kinds_bytes(*kp, Traits::kBlockM, Traits::kBlockN);
      if (kp->deterministic) {
        if (Status s = build_tile_kinds(*kp, kp->block_tiles, DqTraits::kBlockM, DqTraits::kBlockN, w, stream,
                                        &kp->dq_step_kinds);
            !s.ok()) {
          return s;
        }
      }
      next += block_tiles_ws_bytes<Traits>(*kp);
    }
    float* partials = dbias.ws_floats > 0 ? reinterpret_cast<float*>(next) : nullptr;
    if (Status s = begin_dbias(kp, dbias, partials, stream); !s.ok()) return s;
    if (Status s = launch_bwd_kernels<Traits>(*kp, stream); !s.ok()) return s;
    return end_dbias(*kp, dbias, partials, stream);
  } else {
    (void)dbias, (void)ws;
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
  // head dim >= 64; the GPU tests force it on any GPU (the kBwdSingleBuffer switch,
  // tests/cpp/test_special.cpp), where it passed at every head dim with masks, modifiers,
  // dropout and deterministic mode (H200, 2026-11-29). Not yet run on an A100 itself.
  const bool force_single = detail::switch_on(detail::Switch::kBwdSingleBuffer);
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
  if (Status s = multiprocessors(&num_sms); !s.ok()) return s;

  BwdKernelParams kp;
  static_cast<BackwardParams&>(kp) = params;
  set_workspace_rows(&kp, kBlockM);
  kp.kv_splits = kv_splits_for(params, Traits::kBlockN, num_sms);
  kp.step_buffers = step_buffers;
  kp.smem_limit = Traits::kSmemBytes <= size_t(smem_optin) ? Traits::kSmemBytes : Traits::kSmemBytesSingle;
  if constexpr (Traits::kInterleave) {  // one CTA per SM (the main kernel's shared memory)
    kp.cta_group_planes = causal_group_planes(params.is_causal, int(ceil_div(params.seqlen_k, Traits::kBlockN)),
                                              static_cast<long long>(params.heads_k) * kp.kv_splits * params.batch,
                                              num_sms);
  }

  const DbiasPlan dbias = Traits::kMods == ScoreMods::kBiasMask ? plan_dbias(params) : DbiasPlan{};
  void* ws = nullptr;
  void* bias_mask_ws = nullptr;
  const size_t bias_mask_bytes = block_tiles_ws_bytes<Traits>(params) + sizeof(float) * size_t(dbias.ws_floats);
  if (Status s = alloc_workspace<kHeadDim>(&kp, stream, &ws, bias_mask_bytes, &bias_mask_ws); !s.ok()) return s;

  const Status launched = launch_bias_mask_bwd<Traits>(&kp, dbias, bias_mask_ws, stream);
  const Status freed = workspace_free(ws, stream);
  return launched.ok() ? freed : launched;
}

}  // namespace flashattn::cuda
