// Turning CUDA runtime errors into Status, on the host side of the CUDA backend.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "flashattn/types.h"

namespace flashattn::cuda {

inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Status::CudaError(std::string(what) + ": " + cudaGetErrorName(err) + " (" +
                           cudaGetErrorString(err) + ")");
}

}  // namespace flashattn::cuda

// Returns a CudaError Status from the enclosing function when `expr` fails.
#define FLASHATTN_CUDA_TRY(expr)                                                   \
  do {                                                                             \
    if (::flashattn::Status _s = ::flashattn::cuda::cuda_status((expr), #expr);    \
        !_s.ok())                                                                  \
      return _s;                                                                   \
  } while (0)
