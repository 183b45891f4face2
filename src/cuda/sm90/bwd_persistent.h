// dev/ A/B (issue 20, FLASHATTN_DEV_SM90_BWD_PERSISTENT): the fused dK/dV/dQ kernel of the Hopper
// backward (bwd_kv_kernel<Traits, true>, dense d64/d128, with or without softcap/ALiBi) on a
// persistent grid: min(tiles, SMs) CTAs, each walking its tiles (key block, plane) in
// BwdTileOrder (bwd_tile_order.h). The step body is bwd_kv_kernel's fused one; what differs:
//  - every ring counts across tiles: the Q/dO/LSE/D stages by the CTA's step count `it` (stage
//    it % kStages, phase (it / kStages) & 1), the resident K/V by the count of tiles with steps
//    `kv_it`, the dS^T buffers by `it`'s parity (by the tile's step parity, a one-step tile
//    followed by another would have both tiles' step 0 in one buffer while the other consumer's
//    dQ product may still read it);
//  - K and V have "empty" barriers (one arrival per consumer warp, as the stages'): V is free
//    once the tile's last dP^T is done, K once its last dQ product is (d64: its last S^T; the dQ
//    product reads the consumer's copy of K's half), so the producer loads the next tile's V, then
//    K, while the consumers finish the last step and store dK/dV. The producer issues the next
//    tile's first stage before waiting for them;
//  - the dQ writer warp walks the same tiles and hands each buffer back at the top of the next
//    step of the CTA (so it never hands one back after the CTA's last step, as before).
// Every tile-derived value comes from blockIdx.x and the round (no shared-memory read), so it
// stays on the uniform datapath. Block-sparse (KvStepWalk reads blockIdx) and the split-role
// kernels (d192/d256) keep the one-CTA-per-tile launch.
#pragma once

#if defined(FLASHATTN_DEV_SM90_BWD_PERSISTENT)

#include "cuda/sm90/bwd_kernel.h"
#include "cuda/sm90/bwd_tile_order.h"

