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

// Whether an operand of p with strides s over `heads` heads broadcasts (stride 0 over a dimension
// of extent > 1: rows, heads, or a dense call's batch): the copy engine has no map for it, so the
// dispatchers leave such calls to sm80 (fwd_declines, fwd8_declines, fwd_cache_declines,
// bwd_declines).
inline bool broadcast_operand(const QKVParams& p, const Strides3& s, int heads) {
  return s.row == 0 || (heads > 1 && s.head == 0) || (!p.is_varlen() && p.batch > 1 && s.batch == 0);
}

// attn_bias's map for the Hopper bias kernels (forward and backward): (keys, rows, heads, batch)
// with extent 1 where it broadcasts (stride 0; the kernels then ask for coordinate 0), boxes of 64
// keys x `box_rows` rows (1 row when it broadcasts over the rows), 128-byte swizzle. Keys and
// rows are positions in the sequence: varlen's extents are max_seqlen_k / max_seqlen_q (seqlen_q
// and seqlen_k here). The callers' declines checked the strides and the alignment the copy
// engine needs (bias_map_declines).
Status make_bias_map(CUtensorMap* map, const Broadcast4& bias, int seqlen_q, int seqlen_k, int box_rows);

// Why a defined attn_bias cannot travel by make_bias_map (the dispatchers' sm80 reason), or
// nullptr: it must be 16-bit (the call's dtype) with a 16-byte aligned base and batch, head and
// row strides that are multiples of 8 elements (0 where it broadcasts).
const char* bias_map_declines(const Broadcast4& bias);

}  // namespace flashattn::cuda::sm90
