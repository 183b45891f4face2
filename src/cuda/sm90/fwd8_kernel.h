// The FP8 (float8 e4m3) forward for Hopper (sm_90a), issue 21: the 16-bit kernel's structure
// (fwd_kernel.h: persistent CTAs, a producer warpgroup streaming K and V through a staged ring,
// two ping-ponging consumer warpgroups, S_j overlapped with P_{j+1} V_{j+1}) with three changes
// that 8-bit wgmma forces (docs/SEMANTICS.md, "FP8", is the contract; core/fp8.h the reference r):
//
//  1. Both shared-memory operands of an 8-bit wgmma are K-major. S = Q K^T already is (rows of
//     head-dim bytes). For O += P V the K dimension is the keys, but V arrives (keys, d) with d
//     contiguous, so warps 1-3 of the producer warpgroup transpose each V tile, after its copy
//     lands, into a second buffer Vt (d rows of block_n key bytes), with a key permutation (3.).
//  2. P is rounded to e4m3 relative to the integer reference r = ceil(max logit) - 8 (in log2
//     units), so P lies in (0, 256]; every change of r rescales O and l by a power of two. There
//     is no lazy rescale (fwd_kernel.h, kRescaleThreshold): a stale r would put P above 448.
//     The row sum l takes P before its rounding (SEMANTICS.md step 2).
//  3. P goes from the f32 accumulator layout to the 8-bit A fragment without shuffles:
//
//     Accumulator of S (m64nN, PTX ISA "wgmma .m64nNk16 register fragment layout for
//     accumulator D"): lane 4g + t of warp w holds rows 16w + g (+8 for h = 1) and, per 8-column
//     chunk c, columns 8c + 2t + e (e = 0, 1) in s[4c + 2h + e].
//     A fragment of an 8-bit m64nNk32 product (the k16 16-bit fragment, read as bytes): word 0
//     holds row g, K-bytes 4t .. 4t + 3; word 1 row g + 8, the same bytes; words 2 and 3 the
//     same at K-bytes 16 + 4t .. 16 + 4t + 3.
//     Within one k32 step (keys 32kk .. 32kk + 31, chunks c = 4kk .. 4kk + 3) thread t owns keys
//     u = 8j + 2t + e of each half (j = 0, 1 within a 16-key half hf): eight per row. Packing
//     them in order, word hf*2 + h = (u(j=0,e=0), u(0,1), u(1,0), u(1,1)) of half hf, places
//     key u = 16hf + 8j + 2t + e at K-position k(u) = 16hf + 4t + 2j + e. That is not the
//     identity (keys 2t, 2t+1 of thread t are K-positions 4t, 4t+1, but keys 8+2t, 8+2t+1 land
//     at 4t+2, 4t+3), and P V sums over K, so any permutation of K applied to both P and V
//     leaves O unchanged: the transpose writes V's key u of each 32-key group at K-byte k(u)
//     of Vt's row. P stays in its thread, the shuffles FlashAttention-3 spends on P are gone,
//     and the permutation costs the transpose nothing (it moves every byte anyway).
//
// Transposer (warps 1-3 of warpgroup 0): per warp, items of 16 keys x 32 head-dim bytes, one
// ldmatrix.x4.trans (byte pairs of one key as 16-bit elements), four byte permutes and one
// stmatrix.x4 each (fwd8_layout.h, "The matrix transposer"; checked on the host by
// tests/cpp/test_fp8_sm90_layout.cpp against the ISA's ldmatrix / stmatrix). ldmatrix's
// transpose hands lane 4g + t keys 2t, 2t + 1 of two head-dim columns, which with the next 8
// keys' register are exactly Vt's K-permuted word 4t (3.), so the permutation is free here too.
// The first version (4 x 4 byte units of 4-byte loads and stores, 120 SASS instructions per 16
// bytes) bound the first H200 run at ~285 TFLOP/s at d128; this one runs 785 at d128 16k, as fast
// as a V pre-transposed by TMA (A/B of 2026-12-02, dev/NOTES.md; both alternatives removed since).
// V's slot is freed as soon as it is read; Vt has a full / empty pair of its own. The
// transposers do not follow the tiles: they take every V slot in ring order until the producer
// marks a slot as the end (that slot's flag, then a plain arrival on its full barrier).
// A caller-transposed V (FA3's other option) would skip this stage; timed with a transpose
// kernel in front, it was no faster at 16k and slower at 4k (dev/NOTES.md).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/fp8.h"
#include "cuda/ptx/ldmatrix.h"
#include "cuda/sm90/fwd8_layout.h"
#include "cuda/sm90/fwd8_traits.h"
#include "cuda/sm90/fwd_kernel.h"

