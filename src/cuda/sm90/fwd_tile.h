// Tile choices of the Hopper (sm90a) forward (fwd_traits.h), and the shared-memory and register
// algebra behind them. Host-safe (no CUDA headers): tests/cpp/test_sm90_layout.cpp checks every
// instantiated tile against the limits without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashattn::cuda::sm90 {

struct FwdTile {
  int consumers;   // consumer warpgroups; each owns 64 query rows, so block_m = 64 * consumers
  int block_n;     // keys per K/V tile (the N of S = Q K^T, a multiple of 16)
  int stages;      // K/V tiles in flight (each stage holds one K and one V tile)
  bool ping_pong;  // consumers take turns issuing their products (fwd_kernel.h, Turns)
  // The consumers' key-block pipeline runs across tiles (fwd_kernel.h, consume_cross_tile): the
  // first Q K^T product of the next tile is issued with the last P V product of this one, so the
  // tile boundary costs no more than a block boundary. Needs a second Q buffer (the next tile's Q
  // lands while this one is still read).
  bool cross_tile = false;
  // CTAs resident per SM (the launch bounds' minimum and the persistent grid's size): with 2 or 3,
  // each CTA's tile boundaries (Q load, first softmax, epilogue) run beside the other CTAs' key
  // blocks, at 1 / ctas_per_sm of the registers and shared memory each (fwd_consumer_regs,
  // fwd_smem_limit).
  int ctas_per_sm = 1;
};

