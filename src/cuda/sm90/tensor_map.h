// Tensor maps (host side) for the Hopper kernels' bulk tensor copies.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "core/params.h"

namespace flashattn::cuda::sm90 {

// A rank-4 map of one (batch, seq, heads, dim) operand, innermost first: (dim, seq, heads,
// batch), boxes of `box_cols` columns x `box_rows` rows of one head and one batch entry, written
// to shared memory in swizzled rows of `swizzle_bytes` (128, or 64; ptx/smem_desc.h). The 16-bit
// kernels take 64 columns of 128 bytes; the FP8 forward (fwd8_kernel.h) 128 e4m3 columns of 128
// bytes, or at head dim 64 one row of 64 bytes under the 64-byte swizzle. Varlen operands are one batch entry of
// `rows` packed tokens. Rows past `rows` read as zeros.
//
// NotSupported when the copy engine cannot describe the operand (a stride that is not a
// multiple of 16 bytes, a pointer that is not 16-byte aligned, dimensions out of range): the
// dispatcher then runs the sm80 path.
Status make_operand_map(CUtensorMap* map, const void* ptr, DType dtype, int head_dim, int64_t rows, int heads,
                        int batch, const Strides3& strides, int box_rows, int box_cols = 64,
                        int swizzle_bytes = 128);

}  // namespace flashattn::cuda::sm90
