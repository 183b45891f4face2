// The dbias passes around the CUDA backward's main kernel (bwd_dbias.h).
#include "cuda/bwd_dbias.h"

#include "cuda/common/cuda_check.h"

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

__global__ void zero_kernel(const Broadcast4 d, int64_t cols) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= cols) return;
  const int planes = int(d.size[0] * d.size[1]), heads = int(d.size[1]);
  for (int bh = blockIdx.z; bh < planes; bh += gridDim.z) {
    float* col = static_cast<float*>(d.data) + (bh / heads) * d.batch + (bh % heads) * d.head + j;
    for (int64_t r = blockIdx.y; r < d.size[2]; r += gridDim.y) col[r * d.row] = 0.0f;
  }
}

// dbias[bb, hh, r, j] = the sum of its (b, h, i) terms of the workspace in that order, in double;
// neighbouring threads take neighbouring keys, so each read of the workspace is coalesced.
__global__ void reduce_kernel(const Broadcast4 d, const float* ws, int64_t batch, int64_t heads, int64_t rows,
                              int64_t cols) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= cols) return;
  const int planes = int(d.size[0] * d.size[1]), out_heads = int(d.size[1]);
  for (int bh = blockIdx.z; bh < planes; bh += gridDim.z) {
    const int64_t bb = bh / out_heads, hh = bh % out_heads;
    float* col = static_cast<float*>(d.data) + bb * d.batch + hh * d.head + j;
    const int64_t b_lo = d.size[0] == 1 ? 0 : bb, b_hi = d.size[0] == 1 ? batch : bb + 1;
    const int64_t h_lo = d.size[1] == 1 ? 0 : hh, h_hi = d.size[1] == 1 ? heads : hh + 1;
    for (int64_t r = blockIdx.y; r < d.size[2]; r += gridDim.y) {
      const int64_t i_lo = d.size[2] == 1 ? 0 : r, i_hi = d.size[2] == 1 ? rows : r + 1;
      double sum = 0.0;
      for (int64_t b = b_lo; b < b_hi; ++b) {
        for (int64_t h = h_lo; h < h_hi; ++h) {
          const float* src = ws + ((b * heads + h) * rows) * cols + j;
          for (int64_t i = i_lo; i < i_hi; ++i) sum += src[i * cols];
        }
      }
      col[r * d.row] = float(sum);
    }
  }
}

}  // namespace

Status zero_dbias(const Broadcast4& dbias, int64_t cols, cudaStream_t stream) {
  const int64_t rows = dbias.size[0] * dbias.size[1] * dbias.size[2];
  if (rows * cols == 0) return Status::Ok();
  // dbias as one contiguous block (as the Python layer allocates it): a memset.
  const int64_t* n = dbias.size;
  const bool dense = (n[2] == 1 || dbias.row == cols) && (n[1] == 1 || dbias.head == n[2] * cols) &&
                     (n[0] == 1 || dbias.batch == n[1] * n[2] * cols);
  if (dense) {
    return cuda_status(cudaMemsetAsync(dbias.data, 0, size_t(rows * cols) * sizeof(float), stream),
                       "zeroing dbias");
  }
  zero_kernel<<<grid_for(dbias, cols), kThreads, 0, stream>>>(dbias, cols);
  return cuda_status(cudaGetLastError(), "launching the dbias zero kernel");
}

Status reduce_dbias(const Broadcast4& dbias, const float* ws, int64_t batch, int64_t heads, int64_t rows,
                    int64_t cols, cudaStream_t stream) {
  const int64_t out_rows = dbias.size[0] * dbias.size[1] * dbias.size[2];
  if (out_rows * cols == 0) return Status::Ok();
  reduce_kernel<<<grid_for(dbias, cols), kThreads, 0, stream>>>(dbias, ws, batch, heads, rows, cols);
  return cuda_status(cudaGetLastError(), "launching the dbias reduction kernel");
}

}  // namespace flashattn::cuda
