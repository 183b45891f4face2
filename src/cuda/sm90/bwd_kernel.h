// Hopper (sm_90a) backward: bulk tensor copies, warpgroup products and warp specialisation, as in
// the forward (fwd_kernel.h), in two kernels that each own what they accumulate, so the result is
// deterministic without atomics:
//  - bwd_kv_kernel, one CTA per key block of one KV head (and chunk of its query heads): K and V
//    stay in shared memory; a producer thread streams (Q, dO, LSE*log2e, D) per query block
//    through a ring of stages; each consumer warpgroup owns 64 keys and per step computes
//        S^T = K Q^T,  dP^T = V dO^T,  P^T = exp2(S^T scale_log2 - LSE_log2),
//        dS^T = P^T (dP^T - D),  dV += P^T dO,  dK += dS^T Q
//    with P^T and dS^T kept in registers as the A operands of the last two products.
//  - bwd_dq_kernel, one CTA per query block of one head: Q and dO stay, K and V stream per key
//    block; per step S = Q K^T, dP = dO V^T, dS = P (dP - D), dQ += dS K.
// S and dP are computed twice (7 products instead of 5): the price of no f32 dQ accumulator in
// global memory and no atomics. The statistics come from the sm80 preprocess kernel (workspace
// layout of BwdKernelParams, with ws_block = the dQ kernel's block_m); the learnable sink's
// gradient and the GQA reduction of split query heads are the sm80 auxiliary kernels too.
//
// First version (2026-12-01): no ping-pong between the consumers and no overlap of the
// exponentials with the products inside a warpgroup. On the H200 (bf16, d128) it passed
// test_cuda.py under FLASHATTN_CUDA_PATH=sm90 and ran the backward at 409 / 441 TFLOP/s (2k /
// 16k; sm80 296 / 320, cuDNN 525 / 558; dev/NOTES.md). Reached only with FLASHATTN_CUDA_PATH=sm90
// (cuda_backend.cu) until fp16, the C++ suite and the sanitizers have run on it.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/common/mask.h"
#include "cuda/common/seq_extent.h"
#include "cuda/ptx/math.h"
#include "cuda/ptx/mbarrier.h"
#include "cuda/ptx/smem_desc.h"
#include "cuda/ptx/tma.h"
#include "cuda/ptx/warpgroup.h"
#include "cuda/ptx/wgmma.h"
#include "cuda/sm80/bwd_common.h"  // BwdKernelParams, query_block_range, MaskMode
#include "cuda/sm90/fwd_kernel.h"   // Turns (ping-pong between the consumers)

namespace flashattn::cuda::sm90 {

// Compile-time shape of both kernels for one (element type, head dim, mask).
// Registers per consumer thread, dK/dV kernel: dK and dV head_dim / 2 floats each, S^T and dP^T
// block_m / 2 each, P^T and dS^T block_m / 4 (16-bit pairs) each: 224 at d128 under the 240 of
// setmaxnreg. dQ kernel: dQ head_dim / 2, S and dP block_n / 2, dS block_n / 4: 144 at d128.
template <typename Element_, int kHeadDim_, MaskMode kMask_>
struct BwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr MaskMode kMask = kMask_;
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static constexpr int kPanels = kHeadDim / 64;  // 64-column panels of 128-byte swizzled rows
  static constexpr int kRowBytes = 128;
  static constexpr int kStages = 2;
  // dev/ A/B (-DFLASHATTN_DEV_SM90_BWD_PINGPONG): the consumers take turns issuing their products
  // (the forward's Turns), so one warpgroup's element-wise work overlaps the other's products.
#if defined(FLASHATTN_DEV_SM90_BWD_PINGPONG)
  static constexpr bool kPingPong = true;
#else
  static constexpr bool kPingPong = false;
#endif

