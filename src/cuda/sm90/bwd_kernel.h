// Hopper (sm_90a) backward: bulk tensor copies, warpgroup products and warp specialisation, as in
// the forward (fwd_kernel.h), in two kernels that each own what they accumulate, so the result is
// deterministic without atomics:
//  - bwd_kv_kernel, one CTA per key block of one KV head (and chunk of its query heads): K and V
//    stay in shared memory; a producer thread streams (Q, dO, LSE*log2e, D) per query block (64
//    rows; 128 in the plain d64 kernels, BwdTraitsBody::kRowSteps128) through a ring of stages;
//    each consumer warpgroup owns 64 keys and per step computes
//        S^T = K Q^T,  dP^T = V dO^T,  P^T = exp2(S^T scale_log2 - LSE_log2),
//        dS^T = P^T (dP^T - D),  dV += P^T dO,  dK += dS^T Q
//    with P^T and dS^T kept in registers as the A operands of the last two products.
//  - bwd_dq_kernel, one CTA per query block of one head: Q and dO stay, K and V stream per key
//    block; per step S = Q K^T, dP = dO V^T, dS = P (dP - D), dQ += dS K.
// S and dP are computed twice (7 products instead of 5): the price of no f32 dQ accumulator in
// global memory and no atomics. That is the deterministic form. The default (non-deterministic)
// form is one fused kernel, bwd_kv_kernel<Traits, true>: each step also stages dS^T in shared
// memory, computes the step's dQ contribution dS K as a wgmma from there, and hands it (staged in
// shared memory) to a writer warp of the producer warpgroup, which has the copy engine add it into
// an f32 accumulator in global memory (cp.reduce.async.bulk); bwd_dq_convert_kernel scales and
// converts it: 5 products, and the order of the additions varies. At d128 (and d64 with a window
// or causal mask) the fused kernel runs on a persistent grid, each CTA walking tiles
// (BwdTraitsBody::kPersistent says which; bwd_kv_kernel's comment says what the walk adds). The
// statistics come from the sm80 preprocess kernel (workspace layout of BwdKernelParams, with
// ws_block = the dQ kernel's block_m); the learnable sink's gradient and the GQA reduction of
// split query heads are the sm80 auxiliary kernels too.
//
// Inside a warpgroup's step the products overlap the element-wise work where the data allow: S
// and dP are two groups (ptxas puts the wait for dP after the first few exponentials; pinning all
// 32 before it with a shared-memory store, as the forward does, was 3-6% slower at d128 without a
// mask, H200 2026-12-02, dev/results/h200-2026-12-02-ab3-*.json); in the fused kernel dV, dQ and dK
// are three groups, so the dQ part is staged while dK runs. No ping-pong between the consumers
// (timed on the two-kernel form: it lost 0-12%).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <climits>
#include <cstdint>
#include <numeric>

#include "cuda/common/cta_order.h"
#include "cuda/common/mask.h"
#include "cuda/common/seq_extent.h"
#include "cuda/ptx/math.h"
#include "cuda/ptx/mbarrier.h"
#include "cuda/ptx/smem_desc.h"
#include "cuda/ptx/tma.h"
#include "cuda/ptx/warpgroup.h"
#include "cuda/ptx/wgmma.h"
#include "cuda/sm80/bwd_common.h"  // BwdKernelParams, query_block_range, MaskMode
#include "cuda/common/score_tensors.h"  // bias_pair_log2
#include "cuda/ptx/ldmatrix.h"
#include "cuda/sm90/bias_layout.h"
#include "cuda/sm90/bwd_mods.h"
#include "cuda/sm90/bwd_sparse.h"
#include "cuda/sm90/bwd_tile_order.h"
#include "cuda/sm90/mask_bits.h"
#include "cuda/sm90/fwd_tile.h"  // setmaxnreg_fits
#include "cuda/sm90/quad_transpose.h"  // the dQ conversion's 16-byte stores
#include "cuda/sm90/tile_feed.h"  // the masked persistent kernels' feed (its first tile is blockIdx.x)

namespace flashattn::cuda::sm90 {

// Compile-time shape of both kernels for one (element type, head dim, mask).
// Registers per consumer thread, dK/dV kernel: dK and dV head_dim / 2 floats each, S^T and dP^T
// block_m / 2 each, P^T and dS^T block_m / 4 (16-bit pairs) each: 224 at d128 under the 240 of
// setmaxnreg. dQ kernel: dQ head_dim / 2, S and dP block_n / 2, dS block_n / 4: 144 at d128.
// d256 (kSplitRoles): dK and dV alone would be 256 per thread, so the two consumers share one
// block of 64 keys by role, not by keys: consumer 0 computes S^T, P^T and dV += P^T dO, consumer
// 1 dP^T, dS^T and dK += dS^T Q, with P^T (f32) handed over in shared memory (bwd_kv_kernel's
// split-role path); 128 + 32 + 16 each. Its dQ kernel steps over 32 keys (shared memory).
// kSparse: the block-sparse backward (BwdSparseTraits below). The two traits share this body,
// and BwdTraits stays a template of its own name and arguments, so the dense instantiations keep
// their symbols and their code.
// kHeadDimV: the width of V, O, dO and dV (head_dim_v); Q, K, dQ and dK are kHeadDim wide. An
// instantiation with kHeadDimV != kHeadDim exists for 192 / 128 only (BwdDvTraits below), on the
// split-role kernels: role P's S^T = K Q^T sums over kHeadDim and its dV over kHeadDimV columns,
// role dS's dP^T = V dO^T sums over kHeadDimV and its dK over kHeadDim: 64 x 64 x 320 MACs a step
// each (d192: 384), so the roles stay balanced.
// kBias: attn_bias (BwdBiasTraits below).
template <typename Element_, int kHeadDim_, MaskMode kMask_, bool kSparse_, bool kMods_ = false,
          int kHeadDimV_ = kHeadDim_, bool kBias_ = false>
struct BwdTraitsBody {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr MaskMode kMask = kMask_;
  // A block mask (block_mask or the compressed lists; attn_mask only as the element mask of
  // partial blocks): each kernel's producer walks its CTA's list of kept tiles (block_tiles.h,
  // build_tile_lists) instead of a range and hands each step's list entry to the consumers in a
  // shared-memory slot of the stage (bwd90::SparseSlot, bwd_sparse.h); skipped tiles are never loaded or computed.
  static constexpr bool kSparse = kSparse_;
  // Softcap and ALiBi (bwd90::ScoreModifiers, bwd_mods.h), under uniform run-time branches, as the forward's
  // kMods kernels. The consumers wait for dP with S (no exponentials under the dP product) and
  // compute P and dS in one pass, which recovers softcap's 1 - tanh^2 from the modified score:
  // no register holds it between the two products. Not with split roles (d192/d256: the dS
  // role never sees S), which keep these calls on sm80.
  static constexpr bool kMods = kMods_;
  // attn_bias (16-bit, the call's dtype), with or without dbias, and/or attn_mask, on the fused
  // kernel: per step the producer copies the bias tile of (query block, key block) into the stage
  // (64 query rows x 128 keys, two 64-key panels of 128-byte swizzled rows, one row when the bias
  // broadcasts over the rows), each consumer reads its scores' words transposed with ldmatrix
  // (bias_t_lane_offset) while S^T runs and adds them after scale / softcap / ALiBi; attn_mask
  // comes packed into bits (mask_bits.h), each thread reading its 16 query rows' words of the key
  // block (copied into the bias slot by the producer when there is no bias); dS, which is dbias,
  // is stored per element in f32 (or summed over the query rows when dbias broadcasts over them).
  // The stage's LSE / D rows then live after the stages (kKvStatsTailBytes), so that at d128 the
  // two 16 KB bias slots fit the 227 KB.
  static constexpr bool kBias = kBias_;
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static constexpr int kPanels = kHeadDim / 64;    // 64-column panels of 128-byte swizzled rows
  static constexpr int kPanelsV = kHeadDimV / 64;  // of a V or dO tile
  static constexpr int kRowBytes = 128;
  // 192 / 128's narrower V and dO tiles leave room for a third stage in both kernels (dK/dV
  // 184 KB, dQ 207 KB against 142 and 166 KB at two). H200 bf16, dsv3 suite, one package each,
  // base / three / base in their own processes: causal +2.3 / +2.0 / +2.1-5.5% at 2k / 4k / 8k
  // (372 / 416 / 440 against 363-364 / 405-408 / 417-431 TFLOP/s), unmasked +0.5-1.5%
  // (dev/results/h200-2026-12-03-s16-dv-{base,st3,base2}-f1b0d74.json).
  static constexpr int kStages = kHeadDimV != kHeadDim ? 3 : 2;
  static constexpr bool kSplitRoles = kHeadDim >= 192;

  // dK/dV kernel: kKvBlockN keys per CTA (64 per consumer; 64 shared by role at d256),
  // kKvBlockM queries per step.
  static constexpr int kKvBlockN = kSplitRoles ? 64 : 64 * kConsumers;
  // kRowSteps128: 128 queries per step for the plain d64 kernels (dense and block-sparse; no
  // softcap / ALiBi / bias), as FlashAttention-3's d64 backward steps; each consumer then holds
  // S^T and dP^T of 64 keys x 128 queries (64 + 64 registers) beside dK and dV (32 + 32), and the
  // fused kernel's dQ product takes the consumer's 64 query rows over all 128 keys and all 64
  // columns (no copy of K's halves). The other kernels keep 64: the bias and mask-bits paths
  // read 64-row slots, and at d128 dK and dV alone are 128 registers.
  // H200 bf16, 64-row steps / 128, same process, twice each (dev/results/
  // h200-2026-12-03-s23-bwd-d64-rows-*-4a67e68.json): backward +4-6% without a mask at 1k-16k,
  // +14-21% causal; 21% fewer instructions per query row in the causal kernel's step loop.
  // The block-sparse d64 kernels step 128 rows too: the plan's key-major lists are built for
  // 128-row query tiles (run_bwd gives build_tile_lists kKvBlockM, and a tile's kind comes from
  // every mask block it touches) and hide_blocked_keys keeps its bits in a 64-bit word. H200
  // bf16, d64 16k, 16 heads, against 64-row steps in one call, twice (dev/results/
  // h200-2026-12-04-s26-sparse-d64-rows128-4c62b3f.json): backward +19.6% at density 0.10 (1.58x
  // FlexAttention), +25.5% at 0.50. The dev/ macro below keeps 64-row sparse steps for A/Bs.
#if defined(FLASHATTN_DEV_SM90_SPARSE_BWD_ROWS64)
  static constexpr bool kRowSteps128 = kHeadDim == 64 && !kSparse && !kMods && !kBias;
#else
  static constexpr bool kRowSteps128 = kHeadDim == 64 && !kMods && !kBias;
#endif
  static constexpr int kKvBlockM = kRowSteps128 ? 128 : 64;
  // dQ kernel: kDqBlockM queries per CTA (64 per consumer), kDqBlockN keys per step.
  static constexpr int kDqBlockM = 64 * kConsumers;
#if defined(FLASHATTN_DEV_SM90_BWD_DQ_BN)
  static constexpr int kDqBlockN = FLASHATTN_DEV_SM90_BWD_DQ_BN;  // dev/ A/B: 128 (S, dP 64 regs each)
#else
  static constexpr int kDqBlockN = kHeadDim == 256 ? 32 : 64;
#endif
  // Workspace rows are allocated in whole blocks of both kernels' query blocks (BwdKernelParams).
  static constexpr int kWsBlock = std::lcm(kDqBlockM, kKvBlockM);

  static constexpr int panel_bytes(int rows) { return rows * kRowBytes; }
  static constexpr int tile_bytes(int rows) { return kPanels * panel_bytes(rows); }     // Q, K
  static constexpr int tile_bytes_v(int rows) { return kPanelsV * panel_bytes(rows); }  // V, dO

  // dK/dV kernel shared memory: K, V (kKvBlockN rows), then kStages x {Q, dO (kKvBlockM rows),
  // LSE*log2e and D (kKvBlockM floats each, padded to 1024 bytes)}, then the barriers.
  static constexpr int kKvStatBytes = kKvBlockM * 4;
  // kBias: the bias slot (kKvBlockM rows x kKvBlockN keys, 16-bit) takes the statistics' place in
  // the stage, and the statistics of all stages go after the stages.
  static constexpr int kBiasTileBytes = kBias ? kKvBlockM * kKvBlockN * 2 : 0;
  static constexpr int kKvStageBytes = tile_bytes(kKvBlockM) + tile_bytes_v(kKvBlockM) + (kBias ? kBiasTileBytes : 1024);
  static constexpr int kKvStatsTailBytes = kBias ? 1024 : 0;
  static constexpr int kKvStagesBytes = kStages * kKvStageBytes + kKvStatsTailBytes;
  static constexpr int kKvBarriers = 1 + 2 * kStages;  // K/V full; per stage full and empty
  // Split roles: P^T of one step (64 x 64 f32 in accumulator order) from consumer 0 to 1.
  static constexpr int kPtBytes = kSplitRoles ? 64 * kKvBlockM * 4 : 0;
  // kSparse: per stage the step's list entry and query head (bwd90::SparseSlot), and one more
  // for the fused kernel's dQ writer, after the barriers.
  static constexpr int kSlotBytes = kSparse ? 8 * (kStages + 1) : 0;
  static constexpr size_t kKvSmemBytes =
      1024 + tile_bytes(kKvBlockN) + tile_bytes_v(kKvBlockN) + kKvStagesBytes + kPtBytes + 8 * kKvBarriers +
      kSlotBytes;

  // dQ kernel: Q, dO (kDqBlockM rows) and their statistics (padded to 1024 bytes), then
  // kStages x {K, V (kDqBlockN rows)}, then the barriers.
  static constexpr int kDqStatBytes = kDqBlockM * 4;
  static constexpr int kDqStageBytes = tile_bytes(kDqBlockN) + tile_bytes_v(kDqBlockN);
  static constexpr int kDqBarriers = 1 + 2 * kStages;  // Q/dO full; per stage full and empty
  static constexpr size_t kDqSmemBytes = 1024 + tile_bytes(kDqBlockM) + tile_bytes_v(kDqBlockM) + 1024 +
                                         kStages * kDqStageBytes + 8 * kDqBarriers + kSlotBytes;

