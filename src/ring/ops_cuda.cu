// RingOps on a CUDA device: stream-ordered workspace and small element-wise kernels.
//
// UNTESTED: compiled in CUDA builds, never run (no multi-GPU machine so far, and the ring on
// one GPU needs a transport for device memory, which only NCCL provides). The same operations
// run on the host in ops_cpu.cpp, which the tests cover. This work is O(rows * heads * dim)
// per ring step, against O(rows^2 * heads * dim) for the attention kernels it surrounds, so
// the kernels are plain: one thread per element (one per row for the merge).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/common/cuda_check.h"
#include "ring/merge.h"
#include "ring/ops.h"

namespace flashattn::ring {
namespace {

constexpr int kThreads = 256;

// A view as rank 4 (leading size-1 dimensions added), passed to kernels by value.
struct View4 {
  char* data;
  DType dtype;
  int64_t shape[4];
  int64_t strides[4];
};

View4 view4(const TensorView& t) {
  View4 v{static_cast<char*>(t.data), t.dtype, {1, 1, 1, 1}, {0, 0, 0, 0}};
  const int pad = 4 - t.ndim;
  for (int i = pad; i < 4; ++i) {
    v.shape[i] = t.shape[i - pad];
    v.strides[i] = t.strides[i - pad];
  }
  return v;
}

int64_t numel(const View4& v) { return v.shape[0] * v.shape[1] * v.shape[2] * v.shape[3]; }

// Element offset of logical (row-major) element e.
__device__ __forceinline__ int64_t offset_of(const View4& v, int64_t e) {
  int64_t off = 0;
#pragma unroll
  for (int i = 3; i >= 0; --i) {
    off += (e % v.shape[i]) * v.strides[i];
    e /= v.shape[i];
  }
  return off;
}

__device__ __forceinline__ float load(DType dt, const char* p, int64_t i) {
  switch (dt) {
    case DType::kFloat16:
      return __half2float(__ushort_as_half(reinterpret_cast<const unsigned short*>(p)[i]));
    case DType::kBFloat16:
      return __bfloat162float(__ushort_as_bfloat16(reinterpret_cast<const unsigned short*>(p)[i]));
    default:
      return reinterpret_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void store(DType dt, char* p, int64_t i, float x) {
  switch (dt) {
    case DType::kFloat16:
      reinterpret_cast<unsigned short*>(p)[i] = __half_as_ushort(__float2half_rn(x));
      break;
    case DType::kBFloat16:
      reinterpret_cast<unsigned short*>(p)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x));
      break;
    default:
      reinterpret_cast<float*>(p)[i] = x;
      break;
  }
}

__global__ void copy_kernel(View4 src, View4 dst, int64_t n) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n) return;
  store(dst.dtype, dst.data, offset_of(dst, e), load(src.dtype, src.data, offset_of(src, e)));
}

__global__ void fill_kernel(View4 dst, float value, int64_t n) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n) return;
  reinterpret_cast<float*>(dst.data)[offset_of(dst, e)] = value;
}

__global__ void accumulate_kernel(View4 acc, View4 src, int64_t n) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n) return;
  reinterpret_cast<float*>(acc.data)[offset_of(acc, e)] +=
      load(src.dtype, src.data, offset_of(src, e));
}

// One thread per (batch, row, head): o (batch, rows, heads, dv), lse (1, batch, heads, rows).
__global__ void merge_kernel(View4 o_acc, View4 lse_acc, View4 o_part, View4 lse_part,
                             int64_t n_rows) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= n_rows) return;
  const int64_t heads = o_acc.shape[2], rows = o_acc.shape[1];
  const int64_t h = r % heads, i = (r / heads) % rows, b = r / (heads * rows);
  float* oa = reinterpret_cast<float*>(o_acc.data) + b * o_acc.strides[0] + i * o_acc.strides[1] +
              h * o_acc.strides[2];
  const char* op =
      o_part.data + (b * o_part.strides[0] + i * o_part.strides[1] + h * o_part.strides[2]) *
                        (o_part.dtype == DType::kFloat32 ? 4 : 2);
  float* la = reinterpret_cast<float*>(lse_acc.data) + b * lse_acc.strides[1] +
              h * lse_acc.strides[2] + i * lse_acc.strides[3];
  const float lb = reinterpret_cast<const float*>(
      lse_part.data)[b * lse_part.strides[1] + h * lse_part.strides[2] + i * lse_part.strides[3]];
  const MergeWeights w = merge_weights(*la, lb);
  for (int64_t c = 0; c < o_acc.shape[3]; ++c)
    oa[c] = merge_value(w, oa[c], load(o_part.dtype, op, c));
  *la = w.lse;
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

class CudaOps final : public RingOps {
 public:
  CudaOps(int device, void* stream) : device_(device), stream_(static_cast<cudaStream_t>(stream)) {}

  Status alloc(size_t bytes, void** ptr) override {
    cuda::DeviceScope scope(device_);
    const cudaError_t e = cudaMallocAsync(ptr, bytes > 0 ? bytes : 1, stream_);
    return check(e, "allocating the ring workspace (" + std::to_string(bytes) + " bytes)");
  }

  void free(void* ptr) override {
    if (ptr == nullptr) return;
    cuda::DeviceScope scope(device_);
    (void)cudaFreeAsync(ptr, stream_);
  }

  Status copy(const TensorView& src, const TensorView& dst) override {
    const View4 s = view4(src), d = view4(dst);
    const int64_t n = numel(s);
    if (n == 0) return Status::Ok();
    cuda::DeviceScope scope(device_);
    copy_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(s, d, n);
    return check(cudaGetLastError(), "launching the ring copy kernel");
  }

  Status fill(const TensorView& dst, float value) override {
    const View4 d = view4(dst);
    const int64_t n = numel(d);
    if (n == 0) return Status::Ok();
    cuda::DeviceScope scope(device_);
    fill_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(d, value, n);
    return check(cudaGetLastError(), "launching the ring fill kernel");
  }

  Status accumulate(const TensorView& acc, const TensorView& src) override {
    const View4 a = view4(acc), s = view4(src);
    const int64_t n = numel(a);
    if (n == 0) return Status::Ok();
    cuda::DeviceScope scope(device_);
    accumulate_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(a, s, n);
    return check(cudaGetLastError(), "launching the ring accumulate kernel");
  }

  Status merge(const TensorView& o_acc, const TensorView& lse_acc, const TensorView& o_part,
               const TensorView& lse_part) override {
    const View4 oa = view4(o_acc), op = view4(o_part);
    const int64_t rows = oa.shape[0] * oa.shape[1] * oa.shape[2];
    if (rows == 0) return Status::Ok();
    cuda::DeviceScope scope(device_);
    merge_kernel<<<blocks_for(rows), kThreads, 0, stream_>>>(oa, view4(lse_acc), op,
                                                             view4(lse_part), rows);
    return check(cudaGetLastError(), "launching the ring merge kernel");
  }

 private:
  static Status check(cudaError_t e, const std::string& what) {
    if (e == cudaSuccess) return Status::Ok();
    return Status::CudaError("ring: " + what + ": " + cudaGetErrorString(e));
  }

  int device_;
  cudaStream_t stream_;
};

}  // namespace

std::unique_ptr<RingOps> make_cuda_ops(int device, void* stream) {
  return std::make_unique<CudaOps>(device, stream);
}

}  // namespace flashattn::ring
