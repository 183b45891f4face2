// The Hopper FP8 forward's index algebra (src/cuda/sm90/fwd8_layout.h: Fwd8Shape and fwd8::) checked
// on the host, without a GPU, against models of the hardware written again here from the PTX
// ISA and the tensor-map documentation (not shared with the kernel):
//  - the copy engine's 128- and 64-byte swizzles, per box row;
//  - a K-major wgmma operand read through a matrix descriptor (start, stride offset, swizzle);
//  - the f32 accumulator layout of an m64nN product and the 8-bit A fragment of m64nNk32.
// Bytes carry tags (a key, a head-dim column, a row) instead of values, so each check names
// which element reaches which product term: for O += P V, at every K position of every k32
// step, the key whose P the A fragment holds must be the key whose V row the transposed tile
// (the kernel's own transpose code, run here) holds in every column, in the right column; for
// S = Q K^T, the same head-dim column of Q and K.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda/sm90/fwd8_layout.h"

namespace {

namespace fwd8 = flashattn::cuda::sm90::fwd8;
using flashattn::cuda::sm90::Fwd8Shape;

// The copy engine's write of box row r, byte c under CU_TENSOR_MAP_SWIZZLE_{128B,64B} with rows
// of that width: 16-byte chunk c / 16 moves to chunk (c / 16) XOR (r mod 8) at 128 bytes, XOR
// ((r / 2) mod 4) at 64 (the pattern repeats every 1024 / 512 bytes).
uint32_t tma_offset(int r, int c, int row_bytes) {
  const int chunk = c / 16;
  const int swz = row_bytes == 128 ? chunk ^ (r % 8) : chunk ^ ((r / 2) % 4);
  return uint32_t(r * row_bytes + swz * 16 + c % 16);
}

// A K-major operand's element (row n, K-byte k < 32) as wgmma reads it through a descriptor:
// pre-swizzle address start + (n / 8) * stride + (n % 8) * row_bytes + k, then the swizzle on the
// address bits (128B: bits 4-6 ^= bits 7-9; 64B: bits 4-5 ^= bits 7-8). `start` is relative to a
// 1024-byte aligned tile.
uint32_t desc_offset(uint32_t start, int n, int k, int row_bytes, int stride) {
  const uint32_t a = start + uint32_t((n / 8) * stride + (n % 8) * row_bytes + k);
  const uint32_t mask = row_bytes == 128 ? 7u : 3u;
  return a ^ (((a >> 7) & mask) << 4);
}

// f32 accumulator of m64nN, lane 4g + t of warp w: element 4c + 2h + e is row 16w + g + 8h,
// column 8c + 2t + e.
int acc_row(int w, int lane, int idx) { return 16 * w + lane / 4 + 8 * ((idx / 2) % 2); }
int acc_col(int lane, int idx) { return 8 * (idx / 4) + 2 * (lane % 4) + idx % 2; }
// 8-bit A fragment of m64nNk32: word q byte b of lane 4g + t of warp w is row 16w + g + 8 (q % 2),
// K-byte 16 (q / 2) + 4t + b.
int frag_row(int w, int lane, int q) { return 16 * w + lane / 4 + 8 * (q % 2); }
int frag_k(int lane, int q, int b) { return 16 * (q / 2) + 4 * (lane % 4) + b; }

TEST(Fp8Sm90Layout, KeyPermutationIsABijection) {
  std::vector<int> seen(32, 0);
  for (int u = 0; u < 32; ++u) {
    EXPECT_EQ(fwd8::key_of_k(fwd8::k_of_key(u)), u);
    ++seen[static_cast<size_t>(fwd8::k_of_key(u))];
  }
  for (int k = 0; k < 32; ++k) EXPECT_EQ(seen[static_cast<size_t>(k)], 1) << k;
}

// ldmatrix.sync.aligned.m8n8.x4.trans.b16 and stmatrix.sync.aligned.m8n8.x4.b16 on a byte image
// (PTX ISA, "warp-level matrix load / store"): matrix m's eight rows of 16 bytes (eight 16-bit
// elements) start at the addresses lanes 8m .. 8m + 7 give. ldmatrix without .trans hands lane
// 4g + t, in r[m], row g's elements 2t and 2t + 1; .trans hands it the transpose's: column g of
// rows 2t (low half) and 2t + 1 (high half). stmatrix stores lane 4g + t's r[m] as row g's
// elements 2t, 2t + 1.
void ldmatrix_x4_trans(const std::vector<unsigned char>& mem, const uint32_t (&addr)[32], uint32_t (&r)[32][4]) {
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int m = 0; m < 4; ++m) {
      const uint32_t lo = addr[8 * m + 2 * t] + uint32_t(2 * g), hi = addr[8 * m + 2 * t + 1] + uint32_t(2 * g);
      r[lane][m] = uint32_t(mem[lo]) | uint32_t(mem[lo + 1]) << 8 | uint32_t(mem[hi]) << 16 | uint32_t(mem[hi + 1]) << 24;
    }
  }
}
void stmatrix_x4(std::vector<unsigned char>& mem, const uint32_t (&addr)[32], const uint32_t (&r)[32][4],
                 std::vector<int>* writes, uint32_t writes_base) {
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int m = 0; m < 4; ++m) {
      for (int b = 0; b < 4; ++b) {
        const uint32_t a = addr[8 * m + g] + uint32_t(4 * t + b);
        mem[a] = static_cast<unsigned char>(r[lane][m] >> (8 * b));
        ++(*writes)[a - writes_base];
      }
    }
  }
}

