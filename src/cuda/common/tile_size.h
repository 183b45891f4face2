// Tile sizes of the sm80-class kernels, one table per kernel family. Each entry says why.
// Rows per warp = block_m / warps; every warp owns whole 16-row MMA tiles of Q (no cross-warp
// reduction in the forward). Registers per thread are the binding constraint: the O accumulator
// takes rows_per_warp * head_dim / 32 floats and S takes rows_per_warp * block_n / 32.
#pragma once

namespace flashattn::cuda {

struct FwdTile {
  int block_m;  // query rows per CTA
  int block_n;  // keys per K/V tile
  int warps;    // warps per CTA
  int min_ctas = 1;  // CTAs per SM the registers must allow (__launch_bounds__)
};

constexpr FwdTile fwd_tile(int head_dim, bool score_mods) {
#if defined(FLASHATTN_DEV_FWD_BM)
  // dev/ experiments only: -DFLASHATTN_DEV_FWD_{BM,BN,WARPS}=... override every head dim.
  if (head_dim > 0) return {FLASHATTN_DEV_FWD_BM, FLASHATTN_DEV_FWD_BN, FLASHATTN_DEV_FWD_WARPS};
#endif
  // d <= 64: 32 rows per warp halves shared-memory traffic per MMA (K/V fragments are reused
  //          by two row tiles); O (<= 64 regs) and S (64 regs) fit comfortably.
  if (head_dim <= 64) return {128, 64, 4};
  // d 96/128: same shape; O takes 96/128 registers, S 64, which is the most that fits under
  //           255 without spills (FlashAttention-2 settled on the same 128 x 64 x 4 warps).
  //           With score modifiers (softcap, ALiBi, dropout) the per-element work needs more
  //           live registers: 64-key tiles spill 200+ bytes there (ptxas, sm_90), 32-key tiles
  //           none.
  if (head_dim <= 128) return score_mods ? FwdTile{128, 32, 4} : FwdTile{128, 64, 4};
  // d 192/256: 16 rows per warp; 32 rows would need 192-256 registers for O alone.
  //           d256: 64 x 64 over 4 warps (FA2's shape): 96 KB of shared memory, so two CTAs
  //           share an SM and one's prologue and epilogue overlap the other's loop. With
  //           swizzled rows it measured 1.03-1.20x FA2 against 0.92-1.14x for 128 x 64 x 8
  //           (H200, bf16, 1k-16k; dev/results/h200-2026-11-29-ab-s6-*.json; padded rows had
  //           made it slower from 2k up). d192 (rows not swizzlable, unmeasured) keeps 128 x 64 x 8.
  if (head_dim > 192) return {64, 64, 4};
  return {128, 64, 8};
}

// With attn_bias, attn_mask or a block mask (ScoreMods::kBiasMask) each score also needs its
// row's bias, mask and block-state pointers and the key-tile walk next to the modifiers' state.
// At 32 rows per warp (the modifier tiles of fwd_tile) that spilled: d64 4 / 92 bytes (ptxas
// sm_80 / sm_90), d128 4 / 48 bytes. 16 rows per warp over 8 warps halves O's registers; the
// tile keeps 64 keys, so a 128 x 128 block (FlexAttention's) is two whole tiles. At d256 (16 rows
// per warp already) 64 keys spilled 92 bytes and 32 keys 8 (sm_80). The tiles below spill
// nothing at sm_80 or sm_90, at any head dim. Unmeasured on a GPU.
constexpr FwdTile fwd_bias_mask_tile(int head_dim) {
  if (head_dim <= 192) return {128, 64, 8};
  return {64, 16, 4};
}

// Decode-shaped forward (at most block_m query rows per (head, batch), e.g. one token, or the query
// heads of a GQA group folded into rows; folded tokens may take several such tiles): the warps
// share the block_m = 16 rows and split each K/V tile's keys between them (FwdTraits::kSplitKeys),
// merging their partial (O, max, sum) once at the end. The 128-row tile would spend 8x the
// tensor-core work on rows that do not exist, which bounded the split-KV forward at about 3 TB/s on
// H200 (0.66x FA2 at batch 8 and 64k-128k keys,
// bench/results/superseded/h200-2026-11-29-decode-0abcc38.json). Each warp keeps a 16-row O
// (head_dim / 8 registers) and 16 x block_n / warps scores, so registers are no constraint; block_n
// is as large as keeps three CTAs (68-72 KB of shared memory) on an sm90 SM, which keeps about 96
// KB of K/V copies in flight per SM; the registers are capped to match (168 per thread). At d > 128
// the 16-row O alone takes 96-128 registers, so two CTAs. Measured (d128, bf16, H200,
// bench/results/h200-2026-11-29-decode.json): 3.96-4.48 TB/s from batch 8 or 128k keys on,
// 1.00x FA2 at batch 8 and 1.6x at batch 64. d64 (256-key tiles) and d256 are unmeasured.
// With attn_bias / attn_mask / block masks (bias_mask) the tiles hold half the keys: under the
// 168-register cap the d64 256-key tile spilled 48 bytes (ptxas, sm_80), the d128 128-key
// tile 8 bytes (sm_90).
constexpr FwdTile fwd_decode_tile(int head_dim, bool bias_mask = false) {
  if (head_dim <= 64) return bias_mask ? FwdTile{16, 128, 4, 3} : FwdTile{16, 256, 4, 3};
  if (head_dim <= 128) return bias_mask ? FwdTile{16, 64, 4, 3} : FwdTile{16, 128, 4, 3};
  return {16, 64, 4, 2};
}

// The decode tile of an e4m3 KV cache read by 16-bit queries (FwdTraits::kFp8Cache): its K/V
// tiles hold one byte per element, so more keys per tile keep fwd_decode_tile's bytes (or more)
// in flight per CTA, as far as three CTAs (two at d256) still fit an sm90 SM's 228 KB with the
// page offsets shared by K and V (FwdTraits::smem_bytes; 8 bytes per key). Shared memory per CTA
// (Q + K/V + offsets): d64 320 keys 2 + 50 (rows padded to 80 bytes) + 5 = 57 KB; d128 256 keys
// 4 + 64 + 4 = 72 KB; d256 128 keys 8 + 64 + 2 = 74 KB (two CTAs; fewer keys would not hold the
// split-key merge, 48 KB). Registers (ptxas, sm_90, cap 168 at three CTAs) decided the rest:
// d64 x 384 keys spilled 36 bytes; at d128, 256 keys spilled 36 bytes with score modifiers
// (softcap, ALiBi) and 48 with the window mask, and 192 keys spilled 28 bytes, so those take
// fwd_decode_tile's 128 keys. Unmeasured on a GPU.
constexpr FwdTile fwd_fp8_cache_decode_tile(int head_dim, bool score_mods, bool window) {
  if (head_dim <= 64) return score_mods ? FwdTile{16, 256, 4, 3} : FwdTile{16, 320, 4, 3};
  if (head_dim <= 128) return score_mods || window ? FwdTile{16, 128, 4, 3} : FwdTile{16, 256, 4, 3};
  return {16, 128, 4, 2};
}

// An e4m3 KV cache read by 16-bit queries (FwdTraits::kFp8Cache) with more query rows than the
// decode tile takes (prefill or long speculative steps against the cache): the widening holds
// two k steps of Q fragments and four widened K fragments at once (common/warp_gemm_e4m3.h), so
// 32 rows per warp (fwd_tile's d <= 128 shape) spilled (d128: 64 bytes at sm_90, ptxas); 16 rows
// per warp over 8 warps do not. Unmeasured on a GPU.
constexpr FwdTile fwd_fp8_cache_tile(int head_dim) {
  if (head_dim > 192) return {64, 64, 4};
  return {128, 64, 8};
}

// Backward (FlashAttention-2 algorithm, sm80-class). One CTA per key block accumulates dK and dV
// in registers over the query blocks, so block_n * head_dim * 2 floats per CTA live in registers
// for the whole kernel: at 8 warps that is block_n * head_dim / 128 per thread, which is why
// block_n shrinks as head_dim grows. The three matrix products per step use their own warp grids:
//   S = Q K^T and dP = dO V^T   (block_m x block_n):   sdp_warps_m  x (warps / sdp_warps_m)
//   dV += P^T dO, dK += dS^T Q  (block_n x head_dim):  kv_warps_n   x (warps / kv_warps_n)
//   dQ = dS K                   (block_m x head_dim):  dq_warps_m   x (warps / dq_warps_m),
//                                                      in dq_chunks column passes
// Each warp tile must be a multiple of 16 rows and 16 columns (x4 ldmatrix loads two 8-wide
// tiles). Shared memory holds K, V, double-buffered Q and dO, P and dS: 130 / 166 / 139 / 163 /
// 169 / 211 KB for d 32 / 64 / 96 / 128 / 192 / 256 (d64/128/256 in swizzled rows without
// padding), inside the 227 KB an sm90 CTA may use. On A100 (163 KB) d32, d96 and d128 fit.
// With one Q/dO step buffer instead of two every head dim fits (BwdTraits::kSmemBytesSingle),
// and run_bwd uses it there.
struct BwdTile {
  int block_m;      // query rows per step
  int block_n;      // keys per CTA
  int warps;        // warps per CTA
  int sdp_warps_m;  // warps along query rows for S and dP
  int kv_warps_n;   // warps along keys for dK and dV
  int dq_warps_m;   // warps along query rows for dQ
  int dq_chunks;    // dQ is produced in this many column passes (bounds its registers)
  int mods_splits;  // with softcap / ALiBi / dropout, S and dP are produced in this many row
                    // slices of the warp tile (their temporaries need the registers)
  bool interleave;  // causal launches interleave their planes (cta_order.h; BwdTraits::kInterleave)
};

constexpr BwdTile bwd_tile(int head_dim) {
  // d32/64: dK+dV take 32/64 registers, so S and dP can be 128 x 128 (64 each): 128-row steps
  //         halve the barriers and per-step overhead per FLOP. S/dP warp tiles of 64 rows x 32
  //         keys; the 32 x 64 alternative (same shared-memory traffic) spills at d64 (ptxas sm90).
  //         With score modifiers the 64 rows go in two slices (d64: 136 -> 24 bytes of spills).
  // interleave: the causal start order of cta_order.h, whose CTA indices live in shared memory
  //             (bwd_kernel.h). Measured on H200 (bf16, 1k-16k, dev/results/
  //             h200-2026-11-29-ab-s10-*.json): d128 causal +1-6%; d64 causal -1-4% and d256
  //             causal -3-+2%, where reading the indices from shared memory costs what the order
  //             gains (the same reads made the non-causal kernels 3% slower, hence causal only).
  if (head_dim <= 64) return {128, 128, 8, 2, 4, 4, 1, 2, false};
  // d96/128: dK+dV take 96/128 registers, so the query step drops to 64 rows (S and dP 32
  //          each); 32 x 32 S tiles per warp, 32 keys x 48/64 columns of dK/dV per warp, and
  //          32 x 32 dQ tiles at d128 (the fewest ldmatrix per MMA that fit). Slicing S/dP for
  //          the modifiers removes the d96 spills; at d128 it removes the hot loop's reloads
  //          of the window kernel (6 -> 0 per step; no mask 5 -> 3) but costs 50% more ldmatrix
  //          on S and dP: backward 8-11% slower with softcap (H200, bf16, 2k/16k; dev/results/
  //          h200-2026-11-29-ab-s14-*.json), so d128 keeps one slice and its reloads.
  if (head_dim <= 96) return {64, 128, 8, 2, 4, 4, 1, 2, false};
  if (head_dim <= 128) return {64, 128, 8, 2, 4, 2, 1, 1, true};
  // d192/256: 64 keys per CTA keep dK+dV at 96/128 registers; at d256 dQ goes in four column
  //           passes (16 registers each) so nothing spills next to them in the plain kernels.
  //           S/dP warp tiles: 32 x 16 at d192, 16 x 32 at d256 (the same ldmatrix bytes per
  //           MMA; at d256 the 16 x 32 grid measured 1-3% faster on H200, dev/results/
  //           h200-2026-11-29-ab-s5-sdp4.json, d192 is unmeasured).
  if (head_dim <= 192) return {64, 64, 8, 2, 2, 2, 1, 1, false};
  return {64, 64, 8, 4, 2, 2, 4, 1, false};
}

// Deterministic dQ kernel of the backward: one CTA per query block recomputes S, P, dP and dS
// against every visible key block and keeps dQ in registers (no atomics, fixed order). Warps
// own 16-row slices like the forward; dQ takes head_dim / 8 registers per thread, S and dP
// block_n / 8 each, so block_n halves at d > 128.
struct BwdDqTile {
  int block_m;
  int block_n;
  int warps;
};

constexpr BwdDqTile bwd_dq_tile(int head_dim) {
  if (head_dim <= 128) return {64, 64, 4};
  return {64, 32, 4};
}

}  // namespace flashattn::cuda
