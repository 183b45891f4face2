// Tile shapes and shared-memory plan of the Hopper (sm90a) forward kernel (fwd_kernel.h).
#pragma once

#include <cuda.h>

#include <cstddef>

#include "core/params.h"
#include "cuda/common/variants.h"
#include "cuda/sm90/tile_order.h"

namespace flashattn::cuda::sm90 {

struct FwdTile {
  int consumers;   // consumer warpgroups; each owns 64 query rows, so block_m = 64 * consumers
  int block_n;     // keys per K/V tile (the N of S = Q K^T, a multiple of 16)
  int stages;      // K/V tiles in flight (each stage holds one K and one V tile)
  bool ping_pong;  // consumers take turns issuing their products (fwd_kernel.h, Turns)
};

// Per head dim (and mask). Registers per consumer thread: O takes head_dim / 2 floats, S block_n / 2
// and P (16-bit pairs) block_n / 4, under the 240 that setmaxnreg gives two consumer warpgroups
// (160 for three). Shared memory: Q (block_m x d) + stages x (K + V) (block_n x d each), 16-bit,
// within 227 KB. Measured on H200 (bf16, forward, 1k-16k, against the 128 x 128 ping-pong tile;
// dev/results/h200-2026-12-01-ab-sm90a-*.json):
//  - d64: three consumer warpgroups (192 x 128, 2 stages: 24 + 64 KB; O 32 + S 64 + P 32
//    registers of 160): +16-23% from 2k up (544 against 453 TFLOP/s at 16k), +6% at 1k, -3% at
//    1k causal. 128 x 192 with two: -8% to +3%.
//  - d128 without a mask: 128 x 176, 2 stages (32 + 176 KB): +1.5-5% from 8k up (710 against 678
//    at 16k). With a window or causal mask 128 x 128 (32 + 128 KB): 176 lost 7% at 1k causal
//    and gained 4% at 16k causal, and short causal rows are the weaker ones.
//  - d192 (DeepSeek-V3's q/k; its v of 128 is zero-padded to 192): 128 x 112, 2 stages: 48 + 168
//    KB; O 96 + S 56 + P 28 registers. The largest N that fits; not swept.
//  - d256: 128 x 80, 2 stages: 64 + 160 KB (the most that fits); O 128 + S 40 + P 20. Not swept.
//  - Ping-pong (turns between the consumers): +1-3% at d128 (ab-sm90a-nopp128).
constexpr FwdTile fwd_tile(int head_dim, bool windowed) {
#if defined(FLASHATTN_DEV_SM90_BN)
  // dev/ experiments: -DFLASHATTN_DEV_SM90_{HDIM,CONSUMERS,BN,STAGES,PINGPONG}=... replace the
  // tile of head dim FLASHATTN_DEV_SM90_HDIM.
  if (head_dim == FLASHATTN_DEV_SM90_HDIM) {
    return {FLASHATTN_DEV_SM90_CONSUMERS, FLASHATTN_DEV_SM90_BN, FLASHATTN_DEV_SM90_STAGES, FLASHATTN_DEV_SM90_PINGPONG != 0};
  }
#endif
  if (head_dim <= 64) return {3, 128, 2, true};
  if (head_dim <= 128) return windowed ? FwdTile{2, 128, 2, true} : FwdTile{2, 176, 2, true};
  if (head_dim <= 192) return {2, 112, 2, true};
  return {2, 80, 2, true};
}

template <typename Element_, int kHeadDim_, MaskMode kMask_, bool kMods_ = false>
struct FwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr MaskMode kMask = kMask_;
  // Score modifiers (fwd_kernel.h, modify_scores): softcap * tanh(s * scale / softcap) (Gemma 2;
  // one more MUFU operation per score) and/or ALiBi's -slope |i + seqlen_k - seqlen_q - j|, each
  // under a uniform run-time branch, the scores then in log2 units. Dropout stays on sm80.
  static constexpr bool kMods = kMods_;
  static constexpr FwdTile kTile = fwd_tile(kHeadDim, kMask == MaskMode::kWindow);
  static constexpr int kConsumers = kTile.consumers;
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kStages = kTile.stages;
  static constexpr bool kPingPong = kTile.ping_pong;
  static constexpr int kThreads = 128 * (kConsumers + 1);  // warpgroup 0 produces
  // setmaxnreg: the producer gives its registers to the consumers. 65536 per SM (one CTA):
  // 128 x 24 + 256 x 240 = 64512.
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = kConsumers == 2 ? 240 : (kConsumers == 3 ? 160 : 240);

