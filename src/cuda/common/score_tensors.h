// The score modifiers read from tensors (ScoreMods::kBiasMask): attn_bias, attn_mask and the
// block mask's states, for the scores of one (sequence, head) (docs/SEMANTICS.md "Bias and
// masks"). Positions i, j are inside the sequence. Callers clamp rows past seqlen_q and keys
// past seqlen_k (the padding of a tile) to the last row / key: those scores are never stored or
// are masked by the key bound, and the clamp keeps every read inside the tensors without a
// branch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "core/params.h"
#include "cuda/common/tile_kind.h"
#include "cuda/ptx/cp_async.h"

namespace flashattn::cuda {

// One query row's pointers into attn_bias, attn_mask and the block states (null: not given),
// found once per row of a tile and reused for its keys. Everything else is read from the
// kernel's parameters (constant memory), which keeps the hot loop's registers for the tile.
struct ScoreRow {
  const char* bias;
  const uint8_t* mask;
  const uint8_t* states;
};

// Row i (clamped to the sequence: see above) of (sequence b, head h). Params: the forward's
// or the backward's kernel parameters (both carry the call's QKVParams and a block_tiles plan).
template <typename Params>
__device__ __forceinline__ ScoreRow score_row(const Params& p, int b, int h, int i) {
  ScoreRow r{nullptr, nullptr, nullptr};
  if (p.bias.defined()) {
    const int64_t size = p.bias.dtype == DType::kFloat32 ? 4 : 2;
    r.bias = static_cast<const char*>(p.bias.data) + (b * p.bias.batch + h * p.bias.head + i * p.bias.row) * size;
  }
  if (p.mask.defined()) {
    r.mask = static_cast<const uint8_t*>(p.mask.data) + b * p.mask.batch + h * p.mask.head + i * p.mask.row;
  }
  const BlockTilePlan& plan = p.block_tiles;
  if (plan.on()) {
    r.states = plan.states + (plan.plane(b, h, p.heads) * plan.q_blocks + i / p.block_size_q) * plan.k_blocks;
  }
  return r;
}

// attn_bias at (row, key j) in log2 units (scores are after scale_log2 / softcap there); the
// row has a bias. j clamped to the sequence.
__device__ __forceinline__ float bias_log2(const QKVParams& p, const ScoreRow& r, int j) {
  float x;
  if (p.bias.dtype == DType::kFloat32) {
    x = __ldg(reinterpret_cast<const float*>(r.bias) + j);
  } else if (p.bias.dtype == DType::kBFloat16) {
    x = __bfloat162float(__ldg(reinterpret_cast<const __nv_bfloat16*>(r.bias) + j));
  } else {
    x = __half2float(__ldg(reinterpret_cast<const __half*>(r.bias) + j));
  }
  return x * 1.4426950408889634f;  // log2(e)
}

// Bias tiles in shared memory (FwdTraits / BwdTraits::kBiasSmem, dev/NOTES.md "Bias tiles through
// shared memory"): the sm80 forward and backward copy each (query tile, key tile) tile of a
// 16-bit attn_bias into shared memory with cp.async, with the forward's K tile / the backward's
// step (Q, dO), and read it from there.

// Whether this call's attn_bias can be copied in 16-byte chunks: a 16-bit dtype (the call's),
// a 16-byte aligned base, every stride a multiple of 8 elements, and a key extent (seqlen_k;
// varlen: max_seqlen_k) that is a multiple of 8, so that a chunk holding any key inside the
// sequence lies inside its row. Otherwise the kernel reads the bias per element (bias_log2).
__device__ __forceinline__ bool bias_tile_copyable(const QKVParams& p) {
  const Broadcast4& b = p.bias;
  return b.defined() && b.dtype != DType::kFloat32 && reinterpret_cast<uintptr_t>(b.data) % 16 == 0 &&
         (b.batch | b.head | b.row) % 8 == 0 && p.seqlen_k % 8 == 0;
}

// Two adjacent 16-bit attn_bias elements as packed in memory (key 2c low, 2c + 1 high) in log2
// units, rounded as bias_log2 rounds them.
template <typename Element>
__device__ __forceinline__ float2 bias_pair_log2(uint32_t w) {
  float lo, hi;
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xffff0000u);
  } else {
    lo = __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
    hi = __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
  }
  return make_float2(lo * 1.4426950408889634f, hi * 1.4426950408889634f);  // log2(e)
}

// Byte offset from a bias tile (rows of kKeys 16-bit elements, kKeys % 64 == 0) of row r's
// 16-byte chunk c: chunk bits 0-2 XOR row % 8, so that a warp's reads of one mma accumulator
// tile (rows g of an 8-row group, chunk c, word t) hit 32 distinct banks.
template <int kKeys>
__device__ __forceinline__ uint32_t bias_smem_offset(int r, int c) {
  static_assert(kKeys % 64 == 0, "rows of whole 8-chunk groups");
  return uint32_t(r * kKeys * 2 + ((c ^ (r & 7)) << 4));
}