namespace flashattn::cuda::sm90 {

struct Ring8 {
  uint64_t* q_full;
  uint64_t* q_empty;
  uint64_t* k_full;    // [stages] the copy landed
  uint64_t* k_empty;   // [stages] every consumer warp has issued its last read
  uint64_t* v_full;    // [stages] the copy landed (or the end mark)
  uint64_t* v_empty;   // [stages] every transposer thread has read it
  uint64_t* vt_full;   // [stages] every transposer thread has written it
  uint64_t* vt_empty;  // [stages] every consumer warp is done with it
};

// Four e4m3 of increasing K (byte 0 = p0), round to nearest even, saturating (ptx/fp8.h's
// float_to_e4m3, two at a time: cvt puts its first source in the upper byte).
__device__ __forceinline__ uint32_t pack4_e4m3(float p0, float p1, float p2, float p3) {
  uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(lo) : "f"(p1), "f"(p0));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(hi) : "f"(p3), "f"(p2));
  return uint32_t(lo) | (uint32_t(hi) << 16);
}

// Shared-memory words by 32-bit address (the generic pointers the kernel derives from the
// aligned base compile to generic LD/ST, not LDS/STS).
struct SharedWords {
  __device__ __forceinline__ uint32_t load(uint32_t addr) const {
    uint32_t x;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(x) : "r"(addr) : "memory");
    return x;
  }
  __device__ __forceinline__ void store(uint32_t addr, uint32_t x) const {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(x) : "memory");
  }
};

// The transposers' share of one V tile: src (kBlockN keys x kHeadDim bytes, in panels) ->
// dst (kHeadDim rows x kBlockN key bytes, K-permuted as in the file comment), shared-memory
// addresses; `tid` in [0, kTransposeThreads). The algebra: fwd8_layout.h.
// Per warp, items of 16 keys x 32 head-dim bytes: ldmatrix.x4.trans, four byte permutes,
// stmatrix.x4 (fwd8_layout.h, "The matrix transposer"). Two items per pass: the second
// ldmatrix issues before the first one's permutes wait for it, within the producer's 40
// registers.
template <typename Traits>
__device__ __forceinline__ void transpose_v(uint32_t src, uint32_t dst, int tid) {
  constexpr int kItems = fwd8::matrix_items(Traits::kHeadDim, Traits::kBlockN);
  constexpr int kWarps = Traits::kTransposeThreads / 32;
  static_assert(Traits::kTransposeThreads % 32 == 0, "whole warps");
  const unsigned warp = unsigned(tid) / 32;
  const int lane = tid % 32;
  // The XORs on the offsets, not on the addresses: the lane's bits reach bit 10 (16 rows of
  // 128 bytes), above the tiles' 1024-byte alignment.
  const uint32_t ld_lane = fwd8::ldsm_lane_bits(lane, Traits::kRowBytes);
  const uint32_t st_lane = fwd8::stsm_lane_bits(lane, Traits::kVtRowBytes);
#pragma unroll Traits::kTransposeUnroll
  for (unsigned item = warp; item < unsigned(kItems); item += kWarps) {
    const fwd8::MatrixItem it = fwd8::matrix_item(item, Traits::kBlockN);
    uint32_t r[4], o[4];
    ptx::ldmatrix_x4_trans(r, src + (fwd8::ldsm_item_bits(it, Traits::kRowBytes, Traits::kPanelBytesKV) ^ ld_lane));
    fwd8::matrix_vt_words(r, o, lane);
    ptx::stmatrix_x4(dst + (fwd8::stsm_item_bits(it, Traits::kVtRowBytes, Traits::kPanelBytesVt) ^ st_lane), o);
  }
}

