// The one place where the forward's run-time options become template arguments.
#include <atomic>
#include <cstdlib>

#include "core/switches.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/kernel_facts.h"
#include "cuda/common/tile_size.h"
#include "cuda/common/variants.h"
#include "cuda/sm80/fwd.h"
#include "cuda/sm80/fwd_kernel.h"

namespace flashattn::cuda {
namespace {

// Decode with grouped KV heads: a single query token per sequence would fill one row of a
// 128-row tile. Folding the `heads / heads_k` query heads that share a KV head into the query
// sequence (q viewed as (batch, group, heads_k, d)) gives each CTA `group` useful rows and reads
// each KV head once instead of once per query head. Exact only when every folded row sees the
// same keys with the same scores: no left window, no ALiBi (per-head slopes), no dropout (the
// mask is indexed by head and row), no bias or masks (per head and row either); LSE must have
// a unit head stride to keep unit row stride.
// Learnable sinks are per query head: sink_fold tells the epilogue and the combine whose sink
// each folded row takes.
ForwardParams fold_gqa_decode(const ForwardParams& p) {
  const bool foldable = p.seqlen_q == 1 && p.heads > p.heads_k && !p.is_varlen() && p.alibi == nullptr &&
                        !p.has_dropout() && p.window_left < 0 && !p.has_score_mods() &&
                        (p.lse == nullptr || p.lse_head_stride == 1);
  if (!foldable) return p;
  const int group = p.heads / p.heads_k;
  ForwardParams f = p;
  f.seqlen_q = group;
  f.heads = p.heads_k;
  f.total_q = int64_t(p.batch) * group;
  f.q_strides = Strides3{p.q_strides.batch, p.q_strides.head, p.q_strides.head * group};
  f.out_strides = Strides3{p.out_strides.batch, p.out_strides.head, p.out_strides.head * group};
  f.lse_head_stride = p.lse_head_stride * group;
  f.sink_fold = group;  // row i of kv head h is query head h * group + i: its sink
  // With one query, a right window (causal included) hides no key: seqlen_k - 1 + right >= the
  // last key. Drop it, since the folded rows would otherwise be masked differently.
  f.window_left = f.window_right = -1;
  f.is_causal = false;
  return f;
}

// The decode tile's rows, the same at every head dim and cache dtype (run_fwd picks that tile
// for calls of at most this many rows, and for folded tokens: fold_gqa_tokens).
constexpr int kDecodeRows = fwd_decode_tile(64).block_m;
static_assert(fwd_decode_tile(128).block_m == kDecodeRows && fwd_decode_tile(256).block_m == kDecodeRows &&
                  fwd_decode_tile(128, true).block_m == kDecodeRows &&
                  fwd_fp8_cache_decode_tile(64, false, false).block_m == kDecodeRows &&
                  fwd_fp8_cache_decode_tile(128, true, true).block_m == kDecodeRows &&
                  fwd_fp8_cache_decode_tile(256, false, false).block_m == kDecodeRows,
              "one decode tile height");

// Decode with grouped KV heads and 2-16 query tokens (speculative decoding, chunked decode), and
// one token where fold_gqa_decode declines (a left window, an LSE without unit head stride,
// varlen calls: vLLM's decode and mixed batches through flash_attn_varlen_func, max_seqlen_q
// <= 16, each sequence's rows from its own token count):
// the same reason to fold, but the rows of a KV head are (token, group member) pairs, r = t *
// group + j, which q, out and LSE do not hold evenly spaced: the decode kernels place each row
// from ForwardParams::q_fold (fwd_kernel.h FoldedRows) and mask by token (the mask of the
// seqlen_q tokens, so causal and windows stay exact per token). The folded rows run on the
// decode tile (run_fwd), ceil(tokens x group / 16) tiles per KV head, each reading the head's
// keys once, where unfolded each of the group's query heads reads them (with at most 16 tokens
// the unfolded call takes one decode tile per query head). So only where that is fewer reads,
// i.e. tokens <= floor(16 (group - 1) / group): up to 12 tokens at 32/8 heads, 8 with pairs, 14
// at 64/8; beyond, the fold would change nothing but the split count. Exact under the same
// conditions as the one-token fold except windows, which the token mask keeps. token_fold_max
// is that bound for p's options (0: no fold).
int token_fold_max(const ForwardParams& p) {
  const int group = p.heads_k > 0 ? p.heads / p.heads_k : 1;
  if (group < 2 || p.alibi != nullptr || p.has_dropout() || p.has_score_mods() ||
      detail::switch_on(detail::Switch::kNoTokenFold)) {
    return 0;
  }
  return kDecodeRows * (group - 1) / group;  // ceil(t x group / 16) < group <=> t <= this
}

ForwardParams fold_gqa_tokens(const ForwardParams& p) {
  const int group = p.heads_k > 0 ? p.heads / p.heads_k : 1;
  if (p.seqlen_q < 1 || p.seqlen_q > token_fold_max(p)) return p;
  detail::count_token_fold();
  ForwardParams f = p;
  f.seqlen_q = p.seqlen_q * group;  // rows; total_q keeps counting tokens (ForwardParams::q_fold)
  f.heads = p.heads_k;
  f.q_fold = group;
  f.sink_fold = group;  // row r of kv head h is query head h * group + r % group: its sink
  f.q_fold_head = p.q_strides.head;
  f.out_fold_head = p.out_strides.head;
  f.lse_fold_head = p.lse_head_stride;
  f.q_strides.head = p.q_strides.head * group;
  f.out_strides.head = p.out_strides.head * group;
  f.lse_head_stride = p.lse_head_stride * group;
  return f;
}

ForwardParams fold_gqa(const ForwardParams& p) {
  if (p.seqlen_q == 1 && !detail::switch_on(detail::Switch::kNoDecodeFold)) {
    ForwardParams f = fold_gqa_decode(p);
    if (f.sink_fold > 1) return f;  // folded
  }
  return fold_gqa_tokens(p);
}

}  // namespace

int decode_tokens_max(const ForwardParams& params) {
  const int folded = token_fold_max(params);
  return folded > 0 ? folded : kDecodeRows;
}

Status dispatch_fwd(const ForwardParams& params, cudaStream_t stream) {
  const ForwardParams p = fold_gqa(params);
  return dispatch_variant<true>(p, [&]<typename Element, int kHeadDim, MaskMode kMask, ScoreMods kMods>() {
    return run_fwd<FwdTraits<Element, kHeadDim, kMask, kMods>>(p, stream);
  });
}

Status dispatch_fwd_kvcache(const ForwardParams& params, cudaStream_t stream) {
  const ForwardParams p = fold_gqa(params);
  if (p.kv_dtype == DType::kFloat8E4M3) {
    return dispatch_variant<false, kFp8CacheHeadDims>(
        p, [&]<typename Element, int kHeadDim, MaskMode kMask, ScoreMods kMods>() {
          return run_fwd_kvcache_fp8<FwdTraits<Element, kHeadDim, kMask, kMods>>(p, stream);
        });
  }
  return dispatch_variant(p, [&]<typename Element, int kHeadDim, MaskMode kMask, ScoreMods kMods>() {
    return run_fwd_kvcache<FwdTraits<Element, kHeadDim, kMask, kMods>>(p, stream);
  });
}

Status compute90_code(const void* kernel, bool* yes) {
  // 0 unknown, 1 no, 2 yes.
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices];
  int device = 0;
  FLASHATTN_CUDA_TRY(cudaGetDevice(&device));
  const bool cached = device >= 0 && device < kMaxDevices;
  if (cached && known[device].load(std::memory_order_relaxed) != 0) {
    *yes = known[device].load(std::memory_order_relaxed) == 2;
    return Status::Ok();
  }
  int major = 0;
  if (Status s = compute_major(&major); !s.ok()) return s;
  cudaFuncAttributes attributes = {};
  FLASHATTN_CUDA_TRY(cudaFuncGetAttributes(&attributes, kernel));
  *yes = major >= 9 && attributes.ptxVersion >= 90;
  if (cached) known[device].store(*yes ? 2 : 1, std::memory_order_relaxed);
  return Status::Ok();
}

Status split_cluster_fits(const void* kernel, int threads, size_t smem, int splits, bool* fits) {
  *fits = false;
  if (splits < 2 || splits > kMaxSplitCluster) return Status::Ok();
  // Hopper only: the rule in fwd_launch.h was measured there (a newer GPU running the compute_90
  // code keeps the counters until measured).
  int major = 0;
  if (Status s = compute_major(&major); !s.ok()) return s;
  bool code = false;
  if (Status s = compute90_code(kernel, &code); !s.ok()) return s;
  if (major != 9 || !code) return Status::Ok();
  int clusters = 0;
  if (Status s = active_clusters(kernel, threads, smem, splits, &clusters); !s.ok()) return s;
  *fits = clusters >= 1;
  return Status::Ok();
}

}  // namespace flashattn::cuda
