// Host-side launch of one forward kernel instantiation. Included only by the generated
// src/cuda/instantiations/fwd_*.cu files, each of which instantiates run_fwd for one traits.
#pragma once

#include <cuda_runtime.h>

#include "core/switches.h"
#include "cuda/block_tiles.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/kernel_facts.h"
#include "cuda/common/split_heuristic.h"
#include "cuda/common/workspace.h"
#include "cuda/sm80/fwd.h"
#include "cuda/sm80/fwd_kernel.h"

namespace flashattn::cuda {

// Launches fwd_combine_kernel over params' split partials (params.num_splits > 1, split_out and
// split_lse set, row width kHeadDimV). On sm90 the combine is a programmatic dependent launch: it
// starts while the split kernel's last CTAs run and waits for their partials in the kernel
// (cudaGridDependencySynchronize), instead of launching after the whole grid. H200, batch 1 x 4k
// decode: 16.7 -> 15.8 us (flash_attn_func) and 17.8 -> 16.5 us (KV cache), larger shapes within
// 1% (dev/results/h200-2026-12-01-ab-pdl-*.json). Only where the loaded combine kernel was
// compiled for compute 9.0 or newer: older code (a build without sm_90, JIT-compiled from
// compute_80 PTX on a Hopper GPU) has no wait and launches plainly. Not used where the decode
// kernels merge their own partials (params.split_counters; launch_fwd).
template <typename Element, int kHeadDimV>
Status launch_split_combine(const ForwardParams& params, cudaStream_t stream) {
  return launch_combine_after_splits(fwd_combine_kernel<Element, kHeadDimV>,
                                     dim3(unsigned((params.split_rows() + 3) / 4), unsigned(params.heads)), dim3(128),
                                     params, stream, "launching the split-KV combine kernel");
}

template <typename Traits>
Status launch_fwd(const ForwardParams& params_in, cudaStream_t stream) {
  const auto kernel = fwd_kernel<Traits>;
  if constexpr (Traits::kSmemBytes > 48 * 1024) {
    if (Status s = raise_dynamic_smem(kernel, Traits::kSmemBytes); !s.ok()) return s;
  }
  // The e4m3 cache kernels take less without pages or with shared page offsets (FwdTraits::smem_bytes).
  const size_t smem = Traits::smem_bytes(params_in.kv.paged(), page_offsets_shared<Traits>(params_in));
  ForwardParams params = params_in;
  const int m_blocks = (params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  const int n_blocks = (params.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  int splits = params.num_splits;
  const bool chosen = splits == 0;  // the count is the heuristic's, not the caller's
  const bool grouped = params.is_causal;  // causal launches interleave their planes (cta_order.h)
  int sms = 0, per_sm = 0;
  if (splits == 0 || grouped) {
    if (Status s = multiprocessors(&sms); !s.ok()) return s;
    if (Status s = blocks_per_sm(kernel, Traits::kThreads, smem, &per_sm); !s.ok()) return s;
  }
  if (splits == 0) {
    splits = choose_num_splits(static_cast<long long>(m_blocks) * params.heads * params.batch, n_blocks, sms,
                               per_sm, 64, Traits::kSplitKeys ? SplitCost::kDecodeMerge : SplitCost::kRowTiles);
  }
  splits = std::max(1, std::min({splits, n_blocks, 65535 / std::max(1, params.batch)}));
  // Split-KV decode on sm90 at small grids: the splits of each row group run as one thread-block
  // cluster and merge their partials in distributed shared memory (fwd_kernel.h
  // merge_splits_in_cluster): no workspace, counters, fences or combine kernel. Where: at most
  // kMaxSplitCluster splits, the heuristic's count capped to it when the cap at most halves it
  // (dense caches), one query block (the plain CTA order, cta_order.h) and at most two CTAs per
  // SM on average. Measured (H200, d128 bf16, 32 query heads over 8 KV heads, one token, eager
  // us, cluster / counter merge, dev/results/h200-2026-12-04-s30-placement-*.json): batch 1 x 4k
  // 8 splits 11.1-11.3 against the counter merge's best (16 splits) 12.2-12.5; 2 x 4k 13.2-13.5
  // against 13.6-14.4; 4 x 4k 23.0-23.3 against 24.8-26.0. Clusters of 12 or 16 were slower than
  // of 8 at every such shape (b1 x 4k 11.7-12.4); fewer splits lose where the keys are long (b1 x
  // 16k 8 splits 34.1 against 32 splits 26.3: hence at most halved), and larger grids lose with
  // clusters (b8 x 8k 6 splits 82 against 70 us, b64 x 4k 3 splits 254 against 250). Placement:
  // one CTA per SM (shared memory padded) was slower at every shape, the spread scheduling policy
  // the same as the default (-0.1..-0.2 us). The switches keep the counter merge
  // (FLASHATTN_SPLIT_COMBINE=counter) or the combine kernel (=kernel) for tests and A/B runs; they
  // change the merge only, not the split count (an A/B of the merge alone, and the same bits).
  bool cluster = false;
  if constexpr (Traits::kSplitKeys) {
    // Paged caches keep the heuristic's count (b1 x 4k, 16-row pages: 15.3 us at 8 splits in
    // clusters against 14.3 at 16 by the counters,
    // dev/results/h200-2026-12-04-s30-decode-capped-paged-361c7ce.json: each split's key blocks
    // cost their page work in turn), but for several query tokens folded into the rows
    // (fold_gqa_tokens: q_fold > 1 and more rows than the group): there the counters' merge of
    // whole 16-row tiles costs more than the page work saved. H200, 32 / 8 heads, d128, 16-row
    // pages, us (dev/results/h200-2026-12-05-s38-decode-splits-fold-8149d27.json): b1 x 4k 4
    // tokens 21.0 (the heuristic's 16) against 16.6 at 8 in clusters, 2 tokens 17.1 / 16.2;
    // b4 x 4k 35.8 / 27.4 and 31.0 / 27.2 (the unfolded call's best, 20.1 and 19.7 at b1, kept
    // the heuristic's count).
    const bool tokens_folded = params.q_fold > 1 && params.seqlen_q > params.q_fold;
    const bool cap = chosen && (!params.kv.paged() || tokens_folded) && splits > kMaxSplitCluster &&
                     splits <= 2 * kMaxSplitCluster;
    const int capped = cap ? kMaxSplitCluster : splits;
    if (capped > 1 && capped <= kMaxSplitCluster && m_blocks == 1) {
      if (sms == 0) {
        if (Status s = multiprocessors(&sms); !s.ok()) return s;
      }
      if (static_cast<long long>(m_blocks) * params.heads * params.batch * capped <= 2LL * sms) {
        if (Status s = split_cluster_fits(reinterpret_cast<const void*>(kernel), Traits::kThreads, smem, capped, &cluster);
            !s.ok()) {
          return s;
        }
        if (cluster) splits = capped;
        cluster = cluster && !detail::switch_on(detail::Switch::kSplitCombineKernel) &&
                  !detail::switch_on(detail::Switch::kSplitCombineCounter);
      }
    }
  }
  params.num_splits = splits;
  if (grouped) {
    params.cta_group_planes = causal_group_planes(
        true, m_blocks, static_cast<long long>(params.heads) * params.batch * splits, sms * std::max(1, per_sm));
  }

  // A block mask: the plan of this traits' tiles (block_tiles.h), freed after the launch.
  void* plan = nullptr;
  if constexpr (Traits::kMods == ScoreMods::kBiasMask) {
    if (params.block_mask.defined() || params.has_block_lists()) {
      if (Status s = workspace_alloc(&plan, block_tiles_bytes(params, Traits::kBlockM, Traits::kBlockN), stream);
          !s.ok()) {
        return s;
      }
      if (Status s = build_block_tiles(&params, Traits::kBlockM, Traits::kBlockN, plan, stream); !s.ok()) {
        (void)workspace_free(plan, stream);
        return s;
      }
    }
  }

  float* workspace = nullptr;
  if (splits > 1 && !cluster) {
    const size_t rows = size_t(params.split_rows()) * params.heads * splits;
    if (Status s = workspace_alloc(reinterpret_cast<void**>(&workspace),
                                   rows * (Traits::kHeadDim + 1) * sizeof(float), stream);
        !s.ok()) {
      if (plan != nullptr) (void)workspace_free(plan, stream);
      return s;
    }
    params.split_out = workspace;
    params.split_lse = workspace + rows * Traits::kHeadDim;
    // The decode kernels merge their own partials: the last split CTA of each row group does
    // (fwd_kernel.h merge_if_last_split), so no combine kernel follows: at batch 1 x 4k keys its
    // wait for the whole split grid and its chain of L2 reads are, by the model in dev/NOTES.md
    // "Decode latency", 3-5 us of the 15.7 measured (not yet timed without them).
    // The kSplitCombineKernel switch (FLASHATTN_SPLIT_COMBINE=kernel) keeps the combine kernel
    // (tests compare the two bit for bit; core/switches.h).
    if constexpr (Traits::kSplitKeys) {
      if (!detail::switch_on(detail::Switch::kSplitCombineKernel)) {
        const size_t groups = size_t(m_blocks) * params.heads * params.batch;
        if (Status s = split_counters(groups, stream, &params.split_counters); !s.ok()) {
          if (plan != nullptr) (void)workspace_free(plan, stream);
          (void)workspace_free(workspace, stream);
          return s;
        }
      }
    }
  }
  const dim3 grid(m_blocks, params.heads, params.batch * splits);
  Status status;
  if (cluster) {
    const ClusterLaunchZ launch(grid, Traits::kThreads, smem, splits, stream);
    status = cuda_status(cudaLaunchKernelEx(&launch.config, kernel, params),
                         "launching the sm80 forward kernel as clusters");
    if (status.ok()) {
      detail::count_split_cluster_launch();
    } else {
      (void)cudaGetLastError();  // reported here, not again by a later launch's check
    }
  } else {
    kernel<<<grid, Traits::kThreads, smem, stream>>>(params);
    status = cuda_status(cudaGetLastError(), "launching the sm80 forward kernel");
  }
  if (plan != nullptr) {
    Status freed = workspace_free(plan, stream);
    if (status.ok()) status = freed;
  }
  if (splits > 1 && !cluster) {
    if (status.ok() && params.total_q > 0 && params.split_counters == nullptr) {
      status = launch_split_combine<typename Traits::Element, Traits::kHeadDim>(params, stream);
    }
    Status freed = workspace_free(workspace, stream);
    if (status.ok()) status = freed;
  }
  return status;
}

// Launches the decode shape (warps split the keys, fwd_decode_tile) when no sequence has more
// query rows than its 16-row tile or the rows are folded tokens (ForwardParams::q_fold: only
// the decode kernels place them; more than 16 rows take several tiles), else the row-split tile of
// fwd_tile.
template <typename Traits>
Status run_fwd(const ForwardParams& params, cudaStream_t stream) {
  using Decode = typename Traits::Decode;
  if (params.seqlen_q <= Decode::kBlockM || params.q_fold > 1) return launch_fwd<Decode>(params, stream);
  return launch_fwd<Traits>(params, stream);
}

// forward_kvcache: the same kernels reading K and V from the cache (FwdTraits::kCache).
template <typename Traits>
Status run_fwd_kvcache(const ForwardParams& params, cudaStream_t stream) {
  return run_fwd<typename Traits::Cache>(params, stream);
}

// forward_kvcache with an e4m3 cache read by 16-bit queries (FwdTraits::Fp8Cache).
template <typename Traits>
Status run_fwd_kvcache_fp8(const ForwardParams& params, cudaStream_t stream) {
  return run_fwd<typename Traits::Fp8Cache>(params, stream);
}

}  // namespace flashattn::cuda
