// The dbias passes around the CUDA backward's main kernel (bwd_dbias.h).
#include "cuda/bwd_dbias.h"

#include "cuda/common/cuda_check.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

namespace flashattn::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = 65535;    // blocks per grid dimension y and z (each walks grid-stride)
constexpr int64_t kTargetBlocks = 4096;  // about 31 blocks per SM of an H200: rows per block follow

// Blocks over dbias's (columns in chunks of kThreads, row slices, planes (bb, hh)): each thread
// takes one column and walks rows and planes grid-stride, so no element pays a 64-bit division
// (the per-element form derived (bb, hh, r, j) with four), and each block walks many rows: a
// block per (column chunk, row) made 2M blocks of one store each for 8 x 16 x 2k x 2k floats,
// and the launches, not the stores, set the time (1.86 ms, 1.15 TB/s, H200, 2026-12-03 s20;
// dev/NOTES.md "Bias on the Hopper backward").
dim3 grid_for(const Broadcast4& d, int64_t cols) {
  const auto clamp = [](int64_t n) { return n < kMaxGrid ? (n > 0 ? n : 1) : kMaxGrid; };
  const int64_t x = (cols + kThreads - 1) / kThreads, z = clamp(d.size[0] * d.size[1]);
  const int64_t y = std::min(clamp(d.size[2]), clamp((kTargetBlocks + x * z - 1) / (x * z)));
  return dim3(unsigned(x), unsigned(y), unsigned(z));
}

// dbias's element (bb, hh, r, j) as its dtype T (float, __nv_bfloat16 or __half).
template <typename T>
__device__ __forceinline__ T* element(const Broadcast4& d, int64_t bb, int64_t hh, int64_t r, int64_t j) {
  return static_cast<T*>(d.data) + bb * d.batch + hh * d.head + r * d.row + j;
}

template <typename T>
__global__ void zero_kernel(const Broadcast4 d, int64_t cols) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= cols) return;
  const int planes = int(d.size[0] * d.size[1]), heads = int(d.size[1]);
  for (int bh = blockIdx.z; bh < planes; bh += gridDim.z) {
    T* col = element<T>(d, bh / heads, bh % heads, 0, j);
    for (int64_t r = blockIdx.y; r < d.size[2]; r += gridDim.y) col[r * d.row] = T(0.0f);
  }
}

// dbias[bb, hh, r, j] = the sum of its (b, h, i) terms of the workspace in that order, in double;
// neighbouring threads take neighbouring keys, so each read of the workspace is coalesced. The
// terms of an element are an outer walk (the batch, the heads, or both as consecutive planes)
// and an inner one (the rows), each at one stride, walked by two counters. Each thread loads
// kTermsAhead terms before adding any of them (in order): with the loads inside the walks, each
// waited for the previous addition, and the (1, H, N, N) reduction over a batch of 8 ran at
// 1.8 TB/s (1.33 ms for 2.1 GB of partials at 8 x 16 x 2k, H200 s20).
constexpr int kTermsAhead = 8;

template <typename T>
__global__ void reduce_kernel(const Broadcast4 d, const float* ws, int64_t batch, int64_t heads, int64_t rows,
                              int64_t cols) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= cols) return;
  const int planes = int(d.size[0] * d.size[1]), out_heads = int(d.size[1]);
  const bool sum_b = d.size[0] == 1, sum_h = d.size[1] == 1, sum_i = d.size[2] == 1;
  const int64_t plane = rows * cols;
  // (outer count, stride), (inner count, stride) over the summed dimensions, in (b, h, i) order.
  int64_t n_out = 1, s_out = 0, n_in = 1, s_in = 0;
  if (sum_b && sum_h) {
    n_out = batch * heads, s_out = plane;  // (b, h) consecutive planes
  } else if (sum_b) {
    n_out = batch, s_out = heads * plane;
  } else if (sum_h) {
    n_out = heads, s_out = plane;
  }
  if (sum_i) n_in = rows, s_in = cols;
  const int64_t terms = n_out * n_in;
  for (int bh = blockIdx.z; bh < planes; bh += gridDim.z) {
    const int64_t bb = bh / out_heads, hh = bh % out_heads;
    T* col = element<T>(d, bb, hh, 0, j);
    const float* base = ws + ((sum_b ? 0 : bb) * heads + (sum_h ? 0 : hh)) * plane + j;
    for (int64_t r = blockIdx.y; r < d.size[2]; r += gridDim.y) {
      const float* src = base + (sum_i ? 0 : r) * cols;
      // From -0, the additive identity (0 + -0 is +0): a single term keeps its sign, so a 16-bit
      // dbias through the partials has the bits of the float32 one stored directly, -0 included.
      double sum = -0.0;
      int64_t o = 0, in = 0;  // term t0 + k's outer and inner index (no division)
      for (int64_t t0 = 0; t0 < terms; t0 += kTermsAhead) {
        float v[kTermsAhead];
#pragma unroll
        for (int k = 0; k < kTermsAhead; ++k) {
          v[k] = 0.0f;
          if (t0 + k < terms) {
            v[k] = __ldg(src + o * s_out + in * s_in);
            if (++in == n_in) in = 0, ++o;
          }
        }
#pragma unroll
        for (int k = 0; k < kTermsAhead; ++k) {
          if (t0 + k < terms) sum += v[k];
        }
      }
      col[r * d.row] = T(float(sum));
    }
  }
}

}  // namespace

// Calls f(T{}) with T dbias's element type (float, __nv_bfloat16 or __half).
template <typename F>
void with_dbias_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kBFloat16: f(__nv_bfloat16{}); break;
    case DType::kFloat16: f(__half{}); break;
    default: f(float{}); break;
  }
}

Status zero_dbias(const Broadcast4& dbias, int64_t cols, cudaStream_t stream) {
  const int64_t rows = dbias.size[0] * dbias.size[1] * dbias.size[2];
  if (rows * cols == 0) return Status::Ok();
  // dbias as one contiguous block (as the Python layer allocates it): a memset.
  const int64_t* n = dbias.size;
  const bool dense = (n[2] == 1 || dbias.row == cols) && (n[1] == 1 || dbias.head == n[2] * cols) &&
                     (n[0] == 1 || dbias.batch == n[1] * n[2] * cols);
  if (dense) {
    return cuda_status(cudaMemsetAsync(dbias.data, 0, size_t(rows * cols) * size_t(dtype_size(dbias.dtype)), stream),
                       "zeroing dbias");
  }
  with_dbias_type(dbias.dtype, [&](auto t) {
    zero_kernel<decltype(t)><<<grid_for(dbias, cols), kThreads, 0, stream>>>(dbias, cols);
  });
  return cuda_status(cudaGetLastError(), "launching the dbias zero kernel");
}

Status reduce_dbias(const Broadcast4& dbias, const float* ws, int64_t batch, int64_t heads, int64_t rows,
                    int64_t cols, cudaStream_t stream) {
  const int64_t out_rows = dbias.size[0] * dbias.size[1] * dbias.size[2];
  if (out_rows * cols == 0) return Status::Ok();
  with_dbias_type(dbias.dtype, [&](auto t) {
    reduce_kernel<decltype(t)><<<grid_for(dbias, cols), kThreads, 0, stream>>>(dbias, ws, batch, heads, rows, cols);
  });
  return cuda_status(cudaGetLastError(), "launching the dbias reduction kernel");
}

}  // namespace flashattn::cuda