  // The fused dK/dV/dQ kernel (bwd_kv_kernel<Traits, true>, the non-deterministic default): each
  // step also writes dS^T to shared memory (kDsBytes, two buffers by step parity) and computes the
  // step's dQ contribution as a wgmma from there, added into the f32 accumulator in global memory
  // by the copy engine (bulk reduce-add from kDqPartBytes of shared memory per consumer). The
  // consumers split dQ's columns over all 128 keys, after a barrier that says both have written
  // their dS^T rows: 64 each at d128, 32 each at d64 with 64-row steps (kDqKHalves, m64n32
  // products: the d64 softcap / ALiBi, bias and (by default) block-sparse kernels), so a step
  // adds each 64 x 64 block of dQ once. There B is then a 32-column slice of K, which in K's 128-byte
  // swizzled rows starts 64 bytes into each swizzle atom; the PTX ISA's operands are whole atoms
  // (the descriptor's base offset encodes only the row phase, bits 7-9), so each consumer first
  // copies its half of K into 64-byte swizzled rows (kKHalvesBytes), where 32 columns are one atom.
  // Against each consumer taking its own 64 keys and all 64 columns (twice the reduce traffic and
  // staging), H200 bf16, same process (dev/results/h200-2026-12-02-bwd-d64-*.json): +11-12% at
  // 2k/4k/16k without a mask (16k 422 -> 473 TFLOP/s), causal +0.5/0/+4% at 2k/4k/16k, and at 1k
  // without a mask 337 against the two-kernel form's 305, which the dispatcher chose there before.
  // kRowSteps128 instead: consumer c's dQ product is its 64 query rows (the dS^T panel of queries
  // 64c .. 64c + 63) over all 128 keys and all 64 columns, so a part is a whole 64-row block.
  static constexpr bool kDqKHalves = kHeadDim == 64 && !kRowSteps128;
  static constexpr int kDqCols = kRowSteps128 ? kHeadDim : kHeadDim / kConsumers;  // dQ columns per consumer
  static constexpr int kDqKeys = kKvBlockN;              // keys per dQ product
  // dS^T: kKvBlockN key rows per 64-query panel (128-byte swizzled rows), kKvBlockM / 64 panels.
  static constexpr int kDsPanelBytes = kKvBlockN * kRowBytes;
  static constexpr int kDsBytes = kKvBlockN * kKvBlockM * 2;
  static constexpr int kDqPartBytes = 64 * kDqCols * 4;
  // kDqKHalves: K's column halves (32 columns = 64 bytes of each of kKvBlockN rows), half c at c x
  // kKHalfBytes, after the dQ parts.
  static constexpr int kKHalfRowBytes = 64;
  static constexpr int kKHalfBytes = kKvBlockN * kKHalfRowBytes;
  static constexpr int kKHalvesBytes = kDqKHalves ? kConsumers * kKHalfBytes : 0;
  static constexpr int kFusedExtraBytes = 2 * kDsBytes + kConsumers * kDqPartBytes + kKHalvesBytes;
  static constexpr size_t kKvFusedSmemBytes = kKvSmemBytes + kFusedExtraBytes;

  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 192 || kHeadDim == 256, "d64, d128, d192 and d256");
  static_assert(kKvBlockM == 64 || (kKvBlockM == 128 && kRowSteps128 && kConsumers == 2),
                "dS^T rows are 64-query panels of 128 bytes; 128 rows: one panel per consumer's dQ rows");
  // The fused kernel: d64 and d128 (at d256 dK and dV already fill the registers).
  static constexpr bool kHasFused = !kSplitRoles;
  // The fused kernel on a persistent grid (bwd_kv_kernel's kPersistent: min(tiles, SMs) CTAs,
  // each walking tiles), or one CTA per tile; one of the two per instantiation. Measured (H200
  // bf16, one process, persistent / one CTA per tile at 512/1k/2k/4k/16k, dev/results/
  // h200-2026-12-02-ab-bwdpers-{base,pers}-d90547a.json): d128 +3.4/+3.4/+2.2/+1.1/+1.1%, causal
  // +5.4/+3.5/+1.9/+1.2/0%; d64 causal +8.3/+5.7/+3.4/+2.1/-0.1%; d64 unmasked +3.3/+0.7% but
  // -1.5/-2.7/-2.4% from 2k (short steps, and the persistent step loop is ~20 instructions
  // longer), so d64 without a window keeps one CTA per tile. So do softcap/ALiBi at d128 (the
  // persistent form spilled 4 bytes per step in its consumers there) and the block-sparse kernel
  // (its step walk, bwd_sparse.h KvStepWalk, reads blockIdx). The block-sparse kernel on the
  // dynamic feed (each tile's steps handed over through the stage slots, a tile without a step
  // taking one kNoStep stage) was written and measured in s28 (H200 bf16, 16 heads x 16k, 128
  // blocks, alternated twice in one call, dev/results/h200-2026-12-04-s28-sparse-bwd-persistent-da1cae0.json):
  // backward d64 +1.3/+2.0% at density 0.10, -1% at 0.50; d128 -0.8/-1.0% at 0.10, -0.7% at 0.50.
  // Not taken (its tiles carry ~26 steps each at 0.10: the prologue it hides is small).
  static constexpr bool kPersistent = kHasFused && !kSparse && !kBias && !(kMods && kHeadDim == 128) &&
                                      !(kHeadDim == 64 && kMask != MaskMode::kWindow);
  // kPersistent, after the fused kernel's barriers: K and V empty, the tile feed's full and empty
  // pairs, its two slots.
  static constexpr int kPersistentBytes = kPersistent ? 6 * 8 + 2 * 4 : 0;
  static_assert(!kHasFused || kDqCols == (kDqKHalves ? 32 : 64), "the dQ product is m64n64, m64n32 on K's halves");
  static_assert(!kDqKHalves || (kHeadDim == 64 && kConsumers == 2),
                "one 32-column half of K (one 64-byte swizzle atom wide) per consumer");
  static_assert(!kDqKHalves || (2 * tile_bytes(kKvBlockN) + kKvStagesBytes + 2 * kDsBytes +
                                kConsumers * kDqPartBytes) % 1024 == 0,
                "K's halves start on a swizzle period (512 bytes at 64-byte rows): base offset 0");
  static_assert(!kHasFused || kKvFusedSmemBytes + kPersistentBytes <= 232448,
                "the fused kernel fits the 227 KB an sm90 CTA may use");
  static_assert(2 * kKvStatBytes <= 1024 && 2 * kDqStatBytes <= 1024, "statistics fit their padding");
  // Each sequence owns whole kWsBlock blocks of workspace rows (set_workspace_rows), so a step's
  // LSE / D rows and its dQ parts stay inside its sequence's rows only if kWsBlock is a multiple
  // of the step.
  static_assert(kWsBlock % kKvBlockM == 0, "dK/dV steps inside a sequence's workspace rows");
  static_assert(!kHasFused || kConsumers * kDqPartBytes == kKvBlockM * kHeadDim * 4,
                "a step's dQ parts cover its query rows x head_dim once");
  static_assert(setmaxnreg_fits(kProducerRegs, kConsumers, kConsumerRegs, 1),
                "setmaxnreg within the launch's registers (fwd_tile.h setmaxnreg_pool)");
  static_assert(kKvSmemBytes <= 232448 && kDqSmemBytes <= 232448, "fits the 227 KB an sm90 CTA may use");
  static_assert(!kMods || !kSplitRoles, "softcap and ALiBi: d64 and d128 (d192/d256 run them on sm80)");
  static_assert(!kMods || !kSparse, "softcap and ALiBi with a block mask run on sm80");
  static_assert(kHeadDimV == kHeadDim || (kHeadDim == 192 && kHeadDimV == 128 && kSplitRoles && !kSparse && !kMods),
                "head_dim_v != head_dim: 192 / 128 on the dense split-role kernels only");
  static_assert(!kBias || (kMods && !kSparse && kHasFused && kHeadDimV == kHeadDim && kKvBlockN == 128 &&
                           kKvBlockN == kMaskBitsGroupKeys && kKvBlockM == 64 &&
                           kStages * 2 * kKvStatBytes <= kKvStatsTailBytes),
                "attn_bias / attn_mask: the fused kernel at d64 / d128, 64 x 128 bias tiles, a key block per bit group");
};

template <typename Element_, int kHeadDim_, MaskMode kMask_>
struct BwdTraits : BwdTraitsBody<Element_, kHeadDim_, kMask_, false> {};

// The block-sparse backward (kSparse): instantiated with MaskMode::kWindow only, which serves
// calls without a window too (tools/gen_instantiations.py, sm90bwdsparse*).
template <typename Element_, int kHeadDim_, MaskMode kMask_>
struct BwdSparseTraits : BwdTraitsBody<Element_, kHeadDim_, kMask_, true> {};

// Softcap and ALiBi (kMods), without a block mask: d64 with either mask mode, d128 without a
// window (sm90bwdmods*; bwd_dispatch.cu has_mods_kernel says why).
template <typename Element_, int kHeadDim_, MaskMode kMask_>
struct BwdModsTraits : BwdTraitsBody<Element_, kHeadDim_, kMask_, false, true> {};

// head_dim_v != head_dim (kHeadDimV): 192 / 128, DeepSeek-V3's prefill, without softcap, ALiBi
// or a block mask (sm90bwd_hdim192_*_dv128.cu; bwd_dispatch.cu). A template of its own, so
// BwdTraits keeps its arguments and its instantiations their symbols.
template <typename Element_, int kHeadDim_, MaskMode kMask_, int kHeadDimV_>
struct BwdDvTraits : BwdTraitsBody<Element_, kHeadDim_, kMask_, false, false, kHeadDimV_> {};

// attn_bias without attn_mask or a block mask (kBias, with kMods' softcap and ALiBi at run time):
// d64 and d128, the window mask only (it serves calls without one: sm90bwdbias*; bwd_dispatch.cu).
template <typename Element_, int kHeadDim_, MaskMode kMask_>
struct BwdBiasTraits : BwdTraitsBody<Element_, kHeadDim_, kMask_, false, true, kHeadDim_, true> {};

struct BwdMaps {
  CUtensorMap q, k, v, dout;
};

struct BwdKernelArgs {
  BwdMaps kv;  // the dK/dV kernel's maps: Q, dO in kKvBlockM-row boxes, K, V in kKvBlockN
  BwdMaps dq;  // the dQ kernel's maps: Q, dO in kDqBlockM-row boxes, K, V in kDqBlockN
  BwdKernelParams p;
  // Last, so the dense kernels' parameter offsets stay where they were.
  BwdSparseLists sparse;
  BwdSoftcap softcap;
  // kPersistent with a window or causal mask: the tile feed's counter (workspace, zeroed per call).
  int* tile_counter;
  // kBias: attn_bias's map, (keys, rows, heads, batch), boxes of 64 keys x kKvBlockM rows (1 row
  // when it broadcasts over the rows), 128-byte swizzle (make_bias_map).
  CUtensorMap bias;
  // kBias: attn_mask packed into bits (mask_bits.h; words null without attn_mask).
  MaskBits mask_bits;
};

namespace bwd90 {

// S (+)= A B^T over the head dim, both operands K-major (rows of 128-byte swizzled panels).
template <int N, typename Element, int kPanels>
__device__ __forceinline__ void gemm_kmajor(float (&acc)[N / 2], uint64_t a_desc, int a_panel_bytes, uint64_t b_desc,
                                            int b_panel_bytes) {
  using Mma = ptx::Wgmma<N, Element>;
  ptx::wgmma_fence();
#pragma unroll
  for (int panel = 0; panel < kPanels; ++panel) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {  // four k16 steps of 32 bytes per 128-byte row
      Mma::template ss<0>(acc, ptx::desc_advance(a_desc, panel * a_panel_bytes + kk * 32),
                          ptx::desc_advance(b_desc, panel * b_panel_bytes + kk * 32), (panel | kk) != 0 ? 1u : 0u);
    }
  }
}

// D += A B with A from registers (16-bit pairs in the m64k16 fragment order, kK / 16 steps) and
// B MN-major in shared memory (its rows are the k index, its 64-column panels the N index).
template <int N, typename Element, int kK>
__device__ __forceinline__ void gemm_rs(float (&acc)[N / 2], const uint32_t (&a)[kK / 4], uint64_t b_desc) {
  using Mma = ptx::Wgmma<N, Element>;
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    const uint32_t frag[4] = {a[4 * kk], a[4 * kk + 1], a[4 * kk + 2], a[4 * kk + 3]};
    Mma::template rs<1>(acc, frag, ptx::desc_advance(b_desc, kk * 16 * 128), 1u);
  }
}

// Descriptors of a tile of 128-byte swizzled panels: K-major (its rows hold the k index's
// elements) and MN-major (its rows are the k index, its panels `panel_bytes` apart the N index).
__device__ __forceinline__ uint64_t kmajor_desc(uint32_t addr) {
  return ptx::smem_desc(addr, 16, 1024, ptx::SmemSwizzle::k128B);
}
__device__ __forceinline__ uint64_t mn_desc(uint32_t addr, int panel_bytes) {
  return ptx::smem_desc(addr, panel_bytes, 1024, ptx::SmemSwizzle::k128B);
}

// S = A_s B_s^T over the head dim and dP = A_dp B_dp^T over head_dim_v (all K-major), committed
// as two groups (S first) and not waited for: the caller waits for S alone (wgmma_wait<1>),
// starts on the exponentials, then waits for dP (wgmma_wait<0>).
template <int N, typename Traits>
__device__ __forceinline__ void issue_s_dp(float (&s)[N / 2], float (&dp)[N / 2], uint64_t a_s, uint64_t a_dp,
                                           int a_panel_bytes, uint64_t b_s, uint64_t b_dp, int b_panel_bytes) {
  using Element = typename Traits::Element;
  gemm_kmajor<N, Element, Traits::kPanels>(s, a_s, a_panel_bytes, b_s, b_panel_bytes);
  ptx::wgmma_commit();
  gemm_kmajor<N, Element, Traits::kPanelsV>(dp, a_dp, a_panel_bytes, b_dp, b_panel_bytes);
  ptx::wgmma_commit();
}

// Sets the scores of a dK/dV step tile that `mask` hides to -inf. The tile is S^T (keys x
// queries) in accumulator order: element (key `key` + 8h, query m0 + 8c + 2t4 + e) is
// x[4c + 2h + e]. Each of the thread's two keys gets its visible query rows once (key_range),
// then every score is two compares and a select. Callers branch on the block needing a mask
// once, around this call: tested inside the loop, the flag cost a branch per element (ncu at
// d128 4k causal: 6.7% of the samples stalled on branch resolution).
template <int kBlockM>
__device__ __forceinline__ void mask_key_rows(float (&x)[kBlockM / 2], const WindowMask& mask, int m0, int key,
                                              int t4) {
  int lo[2], hi[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) mask.key_range(key + 8 * h, &lo[h], &hi[h]);
#pragma unroll
  for (int c = 0; c < kBlockM / 8; ++c) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int q = m0 + 8 * c + 2 * t4 + e;
        if (q < lo[h] || q >= hi[h]) x[4 * c + 2 * h + e] = -INFINITY;
      }
    }
  }
}

template <typename Element, int n>
__device__ __forceinline__ void pack_pairs(const float (&x)[n], uint32_t (&out)[n / 2]) {
#pragma unroll
  for (int i = 0; i < n / 2; ++i) out[i] = ptx::pack2<Element>(x[2 * i], x[2 * i + 1]);
}

// One arrival per consumer warp frees a buffer only the tensor cores read (K, V: the barriers
// count the consumer warps).
__device__ __forceinline__ void release(uint64_t* bar, int lane) {
  if (lane == 0) ptx::mbarrier_arrive(bar);
}

// Frees a stage. Each lane reads the stage's LSE and D words itself, so each lane's reads must be
// ordered before the copy engine's next writes there. kEveryThread: every consumer thread
// arrives (the empty barriers count the consumer threads; stage_arrivals), its own arrival
// releasing its reads. Otherwise lane 0 arrives for its warp after a __syncwarp(), which orders
// the other lanes' reads before it in the PTX memory model but not in compute-sanitizer's
// racecheck: with lane-0 arrivals, with or without the __syncwarp(), it reported every other
// lane's reads against the next writes (H200, 1 x 2 x 1024 d128, 16 steps over 2 stages: 4 hazard
// sites both ways, dev/results/h200-2026-12-02-san-racecheck-bwd-dense1k-*). Every-thread
// arrivals are the default; the two-kernel form's dK/dV kernel at d128 keeps lane 0's, since
// there (168 registers, no slack) the unpredicated arrival moved ptxas to spill two 64-bit
// values reloaded every step (plain and softcap/ALiBi, ptxas 13.0).
template <bool kEveryThread>
__device__ __forceinline__ void release_stage(uint64_t* bar, int lane) {
  if constexpr (kEveryThread) {
    ptx::mbarrier_arrive(bar);
  } else {
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(bar);
  }
}

