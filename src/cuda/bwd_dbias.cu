// The dbias passes around the CUDA backward's main kernel (bwd_dbias.h).
#include "cuda/bwd_dbias.h"

#include "cuda/common/cuda_check.h"

namespace flashattn::cuda {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

// Element e of dbias in (bb, hh, r, j) order: its offset through dbias's strides.
__device__ int64_t dbias_offset(const Broadcast4& d, int64_t cols, int64_t e, int64_t* bb, int64_t* hh, int64_t* r,
                                int64_t* j) {
  *j = e % cols;
  *r = e / cols % d.size[2];
  *hh = e / (cols * d.size[2]) % d.size[1];
  *bb = e / (cols * d.size[2] * d.size[1]);
  return *bb * d.batch + *hh * d.head + *r * d.row + *j;
}

__global__ void zero_kernel(const Broadcast4 d, int64_t cols) {
  const int64_t n = d.size[0] * d.size[1] * d.size[2] * cols;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    int64_t bb, hh, r, j;
    static_cast<float*>(d.data)[dbias_offset(d, cols, e, &bb, &hh, &r, &j)] = 0.0f;
  }
}

// One thread per dbias element; neighbouring threads take neighbouring keys, so each read of
// the workspace is coalesced.
__global__ void reduce_kernel(const Broadcast4 d, const float* ws, int64_t batch, int64_t heads, int64_t rows,
                              int64_t cols) {
  const int64_t n = d.size[0] * d.size[1] * d.size[2] * cols;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    int64_t bb, hh, r, j;
    const int64_t out = dbias_offset(d, cols, e, &bb, &hh, &r, &j);
    const int64_t b_lo = d.size[0] == 1 ? 0 : bb, b_hi = d.size[0] == 1 ? batch : bb + 1;
    const int64_t h_lo = d.size[1] == 1 ? 0 : hh, h_hi = d.size[1] == 1 ? heads : hh + 1;
    const int64_t i_lo = d.size[2] == 1 ? 0 : r, i_hi = d.size[2] == 1 ? rows : r + 1;
    double sum = 0.0;
    for (int64_t b = b_lo; b < b_hi; ++b) {
      for (int64_t h = h_lo; h < h_hi; ++h) {
        const float* src = ws + ((b * heads + h) * rows) * cols + j;
        for (int64_t i = i_lo; i < i_hi; ++i) sum += src[i * cols];
      }
    }
    static_cast<float*>(d.data)[out] = float(sum);
  }
}

}  // namespace

Status zero_dbias(const Broadcast4& dbias, int64_t cols, cudaStream_t stream) {
  const int64_t n = dbias.size[0] * dbias.size[1] * dbias.size[2] * cols;
  if (n == 0) return Status::Ok();
  zero_kernel<<<grid_for(n), kThreads, 0, stream>>>(dbias, cols);
  return cuda_status(cudaGetLastError(), "launching the dbias zero kernel");
}

Status reduce_dbias(const Broadcast4& dbias, const float* ws, int64_t batch, int64_t heads, int64_t rows,
                    int64_t cols, cudaStream_t stream) {
  const int64_t n = dbias.size[0] * dbias.size[1] * dbias.size[2] * cols;
  if (n == 0) return Status::Ok();
  reduce_kernel<<<grid_for(n), kThreads, 0, stream>>>(dbias, ws, batch, heads, rows, cols);
  return cuda_status(cudaGetLastError(), "launching the dbias reduction kernel");
}

}  // namespace flashattn::cuda