  // Tiles are 64-column panels of 128-byte rows (the widest swizzled row the copy engine writes).
  static constexpr int kPanels = kHeadDim / 64;
  static constexpr int kRowBytes = 128;
  static constexpr int kPanelBytesQ = kBlockM * kRowBytes;
  static constexpr int kPanelBytesKV = kBlockN * kRowBytes;
  static constexpr int kTileBytesQ = kPanels * kPanelBytesQ;
  static constexpr int kTileBytesKV = kPanels * kPanelBytesKV;
  // Which tile a CTA takes next (fwd_kernel.h): under a causal or window mask tiles differ in
  // work, so each CTA's producer takes the next one from a global counter, heaviest first, and
  // hands it to the consumers (TileFeed); without a mask every tile is the same work and CTAs
  // walk fixed rounds (TileOrder::cta_tile), which skips the hand-off. Measured on H200, bf16,
  // against the other choice in the same build (dev/results/h200-2026-12-01-ab-sm90e-*.json):
  // causal +16/+10/+5/+2% at d64 1k/2k/4k/16k, +18/+12/+5/+3% at d128, +7/+4/+3.5/0% at d256;
  // unmasked -5% at d128 (1k-16k), -2% at d256, within 2% at d64.
  static constexpr bool kDynamicTiles = kMask == MaskMode::kWindow;
  static constexpr int kBarriers = 2 + 4 * kStages  // Q full and empty; K, V full and empty per stage
                                   + (kDynamicTiles ? 4 + 1 : 0);  // the feed's full/empty pairs, its two slots
  // +1024: the dynamic shared-memory base is rounded up to the swizzle's 1024-byte period.
  // ptxas hoists the wait for P V above the softmax unless a shared-memory store of its result
  // comes first (fwd_kernel.h). Pinned, the exponentials overlap their own P V product: H200
  // bf16, against the unpinned kernel in the same session (dev/results/h200-2026-12-01-ab-fwdpin-
  // {base,pin,pinq}.json): d128 +1.5-4.3% from 1k to 16k (16k 712 -> 727, causal 683 -> 712),
  // d64 +0-2%. At d256 and on the softcap kernels (d64/d128) it moved -1..+2% (one row +3.6%;
  // dev/results/h200-2026-12-01-ab-{hd,sc}-{base,pinall}.json): within noise, so those keep the
  // unpinned schedule (d192 not timed).
  static constexpr bool kPinSoftmax = kHeadDim <= 128 && !kMods;
  static constexpr int kPinBytes = kPinSoftmax ? 4 * 4 * kConsumers : 0;  // one float per consumer warp
  // O stored in whole 16-byte chunks after a transpose across each quad (fwd_kernel.h,
  // store_tile): the plain store wrote each 32-byte sector in two halves (ncu at d128 16k: 2.1 M
  // excessive sectors, the output's size). With the pin: d128 +0.4-2.6% (1k 546 -> 560), but d64
  // -2.5-5% at 1k-4k (three consumers, short tiles: the shuffles cost more than they save).
  static constexpr bool kStoreOChunks = kHeadDim == 128;
  static constexpr size_t kSmemBytes = 1024 + kTileBytesQ + 2 * kStages * kTileBytesKV + 8 * kBarriers + kPinBytes;

  static_assert(kHeadDim % 64 == 0, "whole 64-column panels");
  static_assert(!kPingPong || kConsumers >= 2, "ping-pong takes turns between consumer warpgroups");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "S = Q K^T is one m64nNk16 product per k-step");
  static_assert(kPanelBytesKV % 1024 == 0, "K/V panels start on the swizzle period");
  static_assert(kSmemBytes <= 232448, "fits the 227 KB an sm90 CTA may use");
};

// Kernel parameters: the validated problem and the three operand maps (copied into the
// kernel's parameter space, where the copy engine reads them: __grid_constant__).
struct FwdParams {
  CUtensorMap q;  // boxes of 64 columns x block_m rows
  CUtensorMap k;  // 64 x block_n
  CUtensorMap v;  // 64 x block_n
  ForwardParams p;
  TileOrder order;
  int* tile_counter;  // kDynamicTiles: tiles handed out so far beyond the first wave (zeroed per launch)
};

}  // namespace flashattn::cuda::sm90