// Arrivals that free a stage of a kernel's ring (init_ring's count): every consumer thread's, or
// one per consumer warp (release_stage).
template <bool kEveryThread, int kConsumers>
constexpr int stage_arrivals() {
  return kEveryThread ? 128 * kConsumers : 4 * kConsumers;
}

// dQ (+)= dS K for one step of the fused kernel: A = dS from dS^T in shared memory (MN-major:
// rows are keys, the k index; 64 queries per 128-byte row), B = K MN-major (rows are keys, this
// consumer's N head-dim columns: one panel of 128-byte rows, or with kDqKHalves its half of
// 64-byte rows, kBRowBytes); kKeys / 16 k16 steps of 16 rows.
template <int kKeys, int N, int kBRowBytes, typename Element>
__device__ __forceinline__ void gemm_dq(float (&acc)[N / 2], uint64_t ds_desc, uint64_t k_desc) {
  using Mma = ptx::Wgmma<N, Element>;
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    Mma::template ss<1, 1>(acc, ptx::desc_advance(ds_desc, kk * 16 * 128),
                           ptx::desc_advance(k_desc, kk * 16 * kBRowBytes), kk != 0 ? 1u : 0u);
  }
}

// kDqKHalves: the MN-major descriptor of one half of K in 64-byte swizzled rows. One half is one
// swizzle atom across N (32 columns), so the leading offset (atom to atom along N) is never
// stepped; it is set to the distance between the halves, as for the whole 64-column tile.
// The stride offset steps 8 K-rows (512 bytes, the 64-byte swizzle's period).
template <int kHalfBytes>
__device__ __forceinline__ uint64_t k_half_desc(uint32_t addr) {
  return ptx::smem_desc(addr, kHalfBytes, 8 * 64, ptx::SmemSwizzle::k64B);
}

// kDqKHalves: copies head-dim columns [32 c, 32 c + 32) of the resident K tile (kRows rows of 128
// bytes, 128-byte swizzle: 16-byte chunk j of row r at chunk j ^ (r % 8)) into `half` (kRows rows
// of 64 bytes, 64-byte swizzle, as the copy engine's CU_TENSOR_MAP_SWIZZLE_64B and the
// descriptor read it: the chunk bits 4-5 XOR address bits 7-8, so chunk j of row r sits at
// chunk j ^ ((r / 2) % 4)). `half` is 512-byte aligned. Thread t of the warpgroup moves chunk
// t % 4 of rows t / 4 + 32 i: each warp stores 8 whole rows (512 contiguous bytes) per pass.
// Once per CTA; the caller's proxy fence and the step's dS barrier order it before the products.
template <int kRows>
__device__ __forceinline__ void copy_k_half(const unsigned char* k_tile, unsigned char* half, int c, int tid) {
  const int j = tid % 4;
#pragma unroll
  for (int i = 0; i < kRows / 32; ++i) {
    const int r = tid / 4 + 32 * i;
    const uint4 v = *reinterpret_cast<const uint4*>(k_tile + r * 128 + (((4 * c + j) ^ (r % 8)) << 4));
    *reinterpret_cast<uint4*>(half + r * 64 + ((j ^ ((r / 2) % 4)) << 4)) = v;
  }
}

// Where accumulator value i of warpgroup thread `tid` lives in a 64 x 64 f32 tile kept in
// accumulator order (float4 groups of four values, consecutive threads adjacent: conflict-free):
// the fused kernel's dQ parts (bwd_dq_convert_kernel inverts it) and the d256 P^T handover.
__device__ __forceinline__ int acc_order_index(int i, int tid) { return ((i / 4) * 128 + tid) * 4 + i % 4; }

// The mbarriers of a kernel's ring: `first` (its resident tiles, one arrival), then per stage
// full (the producer's) and empty (`arrivals`: stage_arrivals).
__device__ __forceinline__ void init_ring(uint64_t* first, uint64_t* full, uint64_t* empty, int stages,
                                          int arrivals) {
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(first, 1);
    for (int s = 0; s < stages; ++s) {
      ptx::mbarrier_init(&full[s], 1);
      ptx::mbarrier_init(&empty[s], arrivals);
    }
    ptx::mbarrier_init_fence();
  }
  __syncthreads();
}

// Writes this thread's two rows (row_ptr[h]: row key/query_local + 8h, already offset by its
// first column) of a 64-row f32 accumulator block, scaled, in Element (element (row local + 8h,
// column 8c + 2 t4 + e) is acc[4c + 2h + e]): four chunks' pieces are quad-transposed
// (quad_transpose.h), so each store is 16 contiguous bytes of a row, as the forward stores O, and
// a warp's store covers 8 rows x 64 bytes. Rows with row_ok[h] false are not written. Every lane
// of the warp calls it (the transposes shuffle before the row bound). The dK/dV epilogue and the
// deterministic dQ kernel store through it; the main dK/dV kernel was 4-16% faster at 512-2k with
// it than with each thread's 4-byte pieces, 1-3% at 16k (dev/results/h200-2026-12-02-split-bwd-48180e9.json).
template <typename Element, int kCols>
__device__ __forceinline__ void store_acc_rows(const float (&acc)[kCols / 2], float scale, char* const (&row_ptr)[2],
                                               const bool (&row_ok)[2], int t4) {
  static_assert(kCols % 32 == 0, "whole quad transposes of 8-column chunks");
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int c = 0; c < kCols / 8; c += 4) {
      uint32_t x[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        x[j] = ptx::pack2<Element>(acc[4 * (c + j) + 2 * h] * scale, acc[4 * (c + j) + 2 * h + 1] * scale);
      }
      const uint4 chunk = quad_transpose(x, t4);  // lane t4: chunk c + t4
      if (row_ok[h]) *reinterpret_cast<uint4*>(row_ptr[h] + sizeof(Element) * 8 * c) = chunk;
    }
  }
}

// Writes a 64-row block of dK or dV from its accumulator (rows key_local and +8 of this thread):
// scaled into `out` (Element, strides st) through store_acc_rows, or, when query heads are split
// over CTAs (kv_splits > 1), unscaled into the f32 `partial` that the sm80 reduction kernel
// sums. Every lane of the warp calls it.
template <typename Element, int kHeadDim>
__device__ __forceinline__ void store_kv_grad(const float (&acc)[kHeadDim / 2], const BwdKernelParams& params,
                                              const SeqExtent& seq, int batch, int kv_head, int split, int n0,
                                              int key_local, int keys_here, int t4, float* partial, void* out,
                                              const Strides3& st, float scale) {
  if (params.kv_splits > 1) {
    const int64_t row_base = int64_t(split) * params.total_k + params.k_row0(batch, seq.row0_k) + n0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = key_local + 8 * h;
      if (r >= keys_here) continue;
      const int64_t off = ((row_base + r) * params.heads_k + kv_head) * kHeadDim + 2 * t4;
#pragma unroll
      for (int c = 0; c < kHeadDim / 8; ++c) {
        *reinterpret_cast<float2*>(partial + off + 8 * c) = make_float2(acc[4 * c + 2 * h], acc[4 * c + 2 * h + 1]);
      }
    }
    return;
  }
  char* row_ptr[2];
  bool row_ok[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = key_local + 8 * h;
    const int64_t row = seq.row0_k + n0 + r;
    row_ptr[h] = static_cast<char*>(out) +
                 sizeof(Element) * (batch * st.batch + row * st.row + int64_t(kv_head) * st.head + 8 * t4);
    row_ok[h] = r < keys_here;
  }
  store_acc_rows<Element, kHeadDim>(acc, scale, row_ptr, row_ok, t4);
}

// Tensor-map coordinates: dense operands are (dim, position, head, batch); varlen ones are one
// batch entry of packed tokens.
__device__ __forceinline__ int map_batch(const BwdKernelParams& p, int batch) { return p.is_varlen() ? 0 : batch; }

}  // namespace bwd90

namespace bwd90 {

// One tile of bwd_kv_kernel (key block n_block of plane (kv_head, split, batch)): its keys
// [n0, n0 + keys_here), query blocks [m_lo, m_lo + n_m) of each of the split's query heads from
// head_begin, steps (head, query block) pairs. The consumers hold theirs in one; kv_tile derives
// tile t of BwdTileOrder for the persistent walk (Traits::kPersistent).
struct KvTile {
  int n_block, kv_head, split, batch;
  SeqExtent seq;
  int n0, keys_here, head_begin, m_lo, n_m, steps;
  int64_t ws_row0;
  __device__ __forceinline__ bool exists() const { return n0 < seq.seqlen_k; }
};

// A tile's dense steps in bwd_kv_kernel's order, head-major: query blocks m_lo .. m_lo + n_m - 1
// of each of the split's heads in turn, one advance() per step. No step divides by n_m: the
// window kernels' consumers spent a signed division (about 25 vector instructions, one MUFU.RCP)
// per step on step / n_m and step % n_m, about 4% of a d64 step.
struct DenseWalk {
  int m_lo, m_end;
  int m;     // this step's query block
  int head;  // this step's query head
  __device__ __forceinline__ DenseWalk(int m_lo_, int n_m, int head_begin)
      : m_lo(m_lo_), m_end(m_lo_ + n_m), m(m_lo_), head(head_begin) {}
  __device__ __forceinline__ void advance() {
    if (++m == m_end) {
      m = m_lo;
      ++head;
    }
  }
};

// Tile t's values, as the one-CTA-per-tile launch derives its CTA's at the top of bwd_kv_kernel
// (steps 0 for a tile past its sequence's keys).
template <typename Traits>
__device__ __forceinline__ KvTile kv_tile(const BwdKernelParams& params, const BwdTileOrder& order, int t) {
  constexpr int kBlockN = Traits::kKvBlockN;
  constexpr int kBlockM = Traits::kKvBlockM;
  KvTile w;
  const BwdTileCoord c = order.at(t);
  w.n_block = c.n_block;
  w.kv_head = c.kv_head;
  w.split = c.split;
  w.batch = c.batch;
  w.seq = seq_extent(params, w.batch);
  w.n0 = w.n_block * kBlockN;
  w.keys_here = min(kBlockN, w.seq.seqlen_k - w.n0);
  const int group = params.heads / params.heads_k;
  const int heads_per_split = group / params.kv_splits;
  w.head_begin = w.kv_head * group + w.split * heads_per_split;
  int m_lo = 0, m_hi = (w.seq.seqlen_q + kBlockM - 1) / kBlockM;
  if constexpr (Traits::kMask == MaskMode::kWindow) {
    const WindowMask mask = make_window_mask<true>(w.seq.seqlen_q, w.seq.seqlen_k, params.window_left,
                                                   params.window_right);
    query_block_range(mask, w.n0, w.n0 + w.keys_here, kBlockM, &m_lo, &m_hi);
  }
  w.m_lo = m_lo;
  w.n_m = max(m_hi - m_lo, 0);
  w.steps = w.exists() ? w.n_m * heads_per_split : 0;
  w.ws_row0 = params.ws_row0(w.batch, w.seq.row0_q);
  return w;
}

// The persistent kernel's tiles: the one-CTA-per-tile grid's, (key blocks, heads_k * kv_splits,
// batch), in its CTA order (run_bwd checks that tiles + SMs fits an int).
__device__ __forceinline__ BwdTileOrder kv_tile_order(const BwdKernelParams& params, int block_n) {
  BwdTileOrder o;
  o.blocks = (params.seqlen_k + block_n - 1) / block_n;
  o.kv_splits = params.kv_splits;
  o.planes_y = params.heads_k * params.kv_splits;
  o.planes = o.planes_y * params.batch;
  o.tiles = o.blocks * o.planes;
  o.group = params.cta_group_planes;
  return o;
}

}  // namespace bwd90

// Named barriers (ids from 3: 0 is __syncthreads, 1 and 2 the forward's turns). Of the fused
// kernel: dS^T of both consumers written (every fused kernel: each dQ product reads both
// consumers' dS^T rows); per consumer c, its dQ
// part staged in shared memory (full, kDqFullBarrier0 + c) and read by the copy engine (empty,
// kDqEmptyBarrier0 + c), each between that consumer's warpgroup and the dQ writer warp
// (128 + 32 threads). Of the split-role kernel (d256): P^T of a step written by consumer 0, and
// read by consumer 1.
constexpr int kDsReadyBarrier = 3;
constexpr int kDqFullBarrier0 = 4;
constexpr int kDqEmptyBarrier0 = 6;
constexpr int kDqHandoffThreads = 128 + 32;
constexpr int kPtReadyBarrier = 3;
constexpr int kPtFreeBarrier = 4;

namespace bwd90 {

// The fused kernels' dQ writer warp, per step: each consumer's part, once staged, to the copy
// engine, which adds it into the query block's f32 accumulator at gdq.
template <typename Traits>
__device__ __forceinline__ void add_dq_parts(float* gdq, float* sDq, int lane) {
#pragma unroll
  for (int c = 0; c < Traits::kConsumers; ++c) {
    ptx::named_barrier_sync(kDqFullBarrier0 + c, kDqHandoffThreads);
    if (lane == 0) {
      ptx::bulk_reduce_add_f32(gdq + c * (Traits::kDqPartBytes / 4), sDq + c * (Traits::kDqPartBytes / 4),
                               Traits::kDqPartBytes);
      ptx::bulk_commit_group();
    }
  }
}

// And each part's buffer back to its consumer as soon as the engine has read it (consumer 0's
// part first).
template <typename Traits>
__device__ __forceinline__ void hand_back_dq_parts(int lane) {
  static_assert(Traits::kConsumers == 2, "one wait_group.read count per part");
  if (lane == 0) ptx::bulk_wait_group_read<1>();
  __syncwarp();
  ptx::named_barrier_arrive(kDqEmptyBarrier0, kDqHandoffThreads);
  if (lane == 0) ptx::bulk_wait_group_read<0>();
  __syncwarp();
  ptx::named_barrier_arrive(kDqEmptyBarrier0 + 1, kDqHandoffThreads);
}

// Part `part` (kDqCols columns) of a 64-row f32 dQ block in accumulator order (acc_order_index:
// thread t of the warpgroup that computed it holds float4 t + 128 j of the part, its 8-column
// chunk j, rows r and r + 8, two columns each), scaled and converted, as thread t would store it:
// four chunks' pieces quad-transposed (quad_transpose.h), so each store is 16 contiguous bytes of
// a row. load(j, h) gives the pair of row r + 8h from float4 j. dq: the (batch, head)'s first
// element (bytes); the block is rows m0 .. m0 + 63 of the sequence (seqlen_q rows, the first at
// dq's row row0_q), those past seqlen_q not written. Every lane of the warp calls it, t % 32 its
// lane.
template <typename Traits, typename Load>
__device__ __forceinline__ void store_dq_part(const Load& load, int t, int part, char* dq, int64_t row_stride,
                                              int64_t row0_q, int m0, int seqlen_q, float scale) {
  using Element = typename Traits::Element;
  constexpr int kChunks = Traits::kDqCols / 8;
  static_assert(kChunks % 4 == 0, "whole quad transposes per part");
  const int t4 = t & 3;  // t >= 0: as bits (no signed divisions)
  const int row = 16 * (t >> 5) + ((t & 31) >> 2);
#pragma unroll
  for (int c = 0; c < kChunks; c += 4) {
    const int col = part * Traits::kDqCols + 8 * (c + t4);  // this lane's chunk after the transpose
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t x[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 v = load(c + j, h);
        x[j] = ptx::pack2<Element>(v.x * scale, v.y * scale);
      }
      const uint4 chunk = quad_transpose(x, t4);  // every lane, before the row bound
      const int r = m0 + row + 8 * h;
      if (r < seqlen_q) *reinterpret_cast<uint4*>(dq + sizeof(Element) * ((row0_q + r) * row_stride + col)) = chunk;
    }
  }
}

}  // namespace bwd90

