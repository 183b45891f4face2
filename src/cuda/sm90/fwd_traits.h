// Tile shapes and shared-memory plan of the Hopper (sm90a) forward kernel (fwd_kernel.h).
#pragma once

#include <cuda.h>

#include <cstddef>

#include "core/params.h"
#include "cuda/common/variants.h"
#include "cuda/sm90/fwd_tile.h"
#include "cuda/sm90/mask_bits.h"
#include "cuda/sm90/tile_order.h"

namespace flashattn::cuda::sm90 {

// kHeadDimV: the width of V and O (head_dim_v); Q and K are kHeadDim wide. An instantiation
// with kHeadDimV != kHeadDim exists for 192 / 128 only (fwd_dispatch.cu, has_kernel).
// kSparse: the block-sparse forward (FwdSparseTraits below). The two traits share this body, and
// FwdTraits stays a template of its own name and arguments, so the dense instantiations keep
// their symbols and their code.
// kBias: attn_bias and/or attn_mask without a block mask (FwdBiasTraits below).
template <typename Element_, int kHeadDim_, MaskMode kMask_, bool kMods_, int kHeadDimV_, bool kSparse_,
          bool kShortRows_ = false, bool kBias_ = false, bool kMaskOnly_ = false, bool kCache_ = false>
struct FwdTraitsBody {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr MaskMode kMask = kMask_;
  // Score modifiers (fwd_kernel.h, modify_scores): softcap * tanh(s * scale / softcap) (Gemma 2;
  // one more MUFU operation per score) and/or ALiBi's -slope |i + seqlen_k - seqlen_q - j|, each
  // under a uniform run-time branch, the scores then in log2 units. Dropout stays on sm80.
  static constexpr bool kMods = kMods_;
  // A block mask (block_mask or the compressed lists; attn_mask only as the element mask of
  // partial blocks): the producer and the consumers walk the key tiles of the query tile's list
  // (cuda/block_tiles.h) instead of the range [n_lo, n_hi), and the tiles come from the dynamic
  // feed, since their cost follows the density of each query tile's row of blocks (fwd_kernel.h).
  static constexpr bool kSparse = kSparse_;
  // kShortRows: short rows (FwdShortRowsTraits; fwd_tile.h fwd_has_short_rows and
  // fwd_short_rows_max_seqlen): the short-rows tile (fwd_short_rows_tile) and the row sums on the
  // tensor cores (kRowSumMma).
  static constexpr bool kShortRows = kShortRows_;
  static_assert(!kShortRows || (fwd_has_short_rows(kHeadDim, kHeadDimV, kMask == MaskMode::kWindow) && !kSparse && !kMods),
                "the short-rows kernels: d64 and d128 masked or not, d256 masked; no score modifiers");
  // attn_bias (16-bit, q's dtype) and/or attn_mask, no block mask (fwd_kernel.h, "Bias"): the
  // producer copies each (query tile, key tile) tile of the bias with the K tile of its stage
  // (one more bulk tensor copy per 64 keys, on the K stage's "full" barrier) into a slot of the
  // stage, and the consumers read it in the accumulator layout with ldmatrix; attn_mask comes
  // packed into bits before the launch (mask_bits.h), one word per thread, row and key block.
  // Scores are in log2 units after the modifiers, as with kMods (softcap and ALiBi run under
  // uniform branches). Takes the sparse kernel's tile (128 x 128 at d64 and d128): a bias slot per stage
  // is 32 KB there, 2 x 32 KB on top of the masked d128 tile's 160 KB (fwd_bias_bytes).
  static constexpr bool kBias = kBias_;
  static_assert(!(kBias && kShortRows), "the bias kernel takes the sparse kernel's tile");
  // kMaskOnly: attn_mask alone (no attn_bias, softcap or ALiBi; FwdMaskTraits below): the plain
  // kernel of the window mask, its tile at d64 / d128 (d64: three consumers; d256: 64-key blocks,
  // fwd_tile.h fwd_mask_tile), whose consumers read the
  // packed bits (mask_bits.h) of every key block as the bias kernel's do, and no bias slot. The
  // bias kernel's 128 x 128 tile, scores in log2 units after the modifiers and per-stage slot are
  // for a float bias; a mask needs none of them.
  static constexpr bool kMaskOnly = kMaskOnly_;
  static_assert(!kMaskOnly || (!kBias && !kSparse && !kShortRows && !kMods && kMask == MaskMode::kWindow),
                "the mask kernel: attn_mask alone, on the window kernel");
  // The consumers test attn_mask's packed bits (fwd_kernel.h mask_bits_scores).
  static constexpr bool kMaskBits = kBias || kMaskOnly;
  // kCache: K and V from a KV cache (params.kv: forward_kvcache, or a varlen call with a block
  // table), dense or paged at any page size, for prefill-shaped calls (FwdCacheTraits below). The
  // copy engine cannot follow a block table row by row, so the whole producer warpgroup copies
  // K and V with cp.async, eight lanes per 128-byte row, each row's page looked up once and rows
  // past the sequence zero-filled (fwd_kernel.h cache_producer; the plan in fwd_tile.h). The
  // sparse kernel's tile (128 keys at d64 / d128, 64 at d256), fixed rounds of tiles (every
  // producer thread walks them; no feed to hand out).
  static constexpr bool kCache = kCache_;
  static_assert(!kCache || (!kSparse && !kBias && !kMaskOnly && !kShortRows && kMask == MaskMode::kWindow &&
                            kHeadDimV == kHeadDim),
                "the cache kernel: the window kernel's masks, no bias, masks or block masks");
  static constexpr FwdTile kTile = kSparse || kBias || kCache ? fwd_sparse_tile(kHeadDim, kHeadDimV)
                                   : kMaskOnly      ? fwd_mask_tile(kHeadDim)
                                   : kShortRows     ? fwd_short_rows_tile(kHeadDim, kMask == MaskMode::kWindow)
                                                    : fwd_tile(kHeadDim, kHeadDimV, kMask == MaskMode::kWindow);
  static constexpr int kConsumers = kTile.consumers;
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kStages = kTile.stages;
  static constexpr bool kPingPong = kTile.ping_pong;
  static constexpr int kThreads = 128 * (kConsumers + 1);  // warpgroup 0 produces
  static constexpr int kCtasPerSm = kTile.ctas_per_sm;
  // setmaxnreg: the producer gives its registers to the consumers. 65536 per SM (one CTA):
  // 128 x 24 + 256 x 240 = 64512.
  // kCache: 128 copying threads (fwd_tile.h kFwdCacheProducerRegs).
  static constexpr int kProducerRegs = kBias_    ? kFwdBiasProducerRegs
                                       : kCache_ ? kFwdCacheProducerRegs
                                                 : fwd_producer_regs(kTile);  // fwd_tile.h
  static constexpr int kConsumerRegs = kBias_    ? kFwdBiasConsumerRegs
                                       : kCache_ ? kFwdCacheConsumerRegs
                                                 : fwd_consumer_regs(kTile);
  // Arrivals that fill a K or V stage: the one producer thread's (with the copy engine's bytes),
  // or, kCache, one per copying thread (cp.async.mbarrier.arrive.noinc after its copies).
  static constexpr int kKvArrivals = kCache ? 128 : 1;
  static_assert(!kCache || (kBlockN % 16 == 0 && kBlockN <= 128),
                "kCache: sixteen 8-lane groups take a tile's rows 16 apart (fwd_tile.h cache_copy_row)");

