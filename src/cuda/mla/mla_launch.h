// Host-side launch of the MLA decode kernel (mla_kernel.h): the stage count the device's shared
// memory allows, the key splits, the split-KV workspace and the combine (mla_combine_kernel). Included only by the
// generated instantiations/mla_hdim576_*.cu, one per dtype.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "cuda/common/cuda_check.h"
#include "cuda/common/kernel_facts.h"
#include "cuda/common/split_heuristic.h"
#include "cuda/common/workspace.h"
#include "cuda/mla/mla.h"
#include "cuda/mla/mla_kernel.h"
#include "cuda/sm80/fwd.h"  // launch_combine_after_splits
#if defined(FLASHATTN_CUDA_SM90)
#include "cuda/sm90/tensor_map.h"
#endif

namespace flashattn::cuda::mla {

// Most splits per (sequence, KV head, row block). One CTA fills an SM here, so a single sequence
// (batch 1, one latent KV head, 16 heads: one CTA before splitting) needs ~132 splits to fill an
// H200; the sm80 decode stops at 64 (fwd_launch.h), where 2-3 CTAs share an SM.
constexpr int kMaxSplits = 128;

// Launches mla_combine_kernel over params' split partials: one CTA per (row, head, 128
// columns); on sm90 a programmatic dependent of the decode kernel, as launch_split_combine
// (sm80/fwd_launch.h) launches the forward's combine.
template <typename Element>
Status launch_combine(const ForwardParams& params, cudaStream_t stream) {
  return launch_combine_after_splits(
      mla_combine_kernel<Element>,
      dim3(unsigned(params.total_q), unsigned(params.heads), unsigned(kHeadDimV / kCombineCols)),
      dim3(32 * kCombineWarps), params, stream, "launching the MLA split combine kernel");
}

// kmap: Traits::kTma's map of the cache (make_cache_map); ignored otherwise.
template <typename Traits>
Status launch_decode(const ForwardParams& params_in, cudaStream_t stream, int sms, const CUtensorMap& kmap) {
  const auto kernel = mla_decode_kernel<Traits>;
  if (Status s = raise_dynamic_smem(kernel, Traits::kSmemBytes); !s.ok()) return s;
  ForwardParams params = params_in;
  MlaPlan plan;
  plan.group = params.heads / params.heads_k;
  plan.rows = plan.group * params.seqlen_q;
  const int m_blocks = (plan.rows + Traits::kBlockM - 1) / Traits::kBlockM;
  // Splits from shapes only (the capacity, never cache_seqlens: a captured graph stays valid).
  const int n_tiles = std::max(1, (params.kv.capacity + Traits::kBlockN - 1) / Traits::kBlockN);
  int splits = params.num_splits;
  if (splits == 0) {
    // One CTA per SM (__launch_bounds__(kThreads, 1), 111-183 KB of shared memory); the decode
    // cost model of split_heuristic.h, which fills the SMs in about one wave.
    splits = choose_num_splits(static_cast<long long>(params.batch) * params.heads_k * m_blocks, n_tiles, sms, 1,
                               kMaxSplits, SplitCost::kDecode);
  }
  splits = std::max(1, std::min({splits, n_tiles, 65535 / std::max(1, params.batch)}));
  plan.tiles_per_split = (n_tiles + splits - 1) / splits;
  splits = (n_tiles + plan.tiles_per_split - 1) / plan.tiles_per_split;  // no split without tiles
  params.num_splits = splits;

  float* workspace = nullptr;
  if (splits > 1) {
    const size_t rows = size_t(params.total_q) * params.heads * splits;
    if (Status s = workspace_alloc(reinterpret_cast<void**>(&workspace), rows * (kHeadDimV + 1) * sizeof(float), stream);
        !s.ok()) {
      return s;
    }
    params.split_out = workspace;
    params.split_lse = workspace + rows * kHeadDimV;
  }
  const dim3 grid(m_blocks, params.heads_k, params.batch * splits);
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(params, plan, kmap);
  Status status = cuda_status(cudaGetLastError(), "launching the MLA decode kernel");
  if (splits > 1) {
    if (status.ok()) status = launch_combine<typename Traits::Element>(params, stream);
    Status freed = workspace_free(workspace, stream);
    if (status.ok()) status = freed;
  }
  return status;
}

// The TMA kernels' map of a latent cache (MlaTraits::kTma): dense (576 columns, capacity rows,
// heads_k, batch_cache), or paged (576 columns, page_size rows, heads_k, num_blocks; the batch
// stride is then the page stride), boxes of 64 columns x kBlockN rows under the 128-byte swizzle.
// False where the copy engine cannot describe it (alignment, strides) or sm90 was not built: the
// cp.async kernels then run.
inline bool make_cache_map(const ForwardParams& p, int box_rows, CUtensorMap* map) {
#if defined(FLASHATTN_CUDA_SM90)
  const KVCacheParams& kv = p.kv;
  return sm90::make_operand_map(map, p.k, p.dtype, kHeadDim, kv.paged() ? kv.page_size : kv.capacity, p.heads_k,
                                kv.paged() ? kv.num_blocks : kv.batch_cache, p.k_strides, box_rows)
      .ok();
#else
  (void)p, (void)box_rows, (void)map;
  return false;
#endif
}

// Picks the instantiation: a separate v_cache copies V tiles too (one stage: K + V of 64 keys are
// 136 KB, 157 KB in all); the latent cache double-buffers its K tiles where the device's opt-in
// shared memory holds two (183 KB: sm90's 227 KB does, A100's 163 KB does not), else uses one
// stage (111 KB); with more than 16 rows per (sequence, KV head) it takes 32-row blocks where
// their 222 KB fit (sm90), halving the CTAs that read each K tile.
template <typename Element>
Status run_decode(const ForwardParams& params, cudaStream_t stream) {
  int device = 0, optin = 0, sms = 0;
  FLASHATTN_CUDA_TRY(cudaGetDevice(&device));
  FLASHATTN_CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const CUtensorMap no_map{};
  if (Status s = multiprocessors(&sms); !s.ok()) return s;
  using Separate = MlaTraits<Element, 1, true>;
  using Latent2 = MlaTraits<Element, 2, false>;
  using Latent2Rows32 = MlaTraits<Element, 2, false, 32>;
  using Latent1 = MlaTraits<Element, 1, false>;
  const bool separate = !v_aliases_k(params);
  const int need = separate ? Separate::kSmemBytes : Latent1::kSmemBytes;
  if (optin < need) {
    return Status::NotSupported("the CUDA MLA decode needs " + std::to_string(need) +
                                " bytes of shared memory per block (v_cache " +
                                (separate ? "separate from" : "a view of") + " k_cache); device " +
                                std::to_string(device) + " allows " + std::to_string(optin));
  }
  if (separate) return launch_decode<Separate>(params, stream, sms, no_map);
  const int rows = params.heads / params.heads_k * params.seqlen_q;
#if !defined(FLASHATTN_DEV_MLA_CP_ASYNC) && defined(FLASHATTN_CUDA_SM90)
  // sm90, a dense latent cache: the K tiles by TMA (MlaTraits::kTma). H200 bf16, kernel time
  // against the cp.async kernels, two alternations in one call (dev/results/
  // h200-2026-12-04-s27-mla-tma.txt): 16 heads b8 x 8k 25.9-26.1 -> 24.8-25.0 us, b64 x 32k
  // 599-600 -> 592 us, b1 x 4k 6.7 -> 6.5-6.6 us; 128 heads b8 x 8k 112-113 -> 81 us (the copy
  // issue no longer takes the products' issue slots). The dev/ macro FLASHATTN_DEV_MLA_CP_ASYNC
  // keeps the cp.async kernels for A/Bs.
  {
    using Tma2 = MlaTraits<Element, 2, false, 16, true>;
    using Tma2Rows32 = MlaTraits<Element, 2, false, 32, true>;
    int major = 0;
    FLASHATTN_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    CUtensorMap kmap;
    if (major == 9 && !params.kv.paged() && make_cache_map(params, Tma2::kBlockN, &kmap)) {
      if (rows > Tma2::kBlockM && optin >= Tma2Rows32::kSmemBytes) {
        return launch_decode<Tma2Rows32>(params, stream, sms, kmap);
      }
      if (optin >= Tma2::kSmemBytes) return launch_decode<Tma2>(params, stream, sms, kmap);
    }
    // A paged cache whose pages hold whole 64-row tiles (page_size % 64 == 0) and no leftpad, so
    // each tile's rows lie in one page; other paged caches keep the cp.async kernels (a 64-row box
    // would cross a page). H200 bf16, bench.py's pages of 64 (shuffled), kernel time per call
    // against the cp.async kernels, two alternations in one call (dev/results/
    // h200-2026-12-04-s28-mla-tma-paged-da1cae0.json): 16 heads b8 x 8k 32.0-32.2 -> 29.2-29.4 us (dense
    // 28.8-29.1), b64 x 32k 691-693 -> 606-608 us (dense 600-609), b1 x 4k 10.6-10.7 -> 10.2 us;
    // 128 heads b8 x 8k 133 -> 101-102 us (dense 96-97).
    using TmaPaged2 = MlaTraits<Element, 2, false, 16, true, true>;
    using TmaPaged2Rows32 = MlaTraits<Element, 2, false, 32, true, true>;
    if (major == 9 && params.kv.paged() && params.kv.page_size % TmaPaged2::kBlockN == 0 &&
        params.kv.leftpad == nullptr && make_cache_map(params, TmaPaged2::kBlockN, &kmap)) {
      if (rows > TmaPaged2::kBlockM && optin >= TmaPaged2Rows32::kSmemBytes) {
        return launch_decode<TmaPaged2Rows32>(params, stream, sms, kmap);
      }
      if (optin >= TmaPaged2::kSmemBytes) return launch_decode<TmaPaged2>(params, stream, sms, kmap);
    }
  }
#endif
  if (rows > Latent2::kBlockM && optin >= Latent2Rows32::kSmemBytes) {
    return launch_decode<Latent2Rows32>(params, stream, sms, no_map);
  }
  if (optin >= Latent2::kSmemBytes) return launch_decode<Latent2>(params, stream, sms, no_map);
  return launch_decode<Latent1>(params, stream, sms, no_map);
}

}  // namespace flashattn::cuda::mla
