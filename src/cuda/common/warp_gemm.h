// Warp-level matrix products over shared memory and registers (mma.sync m16n8k16 fed by
// ldmatrix), shared by the forward and backward kernels. Accumulators are kMT x kNT tiles of
// 16 x 8 f32 in the C-fragment layout of ptx/mma.h.
#pragma once

#include <cstdint>

#include "cuda/common/smem_layout.h"
#include "cuda/ptx/ldmatrix.h"
#include "cuda/ptx/math.h"
#include "cuda/ptx/mma.h"

namespace flashattn::cuda {

// ldmatrix row/column offsets of this lane inside a 16 x 16 tile (see ptx/ldmatrix.h: lanes
// 8q..8q+7 address the rows of matrix q). Two addressings cover every operand of the backward:
//   kind A: row lane%8 + 8*((lane/8)%2), column 8*(lane/16). Plain ldmatrix of an A operand
//           stored [m][k]; .trans ldmatrix of a B operand stored [k][n] (two 8-wide n tiles).
//   kind B: row lane%8 + 8*(lane/16), column 8*((lane/8)%2). Plain ldmatrix of a B operand
//           stored [n][k] (two 8-wide n tiles); .trans ldmatrix of an A operand stored [k][m].
// With .trans each 8x8 matrix arrives transposed, so lane l holds stored (rows 2(l%4), 2(l%4)+1;
// column l/4): for [k][m] that is A(m = g, k = 2t..2t+1), for [k][n] B(k = 2t..2t+1, n = g).
__device__ __forceinline__ int ldsm_row_a(int lane) { return lane % 8 + ((lane / 8) % 2) * 8; }
__device__ __forceinline__ int ldsm_col_a(int lane) { return (lane / 16) * 8; }
__device__ __forceinline__ int ldsm_row_b(int lane) { return lane % 8 + (lane / 16) * 8; }
__device__ __forceinline__ int ldsm_col_b(int lane) { return ((lane / 8) % 2) * 8; }

template <int kMT, int kNT>
__device__ __forceinline__ void zero_acc(float (&acc)[kMT][kNT][4]) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
}

// How an operand tile sits in shared memory (rows laid out by a smem_layout.h Layout): kOuter
// rows are [m or n][k] and read with plain ldmatrix; kK rows are [k][m or n] and read with .trans.
enum class SmemMajor { kOuter, kK };

// The x4 ldmatrix of the 16 x 16 operand tile at (outer, k); base is this lane's address of
// tile (0, 0), built with the offsets above (kind A or B as each product below says).
template <typename Element, SmemMajor kMajor, typename Layout>
__device__ __forceinline__ void load_frag(uint32_t (&r)[4], uint32_t base, int outer, int k) {
  static_assert(sizeof(Element) == 2, "16-bit operands");
  if constexpr (kMajor == SmemMajor::kOuter) {
    ptx::ldmatrix_x4(r, Layout::advance(base, outer, k));
  } else {
    ptx::ldmatrix_x4_trans(r, Layout::advance(base, k, outer));
  }
}

// The kMT A fragments of k step kk (16-row tiles of this warp's A, stored [m][k]).
template <typename Element, int kMT, SmemMajor kAMajor, typename LayoutA>
__device__ __forceinline__ void load_a_frags(uint32_t (&a)[kMT][4], uint32_t a_addr, int kk) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) load_frag<Element, kAMajor, LayoutA>(a[mt], a_addr, mt * 16, kk * 16);
}

// acc[.][nt] and acc[.][nt + 1] += a * (the two 8-wide B tiles of one x4 ldmatrix).
template <typename Element, int kMT, int kNT>
__device__ __forceinline__ void mma_b_pair(float (&acc)[kMT][kNT][4], const uint32_t (&a)[kMT][4],
                                           const uint32_t (&b)[4], int nt) {
  const uint32_t b0[2] = {b[0], b[1]};
  const uint32_t b1[2] = {b[2], b[3]};
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    ptx::mma_m16n8k16<Element>(acc[mt][nt], a[mt], b0);
    ptx::mma_m16n8k16<Element>(acc[mt][nt + 1], a[mt], b1);
  }
}

