// dbias on the CUDA backward (ScoreMods::kBiasMask, sm80/bwd_kernel.h): the main kernel stores
// dS = P (dP - D) of every (sequence b, head h, query i, key j) it visits with plain stores,
// either into dbias itself or, when dbias broadcasts over the batch, the heads or the query
// rows (several (b, h, i) share one element), into a float32 (batch, heads, seqlen_q, seqlen_k)
// workspace that reduce_dbias sums afterwards.
//
// Why a workspace and a second kernel rather than atomics into dbias: float additions in
// the order CTAs happen to finish would make dbias differ from run to run; here every element
// is the sum of its terms in one fixed order (sequences, then heads, then rows, in double), so
// dbias is bitwise reproducible, deterministic mode or not. The cost is the workspace
// (batch x heads x seqlen_q x seqlen_k floats, the size of a full bias's gradient) and one pass
// over it; a full-shape dbias needs neither.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/params.h"

namespace flashattn::cuda {

// Sets every element of dbias (its shape size[0..2] x cols, its strides) to 0 on `stream`: the
// elements no step writes (absent blocks, rows or keys past a varlen sequence) stay 0.
Status zero_dbias(const Broadcast4& dbias, int64_t cols, cudaStream_t stream);

// dbias[bb, hh, r, j] = sum of ws[b, h, i, j] over the (b, h, i) that broadcast onto (bb, hh, r)
// (a dimension of size 1 in dbias takes all of ws's), summed in (b, h, i) order in double.
// ws: (batch, heads, rows, cols) float32, contiguous. Writes every element of dbias.
Status reduce_dbias(const Broadcast4& dbias, const float* ws, int64_t batch, int64_t heads, int64_t rows,
                    int64_t cols, cudaStream_t stream);

}  // namespace flashattn::cuda
