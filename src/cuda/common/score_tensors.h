// The score modifiers read from tensors (ScoreMods::kBiasMask): attn_bias, attn_mask and the
// block mask's states, for the scores of one (sequence, head) (docs/SEMANTICS.md "Bias and
// masks"). Positions i, j are inside the sequence. Rows past seqlen_q and keys past seqlen_k
// (the padding of a tile) read the last row / key instead: those scores are never stored or
// are masked by the key bound, and the clamp keeps every read inside the tensors without a
// branch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "core/params.h"
#include "cuda/common/tile_kind.h"

namespace flashattn::cuda {

struct ScoreTensors {
  const char* bias = nullptr;  // this (sequence, head)'s plane of attn_bias; null = none
  int64_t bias_row = 0;        // elements
  DType bias_dtype = DType::kFloat32;
  const uint8_t* mask = nullptr;  // attn_mask's plane; null = none
  int64_t mask_row = 0;
  const uint8_t* states = nullptr;  // BlockTilePlan::states of this plane; null = no block mask
  int32_t k_blocks = 0, block_q = 1, block_k = 1;
  int last_i = 0, last_j = 0;  // seqlen_q - 1, seqlen_k - 1

  // One query row's pointers, found once per row and reused for its keys.
  struct Row {
    const char* bias;
    const uint8_t* mask;
    const uint8_t* states;
  };

  __device__ __forceinline__ Row row(int i) const {
    const int64_t r = min(i, last_i);
    const int64_t size = bias_dtype == DType::kFloat32 ? 4 : 2;
    return Row{bias == nullptr ? nullptr : bias + r * bias_row * size, mask == nullptr ? nullptr : mask + r * mask_row,
               states == nullptr ? nullptr : states + r / block_q * k_blocks};
  }

  // attn_bias at (row, j), in log2 units (scores are after scale_log2 / softcap there).
  __device__ __forceinline__ float bias_log2(const Row& r, int j) const {
    const int64_t c = min(j, last_j);
    float x;
    if (bias_dtype == DType::kFloat32) {
      x = __ldg(reinterpret_cast<const float*>(r.bias) + c);
    } else if (bias_dtype == DType::kBFloat16) {
      x = __bfloat162float(__ldg(reinterpret_cast<const __nv_bfloat16*>(r.bias) + c));
    } else {
      x = __half2float(__ldg(reinterpret_cast<const __half*>(r.bias) + c));
    }
    return x * 1.4426950408889634f;  // log2(e)
  }

  // Whether (row, j) is hidden in a tile of `kind` (block_tiles.h): clean tiles hide nothing;
  // mask tiles lie in partial blocks (attn_mask decides); mixed tiles look up the block state,
  // and attn_mask is read only where the block is partial (full blocks never read it).
  __device__ __forceinline__ bool hidden(const Row& r, int kind, int j) const {
    const int64_t c = min(j, last_j);
    const auto mask_drops = [&] { return r.mask != nullptr && __ldg(r.mask + c) == 0; };
    if (kind == kTileMask) return mask_drops();
    if (kind == kTileMixed) {
      const uint8_t s = __ldg(r.states + c / block_k);
      return s == kBlockAbsent || (s == kBlockPartial && mask_drops());
    }
    return false;
  }
};

// The tensors of (sequence b, head h) with lengths seqlen_q, seqlen_k.
__device__ __forceinline__ ScoreTensors score_tensors(const ForwardParams& p, int b, int h, int seqlen_q,
                                                      int seqlen_k) {
  ScoreTensors t;
  if (p.bias.defined()) {
    t.bias_dtype = p.bias.dtype;
    const int64_t size = p.bias.dtype == DType::kFloat32 ? 4 : 2;
    t.bias = static_cast<const char*>(p.bias.data) + (b * p.bias.batch + h * p.bias.head) * size;
    t.bias_row = p.bias.row;
  }
  if (p.mask.defined()) {
    t.mask = static_cast<const uint8_t*>(p.mask.data) + b * p.mask.batch + h * p.mask.head;
    t.mask_row = p.mask.row;
  }
  const BlockTilePlan& plan = p.block_tiles;
  if (plan.on()) {
    t.states = plan.states + plan.plane(b, h, p.heads) * plan.q_blocks * plan.k_blocks;
    t.k_blocks = plan.k_blocks;
    t.block_q = p.block_size_q;
    t.block_k = p.block_size_k;
  }
  t.last_i = seqlen_q - 1;
  t.last_j = seqlen_k - 1;
  return t;
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
  // Binary search: causal and split-KV CTAs start deep in the list, and a linear skip would
  // cost one dependent load per skipped tile.
  int lo = 0, hi = __ldg(list);
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if ((__ldg(entries + mid) & kTileIndexMask) >= n_hi) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return TileWalk{entries + lo, entries + __ldg(list)};
}

}  // namespace flashattn::cuda