// One 16-deep k step: acc[kMT][kNT] += a (kMT A fragments) * B, the B tiles of step kk loaded
// from shared memory in pairs (one x4 ldmatrix serves two 8-wide tiles).
template <typename Element, int kMT, int kNT, SmemMajor kBMajor, typename LayoutB>
__device__ __forceinline__ void mma_k_step(float (&acc)[kMT][kNT][4], const uint32_t (&a)[kMT][4], uint32_t b_addr,
                                           int kk) {
  static_assert(kNT % 2 == 0, "B tiles load in pairs");
#pragma unroll
  for (int nt = 0; nt < kNT; nt += 2) {
    uint32_t b[4];
    load_frag<Element, kBMajor, LayoutB>(b, b_addr, nt * 8, kk * 16);
    mma_b_pair<Element>(acc, a, b, nt);
  }
}

// acc[kMT][kNT] (16 x 8 tiles) += A * B with K = 16 * kKSteps, both operands in shared memory.
// a_addr / b_addr are this lane's byte addresses of tile (0, 0) in layouts LayoutA / LayoutB.
template <typename Element, int kMT, int kNT, int kKSteps, typename LayoutA, typename LayoutB, SmemMajor kAMajor,
          SmemMajor kBMajor>
__device__ __forceinline__ void warp_gemm(float (&acc)[kMT][kNT][4], uint32_t a_addr, uint32_t b_addr) {
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    uint32_t a[kMT][4];
    load_a_frags<Element, kMT, kAMajor, LayoutA>(a, a_addr, kk);
    mma_k_step<Element, kMT, kNT, kBMajor, LayoutB>(acc, a, b_addr, kk);
  }
}

// The three layouts the kernels use:
// A stored [m][k], B stored [n][k] (acc += A B^T): a_addr kind A, b_addr kind B.
template <typename Element, int kMT, int kNT, int kKSteps, typename LayoutA, typename LayoutB>
__device__ __forceinline__ void warp_gemm_abt(float (&acc)[kMT][kNT][4], uint32_t a_addr, uint32_t b_addr) {
  warp_gemm<Element, kMT, kNT, kKSteps, LayoutA, LayoutB, SmemMajor::kOuter, SmemMajor::kOuter>(acc, a_addr, b_addr);
}

// A stored transposed as [k][m], B stored [k][n] (acc(m, n) += sum_k A[k][m] B[k][n]):
// a_addr kind B (.trans), b_addr kind A (.trans).
template <typename Element, int kMT, int kNT, int kKSteps, typename LayoutA, typename LayoutB>
__device__ __forceinline__ void warp_gemm_atb(float (&acc)[kMT][kNT][4], uint32_t a_addr, uint32_t b_addr) {
  warp_gemm<Element, kMT, kNT, kKSteps, LayoutA, LayoutB, SmemMajor::kK, SmemMajor::kK>(acc, a_addr, b_addr);
}

// A stored [m][k], B stored [k][n] (acc += A B): a_addr kind A, b_addr kind A (.trans).
template <typename Element, int kMT, int kNT, int kKSteps, typename LayoutA, typename LayoutB>
__device__ __forceinline__ void warp_gemm_ab(float (&acc)[kMT][kNT][4], uint32_t a_addr, uint32_t b_addr) {
  warp_gemm<Element, kMT, kNT, kKSteps, LayoutA, LayoutB, SmemMajor::kOuter, SmemMajor::kK>(acc, a_addr, b_addr);
}

