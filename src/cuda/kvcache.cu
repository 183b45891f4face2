// The append + rotary kernel of forward_kvcache (kvcache.h). Memory-bound and small: one warp
// per (token, head) row of the new keys/values and of q; the lanes walk the row's rotary pairs,
// then its remaining columns.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/common/cuda_check.h"
#include "cuda/kvcache.h"
#include "cuda/ptx/fp8.h"

namespace flashattn::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

template <typename Element>
__device__ __forceinline__ float load(const Element* p, int64_t i) {
  return static_cast<float>(p[i]);
}

// Calls put(i, x) for the rotary columns i of [0, rotary_dim) of a row of src (none unless
// `rotate`), x in float32 turned by the angle of table row `pos`: interleaved pairs (2i, 2i + 1),
// else (i, i + rotary_dim / 2); (a, b) -> (a cos - b sin, a sin + b cos). The products are
// rounded separately (no FMA contraction) to match the CPU backend bit for bit. Returns the
// first column it left to the caller.
template <typename Element, typename Put>
__device__ int put_rotated(const KVCacheParams& kv, const Element* src, int64_t pos, bool rotate, int lane,
                           Put put) {
  const int half = rotate ? kv.rotary_dim / 2 : 0;
  const auto* cos_row = static_cast<const Element*>(kv.rotary_cos) + pos * kv.rotary_cos_stride;
  const auto* sin_row = static_cast<const Element*>(kv.rotary_sin) + pos * kv.rotary_sin_stride;
  for (int i = lane; i < half; i += 32) {
    const int ia = kv.rotary_interleaved ? 2 * i : i;
    const int ib = kv.rotary_interleaved ? 2 * i + 1 : i + half;
    const float a = load(src, ia), b = load(src, ib);
    const float c = load(cos_row, i), s = load(sin_row, i);
    put(ia, __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
    put(ib, __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c)));
  }
  return 2 * half;
}

// dst[0, d) = src[0, d) with its rotary pairs turned (put_rotated) and rounded to Element, the
// other columns copied. src and dst may be the same row only without rotation.
template <typename Element>
__device__ void rotate_row(const KVCacheParams& kv, const Element* src, Element* dst, int d, int64_t pos,
                           int lane) {
  const int rest = put_rotated(kv, src, pos, true, lane, [&](int i, float x) { dst[i] = Element(x); });
  for (int i = rest + lane; i < d; i += 32) dst[i] = src[i];
}

// An e4m3 cache (docs/SEMANTICS.md, "FP8 KV cache"): dst[i] = e4m3(x_i / descale), x the row of
// src in float32, its rotary pairs turned when `rotate` but not rounded to Element, a true
// division (__fdiv_rn; never a multiplication by 1 / descale), round to nearest even,
// saturating: the CPU backend's store_quantized (cpu/kvcache.cpp) bit for bit.
template <typename Element>
__device__ void quantize_row(const KVCacheParams& kv, const Element* src, uint8_t* dst, int d, int64_t pos,
                             bool rotate, float descale, int lane) {
  const auto put = [&](int i, float x) { dst[i] = ptx::float_to_e4m3(__fdiv_rn(x, descale)); };
  const int rest = put_rotated(kv, src, pos, rotate, lane, put);
  for (int i = rest + lane; i < d; i += 32) put(i, load(src, i));
}

template <typename Element>
__device__ void copy_row(const Element* src, Element* dst, int d, int lane) {
  for (int i = lane; i < d; i += 32) dst[i] = src[i];
}

