// The compile-time shape of the MLA decode kernel (mla_kernel.h): its shared-memory map and
// launch plan. Host code too: tests/cpp/test_smem_layout.cpp checks the map without a GPU (every
// tile read stays inside its stage, every region inside kSmemBytes).
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/common/smem_layout.h"

namespace flashattn::cuda::mla {

constexpr int kHeadDim = 576;   // q and k: 512 latent columns + 64 rotary ones
constexpr int kHeadDimV = 512;  // v: the latent columns
constexpr int kMaxSeqlenQ = 16; // query tokens per call (decode, MTP / speculative decoding)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The compile-time shape of one instantiation.
//   kStages_     K (and V) tile stages in shared memory: 2 where the device's opt-in shared
//                memory holds them (sm90: 227 KB), else 1 (A100: 163 KB; no copy overlap).
//   kSeparateV_  v_cache is its own tensor (not a view of k_cache): V tiles are copied too.
//   kBlockM_     rows per CTA: 16 (one m16 tile), or 32 where a call has more than 16 rows
//                (heads_per_group x seqlen_q: 128 heads, or 16 heads with 2+ query tokens), so
//                that half as many CTAs read each K tile. O (kBlockM x 512 f32) is split over
//                the 8 warps: 64 columns each, 32 or 64 registers per thread; 64 rows would take
//                128 and the 2-stage tiles would not fit beside their Q (dev/NOTES.md, "MLA decode").
//   kTma_        (sm90, a dense latent cache) K tiles come by the copy engine: thread 0 issues
//                nine 64-column boxes per tile into a stage that an mbarrier completes, instead
//                of every thread's 18 cp.async per tile (27% of the warps' samples at b8 x 8k,
//                ncu, dev/NOTES.md); the tile is then in SwizzledPanels, the layout those boxes
//                land in.
//   kTmaPaged_   (with kTma) a paged latent cache whose pages are whole 64-row tiles apart
//                (page_size % 64 == 0, no leftpad): each tile's boxes come from one page, its
//                index read by thread 0 one tile ahead (at pages of 64, within 1-5% of the dense
//                cache's kernel time, against 6-37% for the cp.async kernels; mla_launch.h).
template <typename Element_, int kStages_, bool kSeparateV_, int kBlockM_ = 16, bool kTma_ = false,
          bool kTmaPaged_ = false>
struct MlaTraits {
  using Element = Element_;
  static constexpr int kStages = kStages_;
  static constexpr bool kSeparateV = kSeparateV_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr bool kTma = kTma_;
  static constexpr bool kTmaPaged = kTmaPaged_;
  static_assert(!kTmaPaged || kTma, "paged TMA copies are TMA copies");
  static_assert(!kTma || (!kSeparateV && kStages >= 2), "TMA copies: the latent cache, double-buffered");
  static constexpr int kMTiles = kBlockM / 16;
  static_assert(kBlockM % 16 == 0, "whole m16 tiles");
  static constexpr int kBlockN = 64;  // keys per tile: 72 KB of K at d 576
  static constexpr int kWarps = 8;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kKeysPerWarp = kBlockN / kWarps;   // S columns per warp: one n8 tile
  static constexpr int kColsPerWarp = kHeadDimV / kWarps;  // O columns per warp
  static constexpr int kONTiles = kColsPerWarp / 8;
  static_assert(kKeysPerWarp == 8, "one n8 tile of S per warp");

  // Unpadded rows, 16-byte chunks swizzled within 128-byte lines (smem_layout.h): Q, and the K
  // tiles unless kTma (then the copy engine's 64-column panels, the same swizzle per line).
  using QKLayout = SwizzledRows<kHeadDim>;
  using KLayout = std::conditional_t<kTma, SwizzledPanels<kHeadDim, kBlockN>, QKLayout>;
  using VLayout = std::conditional_t<kSeparateV, SwizzledRows<kHeadDimV>, KLayout>;
  using PLayout = SwizzledRows<kBlockN>;

