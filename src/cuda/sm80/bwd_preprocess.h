// The small memory-bound kernels around the sm80-class backward (bwd_kernel.h):
//   bwd_preprocess_kernel   D = rowsum(dO * O) and LSE * log2(e) into the workspace
//   bwd_convert_dq_kernel   dQ = scale * f32 accumulator -> element type
//   bwd_reduce_dkv_kernel   GQA with split query heads: dK, dV = sums of the f32 partials
//   bwd_sink_grad_kernel    dsink = -(sum of the preprocess CTAs' partials), per head
// The first three run over (row block, head, batch) grids and move 16-byte chunks.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/sink.h"
#include "cuda/sm80/bwd_common.h"

namespace flashattn::cuda {

constexpr int kBwdAuxThreads = 128;  // threads per CTA of the kernels in this file
constexpr int kBwdAuxRows = 32;      // rows per CTA of the convert and reduce kernels

// Rows per CTA of the preprocess kernel: each row is reduced by a group of 4 or 8 lanes.
template <int kHeadDim>
constexpr int bwd_preprocess_lanes_per_row() {
  return (kHeadDim / 8) % 8 == 0 ? 8 : 4;
}
template <int kHeadDim>
constexpr int bwd_preprocess_rows_per_cta() {
  return kBwdAuxThreads / bwd_preprocess_lanes_per_row<kHeadDim>();
}

// Converts 8 consecutive 16-bit values to f32.
template <typename Element>
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 p = ptx::unpack2<Element>(w[k]);
    f[2 * k] = p.x;
    f[2 * k + 1] = p.y;
  }
}

// Grid (ceil(round_up(seqlen_q, ws_block) / rows_per_cta), heads, batch). Covers every
// workspace row a main-kernel block can read: rows < seqlen get D = dO.O (f32 sums of the
// element-type inputs) and LSE * log2(e) (+inf for LSE = -inf: P = exp2(x - inf) = 0); padding
// rows up to the ws_block boundary get D = 0 and +inf. With dsink requested, each CTA also
// writes the sum of its rows' exp(sink - LSE) * D (core/sink.h) to sink_partial, reduced in a
// fixed order (lane shuffles, then the warps in order), so dsink is reproducible.
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(kBwdAuxThreads) bwd_preprocess_kernel(const __grid_constant__ BwdKernelParams params) {
  constexpr int kLanes = bwd_preprocess_lanes_per_row<kHeadDim>();
  constexpr int kRows = bwd_preprocess_rows_per_cta<kHeadDim>();
  constexpr int kChunksPerLane = kHeadDim / 8 / kLanes;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const SeqExtent seq = seq_extent(params, batch);
  const int r = blockIdx.x * kRows + threadIdx.x / kLanes;
  const int sub = threadIdx.x % kLanes;
  const int rows_alloc = (seq.seqlen_q + params.ws_block - 1) / params.ws_block * params.ws_block;

  float acc = 0.0f;
  if (r < seq.seqlen_q) {
    const RowPtr gO = row_ptr<Element>(params.out, params.out_strides, batch, seq.row0_q + r, head);
    const RowPtr gdO = row_ptr<Element>(params.dout, params.dout_strides, batch, seq.row0_q + r, head);
#pragma unroll
    for (int k = 0; k < kChunksPerLane; ++k) {
      const int col = (sub + k * kLanes) * 8;
      float o[8], d[8];
      unpack8<Element>(*reinterpret_cast<const uint4*>(static_cast<const Element*>(gO.row(0)) + col), o);
      unpack8<Element>(*reinterpret_cast<const uint4*>(static_cast<const Element*>(gdO.row(0)) + col), d);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc = fmaf(o[e], d[e], acc);
    }
  }
  // Lane groups are aligned, so the xor partners stay inside the row's group.
#pragma unroll
  for (int m = kLanes / 2; m > 0; m /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, m);

  float lse = -INFINITY;
  if (sub == 0 && r < rows_alloc) {
    float lse2 = INFINITY;
    if (r < seq.seqlen_q) {
      lse = params.lse[batch * params.lse_batch_stride + int64_t(head) * params.lse_head_stride + seq.row0_q + r];
      lse2 = lse == -INFINITY ? INFINITY : lse * kLog2e;
    }
    const int64_t ws = int64_t(head) * params.ws_rows + params.ws_row0(batch, seq.row0_q) + r;
    params.lse_log2[ws] = lse2;
    params.dsum[ws] = r < seq.seqlen_q ? acc : 0.0f;
  }

  if (params.sink_partial != nullptr) {
    float term = sub == 0 && r < seq.seqlen_q ? sink_grad_term(params.learnable_sink[head], lse, acc) : 0.0f;
#pragma unroll
    for (int m = 16; m > 0; m /= 2) term += __shfl_xor_sync(0xffffffffu, term, m);
    __shared__ float warp_sums[kBwdAuxThreads / 32];
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = term;
    __syncthreads();
    if (threadIdx.x == 0) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kBwdAuxThreads / 32; ++w) sum += warp_sums[w];
      params.sink_partial[(int64_t(head) * gridDim.z + batch) * gridDim.x + blockIdx.x] = sum;
    }
  }
}