// dK/dV, and with kFusedDq dQ too (the consumers split its columns, or with kRowSteps128 its
// rows: BwdTraitsBody::kDqCols).
// One CTA per tile (key block, plane = kv head x split x batch): grid (key blocks of the longest
// sequence, heads_k * kv_splits, batch). Or, fused with Traits::kPersistent, min(tiles, SMs) CTAs
// that each walk tiles in BwdTileOrder (bwd_tile_order.h): tile t is the slot CTA t has in the
// one-CTA launch, so the tiles in flight share planes as there. The step body is the same; what
// the walk adds (each `if constexpr (kPersistent)`, compiled away otherwise):
//  - the tiles: static rounds without a mask (equal tiles), a dynamic feed under a window or
//    causal mask (TileFeed; static rounds left the busiest CTA 1.13-1.55x the mean work
//    at d128 causal 512-16k in the host model of tests/cpp/test_bwd_tile_order.cpp, greedy
//    dispatch in tile order 1.00-1.02x);
//  - every ring counts across tiles: the Q/dO/LSE/D stages by the CTA's step count `it` (stage
//    it % kStages, phase (it / kStages) & 1), the resident K/V by the count of tiles with steps
//    `kv_it`, the dS^T buffers by `it`'s parity (by the tile's step parity, a one-step tile
//    followed by another would have both tiles' step 0 in one buffer while the other consumer's
//    dQ product may still read it);
//  - K and V have "empty" barriers (one arrival per consumer warp, as the stages'): V is free
//    once the tile's last dP^T is done, K once its last dQ product is (kDqKHalves: its last S^T;
//    the dQ product reads the consumer's copy of K's half), so the producer loads the next tile's V, then
//    K, while the consumers finish the last step and store dK/dV. The producer issues the next
//    tile's first stage before waiting for them;
//  - the dQ writer warp walks the same tiles and hands each buffer back at the top of the next
//    step of the CTA (so it never hands one back after the CTA's last step, as before).
// Every tile-derived value comes from blockIdx.x and the round or the feed's uniform word (no
// plain shared-memory read), so it stays on the uniform datapath. The protocol's host model:
// dev/bwd_persistent_protocol.py.
template <typename Traits, bool kFusedDq>
__global__ void __launch_bounds__(Traits::kThreads, 1) bwd_kv_kernel(const __grid_constant__ BwdKernelArgs args) {
  using Element = typename Traits::Element;
  constexpr int kBlockN = Traits::kKvBlockN;
  constexpr int kBlockM = Traits::kKvBlockM;
  constexpr int kStages = Traits::kStages;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr bool kPersistent = kFusedDq && Traits::kPersistent;
  // Masked persistent launches take their tiles from the feed, unmasked ones in static rounds.
  constexpr bool kDynamic = kPersistent && Traits::kMask == MaskMode::kWindow;
  const BwdKernelParams& params = args.p;
  // kPersistent: the tiles, and this CTA's place among the CTAs. It derives its tiles' values
  // with bwd90::kv_tile; the one-CTA launch's below (n_block ... ws_row0, from the CTA's slot)
  // are then left unused, except as the consumers' initial w, which the first tile replaces.
  [[maybe_unused]] const BwdTileOrder order = bwd90::kv_tile_order(params, kBlockN);
  [[maybe_unused]] const int cta = int(blockIdx.x);
  [[maybe_unused]] const int ctas = int(gridDim.x);

  // Causal launches start the key blocks of params.cta_group_planes (kv head, split, batch)
  // planes interleaved, heaviest (the first key block) first (cuda/common/cta_order.h); 1: the
  // plain order. Against blockIdx order, H200 bf16, same session (dev/results/
  // h200-2026-12-02-ab-bwdorder-{plain,main}.json): causal d128 +3.1/+4.1% at 2k/4k, d64
  // +1.3/+2.7%, 1k and 16k within 1%; unmasked launches (group 1) within noise.
  const CtaSlot slot = this_cta_slot(params.cta_group_planes);
  const int n_block = slot.block;
  const int kv_head = int(slot.plane % gridDim.y) / params.kv_splits;
  const int split = int(slot.plane % gridDim.y) % params.kv_splits;
  const int batch = int(slot.plane / gridDim.y);
  const SeqExtent seq = seq_extent(params, batch);
  const int n0 = n_block * kBlockN;
  if constexpr (!kPersistent) {
    if (n0 >= seq.seqlen_k) return;  // past this sequence's keys (varlen): the whole CTA leaves
  }
  int keys_here = min(kBlockN, seq.seqlen_k - n0);
  const int group = params.heads / params.heads_k;
  const int heads_per_split = group / params.kv_splits;
  const int head_begin = kv_head * group + split * heads_per_split;

  WindowMask mask = make_window_mask<Traits::kMask == MaskMode::kWindow>(
      seq.seqlen_q, seq.seqlen_k, params.window_left, params.window_right);
  int m_lo = 0, m_hi = (seq.seqlen_q + kBlockM - 1) / kBlockM;
  if constexpr (Traits::kMask == MaskMode::kWindow) {
    query_block_range(mask, n0, n0 + keys_here, kBlockM, &m_lo, &m_hi);
  }
  const int n_m = max(m_hi - m_lo, 0);
  // (head, query block) pairs, head-major. kSparse: the consumers learn theirs from the producer.
  int steps = n_m * heads_per_split;
  const int64_t ws_row0 = params.ws_row0(batch, seq.row0_q);

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = ptx::align_shared<1024>(smem_raw);
  unsigned char* sK = smem;
  unsigned char* sV = sK + Traits::tile_bytes(kBlockN);
  unsigned char* stages = sV + Traits::tile_bytes_v(kBlockN);
  // Fused: dS^T (two buffers), then one f32 dQ part per consumer (kDqKHalves: then K's halves),
  // before the barriers.
  unsigned char* sDs = stages + Traits::kKvStagesBytes;
  float* sDq = reinterpret_cast<float*>(sDs + 2 * Traits::kDsBytes);
  [[maybe_unused]] unsigned char* sKh =
      reinterpret_cast<unsigned char*>(sDq) + Traits::kConsumers * Traits::kDqPartBytes;
  using Walk = bwd90::DenseWalk;
  // Split roles (d256): P^T handed from consumer 0 to 1, before the barriers.
  float* sPt = reinterpret_cast<float*>(stages + Traits::kKvStagesBytes);
  uint64_t* bars = reinterpret_cast<uint64_t*>(stages + Traits::kKvStagesBytes + Traits::kPtBytes +
                                               (kFusedDq ? Traits::kFusedExtraBytes : 0));
  uint64_t* kv_full = bars;
  uint64_t* full = bars + 1;               // [kStages]
  uint64_t* empty = bars + 1 + kStages;    // [kStages]
  // kSparse: [kStages] after the barriers, then the fused kernel's dQ writer's (Traits::kSlotBytes).
  [[maybe_unused]] bwd90::SparseSlot* slots = reinterpret_cast<bwd90::SparseSlot*>(bars + Traits::kKvBarriers);
  // kPersistent, after the barriers instead (Traits::kPersistentBytes): K and V free, the tile feed.
  [[maybe_unused]] uint64_t* k_empty = bars + Traits::kKvBarriers;
  [[maybe_unused]] uint64_t* v_empty = bars + Traits::kKvBarriers + 1;
  [[maybe_unused]] const TileFeed feed{reinterpret_cast<int*>(bars + Traits::kKvBarriers + 6),
                                                bars + Traits::kKvBarriers + 2, bars + Traits::kKvBarriers + 4};
  const auto stage_q = [&](int s) { return stages + s * Traits::kKvStageBytes; };
  const auto stage_do = [&](int s) { return stage_q(s) + Traits::tile_bytes(kBlockM); };
  // kBias: the bias slot follows dO, and the statistics of stage s are in the tail after the
  // stages (BwdTraitsBody::kKvStatsTailBytes).
  [[maybe_unused]] const auto stage_bias = [&](int s) { return stage_do(s) + Traits::tile_bytes_v(kBlockM); };
  const auto stage_lse = [&](int s) {
    if constexpr (Traits::kBias) {
      return reinterpret_cast<float*>(stages + kStages * Traits::kKvStageBytes) + s * 2 * kBlockM;
    } else {
      return reinterpret_cast<float*>(stage_do(s) + Traits::tile_bytes_v(kBlockM));
    }
  };
  const auto stage_dsum = [&](int s) { return stage_lse(s) + kBlockM; };

  const int warpgroup = threadIdx.x / 128;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  // Every-thread stage releases (release_stage) but in the two-kernel form's d128 dK/dV kernel.
  constexpr bool kEveryThread = kFusedDq || Traits::kSplitRoles || kHeadDim != 128;
  bwd90::init_ring(kv_full, full, empty, kStages, bwd90::stage_arrivals<kEveryThread, Traits::kConsumers>());
  if constexpr (kPersistent) {
    if (threadIdx.x == 0) {
      ptx::mbarrier_init(k_empty, 4 * Traits::kConsumers);
      ptx::mbarrier_init(v_empty, 4 * Traits::kConsumers);
      for (int i = 0; i < 2; ++i) {
        ptx::mbarrier_init(&feed.full[i], 1);
        ptx::mbarrier_init(&feed.empty[i], 4 * Traits::kConsumers + 1);  // consumer warps, dQ writer
      }
      ptx::mbarrier_init_fence();
    }
    __syncthreads();
  }

  if (warpgroup == 0) {
    ptx::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    if constexpr (kPersistent) {
      if (warp == 1) {
        // The dQ writer: the one-CTA launch's (below), over the CTA's steps of all its tiles. The
        // buffers go back at the top of the next step (the first one: both, as at that launch's
        // start), so none goes back after the CTA's last step (an arrival nobody would sync).
        bool started = false;
#pragma unroll 1
        for (int r = 0;; ++r) {
          const int t = kDynamic ? take_tile(feed, r, lane) : BwdTileOrder::cta_tile(r, cta, ctas);
          if (t >= order.tiles) break;
          const bwd90::KvTile w = bwd90::kv_tile<Traits>(params, order, t);
          Walk walk(w.m_lo, w.n_m, w.head_begin);
#pragma unroll 1
          for (int step = 0; step < w.steps; ++step, walk.advance()) {
            float* gdq =
                params.dq_accum + (int64_t(walk.head) * params.ws_rows + w.ws_row0 + walk.m * kBlockM) * kHeadDim;
            if (!started) {
#pragma unroll
              for (int c = 0; c < Traits::kConsumers; ++c) {
                ptx::named_barrier_arrive(kDqEmptyBarrier0 + c, kDqHandoffThreads);
              }
              started = true;
            } else {
              bwd90::hand_back_dq_parts<Traits>(lane);
            }
            bwd90::add_dq_parts<Traits>(gdq, sDq, lane);
          }
        }
        if (lane == 0) ptx::bulk_wait_group<0>();  // the adds done before the CTA's shared memory goes
        return;
      }
      if (warp != 0 || lane != 0) return;
      int it = 0;     // stage loads issued so far, over the CTA's tiles
      int kv_it = 0;  // K/V loads issued so far
      const int heads_per_split = params.heads / params.heads_k / params.kv_splits;
#pragma unroll 1
      for (int r = 0;; ++r) {
        int t;
        if constexpr (kDynamic) {
          // Uniform register (redux.sync over the one producer lane), as the forward's feed.
          t = r == 0 ? cta : int(__reduce_max_sync(1u, unsigned(atomicAdd(args.tile_counter, 1)))) + ctas;
          publish_tile(feed, r, t);
        } else {
          t = BwdTileOrder::cta_tile(r, cta, ctas);
        }
        if (t >= order.tiles) break;
        const bwd90::KvTile w = bwd90::kv_tile<Traits>(params, order, t);
        if (w.steps == 0) continue;  // nothing loaded; the consumers store zeros (or nothing)
        const int mb = bwd90::map_batch(params, w.batch);
        const int row0_q = int(w.seq.row0_q);
        bool kv_pending = true;
        // Steps head by head, the query blocks of a head in order (bwd_kv_kernel's step order),
        // without its division by n_m. The first stage needs only the previous tile's
        // second-to-last step done, so it goes before the K/V, which need its last.
#pragma unroll 1
        for (int head = w.head_begin; head < w.head_begin + heads_per_split; ++head) {
          const int64_t ws_head = int64_t(head) * params.ws_rows + w.ws_row0;
#pragma unroll 1
          for (int m_step = w.m_lo * kBlockM; m_step < (w.m_lo + w.n_m) * kBlockM; m_step += kBlockM) {
            const int m0 = m_step;
            const int s = it % kStages;
            ptx::mbarrier_wait(&empty[s], ((it / kStages) & 1) ^ 1);
            ptx::mbarrier_arrive_expect_tx(&full[s], Traits::tile_bytes(kBlockM) + Traits::tile_bytes_v(kBlockM) +
                                                         2 * Traits::kKvStatBytes);
#pragma unroll
            for (int panel = 0; panel < Traits::kPanels; ++panel) {
              ptx::tma_load_4d(stage_q(s) + panel * Traits::panel_bytes(kBlockM), &args.kv.q, &full[s], 64 * panel,
                               row0_q + m0, head, mb);
              if (panel < Traits::kPanelsV) {
                ptx::tma_load_4d(stage_do(s) + panel * Traits::panel_bytes(kBlockM), &args.kv.dout, &full[s],
                                 64 * panel, row0_q + m0, head, mb);
              }
            }
            ptx::bulk_load(stage_lse(s), params.lse_log2 + ws_head + m0, Traits::kKvStatBytes, &full[s]);
            ptx::bulk_load(stage_dsum(s), params.dsum + ws_head + m0, Traits::kKvStatBytes, &full[s]);
            ++it;
            if (kv_pending) {
              kv_pending = false;
              const int kv_phase = (kv_it & 1) ^ 1;
              ++kv_it;
              ptx::mbarrier_wait(v_empty, kv_phase);
              ptx::mbarrier_arrive_expect_tx(kv_full, Traits::tile_bytes(kBlockN) + Traits::tile_bytes_v(kBlockN));
#pragma unroll
              for (int panel = 0; panel < Traits::kPanelsV; ++panel) {
                ptx::tma_load_4d(sV + panel * Traits::panel_bytes(kBlockN), &args.kv.v, kv_full, 64 * panel,
                                 int(w.seq.row0_k) + w.n0, w.kv_head, mb);
              }
              ptx::mbarrier_wait(k_empty, kv_phase);
#pragma unroll
              for (int panel = 0; panel < Traits::kPanels; ++panel) {
                ptx::tma_load_4d(sK + panel * Traits::panel_bytes(kBlockN), &args.kv.k, kv_full, 64 * panel,
                                 int(w.seq.row0_k) + w.n0, w.kv_head, mb);
              }
            }
          }
        }
      }
      return;
    }
    if constexpr (kFusedDq) {
      // The dQ writer (warp 1): per step, each consumer's staged dQ part goes to the copy engine,
      // which adds it into the query block's f32 accumulator; once the engine has read both
      // parts the buffers are handed back. The consumers only stage (FA3 gives this to a warp of
      // its producer warpgroup too), so no consumer waits on a bulk group.
      if (warp == 1) {
        if constexpr (Traits::kSparse) {
          // The step of each part comes with it from consumer 0 (its slot after the stages':
          // entry and head, kNoStep when the CTA has no step, which both consumers then hand
          // over once without a part), so this warp needs no walk of its own. Otherwise as below.
          const bwd90::SparseSlot* step_slot = slots + kStages;
#pragma unroll
          for (int c = 0; c < Traits::kConsumers; ++c) ptx::named_barrier_arrive(kDqEmptyBarrier0 + c, kDqHandoffThreads);
          for (;;) {
            int entry = 0, head = 0;
#pragma unroll
            for (int c = 0; c < Traits::kConsumers; ++c) {
              ptx::named_barrier_sync(kDqFullBarrier0 + c, kDqHandoffThreads);
              if (c == 0) {
                entry = step_slot->entry;
                head = step_slot->head;
              }
              if (entry != bwd90::kNoStep && lane == 0) {
                const int m0 = (entry & kTileIndexMask) * kBlockM;
                float* gdq = params.dq_accum + (int64_t(head) * params.ws_rows + ws_row0 + m0) * kHeadDim;
                ptx::bulk_reduce_add_f32(gdq + c * (Traits::kDqPartBytes / 4), sDq + c * (Traits::kDqPartBytes / 4),
                                         Traits::kDqPartBytes);
                ptx::bulk_commit_group();
              }
            }
            if (entry == bwd90::kNoStep || (entry & bwd90::kLastStep) != 0) break;
            bwd90::hand_back_dq_parts<Traits>(lane);
          }
          if (lane == 0) ptx::bulk_wait_group<0>();
          return;
        }
        if (steps == 0) return;
#pragma unroll
        for (int c = 0; c < Traits::kConsumers; ++c) ptx::named_barrier_arrive(kDqEmptyBarrier0 + c, kDqHandoffThreads);
        Walk walk(m_lo, n_m, head_begin);
        for (int step = 0; step < steps; ++step, walk.advance()) {
          float* gdq = params.dq_accum + (int64_t(walk.head) * params.ws_rows + ws_row0 + walk.m * kBlockM) * kHeadDim;
          bwd90::add_dq_parts<Traits>(gdq, sDq, lane);
          if (step + 1 < steps) bwd90::hand_back_dq_parts<Traits>(lane);
        }
        if (lane == 0) ptx::bulk_wait_group<0>();  // the adds done before the CTA's shared memory goes
        return;
      }
    }
    // The producer thread's copies: K and V once per CTA, and per step (stage s) the query block
    // at m0 of `head`: Q, dO and their rows of LSE and D. Shared by the block-sparse walk and the
    // dense steps below.
    const auto load_kv = [&](int mb) {
      ptx::mbarrier_arrive_expect_tx(kv_full, Traits::tile_bytes(kBlockN) + Traits::tile_bytes_v(kBlockN));
#pragma unroll
      for (int panel = 0; panel < Traits::kPanels; ++panel) {
        ptx::tma_load_4d(sK + panel * Traits::panel_bytes(kBlockN), &args.kv.k, kv_full, 64 * panel,
                         int(seq.row0_k) + n0, kv_head, mb);
        if (panel < Traits::kPanelsV) {
          ptx::tma_load_4d(sV + panel * Traits::panel_bytes(kBlockN), &args.kv.v, kv_full, 64 * panel,
                           int(seq.row0_k) + n0, kv_head, mb);
        }
      }
    };
    const auto load_step = [&](int s, int head, int m0, int mb) {
      // kBias: the bias tile of (query block m0, this key block), keys in two 64-key panels;
      // coordinate 0 where the bias broadcasts (its map has extent 1 there). Positions in the
      // sequence, as the forward's bias tile.
      // attn_mask without attn_bias: the step's packed words (64 rows of 16 bytes of this key
      // block's group, one row when the mask broadcasts over the rows; group-major, mask_bits.h)
      // by one bulk copy into the unused bias slot.
      int bias_bytes = 0, mask_bytes = 0;
      if constexpr (Traits::kBias) {
        bias_bytes = !params.bias.defined() ? 0 : params.bias.row == 0 ? 2 * Traits::kRowBytes : Traits::kBiasTileBytes;
        if (!params.bias.defined() && args.mask_bits.words != nullptr) {
          mask_bytes = kMaskBitsGroupWords * 4 * (args.mask_bits.row == 0 ? 1 : kBlockM);
        }
      }
      ptx::mbarrier_arrive_expect_tx(&full[s], Traits::tile_bytes(kBlockM) + Traits::tile_bytes_v(kBlockM) +
                                                   2 * Traits::kKvStatBytes + bias_bytes + mask_bytes);
      if (mask_bytes != 0) {
        const MaskBits& mb = args.mask_bits;
        ptx::bulk_load(stage_bias(s), mb.words + mask_bits_row_word(mb, batch, head, m0, 0) + mb.group * (n0 / kBlockN),
                       uint32_t(mask_bytes), &full[s]);
      }
      if (bias_bytes != 0) {
        const Broadcast4& b = params.bias;
#pragma unroll
        for (int panel = 0; panel < 2; ++panel) {
          ptx::tma_load_4d(stage_bias(s) + panel * Traits::panel_bytes(kBlockM), &args.bias, &full[s],
                           n0 + 64 * panel, b.row == 0 ? 0 : m0, b.head == 0 ? 0 : head, b.batch == 0 ? 0 : batch);
        }
      }
#pragma unroll
      for (int panel = 0; panel < Traits::kPanels; ++panel) {
        ptx::tma_load_4d(stage_q(s) + panel * Traits::panel_bytes(kBlockM), &args.kv.q, &full[s], 64 * panel,
                         int(seq.row0_q) + m0, head, mb);
        if (panel < Traits::kPanelsV) {
          ptx::tma_load_4d(stage_do(s) + panel * Traits::panel_bytes(kBlockM), &args.kv.dout, &full[s], 64 * panel,
                           int(seq.row0_q) + m0, head, mb);
        }
      }
      const int64_t ws = int64_t(head) * params.ws_rows + ws_row0 + m0;
      ptx::bulk_load(stage_lse(s), params.lse_log2 + ws, Traits::kKvStatBytes, &full[s]);
      ptx::bulk_load(stage_dsum(s), params.dsum + ws, Traits::kKvStatBytes, &full[s]);
    };
    if constexpr (Traits::kSparse) {
      // The kept steps only (KvStepWalk), loaded as the dense steps below; each one's entry and
      // head go into its stage's slot before the "full" arrival, the last one marked. Without a
      // step nothing is loaded and stage 0 (never used, so free) says so to the consumers.
      if (warp != 0 || lane != 0) return;
      const bwd90::KvStepWalk walk{params, args.sparse, n_m > 0 ? head_begin + heads_per_split : head_begin, m_lo,
                                   m_hi};
      bwd90::KvStep cur = walk.first(head_begin);
      if (!walk.valid(cur)) {
        slots[0].entry = bwd90::kNoStep;
        ptx::mbarrier_arrive(&full[0]);
        return;
      }
      const int mb = bwd90::map_batch(params, batch);
      load_kv(mb);
#pragma unroll 1
      for (int step = 0;; ++step) {
        const bwd90::KvStep next = walk.next(cur);
        const int s = step % kStages;
        const int head = cur.head;
        const int m0 = (cur.entry & kTileIndexMask) * kBlockM;
        ptx::mbarrier_wait(&empty[s], ((step / kStages) & 1) ^ 1);
        slots[s].entry = cur.entry | (walk.valid(next) ? 0 : bwd90::kLastStep);
        slots[s].head = head;
        load_step(s, head, m0, mb);
        if (!walk.valid(next)) break;
        cur = next;
      }
      return;
    }
    // No copy may still be landing when the CTA ends: without a step nothing is loaded.
    if (warp != 0 || lane != 0 || steps == 0) return;
    const int mb = bwd90::map_batch(params, batch);
    load_kv(mb);
    Walk walk(m_lo, n_m, head_begin);
#pragma unroll 1
    for (int step = 0; step < steps; ++step, walk.advance()) {
      const int s = step % kStages;
      ptx::mbarrier_wait(&empty[s], ((step / kStages) & 1) ^ 1);
      load_step(s, walk.head, walk.m * kBlockM, mb);
    }
    return;
  }

  ptx::warpgroup_reg_alloc<Traits::kConsumerRegs>();
  const int consumer = warpgroup - 1;
  const int g = lane / 4;
  const int t4 = lane % 4;
  if constexpr (Traits::kSplitRoles) {
    // d256: both consumers take the CTA's 64 keys; consumer 0 (role P) computes S^T, P^T and
    // dV += P^T dO, consumer 1 (role dS) dP^T, dS^T = P^T (dP^T - D) and dK += dS^T Q. P^T goes
    // from one to the other in f32 through sPt in accumulator order (thread t of each writes or
    // reads the same 32 values: conflict-free float4s), one step in flight (P ready / P free).
    static_assert(!kFusedDq, "the split-role kernel is the two-kernel form");
    constexpr int kS = kBlockM / 2;
    // kHeadDimV != kHeadDim (192 / 128): role P's S^T sums over head_dim and its dV has head_dim_v
    // columns, role dS's dP^T sums over head_dim_v; so each product is one branch per role, and
    // dV lives in the first kHeadDimV / 2 registers of acc (the roles share the allocation). The
    // role is then read from lane 0, so that ptxas sees a warp-uniform value (without it, it
    // serialised the wgmmas of the divergent-looking paths: C7520).
    constexpr bool kSameDims = Traits::kHeadDimV == kHeadDim;
    const bool role_p = (kSameDims ? consumer : __shfl_sync(0xffffffffu, consumer, 0)) == 0;
    const int tid_wg = threadIdx.x % 128;
    const int key_local = (warp % 4) * 16 + g;  // this thread's keys: +0 and +8
    const uint64_t a_desc = bwd90::kmajor_desc(ptx::smem_u32(role_p ? sK : sV));
    float acc[kHeadDim / 2];  // dV (role P) or dK (role dS): 64 keys x head_dim (dV: head_dim_v)
    [[maybe_unused]] auto& acc_v = *reinterpret_cast<float(*)[Traits::kHeadDimV / 2]>(&acc[0]);
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) acc[i] = 0.0f;
    if constexpr (Traits::kSparse) {  // as in the other consumers below
      ptx::mbarrier_wait(&full[0], 0);
      steps = bwd90::slot_word(&slots[0].entry, lane) == bwd90::kNoStep ? 0 : INT_MAX;
    }
    if (steps > 0) ptx::mbarrier_wait(kv_full, 0);
    // As the other consumers below: walked query blocks, and the blocks that need no mask.
    bwd90::DenseWalk walk(m_lo, n_m, head_begin);
    [[maybe_unused]] int clean_lo = 0, clean_hi = 0;
    if constexpr (Traits::kMask == MaskMode::kWindow && !Traits::kSparse) {
      mask.unmasked_row_blocks(n0, n0 + kBlockN, kBlockM, &clean_lo, &clean_hi);
    }
    // Role P: P^T = exp2(S^T scale - LSE) in place, then handed to role dS in sPt once it has read
    // the last one (P free), and announced (P ready).
    const auto hand_over_p = [&](float (&x)[kS], const float2 (&lse)[kBlockM / 8], int step) {
#pragma unroll
      for (int c = 0; c < kBlockM / 8; ++c) {
        const float2 l = lse[c];
#pragma unroll
        for (int i = 4 * c; i < 4 * c + 4; ++i) {
          x[i] = ptx::exp2_approx(fmaf(x[i], params.scale_log2, -(i % 2 == 0 ? l.x : l.y)));
        }
      }
      if (step > 0) ptx::named_barrier_sync(kPtFreeBarrier, 256);  // the other read the last one
#pragma unroll
      for (int i = 0; i < kS; i += 4) {
        *reinterpret_cast<float4*>(sPt + bwd90::acc_order_index(i, tid_wg)) = make_float4(x[i], x[i + 1], x[i + 2], x[i + 3]);
      }
      __threadfence_block();  // the stores before the arrival (bar.arrive alone does not wait for them)
      ptx::named_barrier_arrive(kPtReadyBarrier, 256);
    };
    // 192 / 128 (kPipe): each role issues the next step's first product (S^T or dP^T) right after
    // this step's last one (dV or dK) and waits for the last one behind it, so the tensor pipe
    // has it queued instead of idling through the role's wait, its loop and its stage wait. Every
    // split-role kernel reads LSE or D into registers before it waits for the first product (they
    // were read after it, and their latency was exposed: ncu at 192/128 8k causal, 6% of the
    // samples each on the first FFMA and FADD that use them). H200 bf16, dsv3 shapes, three
    // packages in one call, each twice (dev/results/h200-2026-12-03-s17-dvpipe-*-157e05b.json):
    // registers alone +3-6% causal at 4k / 8k and +3% unmasked at 8k, with kPipe +5-7% causal
    // and +6% unmasked at 8k. ptxas: 0 spills; it adds an empty wgmma where the two roles'
    // branches join (their products stay in flight across it). d192 and d256 keep the serial
    // step: pipelined at d256 it lost 3-5% (2k / 8k, causal and not, twice each in one call,
    // dev/results/h200-2026-12-03-s18-lsefirst-*-a917363.json, the "both" package).
    constexpr bool kPipe = !kSameDims;
    // S^T = K Q^T (role P, over head_dim) or dP^T = V dO^T (role dS, over head_dim_v) of the
    // query block in stage s, committed and not waited for.
    const auto issue_first = [&](float (&x)[kS], int s) {
      if constexpr (kSameDims) {
        bwd90::gemm_kmajor<kBlockM, Element, Traits::kPanels>(
            x, a_desc, Traits::panel_bytes(kBlockN), bwd90::kmajor_desc(ptx::smem_u32(role_p ? stage_q(s) : stage_do(s))),
            Traits::panel_bytes(kBlockM));
      } else if (role_p) {
        bwd90::gemm_kmajor<kBlockM, Element, Traits::kPanels>(x, a_desc, Traits::panel_bytes(kBlockN),
                                                              bwd90::kmajor_desc(ptx::smem_u32(stage_q(s))),
                                                              Traits::panel_bytes(kBlockM));
      } else {
        bwd90::gemm_kmajor<kBlockM, Element, Traits::kPanelsV>(x, a_desc, Traits::panel_bytes(kBlockN),
                                                               bwd90::kmajor_desc(ptx::smem_u32(stage_do(s))),
                                                               Traits::panel_bytes(kBlockM));
      }
      ptx::wgmma_commit();
    };
    float x[kS];  // this step's S^T (role P) or dP^T (role dS); then P^T or dS^T in f32
    if (kPipe && steps > 0) {
      ptx::mbarrier_wait(&full[0], 0);
      issue_first(x, 0);
    }
    for (int step = 0; step < steps; ++step) {
      const int s = step % kStages;
      const int m_blk = walk.m;
      walk.advance();
      int m0 = Traits::kSparse ? 0 : m_blk * kBlockM;
      if (!kPipe) ptx::mbarrier_wait(&full[s], (step / kStages) & 1);
      [[maybe_unused]] int kind = kTileClean, head = 0;
      if constexpr (Traits::kSparse) {
        const int entry = bwd90::slot_word(&slots[s].entry, lane);
        head = bwd90::slot_word(&slots[s].head, lane);
        m0 = (entry & kTileIndexMask) * kBlockM;
        kind = (entry >> kTileKindShift) & 3;
        if (entry & bwd90::kLastStep) steps = step + 1;  // before role dS's "step + 1 < steps" below
      }
      const uint32_t q_addr = ptx::smem_u32(stage_q(s));
      const uint32_t do_addr = ptx::smem_u32(stage_do(s));
      // LSE * log2e (role P) or D (role dS) of the block's queries, into registers. With kPipe
      // before the wait for the first product (which was issued at the end of the last step).
      float2 rowv[kBlockM / 8];
      {
        const float* v = role_p ? stage_lse(s) : stage_dsum(s);
#pragma unroll
        for (int c = 0; c < kBlockM / 8; ++c) rowv[c] = *reinterpret_cast<const float2*>(v + 8 * c + 2 * t4);
      }
      if (!kPipe) issue_first(x, s);  // else issued at the end of the last step
      ptx::wgmma_wait<0>();
      ptx::fence_operand(x);
      // Element (key row key_local + 8h, query column 8c + 2t4 + e) is x[4c + 2h + e].
      uint32_t a[kS / 2];  // P^T or dS^T, 16-bit pairs: the A operand of the last product
      if (role_p) {
        bool needs_mask = false;
        if constexpr (Traits::kMask == MaskMode::kWindow) {
          needs_mask = Traits::kSparse ? mask.block_needs_mask(m0, min(m0 + kBlockM, seq.seqlen_q), n0, n0 + kBlockN)
                                       : m_blk < clean_lo || m_blk >= clean_hi;
        }
        if (needs_mask) bwd90::mask_key_rows<kBlockM>(x, mask, m0, n0 + key_local, t4);
        if constexpr (Traits::kSparse) {
          if (kind != kTileClean) {
            bwd90::hide_blocked_keys<kBlockM>(x, params, kind, batch, head, m0, n0 + key_local, t4, seq.seqlen_q,
                                              seq.seqlen_k);
          }
        }
        hand_over_p(x, rowv, step);
        bwd90::pack_pairs<Element>(x, a);
      } else {
        ptx::named_barrier_sync(kPtReadyBarrier, 256);
        float pt[kS];
#pragma unroll
        for (int i = 0; i < kS; i += 4) {
          const float4 v = *reinterpret_cast<const float4*>(sPt + bwd90::acc_order_index(i, tid_wg));
          pt[i] = v.x, pt[i + 1] = v.y, pt[i + 2] = v.z, pt[i + 3] = v.w;
        }
        if (step + 1 < steps) {
          __threadfence_block();  // the loads done before consumer 0 may overwrite sPt
          ptx::named_barrier_arrive(kPtFreeBarrier, 256);
        }
#pragma unroll
        for (int c = 0; c < kBlockM / 8; ++c) {
          const float2 d = rowv[c];
#pragma unroll
          for (int i = 4 * c; i < 4 * c + 4; ++i) x[i] = pt[i] * (x[i] - (i % 2 == 0 ? d.x : d.y));
        }
        bwd90::pack_pairs<Element>(x, a);
      }
      // dV += P^T dO (role P) or dK += dS^T Q (role dS): B MN-major (rows = queries, the k index).
      if constexpr (kSameDims) {
        bwd90::gemm_rs<kHeadDim, Element, kBlockM>(acc, a, bwd90::mn_desc(role_p ? do_addr : q_addr,
                                                                          Traits::panel_bytes(kBlockM)));
        ptx::wgmma_commit();
      } else if (role_p) {  // (each branch commits its own product: ptxas schedules it so)
        bwd90::gemm_rs<Traits::kHeadDimV, Element, kBlockM>(acc_v, a,
                                                            bwd90::mn_desc(do_addr, Traits::panel_bytes(kBlockM)));
        ptx::wgmma_commit();
      } else {
        bwd90::gemm_rs<kHeadDim, Element, kBlockM>(acc, a, bwd90::mn_desc(q_addr, Traits::panel_bytes(kBlockM)));
        ptx::wgmma_commit();
      }
      if (kPipe && step + 1 < steps) {  // the next step's first product, then wait for this one
        const int s1 = (step + 1) % kStages;
        ptx::mbarrier_wait(&full[s1], ((step + 1) / kStages) & 1);
        issue_first(x, s1);
        ptx::wgmma_wait<1>();
      } else {
        ptx::wgmma_wait<0>();
      }
      ptx::fence_operand(acc);
      bwd90::release_stage<kEveryThread>(&empty[s], lane);
    }
    // Epilogue: dV (role P) or dK = scale * acc (role dS), or their unscaled f32 partials (dV's
    // head_dim_v wide, as launch_bwd_reduce_dkv reads them).
    if constexpr (kSameDims) {
      bwd90::store_kv_grad<Element, kHeadDim>(acc, params, seq, batch, kv_head, split, n0, key_local, keys_here, t4,
                                              role_p ? params.dv_partial : params.dk_partial,
                                              role_p ? params.dv : params.dk,
                                              role_p ? params.dv_strides : params.dk_strides,
                                              role_p ? 1.0f : params.scale);
    } else if (role_p) {
      bwd90::store_kv_grad<Element, Traits::kHeadDimV>(acc_v, params, seq, batch, kv_head, split, n0, key_local,
                                                       keys_here, t4, params.dv_partial, params.dv,
                                                       params.dv_strides, 1.0f);
    } else {
      bwd90::store_kv_grad<Element, kHeadDim>(acc, params, seq, batch, kv_head, split, n0, key_local, keys_here, t4,
                                              params.dk_partial, params.dk, params.dk_strides, params.scale);
    }
    return;
  }
  const int key_row0 = consumer * 64;                       // this warpgroup's first key of the block
  const int key_local = key_row0 + (warp % 4) * 16 + g;    // this thread's keys: +0 and +8
  const float scale_log2 = params.scale_log2;
  // A operands (K-major: rows hold head-dim elements): this warpgroup's 64 keys of K and V.
  const uint64_t k_desc = bwd90::kmajor_desc(ptx::smem_u32(sK + key_row0 * Traits::kRowBytes));
  const uint64_t v_desc = bwd90::kmajor_desc(ptx::smem_u32(sV + key_row0 * Traits::kRowBytes));

  constexpr int kAcc = kHeadDim / 2;  // dK, dV: 64 x head_dim per warpgroup
  constexpr int kS = kBlockM / 2;     // S^T, dP^T: 64 x block_m
  // kBias: this lane's ldmatrix row in a stage's bias slot and the step between its four reads
  // (bias_layout.h bias_t_lane_offset).
  [[maybe_unused]] uint32_t bias_lane_off = 0, bias_step = 0;
  if constexpr (Traits::kBias) {
    bias_lane_off = bias_t_lane_offset(consumer, warp % 4, lane, params.bias.row == 0, Traits::panel_bytes(kBlockM));
    bias_step = bias_t_step(params.bias.row == 0);
  }
  // kBias: whether the call has attn_bias, and attn_mask's bits (uniform). A thread's keys
  // key_local and key_local + 8 of the 128-key group are bits mask_hbit0 and mask_hbit0 + 1 of
  // halfword g of each query row's group (mask_bits.h: key 8c + r at bit c of halfword r, and
  // key_local = 64 consumer + 16 warp + g).
  [[maybe_unused]] const bool has_bias = Traits::kBias && params.bias.defined();
  [[maybe_unused]] const bool has_mask_bits = Traits::kBias && args.mask_bits.words != nullptr;
  [[maybe_unused]] const int mask_hbit0 = 8 * consumer + 2 * (warp % 4);

  // The CTA's tile as derived at the top, in w; kPersistent: each of its tiles in turn. keys_here
  // and the mask stay the kernel's variables, which kPersistent reassigns per tile: read from w,
  // they changed the one-CTA kernels' SASS (ptxas placed keys_here's min elsewhere). w.steps is
  // the consumers' own: kSparse cuts it short.
  [[maybe_unused]] int it = 0;  // kPersistent: the CTA's steps so far, over its tiles
  int kv_it = 0;                // kPersistent: its tiles with a step so far (their K/V loads)
  for (int r = 0;; ++r) {
    bwd90::KvTile w{n_block, kv_head, split, batch, seq, n0, keys_here, head_begin, m_lo, n_m, steps, ws_row0};
    if constexpr (kPersistent) {
      const int t = kDynamic ? take_tile(feed, r, lane) : BwdTileOrder::cta_tile(r, cta, ctas);
      if (t >= order.tiles) break;
      w = bwd90::kv_tile<Traits>(params, order, t);
      if (!w.exists()) continue;  // past this sequence's keys (varlen): nothing to store
      keys_here = w.keys_here;
      mask = make_window_mask<Traits::kMask == MaskMode::kWindow>(w.seq.seqlen_q, w.seq.seqlen_k,
                                                                  params.window_left, params.window_right);
    }
    float dk[kAcc], dv[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) dk[i] = dv[i] = 0.0f;
    // kBias with dbias summed over the query rows: this thread's part of the sums of its two keys
    // over the current head's steps (bwd90::add_dbias_rows).
    [[maybe_unused]] float dbias_rows[2] = {0.0f, 0.0f};

    // Fused: keys past this sequence (the last block) must not reach dQ: their P is forced to 0.
    const bool key_ok[2] = {!kFusedDq || key_local < keys_here, !kFusedDq || key_local + 8 < keys_here};
    const int tid_wg = threadIdx.x % 128;
    float* dq_part = sDq + consumer * (Traits::kDqPartBytes / 4);
    float dq[Traits::kDqCols / 2];  // the fused kernel's dQ part of one step

    if constexpr (Traits::kSparse) {
      // Whether the CTA has a step at all is in stage 0's slot; the loop ends on the last mark.
      ptx::mbarrier_wait(&full[0], 0);
      w.steps = bwd90::slot_word(&slots[0].entry, lane) == bwd90::kNoStep ? 0 : INT_MAX;
      if constexpr (kFusedDq) {
        if (w.steps == 0) {  // the dQ writer waits for one hand-over: one without a part
          ptx::named_barrier_sync(kDqEmptyBarrier0 + consumer, kDqHandoffThreads);
          bwd90::post_step(slots + kStages, consumer, int(threadIdx.x % 128), bwd90::kNoStep, 0);
          ptx::named_barrier_arrive(kDqFullBarrier0 + consumer, kDqHandoffThreads);
        }
      }
    }
    if (w.steps > 0) ptx::mbarrier_wait(kv_full, kv_it & 1);  // one CTA per tile: kv_it stays 0
    if constexpr (kPersistent) kv_it += w.steps > 0;
    if constexpr (kFusedDq && Traits::kDqKHalves) {
      // This consumer's half of K for its dQ columns; the fence here and the first step's dS
      // barrier (all 256 consumer threads, before any dQ product) make it visible to the products.
      // kPersistent: the half's one reader, this consumer's dQ product, was waited for at the end
      // of the previous tile.
      if (w.steps > 0) {
        bwd90::copy_k_half<kBlockN>(sK, sKh + consumer * Traits::kKHalfBytes, consumer, tid_wg);
        ptx::fence_proxy_async_smem();
      }
    }
    // Dense steps: the query block and head by walking; the blocks whose rows see all of this
    // warpgroup's keys skip the mask (two compares a step instead of block_needs_mask's arithmetic
    // on the block's rows: the window kernels' steps were 13% longer than the unmasked ones').
    Walk walk(w.m_lo, w.n_m, w.head_begin);
    [[maybe_unused]] int clean_lo = 0, clean_hi = 0;
    if constexpr (Traits::kMask == MaskMode::kWindow && !Traits::kSparse) {
      mask.unmasked_row_blocks(w.n0 + key_row0, w.n0 + key_row0 + 64, kBlockM, &clean_lo, &clean_hi);
    }
    for (int step = 0; step < w.steps; ++step) {
      // The CTA's step: stage, phase and dS^T buffer (kPersistent: counted over its tiles).
      int cta_step = step;
      if constexpr (kPersistent) cta_step = it;
      [[maybe_unused]] const bool last = step + 1 == w.steps;
      const int s = cta_step % kStages;
      const int m_blk = walk.m;
      [[maybe_unused]] const int walk_head = walk.head;
      walk.advance();
      int m0 = Traits::kSparse ? 0 : m_blk * kBlockM;
      ptx::mbarrier_wait(&full[s], (cta_step / kStages) & 1);
      [[maybe_unused]] int kind = kTileClean, head = 0, entry = 0;
      if constexpr (Traits::kSparse) {
        entry = bwd90::slot_word(&slots[s].entry, lane);
        head = bwd90::slot_word(&slots[s].head, lane);
        m0 = (entry & kTileIndexMask) * kBlockM;
        kind = (entry >> kTileKindShift) & 3;
        if (entry & bwd90::kLastStep) w.steps = step + 1;
      }
      const uint32_t q_addr = ptx::smem_u32(stage_q(s));
      const uint32_t do_addr = ptx::smem_u32(stage_do(s));
      // This thread's LSE pairs, read before S^T and dP^T are issued (kMods reads them in its own
      // pass). Read after the issue, behind the products' operand traffic, they returned after S^T
      // had completed, and the first exponentials waited on them (ncu, d64 4 x 32 x 4k: 12% of the
      // samples). H200 bf16, base / this, one call, each twice (dev/results/
      // h200-2026-12-03-s18-lsefirst-*-a917363.json): d64 +2.5 / +1.8 / +3.4 / +2.3% at 2k / 2k
      // causal / 8k / 8k causal, d128 +2.0 / +0.3 / +3.9 / 0%.
      // kRowSteps128: 32 registers of LSE pairs do not fit beside S^T and dP^T (128 registers in
      // flight); there they are read where P is made.
      constexpr bool kLseEarly = !Traits::kMods && !Traits::kRowSteps128;
      float2 lse2[kLseEarly ? kBlockM / 8 : 1];
      if constexpr (kLseEarly) {
#pragma unroll
        for (int c = 0; c < kBlockM / 8; ++c) lse2[c] = *reinterpret_cast<const float2*>(stage_lse(s) + 8 * c + 2 * t4);
      }
      // B operands K-major for S^T and dP^T (rows = queries), MN-major for dV and dK (rows = the
      // queries as the k index, the head dim across panels).
      float st[kS], dpt[kS];
      bwd90::issue_s_dp<kBlockM, Traits>(st, dpt, k_desc, v_desc, Traits::panel_bytes(kBlockN),
                                         bwd90::kmajor_desc(q_addr), bwd90::kmajor_desc(do_addr),
                                         Traits::panel_bytes(kBlockM));
      // kBias: the bias words of this thread's scores (pair 2c + h: queries 8c + 2t4, +1 of key
      // key_local + 8h), read while the products run (0 without attn_bias: a bias of 0).
      [[maybe_unused]] uint32_t bias_w[kS / 2];
      if constexpr (Traits::kBias) {
        if (has_bias) {
          const uint32_t base = ptx::smem_u32(stage_bias(s)) + bias_lane_off;
#pragma unroll
          for (int j = 0; j < kS / 8; ++j) {
            uint32_t r[4];
            ptx::ldmatrix_x4_trans(r, base + uint32_t(j) * bias_step);
#pragma unroll
            for (int m = 0; m < 4; ++m) bias_w[4 * j + m] = r[m];
          }
        } else {
#pragma unroll
          for (int i = 0; i < kS / 2; ++i) bias_w[i] = 0u;
        }
      }
      // kBias with attn_mask: this thread's halfword (its keys' bits, mask_bits.h) of each of its
      // 16 query rows, paired by row (8c + 2t4 + e in half e of pair c), then folded into one
      // register of keep bits across the wait for S. Without attn_bias the producer copied the
      // step's rows into the bias slot: two ldmatrix.x4.trans. With it (no room in the stage at
      // d128) 16 16-bit loads from global memory (group-major: the step's 64 rows exist, padded),
      // issued together (SASS, d128); the first form's 32-bit words had been issued two at a time,
      // each pair after the previous pair's fold: eight L2 round trips a step.
      [[maybe_unused]] uint32_t mask_keep = ~0u;
      if constexpr (Traits::kBias) {
        if (has_mask_bits) {
          const MaskBits& mb = args.mask_bits;
          uint32_t pairs[kBlockM / 8];
          if (!has_bias) {
            const uint32_t base = ptx::smem_u32(stage_bias(s)) + mask_bits_t_lane_offset(lane, mb.row == 0);
#pragma unroll
            for (int j = 0; j < kBlockM / 32; ++j) {
              uint32_t r[4];
              ptx::ldmatrix_x4_trans(r, base + uint32_t(j) * mask_bits_t_read_step(mb.row == 0));
#pragma unroll
              for (int m = 0; m < 4; ++m) pairs[4 * j + m] = r[m];
            }
          } else {
            const uint16_t* half = reinterpret_cast<const uint16_t*>(
                                       mb.words + mask_bits_row_word(mb, w.batch, walk_head, m0, 0) + mb.group * w.n_block) +
                                   g;
#pragma unroll
            for (int c = 0; c < kBlockM / 8; ++c) {
              const int64_t row = 8 * c + 2 * t4;
              pairs[c] = uint32_t(__ldg(half + 2 * row * mb.row)) | (uint32_t(__ldg(half + 2 * (row + 1) * mb.row)) << 16);
            }
          }
          mask_keep = mask_bits_fold_t(pairs, mask_hbit0);
        }
      }

      // P^T, started before the wait for dP^T (see the file comment). Element (key row
      // key_local + 8h, query column 8c + 2t4 + e) is st[4c + 2h + e].
      const float* lse = stage_lse(s);
      const float* dsum = stage_dsum(s);
      bool needs_mask = false;
      if constexpr (Traits::kMask == MaskMode::kWindow) {
        needs_mask = Traits::kSparse ? mask.block_needs_mask(m0, min(m0 + kBlockM, w.seq.seqlen_q), w.n0 + key_row0,
                                                             w.n0 + key_row0 + 64)
                                     : m_blk < clean_lo || m_blk >= clean_hi;
      }
      // The pieces of the pass from S^T and dP^T to P^T and dS^T. hide_scores: the window and
      // the block mask. mods_pass (kMods: softcap and ALiBi): P and dS = P (dP - D) (1 - tanh^2)
      // in one pass from the scores in log2 units, LSE read here (not from lse2, which is not
      // loaded for these kernels: 16 registers fewer). plain_probs: P from the raw products with
      // the scale folded in (and the bias), LSE pair c from lse_at(c); ds_from_probs: after the
      // wait for dP^T, dS = P (dP - D).
      const auto soft_scores = [&](const bwd90::ScoreModifiers& mods) {
#pragma unroll
        for (int i = 0; i < kS; ++i) st[i] = mods.soft(st[i]);
      };
      const auto mods_pass = [&](const bwd90::ScoreModifiers& mods) {
#pragma unroll
        for (int c = 0; c < kBlockM / 8; ++c) {
          const float2 l = *reinterpret_cast<const float2*>(lse + 8 * c + 2 * t4);
          const float2 d = *reinterpret_cast<const float2*>(dsum + 8 * c + 2 * t4);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            [[maybe_unused]] float2 b = {};
            if constexpr (Traits::kBias) b = bias_pair_log2<Element>(bias_w[2 * c + h]);
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int idx = 4 * c + 2 * h + e;
              const float x = key_ok[h] ? st[idx] : -INFINITY;
              const float alibi = mods.alibi(m0 + 8 * c + 2 * t4 + e, w.n0 + key_local + 8 * h);
              float y = x - alibi;
              if constexpr (Traits::kBias) y += e == 0 ? b.x : b.y;
              const float p = ptx::exp2_approx(y - (e == 0 ? l.x : l.y));
              st[idx] = p;
              dpt[idx] = p * (dpt[idx] - (e == 0 ? d.x : d.y)) * mods.dtanh(x);
            }
          }
        }
      };
      const auto plain_probs = [&](auto lse_at) {
#pragma unroll
        for (int c = 0; c < kBlockM / 8; ++c) {
          const float2 l = lse_at(c);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            [[maybe_unused]] float2 b = {};
            if constexpr (Traits::kBias) b = bias_pair_log2<Element>(bias_w[2 * c + h]);
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int idx = 4 * c + 2 * h + e;
              // Rows past the queries (and LSE = -inf) carry LSE_log2 = +inf: P = 0 there.
              const float x = key_ok[h] ? st[idx] : -INFINITY;
              if constexpr (Traits::kBias) {
                st[idx] = ptx::exp2_approx(fmaf(x, scale_log2, (e == 0 ? b.x : b.y) - (e == 0 ? l.x : l.y)));
              } else {
                st[idx] = ptx::exp2_approx(fmaf(x, scale_log2, -(e == 0 ? l.x : l.y)));
              }
            }
          }
        }
      };
      const auto ds_from_probs = [&]() {
        ptx::wgmma_wait<0>();
        ptx::fence_operand(dpt);
#pragma unroll
        for (int c = 0; c < kBlockM / 8; ++c) {
          const float2 d = *reinterpret_cast<const float2*>(dsum + 8 * c + 2 * t4);
#pragma unroll
          for (int i = 4 * c; i < 4 * c + 4; ++i) dpt[i] = st[i] * (dpt[i] - (i % 2 == 0 ? d.x : d.y));
        }
      };
      if constexpr (!Traits::kBias) {
        ptx::wgmma_wait<Traits::kMods ? 0 : 1>();
        ptx::fence_operand(st);
        if constexpr (Traits::kMods) {  // the scores in log2 units before the masks (see BwdTraitsBody)
          ptx::fence_operand(dpt);
          head = walk_head;  // (kMods: not kSparse)
          soft_scores(bwd90::score_modifiers(params, args.softcap, w.batch, head, mask));
        }
        if (needs_mask) bwd90::mask_key_rows<kBlockM>(st, mask, m0, w.n0 + key_local, t4);
        if constexpr (Traits::kSparse) {
          if (kind != kTileClean) {
            bwd90::hide_blocked_keys<kBlockM>(st, params, kind, w.batch, head, m0, w.n0 + key_local, t4, w.seq.seqlen_q,
                                              w.seq.seqlen_k);
          }
        }
        if constexpr (Traits::kMods) {
          mods_pass(bwd90::score_modifiers(params, args.softcap, w.batch, head, mask));
        } else {
          plain_probs([&](int c) {
            if constexpr (kLseEarly) return lse2[c];
            else return *reinterpret_cast<const float2*>(lse + 8 * c + 2 * t4);
          });
          ds_from_probs();
        }
      } else {
        // The bias kernel: the kMods pass with softcap or ALiBi, else the plain one (exponentials
        // before the wait for dP), under a uniform branch. Each branch holds its waits and every
        // read of the accumulators behind them: with the wait chosen in one branch and the reads
        // in another, ptxas serialised the products (C7514).
        const bool mods_on = args.softcap.in != 0.0f || params.alibi != nullptr;
        head = walk_head;
        // (A lambda here only: shared with the branch above, it moved ptxas's schedule of the
        // plain and kMods kernels, whose SASS stays the timed one.)
        const auto hide_scores = [&]() {
          if (needs_mask) bwd90::mask_key_rows<kBlockM>(st, mask, m0, w.n0 + key_local, t4);
          if (has_mask_bits) {  // attn_mask: a clear bit hides the score
#pragma unroll
            for (int i = 0; i < kS; ++i) {
              if (((mask_keep >> i) & 1u) == 0u) st[i] = -INFINITY;
            }
          }
          if constexpr (Traits::kSparse) {
            if (kind != kTileClean) {
              bwd90::hide_blocked_keys<kBlockM>(st, params, kind, w.batch, head, m0, w.n0 + key_local, t4, w.seq.seqlen_q,
                                                w.seq.seqlen_k);
            }
          }
        };
        if (mods_on) {
          ptx::wgmma_wait<0>();
          ptx::fence_operand(st);
          ptx::fence_operand(dpt);
          const bwd90::ScoreModifiers mods = bwd90::score_modifiers(params, args.softcap, w.batch, head, mask);
          soft_scores(mods);
          hide_scores();
          mods_pass(mods);
        } else {
          ptx::wgmma_wait<1>();
          ptx::fence_operand(st);
          hide_scores();
          plain_probs([&](int c) { return *reinterpret_cast<const float2*>(lse + 8 * c + 2 * t4); });
          ds_from_probs();
        }
      }
      // kBias with dbias (no softcap then: dS is dbias's term): stored per element, or summed
      // over the query rows and stored at the head's last step.
      if constexpr (Traits::kBias) {
        if (params.dbias_out.defined()) {
          if (params.dbias_row_sum) {
            bwd90::add_dbias_rows<kBlockM>(dpt, dbias_rows);
            if (last || walk.head != walk_head) {
              bwd90::flush_dbias_rows(dbias_rows, params, w.batch, head, w.n0 + key_local, t4, w.seq.seqlen_k);
            }
          } else {
            bwd90::store_dbias_t<kBlockM, Element>(dpt, params, w.batch, head, m0, w.n0 + key_local, t4, w.seq.seqlen_q,
                                          w.seq.seqlen_k);
          }
        }
      }
      if constexpr (kPersistent) {
        // S^T and dP^T done: V is no longer read (nor K with kDqKHalves, whose dQ product reads
        // this consumer's copy of its half).
        if (last) {
          bwd90::release(v_empty, lane);
          if constexpr (Traits::kDqKHalves) bwd90::release(k_empty, lane);
        }
      }
      uint32_t pt[kS / 2], dst[kS / 2];
      bwd90::pack_pairs<Element>(st, pt);
      bwd90::pack_pairs<Element>(dpt, dst);
      unsigned char* ds_buf = sDs + (cta_step & 1) * Traits::kDsBytes;
      if constexpr (kFusedDq) {
        // dS^T rows of this thread's keys into the 128-byte swizzled panels of 64 queries (16-byte
        // chunk c of row r at chunk c ^ (r % 8), as the copy engine writes; chunk c of the step's
        // queries in panel c / 8): dst[2c + h] holds queries 8c + 2t4 and +1 of key row
        // key_local + 8h. Conflict-free: a warp's 8 rows x 4 quads.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = key_local + 8 * h;
#pragma unroll
          for (int c = 0; c < kBlockM / 8; ++c) {
            *reinterpret_cast<uint32_t*>(ds_buf + (c / 8) * Traits::kDsPanelBytes + r * Traits::kRowBytes +
                                         (((c % 8) ^ (r % 8)) << 4) + 4 * t4) = dst[2 * c + h];
          }
        }
        ptx::fence_proxy_async_smem();  // visible to the dQ product's operand reads
      }
      if constexpr (!kFusedDq) {
        bwd90::gemm_rs<kHeadDim, Element, kBlockM>(dv, pt, bwd90::mn_desc(do_addr, Traits::panel_bytes(kBlockM)));
        bwd90::gemm_rs<kHeadDim, Element, kBlockM>(dk, dst, bwd90::mn_desc(q_addr, Traits::panel_bytes(kBlockM)));
        ptx::wgmma_commit();
        ptx::wgmma_wait<0>();
        ptx::fence_operand(dv);
        ptx::fence_operand(dk);
        bwd90::release_stage<kEveryThread>(&empty[s], lane);
      } else {
        // Three groups, so the dQ part is staged while dK += dS^T Q still runs: dV += P^T dO; then,
        // once both consumers' dS^T rows are written, dQ = dS K over this consumer's columns of K and
        // all 128 keys (d128: its 64-column panel; d64 at 64-row steps: 32 columns from its copy of
        // K's half; kRowSteps128: its 64 query rows, all of K); then, once dV is done, dK.
        bwd90::gemm_rs<kHeadDim, Element, kBlockM>(dv, pt, bwd90::mn_desc(do_addr, Traits::panel_bytes(kBlockM)));
        ptx::wgmma_commit();
        ptx::named_barrier_sync(kDsReadyBarrier, 128 * Traits::kConsumers);
        // The consumer's operands: kRowSteps128 its query panel of dS^T and all of K, otherwise
        // all the step's queries and its column panel of K (or of K's halves).
        const uint64_t ds_desc =
            Traits::kRowSteps128
                ? bwd90::mn_desc(ptx::smem_u32(ds_buf + consumer * Traits::kDsPanelBytes), Traits::kDsPanelBytes)
                : bwd90::mn_desc(ptx::smem_u32(ds_buf), Traits::kDsBytes);
        if constexpr (Traits::kDqKHalves) {
          bwd90::gemm_dq<Traits::kDqKeys, Traits::kDqCols, Traits::kKHalfRowBytes, Element>(
              dq, ds_desc,
              bwd90::k_half_desc<Traits::kKHalfBytes>(ptx::smem_u32(sKh + consumer * Traits::kKHalfBytes)));
        } else {
          const uint32_t k_cols = ptx::smem_u32(sK) + (Traits::kRowSteps128 ? 0 : consumer) * Traits::panel_bytes(kBlockN);
          bwd90::gemm_dq<Traits::kDqKeys, Traits::kDqCols, Traits::kRowBytes, Element>(
              dq, ds_desc, bwd90::mn_desc(k_cols, Traits::panel_bytes(kBlockN)));
        }
        ptx::wgmma_commit();
        ptx::wgmma_wait<1>();  // dV done
        ptx::fence_operand(dv);
        bwd90::gemm_rs<kHeadDim, Element, kBlockM>(dk, dst, bwd90::mn_desc(q_addr, Traits::panel_bytes(kBlockM)));
        ptx::wgmma_commit();
        ptx::wgmma_wait<1>();  // dQ done
        ptx::fence_operand(dq);
        // kPersistent without K's halves (d128, and d64 at 128-row steps): this consumer's dQ
        // product (its column panel of K, or all of K, over all 128 keys) is done; K is free once
        // the other consumer's is too (eight warp arrivals).
        if constexpr (kPersistent && !Traits::kDqKHalves) {
          if (last) bwd90::release(k_empty, lane);
        }
        // Hand the part to the dQ writer warp once it has given the buffer back.
        ptx::named_barrier_sync(kDqEmptyBarrier0 + consumer, kDqHandoffThreads);
#pragma unroll
        for (int i = 0; i < Traits::kDqCols / 2; i += 4) {
          *reinterpret_cast<float4*>(dq_part + bwd90::acc_order_index(i, tid_wg)) =
              make_float4(dq[i], dq[i + 1], dq[i + 2], dq[i + 3]);
        }
        if constexpr (Traits::kSparse) bwd90::post_step(slots + kStages, consumer, tid_wg, entry, head);
        ptx::fence_proxy_async_smem();
        ptx::named_barrier_arrive(kDqFullBarrier0 + consumer, kDqHandoffThreads);
        ptx::wgmma_wait<0>();
        ptx::fence_operand(dk);
        bwd90::release_stage<kEveryThread>(&empty[s], lane);
      }
      if constexpr (kPersistent) ++it;
    }

    // Epilogue: dK = scale * sum dS^T Q, dV = sum P^T dO (or their partials).
    bwd90::store_kv_grad<Element, kHeadDim>(dk, params, w.seq, w.batch, w.kv_head, w.split, w.n0, key_local,
                                            keys_here, t4, params.dk_partial, params.dk, params.dk_strides,
                                            params.scale);
    bwd90::store_kv_grad<Element, kHeadDim>(dv, params, w.seq, w.batch, w.kv_head, w.split, w.n0, key_local,
                                            keys_here, t4, params.dv_partial, params.dv, params.dv_strides, 1.0f);
    if constexpr (!kPersistent) break;
  }
}

