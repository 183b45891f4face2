// The one matrix product of the CPU backend: a register-blocked float32 kernel
//
//   C (m x n) = A (m x k) * B (k x n)      or      C += A * B
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
//
// Accumulation order over t is sequential for every element of C, so S computed as K.Q^T in
// one pass and as Q.K^T in another is bitwise identical.
#pragma once

#include <cstdint>

#include "cpu/simd.h"

namespace flashattn::cpu {

template <class Isa, int kRows, int kVecs, bool kAccumulate>
FLASHATTN_CPU_INLINE void gemm_tile(int64_t k, const float* a, int64_t a_rs, int64_t a_ks,
                                    const float* b, int64_t ldb, float* c, int64_t ldc) {
  constexpr int W = Isa::kWidth;
  using V = VecF<W>;
  V acc[kRows][kVecs];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      if constexpr (kAccumulate) {
        vload<W>(acc[r][v], c + r * ldc + v * W);
      } else {
        acc[r][v] = V{};
      }
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
}

// Rows [r0, m) of one column strip, in tiles of kTileRows and a final tile of m % kTileRows.
template <class Isa, int kVecs, bool kAccumulate, int kTail = Isa::kTileRows - 1>
FLASHATTN_CPU_INLINE void gemm_strip_tail(int rows, int64_t k, const float* a, int64_t a_rs,
                                          int64_t a_ks, const float* b, int64_t ldb, float* c,
                                          int64_t ldc) {
  if constexpr (kTail > 0) {
    if (rows == kTail) {
      gemm_tile<Isa, kTail, kVecs, kAccumulate>(k, a, a_rs, a_ks, b, ldb, c, ldc);
    } else {
      gemm_strip_tail<Isa, kVecs, kAccumulate, kTail - 1>(rows, k, a, a_rs, a_ks, b, ldb, c, ldc);
    }
  }
}

template <class Isa, int kVecs, bool kAccumulate>
FLASHATTN_CPU_INLINE void gemm_strip(int64_t m, int64_t k, const float* a, int64_t a_rs,
                                     int64_t a_ks, const float* b, int64_t ldb, float* c,
                                     int64_t ldc) {
  constexpr int R = Isa::kTileRows;
  int64_t r = 0;
  for (; r + R <= m; r += R) {
    gemm_tile<Isa, R, kVecs, kAccumulate>(k, a + r * a_rs, a_rs, a_ks, b, ldb, c + r * ldc, ldc);
  }
  if (r < m) {
    gemm_strip_tail<Isa, kVecs, kAccumulate>(static_cast<int>(m - r), k, a + r * a_rs, a_rs, a_ks,
                                             b, ldb, c + r * ldc, ldc);
  }
}

template <class Isa, bool kAccumulate>
FLASHATTN_CPU_INLINE void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs,
                               int64_t a_ks, const float* b, int64_t ldb, float* c,
                               int64_t ldc) {
  constexpr int W = Isa::kWidth;
  constexpr int kStrip = Isa::kTileVecs * W;
  int64_t j = 0;
  for (; j + kStrip <= n; j += kStrip) {
    gemm_strip<Isa, Isa::kTileVecs, kAccumulate>(m, k, a, a_rs, a_ks, b + j, ldb, c + j, ldc);
  }
  // Narrower last strip: one vector at a time.
  for (; j < n; j += W) gemm_strip<Isa, 1, kAccumulate>(m, k, a, a_rs, a_ks, b + j, ldb, c + j, ldc);
}

}  // namespace flashattn::cpu