// Grid (heads), one warp: dsink[h] = -(sum of head h's preprocess partials), the lanes taking
// strided partials in order and a fixed shuffle tree adding them (reproducible). With no query
// rows there are no partials and dsink = 0.
template <typename Element>
__global__ void __launch_bounds__(32) bwd_sink_grad_kernel(const __grid_constant__ BwdKernelParams params) {
  const int head = blockIdx.x;
  const float* part = params.sink_partial + int64_t(head) * params.sink_partials_per_head;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < params.sink_partials_per_head; i += 32) sum += part[i];
#pragma unroll
  for (int m = 16; m > 0; m /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, m);
  if (threadIdx.x == 0) params.dsink[head] = 0.0f - sum;
}

// Grid (ceil(seqlen_q / kBwdAuxRows), heads, batch): dq = scale * dq_accum for rows < seqlen.
// A thread takes one 16 x 8 fragment tile's rows r and r + 8 (dq_frag_offset): 64 contiguous
// bytes of the accumulator, two 16-byte rows of dq.
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(kBwdAuxThreads) bwd_convert_dq_kernel(const __grid_constant__ BwdKernelParams params) {
  static_assert(kBwdAuxRows % 16 == 0, "whole 16-row fragment groups per CTA");
  constexpr int kChunksPerRow = kHeadDim / 8;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const SeqExtent seq = seq_extent(params, batch);
  const int64_t ws_row0 = int64_t(head) * params.ws_rows + params.ws_row0(batch, seq.row0_q);
  const float s = params.scale;
  for (int c = threadIdx.x; c < kBwdAuxRows / 2 * kChunksPerRow; c += kBwdAuxThreads) {
    const int pair = c / kChunksPerRow;  // rows r and r + 8 of a 16-row group
    const int r = blockIdx.x * kBwdAuxRows + (pair / 8) * 16 + pair % 8;
    const int col = (c % kChunksPerRow) * 8;
    if (r >= seq.seqlen_q) continue;
    const float4* src = reinterpret_cast<const float4*>(params.dq_accum + ws_row0 * kHeadDim +
                                                        dq_frag_offset(r, col, kHeadDim));
    float4 f[4];  // f[q] = rows (r, r + 8) x columns (col + 2q, col + 2q + 1)
#pragma unroll
    for (int q = 0; q < 4; ++q) f[q] = src[q];
    Element* dst = static_cast<Element*>(params.dq) + batch * params.dq_strides.batch +
                   (seq.row0_q + r) * params.dq_strides.row + int64_t(head) * params.dq_strides.head + col;
    uint4 lo, hi;
    lo.x = ptx::pack2<Element>(f[0].x * s, f[0].y * s);
    lo.y = ptx::pack2<Element>(f[1].x * s, f[1].y * s);
    lo.z = ptx::pack2<Element>(f[2].x * s, f[2].y * s);
    lo.w = ptx::pack2<Element>(f[3].x * s, f[3].y * s);
    hi.x = ptx::pack2<Element>(f[0].z * s, f[0].w * s);
    hi.y = ptx::pack2<Element>(f[1].z * s, f[1].w * s);
    hi.z = ptx::pack2<Element>(f[2].z * s, f[2].w * s);
    hi.w = ptx::pack2<Element>(f[3].z * s, f[3].w * s);
    *reinterpret_cast<uint4*>(dst) = lo;
    if (r + 8 < seq.seqlen_q) *reinterpret_cast<uint4*>(dst + 8 * params.dq_strides.row) = hi;
  }
}

