// MLA decode on the CUDA backend: forward_kvcache at head_dim 576 / head_dim_v 512 (DeepSeek-V3's
// latent cache), its own kernel (mla_kernel.h). What it takes, what it declines, and the entry
// points shared by the backend (cuda_backend.cu), the dispatch (mla_dispatch.cu) and the
// generated instantiations (instantiations/mla_hdim576_*.cu).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/params.h"

namespace flashattn::cuda {

// Whether the build instantiated the MLA kernels: "576" in FLASHATTN_CUDA_HEAD_DIMS (CMake then
// defines FLASHATTN_CUDA_HDIM_576 and compiles instantiations/mla_hdim576_*.cu).
constexpr bool mla_built() {
#ifdef FLASHATTN_CUDA_HDIM_576
  return true;
#else
  return false;
#endif
}

namespace mla {

// The (head_dim, head_dim_v) pair this path serves.
inline bool is_mla_shape(const QKVParams& p) { return p.head_dim == 576 && p.head_dim_v == 512; }

// Whether v_cache is a view of k_cache's first 512 columns (the shared latent cache:
// v_cache = k_cache[..., :512]): the same data pointer and the same page (batch), row and head
// strides. Only these four numbers are compared; a v_cache that is a copy of the same values is
// "separate" (read on its own, still correct). The kernel then reads each cache row once and
// takes V from the K tile in shared memory.
inline bool v_aliases_k(const ForwardParams& p) {
  return p.v == p.k && p.v_strides.batch == p.k_strides.batch && p.v_strides.row == p.k_strides.row &&
         p.v_strides.head == p.k_strides.head;
}

// The first option of p that the MLA kernel does not implement, named as the caller spells it,
// or "" when it takes p. Checked on the host before anything runs.
std::string declines(const ForwardParams& p);

// Runs the attention of a forward_kvcache call (after the append) on the MLA kernel.
Status dispatch_decode(const ForwardParams& p, cudaStream_t stream);

// Defined in mla_launch.h, instantiated per dtype in instantiations/mla_hdim576_*.cu.
template <typename Element>
Status run_decode(const ForwardParams& p, cudaStream_t stream);

}  // namespace mla
}  // namespace flashattn::cuda
