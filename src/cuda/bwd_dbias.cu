// The dbias passes around the CUDA backward's main kernel (bwd_dbias.h).
#include "cuda/bwd_dbias.h"

#include "cuda/common/cuda_check.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

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
// rows_per_turn: the rows a block takes per turn of its row walk.
dim3 grid_for(const Broadcast4& d, int64_t cols, int64_t rows_per_turn = 1) {
  const auto clamp = [](int64_t n) { return n < kMaxGrid ? (n > 0 ? n : 1) : kMaxGrid; };
  const int64_t x = (cols + kThreads - 1) / kThreads, z = clamp(d.size[0] * d.size[1]);
  const int64_t y = std::min(clamp((d.size[2] + rows_per_turn - 1) / rows_per_turn),
                             clamp((kTargetBlocks + x * z - 1) / (x * z)));
  return dim3(unsigned(x), unsigned(y), unsigned(z));
}

// dbias's element (bb, hh, r, j) as its dtype T (float, __nv_bfloat16 or __half).
template <typename T>
__device__ __forceinline__ T* element(const Broadcast4& d, int64_t bb, int64_t hh, int64_t r, int64_t j) {
  return static_cast<T*>(d.data) + bb * d.batch + hh * d.head + r * d.row + j;
}

// Zeroes the elements (r, j > r + offset) of dbias: those a mask hiding every key past row r's
// diagonal plus `offset` hides, or (offset = -rows) all of them. A thread takes kVec consecutive
// keys j0.. (16 bytes where dbias's strides allow) and walks the rows where any of them is
// hidden: one 16-byte store per row while all of them are, then the element stores of the rows
// the diagonal crosses. H200 s21,
// bf16: 2 x 16 x 8k x 8k 626 us (one key per thread: 736) for half of its 4.3 GB, where a memset
// of all of it at s20's 4.3 TB/s would take about 1000; 8 x 16 x 2k x 2k 211 us either way (a
// block's threads wait for its longest column there).
template <typename T, int kVec>
__global__ void zero_hidden_kernel(const Broadcast4 d, int64_t cols, int64_t offset) {
  const int64_t j0 = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * kVec;
  if (j0 >= cols) return;
  const int planes = int(d.size[0] * d.size[1]), heads = int(d.size[1]);
  const bool whole = j0 + kVec <= cols;
  const int64_t j_last = whole ? j0 + kVec - 1 : cols - 1;
  const int64_t rows_all = min(d.size[2], max(j0 - offset, int64_t(0)));  // every key hidden
  const int64_t rows_any = min(d.size[2], max(j_last - offset, int64_t(0)));  // the last one hidden
  for (int bh = blockIdx.z; bh < planes; bh += gridDim.z) {
    T* col = element<T>(d, bh / heads, bh % heads, 0, j0);
    for (int64_t r = blockIdx.y; r < rows_any; r += gridDim.y) {
      T* p = col + r * d.row;
      if (kVec > 1 && whole && r < rows_all) {
        *reinterpret_cast<uint4*>(p) = make_uint4(0, 0, 0, 0);
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          if (j0 + e <= j_last && j0 + e > r + offset) p[e] = T(0.0f);
        }
      }
    }
  }
}

// The terms of one dbias element in the workspace, in (b, h, i) order: an outer walk (the
// batch, the heads, or both as consecutive planes) and an inner one (the rows), each at one
// stride (floats), and where element (bb, hh, ., j)'s first term starts.
struct TermWalk {
  int64_t n_out = 1, s_out = 0, n_in = 1, s_in = 0;
  bool sum_b, sum_h, sum_i;
  int64_t plane, heads;
  __host__ __device__ int64_t terms() const { return n_out * n_in; }
};

TermWalk term_walk(const Broadcast4& d, int64_t batch, int64_t heads, int64_t rows, int64_t cols) {
  TermWalk w;
  w.sum_b = d.size[0] == 1, w.sum_h = d.size[1] == 1, w.sum_i = d.size[2] == 1;
  w.plane = rows * cols, w.heads = heads;
  if (w.sum_b && w.sum_h) {
    w.n_out = batch * heads, w.s_out = w.plane;  // (b, h) consecutive planes
  } else if (w.sum_b) {
    w.n_out = batch, w.s_out = heads * w.plane;
  } else if (w.sum_h) {
    w.n_out = heads, w.s_out = w.plane;
  }
  if (w.sum_i) w.n_in = rows, w.s_in = cols;
  return w;
}

