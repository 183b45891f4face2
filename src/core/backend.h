// The interface between src/core (validation, dispatch) and the backends.
#pragma once

#include <cstddef>

#include "core/params.h"

namespace flashattn {

// CPU backend (src/cpu): always built.
Status cpu_forward(const ForwardParams& params);
Status cpu_backward(const BackwardParams& params);
// forward_kvcache: appends (with rotary) into the cache, then attends (params.kv.enabled).
Status cpu_forward_kvcache(const ForwardParams& params);

#if defined(FLASHATTN_WITH_CUDA)
// CUDA backend (src/cuda): built when nvcc is found at configure time.
Status cuda_forward(const ForwardParams& params);
Status cuda_backward(const BackwardParams& params);
Status cuda_forward_kvcache(const ForwardParams& params);
// Number of visible CUDA devices (0 on errors or with no driver).
int cuda_device_count();
// Synchronous copy of `bytes` from device memory to host memory on `stream`.
Status cuda_copy_to_host(void* dst, const void* src, size_t bytes, void* stream);
#endif

}  // namespace flashattn