namespace flashattn::cuda::sm90 {

namespace bwd90 {

// One tile of the persistent walk, as bwd_kv_kernel derives it from its CTA slot.
struct KvTile {
  int n_block, kv_head, split, batch;
  SeqExtent seq;
  int n0, keys_here, head_begin, m_lo, n_m, steps;
  int64_t ws_row0;
  __device__ __forceinline__ bool exists() const { return n0 < seq.seqlen_k; }
};

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

// The masked kernels' dynamic tile feed (as the persistent forward's TileFeed, fwd_kernel.h): the
// producer takes each next tile from a global counter (atomicAdd; its first is blockIdx.x) and
// hands it to the consumer warps and the dQ writer warp through a two-slot ring (full: the
// producer's arrival; empty: one arrival per reading warp). Lane 0 alone reads the slot and
// redux.sync spreads it, so the tile and everything derived from it stay uniform (the forward
// measured 5-10% lost when a plain shared-memory read moved them to vector registers) and the
// slot's reader is the lane whose arrival frees it (racecheck; the forward's uniform_word).
struct KvTileFeed {
  int* slot;       // [2]
  uint64_t* full;  // [2]
  uint64_t* empty; // [2]
};

__device__ __forceinline__ int take_kv_tile(const KvTileFeed& feed, int k, int lane) {
  const int s = k & 1;
  ptx::mbarrier_wait(&feed.full[s], (k >> 1) & 1);
  const int t = int(__reduce_max_sync(0xffffffffu, lane == 0 ? unsigned(feed.slot[s]) : 0u));
  if (lane == 0) ptx::mbarrier_arrive(&feed.empty[s]);
  return t;
}

__device__ __forceinline__ void publish_kv_tile(const KvTileFeed& feed, int k, int t) {
  const int s = k & 1;
  ptx::mbarrier_wait(&feed.empty[s], ((k >> 1) & 1) ^ 1);
  feed.slot[s] = t;
  ptx::mbarrier_arrive(&feed.full[s]);  // release: the slot's value is visible to the waiters
}

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

// The persistent kernel's arguments: bwd_kv_kernel's, and the masked kernels' tile counter
// (workspace, zeroed per launch).
struct BwdPersistentArgs {
  BwdKernelArgs a;
  int* tile_counter;
};

// Extra shared memory after bwd_kv_kernel's barriers: K and V empty, the feed's full and empty
// pairs, its two slots.
constexpr size_t kKvPersistentExtraBytes = 6 * sizeof(uint64_t) + 2 * sizeof(int);

// Tiles from the feed (masked: causal and window tiles differ in work, and static rounds left the
// busiest CTA with 1.13-1.55x the mean work at d128 causal 512-16k in the host model of
// tests/cpp/test_bwd_tile_order.cpp, the hardware's dispatch of one CTA per tile 1.00-1.02x) or
// in static rounds (unmasked: equal tiles).
template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    bwd_kv_persistent_kernel(const __grid_constant__ BwdPersistentArgs pargs) {
  const BwdKernelArgs& args = pargs.a;
  constexpr bool kDynamic = Traits::kMask == MaskMode::kWindow;
  static_assert(Traits::kHasFused && !Traits::kSparse && !Traits::kSplitRoles, "dense d64/d128 fused kernel only");
  using Element = typename Traits::Element;
  constexpr int kBlockN = Traits::kKvBlockN;
  constexpr int kBlockM = Traits::kKvBlockM;
  constexpr int kStages = Traits::kStages;
  constexpr int kHeadDim = Traits::kHeadDim;
  const BwdKernelParams& params = args.p;
  const BwdTileOrder order = bwd90::kv_tile_order(params, kBlockN);
  const int cta = int(blockIdx.x);
  const int ctas = int(gridDim.x);

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = ptx::align_shared<1024>(smem_raw);
  unsigned char* sK = smem;
  unsigned char* sV = sK + Traits::tile_bytes(kBlockN);
  unsigned char* stages = sV + Traits::tile_bytes_v(kBlockN);
  unsigned char* sDs = stages + kStages * Traits::kKvStageBytes;
  float* sDq = reinterpret_cast<float*>(sDs + 2 * Traits::kDsBytes);
  [[maybe_unused]] unsigned char* sKh =
      reinterpret_cast<unsigned char*>(sDq) + Traits::kConsumers * Traits::kDqPartBytes;
  uint64_t* bars = reinterpret_cast<uint64_t*>(stages + kStages * Traits::kKvStageBytes + Traits::kFusedExtraBytes);
  uint64_t* kv_full = bars;
  uint64_t* full = bars + 1;             // [kStages]
  uint64_t* empty = bars + 1 + kStages;  // [kStages]
  // After bwd_kv_kernel's barriers (kKvPersistentExtraBytes): K and V free, the tile feed.
  uint64_t* k_empty = bars + Traits::kKvBarriers;
  uint64_t* v_empty = bars + Traits::kKvBarriers + 1;
  [[maybe_unused]] const bwd90::KvTileFeed feed{reinterpret_cast<int*>(bars + Traits::kKvBarriers + 6),
                                                bars + Traits::kKvBarriers + 2, bars + Traits::kKvBarriers + 4};
  const auto stage_q = [&](int s) { return stages + s * Traits::kKvStageBytes; };
  const auto stage_do = [&](int s) { return stage_q(s) + Traits::tile_bytes(kBlockM); };
  const auto stage_lse = [&](int s) { return reinterpret_cast<float*>(stage_do(s) + Traits::tile_bytes_v(kBlockM)); };
  const auto stage_dsum = [&](int s) { return stage_lse(s) + kBlockM; };

  const int warpgroup = threadIdx.x / 128;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  bwd90::init_ring(kv_full, full, empty, kStages, 4 * Traits::kConsumers);
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

  if (warpgroup == 0) {
    ptx::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    if (warp == 1) {
      // The dQ writer: bwd_kv_kernel's, over the CTA's steps of all its tiles. The buffers go
      // back at the top of the next step (the first one: both, as bwd_kv_kernel's start), so
      // none goes back after the CTA's last step (a named-barrier arrival nobody would sync).
      bool started = false;
#pragma unroll 1
      for (int r = 0;; ++r) {
        const int t = kDynamic ? bwd90::take_kv_tile(feed, r, lane) : BwdTileOrder::cta_tile(r, cta, ctas);
        if (t >= order.tiles) break;
        const bwd90::KvTile w = bwd90::kv_tile<Traits>(params, order, t);
#pragma unroll 1
        for (int step = 0; step < w.steps; ++step) {
          const int head = w.head_begin + step / w.n_m;
          const int m0 = (w.m_lo + step % w.n_m) * kBlockM;
          float* gdq = params.dq_accum + (int64_t(head) * params.ws_rows + w.ws_row0 + m0) * kHeadDim;
          if (!started) {
#pragma unroll
            for (int c = 0; c < Traits::kConsumers; ++c) {
              ptx::named_barrier_arrive(kDqEmptyBarrier0 + c, kDqHandoffThreads);
            }
            started = true;
          } else {
            static_assert(Traits::kConsumers == 2, "one wait_group.read count per part");
            if (lane == 0) ptx::bulk_wait_group_read<1>();
            __syncwarp();
            ptx::named_barrier_arrive(kDqEmptyBarrier0, kDqHandoffThreads);
            if (lane == 0) ptx::bulk_wait_group_read<0>();
            __syncwarp();
            ptx::named_barrier_arrive(kDqEmptyBarrier0 + 1, kDqHandoffThreads);
          }
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
        t = r == 0 ? cta : int(__reduce_max_sync(1u, unsigned(atomicAdd(pargs.tile_counter, 1)))) + ctas;
        bwd90::publish_kv_tile(feed, r, t);
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
        for (int m0 = w.m_lo * kBlockM; m0 < (w.m_lo + w.n_m) * kBlockM; m0 += kBlockM) {
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

  ptx::warpgroup_reg_alloc<Traits::kConsumerRegs>();
  const int consumer = warpgroup - 1;
  const int g = lane / 4;
  const int t4 = lane % 4;
  const int key_row0 = consumer * 64;
  const int key_local = key_row0 + (warp % 4) * 16 + g;
  const float scale_log2 = params.scale_log2;
  const uint64_t k_desc = bwd90::kmajor_desc(ptx::smem_u32(sK + key_row0 * Traits::kRowBytes));
  const uint64_t v_desc = bwd90::kmajor_desc(ptx::smem_u32(sV + key_row0 * Traits::kRowBytes));
  constexpr int kAcc = kHeadDim / 2;
  constexpr int kS = kBlockM / 2;
  const int tid_wg = threadIdx.x % 128;
  float* dq_part = sDq + consumer * (Traits::kDqPartBytes / 4);
  int it = 0;     // steps taken so far, over the CTA's tiles
  int kv_it = 0;  // K/V tiles taken so far

#pragma unroll 1
  for (int r = 0;; ++r) {
    const int t = kDynamic ? bwd90::take_kv_tile(feed, r, lane) : BwdTileOrder::cta_tile(r, cta, ctas);
    if (t >= order.tiles) break;
    const bwd90::KvTile w = bwd90::kv_tile<Traits>(params, order, t);
    if (!w.exists()) continue;  // past this sequence's keys (varlen): nothing to store
    const int n0 = w.n0;
    const int batch = w.batch;
    const int n_m = w.n_m;
    const int steps = w.steps;
    const WindowMask mask = make_window_mask<Traits::kMask == MaskMode::kWindow>(
        w.seq.seqlen_q, w.seq.seqlen_k, params.window_left, params.window_right);

    float dk[kAcc], dv[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) dk[i] = dv[i] = 0.0f;
    const bool key_ok[2] = {key_local < w.keys_here, key_local + 8 < w.keys_here};
    float dq[Traits::kDqCols / 2];

    if (steps > 0) {
      ptx::mbarrier_wait(kv_full, kv_it & 1);
      ++kv_it;
      if constexpr (Traits::kDqKHalves) {
        // This tile's K half; the consumer's last dQ product of the previous tile (which read
        // the buffer) was waited for. The fence and the first step's dS barrier order it before
        // the products, as in bwd_kv_kernel.
        bwd90::copy_k_half<kBlockN>(sK, sKh + consumer * Traits::kKHalfBytes, consumer, tid_wg);
        ptx::fence_proxy_async_smem();
      }
    }
    for (int step = 0; step < steps; ++step, ++it) {
      const int s = it % kStages;
      const bool last = step + 1 == steps;
      const int m0 = (w.m_lo + step % n_m) * kBlockM;
      ptx::mbarrier_wait(&full[s], (it / kStages) & 1);
      [[maybe_unused]] int head = 0;
      const uint32_t q_addr = ptx::smem_u32(stage_q(s));
      const uint32_t do_addr = ptx::smem_u32(stage_do(s));
      float st[kS], dpt[kS];
      bwd90::issue_s_dp<kBlockM, Traits>(st, dpt, k_desc, v_desc, Traits::panel_bytes(kBlockN),
                                         bwd90::kmajor_desc(q_addr), bwd90::kmajor_desc(do_addr),
                                         Traits::panel_bytes(kBlockM));
      const float* lse = stage_lse(s);
      const float* dsum = stage_dsum(s);
      const bool needs_mask = Traits::kMask == MaskMode::kWindow &&
                              mask.block_needs_mask(m0, min(m0 + kBlockM, w.seq.seqlen_q), n0 + key_row0,
                                                    n0 + key_row0 + 64);
      float2 lse2[kBlockM / 8];
#pragma unroll
      for (int c = 0; c < kBlockM / 8; ++c) lse2[c] = *reinterpret_cast<const float2*>(lse + 8 * c + 2 * t4);
      ptx::wgmma_wait<Traits::kMods ? 0 : 1>();
      ptx::fence_operand(st);
      if constexpr (Traits::kMods) {
        ptx::fence_operand(dpt);
        head = w.head_begin + step / n_m;
        const bwd90::ScoreModifiers mods = bwd90::score_modifiers(params, args.softcap, batch, head, mask);
#pragma unroll
        for (int i = 0; i < kS; ++i) st[i] = mods.soft(st[i]);
      }
      if (needs_mask) bwd90::mask_key_rows<kBlockM>(st, mask, m0, n0 + key_local, t4);
      if constexpr (Traits::kMods) {
        const bwd90::ScoreModifiers mods = bwd90::score_modifiers(params, args.softcap, batch, head, mask);
#pragma unroll
        for (int c = 0; c < kBlockM / 8; ++c) {
          const float2 l = *reinterpret_cast<const float2*>(lse + 8 * c + 2 * t4);
          const float2 d = *reinterpret_cast<const float2*>(dsum + 8 * c + 2 * t4);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int idx = 4 * c + 2 * h + e;
              const float x = key_ok[h] ? st[idx] : -INFINITY;
              const float alibi = mods.alibi(m0 + 8 * c + 2 * t4 + e, n0 + key_local + 8 * h);
              const float p = ptx::exp2_approx(x - alibi - (e == 0 ? l.x : l.y));
              st[idx] = p;
              dpt[idx] = p * (dpt[idx] - (e == 0 ? d.x : d.y)) * mods.dtanh(x);
            }
          }
        }
      } else {
#pragma unroll
        for (int c = 0; c < kBlockM / 8; ++c) {
          const float2 l = lse2[c];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int idx = 4 * c + 2 * h + e;
              const float x = key_ok[h] ? st[idx] : -INFINITY;
              st[idx] = ptx::exp2_approx(fmaf(x, scale_log2, -(e == 0 ? l.x : l.y)));
            }
          }
        }
        ptx::wgmma_wait<0>();
        ptx::fence_operand(dpt);
#pragma unroll
        for (int c = 0; c < kBlockM / 8; ++c) {
          const float2 d = *reinterpret_cast<const float2*>(dsum + 8 * c + 2 * t4);
#pragma unroll
          for (int i = 4 * c; i < 4 * c + 4; ++i) dpt[i] = st[i] * (dpt[i] - (i % 2 == 0 ? d.x : d.y));
        }
      }
      // S^T and dP^T done: V is no longer read (nor K at d64, whose dQ product reads this
      // consumer's copy of its half).
      if (last) {
        bwd90::release(v_empty, lane);
        if constexpr (Traits::kDqKHalves) bwd90::release(k_empty, lane);
      }
      uint32_t pt[kS / 2], dst[kS / 2];
      bwd90::pack_pairs<Element>(st, pt);
      bwd90::pack_pairs<Element>(dpt, dst);
      unsigned char* ds_buf = sDs + (it & 1) * Traits::kDsBytes;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int rr = key_local + 8 * h;
#pragma unroll
        for (int c = 0; c < kBlockM / 8; ++c) {
          *reinterpret_cast<uint32_t*>(ds_buf + rr * Traits::kRowBytes + ((c ^ (rr % 8)) << 4) + 4 * t4) =
              dst[2 * c + h];
        }
      }
      ptx::fence_proxy_async_smem();
      bwd90::gemm_rs<kHeadDim, Element, kBlockM>(dv, pt, bwd90::mn_desc(do_addr, Traits::panel_bytes(kBlockM)));
      ptx::wgmma_commit();
      ptx::named_barrier_sync(kDsReadyBarrier, 128 * Traits::kConsumers);
      const uint64_t ds_desc = bwd90::mn_desc(ptx::smem_u32(ds_buf), Traits::kDsBytes);
      if constexpr (Traits::kDqKHalves) {
        bwd90::gemm_dq<Traits::kDqKeys, Traits::kDqCols, Traits::kKHalfRowBytes, Element>(
            dq, ds_desc,
            bwd90::k_half_desc<Traits::kKHalfBytes>(ptx::smem_u32(sKh + consumer * Traits::kKHalfBytes)));
      } else {
        const uint32_t k_cols = ptx::smem_u32(sK) + consumer * Traits::panel_bytes(kBlockN);
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
      // d128: this consumer's dQ product (its column panel of K, all 128 keys) is done; K is free
      // once the other consumer's is too (eight warp arrivals).
      if constexpr (!Traits::kDqKHalves) {
        if (last) bwd90::release(k_empty, lane);
      }
      ptx::named_barrier_sync(kDqEmptyBarrier0 + consumer, kDqHandoffThreads);
#pragma unroll
      for (int i = 0; i < Traits::kDqCols / 2; i += 4) {
        *reinterpret_cast<float4*>(dq_part + bwd90::acc_order_index(i, tid_wg)) =
            make_float4(dq[i], dq[i + 1], dq[i + 2], dq[i + 3]);
      }
      ptx::fence_proxy_async_smem();
      ptx::named_barrier_arrive(kDqFullBarrier0 + consumer, kDqHandoffThreads);
      ptx::wgmma_wait<0>();
      ptx::fence_operand(dk);
      bwd90::release(&empty[s], lane);
    }

    bwd90::store_kv_grad<Element, kHeadDim>(dk, params, w.seq, batch, w.kv_head, w.split, n0, key_local, w.keys_here,
                                            t4, params.dk_partial, params.dk, params.dk_strides, params.scale);
    bwd90::store_kv_grad<Element, kHeadDim>(dv, params, w.seq, batch, w.kv_head, w.split, n0, key_local, w.keys_here,
                                            t4, params.dv_partial, params.dv, params.dv_strides, 1.0f);
  }
}

}  // namespace flashattn::cuda::sm90

#endif  // FLASHATTN_DEV_SM90_BWD_PERSISTENT