// Work items: first the appended rows (b, t, h_k), then, with rotary, the query rows (b, t, h).
// CacheElement: Element, or uint8_t for an e4m3 cache (quantize_row).
template <typename Element, typename CacheElement>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    kvcache_append_kernel(const __grid_constant__ ForwardParams p, Element* q_rot) {
  const KVCacheParams& kv = p.kv;
  const int lane = threadIdx.x % 32;
  // Item counts fit in int32 (kvcache_append checks), which keeps the index math off the
  // 64-bit division routine.
  int item = int(blockIdx.x) * kWarpsPerBlock + int(threadIdx.x) / 32;
  const int append_items = kv.k_new != nullptr ? p.batch * kv.seqlen_new * p.heads_k : 0;
  const bool rotary = kv.rotary_dim > 0;
  if (item < append_items) {
    const int h = item % p.heads_k;
    const int t = item / p.heads_k % kv.seqlen_new;
    const int b = item / p.heads_k / kv.seqlen_new;
    const int64_t row = int64_t(kv.cache_len(b)) + t;
    if (row >= kv.capacity) return;  // checked on the host for host-visible cache_seqlens
    const auto* k_src = static_cast<const Element*>(kv.k_new) + b * kv.k_new_strides.batch +
                        t * kv.k_new_strides.row + h * kv.k_new_strides.head;
    const auto* v_src = static_cast<const Element*>(kv.v_new) + b * kv.v_new_strides.batch +
                        t * kv.v_new_strides.row + h * kv.v_new_strides.head;
    auto* k_dst = const_cast<CacheElement*>(static_cast<const CacheElement*>(p.k)) +
                  kv.row_offset(p.k_strides, b, row) + h * p.k_strides.head;
    auto* v_dst = const_cast<CacheElement*>(static_cast<const CacheElement*>(p.v)) +
                  kv.row_offset(p.v_strides, b, row) + h * p.v_strides.head;
    if constexpr (!std::is_same_v<CacheElement, Element>) {
      quantize_row(kv, k_src, k_dst, p.head_dim, row, rotary, p.k_descale.at(b, h), lane);
      quantize_row(kv, v_src, v_dst, p.head_dim_v, row, false, p.v_descale.at(b, h), lane);
    } else {
      if (rotary) {
        rotate_row(kv, k_src, k_dst, p.head_dim, row, lane);
      } else {
        copy_row(k_src, k_dst, p.head_dim, lane);
      }
      copy_row(v_src, v_dst, p.head_dim_v, lane);
    }
    return;
  }
  item -= append_items;
  if (!rotary || item >= p.batch * p.seqlen_q * p.heads) return;
  const int h = item % p.heads;
  const int t = item / p.heads % p.seqlen_q;
  const int b = item / p.heads / p.seqlen_q;
  // Queries sit at cache_len(b) (+ t when causal or windowed), as on the CPU backend.
  const int64_t pos = min(int64_t(kv.cache_len(b)) + (kv.rotary_q_per_token ? t : 0), int64_t(kv.capacity) - 1);
  const auto* q_src = static_cast<const Element*>(p.q) + b * p.q_strides.batch + t * p.q_strides.row +
                      h * p.q_strides.head;
  rotate_row(kv, q_src, q_rot + int64_t(item) * p.head_dim, p.head_dim, pos, lane);
}

}  // namespace

Status kvcache_append(const ForwardParams& p, void* q_rot, cudaStream_t stream) {
  const KVCacheParams& kv = p.kv;
  const int64_t items = (kv.k_new != nullptr ? int64_t(p.batch) * kv.seqlen_new * p.heads_k : 0) +
                        (kv.rotary_dim > 0 ? int64_t(p.batch) * p.seqlen_q * p.heads : 0);
  if (items == 0) return Status::Ok();
  if (items > 0x7fffffff - kWarpsPerBlock) {
    return Status::NotSupported("forward_kvcache: more than 2^31 rows of k/v to append and q to rotate");
  }
  const dim3 grid(static_cast<unsigned>((items + kWarpsPerBlock - 1) / kWarpsPerBlock));
  const bool fp8_cache = p.kv_dtype == DType::kFloat8E4M3;
  if (p.dtype == DType::kBFloat16) {
    const auto kernel = fp8_cache ? kvcache_append_kernel<__nv_bfloat16, uint8_t>
                                  : kvcache_append_kernel<__nv_bfloat16, __nv_bfloat16>;
    kernel<<<grid, 32 * kWarpsPerBlock, 0, stream>>>(p, static_cast<__nv_bfloat16*>(q_rot));
  } else {
    const auto kernel = fp8_cache ? kvcache_append_kernel<__half, uint8_t> : kvcache_append_kernel<__half, __half>;
    kernel<<<grid, 32 * kWarpsPerBlock, 0, stream>>>(p, static_cast<__half*>(q_rot));
  }
  return cuda_status(cudaGetLastError(), "launching the KV-cache append kernel");
}

}  // namespace flashattn::cuda
