// dbias on the CUDA backward (ScoreMods::kBiasMask, sm80/bwd_kernel.h). dS = P (dP - D) of every
// (sequence b, head h, query i, key j) belongs to one step of one CTA of the main kernel (a CTA
// owns a key block of one (b, kv head) and walks its query heads and query blocks). dbias has
// shape (B|1, H|1, Nq|1, Nk); DbiasPlan says how its elements are made:
//   - dbias (B, H, Nq, Nk): each step stores its dS into dbias itself (plain stores);
//   - dbias (*, *, 1, Nk) with Nq > 1 (broadcast over the query rows, e.g. a key-padding bias):
//     the CTA sums dS over the rows in registers across its steps of one (b, h), then over its
//     warps in a fixed order (bwd_common.h, flush_dbias_cols), one value per (b, h, j);
//   - the values of (b, h) go to dbias itself when dbias is (B, H, *, Nk) (and float32, or 16-bit
//     with the sm90 per-element stores), else (broadcast over the batch or the heads: several
//     (b, h) share an element; or 16-bit) to a float32 workspace of
//     partials, (B, H, R, Nk) with R = 1 when summed over the rows, else Nq, that reduce_dbias
//     sums afterwards in a fixed order. Workspace floats:
//         dbias (B, H, *, Nk): 0;  otherwise B * H * (dbias rows == 1 ? 1 : Nq) * Nk
//     (a (B, 1, 1, Nk) key-padding bias at 16k keys x 16 heads: 16 x Nk floats per sequence).
//
// Why partials and a second kernel rather than atomics into dbias: float additions in the order
// CTAs happen to finish would make dbias differ from run to run; here every element is the sum
// of its terms in one fixed order (in the CTA: its walk order and warp order; across CTAs:
// sequences, then heads, then rows, in double), so dbias is bitwise reproducible, deterministic
// mode or not.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/params.h"

namespace flashattn::cuda {

// How the main backward kernel produces dbias (see above). Default: no dbias.
struct DbiasPlan {
  bool row_sum = false;   // dS summed over the query rows in the CTA (dbias broadcasts over them)
  int64_t ws_rows = 0;    // rows per (b, h) of the partials: 1 (row_sum) or seqlen_q
  int64_t ws_floats = 0;  // workspace floats: 0 when dbias is (B, H, *, Nk)
};

// A 16-bit dbias (the bias's dtype) is stored directly only by kernels that round dS to it
// themselves (stores_16bit: the sm90 bias kernel's per-element stores); otherwise it takes the
// partials, whose reduction rounds each sum once.
inline DbiasPlan plan_dbias(const BackwardParams& p, bool stores_16bit = false) {
  DbiasPlan plan;
  if (!p.dbias.defined()) return plan;
  const int64_t* size = p.dbias.size;
  plan.row_sum = size[2] == 1 && p.seqlen_q > 1;
  plan.ws_rows = plan.row_sum ? 1 : p.seqlen_q;
  const bool direct = p.dbias.dtype == DType::kFloat32 || (stores_16bit && !plan.row_sum);
  const bool per_bh = direct && size[0] == p.batch && size[1] == p.heads;  // no two (b, h) share an element
  plan.ws_floats = per_bh ? 0 : int64_t(p.batch) * p.heads * plan.ws_rows * p.seqlen_k;
  return plan;
}

// Sets every element of dbias (its shape size[0..2] x cols, its strides; float32 or 16-bit) to 0
// on `stream`: the elements no step writes (absent blocks, rows or keys past a varlen sequence)
// stay 0.
Status zero_dbias(const Broadcast4& dbias, int64_t cols, cudaStream_t stream);

// zero_dbias for a dbias with a row per query row under a mask that hides every key j > r +
// offset of row r and nothing else (causal, or a window with only a right bound: offset =
// seqlen_k - seqlen_q + window_right): only those elements are zeroed, the kernels storing every
// visible one (a step stores all of its tile's elements). About half the bytes of zero_dbias
// when causal. Not for block masks (absent blocks hide visible keys) or varlen sequences.
Status zero_dbias_hidden(const Broadcast4& dbias, int64_t cols, int64_t offset, cudaStream_t stream);

// dbias[bb, hh, r, j] = sum of ws[b, h, i, j] over the (b, h, i) that broadcast onto (bb, hh, r)
// (a dimension of size 1 in dbias takes all of ws's), summed in (b, h, i) order in double, rounded
// to float32 and then (a 16-bit dbias) to dbias's dtype: the bits of the float32 result cast.
// ws: (batch, heads, rows, cols) float32, contiguous, rows = 1 or dbias's rows (DbiasPlan::ws_rows).
// Writes every element of dbias.
Status reduce_dbias(const Broadcast4& dbias, const float* ws, int64_t batch, int64_t heads, int64_t rows,
                    int64_t cols, cudaStream_t stream);

}  // namespace flashattn::cuda
