// The Hopper backward under a block mask (BwdSparseTraits, bwd_kernel.h): the plan's lists as
// the kernels get them, the step hand-over between the producer, the consumers and the fused
// kernel's dQ writer, the producer's walk, and the element checks of mask and mixed tiles.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/common/score_tensors.h"
#include "cuda/common/tile_kind.h"
#include "cuda/sm80/bwd_common.h"  // BwdKernelParams

namespace flashattn::cuda::sm90 {

// The block-sparse backward's plan (build_tile_lists, both 16-byte aligned in the workspace;
// null without a block mask): the dK/dV kernel's key-major lists for its kKvBlockM x kKvBlockN
// tiling, and in deterministic mode the dQ kernel's query-major lists for kDqBlockM x kDqBlockN.
// Tile counts of each tiling over the longest sequences.
struct BwdSparseLists {
  const int32_t* kv = nullptr;
  const int32_t* dq = nullptr;
  int32_t kv_m_tiles = 0, kv_n_tiles = 0, dq_m_tiles = 0, dq_n_tiles = 0;
};

namespace bwd90 {

// Traits::kSparse: a stage's step as the producer hands it to the consumers, written before the
// stage's "full" arrival (which releases it) and read after their wait for it: the list entry
// (tile index | kind << kTileKindShift, kLastStep on the CTA's last step; kNoStep in stage 0 when
// the CTA has no step at all) and, in the dK/dV kernel, the query head. So the consumers walk
// exactly the producer's steps without a global read, and a step they never see costs nothing.
struct SparseSlot {
  int entry;
  int head;
};
constexpr int kLastStep = 1 << 30;
constexpr int kNoStep = 1 << 29;  // above every entry (tile indices < 2^24, kinds < 4)

// A slot word (>= 0) in a uniform register of every lane: lane 0 alone reads it and redux.sync
// spreads it, so the reader is the lane whose arrival frees the stage (the sparse forward's
// uniform_word: with every lane reading, racecheck reported WAR hazards there, the other lanes'
// reads being ordered before lane 0's arrival only through the redux, which it does not track;
// dev/NOTES.md, "Ninth session").
__device__ __forceinline__ int slot_word(const int* word, int lane) {
  return int(__reduce_max_sync(0xffffffffu, lane == 0 ? unsigned(*word) : 0u));
}

// The fused kernel's hand-over of a step's dQ part: consumer 0 also tells the dQ writer which
// step it is (slot entry and head as the producer gave them, or kNoStep), before the "part
// full" arrival; the fence orders the write before it (bar.arrive alone does not wait for it).
__device__ __forceinline__ void post_step(SparseSlot* writer_slot, int consumer, int tid_wg, int entry, int head) {
  if (consumer == 0 && tid_wg == 0) {
    writer_slot->entry = entry;
    writer_slot->head = head;
    __threadfence_block();
  }
}

// The dK/dV kernel's steps under a block mask: (query head, query tile) pairs, head by head, the
// tiles of a head in its list's order (descending), within the window's [m_lo, m_hi) of this key
// tile. Walked by the producer alone, which loads them; the consumers get them from it
// (SparseSlot), and the fused kernel's dQ writer from consumer 0 (post_step). `head` is head_end
// when no step is left.
struct KvStep {
  int head, index, entry;
};
struct KvStepWalk {
  // Parameter-space references and three ints: the list of a head is found again at each step
  // (a few integer products, the CTA's indices read again) rather than kept, as the producer warp
  // has 24 registers (kept, they spilled).
  const BwdKernelParams& params;
  const BwdSparseLists& lists;
  int head_end, m_lo, m_hi;

  // This key tile's (blockIdx.x) list for `head` of this sequence (blockIdx.z): the block-sparse
  // launch keeps the plain CTA order (cta_group_planes 1, bwd_launch.h), where blockIdx is the slot.
  __device__ __forceinline__ const int32_t* list(int head) const {
    const int64_t plane = params.block_tiles.plane(blockIdx.z, head, params.heads);
    return lists.kv + (plane * lists.kv_n_tiles + blockIdx.x) * (lists.kv_m_tiles + 1);
  }
  // The first step at or after entry `index` of `head`'s list (index < 0: its first below m_hi,
  // found by a binary search, since a causal key tile's list may start far above its range).
  __device__ __forceinline__ KvStep seek(int head, int index) const {
    for (; head < head_end; ++head, index = -1) {
      const int32_t* l = list(head);
      const int count = __ldg(l);
      if (index < 0) index = first_tile_below(count, m_hi, [&](int e) { return __ldg(l + 1 + e); });
      if (index < count) {
        const int entry = __ldg(l + 1 + index);
        if ((entry & kTileIndexMask) >= m_lo) return {head, index, entry};
      }
    }
    return {head_end, 0, 0};
  }
  __device__ __forceinline__ KvStep first(int head_begin) const { return seek(head_begin, -1); }
  __device__ __forceinline__ KvStep next(const KvStep& s) const { return seek(s.head, s.index + 1); }
  __device__ __forceinline__ bool valid(const KvStep& s) const { return s.head < head_end; }
};

// Traits::kSparse: -inf where the block mask hides a score of a dK/dV step tile of `kind` other
// than clean (score_hidden: a mask tile reads attn_mask, a mixed one its block states and then
// attn_mask where partial; the forward's and the sm80 backward's rule). S^T in accumulator order:
// element (key `key` + 8h, query m0 + 8c + 2t4 + e) is x[4c + 2h + e]. Rows and keys are clamped
// to the sequence for the reads only: rows past it have P = 0 through their LSE (+inf), keys past
// it have P forced to 0 (fused) or their dK/dV rows dropped. The tests go into one bit per score
// in a loop unrolled by 4, then the bits into the scores, as the forward does (score_tensors.h,
// hide_blocked_scores: unrolled whole the check dominated the code). Bit 2r + h is the score of
// key `key` + 8h and the thread's r-th query row, m0 + 8(r / 2) + 2t4 + (r & 1), which is
// x[4(r / 2) + 2h + (r & 1)]: 32 bits at 64-row steps, 64 at 128 (BwdTraitsBody::kRowSteps128),
// so a step's bits stay in one word (two registers at 128) across the loop.
template <int kBlockM>
__device__ __forceinline__ void hide_blocked_keys(float (&x)[kBlockM / 2], const BwdKernelParams& params, int kind,
                                                  int batch, int head, int m0, int key, int t4, int seqlen_q,
                                                  int seqlen_k) {
  constexpr int kRows = kBlockM / 4;  // this thread's query rows: 8c + 2t4 + e
  using Bits = std::conditional_t<(2 * kRows > 32), uint64_t, uint32_t>;
  static_assert(2 * kRows <= 8 * int(sizeof(Bits)), "one word of bits");
  const int j0 = min(key, seqlen_k - 1), j1 = min(key + 8, seqlen_k - 1);
  Bits hidden = 0;
#pragma unroll 4
  for (int r = 0; r < kRows; ++r) {
    const ScoreRow row = score_row(params, batch, head, min(m0 + 8 * (r / 2) + 2 * t4 + (r & 1), seqlen_q - 1));
    hidden |= Bits(score_hidden(params, row, kind, j0)) << (2 * r);
    hidden |= Bits(score_hidden(params, row, kind, j1)) << (2 * r + 1);
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if ((hidden >> (2 * r + h)) & 1u) x[4 * (r / 2) + 2 * h + (r & 1)] = -INFINITY;
    }
  }
}

}  // namespace bwd90
}  // namespace flashattn::cuda::sm90