// Per head dim (and mask). Registers per consumer thread: O takes head_dim_v / 2 floats, S
// block_n / 2 and P (16-bit pairs) block_n / 4, under the 240 that setmaxnreg gives two consumer
// warpgroups (160 for three). Shared memory: Q (block_m x d) + stages x (K (block_n x d) + V
// (block_n x d_v)), 16-bit, within 227 KB. Measured on H200 (bf16, forward, 1k-16k, against the
// 128 x 128 ping-pong tile; dev/results/h200-2026-12-01-ab-sm90a-*.json):
//  - d64: three consumer warpgroups (192 x 128, 2 stages: 24 + 64 KB; O 32 + S 64 + P 32
//    registers of 160): +16-23% from 2k up (544 against 453 TFLOP/s at 16k), +6% at 1k, -3% at
//    1k causal. 128 x 192 with two: -8% to +3%.
//  - d128 without a mask: 128 x 176, 2 stages (32 + 176 KB): +1.5-5% from 8k up (710 against 678
//    at 16k). With a window or causal mask 128 x 128 (32 + 128 KB): 176 lost 7% at 1k causal
//    and gained 4% at 16k causal, and short causal rows are the weaker ones.
//  - d192 (head_dim_v 192): 128 x 112, 2 stages: 48 + 168 KB; O 96 + S 56 + P 28 registers. The
//    largest N that fits; not swept.
//  - d192 with head_dim_v 128 (DeepSeek-V3 prefill; issue 19): 128 x 128, 2 stages, every mask:
//    48 + 2 x (48 + 32) = 208 KB; O 64 + S 64 + P 32 registers (the d128 masked tile's count).
//    The largest N that fits: 144 needs 48 + 2 x 90 = 228 KB plus the 1 KB alignment; 3 stages
//    fit only N <= 80. Not run on a GPU yet (dev/NOTES.md, "Hopper forward at 192/128").
//  - d256: 128 x 80, 2 stages: 64 + 160 KB (the most that fits); O 128 + S 40 + P 20. 128 x 64
//    without a mask: -4..-6% from 1k, +1% at 512; with one it wins up to 2048 rows and takes the
//    short-rows kernel there (kFwdShortRowsMaxSeqlen256).
//  - Ping-pong (turns between the consumers): +1-3% at d128 (ab-sm90a-nopp128).
//  - The cross-tile pipeline (cross_tile, two Q buffers), against the one-tile loop in one
//    session (dev/results/h200-2026-12-02-ab-cross2-{base,x}.json, bf16 forward vs cuDNN): d64
//    without a mask +3/+4/+5% at 2k/4k/16k (16k: 555 -> 582 TFLOP/s), +1% at 1k, -3% at 512;
//    d64 causal -2..-5% (1k 261 -> 250, 16k 537 -> 513); d128 (masked tile 128 x 128, unmasked
//    128 x 160 to fit the second Q buffer) -1..-14% up to 4k (1k 555 -> 519, causal 401 -> 386).
//    So only unmasked d64 takes it. A first form with the tile boundary as a branch inside the
//    key-block loop (two softmax copies in the loop) lost everywhere, 2.6% even at d128 16k
//    causal (ab-cross-{base,x}).
constexpr FwdTile fwd_tile(int head_dim, int head_dim_v, bool windowed) {
#if defined(FLASHATTN_DEV_SM90_BN)
  // dev/ experiments: -DFLASHATTN_DEV_SM90_{HDIM,CONSUMERS,BN,STAGES,PINGPONG}=... (and
  // optionally CROSS, CTAS: the cross-tile pipeline, CTAs per SM) replace the tile of head dim
  // FLASHATTN_DEV_SM90_HDIM (and head_dim_v FLASHATTN_DEV_SM90_HDIMV, default the same), of every
  // launch or, with -DFLASHATTN_DEV_SM90_UNMASKED_ONLY, of unmasked ones only.
#if !defined(FLASHATTN_DEV_SM90_HDIMV)
#define FLASHATTN_DEV_SM90_HDIMV FLASHATTN_DEV_SM90_HDIM
#endif
#if !defined(FLASHATTN_DEV_SM90_CROSS)
#define FLASHATTN_DEV_SM90_CROSS 0
#endif
#if !defined(FLASHATTN_DEV_SM90_CTAS)
#define FLASHATTN_DEV_SM90_CTAS 1
#endif
#if defined(FLASHATTN_DEV_SM90_UNMASKED_ONLY)
  // ... of unmasked launches only (the masked kernels keep theirs: the short-rows tiles' ones
  // panels leave no room for wider blocks).
  if (head_dim == FLASHATTN_DEV_SM90_HDIM && head_dim_v == FLASHATTN_DEV_SM90_HDIMV && !windowed) {
#else
  if (head_dim == FLASHATTN_DEV_SM90_HDIM && head_dim_v == FLASHATTN_DEV_SM90_HDIMV) {
#endif
    return {FLASHATTN_DEV_SM90_CONSUMERS, FLASHATTN_DEV_SM90_BN, FLASHATTN_DEV_SM90_STAGES, FLASHATTN_DEV_SM90_PINGPONG != 0,
            FLASHATTN_DEV_SM90_CROSS != 0, FLASHATTN_DEV_SM90_CTAS};
  }
#endif
  if (head_dim == 192 && head_dim_v == 128) return {2, 128, 2, true};
  if (head_dim <= 64) return windowed ? FwdTile{3, 128, 2, true} : FwdTile{3, 128, 2, true, true};
  if (head_dim <= 128) return windowed ? FwdTile{2, 128, 2, true} : FwdTile{2, 176, 2, true};
  if (head_dim <= 192) return {2, 112, 2, true};
  return {2, 80, 2, true};
}

// The tile of short masked rows (FwdShortRowsTraits at d64): d64 under a causal or window mask with at
// most kFwdShortRowsMaxSeqlen query rows takes one consumer (64 x 64, 2 stages: 8 + 2 x 16 KB) at
// three CTAs per SM (ctas_per_sm; setmaxnreg 40 / 120) instead of three consumers. At 1024 rows
// the 192-row tile leaves 1024 = 5 x 192 + 64: a sixth tile per (batch, head) with one of its
// three consumers busy, and under causal the short tiles are the serial chain of one consumer
// (Q K^T -> softmax -> P V) with few key blocks to overlap. Measured on H200 (bf16, same process):
//  - two consumers (128 x 128) against three: causal +7.6/+6.8% at 512/1k, but -8..-21% from 2k
//    and -6% at 1k without a mask (dev/results/h200-2026-12-02-ab-d64-{base,c2}.json), so only
//    masked launches up to 1024 rows take it;
//  - one consumer at two CTAs per SM against two consumers at one: causal +3.0% at 512, +2.7% at
//    1k, 3 stages the same (dev/results/h200-2026-12-02-ab-ctas-{base2,x1,x2-b,base-b}-48180e9.json).
//    The same at d128 (64 x 64 or 64 x 80, the most two CTAs' shared memory allows) lost 5-21% at
//    every length: not taken.
//  - 64 keys at two CTAs lost to 128 keys (causal -3.8% at 512, -5.7 / -6.4% at 1k,
//    dev/results/h200-2026-12-02-ab-s14-1-*-4716590.json), but 64 keys at three CTAs won (128
//    keys do not fit three CTAs' registers: O 32 + row sums 4 + S 64 + P 32 = 132 accumulators,
//    above the 120 a consumer gets): causal 512 +10.6%, 1k +4.6% alone (two passes,
//    dev/results/h200-2026-12-04-s33-short-ab1-b50349e.json), +14.0 / +7.0% with 1/l by
//    MUFU.RCP against neither (medians of four alternating passes; ratio to cuDNN in the same
//    process 0.86 -> 0.99 and 0.89 -> 0.96; dev/results/h200-2026-12-04-s33-short3-ab-2c74ce7.json).
//    Three stages at three CTAs: 2.3 / 2.8% behind two. Four CTAs do not compile: wgmma needs more than the 64
//    registers a thread that 4 x 256 threads leave. The same tile past 1024 rows lost (causal
//    2k -4.2%, 4k -7.2%; s33 call 3, `dev/results/h200-2026-12-04-s33-short-ab2-c44a802.json`),
//    and for unmasked short rows instead of the three-consumer tile -10.5 / -10.4% at 512 / 1k.
//  - two score buffers, S_{i+1} issued before block i's softmax (so S's latency leaves the
//    consumer's chain; producer 24 / consumers 232 registers): causal -6.9% at 512, -6.7% at 1k,
//    and with the row sums on the tensor cores -1.7% / -0.1% against them alone
//    (dev/results/h200-2026-12-02-ab-s13-2-*.json). Predicted +10%: not S's latency either.
constexpr int kFwdShortRowsMaxSeqlen = 1024;
// The short-rows kernels (FwdShortRowsTraits, the row sums on the tensor cores): d64 with and
// without a mask up to kFwdShortRowsMaxSeqlen rows, d128 with and without one up to
// kFwdShortRowsMaxSeqlen128. d128 on them against the 128 x 176 kernel, H200 bf16, two pairs of
// processes (dev/results/h200-2026-12-02-ab-s13-3-*.json, run-to-run spread 0.3% on the rows both
// share): +2.4 / +2.2% at 512, -0.6 / -0.3% at 1k; predicted +4-8% at 512 from the loop's
// instruction count (64 FADD of ~470 per 128-key block).
// Moving the threshold to 1k with O stored through shared memory and a bulk tensor store (no
// room for it in the 128 x 176 tile) was measured in s15: 1k -0.3%, so 512 stays (dev/NOTES.md).
// With two Q slots and the Q first (s38, 2026-12-05, four passes in rotated order with cuDNN in
// each process, dev/results/h200-2026-12-05-s38-fwd-ab-8149d27.json) 1k rows on the short kernel
// again moved within the run's noise (unmasked +0.4%, causal +1.7%; rows of unchanged kernels
// moved up to +1.6%): 512 stays.
constexpr int kFwdShortRowsMaxSeqlen128 = 512;
// d256 under a causal or window mask: 128 x 64 (2 stages: 64 + 2 x 64 KB) instead of 128 x 80. The
// diagonal block of a 128-row tile is two whole 64-key blocks rather than parts of three 80-key
// ones, and at 512 rows 80 keys leave a last block of 32. H200 bf16, one process, O in 16-byte
// chunks in both (dev/results/h200-2026-12-02-ab-s14-2-{ch,chbn64}-6c07bbb.json): causal +16.2 /
// +8.0 / +3.5 / -0.2 / -2.7% at 512 / 1k / 2k / 4k / 16k; without a mask +1.0 / -3.8 / -4.3 /
// -5.0 / -6.4%. So masked launches up to 2048 rows take it; unmasked ones keep 128 x 80.
constexpr int kFwdShortRowsMaxSeqlen256 = 2048;
constexpr bool fwd_has_short_rows(int head_dim, int head_dim_v, bool windowed) {
  return head_dim == head_dim_v && (head_dim == 64 || head_dim == 128 || (head_dim == 256 && windowed));
}
constexpr int fwd_short_rows_max_seqlen(int head_dim) {
  return head_dim == 128   ? kFwdShortRowsMaxSeqlen128
         : head_dim == 256 ? kFwdShortRowsMaxSeqlen256
                           : kFwdShortRowsMaxSeqlen;
}
// Their tiles: d64 without a mask keeps the three-consumer tile (fwd_tile; the one-consumer tile
// was not timed there); d128 without a mask takes its masked tile, 128 x 128, whose two stages
// leave room for a panel of ones beside each stage's V (fwd_traits.h kOnesPerStage; 128 x 176
// does not: 208 KB before them), and which timed the same as 128 x 176 at 512-1k (dev/NOTES.md,
// "Unmasked d128 at <= 1024 keys on the window kernel"). Measured again in s33 (four alternating
// passes with cuDNN, `dev/results/h200-2026-12-04-s33-short-ab3-843927b.json`), all within the
// run's ~1.5% noise: this tile on the cross-tile pipeline (two Q slots fit beside the ones
// panels) +0.7% at 512 and, up to 1024 rows, -1.1% at 1k against the 128 x 176 kernel; d128 under a
// causal mask up to 512 rows on the short kernel (row sums on the tensor cores) +1.1%. With two Q
// slots (fwd_traits.h kQSlots; the window kernel has one and waited ~1600 cycles for Q at the
// tile start, trace) but K first, the short kernel won at causal 512 in four of four passes in
// rotated order, +2.0% (320-325 against 314-319 TFLOP/s; `dev/results/h200-2026-12-04-s34-qfirst-ab-365d30f.json`;
// rows of unchanged kernels moved up to +2.5% in those passes, so only just clear of the noise).
// With the Q first (the order of every short kernel), s38's four rotated passes gave +2.3% and
// +3.4% at causal 512 in two builds that both had it (the ratio to cuDNN 0.958 -> 0.982 / 0.993;
// dev/results/h200-2026-12-05-s38-fwd-ab-8149d27.json): so masked d128 up to 512 rows takes the
// short kernel too (the same 128 x 128 tile, two Q slots).
// The masked d64 short tile: 64 x 64 at three CTAs per SM (above).
constexpr FwdTile fwd_short_rows_tile(int head_dim, bool windowed) {
  return head_dim == 256 ? FwdTile{2, 64, 2, true}
         : head_dim == 128 ? fwd_tile(128, 128, true)
         : windowed      ? FwdTile{1, 64, 2, false, false, 3}
                         : fwd_tile(64, 64, false);
}

// The tile of the mask kernel (FwdMaskTraits, attn_mask alone): the window kernel's where its key
// blocks divide the packed mask's 128-key groups (d64, d128), else d256's masked short-rows tile of
// 64-key blocks (128 x 80 does not divide them).
constexpr FwdTile fwd_mask_tile(int head_dim) {
  return head_dim == 256 ? fwd_short_rows_tile(256, true) : fwd_tile(head_dim, head_dim, true);
}

// The tile of the block-sparse forward (FwdSparseTraits, calls with a block mask): block_m 128
// (two consumers) and block_n 128 where it fits, 64 where not (d192 and d256 at two stages), so
// that user blocks of 128 x 128 (FlexAttention's default) or 128 x 64 cover whole tiles, which
// are then clean (no element check); the dense tile's 192 rows (d64) or 176/112/80 keys
// (d128/d192/d256) would cut most of them into mixed tiles. Tile shapes not swept on a GPU: d128 is the
// masked dense tile (128 x 128, 2 stages), d64 takes the same (32 O registers fewer), d192 and
// d256 take 128 x 64 (48 + 2 x 48 and 64 + 2 x 64 KB).
// A third K/V stage at d64 / d128 (32 + 3 x 64 KB at d128) was measured in s27: -1% at densities
// 0.10 and 0.50 (dev/NOTES.md, "A third K/V stage for the d64/d128 sparse forward").
constexpr FwdTile fwd_sparse_tile(int head_dim, int head_dim_v) {
  if (head_dim == 192 && head_dim_v == 128) return {2, 128, 2, true};
  if (head_dim <= 128) return {2, 128, 2, true};
  return {2, 64, 2, true};
}

// The cache kernel (FwdCacheTraits) takes KV-cache calls with at least this many query rows
// (seqlen_q, or max_seqlen_q of a varlen call): one whole 128-row tile. Fewer (decode,
// speculative decoding) stay on the sm80 cache kernels, which split keys, fold GQA groups into
// rows and merge in-kernel. Under Switch::kDecodeShare a varlen batch's sequences of a few
// tokens run on those in a launch of their own and the rest here (cuda_backend.cu run_kvcache).
constexpr int kFwdCacheMinQueries = 128;

// A varlen call's list of the cache kernel's tiles (cache_tiles.h): the pairs it can hold, from
// the host's total_q and batch. A listed sequence has r >= max(rows_min, 1) rows (one without
// rows has no block), so its ceil(r / block_m) <= r / block_m + 1 query blocks; the sequences'
// rows are at most total_q in all, so at most min(batch, total_q / max(rows_min, 1)) of them are
// listed (ill-formed cu_seqlens that overlap could ask for more: the list is cut at the cap,
// which leaves rows unwritten but writes nothing outside it). Host-tested.
constexpr int64_t cache_tile_cap(int64_t total_q, int64_t batch, int block_m, int rows_min) {
  const int64_t per = total_q / (rows_min > 1 ? rows_min : 1);
  const int64_t cap = total_q / block_m + (batch < per ? batch : per) + 1;
  return cap > 1 ? cap : 1;
}
// The list in workspace: 8-byte slots (int2); slot 0's first int is the count, slot 1 + i pair i
// (sequence, query block).
constexpr size_t cache_tiles_bytes(int64_t cap) { return static_cast<size_t>(cap + 1) * 8; }

// The cache kernel's copies (fwd_kernel.h cache_producer): producer thread `tid` (0-127) copies
// 16-byte chunk cache_copy_chunk(tid) of each 128-byte panel row of tile rows cache_copy_row(tid,
// q), q < block_n / 16, in every panel: eight lanes per row, four rows per warp and cp.async. Lane
// cache_lookup_lane(tid, q) of its warp looks that row up in the cache (the row it looks up is
// cache_lookup_row(lane, warp)). tests/cpp/test_sm90_layout.cpp checks that the copies cover every
// chunk of a tile once and that each lookup is of the row copied.
constexpr int cache_copy_chunk(int tid) { return tid % 8; }
constexpr int cache_copy_row(int tid, int q) { return 16 * q + 4 * (tid / 32) + tid % 32 / 8; }
constexpr int cache_lookup_lane(int tid, int q) { return 4 * q + tid % 32 / 8; }
constexpr int cache_lookup_row(int lane, int warp) { return 16 * (lane / 4) + 4 * warp + lane % 4; }

// The dynamic shared memory a CTA may use on sm90 (227 KB), and its share when `ctas` CTAs are
// resident per SM (228 KB less 1 KB reserved per CTA).
constexpr size_t fwd_smem_limit(int ctas) { return 233472 / size_t(ctas) - 1024; }
constexpr size_t kFwdSmemLimit = fwd_smem_limit(1);  // 232448

// Shared memory of the forward kernel (FwdTraits::kSmemBytes): the 1024-byte alignment of the
// dynamic base, Q, the K/V ring, `barriers` mbarriers of 8 bytes, `extra_bytes` after them.
constexpr size_t fwd_smem_bytes(const FwdTile& t, int head_dim, int head_dim_v, int barriers, int extra_bytes) {
  const size_t q = size_t(64 * t.consumers) * head_dim * 2 * (t.cross_tile ? 2 : 1);
  const size_t kv = size_t(t.block_n) * (head_dim + head_dim_v) * 2;
  return 1024 + q + t.stages * kv + 8 * size_t(barriers) + size_t(extra_bytes);
}

// The most FwdTraits ever adds after the ring: the Q, K and V barriers, the tile feed's four
// barriers and two slots (kDynamicTiles), the block-sparse feed's two flags and one list entry
// per stage (kSparse), one pin slot per consumer warp (kPinSoftmax).
constexpr int fwd_sparse_words(const FwdTile& t) { return (2 + t.stages + 1) / 2; }
constexpr size_t fwd_smem_bound(const FwdTile& t, int head_dim, int head_dim_v) {
  return fwd_smem_bytes(t, head_dim, head_dim_v, 2 * (t.cross_tile ? 2 : 1) + 4 * t.stages + 4 + 1 + fwd_sparse_words(t),
                        16 * t.consumers);
}

// The bias slots of the bias kernel (FwdBiasTraits): one block_m x block_n 16-bit tile per stage.
constexpr size_t fwd_bias_bytes(const FwdTile& t) { return size_t(t.stages) * 64 * t.consumers * t.block_n * 2; }
// setmaxnreg of the bias kernel: its producer spilled at 24 (the bias copy's coordinates live
// across the loop), so 40, and its two consumers 232 (128 x 40 + 256 x 232 = 64512, the pool of
// 384 threads at 168); the consumers hold 32 bias words per block besides O, S and P.
constexpr int kFwdBiasProducerRegs = 40;
constexpr int kFwdBiasConsumerRegs = 232;

// setmaxnreg of the cache kernel (FwdCacheTraits): its 128 producer threads copy K and V
// themselves (fwd_kernel.h cache_producer) and hold a tile's walk, a row's cache offset and the
// copies' addresses; at 40 registers ptxas spilled 76-80 bytes in their loop (d128, d256; before
// the copies' addresses shared one register, 152-340 bytes at every head dim). Two
// consumers keep 224 (O 64 + S 64 + P 32 at d128; d256 128 + 32 + 16).
constexpr int kFwdCacheProducerRegs = 56;
constexpr int kFwdCacheConsumerRegs = 224;

// Registers of a consumer thread's accumulators (O, S, P), and what setmaxnreg gives it.
constexpr int fwd_accumulator_regs(const FwdTile& t, int head_dim_v) {
  return head_dim_v / 2 + t.block_n / 2 + t.block_n / 4;
}
// The registers setmaxnreg can move between a CTA's warpgroups (every sm90 kernel's warp roles):
// those the launch gave the CTA. A kernel with setmaxnreg takes its __launch_bounds__ cap as its
// register count, 65536 / (threads x CTAs per SM) in steps of 8 (at most 255): 168 x 384 = 64512
// for a producer and two consumers, not 65536. A setmaxnreg.inc beyond what the other warpgroups
// freed waits forever: the FP8 sweep's 32 + 2 x 240 (65536 at 384 threads) hung its first test
// (s9; dev/NOTES.md "FP8 forward on Hopper").
constexpr int setmaxnreg_pool(int threads, int ctas_per_sm) {
  const int per_thread = 65536 / (threads * ctas_per_sm);
  return threads * ((per_thread < 255 ? per_thread : 255) / 8 * 8);
}
// Whether producer + consumer warpgroups (128 threads each) fit that pool after setmaxnreg.
constexpr bool setmaxnreg_fits(int producer_regs, int consumers, int consumer_regs, int ctas_per_sm) {
  return 128 * producer_regs + 128 * consumers * consumer_regs <= setmaxnreg_pool(128 * (consumers + 1), ctas_per_sm);
}
// setmaxnreg: the producer warpgroup keeps 24 registers a thread (40 at two or three CTAs per
// SM: its tile walk spilled at 24 there), the consumers share the rest of the pool in setmaxnreg's
// steps of 8, at most 240: 160 for three consumers, 240 for two at one CTA per SM; 120 for one at
// three.
constexpr int fwd_producer_regs(const FwdTile& t) { return t.ctas_per_sm > 1 ? 40 : 24; }
constexpr int fwd_consumer_regs(const FwdTile& t) {
  const int per_consumer =
      (setmaxnreg_pool(128 * (t.consumers + 1), t.ctas_per_sm) - 128 * fwd_producer_regs(t)) / (128 * t.consumers);
  return per_consumer / 8 * 8 < 240 ? per_consumer / 8 * 8 : 240;
}

}  // namespace flashattn::cuda::sm90