  // Tiles are 64-column panels of 128-byte rows (the widest swizzled row the copy engine writes):
  // kPanels of them in a Q or K tile, kPanelsV in a V tile.
  static constexpr int kPanels = kHeadDim / 64;
  static constexpr int kPanelsV = kHeadDimV / 64;
  static constexpr int kRowBytes = 128;
  static constexpr int kPanelBytesQ = kBlockM * kRowBytes;
  static constexpr int kPanelBytesKV = kBlockN * kRowBytes;
  static constexpr int kTileBytesQ = kPanels * kPanelBytesQ;
  static constexpr int kTileBytesK = kPanels * kPanelBytesKV;
  static constexpr int kTileBytesV = kPanelsV * kPanelBytesKV;
  // kBias: the bias slot of one stage, kBlockN / 64 panels of kBlockM rows of 128 bytes (64
  // 16-bit keys) under the 128-byte swizzle, after the V ring. 0 for the other kernels.
  static constexpr int kBiasPanels = kBias ? kBlockN / 64 : 0;
  static constexpr int kPanelBytesBias = kBlockM * kRowBytes;
  static constexpr int kTileBytesBias = kBiasPanels * kPanelBytesBias;
  // attn_mask always goes as bits (mask_bits.h). Measured against the bits and removed: a mask
  // slot of its own beside the bias at d64 (bits +10% at 1 x 16k, +0..7% at 8 x 2k,
  // dev/results/h200-2026-12-03-s17-d64bitsbias-*-8e55c38.json) and, without a bias, a uint8
  // mask tile in the bias slot (bits +7..17% at d128 and d64 8 x 2k, -2..+0% at d64 1 x 16k,
  // dev/results/h200-2026-12-03-s21-mask-tile-vs-bits-probe-*.json).
  // Which tile a CTA takes next (fwd_kernel.h): under a causal or window mask tiles differ in
  // work, so each CTA's producer takes the next one from a global counter, heaviest first, and
  // hands it to the consumers (TileFeed); without a mask every tile is the same work and CTAs
  // walk fixed rounds (TileOrder::cta_tile), which skips the hand-off. Measured on H200, bf16,
  // against the other choice in the same build (dev/results/h200-2026-12-01-ab-sm90e-*.json):
  // causal +16/+10/+5/+2% at d64 1k/2k/4k/16k, +18/+12/+5/+3% at d128, +7/+4/+3.5/0% at d256;
  // unmasked -5% at d128 (1k-16k), -2% at d256, within 2% at d64.
  // Block-sparse launches take the feed too: a query tile's cost is its number of kept key
  // tiles, which varies from row to row of the block mask as under a causal mask.
  // kCache: fixed rounds (the 128 copying threads walk the tiles too); with
  // -DFLASHATTN_DEV_SM90_CACHE_FEED the feed, its producer warps reading it as the consumers do
  // (dev/ A/B, not measured yet: the feed gained 3-18% on causal launches of the other kernels).
#if defined(FLASHATTN_DEV_SM90_CACHE_FEED)
  static constexpr bool kDynamicTiles = kMask == MaskMode::kWindow || kSparse;
#else
  static constexpr bool kDynamicTiles = (kMask == MaskMode::kWindow || kSparse) && !kCache;
#endif
  // fwd_tile.h: the key-block pipeline runs across tiles, over two Q buffers.
  static constexpr bool kCrossTile = kTile.cross_tile;
  // Q slots: two on the cross-tile pipeline (it runs over both) and on the plain short-rows
  // kernels at d64 / d128, so the next tile's Q can land during this tile rather than after its
  // last Q K^T product (the producer loads it first there: fwd_kernel.h kQFirst). H200 bf16, four
  // passes each, same processes as cuDNN: two slots alone against one +2.1% at d128 512, +2.0% at
  // d64 causal 1k (dev/results/h200-2026-12-04-s34-q2-ab-be99498.json; rows it does not touch
  // moved -0.5..+3.2% in those passes, and in the next call the same code timed as one slot had),
  // with the Q first +4.4% / +1.6% more (4 of 4 passes; -s34-qfirst-ab-365d30f.json), and the
  // traced Q wait at d128 512's tile start fell from 676 to 264 cycles, the tile from 14664 to 14114
  // (-s34-fwd-trace-365d30f.txt against -s33-fwd-trace-843927b.txt; d64 causal 1k's stayed ~200).
  // Shared memory: d128 short 230496 (masked: 230536, the tile feed's barriers) of 232448 bytes;
  // d64 masked short 3 x 58504.
  // On the plain d64 / d128 window kernels (and the attn_mask-only kernels that share their loop)
  // two Q slots and the Q first fit too (d64 3 x 64 rows: 24 + 24 + 2 x 32 KB, d128 32 + 32 + 2 x
  // 64 KB) but moved their rows within noise: d64 causal 2k +0.9%, d128 causal 1k / 2k +1.4 /
  // +0.7%, where rows of unchanged kernels moved up to +1.6% (s38, four rotated passes,
  // dev/results/h200-2026-12-05-s38-fwd-ab-8149d27.json; the macro that built it is gone).
  static constexpr int kQSlots = kCrossTile || (kShortRows && kHeadDim <= 128) ? 2 : 1;
  // Beyond the Q and Q barriers fwd_smem_bytes and fwd_smem_bound count (kBarriers has them).
  static constexpr int kExtraQSlots = kQSlots - (kCrossTile ? 2 : 1);
  static constexpr int kExtraQBytes = kExtraQSlots * kTileBytesQ;
  static_assert(!(kCrossTile && kSparse), "the block-sparse kernel walks its lists one tile at a time");
  static constexpr int kBarriers = 2 * kQSlots + 4 * kStages  // Q full and empty per slot; K, V full and empty per stage
                                   + (kDynamicTiles ? 4 + 1 : 0)  // the feed's full/empty pairs, its two slots
                                   // kSparse: the feed's two "has keys" flags, then per stage the
                                   // list entry of the K tile in it (fwd_kernel.h, SparseSlots)
                                   + (kSparse ? fwd_sparse_words(kTile) : 0);
  // +1024: the dynamic shared-memory base is rounded up to the swizzle's 1024-byte period.
  // ptxas hoists the wait for P V above the softmax unless a shared-memory store of its result
  // comes first (fwd_kernel.h). Pinned, the exponentials overlap their own P V product: H200
  // bf16, against the unpinned kernel in the same session (dev/results/h200-2026-12-01-ab-fwdpin-
  // {base,pin,pinq}.json): d128 +1.5-4.3% from 1k to 16k (16k 712 -> 727, causal 683 -> 712),
  // d64 +0-2%. At d256 and on the softcap kernels (d64/d128) it moved -1..+2% (one row +3.6%;
  // dev/results/h200-2026-12-01-ab-{hd,sc}-{base,pinall}.json): within noise, so those keep the
  // unpinned schedule (d192 not timed). 192 / 128 (not timed either) takes the pin: its softmax
  // is d128's masked tile's (128 x 128 scores) against products of 320 FLOPs per score (d128
  // 256, d256 512), its P V product and O are d128's (m64n128, 8 k-steps, 64 accumulators), and
  // its unpinned SASS shows the same hoisted wait (all 66 MUFU.EX2 after it; pinned, all 66
  // between the two waits, no new spills).
  // Row sums of P on the tensor cores (kShortRows): O += P V runs as m64n72k16 (d64; m64n136 at
  // d128) over V and a panel of ones (kOnesBytes, or one per stage), whose eight extra
  // accumulator columns each hold the row sums of the P that was multiplied (the 16-bit P,
  // accumulated in f32 and rescaled with O), so the softmax drops its 64 additions per thread and
  // 128-key block (a sixth of the key-block loop's instructions at d64) and the epilogue its quad
  // reduction; the P V product grows by 1/8. H200 bf16, two A/B calls against the sums on the FMA
  // units, the bit mask in both (dev/results/h200-2026-12-02-ab-s13-*.json):
  //  - unmasked: +6.7/+9.0% at 512, +2.9/+2.9% at 1k, +0.5/+0.6% at 2k, -1.5/-0.4% at 4k,
  //    -2.1/-2.9% at 16k (the tensor cores bound the longer rows);
  //  - the short-rows tile (masked): +2.6/+3.2% at 512, +0.3/+0.9% at 1k;
  //  - the three-consumer masked tile: +2.1/+2.5% at 2k, -0.1/+0.4% at 4k, -2.0/-0.2% at 16k.
  // So d64 takes it up to 1024 rows, masked or not (FwdShortRowsTraits), and d128 up to 512
  // (fwd_tile.h kFwdShortRowsMaxSeqlen128: +2.3% there unmasked; masked since s38). Not pinned (kPinSoftmax stores the
  // row sums; the pin gained 0-2% at d64).
  // The ones must sit where the product's N = head_dim_v..+7 reads: at d64 the leading offset can
  // point each stage's one V panel at a single shared panel after the ring (kOnesBytes); with two
  // V panels it is the panel stride, so each stage has its own ones panel after its V
  // (kOnesPerStage, kVStageBytes).
  static constexpr bool kRowSumMma = kShortRows && kHeadDimV <= 128;  // d256: N would pass 256
  static constexpr bool kOnesPerStage = kRowSumMma && kPanelsV > 1;
  static constexpr int kOnesBytes = kRowSumMma && !kOnesPerStage ? kPanelBytesKV : 0;
  static constexpr int kVStageBytes = kTileBytesV + (kOnesPerStage ? kPanelBytesKV : 0);  // V ring stride
  static constexpr size_t kOnesTotalBytes = kOnesBytes + size_t(kStages) * (kVStageBytes - kTileBytesV);
#if defined(FLASHATTN_DEV_SM90_FWD_PIN_NONE)  // dev/ A/B: no pin anywhere
  static constexpr bool kPinSoftmax = false;
#else
  // kBias (kMods for softcap / ALiBi under run-time branches, no tanh without softcap) takes the
  // pin of the plain kernels: not timed.
  static constexpr bool kPinSoftmax =
      (kHeadDim <= 128 || (kHeadDim == 192 && kHeadDimV == 128)) && (!kMods || kBias) && !kRowSumMma;
#endif
  static constexpr int kPinBytes = kPinSoftmax ? 4 * 4 * kConsumers : 0;  // one float per consumer warp
  // O stored in whole 16-byte chunks after a transpose across each quad (fwd_kernel.h,
  // store_tile): the plain store wrote each 32-byte sector in two halves (ncu at d128 16k: 2.1 M
  // excessive sectors, the output's size; at d256 512 half the kernel's 4.2 M sectors). With the
  // pin: d128 +0.4-2.6% (1k 546 -> 560). d64 lost 2.5-5% at 1k-4k with the first, select-based
  // transpose; with the butterfly form it gains (dev/results/h200-2026-12-02-ab-d64-{base,chunks}.json,
  // same process): +5.3/+3.1/+1.2/+0.8% at 512/1k/2k/4k, causal +3.1/+0.7/+1.0/+0.6%, 16k
  // -1.8/-0.3% (noise). d256 (eight chunks live per row half; no new spills): +17.2/+10.8/+6.4/
  // +3.0/-0.2% at 512/1k/2k/4k/16k, causal +9.0/+6.5/+4.8/+3.4/+1.0%
  // (dev/results/h200-2026-12-02-ab-s14-2-{base,ch}-6c07bbb.json). d192 and 192 / 128 take them
  // too (not timed on their own: 192 / 128 stores d128's O from the same accumulator layout), as
  // does the FP8 forward (fwd8_traits.h). Every head_dim_v here is a multiple of 64.
  static constexpr size_t kSmemBytes =
      fwd_smem_bytes(kTile, kHeadDim, kHeadDimV, kBarriers, kPinBytes) + size_t(kStages) * kTileBytesBias +
      kOnesTotalBytes + kExtraQBytes;

