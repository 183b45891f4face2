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

// Restores the caller's current device when the scope ends; with a device, also makes that one
// current for the scope (status() says whether that worked).
class DeviceScope {
 public:
  DeviceScope() { have_ = cudaGetDevice(&saved_) == cudaSuccess; }
  explicit DeviceScope(int device) : DeviceScope() {
    if (!have_ || saved_ != device) status_ = cudaSetDevice(device);
  }
  ~DeviceScope() {
    if (have_) (void)cudaSetDevice(saved_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  cudaError_t status() const { return status_; }

 private:
  int saved_ = 0;
  bool have_ = false;
  cudaError_t status_ = cudaSuccess;
};

}  // namespace flashattn::cuda

// Returns a CudaError Status from the enclosing function when `expr` fails.
#define FLASHATTN_CUDA_TRY(expr)                                                   \
  do {                                                                             \
    if (::flashattn::Status _s = ::flashattn::cuda::cuda_status((expr), #expr);    \
        !_s.ok())                                                                  \
      return _s;                                                                   \
  } while (0)
