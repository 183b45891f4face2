// Strided copies and fills the CUDA backend runs around its kernels (host side; not attention):
//   * head-dim padding: a head dim the build did not instantiate, or a head_dim_v that differs
//     from head_dim, runs at one built head dim on zero-padded copies of the operands whose
//     width differs from it (cuda_backend.cu), and the results are copied back;
//   * empty inputs: with no key, outputs are 0 and LSE is -inf without launching attention.
// Every operand is a (batch, rows, heads, width) view with arbitrary strides (elements; the
// width dimension has stride 1), dense or varlen (batch 1, batch stride 0, rows = total).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/params.h"
#include "flashattn/types.h"

namespace flashattn::cuda {

// One operand of 16-bit elements (float16 or bfloat16: copies move bits, never convert).
struct Rows16 {
  const void* data = nullptr;  // null as a source: read as zeros
  Strides3 strides;
  int64_t width = 0;  // elements per (batch, row, head)
};

// dst[b, r, h, c] = c < src.width ? src[b, r, h, c] : 0, for every c < dst_width.
// Covers padding (dst wider), unpadding (dst narrower) and zero fills (src.data null).
Status copy_rows16(void* dst, const Strides3& dst_strides, int64_t dst_width, const Rows16& src,
                   int64_t batch, int64_t rows, int64_t heads, cudaStream_t stream);

// lse[b * batch_stride + h * head_stride + r] = value (per_head[h] when given: a float32 per
// head, e.g. the learnable sink), for b < batch, h < heads, r < rows.
Status fill_lse(float* lse, int64_t batch_stride, int64_t head_stride, int64_t batch,
                int64_t heads, int64_t rows, float value, cudaStream_t stream,
                const float* per_head = nullptr);

}  // namespace flashattn::cuda