  static_assert(kHeadDim % 64 == 0 && kHeadDimV % 64 == 0, "whole 64-column panels");
  static_assert(!kPingPong || kConsumers >= 2, "ping-pong takes turns between consumer warpgroups");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "S = Q K^T is one m64nNk16 product per k-step");
  static_assert(kPanelBytesKV % 1024 == 0, "K/V panels start on the swizzle period");
  static_assert(kSmemBytes <= fwd_smem_bound(kTile, kHeadDim, kHeadDimV) + (kBias ? fwd_bias_bytes(kTile) : 0) +
                                    kOnesTotalBytes + kExtraQBytes + 16 * kExtraQSlots,
                "fwd_smem_bound counts every buffer");
  static_assert(!kBias || (!kSparse && kMods && !kCrossTile && kBlockN % 64 == 0 && kHeadDimV == kHeadDim),
                "the bias kernel: no block mask, scores in log2 units, one tile at a time, 64-key panels");
  static_assert(kSmemBytes <= fwd_smem_limit(kCtasPerSm), "fits the share of the 228 KB an sm90 CTA may use");
  static_assert(setmaxnreg_fits(kProducerRegs, kConsumers, kConsumerRegs, kCtasPerSm),
                "setmaxnreg within the launch's registers (fwd_tile.h setmaxnreg_pool)");
  static_assert(kCtasPerSm == 1 || !kBias, "the bias kernel's setmaxnreg counts are for one CTA per SM");
  static_assert(!kMaskBits || (kMaskBitsGroupKeys % kBlockN == 0 && kBlockN % 64 == 0 && !kCrossTile && kDynamicTiles),
                "packed mask bits: a key block is a group or half of one, one tile at a time, the feed's workspace");
  static_assert(!kSparse || kDynamicTiles, "the sparse producer publishes whether a tile has keys with the tile");
};

