// CUDA backend entry points: device selection, the checks only the GPU path needs (dtype,
// head dim, alignment, architecture), then the kernel dispatch.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/backend.h"
#include "cuda/common/build_config.h"
#include "cuda/common/cuda_check.h"
#include "cuda/sm80/bwd.h"
#include "cuda/sm80/fwd.h"

namespace flashattn {
namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

Status check_operand(const char* name, const void* ptr, const Strides3& s) {
  if (!aligned16(ptr)) {
    return Status::NotSupported(std::string(name) +
                                ": the CUDA backend needs 16-byte aligned data pointers");
  }
  if (s.batch % 8 != 0 || s.row % 8 != 0 || s.head % 8 != 0) {
    return Status::NotSupported(std::string(name) + ": the CUDA backend needs strides that are multiples of 8 elements, got (" +
                                std::to_string(s.batch) + ", " + std::to_string(s.row) + ", " +
                                std::to_string(s.head) + ")");
  }
  return Status::Ok();
}

// Checks common to forward and backward; selects the device.
Status prepare(const QKVParams& p) {
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) {
    return Status::NotSupported(std::string("q has dtype ") + dtype_name(p.dtype) +
                                "; the CUDA backend supports float16 and bfloat16 "
                                "(float32 runs on the cpu backend)");
  }
  if (!cuda::dtype_built(p.dtype)) {
    return Status::NotSupported(std::string("dtype ") + dtype_name(p.dtype) +
                                " was not built into this flashattn (FLASHATTN_CUDA_DTYPES)");
  }
  bool known = false;
  for (int d : cuda::kAllHeadDims) known |= d == p.head_dim;
  if (!known) {
    return Status::NotSupported("head_dim " + std::to_string(p.head_dim) +
                                " is not supported by the CUDA backend; supported: 32, 64, 96, "
                                "128, 192, 256");
  }
  if (p.head_dim_v != p.head_dim) {
    return Status::NotSupported("head_dim_v (" + std::to_string(p.head_dim_v) +
                                ") must equal head_dim (" + std::to_string(p.head_dim) +
                                ") on the CUDA backend");
  }
  if (!cuda::head_dim_built(p.head_dim)) {
    return Status::NotSupported("head_dim " + std::to_string(p.head_dim) +
                                " was not built into this flashattn (FLASHATTN_CUDA_HEAD_DIMS)");
  }
  if (p.batch > 65535 || p.heads > 65535) {
    return Status::NotSupported("the CUDA backend supports batch and heads up to 65535, got batch " +
                                std::to_string(p.batch) + " and heads " + std::to_string(p.heads));
  }
  if (Status s = check_operand("q", p.q, p.q_strides); !s.ok()) return s;
  if (Status s = check_operand("k", p.k, p.k_strides); !s.ok()) return s;
  if (Status s = check_operand("v", p.v, p.v_strides); !s.ok()) return s;

  FLASHATTN_CUDA_TRY(cudaSetDevice(p.device.index));
  int major = 0;
  FLASHATTN_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, p.device.index));
  if (major < 8) {
    return Status::NotSupported("the CUDA backend needs compute capability 8.0 or newer; device " +
                                std::to_string(p.device.index) + " is " + std::to_string(major) + ".x");
  }
  return Status::Ok();
}

}  // namespace

Status cuda_forward(const ForwardParams& p) {
  cuda::DeviceScope restore_device;  // prepare() selects the tensors' device
  if (Status s = prepare(p); !s.ok()) return s;
  if (Status s = check_operand("out", p.out, p.out_strides); !s.ok()) return s;
  if (p.batch == 0 || p.seqlen_q == 0) return Status::Ok();
  return cuda::dispatch_fwd(p, static_cast<cudaStream_t>(p.stream));
}

Status cuda_backward(const BackwardParams& p) {
  cuda::DeviceScope restore_device;  // prepare() selects the tensors' device
  if (Status s = prepare(p); !s.ok()) return s;
  const struct {
    const char* name;
    const void* ptr;
    const Strides3& strides;
  } outs[] = {{"out", p.out, p.out_strides}, {"dout", p.dout, p.dout_strides}, {"dq", p.dq, p.dq_strides},
              {"dk", p.dk, p.dk_strides},   {"dv", p.dv, p.dv_strides}};
  for (const auto& o : outs) {
    if (Status s = check_operand(o.name, o.ptr, o.strides); !s.ok()) return s;
  }
  if (p.batch == 0) {
    // No rows: the sink's gradient is 0 (the kernels, which would write it, do not run).
    if (p.dsink != nullptr) {
      FLASHATTN_CUDA_TRY(cudaMemsetAsync(p.dsink, 0, sizeof(float) * size_t(p.heads), static_cast<cudaStream_t>(p.stream)));
    }
    return Status::Ok();
  }
  return cuda::dispatch_bwd(p, static_cast<cudaStream_t>(p.stream));
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

Status cuda_copy_to_host(void* dst, const void* src, size_t bytes, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  FLASHATTN_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
  FLASHATTN_CUDA_TRY(cudaStreamSynchronize(s));
  return Status::Ok();
}

}  // namespace flashattn