// One warp's item of the matrix transposer on a byte image (the kernel's offsets and byte
// permutes, the ISA's ldmatrix / stmatrix above).
template <typename T>
void matrix_item_on_host(std::vector<unsigned char>& smem, uint32_t vt0, int item, std::vector<int>* writes) {
  const fwd8::MatrixItem it = fwd8::matrix_item(unsigned(item), T::kBlockN);
  uint32_t ld[32], st[32], r[32][4], o[32][4];
  for (int lane = 0; lane < 32; ++lane) {
    ld[lane] = fwd8::ldsm_offset(it, lane, T::kRowBytes, T::kPanelBytesKV);
    st[lane] = vt0 + fwd8::stsm_offset(it, lane, T::kVtRowBytes, T::kPanelBytesVt);
  }
  ldmatrix_x4_trans(smem, ld, r);
  for (int lane = 0; lane < 32; ++lane) fwd8::matrix_vt_words(r[lane], o[lane], lane);
  stmatrix_x4(smem, st, o, writes, vt0);
}

// O += P V for one traits: the transposer's items cover Vt once, and every k32 step pairs P and
// V of the same key.
template <typename T>
void check_pv() {
  constexpr int kN = T::kBlockN, kD = T::kHeadDim;
  // V tile (keys x head-dim bytes, panels of kRowBytes columns) as the copy engine lays it, twice:
  // tagged with the key, and with the column.
  std::vector<unsigned char> v_key(T::kTileBytesV), v_col(T::kTileBytesV);
  for (int key = 0; key < kN; ++key) {
    for (int c = 0; c < kD; ++c) {
      const size_t off = size_t((c / T::kRowBytes) * T::kPanelBytesKV) + tma_offset(key, c % T::kRowBytes, T::kRowBytes);
      v_key[off] = static_cast<unsigned char>(key);
      v_col[off] = static_cast<unsigned char>(c);
    }
  }
  // One shared-memory image per tagging: V at 0, Vt after it (as the kernel's ring places them).
  const uint32_t vt0 = uint32_t(T::kTileBytesV);
  std::vector<unsigned char> smem_key(size_t(T::kTileBytesV + T::kTileBytesVt), 0xee), smem_col = smem_key;
  std::copy(v_key.begin(), v_key.end(), smem_key.begin());
  std::copy(v_col.begin(), v_col.end(), smem_col.begin());
  std::vector<int> writes(T::kTileBytesVt, 0);
  std::vector<int> writes_col(T::kTileBytesVt, 0);
  for (int item = 0; item < fwd8::matrix_items(kD, kN); ++item) {
    matrix_item_on_host<T>(smem_key, vt0, item, &writes);
    matrix_item_on_host<T>(smem_col, vt0, item, &writes_col);
  }
  for (size_t i = 0; i < writes.size(); ++i) ASSERT_EQ(writes[i], 1) << "Vt byte " << i;
  const std::vector<unsigned char> vt_key(smem_key.begin() + vt0, smem_key.end());
  const std::vector<unsigned char> vt_col(smem_col.begin() + vt0, smem_col.end());

  // Per warp and lane: which key's P each A-fragment byte holds (from the accumulator layout
  // through p_word / p_source), against the key Vt holds at that K position.
  for (int w = 0; w < 4; ++w) {
    for (int lane = 0; lane < 32; ++lane) {
      for (int kk = 0; kk < kN / 32; ++kk) {
        for (int hf = 0; hf < 2; ++hf) {
          for (int h = 0; h < 2; ++h) {
            const int q = fwd8::p_word(kk, hf, h) - 4 * kk;  // the word's place in the step's fragment
            for (int b = 0; b < 4; ++b) {
              const int idx = fwd8::p_source(kk, hf, h, b);
              ASSERT_LT(idx, kN / 2);
              ASSERT_EQ(acc_row(w, lane, idx), frag_row(w, lane, q)) << "row of P";
              const int key_p = acc_col(lane, idx);
              const int k = frag_k(lane, q, b);
              for (int n = 0; n < kD; ++n) {
                // The kernel's gemm_pv8 start for step kk: its Vt panel, 32 kk bytes into the row.
                const uint32_t start = uint32_t((32 * kk / T::kVtRowBytes) * T::kPanelBytesVt + 32 * kk % T::kVtRowBytes);
                const uint32_t off = desc_offset(start, n, k, T::kVtRowBytes, T::kVtSwizzlePeriod);
                ASSERT_EQ(int(vt_key[off]), key_p) << "kk " << kk << " k " << k << " n " << n << " lane " << lane;
                ASSERT_EQ(int(vt_col[off]), n) << "kk " << kk << " k " << k << " n " << n;
              }
            }
          }
        }
      }
    }
  }
}