  // dK/dV kernel: kKvBlockN keys per CTA (64 per consumer), kKvBlockM queries per step.
  static constexpr int kKvBlockN = 64 * kConsumers;
  static constexpr int kKvBlockM = 64;
  // dQ kernel: kDqBlockM queries per CTA (64 per consumer), kDqBlockN keys per step.
  static constexpr int kDqBlockM = 64 * kConsumers;
#if defined(FLASHATTN_DEV_SM90_BWD_DQ_BN)
  static constexpr int kDqBlockN = FLASHATTN_DEV_SM90_BWD_DQ_BN;  // dev/ A/B: 128 (S, dP 64 regs each)
#else
  static constexpr int kDqBlockN = 64;
#endif
  // Workspace rows are allocated in whole blocks of the larger query block (BwdKernelParams).
  static constexpr int kWsBlock = kDqBlockM;

  static constexpr int panel_bytes(int rows) { return rows * kRowBytes; }
  static constexpr int tile_bytes(int rows) { return kPanels * panel_bytes(rows); }

  // dK/dV kernel shared memory: K, V (kKvBlockN rows), then kStages x {Q, dO (kKvBlockM rows),
  // LSE*log2e and D (kKvBlockM floats each, padded to 1024 bytes)}, then the barriers.
  static constexpr int kKvStatBytes = kKvBlockM * 4;
  static constexpr int kKvStageBytes = 2 * tile_bytes(kKvBlockM) + 1024;
  static constexpr int kKvBarriers = 1 + 2 * kStages;  // K/V full; per stage full and empty
  static constexpr size_t kKvSmemBytes =
      1024 + 2 * tile_bytes(kKvBlockN) + kStages * kKvStageBytes + 8 * kKvBarriers;

  // dQ kernel: Q, dO (kDqBlockM rows) and their statistics (padded to 1024 bytes), then
  // kStages x {K, V (kDqBlockN rows)}, then the barriers.
  static constexpr int kDqStatBytes = kDqBlockM * 4;
  static constexpr int kDqStageBytes = 2 * tile_bytes(kDqBlockN);
  static constexpr int kDqBarriers = 1 + 2 * kStages;  // Q/dO full; per stage full and empty
  static constexpr size_t kDqSmemBytes =
      1024 + 2 * tile_bytes(kDqBlockM) + 1024 + kStages * kDqStageBytes + 8 * kDqBarriers;

  static_assert(kHeadDim % 64 == 0 && kHeadDim <= 128, "d64 and d128 (d256 needs dK/dV split over d)");
  static_assert(2 * kKvStatBytes <= 1024 && 2 * kDqStatBytes <= 1024, "statistics fit their padding");
  static_assert(kKvSmemBytes <= 232448 && kDqSmemBytes <= 232448, "fits the 227 KB an sm90 CTA may use");
};

struct BwdMaps {
  CUtensorMap q, k, v, dout;
};

struct BwdKernelArgs {
  BwdMaps kv;  // the dK/dV kernel's maps: Q, dO in kKvBlockM-row boxes, K, V in kKvBlockN
  BwdMaps dq;  // the dQ kernel's maps: Q, dO in kDqBlockM-row boxes, K, V in kDqBlockN
  BwdKernelParams p;
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

// S = A_s B_s^T and dP = A_dp B_dp^T over the head dim (all K-major), issued as one group in
// this warpgroup's turn; returns when both are done.
template <int N, typename Traits, typename Turns>
__device__ __forceinline__ void gemm_s_dp(float (&s)[N / 2], float (&dp)[N / 2], uint64_t a_s, uint64_t a_dp,
                                          int a_panel_bytes, uint64_t b_s, uint64_t b_dp, int b_panel_bytes,
                                          const Turns& turns) {
  using Element = typename Traits::Element;
  turns.take();
  gemm_kmajor<N, Element, Traits::kPanels>(s, a_s, a_panel_bytes, b_s, b_panel_bytes);
  gemm_kmajor<N, Element, Traits::kPanels>(dp, a_dp, a_panel_bytes, b_dp, b_panel_bytes);
  ptx::wgmma_commit();
  turns.pass();
  ptx::wgmma_wait<0>();
  ptx::fence_operand(s);
  ptx::fence_operand(dp);
}

template <typename Element, int n>
__device__ __forceinline__ void pack_pairs(const float (&x)[n], uint32_t (&out)[n / 2]) {
#pragma unroll
  for (int i = 0; i < n / 2; ++i) out[i] = ptx::pack2<Element>(x[2 * i], x[2 * i + 1]);
}

__device__ __forceinline__ void release(uint64_t* bar, int lane) {
  if (lane == 0) ptx::mbarrier_arrive(bar);
}

// Tensor-map coordinates: dense operands are (dim, position, head, batch); varlen ones are one
// batch entry of packed tokens.
__device__ __forceinline__ int map_batch(const BwdKernelParams& p, int batch) { return p.is_varlen() ? 0 : batch; }

}  // namespace bwd90