  // How the warps share S = Q K^T of a tile; either way each warp ends with S of its own
  // kKeysPerWarp keys for the softmax:
  //   by keys   (kSplitDepth false) each warp computes its 8 keys over the whole depth 576, so
  //             every warp reads all of Q: 8 x 18 KB of ldmatrix reads of Q per tile;
  //   by depth  (kSplitDepth true) warp w computes the 32 keys of key group w % kKeyGroups over
  //             the k steps w / kKeyGroups + kDepthParts i (9 of the 36), and the kDepthParts
  //             partial sums meet in shared memory (sS, f32): Q is read twice per tile, not 8
  //             times (S's ldmatrix traffic 221 -> 111 KB per tile, plus 2 x 16 KB for the
  //             partials), for one more barrier per tile.
  // By depth for the latent cache; a separate v_cache keeps by keys, so that its stage of K and
  // V (136 KB) still fits A100's 163 KB with the rest.
  static constexpr bool kSplitDepth = !kSeparateV;
  static constexpr int kKeyGroups = 2;
  static constexpr int kDepthParts = kWarps / kKeyGroups;
  static constexpr int kGroupKeys = kBlockN / kKeyGroups;  // 32 keys: 4 n8 tiles
  static_assert(kHeadDim % (16 * kDepthParts) == 0, "whole k steps per depth part");
  static constexpr int kSStride = kBlockN + 8;  // floats between rows of a partial (conflict-free float2)

  static constexpr int kKBytes = kBlockN * kHeadDim * 2;
  static constexpr int kVBytes = kSeparateV ? kBlockN * kHeadDimV * 2 : 0;
  static constexpr int kStageBytes = kKBytes + kVBytes;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kPBytes = kBlockM * kBlockN * 2;
  static constexpr int kStatBytes = 2 * kWarps * kBlockM * 4;  // per-warp row maxima and sums
  static constexpr int kSBytes = kSplitDepth ? kDepthParts * kBlockM * kSStride * 4 : 0;  // S partials
  // Offsets from the (128-byte aligned) start of dynamic shared memory.
  static constexpr int kQOffset = kStages * kStageBytes;
  static constexpr int kPOffset = kQOffset + kQBytes;
  static constexpr int kStatOffset = kPOffset + kPBytes;
  static constexpr int kSOffset = kStatOffset + kStatBytes;
  // kTma: one "full" mbarrier per stage after the S partials; the allocation has 1024 bytes more,
  // so that the kernel can start its map on a 1024-byte boundary (the copy engine's swizzle).
  static constexpr int kBarOffset = kSOffset + kSBytes;
  static constexpr int kBarBytes = kTma ? 8 * kStages : 0;
  static constexpr int kSmemUsed = kBarOffset + kBarBytes;
  static constexpr int kSmemBytes = kSmemUsed + (kTma ? 1024 : 0);
  // Byte offsets of stage s's K tile and V tile. The latent cache's V is the first 512 columns
  // of the K tile itself (same rows, same swizzle), so its V tile starts where K's does; only a
  // separate v_cache has a V tile of its own, after K's. (The first GPU run, 2026-12-01, read the
  // latent V at s * kStageBytes + kKBytes: the next stage's K tile, or for the last stage Q, P,
  // the statistics and past kSmemBytes; tests/cpp/test_smem_layout.cpp, MlaSmemMap, now checks.)
  static constexpr int k_stage_offset(int s) { return s * kStageBytes; }
  static constexpr int v_stage_offset(int s) { return s * kStageBytes + (kSeparateV ? kKBytes : 0); }
  static_assert(kStageBytes % 128 == 0 && kQBytes % 128 == 0 && kPBytes % 128 == 0, "128-byte lines");
  static_assert(!kTma || (kStageBytes % 1024 == 0 && kBarOffset % 8 == 0), "stages on the swizzle's 1024-byte period");
  static_assert(kSeparateV ? kMTiles == 1 && !kSplitDepth : kSplitDepth, "by keys: 16 rows; by depth: the latent cache");
};

// The launch plan (set by the launcher, mla_launch.h).
struct MlaPlan {
  int group = 1;            // query heads per KV head
  int rows = 1;             // group * seqlen_q: the rows of one (sequence, KV head)
  int tiles_per_split = 1;  // key tiles each split covers
};

// The split combine (mla_combine_kernel): one CTA of kCombineWarps warps per (row, head,
// kCombineCols columns); warp w merges splits w + kCombineWarps j in passes of 32 (pass p starts
// at split k0 = w + 32 kCombineWarps p, lane j holding the weight of split k0 + kCombineWarps j).
// combine_pass_splits: how many of a pass's 32 exist (> 0 while k0 < splits). Checked on the
// host: every split merged exactly once (test_smem_layout.cpp, MlaCombineCoversEverySplit).
constexpr int kCombineWarps = 8;
constexpr int kCombineCols = 128;  // columns per CTA: one float4 per lane
constexpr int kCombineBatch = 8;   // splits whose partials a warp loads before summing them
static_assert(kHeadDimV % kCombineCols == 0 && kCombineCols == 4 * 32, "a float4 per lane");
constexpr int combine_pass_splits(int splits, int k0) {
  const int n = (splits - k0 + kCombineWarps - 1) / kCombineWarps;
  return n < 32 ? n : 32;
}

}  // namespace flashattn::cuda::mla
