// Host side shared by the Hopper forward launchers (fwd_launch.h, fwd8_launch.h): the operand
// maps, the persistent grid and its tile order, and the launch with the dynamic feed's counter.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "cuda/common/cta_order.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/kernel_facts.h"
#include "cuda/common/workspace.h"
#include "cuda/sm90/fwd_traits.h"
#include "cuda/sm90/tensor_map.h"

namespace flashattn::cuda::sm90 {

// The kernel parameters of one launch: the problem (one split), its q, k, v maps (q and k
// head_dim wide, v head_dim_v; boxes of block_m / block_n rows and `cols` columns under a
// `swizzle`-byte swizzle; q in params.dtype, k and v in kv_dtype) and the tile order of
// block_m-row query tiles. NotSupported names the operand the copy engine cannot describe.
// kv_maps false (the cache kernel, FwdTraits kCache): k and v are a KV cache its producer threads
// copy themselves, and only q gets a map.
inline Status make_fwd_params(const ForwardParams& params, DType kv_dtype, int head_dim, int head_dim_v, int block_m,
                              int block_n, int cols, int swizzle, const char* what, FwdParams* kp,
                              bool kv_maps = true) {
  kp->p = params;
  kp->p.num_splits = 1;
  kp->tile_counter = nullptr;
  if (!kv_maps) kp->k = kp->v = CUtensorMap{};  // never read; not left undefined
  const bool varlen = params.is_varlen();
  const int map_batch = varlen ? 1 : params.batch;
  const int64_t rows_q = varlen ? params.total_q : params.seqlen_q;
  const int64_t rows_k = varlen ? params.total_k : params.seqlen_k;
  const struct {
    CUtensorMap* map;
    const char* name;
    const void* ptr;
    DType dtype;
    int dim;
    int64_t rows;
    int heads;
    const Strides3& strides;
    int box_rows;
  } operands[] = {{&kp->q, "q: ", params.q, params.dtype, head_dim, rows_q, params.heads, params.q_strides, block_m},
                  {&kp->k, "k: ", params.k, kv_dtype, head_dim, rows_k, params.heads_k, params.k_strides, block_n},
                  {&kp->v, "v: ", params.v, kv_dtype, head_dim_v, rows_k, params.heads_k, params.v_strides, block_n}};
  for (const auto& o : operands) {
    if (!kv_maps && o.map != &kp->q) continue;
    if (Status s = make_operand_map(o.map, o.ptr, o.dtype, o.dim, o.rows, o.heads, map_batch, o.strides, o.box_rows,
                                    cols, swizzle);
        !s.ok()) {
      return Status::NotSupported(o.name + s.message());
    }
  }
  int sms = 0;
  if (Status s = multiprocessors(&sms); !s.ok()) return s;
  const int m_blocks = (params.seqlen_q + block_m - 1) / block_m;
  const long long planes = static_cast<long long>(params.heads) * params.batch;
  if (planes * m_blocks >= (1LL << 31)) return Status::NotSupported(std::string("more than 2^31 query tiles for ") + what);
  kp->order = TileOrder(int(planes * m_blocks), m_blocks, int(planes),
                        causal_group_planes(params.is_causal, m_blocks, planes, sms), params.heads);
  return Status::Ok();
}

// Persistent CTAs, ctas_per_sm per SM (one for most tiles: their shared memory allows no
// second; fwd_tile.h): each loads its next tile while finishing one (1k-2k without a mask: +5-11% against one CTA per tile). With a tile
// counter (the dynamic feed: causal, window and block-sparse launches) CTAs take tiles from it,
// zeroed here in stream order in workspace after `plan_bytes` (a multiple of 16) for the caller's
// plan, which build_plan(workspace) writes first on the stream; one CTA per tile, the previous
// choice under a mask, was 0-18% slower (shortest rows the most). A plan without a counter (the
// cache kernel's tile list of a varlen call) gets its workspace the same way. Workspace is freed
// in stream order after the launch.
template <typename Kernel, typename BuildPlan>
Status launch_fwd(Kernel kernel, FwdParams& kp, int threads, int ctas_per_sm, size_t smem, bool counter, size_t plan_bytes,
                  BuildPlan build_plan, const char* what, cudaStream_t stream) {
  if (Status s = raise_dynamic_smem(kernel, smem); !s.ok()) return s;
  int sms = 0;
  if (Status s = multiprocessors(&sms); !s.ok()) return s;
  const int ctas = std::min(kp.order.tiles, sms * ctas_per_sm);
  const std::string launching = std::string("launching ") + what;
  if (!counter && plan_bytes == 0) {
    kernel<<<ctas, threads, smem, stream>>>(kp);
    return cuda_status(cudaGetLastError(), launching.c_str());
  }
  void* ws = nullptr;
  if (Status st = workspace_alloc(&ws, plan_bytes + (counter ? sizeof(int) : 0), stream); !st.ok()) return st;
  Status launched = build_plan(ws);
  if (counter) {
    kp.tile_counter = reinterpret_cast<int*>(static_cast<char*>(ws) + plan_bytes);
    if (launched.ok()) {
      launched = cuda_status(cudaMemsetAsync(kp.tile_counter, 0, sizeof(int), stream), "zeroing the tile counter");
    }
  }
  if (launched.ok()) {
    kernel<<<ctas, threads, smem, stream>>>(kp);
    launched = cuda_status(cudaGetLastError(), launching.c_str());
  }
  Status freed = workspace_free(ws, stream);
  return launched.ok() ? freed : launched;
}

}  // namespace flashattn::cuda::sm90
