// FLASHATTN_HOST_DEVICE marks small inline functions shared by host code and CUDA kernels.
#pragma once

#if defined(__CUDACC__)
#define FLASHATTN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FLASHATTN_HOST_DEVICE inline
#endif
