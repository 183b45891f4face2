// The one matrix product of the CPU backend: a register-blocked float32 kernel
//
//   C (m x n) = A (m x k) * B (k x n)      (GemmMode::kStore, kStoreColMax)
//   C = C + A * B                          (GemmMode::kAccumulate)
//   C = C * diag(s) + A * B                (GemmMode::kScaleAccumulate: column scale s)
//
// written as outer products: for each t < k, a row of B (vectors along n) is multiplied by
// scalars of A broadcast to all lanes and accumulated into a kTileRows x (kTileVecs * W) block
// of C held in registers. Vectors always run along n, which every caller makes the dimension it
// owns and pads (query positions in the forward, key positions in the dK/dV pass), so head dims
// of any size need no padding: they are m or k here.
//
// A is addressed through two strides, so both A and its transpose are read in place:
//   A(r, t) = a[r * a_rs + t * a_ks]
// (K rows: a_rs = row stride, a_ks = 1; V^T for P.V: a_rs = 1, a_ks = row stride).
// B(t, :) starts at b + t * ldb; C(r, :) at c + r * ldc; n must be a multiple of W.
// The column vector `col` (n floats) is the scale of kScaleAccumulate, and for kStoreColMax
// receives col[j] = max(col[j], max_r C(r, j)) (the online softmax's column maximum, computed
// from the registers instead of a second pass over C).
//
// Accumulation order over t is sequential for every element of C, so S computed as K.Q^T in
// one pass and as Q.K^T in another is bitwise identical.
#pragma once

#include <cstdint>

#include "cpu/simd.h"

namespace flashattn::cpu {

enum class GemmMode { kStore, kStoreColMax, kAccumulate, kScaleAccumulate };

template <class Isa, int kRows, int kVecs, GemmMode kMode>
FLASHATTN_CPU_INLINE void gemm_tile(int64_t k, const float* a, int64_t a_rs, int64_t a_ks,
                                    const float* b, int64_t ldb, float* c, int64_t ldc,
                                    float* col) {
  constexpr int W = Isa::kWidth;
  using V = VecF<W>;
  V acc[kRows][kVecs];
#pragma GCC unroll 4
  for (int v = 0; v < kVecs; ++v) {
    if constexpr (kMode == GemmMode::kScaleAccumulate) {
      V scale;
      vload<W>(scale, col + v * W);
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r) {
        vload<W>(acc[r][v], c + r * ldc + v * W);
        acc[r][v] *= scale;
      }
    } else if constexpr (kMode == GemmMode::kAccumulate) {
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r) vload<W>(acc[r][v], c + r * ldc + v * W);
    } else {
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r) acc[r][v] = V{};
    }
  }
  const float* a_row[kRows];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) a_row[r] = a + r * a_rs;
  for (int64_t t = 0; t < k; ++t) {
    V bv[kVecs];
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) vload<W>(bv[v], b + t * ldb + v * W);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const float ar = a_row[r][t * a_ks];
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v) acc[r][v] += ar * bv[v];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) vstore<W>(c + r * ldc + v * W, acc[r][v]);
  }
  if constexpr (kMode == GemmMode::kStoreColMax) {
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      V mx;
      vload<W>(mx, col + v * W);
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r) vmax_inplace<W>(mx, acc[r][v]);
      vstore<W>(col + v * W, mx);
    }
  }
}

// Rows [r0, m) of one column strip, in tiles of kTileRows and a final tile of m % kTileRows.
template <class Isa, int kVecs, GemmMode kMode, int kTail = Isa::kTileRows - 1>
FLASHATTN_CPU_INLINE void gemm_strip_tail(int rows, int64_t k, const float* a, int64_t a_rs,
                                          int64_t a_ks, const float* b, int64_t ldb, float* c,
                                          int64_t ldc, float* col) {
  if constexpr (kTail > 0) {
    if (rows == kTail) {
      gemm_tile<Isa, kTail, kVecs, kMode>(k, a, a_rs, a_ks, b, ldb, c, ldc, col);
    } else {
      gemm_strip_tail<Isa, kVecs, kMode, kTail - 1>(rows, k, a, a_rs, a_ks, b, ldb, c, ldc, col);
    }
  }
}

template <class Isa, int kVecs, GemmMode kMode>
FLASHATTN_CPU_INLINE void gemm_strip(int64_t m, int64_t k, const float* a, int64_t a_rs,
                                     int64_t a_ks, const float* b, int64_t ldb, float* c,
                                     int64_t ldc, float* col) {
  constexpr int R = Isa::kTileRows;
  int64_t r = 0;
  for (; r + R <= m; r += R) {
    gemm_tile<Isa, R, kVecs, kMode>(k, a + r * a_rs, a_rs, a_ks, b, ldb, c + r * ldc, ldc, col);
  }
  if (r < m) {
    gemm_strip_tail<Isa, kVecs, kMode>(static_cast<int>(m - r), k, a + r * a_rs, a_rs, a_ks, b, ldb,
                                       c + r * ldc, ldc, col);
  }
}

template <class Isa, GemmMode kMode>
FLASHATTN_CPU_INLINE void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs,
                               int64_t a_ks, const float* b, int64_t ldb, float* c, int64_t ldc,
                               float* col = nullptr) {
  constexpr int W = Isa::kWidth;
  constexpr int kStrip = Isa::kTileVecs * W;
  int64_t j = 0;
  for (; j + kStrip <= n; j += kStrip) {
    gemm_strip<Isa, Isa::kTileVecs, kMode>(m, k, a, a_rs, a_ks, b + j, ldb, c + j, ldc,
                                           col != nullptr ? col + j : nullptr);
  }
  // Narrower last strip: one vector at a time.
  for (; j < n; j += W) {
    gemm_strip<Isa, 1, kMode>(m, k, a, a_rs, a_ks, b + j, ldb, c + j, ldc,
                              col != nullptr ? col + j : nullptr);
  }
}

}  // namespace flashattn::cpu