// S = Q K^T: step (panel, kk) reads, at K-byte k, head-dim column panel * kRowBytes + 32 kk + k
// of Q's row m (A from shared memory, the consumer's 64 rows) and of K's row n.
template <typename T>
void check_qk() {
  std::vector<unsigned char> q_col(T::kTileBytesQ), q_row(T::kTileBytesQ), k_col(T::kTileBytesK), k_row(T::kTileBytesK);
  for (int m = 0; m < T::kBlockM; ++m) {
    for (int c = 0; c < T::kHeadDim; ++c) {
      const size_t off = size_t((c / T::kRowBytes) * T::kPanelBytesQ) + tma_offset(m, c % T::kRowBytes, T::kRowBytes);
      q_col[off] = static_cast<unsigned char>(c);
      q_row[off] = static_cast<unsigned char>(m);
    }
  }
  for (int n = 0; n < T::kBlockN; ++n) {
    for (int c = 0; c < T::kHeadDim; ++c) {
      const size_t off = size_t((c / T::kRowBytes) * T::kPanelBytesKV) + tma_offset(n, c % T::kRowBytes, T::kRowBytes);
      k_col[off] = static_cast<unsigned char>(c);
      k_row[off] = static_cast<unsigned char>(n);
    }
  }
  for (int consumer = 0; consumer < T::kConsumers; ++consumer) {
    for (int panel = 0; panel < T::kPanels; ++panel) {
      for (int kk = 0; kk < T::kRowBytes / 32; ++kk) {
        const uint32_t qa = uint32_t(consumer * 64 * T::kRowBytes + panel * T::kPanelBytesQ + 32 * kk);
        const uint32_t ka = uint32_t(panel * T::kPanelBytesKV + 32 * kk);
        for (int k = 0; k < 32; ++k) {
          const int col = panel * T::kRowBytes + 32 * kk + k;
          for (int m = 0; m < 64; ++m) {
            const uint32_t off = desc_offset(qa, m, k, T::kRowBytes, T::kSwizzlePeriod);
            ASSERT_EQ(int(q_col[off]), col);
            ASSERT_EQ(int(q_row[off]), consumer * 64 + m);
          }
          for (int n = 0; n < T::kBlockN; ++n) {
            const uint32_t off = desc_offset(ka, n, k, T::kRowBytes, T::kSwizzlePeriod);
            ASSERT_EQ(int(k_col[off]), col);
            ASSERT_EQ(int(k_row[off]), n);
          }
        }
      }
    }
  }
}