template <typename Traits>
__device__ __forceinline__ void gemm_qk8(float (&s)[Traits::kBlockN / 2], uint64_t q_desc, uint64_t k_desc) {
  using Mma = ptx::WgmmaE4m3<Traits::kBlockN>;
  ptx::wgmma_fence();
#pragma unroll
  for (int panel = 0; panel < Traits::kPanels; ++panel) {
#pragma unroll
    for (int kk = 0; kk < Traits::kRowBytes / 32; ++kk) {  // k32 steps of 32 bytes in each row
      Mma::ss(s, ptx::desc_advance(q_desc, panel * Traits::kPanelBytesQ + kk * 32),
              ptx::desc_advance(k_desc, panel * Traits::kPanelBytesKV + kk * 32), (panel | kk) != 0 ? 1u : 0u);
    }
  }
  ptx::wgmma_commit();
}

template <typename Traits>
__device__ __forceinline__ void gemm_pv8(float (&o)[Traits::kHeadDim / 2], const uint32_t (&p)[Traits::kBlockN / 8],
                                         uint64_t vt_desc) {
  using Mma = ptx::WgmmaE4m3<Traits::kHeadDim>;
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Traits::kBlockN / 32; ++kk) {  // 32 keys = 32 bytes of each Vt row per step
    const uint32_t a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
    const int panel = kk * 32 / Traits::kVtRowBytes;
    Mma::rs(o, a, ptx::desc_advance(vt_desc, panel * Traits::kPanelBytesVt + kk * 32 % Traits::kVtRowBytes), 1u);
  }
  ptx::wgmma_commit();
}

// Online softmax of one block (file comment, 2.): st.row_max holds the reference r (log2 units,
// an integer, or -inf before any visible key); s becomes unrounded P = 2^(x - r), x = s * scale.
// Returns whether any row of the warp changed r (correction: 2^(r_old - r_new), exact).
template <typename Traits>
__device__ __forceinline__ bool softmax_block8(ConsumerState<Traits>& st, float scale_log2, float (&correction)[2]) {
  constexpr int kChunks = Traits::kBlockN / 8;
  bool any_rescale = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = -INFINITY;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) mx = fmaxf(mx, fmaxf(st.s[4 * c + 2 * h], st.s[4 * c + 2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float kept = st.row_max[h];
    // ceilf(-inf) = -inf: a block without a visible key proposes nothing.
    const float r = fmaxf(kept, fp8_p_reference(mx * scale_log2));
    const bool moved = r > kept;
    // From -inf: exp2(-inf) = 0, and O and l are 0 anyway.
    correction[h] = moved ? exp2f(kept - r) : 1.0f;
    st.row_max[h] = r;
    any_rescale |= moved;
    // A row that has seen no visible key keeps -inf: subtract 0 so exp2(-inf - -inf) is no NaN.
    const float r_use = r == -INFINITY ? 0.0f : r;
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = ptx::exp2_approx(fmaf(st.s[4 * c + 2 * h + e], scale_log2, -r_use));
        st.s[4 * c + 2 * h + e] = p;
        sum += p;
      }
    }
    st.row_sum[h] = st.row_sum[h] * correction[h] + sum;
  }
  return __any_sync(0xffffffffu, any_rescale);
}

