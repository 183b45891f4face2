// Visibility of key j from query i inside one sequence (docs/SEMANTICS.md): with
// d = i + seqlen_k - seqlen_q, key j is visible iff j < seqlen_k, and
// (left < 0 || j >= d - left) and (right < 0 || j <= d + right). Causal is (-1, 0).
#pragma once

#include <climits>
#include <cstdint>

// The block-level queries are host-callable too, so that tests/cpp/test_mask_blocks.cpp checks
// them against block_needs_mask element by element.
#if defined(__CUDACC__)
#define FLASHATTN_MASK_HD __host__ __device__ __forceinline__
#else
#define FLASHATTN_MASK_HD inline
#endif

namespace flashattn::cuda {

struct WindowMask {
  int seqlen_q;
  int seqlen_k;
  int left;   // -1 = unbounded
  int right;  // -1 = unbounded

  FLASHATTN_MASK_HD int diag(int i) const { return i + seqlen_k - seqlen_q; }

#if defined(__CUDACC__)
  // The keys visible from row i form one interval [*lo, *hi) (empty when *hi <= *lo). Kernels
  // compute it once per row and test each key with two compares, without branches. Windows at
  // least as wide as the sequences arrive as -1 (validate.cpp), so d + right + 1 cannot overflow.
  __device__ __forceinline__ void row_range(int i, int* lo, int* hi) const {
    const int d = diag(i);
    *lo = left < 0 ? 0 : max(0, d - left);
    *hi = right < 0 ? seqlen_k : min(seqlen_k, d + right + 1);
  }

  // The rows that see key j form one interval too, [*lo, *hi) (empty when *hi <= *lo): from
  // lo(i) <= j < hi(i) with d(i) = i + seqlen_k - seqlen_q, row i sees j iff j < seqlen_k,
  // i >= j - right - (seqlen_k - seqlen_q) (right >= 0) and i <= j + left - (seqlen_k - seqlen_q)
  // (left >= 0). The backward's dK/dV kernels, whose threads own keys, test their rows with it.
  __device__ __forceinline__ void key_range(int j, int* lo, int* hi) const {
    const int off = seqlen_k - seqlen_q;
    *lo = right < 0 ? 0 : max(0, j - right - off);
    *hi = j >= seqlen_k ? 0 : left < 0 ? seqlen_q : min(seqlen_q, j + left - off + 1);
  }

  // Key blocks [lo, hi) that hold at least one key visible from rows [row_begin, row_end).
  __device__ __forceinline__ void block_range(int row_begin, int row_end, int block_n, int* lo,
                                              int* hi) const {
    int h = (seqlen_k + block_n - 1) / block_n;
    int l = 0;
    if (right >= 0) {
      const int last_col = diag(row_end - 1) + right;  // rightmost visible key of the last row
      h = min(h, last_col < 0 ? 0 : last_col / block_n + 1);
    }
    if (left >= 0) {
      const int first_col = diag(row_begin) - left;  // leftmost visible key of the first row
      l = first_col <= 0 ? 0 : first_col / block_n;
    }
    *lo = l;
    *hi = h;
  }

#endif  // __CUDACC__

  // Whether some key in [col_begin, col_end) is hidden from some row of [row_begin, row_end).
  FLASHATTN_MASK_HD bool block_needs_mask(int row_begin, int row_end, int col_begin, int col_end) const {
    if (col_end > seqlen_k) return true;
    if (right >= 0 && col_end - 1 > diag(row_begin) + right) return true;
    if (left >= 0 && col_begin < diag(row_end - 1) - left) return true;
    return false;
  }

  // The query blocks m (rows [m * block_m, min((m + 1) * block_m, seqlen_q))) for which
  // block_needs_mask(rows, col_begin, col_end) is false form one interval [*lo, *hi) (empty when
  // *hi <= *lo): the right side hides keys from the first blocks, the left side from the last.
  // The backward's dK/dV kernels walk query blocks for fixed keys; testing the interval costs two
  // uniform compares a step instead of block_needs_mask's arithmetic on the block's rows.
  FLASHATTN_MASK_HD void unmasked_row_blocks(int col_begin, int col_end, int block_m, int* lo, int* hi) const {
    if (col_end > seqlen_k) {  // keys past the sequence: every block
      *lo = 0;
      *hi = 0;
      return;
    }
    const int off = seqlen_k - seqlen_q;
    int l = 0, h = INT_MAX;
    if (right >= 0) {
      // Clean iff m * block_m >= col_end - 1 - off - right (the first row sees the last key).
      const int r = col_end - 1 - off - right;
      l = r <= 0 ? 0 : (r + block_m - 1) / block_m;
    }
    if (left >= 0) {
      // Clean iff min((m + 1) * block_m, seqlen_q) - 1 <= col_begin - off + left (the last row
      // still sees the first key): every block when the sequence's last row does, else the
      // blocks that end by then.
      const int last = col_begin - off + left;
      if (seqlen_q - 1 > last) h = last + 1 <= 0 ? 0 : (last + 1) / block_m;
    }
    *lo = l;
    *hi = h;
  }
};

#if defined(__CUDACC__)
// The mask of one kernel instantiation: kernels compiled without a window get compile-time
// unbounded sides, so only the key-count bound j < seqlen_k remains in their code.
template <bool kWindowed>
__device__ __forceinline__ WindowMask make_window_mask(int seqlen_q, int seqlen_k, int left, int right) {
  return WindowMask{seqlen_q, seqlen_k, kWindowed ? left : -1, kWindowed ? right : -1};
}

#endif  // __CUDACC__

}  // namespace flashattn::cuda