// Copies the attn_bias tile of (sequence b, head h, rows [m0, m0 + kRows), keys [n0, n0 + kKeys))
// into shared memory at s_bias (bias_smem_offset) with cp.async, 16 bytes a chunk; rows at or
// past seqlen_q and chunks at or past seqlen_k are zero-filled (their scores are never stored or
// are masked by the key bound, which overrides the bias). The bias passed bias_tile_copyable.
// Thread tid owns chunk tid % kChunks of rows tid / kChunks + p * kRowsPerPass, one pointer
// stepping down the rows.
template <int kRows, int kKeys, int kThreads>
__device__ __forceinline__ void load_bias_tile(uint32_t s_bias, const QKVParams& p, int b, int h, int m0, int n0,
                                               int seqlen_q, int seqlen_k, int tid) {
  constexpr int kChunks = kKeys / 8;
  constexpr int kRowsPerPass = kThreads / kChunks;
  constexpr int kPasses = kRows / kRowsPerPass;
  static_assert(kRowsPerPass % 8 == 0 && kRows % kRowsPerPass == 0, "whole passes that keep row % 8");
  const int r0 = tid / kChunks;
  const int c = tid % kChunks;
  const int64_t pass_bytes = 2 * kRowsPerPass * p.bias.row;
  const char* g = static_cast<const char*>(p.bias.data) +
                  2 * (b * p.bias.batch + h * p.bias.head + (m0 + r0) * p.bias.row + n0 + c * 8);
  const bool key_in = n0 + c * 8 < seqlen_k;
  const uint32_t dst = s_bias + bias_smem_offset<kKeys>(r0, c);
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const bool valid = key_in && m0 + r0 + pass * kRowsPerPass < seqlen_q;
    ptx::cp_async_16(dst + uint32_t(pass * kRowsPerPass * kKeys * 2), valid ? g : p.bias.data, valid);
    g += pass_bytes;
  }
}

// Whether (row, key j) is hidden in a tile of `kind` (tile_kind.h hidden_in_tile: clean tiles
// read nothing, mask tiles attn_mask, mixed tiles the block state and then attn_mask where the
// block is partial; full blocks never read it). j clamped to the sequence.
__device__ __forceinline__ bool score_hidden(const QKVParams& p, const ScoreRow& r, int kind, int j) {
  return hidden_in_tile(kind, r.states, j, p.block_size_k, r.mask);
}

// -inf where the block mask hides the score, for the rows `row` and row + 8 of a wgmma
// accumulator tile (the Hopper kernels' S, rows are queries) of `kind` other than clean: element
// (row + 8h, key key0 + 8c + e) is x[4c + 2h + e], key0 = the tile's first key + 2 * (lane % 4);
// keys clamped to the sequence (keys past it are the window mask's). The tests go into a bit per
// score in a loop unrolled by 8 (unrolled whole, the check took most of the sparse forward's
// code), then the bits into the scores. The sm90 forward and the sm90 backward's dQ kernel.
template <int kBlockN, typename Params>
__device__ __forceinline__ void hide_blocked_scores(float (&x)[kBlockN / 2], const Params& params, int kind,
                                                    int batch, int head, int row, int key0, int seqlen_q,
                                                    int seqlen_k) {
  constexpr int kPerRow = kBlockN / 4;  // this thread's keys of one row
  static_assert(kPerRow <= 32, "one 32-bit word of bits per row");
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const ScoreRow r = score_row(params, batch, head, min(row + 8 * h, seqlen_q - 1));
    uint32_t hidden = 0;
#pragma unroll 8
    for (int c = 0; c < kPerRow; ++c) {
      hidden |= uint32_t(score_hidden(params, r, kind, min(key0 + 8 * (c / 2) + (c & 1), seqlen_k - 1))) << c;
    }
#pragma unroll
    for (int c = 0; c < kPerRow; ++c) {
      if ((hidden >> c) & 1u) x[4 * (c / 2) + 2 * h + (c & 1)] = -INFINITY;
    }
  }
}

// The key tiles one CTA visits under a block mask: its plan's list (descending tile index),
// from the first entry below n_hi (tiles past this CTA's split, window or sequence are never
// read), walked in order; the caller stops below its n_lo.
struct TileWalk {
  const int32_t* next_entry = nullptr;
  const int32_t* end = nullptr;

  // The next listed tile and its kind; -1 past the end.
  __device__ __forceinline__ int next(int* kind) {
    if (next_entry == end) return -1;
    const int32_t e = __ldg(next_entry++);
    *kind = e >> kTileKindShift;
    return e & kTileIndexMask;
  }
};

__device__ __forceinline__ TileWalk tile_walk(const BlockTilePlan& plan, int b, int h, int heads, int m_block,
                                              int n_hi) {
  const int32_t* list = plan.lists + (plan.plane(b, h, heads) * plan.m_tiles + m_block) * int64_t(plan.n_tiles + 1);
  const int32_t* entries = list + 1;
  const int count = __ldg(list);
  const int first = first_tile_below(count, n_hi, [&](int e) { return __ldg(entries + e); });
  return TileWalk{entries + first, entries + count};
}

}  // namespace flashattn::cuda