template <typename Element_, int kHeadDim_, MaskMode kMask_, bool kMods_ = false, int kHeadDimV_ = kHeadDim_>
struct FwdTraits : FwdTraitsBody<Element_, kHeadDim_, kMask_, kMods_, kHeadDimV_, false> {};

// The block-sparse forward (kSparse): instantiated with MaskMode::kWindow only, which serves
// calls without a window too (tools/gen_instantiations.py, sm90fwdsparse*).
template <typename Element_, int kHeadDim_, MaskMode kMask_, bool kMods_ = false, int kHeadDimV_ = kHeadDim_>
struct FwdSparseTraits : FwdTraitsBody<Element_, kHeadDim_, kMask_, kMods_, kHeadDimV_, true> {};

// Short rows (at most fwd_short_rows_max_seqlen queries: 1024 at d64, 512 at d128, 2048 at d256)
// without score modifiers, d64, d128 and d256 with a mask (fwd_tile.h
// fwd_has_short_rows): at d64/d128 the row sums on the tensor cores (kRowSumMma), at d64 under a
// causal or window mask the one-consumer 64 x 64 tile at three CTAs per SM, at d256 64-key blocks
// (fwd_short_rows_tile); sm90fwdshort_hdim{64,128,256}_{dtype}_{window,nomask}.cu.
template <typename Element_, int kHeadDim_, MaskMode kMask_ = MaskMode::kWindow>
struct FwdShortRowsTraits : FwdTraitsBody<Element_, kHeadDim_, kMask_, false, kHeadDim_, false, true> {};

