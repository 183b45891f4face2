// The two products of the forward against an e4m3 KV cache read by 16-bit queries
// (FwdTraits::kFp8Cache): K and V stay one byte per element in shared memory and are widened
// exactly to the queries' type on their way from shared memory into the mma.sync fragments.
//
// Why widen in registers rather than in a shared-memory conversion pass: a pass would read
// every cache byte from shared memory, write it back as two bytes and read those again with
// ldmatrix (5 bytes of shared-memory traffic per element on top of cp.async's 1, against 3
// here), add a barrier per tile and need a second, 16-bit copy of each tile (the decode tile
// would drop from three CTAs per SM to two). Widening costs one cvt per pair of elements
// (cvt.rn.f16x2.e4m3x2; K under bf16 queries adds an f16 -> f32 -> bf16 round trip, exact: two
// HADD2.F32 and one F2FP per pair) and, for V, one prmt per two pairs, on registers that ldmatrix fills at half the instruction count of the
// 16-bit path (one x4 ldmatrix of e4m3 feeds four mma.sync instead of two).
//
// The fragment mapping. The e4m3 tiles are stored as 16-bit tiles of half the width (two
// codes per 16-bit "element"), so the copies, the swizzled / padded layouts and the ldmatrix
// addressing of warp_gemm.h apply unchanged; ldmatrix then hands each lane four bytes where
// the 16-bit mma expects two pairs laid out differently, and the products absorb that:
//  * S = Q K^T. A plain ldmatrix of the K tile gives lane (g, t) the bytes k = 16c + 4t .. 4t+3
//    of key g in k step c, which widen to the B fragment {k 16c+4t, +1 | k 16c+4t+2, +3}: the
//    mma's k order 2t, 2t+1 | 2t+8, 2t+9 is permuted within each 16 columns. A dot product
//    does not care in which order its terms come, as long as Q's columns follow the same
//    permutation: permute_q_e4m3 rewrites the Q tile once per CTA so that the ordinary A
//    fragments (ldmatrix of Q) carry Q's columns in K's order.
//  * O = P V. A .trans ldmatrix of the V tile [key][d] gives lane (g, t) the bytes
//    {V[2t][2g], V[2t][2g+1], V[2t+1][2g], V[2t+1][2g+1]} of a 16-column chunk; one prmt makes
//    the pairs (V[2t][2g], V[2t+1][2g]) and (V[2t][2g+1], V[2t+1][2g+1]): the B fragments of two
//    8-wide d tiles, one holding the chunk's even columns, one its odd columns. So O's
//    accumulator tile 2c holds chunk c's even columns and tile 2c + 1 its odd ones:
//    element (dt, e) of lane (g, t) is column o_col_e4m3(dt, e, t), which the epilogue uses.
//    P V runs in float16 whatever the queries' type: V's e4m3 values are exact in it (one cvt
//    per pair, no bf16 round trip: under bf16 queries that halves the widening of V), and P
//    (at most 2^8 after the lazy rescale of fwd_kernel.h) rounds finer in float16 than in
//    bfloat16 down to 2^-14 of the row's kept maximum (below 2^-24 it counts as 0).
#pragma once

#include <cstdint>

#include "cuda/common/warp_gemm.h"
#include "cuda/ptx/fp8.h"
#include "cuda/ptx/ldmatrix.h"
#include "cuda/ptx/math.h"
#include "cuda/ptx/mma.h"