// dK/dV. Grid (key blocks of the longest sequence, heads_k * kv_splits, batch).
template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1) bwd_kv_kernel(const __grid_constant__ BwdKernelArgs args) {
  using Element = typename Traits::Element;
  constexpr int kBlockN = Traits::kKvBlockN;
  constexpr int kBlockM = Traits::kKvBlockM;
  constexpr int kStages = Traits::kStages;
  constexpr int kHeadDim = Traits::kHeadDim;
  const BwdKernelParams& params = args.p;

  const int n_block = blockIdx.x;
  const int kv_head = int(blockIdx.y) / params.kv_splits;
  const int split = int(blockIdx.y) % params.kv_splits;
  const int batch = blockIdx.z;
  const SeqExtent seq = seq_extent(params, batch);
  const int n0 = n_block * kBlockN;
  if (n0 >= seq.seqlen_k) return;  // past this sequence's keys (varlen): the whole CTA leaves
  const int keys_here = min(kBlockN, seq.seqlen_k - n0);
  const int group = params.heads / params.heads_k;
  const int heads_per_split = group / params.kv_splits;
  const int head_begin = kv_head * group + split * heads_per_split;

  const WindowMask mask = make_window_mask<Traits::kMask == MaskMode::kWindow>(
      seq.seqlen_q, seq.seqlen_k, params.window_left, params.window_right);
  int m_lo = 0, m_hi = (seq.seqlen_q + kBlockM - 1) / kBlockM;
  if constexpr (Traits::kMask == MaskMode::kWindow) {
    query_block_range(mask, n0, n0 + keys_here, kBlockM, &m_lo, &m_hi);
  }
  const int n_m = max(m_hi - m_lo, 0);
  const int steps = n_m * heads_per_split;  // (head, query block) pairs, head-major
  const int64_t ws_row0 = params.ws_row0(batch, seq.row0_q);

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  unsigned char* sK = smem;
  unsigned char* sV = sK + Traits::tile_bytes(kBlockN);
  unsigned char* stages = sV + Traits::tile_bytes(kBlockN);
  uint64_t* bars = reinterpret_cast<uint64_t*>(stages + kStages * Traits::kKvStageBytes);
  uint64_t* kv_full = bars;
  uint64_t* full = bars + 1;               // [kStages]
  uint64_t* empty = bars + 1 + kStages;    // [kStages]
  const auto stage_q = [&](int s) { return stages + s * Traits::kKvStageBytes; };
  const auto stage_do = [&](int s) { return stage_q(s) + Traits::tile_bytes(kBlockM); };
  const auto stage_lse = [&](int s) { return reinterpret_cast<float*>(stage_do(s) + Traits::tile_bytes(kBlockM)); };
  const auto stage_dsum = [&](int s) { return stage_lse(s) + kBlockM; };

  const int warpgroup = threadIdx.x / 128;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(kv_full, 1);
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(&full[s], 1);
      ptx::mbarrier_init(&empty[s], 4 * Traits::kConsumers);
    }
    ptx::mbarrier_init_fence();
  }
  __syncthreads();

  if (warpgroup == 0) {
    ptx::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    // No copy may still be landing when the CTA ends: without a step nothing is loaded.
    if (warp != 0 || lane != 0 || steps == 0) return;
    const int mb = bwd90::map_batch(params, batch);
    ptx::mbarrier_arrive_expect_tx(kv_full, 2 * Traits::tile_bytes(kBlockN));
#pragma unroll
    for (int panel = 0; panel < Traits::kPanels; ++panel) {
      ptx::tma_load_4d(sK + panel * Traits::panel_bytes(kBlockN), &args.kv.k, kv_full, 64 * panel,
                       int(seq.row0_k) + n0, kv_head, mb);
      ptx::tma_load_4d(sV + panel * Traits::panel_bytes(kBlockN), &args.kv.v, kv_full, 64 * panel,
                       int(seq.row0_k) + n0, kv_head, mb);
    }
    for (int step = 0; step < steps; ++step) {
      const int s = step % kStages;
      const int head = head_begin + step / n_m;
      const int m0 = (m_lo + step % n_m) * kBlockM;
      ptx::mbarrier_wait(&empty[s], ((step / kStages) & 1) ^ 1);
      ptx::mbarrier_arrive_expect_tx(&full[s], 2 * Traits::tile_bytes(kBlockM) + 2 * Traits::kKvStatBytes);
#pragma unroll
      for (int panel = 0; panel < Traits::kPanels; ++panel) {
        ptx::tma_load_4d(stage_q(s) + panel * Traits::panel_bytes(kBlockM), &args.kv.q, &full[s], 64 * panel,
                         int(seq.row0_q) + m0, head, mb);
        ptx::tma_load_4d(stage_do(s) + panel * Traits::panel_bytes(kBlockM), &args.kv.dout, &full[s], 64 * panel,
                         int(seq.row0_q) + m0, head, mb);
      }
      const int64_t ws = int64_t(head) * params.ws_rows + ws_row0 + m0;
      ptx::bulk_load(stage_lse(s), params.lse_log2 + ws, Traits::kKvStatBytes, &full[s]);
      ptx::bulk_load(stage_dsum(s), params.dsum + ws, Traits::kKvStatBytes, &full[s]);
    }
    return;
  }

  ptx::warpgroup_reg_alloc<Traits::kConsumerRegs>();
  const int consumer = warpgroup - 1;
  const int g = lane / 4;
  const int t4 = lane % 4;
  const int key_row0 = consumer * 64;                       // this warpgroup's first key of the block
  const int key_local = key_row0 + (warp % 4) * 16 + g;    // this thread's keys: +0 and +8
  const float scale_log2 = params.scale_log2;
  // A operands (K-major: rows hold head-dim elements): this warpgroup's 64 keys of K and V.
  const uint64_t k_desc = bwd90::kmajor_desc(ptx::smem_u32(sK + key_row0 * Traits::kRowBytes));
  const uint64_t v_desc = bwd90::kmajor_desc(ptx::smem_u32(sV + key_row0 * Traits::kRowBytes));

  constexpr int kAcc = kHeadDim / 2;  // dK, dV: 64 x head_dim per warpgroup
  constexpr int kS = kBlockM / 2;     // S^T, dP^T: 64 x block_m
  float dk[kAcc], dv[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) dk[i] = dv[i] = 0.0f;

  const Turns<Traits> turns{consumer};
  if (consumer == Traits::kConsumers - 1) turns.pass();  // the last warpgroup hands warpgroup 0 the first turn

  if (steps > 0) ptx::mbarrier_wait(kv_full, 0);
  for (int step = 0; step < steps; ++step) {
    const int s = step % kStages;
    const int m0 = (m_lo + step % n_m) * kBlockM;
    ptx::mbarrier_wait(&full[s], (step / kStages) & 1);
    const uint32_t q_addr = ptx::smem_u32(stage_q(s));
    const uint32_t do_addr = ptx::smem_u32(stage_do(s));
    // B operands K-major for S^T and dP^T (rows = queries), MN-major for dV and dK (rows = the
    // queries as the k index, the head dim across panels).
    float st[kS], dpt[kS];
    bwd90::gemm_s_dp<kBlockM, Traits>(st, dpt, k_desc, v_desc, Traits::panel_bytes(kBlockN), bwd90::kmajor_desc(q_addr),
                                      bwd90::kmajor_desc(do_addr), Traits::panel_bytes(kBlockM), turns);

    // Element (key row key_local + 8h, query column 8c + 2t4 + e) is st[4c + 2h + e].
    const float* lse = stage_lse(s);
    const float* dsum = stage_dsum(s);
    const bool needs_mask = Traits::kMask == MaskMode::kWindow &&
                            mask.block_needs_mask(m0, min(m0 + kBlockM, seq.seqlen_q), n0 + key_row0,
                                                  n0 + key_row0 + 64);
#pragma unroll
    for (int c = 0; c < kBlockM / 8; ++c) {
      const float2 l = *reinterpret_cast<const float2*>(lse + 8 * c + 2 * t4);
      const float2 d = *reinterpret_cast<const float2*>(dsum + 8 * c + 2 * t4);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int idx = 4 * c + 2 * h + e;
          float x = st[idx];
          if (needs_mask && !mask.visible(m0 + 8 * c + 2 * t4 + e, n0 + key_local + 8 * h)) x = -INFINITY;
          // Rows past the queries (and LSE = -inf) carry LSE_log2 = +inf: P = 0 there.
          const float p = ptx::exp2_approx(fmaf(x, scale_log2, -(e == 0 ? l.x : l.y)));
          st[idx] = p;
          dpt[idx] = p * (dpt[idx] - (e == 0 ? d.x : d.y));
        }
      }
    }
    uint32_t pt[kS / 2], dst[kS / 2];
    bwd90::pack_pairs<Element>(st, pt);
    bwd90::pack_pairs<Element>(dpt, dst);
    turns.take();
    bwd90::gemm_rs<kHeadDim, Element, kBlockM>(dv, pt, bwd90::mn_desc(do_addr, Traits::panel_bytes(kBlockM)));
    bwd90::gemm_rs<kHeadDim, Element, kBlockM>(dk, dst, bwd90::mn_desc(q_addr, Traits::panel_bytes(kBlockM)));
    ptx::wgmma_commit();
    turns.pass();
    ptx::wgmma_wait<0>();
    ptx::fence_operand(dv);
    ptx::fence_operand(dk);
    bwd90::release(&empty[s], lane);
  }

  if (consumer == 0) turns.take();  // the turn the last warpgroup passed at the end

  // Epilogue: dK = scale * sum dS^T Q, dV = sum P^T dO, from the accumulators (each quad writes
  // 8 contiguous bytes of a row per 8-column chunk), or the unscaled f32 partials of this chunk of
  // query heads (kv_splits > 1, summed by the sm80 reduction kernel).
  if (params.kv_splits > 1) {
    const int64_t row_base = int64_t(split) * params.total_k + params.k_row0(batch, seq.row0_k) + n0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = key_local + 8 * h;
      if (r >= keys_here) continue;
      const int64_t off = ((row_base + r) * params.heads_k + kv_head) * kHeadDim + 2 * t4;
#pragma unroll
      for (int c = 0; c < kHeadDim / 8; ++c) {
        *reinterpret_cast<float2*>(params.dk_partial + off + 8 * c) = make_float2(dk[4 * c + 2 * h], dk[4 * c + 2 * h + 1]);
        *reinterpret_cast<float2*>(params.dv_partial + off + 8 * c) = make_float2(dv[4 * c + 2 * h], dv[4 * c + 2 * h + 1]);
      }
    }
    return;
  }
  const float dk_scale = params.scale;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = key_local + 8 * h;
    if (r >= keys_here) continue;
    const int64_t row = seq.row0_k + n0 + r;
    char* gdk = static_cast<char*>(params.dk) +
                sizeof(Element) * (batch * params.dk_strides.batch + row * params.dk_strides.row +
                                   int64_t(kv_head) * params.dk_strides.head + 2 * t4);
    char* gdv = static_cast<char*>(params.dv) +
                sizeof(Element) * (batch * params.dv_strides.batch + row * params.dv_strides.row +
                                   int64_t(kv_head) * params.dv_strides.head + 2 * t4);
