// Tile shapes and shared-memory plan of the Hopper (sm90a) FP8 forward (fwd8_kernel.h): q, k, v
// in float8 e4m3, out bf16 (docs/SEMANTICS.md, "FP8"; issue 21).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstddef>

#include "core/params.h"
#include "cuda/common/variants.h"
#include "cuda/sm90/fwd8_layout.h"
#include "cuda/sm90/fwd_tile.h"
#include "cuda/sm90/tile_order.h"

namespace flashattn::cuda::sm90 {

// kMods_: softcap and ALiBi (fwd_kernel.h modify_scores, under uniform run-time branches, the
// scores then in log2 units before the reference r is taken), as FwdTraits::kMods.
template <int kHeadDim_, MaskMode kMask_, bool kMods_ = false>
struct Fwd8Traits : Fwd8Shape<kHeadDim_> {
  using Shape = Fwd8Shape<kHeadDim_>;
  // The output's element (bf16): store_tile, shared with the 16-bit kernel, packs O in it.
  using Element = __nv_bfloat16;
  static constexpr MaskMode kMask = kMask_;
  static constexpr bool kMods = kMods_;
  static constexpr int kThreads = 128 * (Shape::kConsumers + 1);
  // Warpgroup 0: one thread issues the copies, warps 1-3 transpose V (fwd8_kernel.h). Two
  // transposer items in flight (4 ldmatrix registers, 4 results, addresses each) stay within
  // 40 registers: SASS after setmaxnreg.dec uses R0-R33 (every instantiation, CUDA 13).
  // 128 x 40 + 256 x 232 = 64512, the launch's 168 x 384 (fwd_tile.h setmaxnreg_pool). d256
  // (fwd8_narrow_producer): 128 x 24 + 256 x 240 (the sweep's first form, 128 x 32 + 256 x 240 =
  // 65536, asked for more than the launch had and hung). Three consumers: 128 x 32 + 384 x 160
  // (65536 of 128 x 512). Both one transposer item per pass.
#if defined(FLASHATTN_DEV_FP8_REGS240)
  static constexpr bool kRegs240 = Shape::kConsumers == 2;
#else
  static constexpr bool kRegs240 = fwd8_narrow_producer(Shape::kTile, kHeadDim_);
#endif
  static constexpr bool kWideConsumers = Shape::kConsumers == 2 && !kRegs240;
  static constexpr int kProducerRegs = kWideConsumers ? 40 : Shape::kConsumers == 3 ? 32 : 24;
  static constexpr int kConsumerRegs = Shape::kConsumers == 3 ? 160 : kWideConsumers ? 232 : 240;
  static constexpr int kTransposeUnroll = kWideConsumers ? 2 : 1;
  static constexpr int kTransposeThreads = 96;

  static constexpr bool kDynamicTiles = kMask == MaskMode::kWindow;  // as the 16-bit kernel (fwd_traits.h)
  static constexpr bool kCache = false;  // tile_work: the extents of q, k and v themselves (FwdTraits::kCache)
  // Q full/empty; K, V, Vt full and empty per stage; the tile feed's pairs and slots.
  static constexpr int kBarriers = 2 + 6 * Shape::kStages + (kDynamicTiles ? 4 + 1 : 0);
  // The softmax pinned between the two waits (FwdTraits::kPinSoftmax, fwd_kernel.h): unpinned,
  // ptxas puts the wait for P V before all 66 exponentials of the d128 loop here too (SASS).
  // The bf16 choice (pinned at d <= 128 without modifiers, measured there) is taken as it is;
  // not timed for FP8.
  static constexpr bool kPinSoftmax = kHeadDim_ <= 128 && !kMods_;
  static constexpr int kPinBytes = kPinSoftmax ? 4 * 4 * Shape::kConsumers : 0;  // one float per consumer warp
  // store_tile writes O in 16-byte chunks at every head dim (fwd_traits.h): at d64 and d256,
  // against the 4-byte pieces they stored before, +4.3/+4.3% at 4k, +1.4/+1.0% at 16k, causal
  // +2.3/+5.0% and +0.3/+0.8% (dev/results/h200-2026-12-02-ab-s14-2-fp8-{base,ch}-6c07bbb.json).
  // The row sums stay on the FMA units (FwdTraits::kRowSumMma).
  static constexpr bool kRowSumMma = false;
  // +1024 alignment, the tiles, the barriers, the transposers' end flags (one int per stage),
  // the pin slots.
  static constexpr size_t kSmemBytes = 1024 + Shape::kTileBytesQ +
                                       size_t(Shape::kStages) * (Shape::kTileBytesK + Shape::kTileBytesV + Shape::kTileBytesVt) +
                                       8 * kBarriers + 4 * Shape::kStages + kPinBytes;

  static_assert(Shape::kPingPong, "ping-pong takes turns between consumer warpgroups");
  static_assert(kSmemBytes <= kFwdSmemLimit, "fits the 227 KB an sm90 CTA may use");
  static_assert(setmaxnreg_fits(kProducerRegs, Shape::kConsumers, kConsumerRegs, 1),
                "setmaxnreg within the launch's registers (fwd_tile.h setmaxnreg_pool)");
};

}  // namespace flashattn::cuda::sm90
