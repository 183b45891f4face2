// The fragment mapping of the forward against an e4m3 KV cache (src/cuda/common/warp_gemm_e4m3.h)
// checked on the host, without a GPU: ldmatrix (plain and .trans), prmt and mma.sync m16n8k16 are
// emulated here from the PTX ISA's fragment layouts (written again, not shared with the kernel),
// over tiles laid out by the kernel's own smem_layout.h layouts and addressed with its offset()
// and advance(). For each head dim's layout, S = Q K^T from Q's permuted columns and K's bytes,
// and O = P V from V's bytes, must equal the direct products, O in the columns o_col_e4m3 names.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/common/smem_layout.h"

namespace {

using flashattn::cuda::PaddedRows;
using flashattn::cuda::SwizzledRows;

// ldmatrix lane rows / 16-bit columns of kinds A and B (src/cuda/common/warp_gemm.h).
int row_a(int lane) { return lane % 8 + ((lane / 8) % 2) * 8; }
int col_a(int lane) { return (lane / 16) * 8; }
int row_b(int lane) { return lane % 8 + (lane / 16) * 8; }
int col_b(int lane) { return ((lane / 8) % 2) * 8; }

// Shared memory as bytes.
struct Smem {
  std::vector<uint8_t> bytes = std::vector<uint8_t>(1 << 16, 0);
  uint32_t word(uint32_t addr) const {
    return uint32_t(bytes[addr]) | uint32_t(bytes[addr + 1]) << 8 | uint32_t(bytes[addr + 2]) << 16 |
           uint32_t(bytes[addr + 3]) << 24;
  }
  uint16_t half(uint32_t addr) const { return uint16_t(bytes[addr] | bytes[addr + 1] << 8); }
};

// ldmatrix.x4 (b16): lane l reads the 16-byte row at addr[l]; matrix q's row i is lane 8q + i's.
// Plain: lane l receives in register q row l / 4's 32-bit word l % 4. .trans: the b16 elements
// (row 2(l % 4), column l / 4) in the low half and (row 2(l % 4) + 1, column l / 4) in the high.
void ldmatrix_x4(const Smem& m, const uint32_t (&addr)[32], bool trans, uint32_t (&r)[32][4]) {
  for (int l = 0; l < 32; ++l) {
    for (int q = 0; q < 4; ++q) {
      if (!trans) {
        r[l][q] = m.word(addr[8 * q + l / 4] + 4 * (l % 4));
      } else {
        const uint32_t lo = m.half(addr[8 * q + 2 * (l % 4)] + 2 * (l / 4));
        const uint32_t hi = m.half(addr[8 * q + 2 * (l % 4) + 1] + 2 * (l / 4));
        r[l][q] = lo | hi << 16;
      }
    }
  }
}

uint32_t prmt(uint32_t x, uint32_t selector) {  // __byte_perm(x, 0, selector)
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t s = (selector >> (4 * i)) & 7u;
    r |= (s < 4 ? (x >> (8 * s)) & 0xffu : 0u) << (8 * i);
  }
  return r;
}

// Cache "codes" here are small integers standing for e4m3 values (the widening is exact, so
// the value of a byte is all that matters): value(b) = b - 128.
double value(uint32_t byte) { return double(int(byte & 0xffu) - 128); }

// An emulated 16-bit register holds two values.
struct Pair {
  double lo, hi;
};
Pair widen(uint32_t two_codes) { return {value(two_codes), value(two_codes >> 8)}; }

// mma.m16n8k16: A (16 x 16) from the lanes' a[4] pairs, B (16 x 8) from b[2], C += A B in the
// C fragment (c0, c1: row g, columns 2t, 2t + 1; c2, c3: row g + 8).
void mma(double (&c)[32][4], const Pair (&a)[32][4], const Pair (&b)[32][2]) {
  double A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    const int rows[4] = {g, g + 8, g, g + 8}, ks[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
    for (int i = 0; i < 4; ++i) A[rows[i]][ks[i]] = a[l][i].lo, A[rows[i]][ks[i] + 1] = a[l][i].hi;
    B[2 * t][g] = b[l][0].lo, B[2 * t + 1][g] = b[l][0].hi;
    B[2 * t + 8][g] = b[l][1].lo, B[2 * t + 9][g] = b[l][1].hi;
  }
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
      for (int k = 0; k < 16; ++k) c[l][e] += A[row][k] * B[k][col];
    }
  }
}