namespace flashattn::cuda {

// The B fragment {low pair, high pair} of a 32-bit register holding four e4m3 codes.
template <typename Element>
__device__ __forceinline__ void widen_b_frag(uint32_t (&b)[2], uint32_t lo_pair_codes, uint32_t hi_pair_codes) {
  b[0] = ptx::widen_e4m3x2<Element>(static_cast<uint16_t>(lo_pair_codes & 0xffffu));
  b[1] = ptx::widen_e4m3x2<Element>(static_cast<uint16_t>(hi_pair_codes & 0xffffu));
}

// Column of O that accumulator element e (0..3: n = 2t + e % 2, rows g / g + 8) of 8-wide tile dt
// of lane (g, t) holds after warp_gemm_pv_e4m3: chunk dt / 2, its even (dt even) or odd columns.
__device__ __forceinline__ int o_col_e4m3(int dt, int e, int t) {
  return 16 * (dt / 2) + 4 * t + 2 * (e % 2) + dt % 2;
}

// Permutes the columns of a 16-bit Q tile (kRows x kHeadDim in Layout) within every 16 columns
// to the order of K's fragments above: 32-bit word j of the 16 columns (columns 2j, 2j + 1)
// becomes word 2j (j < 4) or 2(j - 4) + 1 (j >= 4) of the original, i.e. the new word order is
// 0 2 4 6 1 3 5 7. Each thread rewrites whole 16-column groups; the caller brackets the call
// with barriers (the tile has landed before, nobody reads it until after).
template <int kRows, int kHeadDim, int kThreads, typename Layout, typename Element>
__device__ __forceinline__ void permute_q_e4m3(Element* sq, int tid) {
  constexpr int kGroups = kHeadDim / 16;
#pragma unroll
  for (int i = tid; i < kRows * kGroups; i += kThreads) {
    const int r = i / kGroups;
    const int c = (i % kGroups) * 16;
    uint4* lo = reinterpret_cast<uint4*>(Layout::at(sq, r, c));
    uint4* hi = reinterpret_cast<uint4*>(Layout::at(sq, r, c + 8));
    const uint4 a = *lo, b = *hi;
    *lo = make_uint4(a.x, a.z, b.x, b.z);
    *hi = make_uint4(a.y, a.w, b.y, b.w);
  }
}

// acc[kMT][kNT] += Q K^T over kHeadDim columns: Q 16-bit, permuted by permute_q_e4m3, stored
// [m][k] (a_addr kind A, Element units); K e4m3 stored [n][k] as a 16-bit tile of kHeadDim / 2
// columns (b_addr kind B of LayoutB). One x4 ldmatrix of K serves two key tiles x two k steps.
template <typename Element, int kMT, int kNT, int kHeadDim, typename LayoutA, typename LayoutB>
__device__ __forceinline__ void warp_gemm_qk_e4m3(float (&acc)[kMT][kNT][4], uint32_t a_addr, uint32_t b_addr) {
  static_assert(kHeadDim % 32 == 0 && kNT % 2 == 0, "x4 ldmatrix of K covers 16 keys x 32 columns");
#pragma unroll
  for (int kp = 0; kp < kHeadDim / 32; ++kp) {
    uint32_t a0[kMT][4], a1[kMT][4];  // k steps 2kp, 2kp + 1
    load_a_frags<Element, kMT, SmemMajor::kOuter, LayoutA>(a0, a_addr, 2 * kp);
    load_a_frags<Element, kMT, SmemMajor::kOuter, LayoutA>(a1, a_addr, 2 * kp + 1);
#pragma unroll
    for (int nt = 0; nt < kNT; nt += 2) {
      // Kind B: matrices (keys 0-7, step 2kp), (keys 0-7, step 2kp+1), (keys 8-15, 2kp), (8-15, 2kp+1).
      uint32_t r[4];
      ptx::ldmatrix_x4(r, LayoutB::advance(b_addr, nt * 8, kp * 16));
      uint32_t b[4][2];
#pragma unroll
      for (int q = 0; q < 4; ++q) widen_b_frag<Element>(b[q], r[q], r[q] >> 16);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        ptx::mma_m16n8k16<Element>(acc[mt][nt], a0[mt], b[0]);
        ptx::mma_m16n8k16<Element>(acc[mt][nt], a1[mt], b[1]);
        ptx::mma_m16n8k16<Element>(acc[mt][nt + 1], a0[mt], b[2]);
        ptx::mma_m16n8k16<Element>(acc[mt][nt + 1], a1[mt], b[3]);
      }
    }
  }
}

// acc[kMT][kDT] += P V: P the f32 scores of kKSteps 16-key steps (two adjacent 8-key tiles per
// step, rounded to float16: see above), V e4m3 stored [key][d] as a 16-bit tile of kDT * 4
// columns (b_addr kind A of LayoutB, read with .trans). Tile dt of acc holds the columns
// o_col_e4m3 names. One x4 ldmatrix of V serves 16 keys x 32 columns (four d tiles).
template <int kMT, int kDT, int kKSteps, typename LayoutB>
__device__ __forceinline__ void warp_gemm_pv_e4m3(float (&acc)[kMT][kDT][4], const float (&p)[kMT][2 * kKSteps][4],
                                                  uint32_t b_addr) {
  static_assert(kDT % 4 == 0, "x4 ldmatrix of V covers 32 columns");
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    uint32_t a[kMT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      a[mt][0] = ptx::pack2<__half>(p[mt][2 * kk][0], p[mt][2 * kk][1]);
      a[mt][1] = ptx::pack2<__half>(p[mt][2 * kk][2], p[mt][2 * kk][3]);
      a[mt][2] = ptx::pack2<__half>(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
      a[mt][3] = ptx::pack2<__half>(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
    }
#pragma unroll
    for (int cp = 0; cp < kDT / 4; ++cp) {
      // Kind A, .trans: matrices (keys 0-7, chunk 2cp), (keys 8-15, 2cp), (0-7, 2cp+1), (8-15, 2cp+1).
      uint32_t r[4];
      ptx::ldmatrix_x4_trans(r, LayoutB::advance(b_addr, kk * 16, cp * 16));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // Bytes {V[2t][2g], V[2t][2g+1], V[2t+1][2g], V[2t+1][2g+1]} -> low 16 bits: column 2g
        // of keys 2t, 2t + 1; high 16 bits: column 2g + 1.
        const uint32_t x0 = __byte_perm(r[2 * h], 0u, 0x3120u);      // keys 0-7 of the step
        const uint32_t x1 = __byte_perm(r[2 * h + 1], 0u, 0x3120u);  // keys 8-15
        uint32_t even[2], odd[2];
        widen_b_frag<__half>(even, x0, x1);
        widen_b_frag<__half>(odd, x0 >> 16, x1 >> 16);
        const int dt = 4 * cp + 2 * h;
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          ptx::mma_m16n8k16<__half>(acc[mt][dt], a[mt], even);
          ptx::mma_m16n8k16<__half>(acc[mt][dt + 1], a[mt], odd);
        }
      }
    }
  }
}

}  // namespace flashattn::cuda
