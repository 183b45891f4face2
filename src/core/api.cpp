// Public entry points: validate once, then dispatch on the tensors' device.
#include "core/backend.h"
#include "core/params.h"
#include "flashattn/flashattn.h"

namespace flashattn {

#if !defined(FLASHATTN_WITH_CUDA)
namespace {
Status no_cuda_backend() {
  return Status::NotSupported(
      "tensors are on a CUDA device, but this flashattn build has no CUDA backend "
      "(configure with nvcc on PATH)");
}
}  // namespace
#endif

Status forward(const ForwardArgs& args) {
  ForwardParams params;
  if (Status s = make_forward_params(args, &params); !s.ok()) return s;
  // A block table makes the call a read of paged K/V: the KV-cache path (without an append).
  const bool paged = params.kv.enabled;
  if (params.device.type == DeviceType::kCPU) return paged ? cpu_forward_kvcache(params) : cpu_forward(params);
#if defined(FLASHATTN_WITH_CUDA)
  return paged ? cuda_forward_kvcache(params) : cuda_forward(params);
#else
  return no_cuda_backend();
#endif
}

Status backward(const BackwardArgs& args) {
  BackwardParams params;
  if (Status s = make_backward_params(args, &params); !s.ok()) return s;
  if (params.device.type == DeviceType::kCPU) return cpu_backward(params);
#if defined(FLASHATTN_WITH_CUDA)
  return cuda_backward(params);
#else
  return no_cuda_backend();
#endif
}

Status forward_kvcache(const KVCacheArgs& args) {
  ForwardParams params;
  if (Status s = make_kvcache_params(args, &params); !s.ok()) return s;
  if (params.device.type == DeviceType::kCPU) return cpu_forward_kvcache(params);
#if defined(FLASHATTN_WITH_CUDA)
  return cuda_forward_kvcache(params);
#else
  return no_cuda_backend();
#endif
}

bool cuda_available() {
#if defined(FLASHATTN_WITH_CUDA)
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

const char* version() { return FLASHATTN_VERSION_STRING; }

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat8E4M3: return "float8_e4m3";
    case DType::kInt32: return "int32";
    case DType::kUInt8: return "uint8";
  }
  return "unknown";
}

const char* status_code_name(StatusCode c) {
  switch (c) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotSupported: return "not supported";
    case StatusCode::kCudaError: return "CUDA error";
    case StatusCode::kInternal: return "internal error";
  }
  return "unknown";
}

TensorView make_contiguous_view(void* data, DType dtype, Device device,
                                std::initializer_list<int64_t> shape) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.ndim = static_cast<int32_t>(shape.size() > TensorView::kMaxDims ? TensorView::kMaxDims
                                                                      : shape.size());
  int i = 0;
  for (int64_t s : shape) {
    if (i == t.ndim) break;
    t.shape[i++] = s;
  }
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.strides[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

}  // namespace flashattn