// Grid (ceil(seqlen_k / kBwdAuxRows), heads_k, batch): dk = scale * sum_s dk_partial[s] and
// dv = sum_s dv_partial[s] / (1 - p), summed in split order 0, 1, ... (reproducible).
// kHeadDimV < kHeadDim (the sm90 backward at 192 / 128): dv and its partials are kHeadDimV wide
// (dense rows of kHeadDimV floats per key row and kv head); a chunk past them does dk alone.
template <typename Element, int kHeadDim, int kHeadDimV = kHeadDim>
__global__ void __launch_bounds__(kBwdAuxThreads) bwd_reduce_dkv_kernel(const __grid_constant__ BwdKernelParams params) {
  static_assert(kHeadDimV <= kHeadDim && kHeadDimV % 8 == 0, "dv no wider than dk, whole chunks");
  constexpr int kChunksPerRow = kHeadDim / 8;
  const int kv_head = blockIdx.y;
  const int batch = blockIdx.z;
  const SeqExtent seq = seq_extent(params, batch);
  const int64_t k_row0 = params.k_row0(batch, seq.row0_k);
  const int64_t split_stride = params.total_k * params.heads_k * kHeadDim;
  const int64_t split_stride_v = params.total_k * params.heads_k * kHeadDimV;
  const float dk_scale = params.scale;
  const float dv_scale = params.has_dropout() ? params.dropout_rescale : 1.0f;
  for (int c = threadIdx.x; c < kBwdAuxRows * kChunksPerRow; c += kBwdAuxThreads) {
    const int j = blockIdx.x * kBwdAuxRows + c / kChunksPerRow;
    const int col = (c % kChunksPerRow) * 8;
    if (j >= seq.seqlen_k) continue;
    const int64_t off = ((k_row0 + j) * params.heads_k + kv_head) * kHeadDim + col;
    if constexpr (kHeadDimV != kHeadDim) {
      if (col >= kHeadDimV) {  // dk alone
        float dk[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) dk[e] = 0.0f;
        for (int s = 0; s < params.kv_splits; ++s) {
          const float4* pk = reinterpret_cast<const float4*>(params.dk_partial + s * split_stride + off);
          const float4 k0 = pk[0], k1 = pk[1];
          dk[0] += k0.x; dk[1] += k0.y; dk[2] += k0.z; dk[3] += k0.w;
          dk[4] += k1.x; dk[5] += k1.y; dk[6] += k1.z; dk[7] += k1.w;
        }
        uint4 ok;
        ok.x = ptx::pack2<Element>(dk[0] * dk_scale, dk[1] * dk_scale);
        ok.y = ptx::pack2<Element>(dk[2] * dk_scale, dk[3] * dk_scale);
        ok.z = ptx::pack2<Element>(dk[4] * dk_scale, dk[5] * dk_scale);
        ok.w = ptx::pack2<Element>(dk[6] * dk_scale, dk[7] * dk_scale);
        *reinterpret_cast<uint4*>(static_cast<Element*>(params.dk) + batch * params.dk_strides.batch +
                                  (seq.row0_k + j) * params.dk_strides.row + int64_t(kv_head) * params.dk_strides.head +
                                  col) = ok;
        continue;
      }
    }
    // dv's partials: off itself at kHeadDimV == kHeadDim.
    const int64_t off_v = ((k_row0 + j) * params.heads_k + kv_head) * kHeadDimV + col;
    float dk[8], dv[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) dk[e] = dv[e] = 0.0f;
    for (int s = 0; s < params.kv_splits; ++s) {
      const float4* pk = reinterpret_cast<const float4*>(params.dk_partial + s * split_stride + off);
      const float4* pv = reinterpret_cast<const float4*>(params.dv_partial + s * split_stride_v + off_v);
      const float4 k0 = pk[0], k1 = pk[1], v0 = pv[0], v1 = pv[1];
      dk[0] += k0.x; dk[1] += k0.y; dk[2] += k0.z; dk[3] += k0.w;
      dk[4] += k1.x; dk[5] += k1.y; dk[6] += k1.z; dk[7] += k1.w;
      dv[0] += v0.x; dv[1] += v0.y; dv[2] += v0.z; dv[3] += v0.w;
      dv[4] += v1.x; dv[5] += v1.y; dv[6] += v1.z; dv[7] += v1.w;
    }
    uint4 ok, ov;
    ok.x = ptx::pack2<Element>(dk[0] * dk_scale, dk[1] * dk_scale);
    ok.y = ptx::pack2<Element>(dk[2] * dk_scale, dk[3] * dk_scale);
    ok.z = ptx::pack2<Element>(dk[4] * dk_scale, dk[5] * dk_scale);
    ok.w = ptx::pack2<Element>(dk[6] * dk_scale, dk[7] * dk_scale);
    ov.x = ptx::pack2<Element>(dv[0] * dv_scale, dv[1] * dv_scale);
    ov.y = ptx::pack2<Element>(dv[2] * dv_scale, dv[3] * dv_scale);
    ov.z = ptx::pack2<Element>(dv[4] * dv_scale, dv[5] * dv_scale);
    ov.w = ptx::pack2<Element>(dv[6] * dv_scale, dv[7] * dv_scale);
    Element* gk = static_cast<Element*>(params.dk) + batch * params.dk_strides.batch +
                  (seq.row0_k + j) * params.dk_strides.row + int64_t(kv_head) * params.dk_strides.head + col;
    Element* gv = static_cast<Element*>(params.dv) + batch * params.dv_strides.batch +
                  (seq.row0_k + j) * params.dv_strides.row + int64_t(kv_head) * params.dv_strides.head + col;
    *reinterpret_cast<uint4*>(gk) = ok;
    *reinterpret_cast<uint4*>(gv) = ov;
  }
}

}  // namespace flashattn::cuda