// dbias[bb, hh, r, j] = the sum of its terms (TermWalk) in order, in double, from -0 (the additive
// identity: a single term keeps its sign, so a 16-bit dbias through the partials has the bits of
// the float32 one stored directly, -0 included), rounded to float32 and then to T. Neighbouring
// threads take neighbouring keys, so each read of the workspace is coalesced. A thread issues
// the loads of kTerms terms of kRows rows (16 in all) before adding any, as a turn of its walks.
// Against the walks with the loads inside (each waiting for the previous addition, and each row
// behind the previous row's store): the (1, H, N, N) reduction over a batch of 8 ran at 1.8 TB/s
// (1.33 ms for 2.1 GB of partials at 8 x 16 x 2k, H200 s20; 0.91 ms with eight terms ahead, one
// row), and over a batch of 2 at 1.0 TB/s (2 x 32 x 8k at d64: 16.8 ms for 17 GB), two loads per
// round trip. The launcher picks (kTerms, kRows) by the element's term count.
template <typename T, int kTerms, int kRows>
__global__ void __launch_bounds__(kThreads, 3) reduce_kernel(const Broadcast4 d, const float* __restrict__ ws,
                                                          const TermWalk w, int64_t cols) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= cols) return;
  const int planes = int(d.size[0] * d.size[1]), out_heads = int(d.size[1]);
  const int64_t terms = w.terms(), rows_out = d.size[2];
  for (int bh = blockIdx.z; bh < planes; bh += gridDim.z) {
    const int64_t bb = bh / out_heads, hh = bh % out_heads;
    T* col = element<T>(d, bb, hh, 0, j);
    const float* base = ws + ((w.sum_b ? 0 : bb) * w.heads + (w.sum_h ? 0 : hh)) * w.plane + j;
    for (int64_t r0 = int64_t(blockIdx.y) * kRows; r0 < rows_out; r0 += int64_t(gridDim.y) * kRows) {
      double sum[kRows];
#pragma unroll
      for (int q = 0; q < kRows; ++q) sum[q] = -0.0;
      int64_t o = 0, in = 0;  // the next term's outer and inner index (no division)
      for (int64_t t0 = 0; t0 < terms; t0 += kTerms) {
        float v[kTerms][kRows];
#pragma unroll
        for (int k = 0; k < kTerms; ++k) {
          const bool term = t0 + k < terms;
          const int64_t at = o * w.s_out + in * w.s_in;
#pragma unroll
          for (int q = 0; q < kRows; ++q) {
            v[k][q] = term && r0 + q < rows_out ? __ldg(base + (w.sum_i ? 0 : r0 + q) * cols + at) : 0.0f;
          }
          if (term && ++in == w.n_in) in = 0, ++o;
        }
#pragma unroll
        for (int k = 0; k < kTerms; ++k) {
          if (t0 + k < terms) {
#pragma unroll
            for (int q = 0; q < kRows; ++q) sum[q] += v[k][q];
          }
        }
      }
#pragma unroll
      for (int q = 0; q < kRows; ++q) {
        if (r0 + q < rows_out) col[(r0 + q) * d.row] = T(float(sum[q]));
      }
    }
  }
}

template <typename T, int kTerms, int kRows>
void launch_reduce(const Broadcast4& d, const float* ws, const TermWalk& w, int64_t cols, cudaStream_t stream) {
  reduce_kernel<T, kTerms, kRows><<<grid_for(d, cols, kRows), kThreads, 0, stream>>>(d, ws, w, cols);
}

// 16 loads a turn: (8 terms, 2 rows) from 8 terms on, (4, 4) from 3, (2, 8) below (a batch of 2,
// or of 1 with a head broadcast over 2 heads, and the single-term copies of a 16-bit dbias).
template <typename T>
void launch_reduce(const Broadcast4& d, const float* ws, const TermWalk& w, int64_t cols, cudaStream_t stream) {
  if (w.terms() >= 8) {
    launch_reduce<T, 8, 2>(d, ws, w, cols, stream);
  } else if (w.terms() >= 3) {
    launch_reduce<T, 4, 4>(d, ws, w, cols, stream);
  } else {
    launch_reduce<T, 2, 8>(d, ws, w, cols, stream);
  }
}

// Calls f(T{}) with T dbias's element type (float, __nv_bfloat16 or __half).
template <typename F>
void with_dbias_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kBFloat16: f(__nv_bfloat16{}); break;
    case DType::kFloat16: f(__half{}); break;
    default: f(float{}); break;
  }
}

// zero_hidden_kernel over dbias in 16-byte chunks where its base and every stride walked allow.
Status launch_zero(const Broadcast4& dbias, int64_t cols, int64_t offset, cudaStream_t stream) {
  with_dbias_type(dbias.dtype, [&](auto t) {
    using T = decltype(t);
    constexpr int kVec = 16 / sizeof(T);
    const int64_t* n = dbias.size;
    const bool aligned = reinterpret_cast<uintptr_t>(dbias.data) % 16 == 0 && dbias.row % kVec == 0 &&
                         (n[1] == 1 || dbias.head % kVec == 0) && (n[0] == 1 || dbias.batch % kVec == 0);
    if (aligned) {
      zero_hidden_kernel<T, kVec><<<grid_for(dbias, (cols + kVec - 1) / kVec), kThreads, 0, stream>>>(dbias, cols, offset);
    } else {
      zero_hidden_kernel<T, 1><<<grid_for(dbias, cols), kThreads, 0, stream>>>(dbias, cols, offset);
    }
  });
  return cuda_status(cudaGetLastError(), "launching the dbias zero kernel");
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
    return cuda_status(cudaMemsetAsync(dbias.data, 0, size_t(rows * cols) * size_t(dtype_size(dbias.dtype)), stream),
                       "zeroing dbias");
  }
  return launch_zero(dbias, cols, -n[2], stream);  // every row's keys from 0 on
}

Status zero_dbias_hidden(const Broadcast4& dbias, int64_t cols, int64_t offset, cudaStream_t stream) {
  if (dbias.size[0] * dbias.size[1] * dbias.size[2] * cols == 0) return Status::Ok();
  return launch_zero(dbias, cols, offset, stream);
}

Status reduce_dbias(const Broadcast4& dbias, const float* ws, int64_t batch, int64_t heads, int64_t rows,
                    int64_t cols, cudaStream_t stream) {
  const int64_t out_rows = dbias.size[0] * dbias.size[1] * dbias.size[2];
  if (out_rows * cols == 0) return Status::Ok();
  const TermWalk w = term_walk(dbias, batch, heads, rows, cols);
  with_dbias_type(dbias.dtype, [&](auto t) { launch_reduce<decltype(t)>(dbias, ws, w, cols, stream); });
  return cuda_status(cudaGetLastError(), "launching the dbias reduction kernel");
}

}  // namespace flashattn::cuda