// P to the A fragment of gemm_pv8 (file comment, 3.; fwd8_layout.h p_word / p_source).
template <typename Traits>
__device__ __forceinline__ void convert_p8(const ConsumerState<Traits>& st, uint32_t (&p)[Traits::kBlockN / 8]) {
#pragma unroll
  for (int kk = 0; kk < Traits::kBlockN / 32; ++kk) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        p[fwd8::p_word(kk, hf, h)] =
            pack4_e4m3(st.s[fwd8::p_source(kk, hf, h, 0)], st.s[fwd8::p_source(kk, hf, h, 1)],
                       st.s[fwd8::p_source(kk, hf, h, 2)], st.s[fwd8::p_source(kk, hf, h, 3)]);
      }
    }
  }
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1) fwd8_kernel(const __grid_constant__ FwdParams kp) {
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kStages = Traits::kStages;
  const ForwardParams& params = kp.p;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = ptx::align_shared<1024>(smem_raw);
  unsigned char* sQ = smem;                                  // kPanels x (kBlockM rows)
  unsigned char* sK = sQ + Traits::kTileBytesQ;              // kStages x kPanels x (kBlockN rows)
  unsigned char* sV = sK + kStages * Traits::kTileBytesK;    // kStages x kPanels x (kBlockN rows)
  unsigned char* sVt = sV + kStages * Traits::kTileBytesV;   // kStages x (kHeadDim rows of kBlockN)
  uint64_t* bars = reinterpret_cast<uint64_t*>(sVt + kStages * Traits::kTileBytesVt);
  const Ring8 ring{bars,
                   bars + 1,
                   bars + 2,
                   bars + 2 + kStages,
                   bars + 2 + 2 * kStages,
                   bars + 2 + 3 * kStages,
                   bars + 2 + 4 * kStages,
                   bars + 2 + 5 * kStages};
  const TileFeed feed{reinterpret_cast<int*>(bars + 6 + 6 * kStages), bars + 2 + 6 * kStages, bars + 4 + 6 * kStages};
  // One end flag per V slot: a shared one could be seen set while a transposer still has the
  // other slot's last real tile to take. Read and written as shared words (SharedWords).
  const uint32_t stop_flag = ptx::smem_u32(bars + Traits::kBarriers);  // [kStages]

  const int warpgroup = threadIdx.x / 128;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const TileOrder order = kp.order;
  const int group = params.heads / params.heads_k;
  const int map_batch_varlen = params.is_varlen();

  if (threadIdx.x == 0) {
    ptx::mbarrier_init(ring.q_full, 1);
    ptx::mbarrier_init(ring.q_empty, 4 * Traits::kConsumers);
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(&ring.k_full[s], 1);
      ptx::mbarrier_init(&ring.v_full[s], 1);
      ptx::mbarrier_init(&ring.k_empty[s], 4 * Traits::kConsumers);
      ptx::mbarrier_init(&ring.v_empty[s], Traits::kTransposeThreads);
      ptx::mbarrier_init(&ring.vt_full[s], Traits::kTransposeThreads);
      ptx::mbarrier_init(&ring.vt_empty[s], 4 * Traits::kConsumers);
    }
    if constexpr (Traits::kDynamicTiles) {
      for (int s = 0; s < 2; ++s) {
        ptx::mbarrier_init(&feed.full[s], 1);
        ptx::mbarrier_init(&feed.empty[s], 4 * Traits::kConsumers);
      }
    }
    for (int s = 0; s < kStages; ++s) SharedWords{}.store(stop_flag + 4 * s, 0);
    ptx::mbarrier_init_fence();
  }
  __syncthreads();

  if (warpgroup == 0) {
    ptx::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    if (warp != 0) {
      // Transposers: every V slot in ring order until the end mark.
      const int tid = threadIdx.x - 32;
#pragma unroll 1
      for (int it = 0;; ++it) {
        const int stage = it % kStages;
        const uint32_t parity = (it / kStages) & 1;
        ptx::mbarrier_wait(&ring.v_full[stage], parity);
        if (SharedWords{}.load(stop_flag + 4 * stage) != 0) break;
        ptx::mbarrier_wait(&ring.vt_empty[stage], parity ^ 1);
        transpose_v<Traits>(ptx::smem_u32(sV + stage * Traits::kTileBytesV),
                            ptx::smem_u32(sVt + stage * Traits::kTileBytesVt), tid);
        // The consumers read Vt through the async proxy (wgmma): order these generic writes first.
        ptx::fence_proxy_async_smem();
        ptx::mbarrier_arrive(&ring.v_empty[stage]);
        ptx::mbarrier_arrive(&ring.vt_full[stage]);
      }
      return;
    }
    if (lane != 0) return;
    ptx::tma_prefetch_map(&kp.q);
    ptx::tma_prefetch_map(&kp.k);
    ptx::tma_prefetch_map(&kp.v);
    int it = 0;
    int q_pass = 0;
    for (int k = 0;; ++k) {
      int t;
      if constexpr (Traits::kDynamicTiles) {
        t = k == 0 ? int(blockIdx.x)
                   : int(__reduce_max_sync(1u, unsigned(atomicAdd(kp.tile_counter, 1)))) + int(gridDim.x);
        publish_tile(feed, k, t);
      } else {
        t = order.cta_tile(k, blockIdx.x, gridDim.x);
      }
      if (t >= order.tiles) break;
      const TileWork w = tile_work<Traits>(params, order, t);
      if (!w.exists() || !w.has_keys()) continue;
      const int map_batch = map_batch_varlen ? 0 : w.batch;
      const int head_k = w.head / group;
      const auto load_kv = [&](const CUtensorMap* map, unsigned char* base, uint64_t* full, uint64_t* empty,
                               int n_block, int index) {
        const int stage = index % kStages;
        ptx::mbarrier_wait(&empty[stage], ((index / kStages) & 1) ^ 1);
        ptx::mbarrier_arrive_expect_tx(&full[stage], Traits::kTileBytesK);
#pragma unroll
        for (int panel = 0; panel < Traits::kPanels; ++panel) {
          ptx::tma_load_4d(base + stage * Traits::kTileBytesK + panel * Traits::kPanelBytesKV, map, &full[stage],
                           Traits::kRowBytes * panel, int(w.row0_k) + n_block * kBlockN, head_k, map_batch);
        }
      };
      const auto load_q = [&] {
        ptx::mbarrier_wait(ring.q_empty, (q_pass & 1) ^ 1);
        ptx::mbarrier_arrive_expect_tx(ring.q_full, Traits::kTileBytesQ);
#pragma unroll
        for (int panel = 0; panel < Traits::kPanels; ++panel) {
          ptx::tma_load_4d(sQ + panel * Traits::kPanelBytesQ, &kp.q, ring.q_full, Traits::kRowBytes * panel,
                           int(w.row0_q) + w.m0, w.head, map_batch);
        }
        ++q_pass;
      };
      // K one block ahead of V, the first K before Q: the 16-bit kernel's order (fwd_kernel.h).
      load_kv(&kp.k, sK, ring.k_full, ring.k_empty, w.n_hi - 1, it);
      load_q();
#pragma unroll 1
      for (int n_block = w.n_hi - 2; n_block >= w.n_lo; --n_block, ++it) {
        load_kv(&kp.k, sK, ring.k_full, ring.k_empty, n_block, it + 1);
        load_kv(&kp.v, sV, ring.v_full, ring.v_empty, n_block + 1, it);
      }
      load_kv(&kp.v, sV, ring.v_full, ring.v_empty, w.n_lo, it);
      ++it;
    }
    // The end mark for the transposers: the next V slot, once free, completes its phase with
    // no copy and the flag set (the arrival releases the flag, their wait acquires it).
    const int stage = it % kStages;
    ptx::mbarrier_wait(&ring.v_empty[stage], ((it / kStages) & 1) ^ 1);
    SharedWords{}.store(stop_flag + 4 * stage, 1);
    ptx::mbarrier_arrive(&ring.v_full[stage]);
    return;
  }

  ptx::warpgroup_reg_alloc<Traits::kConsumerRegs>();
  const int consumer = warpgroup - 1;
  // Traits::kPinSoftmax: one float per consumer warp after the end flags, stored, never read.
  [[maybe_unused]] const uint32_t pin_slot = stop_flag + 4 * kStages + 4 * (warp - 4);
  const int g = lane / 4;
  const int t4 = lane % 4;
  const int wg_row0 = consumer * 64;
  const int row_in_tile = wg_row0 + (warp % 4) * 16 + g;
  // Descriptors, all K-major: Q and K (rows of head-dim bytes, stride offset one swizzle period
  // of 8 rows), Vt (rows of key bytes, swizzled at their width). The leading offset is unused within a
  // swizzled row, which one k32 step never leaves.
  constexpr ptx::SmemSwizzle kSwz = Traits::kSwizzleBytes == 128 ? ptx::SmemSwizzle::k128B : ptx::SmemSwizzle::k64B;
  const uint64_t q_desc =
      ptx::smem_desc(ptx::smem_u32(sQ + wg_row0 * Traits::kRowBytes), 16, Traits::kSwizzlePeriod, kSwz);
  const uint64_t k_desc0 = ptx::smem_desc(ptx::smem_u32(sK), 16, Traits::kSwizzlePeriod, kSwz);
  constexpr ptx::SmemSwizzle kVtSwz = Traits::kVtRowBytes == 128 ? ptx::SmemSwizzle::k128B : ptx::SmemSwizzle::k64B;
  const uint64_t vt_desc0 = ptx::smem_desc(ptx::smem_u32(sVt), 16, Traits::kVtSwizzlePeriod, kVtSwz);
  const auto k_desc = [&](int stage) { return ptx::desc_advance(k_desc0, stage * Traits::kTileBytesK); };
  const auto vt_desc = [&](int stage) { return ptx::desc_advance(vt_desc0, stage * Traits::kTileBytesVt); };
  const Turns<Traits> turns{consumer};
  if (consumer == Traits::kConsumers - 1) turns.pass();

  int it = 0;
  int q_pass = 0;
  for (int k = 0;; ++k) {
    const int tile = Traits::kDynamicTiles ? take_tile(feed, k, lane) : order.cta_tile(k, blockIdx.x, gridDim.x);
    if (tile >= order.tiles) break;
    const TileWork w = tile_work<Traits>(params, order, tile);
    if (!w.exists()) continue;
    const WindowMask mask = make_window_mask<Traits::kMask == MaskMode::kWindow>(
        w.seqlen_q, w.seqlen_k, params.window_left, params.window_right);
    // q_descale * k_descale of the head's kv head fold into the scale (SEMANTICS.md step 1);
    // v_descale multiplies O at the end. With modifiers the scores leave modify_scores in log2
    // units already (softcap's input scale carries the descales too).
    const int head_k = w.head / group;
    const float descale = params.q_descale.at(w.batch, head_k) * params.k_descale.at(w.batch, head_k);
    const float scale_log2 = Traits::kMods ? 1.0f : params.scale_log2 * descale;
    ScoreMods90 mods{};
    if constexpr (Traits::kMods) {
      mods.softcap = params.softcap > 0.0f;
      mods.scale_log2 = params.scale_log2 * descale;
      mods.softcap_in = mods.softcap ? params.scale * descale / params.softcap : 0.0f;
      mods.softcap_out = mods.softcap ? params.softcap * kLog2e : 0.0f;
      mods.alibi_log2 =
          params.alibi != nullptr ? params.alibi[w.batch * params.alibi_batch_stride + w.head] * kLog2e : 0.0f;
    }

    ConsumerState<Traits> st;
    uint32_t p[kBlockN / 8];
#pragma unroll
    for (int i = 0; i < ConsumerState<Traits>::kORegs; ++i) st.o[i] = 0.0f;
    st.row_max[0] = st.row_max[1] = -INFINITY;
    st.row_sum[0] = st.row_sum[1] = 0.0f;

    if (w.has_keys()) {
      const int row_begin = w.m0 + wg_row0;
      const int row_end = min(w.m0 + w.rows_here, row_begin + 64);
      const auto needs_mask = [&](int n_block) {
        return block_needs_mask<Traits>(mask, w.seqlen_k, row_begin, row_end, n_block);
      };
      const int row = w.m0 + row_in_tile;
      ptx::mbarrier_wait(ring.q_full, q_pass & 1);

      int stage = it % kStages;
      uint32_t parity = (it / kStages) & 1;
      ptx::mbarrier_wait(&ring.k_full[stage], parity);
      turns.take();
      gemm_qk8<Traits>(st.s, q_desc, k_desc(stage));
      turns.pass();
      ptx::wgmma_wait<0>();
      ptx::fence_operand(st.s);
      release(&ring.k_empty[stage], lane);
      if constexpr (Traits::kMods) modify_scores<Traits>(st.s, mods, mask, row, (w.n_hi - 1) * kBlockN + 2 * t4);
      if (needs_mask(w.n_hi - 1)) apply_mask<Traits>(st.s, mask, row, (w.n_hi - 1) * kBlockN + 2 * t4);
      {
        float correction[2];
        softmax_block8<Traits>(st, scale_log2, correction);
      }
      convert_p8<Traits>(st, p);

      for (int n_block = w.n_hi - 2; n_block >= w.n_lo; --n_block) {
        const int prev_stage = stage;
        const uint32_t prev_parity = parity;
        ++it;
        stage = it % kStages;
        parity = (it / kStages) & 1;
        ptx::mbarrier_wait(&ring.k_full[stage], parity);
        ptx::mbarrier_wait(&ring.vt_full[prev_stage], prev_parity);
        turns.take();
        gemm_qk8<Traits>(st.s, q_desc, k_desc(stage));
        gemm_pv8<Traits>(st.o, p, vt_desc(prev_stage));
        turns.pass();
        ptx::wgmma_wait<1>();
        ptx::fence_operand(st.s);
        release(&ring.k_empty[stage], lane);
        if constexpr (Traits::kMods) modify_scores<Traits>(st.s, mods, mask, row, n_block * kBlockN + 2 * t4);
        if (needs_mask(n_block)) apply_mask<Traits>(st.s, mask, row, n_block * kBlockN + 2 * t4);
        float correction[2];
        const bool rescale = softmax_block8<Traits>(st, scale_log2, correction);
        // Keeps ptxas's wait for P V after the exponentials (fwd_kernel.h, the same pin).
        if constexpr (Traits::kPinSoftmax) {
          if (lane == 0) ptx::st_shared_f32(pin_slot, st.row_sum[0] + st.row_sum[1]);
        }
        ptx::wgmma_wait<0>();
        ptx::fence_operand(st.o);
        ptx::fence_operand(p);
        release(&ring.vt_empty[prev_stage], lane);
        if (rescale) rescale_o(st, correction);
        convert_p8<Traits>(st, p);
      }
      release(ring.q_empty, lane);
      ++q_pass;
      ptx::mbarrier_wait(&ring.vt_full[stage], parity);
      turns.take();
      gemm_pv8<Traits>(st.o, p, vt_desc(stage));
      turns.pass();
      ptx::wgmma_wait<0>();
      ptx::fence_operand(st.o);
      release(&ring.vt_empty[stage], lane);
      ++it;
      // O picks up v_descale here (once per element), before store_tile's 1 / l.
      const float v_descale = params.v_descale.at(w.batch, head_k);
#pragma unroll
      for (int i = 0; i < ConsumerState<Traits>::kORegs; ++i) st.o[i] *= v_descale;
    }
    // row_max holds r in log2 units already: a scale of 1 leaves it as the LSE's maximum.
    store_tile<Traits>(params, w, st, row_in_tile, t4, 1.0f);
  }
  if (consumer == 0) turns.take();
}

}  // namespace flashattn::cuda::sm90