// B held in registers across calls (an operand that stays fixed, e.g. V of a backward CTA):
// load_b_frags reads the kNT x (16 * kKSteps) B tile stored [n][k] once (b_addr kind B), and
// warp_gemm_abt_breg runs acc += A B^T with A from shared memory (a_addr kind A) against it.
template <typename Element, int kNT, int kKSteps, typename LayoutB>
__device__ __forceinline__ void load_b_frags(uint32_t (&b)[kKSteps][kNT / 2][4], uint32_t b_addr) {
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk)
#pragma unroll
    for (int np = 0; np < kNT / 2; ++np) load_frag<Element, SmemMajor::kOuter, LayoutB>(b[kk][np], b_addr, np * 16, kk * 16);
}

template <typename Element, int kMT, int kNT, int kKSteps, typename LayoutA>
__device__ __forceinline__ void warp_gemm_abt_breg(float (&acc)[kMT][kNT][4], uint32_t a_addr,
                                                   const uint32_t (&b)[kKSteps][kNT / 2][4]) {
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    uint32_t a[kMT][4];
    load_a_frags<Element, kMT, SmemMajor::kOuter, LayoutA>(a, a_addr, kk);
#pragma unroll
    for (int np = 0; np < kNT / 2; ++np) mma_b_pair<Element>(acc, a, b[kk][np], 2 * np);
  }
}

// Stores a warp's f32 accumulator tile, converted to 16-bit pairs, at tile (row0.., col0..) of
// smem in Layout: element (mt, nt, e) goes to row mt*16 + g + 8*(e/2), column nt*8 + 2t + e%2.
// Conflict-free for PaddedRows with a stride 8 elements past a multiple of 64, and for
// SwizzledRows.
template <typename Element, int kMT, int kNT, typename Layout>
__device__ __forceinline__ void store_acc_16bit(Element* smem, const float (&acc)[kMT][kNT][4], int row0,
                                                int col0, int lane, float scale = 1.0f) {
  const int g = lane / 4;
  const int t = lane % 4;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      Element* p = Layout::at(smem, row0 + mt * 16 + g, col0 + nt * 8 + 2 * t);
      *reinterpret_cast<uint32_t*>(p) = ptx::pack2<Element>(acc[mt][nt][0] * scale, acc[mt][nt][1] * scale);
      // Eight rows down: the same swizzle phase, so a plain row step.
      *reinterpret_cast<uint32_t*>(p + 8 * Layout::kStride) =
          ptx::pack2<Element>(acc[mt][nt][2] * scale, acc[mt][nt][3] * scale);
    }
  }
}

// A taken from registers: acc += A B where A is the f32 accumulator of a previous product
// (e.g. P = softmax(S), or dS), rounded to 16 bits, and B is stored [k][n] in shared memory
// (b_addr kind A, read with .trans). Two adjacent 8-wide accumulator tiles of A form one 16-wide
// A fragment once packed, so nothing leaves registers.
template <typename Element, int kMT, int kNT, int kKSteps, typename LayoutB>
__device__ __forceinline__ void warp_gemm_rs(float (&acc)[kMT][kNT][4], const float (&a_acc)[kMT][2 * kKSteps][4],
                                             uint32_t b_addr) {
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    uint32_t a[kMT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      a[mt][0] = ptx::pack2<Element>(a_acc[mt][2 * kk][0], a_acc[mt][2 * kk][1]);
      a[mt][1] = ptx::pack2<Element>(a_acc[mt][2 * kk][2], a_acc[mt][2 * kk][3]);
      a[mt][2] = ptx::pack2<Element>(a_acc[mt][2 * kk + 1][0], a_acc[mt][2 * kk + 1][1]);
      a[mt][3] = ptx::pack2<Element>(a_acc[mt][2 * kk + 1][2], a_acc[mt][2 * kk + 1][3]);
    }
    mma_k_step<Element, kMT, kNT, SmemMajor::kK, LayoutB>(acc, a, b_addr, kk);
  }
}

}  // namespace flashattn::cuda