// dQ. Grid (query blocks of the longest sequence, heads, batch).
template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1) bwd_dq_kernel(const __grid_constant__ BwdKernelArgs args) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kDqBlockM;
  constexpr int kBlockN = Traits::kDqBlockN;
  constexpr int kStages = Traits::kStages;
  constexpr int kHeadDim = Traits::kHeadDim;
  const BwdKernelParams& params = args.p;

  // The last query blocks first: under a causal mask they see the most keys, so the lightest
  // CTAs fill the tail of the grid (not yet timed against the plain order).
  const int m_block = int(gridDim.x) - 1 - int(blockIdx.x);
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int kv_head = head / (params.heads / params.heads_k);
  const SeqExtent seq = seq_extent(params, batch);
  const int m0 = m_block * kBlockM;
  if (m0 >= seq.seqlen_q) return;  // past this sequence's queries (varlen)
  const int rows_here = min(kBlockM, seq.seqlen_q - m0);
  const WindowMask mask = make_window_mask<Traits::kMask == MaskMode::kWindow>(
      seq.seqlen_q, seq.seqlen_k, params.window_left, params.window_right);
  int n_lo = 0, n_hi = (seq.seqlen_k + kBlockN - 1) / kBlockN;
  if constexpr (Traits::kMask == MaskMode::kWindow) mask.block_range(m0, m0 + rows_here, kBlockN, &n_lo, &n_hi);
  int steps = max(n_hi - n_lo, 0);  // kSparse: the consumers learn theirs from the producer

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = ptx::align_shared<1024>(smem_raw);
  unsigned char* sQ = smem;
  unsigned char* sdO = sQ + Traits::tile_bytes(kBlockM);
  float* sLse = reinterpret_cast<float*>(sdO + Traits::tile_bytes_v(kBlockM));
  float* sDsum = sLse + kBlockM;
  unsigned char* stages = reinterpret_cast<unsigned char*>(sLse) + 1024;
  uint64_t* bars = reinterpret_cast<uint64_t*>(stages + kStages * Traits::kDqStageBytes);
  uint64_t* q_full = bars;
  uint64_t* full = bars + 1;             // [kStages]
  uint64_t* empty = bars + 1 + kStages;  // [kStages]
  // kSparse: [kStages] after the barriers (Traits::kSlotBytes); only .entry is used here.
  [[maybe_unused]] bwd90::SparseSlot* slots = reinterpret_cast<bwd90::SparseSlot*>(bars + Traits::kDqBarriers);
  const auto stage_k = [&](int s) { return stages + s * Traits::kDqStageBytes; };
  const auto stage_v = [&](int s) { return stage_k(s) + Traits::tile_bytes(kBlockN); };

  const int warpgroup = threadIdx.x / 128;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  constexpr bool kEveryThread = true;  // release_stage
  bwd90::init_ring(q_full, full, empty, kStages, bwd90::stage_arrivals<kEveryThread, Traits::kConsumers>());

  const int64_t ws = int64_t(head) * params.ws_rows + params.ws_row0(batch, seq.row0_q) + m0;
  if (warpgroup == 0) {
    ptx::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    if (warp != 0 || lane != 0) return;
    // No visible key: the consumers write dQ = 0 without waiting (kSparse: the walk below finds out).
    if (!Traits::kSparse && steps == 0) return;
    const int mb = bwd90::map_batch(params, batch);
    const auto load_q = [&]() {
      ptx::mbarrier_arrive_expect_tx(q_full, Traits::tile_bytes(kBlockM) + Traits::tile_bytes_v(kBlockM) +
                                                 2 * Traits::kDqStatBytes);
#pragma unroll
      for (int panel = 0; panel < Traits::kPanels; ++panel) {
        ptx::tma_load_4d(sQ + panel * Traits::panel_bytes(kBlockM), &args.dq.q, q_full, 64 * panel,
                         int(seq.row0_q) + m0, head, mb);
        if (panel < Traits::kPanelsV) {
          ptx::tma_load_4d(sdO + panel * Traits::panel_bytes(kBlockM), &args.dq.dout, q_full, 64 * panel,
                           int(seq.row0_q) + m0, head, mb);
        }
      }
      ptx::bulk_load(sLse, params.lse_log2 + ws, Traits::kDqStatBytes, q_full);
      ptx::bulk_load(sDsum, params.dsum + ws, Traits::kDqStatBytes, q_full);
    };
    // Step `step`'s K and V of key block n_block into its stage, once free.
    const auto load_step = [&](int step, int n_block) {
      const int s = step % kStages;
      const int key = int(seq.row0_k) + n_block * kBlockN;
      ptx::mbarrier_wait(&empty[s], ((step / kStages) & 1) ^ 1);
      ptx::mbarrier_arrive_expect_tx(&full[s], Traits::tile_bytes(kBlockN) + Traits::tile_bytes_v(kBlockN));
#pragma unroll
      for (int panel = 0; panel < Traits::kPanels; ++panel) {
        ptx::tma_load_4d(stage_k(s) + panel * Traits::panel_bytes(kBlockN), &args.dq.k, &full[s], 64 * panel, key,
                         kv_head, mb);
        if (panel < Traits::kPanelsV) {
          ptx::tma_load_4d(stage_v(s) + panel * Traits::panel_bytes(kBlockN), &args.dq.v, &full[s], 64 * panel, key,
                           kv_head, mb);
        }
      }
    };
    if constexpr (Traits::kSparse) {
      // This query tile's list (the forward's: descending key tiles) from its first entry below
      // n_hi while entries stay >= n_lo, each entry into its stage's slot before the "full"
      // arrival, the last one marked; no step: stage 0 says so and nothing is loaded.
      const BwdSparseLists& lists = args.sparse;
      const int32_t* list =
          lists.dq + (params.block_tiles.plane(batch, head, params.heads) * lists.dq_m_tiles + m_block) *
                         int64_t(lists.dq_n_tiles + 1);
      const int count = steps > 0 ? __ldg(list) : 0;
      int index = first_tile_below(count, n_hi, [&](int e) { return __ldg(list + 1 + e); });
      int entry = index < count ? __ldg(list + 1 + index) : 0;
      if (index >= count || (entry & kTileIndexMask) < n_lo) {
        slots[0].entry = bwd90::kNoStep;
        ptx::mbarrier_arrive(&full[0]);
        return;
      }
      load_q();
#pragma unroll 1
      for (int step = 0;; ++step) {
        const int next = index + 1 < count ? __ldg(list + 2 + index) : -1;
        const bool last = next < 0 || (next & kTileIndexMask) < n_lo;
        const int s = step % kStages;
        ptx::mbarrier_wait(&empty[s], ((step / kStages) & 1) ^ 1);
        slots[s].entry = entry | (last ? bwd90::kLastStep : 0);
        load_step(step, entry & kTileIndexMask);
        if (last) break;
        ++index;
        entry = next;
      }
      return;
    }
    load_q();
    for (int step = 0; step < steps; ++step) load_step(step, n_lo + step);
    return;
  }

  ptx::warpgroup_reg_alloc<Traits::kConsumerRegs>();
  const int consumer = warpgroup - 1;
  const int g = lane / 4;
  const int t4 = lane % 4;
  const int row_base = consumer * 64;
  const int row_local = row_base + (warp % 4) * 16 + g;  // this thread's rows: +0 and +8
  const float scale_log2 = params.scale_log2;
  const uint64_t q_desc = bwd90::kmajor_desc(ptx::smem_u32(sQ + row_base * Traits::kRowBytes));
  const uint64_t do_desc = bwd90::kmajor_desc(ptx::smem_u32(sdO + row_base * Traits::kRowBytes));

  constexpr int kS = kBlockN / 2;
  float dq[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) dq[i] = 0.0f;

  if constexpr (Traits::kSparse) {
    // Whether the tile has a step at all is in stage 0's slot; the loop ends on the last mark.
    ptx::mbarrier_wait(&full[0], 0);
    steps = bwd90::slot_word(&slots[0].entry, lane) == bwd90::kNoStep ? 0 : INT_MAX;
  }
  if (steps > 0) {
    ptx::mbarrier_wait(q_full, 0);
    float lse[2], dsum[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      lse[h] = sLse[row_local + 8 * h];
      dsum[h] = sDsum[row_local + 8 * h];
    }
    for (int step = 0; step < steps; ++step) {
      const int s = step % kStages;
      int n0 = Traits::kSparse ? 0 : (n_lo + step) * kBlockN;
      ptx::mbarrier_wait(&full[s], (step / kStages) & 1);
      [[maybe_unused]] int kind = kTileClean;
      if constexpr (Traits::kSparse) {
        const int entry = bwd90::slot_word(&slots[s].entry, lane);
        n0 = (entry & kTileIndexMask) * kBlockN;
        kind = (entry >> kTileKindShift) & 3;
        if (entry & bwd90::kLastStep) steps = step + 1;
      }
      const uint32_t k_addr = ptx::smem_u32(stage_k(s));
      float sc[kS], dp[kS];
      bwd90::issue_s_dp<kBlockN, Traits>(sc, dp, q_desc, do_desc, Traits::panel_bytes(kBlockM),
                                         bwd90::kmajor_desc(k_addr), bwd90::kmajor_desc(ptx::smem_u32(stage_v(s))),
                                         Traits::panel_bytes(kBlockN));

      // P, started before the wait for dP (see the file comment). Element (query row
      // row_local + 8h, key column n0 + 8c + 2t4 + e) is sc[4c + 2h + e].
      const bool needs_mask =
          mask.block_needs_mask(m0 + row_base, max(min(m0 + rows_here, m0 + row_base + 64), m0 + row_base + 1), n0,
                                n0 + kBlockN);
      ptx::wgmma_wait<Traits::kMods ? 0 : 1>();
      ptx::fence_operand(sc);
      if constexpr (Traits::kMods) {  // the scores in log2 units before the masks (BwdTraitsBody)
        ptx::fence_operand(dp);
        const bwd90::ScoreModifiers mods = bwd90::score_modifiers(params, args.softcap, batch, head, mask);
#pragma unroll
        for (int i = 0; i < kS; ++i) sc[i] = mods.soft(sc[i]);
      }
      if (needs_mask) {  // one uniform branch around the whole tile (see mask_key_rows)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          int lo, hi;
          mask.row_range(m0 + row_local + 8 * h, &lo, &hi);
#pragma unroll
          for (int c = 0; c < kBlockN / 8; ++c) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int key = n0 + 8 * c + 2 * t4 + e;
              if (key < lo || key >= hi) sc[4 * c + 2 * h + e] = -INFINITY;
            }
          }
        }
      }
      if constexpr (Traits::kSparse) {
        if (kind != kTileClean) {
          hide_blocked_scores<kBlockN>(sc, params, kind, batch, head, m0 + row_local, n0 + 2 * t4, seq.seqlen_q,
                                            seq.seqlen_k);
        }
      }
      if constexpr (Traits::kMods) {  // P and dS = P (dP - D) (1 - tanh^2) in one pass
        const bwd90::ScoreModifiers mods = bwd90::score_modifiers(params, args.softcap, batch, head, mask);
#pragma unroll
        for (int i = 0; i < kS; ++i) {
          const float x = sc[i];
          const float alibi = mods.alibi(m0 + row_local + 8 * ((i / 2) % 2), n0 + 8 * (i / 4) + 2 * t4 + i % 2);
          sc[i] = ptx::exp2_approx(x - alibi - lse[(i / 2) % 2]);
          dp[i] = sc[i] * (dp[i] - dsum[(i / 2) % 2]) * mods.dtanh(x);
        }
      } else {
#pragma unroll
        for (int i = 0; i < kS; ++i) sc[i] = ptx::exp2_approx(fmaf(sc[i], scale_log2, -lse[(i / 2) % 2]));
        ptx::wgmma_wait<0>();
        ptx::fence_operand(dp);
#pragma unroll
        for (int i = 0; i < kS; ++i) dp[i] = sc[i] * (dp[i] - dsum[(i / 2) % 2]);
      }
      uint32_t ds[kS / 2];
      bwd90::pack_pairs<Element>(dp, ds);
      bwd90::gemm_rs<kHeadDim, Element, kBlockN>(dq, ds, bwd90::mn_desc(k_addr, Traits::panel_bytes(kBlockN)));
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
      ptx::fence_operand(dq);
      bwd90::release_stage<kEveryThread>(&empty[s], lane);
    }
  }

  // dQ = scale * sum dS K, written from the accumulators in 16-byte row chunks.
  char* row_ptr[2];
  bool row_ok[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row_local + 8 * h;
    row_ptr[h] = static_cast<char*>(params.dq) +
                 sizeof(Element) * (batch * params.dq_strides.batch + (seq.row0_q + m0 + r) * params.dq_strides.row +
                                    int64_t(head) * params.dq_strides.head + 8 * t4);
    row_ok[h] = r < rows_here;
  }
  bwd90::store_acc_rows<Element, kHeadDim>(dq, params.scale, row_ptr, row_ok, t4);
}