// The matrix transposer's offsets equal the plain formulas (copy-engine swizzle of V's key row, the kernel's Vt swizzle); each
// ldmatrix / stmatrix phase (one matrix: eight 16-byte rows) reaches 32 distinct banks.
template <typename T>
void check_matrix_offsets_and_banks() {
  for (int item = 0; item < fwd8::matrix_items(T::kHeadDim, T::kBlockN); ++item) {
    const fwd8::MatrixItem it = fwd8::matrix_item(unsigned(item), T::kBlockN);
    for (int lane = 0; lane < 32; ++lane) {
      const int m = lane / 8, i = lane % 8;
      const int key = it.kb + 8 * (m % 2) + i, d = it.d0 + 16 * (m / 2);
      ASSERT_EQ(fwd8::ldsm_offset(it, lane, T::kRowBytes, T::kPanelBytesKV),
                uint32_t((d / T::kRowBytes) * T::kPanelBytesKV) + tma_offset(key, d % T::kRowBytes, T::kRowBytes))
          << "item " << item << " lane " << lane;
      ASSERT_EQ(fwd8::stsm_offset(it, lane, T::kVtRowBytes, T::kPanelBytesVt),
                uint32_t((it.kb / T::kVtRowBytes) * T::kPanelBytesVt) +
                    fwd8::swizzled(it.d0 + fwd8::stsm_lane_row(lane), it.kb % T::kVtRowBytes, T::kVtRowBytes))
          << "item " << item << " lane " << lane;
    }
    for (int m = 0; m < 4; ++m) {
      std::vector<int> ld_banks(32, 0), st_banks(32, 0);
      for (int i = 0; i < 8; ++i) {
        const uint32_t ld = fwd8::ldsm_offset(it, 8 * m + i, T::kRowBytes, T::kPanelBytesKV);
        const uint32_t st = fwd8::stsm_offset(it, 8 * m + i, T::kVtRowBytes, T::kPanelBytesVt);
        for (uint32_t w = 0; w < 4; ++w) {
          ++ld_banks[(ld / 4 + w) % 32];
          ++st_banks[(st / 4 + w) % 32];
        }
      }
      for (int b = 0; b < 32; ++b) {
        ASSERT_EQ(ld_banks[size_t(b)], 1) << "ldmatrix item " << item << " matrix " << m << " bank " << b;
        ASSERT_EQ(st_banks[size_t(b)], 1) << "stmatrix item " << item << " matrix " << m << " bank " << b;
      }
    }
  }
}

TEST(Fp8Sm90Layout, MatrixTransposerOffsetsAndBanksD64) { check_matrix_offsets_and_banks<Fwd8Shape<64>>(); }
TEST(Fp8Sm90Layout, MatrixTransposerOffsetsAndBanksD128) { check_matrix_offsets_and_banks<Fwd8Shape<128>>(); }
TEST(Fp8Sm90Layout, MatrixTransposerOffsetsAndBanksD256) { check_matrix_offsets_and_banks<Fwd8Shape<256>>(); }

TEST(Fp8Sm90Layout, MatrixTransposerPairsTheSameKeyD64) { check_pv<Fwd8Shape<64>>(); }
TEST(Fp8Sm90Layout, MatrixTransposerPairsTheSameKeyD128) { check_pv<Fwd8Shape<128>>(); }
TEST(Fp8Sm90Layout, MatrixTransposerPairsTheSameKeyD256) { check_pv<Fwd8Shape<256>>(); }
TEST(Fp8Sm90Layout, QKReadsTheSameColumnD64) { check_qk<Fwd8Shape<64>>(); }
TEST(Fp8Sm90Layout, QKReadsTheSameColumnD128) { check_qk<Fwd8Shape<128>>(); }
TEST(Fp8Sm90Layout, QKReadsTheSameColumnD256) { check_qk<Fwd8Shape<256>>(); }

// The tiles the dev sweep may pick (fwd8_layout.h FLASHATTN_DEV_FP8_*; dev/NOTES.md): Vt in two
// or three panels, 192 query rows.
template <typename T>
void check_all() {
  check_pv<T>();
  check_matrix_offsets_and_banks<T>();
  check_qk<T>();
}
using flashattn::cuda::sm90::FwdTile;
TEST(Fp8Sm90Layout, SweepTilesD64) {
  check_all<Fwd8Shape<64, FwdTile{3, 128, 2, true}>>();
  check_all<Fwd8Shape<64, FwdTile{2, 192, 2, true}>>();
  check_all<Fwd8Shape<64, FwdTile{2, 256, 2, true}>>();
}
TEST(Fp8Sm90Layout, SweepTilesD128) {
  check_all<Fwd8Shape<128, FwdTile{2, 192, 2, true}>>();
  check_all<Fwd8Shape<128, FwdTile{2, 256, 2, true}>>();
}
TEST(Fp8Sm90Layout, SweepTilesD256) { check_all<Fwd8Shape<256, FwdTile{2, 128, 2, true}>>(); }

}  // namespace
