// Host side of the Hopper backward for one traits: workspace, then preprocess (sm80's) ->
//   deterministic: dK/dV kernel -> dQ kernel (S and dP twice, no atomics);
//   otherwise:     zeroed f32 dQ accumulator -> fused dK/dV/dQ kernel (one CTA per tile, or
//                  Traits::kPersistent's grid of min(tiles, SMs) CTAs) -> dQ conversion;
// -> (GQA reduction of split query heads, sm80's), all on `stream`; under a block mask
// (BwdSparseTraits) the plan's passes (block_tiles.h) first.
// Included only by the generated src/cuda/instantiations/sm90bwd_*.cu files.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cuda/block_tiles.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/kernel_facts.h"
#include "cuda/common/workspace.h"
#include "cuda/sm80/bwd_launch.h"  // bwd_detail: workspace layout, auxiliary launches, kv_splits_for
#include "cuda/sm80/bwd_preprocess.h"
#include "cuda/sm90/bwd.h"
#include "cuda/sm90/bwd_kernel.h"
#include "cuda/sm90/fwd.h"  // the attn_mask bit pack (mask_bits.cu)
#include "cuda/sm90/tensor_map.h"

namespace flashattn::cuda::sm90 {

template <typename Traits>
Status run_bwd(const BackwardParams& params, cudaStream_t stream) {
  using namespace ::flashattn::cuda::bwd_detail;
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kHeadDimV = Traits::kHeadDimV;  // v, out, dout, dv (BwdDvTraits: 128 at head_dim 192)
  constexpr int kWsBlock = Traits::kWsBlock;
  // The sink gradient's partials are counted by alloc_workspace at kHeadDim and written by the
  // preprocess (over O and dO) at kHeadDimV: the same rows per CTA.
  static_assert(bwd_preprocess_rows_per_cta<kHeadDim>() == bwd_preprocess_rows_per_cta<kHeadDimV>(),
                "one preprocess grid for both widths");

  BwdKernelArgs args;
  args.tile_counter = nullptr;
  BwdKernelParams& kp = args.p;
  static_cast<BackwardParams&>(kp) = params;
  const bool varlen = params.is_varlen();
  const int map_batch = varlen ? 1 : params.batch;
  const int64_t rows_q = varlen ? params.total_q : params.seqlen_q;
  const int64_t rows_k = varlen ? params.total_k : params.seqlen_k;
  const struct {
    CUtensorMap* map;
    const void* ptr;
    const Strides3& strides;
    int64_t rows;
    int heads;
    int width;
    int box;
    const char* name;
  } maps[] = {
      {&args.kv.q, params.q, params.q_strides, rows_q, params.heads, kHeadDim, Traits::kKvBlockM, "q"},
      {&args.kv.dout, params.dout, params.dout_strides, rows_q, params.heads, kHeadDimV, Traits::kKvBlockM, "dout"},
      {&args.kv.k, params.k, params.k_strides, rows_k, params.heads_k, kHeadDim, Traits::kKvBlockN, "k"},
      {&args.kv.v, params.v, params.v_strides, rows_k, params.heads_k, kHeadDimV, Traits::kKvBlockN, "v"},
      {&args.dq.q, params.q, params.q_strides, rows_q, params.heads, kHeadDim, Traits::kDqBlockM, "q"},
      {&args.dq.dout, params.dout, params.dout_strides, rows_q, params.heads, kHeadDimV, Traits::kDqBlockM, "dout"},
      {&args.dq.k, params.k, params.k_strides, rows_k, params.heads_k, kHeadDim, Traits::kDqBlockN, "k"},
      {&args.dq.v, params.v, params.v_strides, rows_k, params.heads_k, kHeadDimV, Traits::kDqBlockN, "v"},
  };
  // The fused kernel reads only the dK/dV kernel's maps (the first four); the two-kernel form
  // (deterministic, and always at d192/d256) all eight. Each encode is a driver call per operand.
  if constexpr (!Traits::kHasFused) kp.deterministic = true;  // d192/d256: the two-kernel form only
  const int map_count = kp.deterministic ? 8 : 4;
  for (int i = 0; i < map_count; ++i) {
    const auto& m = maps[i];
    if (Status s = make_operand_map(m.map, m.ptr, params.dtype, m.width, m.rows, m.heads, map_batch, m.strides, m.box);
        !s.ok()) {
      return Status::NotSupported(std::string(m.name) + ": " + s.message());
    }
  }

  // kBias: attn_bias's map (the fused kernel's producer copies its 64 x 128 tiles), dbias's plan
  // (cuda/bwd_dbias.h; its partials in the plan's space below) and attn_mask's packed bits (after
  // them; mask_bits.h, packed on the stream before the kernels). The bias kernels are the fused
  // form only: bwd_declines sends deterministic calls to sm80.
  [[maybe_unused]] DbiasPlan dbias;
  [[maybe_unused]] size_t mask_bits_offset = 0;
  args.mask_bits = MaskBits{};
  if constexpr (Traits::kBias) {
    if (params.deterministic) return Status::NotSupported("the sm90 bias backward has no deterministic form");
    if (params.bias.defined()) {
      if (Status s = make_bias_map(&args.bias, params.bias, params.seqlen_q, params.seqlen_k, Traits::kKvBlockM);
          !s.ok()) {
        return s;
      }
    }
    dbias = plan_dbias(params, /*stores_16bit=*/true);
  }
  if constexpr (Traits::kMods) {
    if (params.softcap > 0.0f) {
      constexpr float kLog2eF = 1.4426950408889634f;
      args.softcap.in = params.scale / params.softcap;
      args.softcap.out = params.softcap * kLog2eF;
      args.softcap.out_inv = 1.0f / args.softcap.out;
    }
  }

  int num_sms = 0;
  if (Status s = multiprocessors(&num_sms); !s.ok()) return s;

  // Workspace (BwdKernelParams) in whole kWsBlock query blocks (the dQ kernel's); the f32 dQ
  // accumulator (heads x ws_rows x head_dim, in acc_order_index order per 64-row block) unless
  // deterministic; split query heads' dK and dV partials (kHeadDim wide each: dV's kHeadDimV fit).
  set_workspace_rows(&kp, kWsBlock);
  kp.kv_splits = kv_splits_for(params, Traits::kKvBlockN, num_sms);
  // The dK/dV kernel's CTAs (one per SM: its shared memory) start in groups of planes under a
  // causal mask (cta_order.h): the heaviest key blocks of the last group start with work left.
  // Not under a block mask: its step walk (bwd_sparse.h KvStepWalk) reads the key tile and the
  // batch from blockIdx again, to spare the producer's registers.
  kp.cta_group_planes =
      Traits::kSparse ? 1
                      : causal_group_planes(params.is_causal, int(ceil_div(params.seqlen_k, Traits::kKvBlockN)),
                                            static_cast<long long>(params.heads_k) * kp.kv_splits * params.batch,
                                            num_sms);
  // The persistent fused kernel (BwdTraitsBody::kPersistent) numbers its tiles (key blocks x kv
  // heads x splits x batch) and its CTAs' rounds past them in ints. 2^31 tiles of 128 keys are
  // some 64 TB of K at d128 (32 TB at d64; less with split query heads), so such a call is
  // refused rather than given 64-bit indices or a second, one-CTA-per-tile, instantiation.
  const long long kv_tiles = ceil_div(params.seqlen_k, Traits::kKvBlockN) * static_cast<long long>(params.heads_k) *
                             kp.kv_splits * params.batch;
  if (Traits::kPersistent && !kp.deterministic && kv_tiles + num_sms >= (1LL << 31)) {
    return Status::NotSupported("sm90 backward: batch " + std::to_string(params.batch) + " x heads_k " +
                                std::to_string(params.heads_k) + " x seqlen_k " + std::to_string(params.seqlen_k) +
                                " (" + std::to_string(kv_tiles) + " key tiles) is more than the persistent " +
                                "kernel's 32-bit tile indices hold; split the batch");
  }
  // kSparse: the block states, the dK/dV kernel's key-major lists and (deterministic) the dQ
  // kernel's query-major ones (block_tiles.h), after the workspace's fixed arrays.
  size_t plan_bytes = 0;
  if constexpr (Traits::kSparse) {
    plan_bytes = block_states_bytes(params) + tile_lists_bytes(params, Traits::kKvBlockM, Traits::kKvBlockN) +
                 (kp.deterministic ? tile_lists_bytes(params, Traits::kDqBlockM, Traits::kDqBlockN) : 0);
  }
  // The persistent kernel's tile counter (masked launches' dynamic feed), in the plan's space.
  if constexpr (Traits::kPersistent && Traits::kMask == MaskMode::kWindow) {
    if (!kp.deterministic) plan_bytes += 256;
  }
  // kBias: dbias's partials (none when dbias is stored into directly), then attn_mask's bits.
  if constexpr (Traits::kBias) {
    mask_bits_offset = round_up(sizeof(float) * size_t(dbias.ws_floats), kWsAlign);
    if (params.mask.defined()) {
      const size_t bits = mask_bits_bytes(params, MaskBitsOrder::kGroupMajor);
      if (bits / sizeof(uint32_t) > size_t(kMaskBitsMaxWords)) {
        return Status::NotSupported("attn_mask: more than 2^32 words of packed bits for the sm90 bias backward");
      }
      plan_bytes = mask_bits_offset + bits;
    } else {
      plan_bytes = mask_bits_offset;
    }
  }
  void* ws = nullptr;
  void* plan_ws = nullptr;
  if (Status s = alloc_workspace<kHeadDim>(&kp, stream, &ws, plan_bytes, &plan_ws); !s.ok()) return s;

  const auto launch = [&]() -> Status {
    if constexpr (Traits::kSparse) {
      char* w = static_cast<char*>(plan_ws);
      if (Status s = build_block_states(kp, w, stream, &kp.block_tiles); !s.ok()) return s;
      w += block_states_bytes(kp);
      BwdSparseLists& lists = args.sparse;
      // The tile counts as build_tile_lists's geometry has them (over the longest sequences).
      lists.kv_m_tiles = int32_t(ceil_div(kp.seqlen_q, Traits::kKvBlockM));
      lists.kv_n_tiles = int32_t(ceil_div(kp.seqlen_k, Traits::kKvBlockN));
      if (Status s = build_tile_lists(kp, kp.block_tiles, Traits::kKvBlockM, Traits::kKvBlockN, /*key_major=*/true, w,
                                      stream, &lists.kv);
          !s.ok()) {
        return s;
      }
      w += tile_lists_bytes(kp, Traits::kKvBlockM, Traits::kKvBlockN);
      if (kp.deterministic) {
        lists.dq_m_tiles = int32_t(ceil_div(kp.seqlen_q, Traits::kDqBlockM));
        lists.dq_n_tiles = int32_t(ceil_div(kp.seqlen_k, Traits::kDqBlockN));
        if (Status s = build_tile_lists(kp, kp.block_tiles, Traits::kDqBlockM, Traits::kDqBlockN,
                                        /*key_major=*/false, w, stream, &lists.dq);
            !s.ok()) {
          return s;
        }
      }
    }
    [[maybe_unused]] float* dbias_partials = nullptr;
    if constexpr (Traits::kBias) {
      if (params.mask.defined()) {
        if (Status s = build_mask_bits(kp, static_cast<char*>(plan_ws) + mask_bits_offset, stream, &args.mask_bits,
                                       MaskBitsOrder::kGroupMajor);
            !s.ok()) {
          return s;
        }
      }
      if (dbias.ws_floats > 0) dbias_partials = static_cast<float*>(plan_ws);
      // Without a window or varlen sequences every (b, h, i, j), or with row sums every (b, h, j),
      // is stored by one step (bwd_mods.h store_dbias_t, flush_dbias_rows): nothing to zero.
      const bool every_written = !kp.has_window() && !kp.is_varlen();
      if (Status s = begin_dbias(&kp, dbias, dbias_partials, stream, every_written); !s.ok()) return s;
    }
    if (Status s = launch_bwd_preprocess<Element, kHeadDimV>(kp, stream); !s.ok()) return s;  // D over O, dO
    const dim3 kv_grid(unsigned(ceil_div(kp.seqlen_k, Traits::kKvBlockN)), kp.heads_k * kp.kv_splits, kp.batch);
    if constexpr (Traits::kHasFused) {
      if (!kp.deterministic) {
        FLASHATTN_CUDA_TRY(
            cudaMemsetAsync(kp.dq_accum, 0, sizeof(float) * size_t(kp.heads) * kp.ws_rows * kHeadDim, stream));
        if constexpr (Traits::kPersistent) {
          // min(tiles, SMs) CTAs, each walking tiles (bwd_kv_kernel's kPersistent).
          const auto kernel = bwd_kv_kernel<Traits, true>;
          constexpr size_t kSmem = Traits::kKvFusedSmemBytes + Traits::kPersistentBytes;
          if (Status s = raise_dynamic_smem(kernel, kSmem); !s.ok()) return s;
          const unsigned ctas = unsigned(kv_tiles < num_sms ? kv_tiles : num_sms);
          if constexpr (Traits::kMask == MaskMode::kWindow) {
            args.tile_counter = static_cast<int*>(plan_ws);
            FLASHATTN_CUDA_TRY(cudaMemsetAsync(args.tile_counter, 0, sizeof(int), stream));
          }
          kernel<<<ctas, Traits::kThreads, kSmem, stream>>>(args);
          FLASHATTN_CUDA_TRY(cudaGetLastError());
        } else {
          const auto kernel = bwd_kv_kernel<Traits, true>;
          constexpr size_t kSmem = Traits::kKvFusedSmemBytes;
          if (Status s = raise_dynamic_smem(kernel, kSmem); !s.ok()) return s;
          kernel<<<kv_grid, Traits::kThreads, kSmem, stream>>>(args);
          FLASHATTN_CUDA_TRY(cudaGetLastError());
        }
        {
          const dim3 grid(unsigned(ceil_div(kp.seqlen_q, 64)), kp.heads, kp.batch);
          bwd_dq_convert_kernel<Traits><<<grid, 128, 0, stream>>>(kp);
          FLASHATTN_CUDA_TRY(cudaGetLastError());
        }
        if constexpr (Traits::kBias) {
          if (Status s = end_dbias(kp, dbias, dbias_partials, stream); !s.ok()) return s;
        }
        return launch_bwd_reduce_dkv<Element, kHeadDim, kHeadDimV>(kp, stream);
      }
    }
    if constexpr (Traits::kBias) {
      return Status::NotSupported("the sm90 bias backward has no deterministic form");  // (checked above)
    } else {
      {
        const auto kernel = bwd_kv_kernel<Traits, false>;
        constexpr size_t kSmem = Traits::kKvSmemBytes;
        if (Status s = raise_dynamic_smem(kernel, kSmem); !s.ok()) return s;
        kernel<<<kv_grid, Traits::kThreads, kSmem, stream>>>(args);
        FLASHATTN_CUDA_TRY(cudaGetLastError());
      }
      {
        const auto kernel = bwd_dq_kernel<Traits>;
        constexpr size_t kSmem = Traits::kDqSmemBytes;
        if (Status s = raise_dynamic_smem(kernel, kSmem); !s.ok()) return s;
        const dim3 grid(unsigned(ceil_div(kp.seqlen_q, Traits::kDqBlockM)), kp.heads, kp.batch);
        kernel<<<grid, Traits::kThreads, kSmem, stream>>>(args);
        FLASHATTN_CUDA_TRY(cudaGetLastError());
      }
      return launch_bwd_reduce_dkv<Element, kHeadDim, kHeadDimV>(kp, stream);
    }
  };
  const Status launched = launch();
  const Status freed = workspace_free(ws, stream);
  return launched.ok() ? freed : launched;
}

}  // namespace flashattn::cuda::sm90