// The kernel's column of O for accumulator (dt, e) of lane t (warp_gemm_e4m3.h o_col_e4m3).
int o_col(int dt, int e, int t) { return 16 * (dt / 2) + 4 * t + 2 * (e % 2) + dt % 2; }

// Q K^T for 16 rows x 16 keys and P V for 16 rows x 16 keys x kHeadDim columns, one warp.
template <int kHeadDim, typename KVLayout>
void check_products() {
  std::mt19937 rng(kHeadDim);
  std::uniform_int_distribution<int> byte(0, 255), small(-8, 8);
  constexpr int kKeys = 16;
  // Q values (16 x kHeadDim) and the K / V codes (kKeys x kHeadDim).
  std::vector<std::vector<double>> q(16, std::vector<double>(kHeadDim));
  std::vector<std::vector<uint8_t>> k(kKeys, std::vector<uint8_t>(kHeadDim)), v = k;
  for (auto& row : q) for (auto& x : row) x = small(rng);
  for (auto& row : k) for (auto& x : row) x = uint8_t(byte(rng));
  for (auto& row : v) for (auto& x : row) x = uint8_t(byte(rng));

  // Shared memory: K and V copied chunk by chunk as the kernel's load_rows places them (16-byte
  // chunk c of row r at KVLayout::offset(r, 8c), the 16-bit view of half the width); Q as
  // values after permute_q_e4m3 (word j of 16 columns holds original word 0 2 4 6 1 3 5 7), whose
  // ordinary A fragments (ldmatrix of Q, warp_gemm.h) are taken directly below.
  const uint32_t k_base = 0, v_base = 1 << 14;
  Smem m;
  for (int r = 0; r < kKeys; ++r) {
    for (int c = 0; c < kHeadDim / 16; ++c) {
      for (int b = 0; b < 16; ++b) {
        m.bytes[k_base + KVLayout::offset(r, 8 * c) + b] = k[r][16 * c + b];
        m.bytes[v_base + KVLayout::offset(r, 8 * c) + b] = v[r][16 * c + b];
      }
    }
  }
  std::vector<std::vector<double>> qp(16, std::vector<double>(kHeadDim));
  const int word_of[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < kHeadDim; ++c) {
      const int g = c / 16, j = (c % 16) / 2;
      qp[r][c] = q[r][16 * g + 2 * word_of[j] + c % 2];
    }
  }

  // S = Q K^T (warp_gemm_qk_e4m3, kMT = 1, kNT = 2).
  double s[2][32][4] = {};
  uint32_t k_addr[32];
  for (int l = 0; l < 32; ++l) k_addr[l] = k_base + KVLayout::offset(row_b(l), col_b(l));
  for (int kp = 0; kp < kHeadDim / 32; ++kp) {
    Pair a[2][32][4];  // k steps 2kp, 2kp + 1: Q' A fragments (a plain ldmatrix of Q' gives these)
    for (int step = 0; step < 2; ++step) {
      for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4, k0 = 16 * (2 * kp + step);
        const int rows[4] = {g, g + 8, g, g + 8}, ks[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
        for (int i = 0; i < 4; ++i) a[step][l][i] = {qp[rows[i]][k0 + ks[i]], qp[rows[i]][k0 + ks[i] + 1]};
      }
    }
    uint32_t addr[32], r[32][4];
    for (int l = 0; l < 32; ++l) addr[l] = KVLayout::advance(k_addr[l], 0, kp * 16);
    ldmatrix_x4(m, addr, false, r);
    Pair b[4][32][2];
    for (int l = 0; l < 32; ++l) {
      for (int qi = 0; qi < 4; ++qi) b[qi][l][0] = widen(r[l][qi]), b[qi][l][1] = widen(r[l][qi] >> 16);
    }
    mma(s[0], a[0], b[0]);
    mma(s[0], a[1], b[1]);
    mma(s[1], a[0], b[2]);
    mma(s[1], a[1], b[3]);
  }
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int nt = 0; nt < 2; ++nt) {
      for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e / 2), key = nt * 8 + 2 * t + e % 2;
        double want = 0.0;
        for (int c = 0; c < kHeadDim; ++c) want += q[row][c] * value(k[key][c]);
        ASSERT_EQ(s[nt][l][e], want) << "S row " << row << " key " << key;
      }
    }
  }

  // O = P V (warp_gemm_pv_e4m3, kMT = 1, one 16-key step). P in the C layout of two key tiles.
  std::vector<std::vector<double>> p(16, std::vector<double>(kKeys));
  for (auto& row : p) for (auto& x : row) x = small(rng);
  Pair a[32][4];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    a[l][0] = {p[g][2 * t], p[g][2 * t + 1]};
    a[l][1] = {p[g + 8][2 * t], p[g + 8][2 * t + 1]};
    a[l][2] = {p[g][8 + 2 * t], p[g][8 + 2 * t + 1]};
    a[l][3] = {p[g + 8][8 + 2 * t], p[g + 8][8 + 2 * t + 1]};
  }
  constexpr int kDT = kHeadDim / 8;
  std::vector<std::array<std::array<double, 4>, 32>> o(kDT);
  for (auto& tile : o) for (auto& lane : tile) lane.fill(0.0);
  uint32_t v_addr[32];
  for (int l = 0; l < 32; ++l) v_addr[l] = v_base + KVLayout::offset(row_a(l), col_a(l));
  for (int cp = 0; cp < kDT / 4; ++cp) {
    uint32_t addr[32], r[32][4];
    for (int l = 0; l < 32; ++l) addr[l] = KVLayout::advance(v_addr[l], 0, cp * 16);
    ldmatrix_x4(m, addr, true, r);
    for (int h = 0; h < 2; ++h) {
      Pair even[32][2], odd[32][2];
      for (int l = 0; l < 32; ++l) {
        const uint32_t x0 = prmt(r[l][2 * h], 0x3120u), x1 = prmt(r[l][2 * h + 1], 0x3120u);
        even[l][0] = widen(x0), even[l][1] = widen(x1);
        odd[l][0] = widen(x0 >> 16), odd[l][1] = widen(x1 >> 16);
      }
      double c_even[32][4] = {}, c_odd[32][4] = {};
      mma(c_even, a, even);
      mma(c_odd, a, odd);
      const int dt = 4 * cp + 2 * h;
      for (int l = 0; l < 32; ++l) {
        for (int e = 0; e < 4; ++e) o[dt][l][e] += c_even[l][e], o[dt + 1][l][e] += c_odd[l][e];
      }
    }
  }
  for (int dt = 0; dt < kDT; ++dt) {
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, t = l % 4;
      for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e / 2), col = o_col(dt, e, t);
        double want = 0.0;
        for (int key = 0; key < kKeys; ++key) want += p[row][key] * value(v[key][col]);
        ASSERT_EQ(o[dt][l][e], want) << "O row " << row << " column " << col << " (tile " << dt << ")";
      }
    }
  }
  // Every column is some tile's exactly once per lane quad.
  std::vector<int> hits(kHeadDim, 0);
  for (int dt = 0; dt < kDT; ++dt)
    for (int t = 0; t < 4; ++t)
      for (int e = 0; e < 2; ++e) ++hits[o_col(dt, e, t)];
  for (int c = 0; c < kHeadDim; ++c) EXPECT_EQ(hits[c], 1) << c;
}

// The KV layouts FwdTraits picks for an e4m3 cache: rows of kHeadDim bytes as 16-bit rows of
// kHeadDim / 2, swizzled at d128 / d256, padded by 16 bytes at d64.
TEST(E4M3Fragments, D64Padded) { check_products<64, PaddedRows<40>>(); }
TEST(E4M3Fragments, D128Swizzled) { check_products<128, SwizzledRows<64>>(); }
TEST(E4M3Fragments, D256Swizzled) { check_products<256, SwizzledRows<128>>(); }

}  // namespace
