// Tensor maps (host side) for the Hopper kernels' bulk tensor copies.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "core/params.h"

namespace flashattn::cuda::sm90 {

// A rank-4 map of one (batch, seq, heads, dim) operand, innermost first: (dim, seq, heads,
// batch), boxes of 64 columns x `box_rows` rows of one head and one batch entry, written to
// shared memory in 128-byte swizzled rows (ptx/wgmma.h). Varlen operands are one batch entry of
// `rows` packed tokens. Rows past `rows` read as zeros.
//
// NotSupported when the copy engine cannot describe the operand (a stride that is not a
// multiple of 16 bytes, a pointer that is not 16-byte aligned, dimensions out of range): the
// dispatcher then runs the sm80 path.
Status make_operand_map(CUtensorMap* map, const void* ptr, DType dtype, int head_dim, int64_t rows, int heads,
                        int batch, const Strides3& strides, int box_rows);

}  // namespace flashattn::cuda::sm90
