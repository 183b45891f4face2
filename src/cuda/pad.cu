// Strided copies and fills around the CUDA kernels (see pad.h). Memory-bound and simple: one
// thread per destination element in a grid-stride loop, or per 16-byte chunk of 8 elements
// where every width, stride and pointer allows it (the common case: head dims and tensor
// strides are multiples of 8), which moves 16 bytes per access instead of 2 (not yet timed). These
// run only on the padded-head-dim and empty-input paths, never around a built head dim with
// head_dim_v == head_dim.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/common/cuda_check.h"
#include "cuda/pad.h"

namespace flashattn::cuda {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill any current GPU several times over; the loop covers the rest.
constexpr int64_t kMaxBlocks = 65535;

__global__ void copy_rows16_kernel(uint16_t* __restrict__ dst, Strides3 ds, int64_t dst_width,
                                   const uint16_t* __restrict__ src, Strides3 ss,
                                   int64_t src_width, int64_t rows, int64_t heads, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * kThreads) {
    const int64_t c = i % dst_width;
    const int64_t h = (i / dst_width) % heads;
    const int64_t r = (i / (dst_width * heads)) % rows;
    const int64_t b = i / (dst_width * heads * rows);
    uint16_t value = 0;
    if (src != nullptr && c < src_width) value = src[b * ss.batch + r * ss.row + h * ss.head + c];
    dst[b * ds.batch + r * ds.row + h * ds.head + c] = value;
  }
}

// The same copy in 16-byte chunks: widths in chunks of 8 elements, strides in chunks.
__global__ void copy_rows16_vec_kernel(uint4* __restrict__ dst, Strides3 ds, int64_t dst_chunks,
                                       const uint4* __restrict__ src, Strides3 ss, int64_t src_chunks,
                                       int64_t rows, int64_t heads, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * kThreads) {
    const int64_t c = i % dst_chunks;
    const int64_t h = (i / dst_chunks) % heads;
    const int64_t r = (i / (dst_chunks * heads)) % rows;
    const int64_t b = i / (dst_chunks * heads * rows);
    uint4 value = make_uint4(0, 0, 0, 0);
    if (src != nullptr && c < src_chunks) value = src[b * ss.batch + r * ss.row + h * ss.head + c];
    dst[b * ds.batch + r * ds.row + h * ds.head + c] = value;
  }
}

constexpr int64_t kChunk = 8;  // 16-bit elements per 16-byte chunk

bool chunked(const void* p, const Strides3& s, int64_t width) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0 && width % kChunk == 0 && s.batch % kChunk == 0 &&
         s.row % kChunk == 0 && s.head % kChunk == 0;
}

Strides3 in_chunks(const Strides3& s) { return Strides3{s.batch / kChunk, s.row / kChunk, s.head / kChunk}; }

__global__ void fill_lse_kernel(float* __restrict__ lse, int64_t batch_stride, int64_t head_stride,
                                int64_t heads, int64_t rows, float value, const float* __restrict__ per_head,
                                int64_t total) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * kThreads) {
    const int64_t r = i % rows;
    const int64_t h = (i / rows) % heads;
    const int64_t b = i / (rows * heads);
    lse[b * batch_stride + h * head_stride + r] = per_head != nullptr ? per_head[h] : value;
  }
}

int blocks_for(int64_t total) {
  return static_cast<int>(std::min<int64_t>(kMaxBlocks, (total + kThreads - 1) / kThreads));
}

}  // namespace

Status copy_rows16(void* dst, const Strides3& dst_strides, int64_t dst_width, const Rows16& src,
                   int64_t batch, int64_t rows, int64_t heads, cudaStream_t stream) {
  const int64_t total = batch * rows * heads * dst_width;
  if (total == 0) return Status::Ok();
  if (chunked(dst, dst_strides, dst_width) && (src.data == nullptr || chunked(src.data, src.strides, src.width))) {
    const int64_t chunks = total / kChunk;
    copy_rows16_vec_kernel<<<blocks_for(chunks), kThreads, 0, stream>>>(
        static_cast<uint4*>(dst), in_chunks(dst_strides), dst_width / kChunk,
        static_cast<const uint4*>(src.data), in_chunks(src.strides), src.width / kChunk, rows, heads, chunks);
    return cuda_status(cudaGetLastError(), "launching the head-dim copy kernel");
  }
  copy_rows16_kernel<<<blocks_for(total), kThreads, 0, stream>>>(
      static_cast<uint16_t*>(dst), dst_strides, dst_width, static_cast<const uint16_t*>(src.data),
      src.strides, src.width, rows, heads, total);
  return cuda_status(cudaGetLastError(), "launching the head-dim copy kernel");
}

Status fill_lse(float* lse, int64_t batch_stride, int64_t head_stride, int64_t batch,
                int64_t heads, int64_t rows, float value, cudaStream_t stream, const float* per_head) {
  const int64_t total = batch * heads * rows;
  if (lse == nullptr || total == 0) return Status::Ok();
  fill_lse_kernel<<<blocks_for(total), kThreads, 0, stream>>>(lse, batch_stride, head_stride,
                                                               heads, rows, value, per_head, total);
  return cuda_status(cudaGetLastError(), "launching the LSE fill kernel");
}

}  // namespace flashattn::cuda
