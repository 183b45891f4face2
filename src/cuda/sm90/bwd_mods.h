// The Hopper backward with softcap and ALiBi (BwdModsTraits, bwd_kernel.h): the score
// modifiers and softcap's factor of dS.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "cuda/common/mask.h"
#include "cuda/ptx/math.h"
#include "cuda/sm80/bwd_common.h"  // BwdKernelParams

namespace flashattn::cuda::sm90 {

// Softcap's constants (kMods kernels; run_bwd sets them), read from the parameter space where
// they take no register: scale / softcap (0 without softcap), softcap log2(e) and its inverse.
struct BwdSoftcap {
  float in = 0.0f, out = 0.0f, out_inv = 0.0f;
};

namespace bwd90 {

// Traits::kMods: softcap and ALiBi for one (sequence, query head), as the forward applies them
// (scale or softcap, then ALiBi, then the masks; sm80/bwd_common.h scores_to_probs): the score
// in log2 units is softcap ? tanh(s scale / softcap) softcap log2(e) : s scale log2(e), minus
// slope log2(e) |i + seqlen_k - seqlen_q - j|. The kernels keep the first part (`soft`) in the
// score registers, hide masked scores there (-inf), and subtract ALiBi only in the pass that
// computes P and dS, where softcap's factor 1 - tanh^2 comes from the same value: ALiBi is
// computed once per score and no value lives between the passes (with ALiBi subtracted first
// and recomputed for the factor, the d128 kernels spilled). The constants stay in the
// parameter space.
struct ScoreModifiers {
  const BwdKernelParams& params;
  const BwdSoftcap& softcap;
  const WindowMask& mask;  // its diagonal (the kernel's, which keeps the sequence lengths anyway)
  float alibi_log2;        // slope log2(e); 0 without ALiBi

  // The raw product s = q.k in log2 units after scale or softcap.
  __device__ __forceinline__ float soft(float s) const {
    return softcap.in != 0.0f ? ptx::tanh_approx(s * softcap.in) * softcap.out : s * params.scale_log2;
  }
  // ALiBi's term of query i and key j.
  __device__ __forceinline__ float alibi(int i, int j) const { return alibi_log2 * fabsf(float(mask.diag(i) - j)); }
  // Softcap's factor of dS, 1 - tanh^2, from soft's value x (-inf where masked: 0 there, so that
  // P = 0 times it stays 0); 1 without softcap.
  __device__ __forceinline__ float dtanh(float x) const {
    if (softcap.in == 0.0f) return 1.0f;
    const float th = x * softcap.out_inv;
    return fmaxf(fmaf(-th, th, 1.0f), 0.0f);
  }
};

__device__ __forceinline__ ScoreModifiers score_modifiers(const BwdKernelParams& p, const BwdSoftcap& softcap,
                                                          int batch, int head, const WindowMask& mask) {
  const float slope = p.alibi != nullptr ? __ldg(p.alibi + batch * p.alibi_batch_stride + head) : 0.0f;
  return {p, softcap, mask, slope * 1.4426950408889634f};
}

// dbias on the bias kernels (BwdBiasTraits; cuda/bwd_dbias.h says where dbias_out points). A
// thread's dS^T holds (key `key` + 8h, query m0 + 8c + 2t4 + e) at ds[4c + 2h + e]; every (b, h,
// i, j) belongs to one step of one CTA, so each element is stored once: for a fixed (c, h, e) a
// warp's store covers 8 consecutive keys (32 bytes; 16 in 16-bit, the other 16 the h = 1 store's)
// of 4 query rows.
template <int kBlockM, typename T>
__device__ __forceinline__ void store_dbias_t_as(const float (&ds)[kBlockM / 2], const Broadcast4& d, int batch,
                                                 int head, int m0, int key, int t4, int seqlen_q, int seqlen_k) {
  T* base = static_cast<T*>(d.data) + batch * d.batch + head * d.head;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int j = key + 8 * h;
    if (j >= seqlen_k) continue;
#pragma unroll
    for (int c = 0; c < kBlockM / 8; ++c) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = m0 + 8 * c + 2 * t4 + e;
        if (i < seqlen_q) base[int64_t(i) * d.row + j] = T(ds[4 * c + 2 * h + e]);
      }
    }
  }
}
// dbias_out in float32, or in the bias's 16-bit dtype Element (dbias itself, DbiasPlan: rounded
// here once, the bits a cast of the float32 value gives; half the bytes, and no cast afterwards).
template <int kBlockM, typename Element>
__device__ __forceinline__ void store_dbias_t(const float (&ds)[kBlockM / 2], const BwdKernelParams& p, int batch,
                                              int head, int m0, int key, int t4, int seqlen_q, int seqlen_k) {
  if (p.dbias_out.dtype == DType::kFloat32) {
    store_dbias_t_as<kBlockM, float>(ds, p.dbias_out, batch, head, m0, key, t4, seqlen_q, seqlen_k);
  } else {
    store_dbias_t_as<kBlockM, Element>(ds, p.dbias_out, batch, head, m0, key, t4, seqlen_q, seqlen_k);
  }
}

// dbias broadcast over the query rows: the thread's sums of its two keys' dS over its queries,
// added step after step of one head (rows past the queries have P = 0, so dS = 0).
template <int kBlockM>
__device__ __forceinline__ void add_dbias_rows(const float (&ds)[kBlockM / 2], float (&sums)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int c = 0; c < kBlockM / 8; ++c) sums[h] += ds[4 * c + 2 * h] + ds[4 * c + 2 * h + 1];
  }
}

// At the head's last step: the quad's four parts of each key in a fixed order (so dbias is the same
// bits every run), stored by lane t4 = 0 at row 0 of (batch, head), and the sums reset. Only this
// quad's keys: each (b, h, key) is summed by one quad of one CTA.
__device__ __forceinline__ void flush_dbias_rows(float (&sums)[2], const BwdKernelParams& p, int batch, int head,
                                                 int key, int t4, int seqlen_k) {
  const Broadcast4& d = p.dbias_out;
  float* base = static_cast<float*>(d.data) + batch * d.batch + head * d.head;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float v = sums[h];
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    if (t4 == 0 && key + 8 * h < seqlen_k) base[key + 8 * h] = v;
    sums[h] = 0.0f;
  }
}

}  // namespace bwd90
}  // namespace flashattn::cuda::sm90