// dQ = scale * the fused kernel's f32 accumulator, in Element: the inverse of acc_order_index per
// 64-row query block. Grid (64-row blocks of the longest sequence, heads, batch), 128 threads;
// thread t reads what warpgroup thread t held (float4 (c * 128 + t) of a part is its 8-column
// chunk c: rows r and r + 8, two columns each), packs four chunks' pieces and quad-transposes
// them (quad_transpose.h), so each store is 16 contiguous bytes of a row and a warp's store
// covers 8 rows x 64 bytes. The first form stored each thread's 4-byte pieces: 87-107 us for
// 16 heads x 16k rows at d128 / 32 x 16k at d64 against 55-59 us for cuDNN's conversion; this
// one 50-51 us at both (H200, dev/kernel_split.py, dev/results/h200-2026-12-02-split-bwd-
// {508b46b,48180e9}.json).
template <typename Traits>
__global__ void __launch_bounds__(128) bwd_dq_convert_kernel(const __grid_constant__ BwdKernelParams params) {
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kChunks = Traits::kDqCols / 8;     // 8-column chunks per part
  constexpr int kIters = 64 * kHeadDim / 4 / 128;  // float4 per thread: kHeadDim / kDqCols parts
  static_assert(kIters % kChunks == 0, "whole parts");
  const int m0 = int(blockIdx.x) * 64;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const SeqExtent seq = seq_extent(params, batch);
  if (m0 >= seq.seqlen_q) return;
  const float* src =
      params.dq_accum + (int64_t(head) * params.ws_rows + params.ws_row0(batch, seq.row0_q) + m0) * kHeadDim;
  char* dq = static_cast<char*>(params.dq) +
             sizeof(Element) * (batch * params.dq_strides.batch + int64_t(head) * params.dq_strides.head);
  // Every load first, then the stores: dq may alias the accumulator as far as the compiler knows,
  // so a load-store loop waited one memory latency per float4 (ncu, H200 d128 16k: 176 us at
  // 1.1 TB/s, IPC 0.45, against 53 us for cuDNN's conversion).
  float4 v[kIters];
#pragma unroll
  for (int i = 0; i < kIters; ++i) v[i] = __ldg(reinterpret_cast<const float4*>(src) + threadIdx.x + 128 * i);
#pragma unroll
  for (int part = 0; part < kIters / kChunks; ++part) {
    bwd90::store_dq_part<Traits>(
        [&](int j, int h) {
          const float4& x = v[part * kChunks + j];
          return h == 0 ? make_float2(x.x, x.y) : make_float2(x.z, x.w);
        },
        threadIdx.x, part, dq, params.dq_strides.row, seq.row0_q, m0, seq.seqlen_q, params.scale);
  }
}

}  // namespace flashattn::cuda::sm90
