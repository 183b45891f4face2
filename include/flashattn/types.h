// Basic vocabulary of the public API: element types, devices, non-owning tensor views and the
// Status every entry point returns. No allocation, no exceptions, no printing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

namespace flashattn {

enum class DType : int32_t {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  // OCP float8 E4M3FN (torch.float8_e4m3fn): no infinities, NaN = S.1111.111, largest 448.
  // q/k/v of an FP8 forward, or the cache of an FP8 KV cache (docs/SEMANTICS.md, "FP8").
  kFloat8E4M3 = 3,
  kInt32 = 4,       // index tensors (cu_seqlens)
  kUInt8 = 5,       // boolean masks (bool or uint8 storage; nonzero = keep)
};

// Size of one element in bytes.
constexpr int dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32: return 4;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kFloat8E4M3: return 1;
    case DType::kInt32: return 4;
    case DType::kUInt8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t);

enum class DeviceType : int32_t { kCPU = 0, kCUDA = 1 };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int32_t index = 0;  // CUDA ordinal; ignored for the CPU

  friend bool operator==(const Device&, const Device&) = default;
};

// A non-owning, strided view of a tensor. Shapes and strides are in elements.
// A default-constructed view (ndim == 0) means "not given" for optional arguments.
struct TensorView {
  static constexpr int kMaxDims = 4;

  void* data = nullptr;
  DType dtype = DType::kFloat32;
  Device device{};
  int32_t ndim = 0;
  int64_t shape[kMaxDims] = {0, 0, 0, 0};
  int64_t strides[kMaxDims] = {0, 0, 0, 0};

  bool defined() const { return ndim > 0; }
  int64_t numel() const {
    if (ndim == 0) return 0;
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
};

// Builds a contiguous (row-major) view; strides are derived from the shape.
TensorView make_contiguous_view(void* data, DType dtype, Device device,
                                std::initializer_list<int64_t> shape);

enum class StatusCode : int32_t {
  kOk = 0,
  kInvalidArgument = 1,  // a shape, dtype, stride, pointer or option is wrong
  kNotSupported = 2,     // valid, but this backend/build/GPU cannot run it
  kCudaError = 3,        // a CUDA runtime call failed
  kInternal = 4,         // a bug in flashattn
};

const char* status_code_name(StatusCode c);

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status NotSupported(std::string m) { return {StatusCode::kNotSupported, std::move(m)}; }
  static Status CudaError(std::string m) { return {StatusCode::kCudaError, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace flashattn