#pragma unroll
    for (int c = 0; c < kHeadDim / 8; ++c) {
      *reinterpret_cast<uint32_t*>(gdk + sizeof(Element) * 8 * c) =
          ptx::pack2<Element>(dk[4 * c + 2 * h] * dk_scale, dk[4 * c + 2 * h + 1] * dk_scale);
      *reinterpret_cast<uint32_t*>(gdv + sizeof(Element) * 8 * c) =
          ptx::pack2<Element>(dv[4 * c + 2 * h], dv[4 * c + 2 * h + 1]);
    }
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
  const int steps = max(n_hi - n_lo, 0);

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  unsigned char* sQ = smem;
  unsigned char* sdO = sQ + Traits::tile_bytes(kBlockM);
  float* sLse = reinterpret_cast<float*>(sdO + Traits::tile_bytes(kBlockM));
  float* sDsum = sLse + kBlockM;
  unsigned char* stages = reinterpret_cast<unsigned char*>(sLse) + 1024;
  uint64_t* bars = reinterpret_cast<uint64_t*>(stages + kStages * Traits::kDqStageBytes);
  uint64_t* q_full = bars;
  uint64_t* full = bars + 1;             // [kStages]
  uint64_t* empty = bars + 1 + kStages;  // [kStages]
  const auto stage_k = [&](int s) { return stages + s * Traits::kDqStageBytes; };
  const auto stage_v = [&](int s) { return stage_k(s) + Traits::tile_bytes(kBlockN); };

  const int warpgroup = threadIdx.x / 128;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(&full[s], 1);
      ptx::mbarrier_init(&empty[s], 4 * Traits::kConsumers);
    }
    ptx::mbarrier_init_fence();
  }
  __syncthreads();

  const int64_t ws = int64_t(head) * params.ws_rows + params.ws_row0(batch, seq.row0_q) + m0;
  if (warpgroup == 0) {
    ptx::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    if (warp != 0 || lane != 0) return;
    if (steps == 0) return;  // no visible key: the consumers write dQ = 0 without waiting
    const int mb = bwd90::map_batch(params, batch);
    ptx::mbarrier_arrive_expect_tx(q_full, 2 * Traits::tile_bytes(kBlockM) + 2 * Traits::kDqStatBytes);
#pragma unroll
    for (int panel = 0; panel < Traits::kPanels; ++panel) {
      ptx::tma_load_4d(sQ + panel * Traits::panel_bytes(kBlockM), &args.dq.q, q_full, 64 * panel,
                       int(seq.row0_q) + m0, head, mb);
      ptx::tma_load_4d(sdO + panel * Traits::panel_bytes(kBlockM), &args.dq.dout, q_full, 64 * panel,
                       int(seq.row0_q) + m0, head, mb);
    }
    ptx::bulk_load(sLse, params.lse_log2 + ws, Traits::kDqStatBytes, q_full);
    ptx::bulk_load(sDsum, params.dsum + ws, Traits::kDqStatBytes, q_full);
    for (int step = 0; step < steps; ++step) {
      const int s = step % kStages;
      const int key = int(seq.row0_k) + (n_lo + step) * kBlockN;
      ptx::mbarrier_wait(&empty[s], ((step / kStages) & 1) ^ 1);
      ptx::mbarrier_arrive_expect_tx(&full[s], 2 * Traits::tile_bytes(kBlockN));
#pragma unroll
      for (int panel = 0; panel < Traits::kPanels; ++panel) {
        ptx::tma_load_4d(stage_k(s) + panel * Traits::panel_bytes(kBlockN), &args.dq.k, &full[s], 64 * panel, key,
                         kv_head, mb);
        ptx::tma_load_4d(stage_v(s) + panel * Traits::panel_bytes(kBlockN), &args.dq.v, &full[s], 64 * panel, key,
                         kv_head, mb);
      }
    }
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

  const Turns<Traits> turns{consumer};
  if (consumer == Traits::kConsumers - 1) turns.pass();
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
      const int n0 = (n_lo + step) * kBlockN;
      ptx::mbarrier_wait(&full[s], (step / kStages) & 1);
      const uint32_t k_addr = ptx::smem_u32(stage_k(s));
      float sc[kS], dp[kS];
      bwd90::gemm_s_dp<kBlockN, Traits>(sc, dp, q_desc, do_desc, Traits::panel_bytes(kBlockM), bwd90::kmajor_desc(k_addr),
                                        bwd90::kmajor_desc(ptx::smem_u32(stage_v(s))), Traits::panel_bytes(kBlockN),
                                        turns);

      // Element (query row row_local + 8h, key column n0 + 8c + 2t4 + e) is sc[4c + 2h + e].
      const bool needs_mask =
          mask.block_needs_mask(m0 + row_base, max(min(m0 + rows_here, m0 + row_base + 64), m0 + row_base + 1), n0,
                                n0 + kBlockN);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        int lo = 0, hi = 0;
        if (needs_mask) mask.row_range(m0 + row_local + 8 * h, &lo, &hi);
#pragma unroll
        for (int c = 0; c < kBlockN / 8; ++c) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int idx = 4 * c + 2 * h + e;
            const int key = n0 + 8 * c + 2 * t4 + e;
            float x = sc[idx];
            if (needs_mask && (key < lo || key >= hi)) x = -INFINITY;
            const float p = ptx::exp2_approx(fmaf(x, scale_log2, -lse[h]));
            dp[idx] = p * (dp[idx] - dsum[h]);
          }
        }
      }
      uint32_t ds[kS / 2];
      bwd90::pack_pairs<Element>(dp, ds);
      turns.take();
      bwd90::gemm_rs<kHeadDim, Element, kBlockN>(dq, ds, bwd90::mn_desc(k_addr, Traits::panel_bytes(kBlockN)));
      ptx::wgmma_commit();
      turns.pass();
      ptx::wgmma_wait<0>();
      ptx::fence_operand(dq);
      bwd90::release(&empty[s], lane);
    }
  }

  if (consumer == 0) turns.take();  // the turn the last warpgroup passed at the end

  // dQ = scale * sum dS K, written from the accumulators.
  const float dq_scale = params.scale;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row_local + 8 * h;
    if (r >= rows_here) continue;
    char* gdq = static_cast<char*>(params.dq) +
                sizeof(Element) * (batch * params.dq_strides.batch + (seq.row0_q + m0 + r) * params.dq_strides.row +
                                   int64_t(head) * params.dq_strides.head + 2 * t4);
#pragma unroll
    for (int c = 0; c < kHeadDim / 8; ++c) {
      *reinterpret_cast<uint32_t*>(gdq + sizeof(Element) * 8 * c) =
          ptx::pack2<Element>(dq[4 * c + 2 * h] * dq_scale, dq[4 * c + 2 * h + 1] * dq_scale);
    }
  }
}

}  // namespace flashattn::cuda::sm90