// attn_bias and/or attn_mask without a block mask (kBias): window mask only, which serves calls
// without a window too, with the score modifiers (softcap, ALiBi) under run-time branches
// (tools/gen_instantiations.py, sm90fwdbias*). Head dims 64 and 128 (fwd_dispatch.cu).
template <typename Element_, int kHeadDim_, MaskMode kMask_ = MaskMode::kWindow>
struct FwdBiasTraits : FwdTraitsBody<Element_, kHeadDim_, kMask_, true, kHeadDim_, false, false, true> {};

// attn_mask without attn_bias, softcap or ALiBi (kMaskOnly): the window kernel with the mask's
// packed bits, head dims 64, 128 and 256 (sm90fwdmask_hdim{64,128,256}_{dtype}_window.cu;
// fwd_dispatch.cu; d256 on 64-key blocks, fwd_tile.h fwd_mask_tile).
template <typename Element_, int kHeadDim_>
struct FwdMaskTraits
    : FwdTraitsBody<Element_, kHeadDim_, MaskMode::kWindow, false, kHeadDim_, false, false, false, true> {};

// K and V from a KV cache (kCache, forward_kvcache and varlen calls with a block table) for
// prefill-shaped calls: the window kernel (it serves calls without a window too), plain or with
// softcap / ALiBi, at head dims 64, 128 and 256 (sm90fwdcache{,mods}_hdim{D}_{dtype}_window.cu;
// fwd_dispatch.cu fwd_cache_declines says which calls take it).
template <typename Element_, int kHeadDim_, bool kMods_ = false>
struct FwdCacheTraits
    : FwdTraitsBody<Element_, kHeadDim_, MaskMode::kWindow, kMods_, kHeadDim_, false, false, false, false, true> {};

// Kernel parameters: the validated problem and the three operand maps (copied into the
// kernel's parameter space, where the copy engine reads them: __grid_constant__).
struct FwdParams {
  CUtensorMap q;  // boxes of 64 columns x block_m rows
  CUtensorMap k;  // 64 x block_n (head_dim columns); unused (not encoded) by kCache
  CUtensorMap v;  // 64 x block_n (head_dim_v columns); unused (not encoded) by kCache
  ForwardParams p;
  TileOrder order;
  int* tile_counter;  // kDynamicTiles: tiles handed out so far beyond the first wave (zeroed per launch)
  // kBias with an attn_bias: (keys, rows, heads, batch), boxes of 64 keys x block_m rows (1 row
  // when the bias broadcasts over the rows); extent 1 where it broadcasts. After the members the
  // other kernels read, so their parameter offsets stay.
  CUtensorMap bias;
  // kMaskBits (the bias and mask kernels), attn_mask: the mask packed into bits in the launch's
  // workspace (mask_bits.h; words = nullptr when there is no attn_mask).
  MaskBits mask_bits;
};

}  // namespace flashattn::cuda::sm90
