// CPU forward_kvcache preparation: append with rotary, rotary on q. See kvcache.h.
#include "cpu/kvcache.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/attention_common.h"
#include "cpu/convert.h"

namespace flashattn::cpu {
namespace {

// Rotates row x (head_dim floats) in place at table position `pos`:
//   interleaved:     pairs (2i, 2i + 1)
//   not interleaved: pairs (i, i + rotary_dim / 2)
// each pair (a, b) -> (a cos - b sin, a sin + b cos) with cos/sin = table[pos][i].
void rotate(const KVCacheParams& kv, DType dt, int64_t pos, float* x, float* cos, float* sin) {
  const int64_t half = kv.rotary_dim / 2;
  const auto* cb = static_cast<const unsigned char*>(kv.rotary_cos);
  const auto* sb = static_cast<const unsigned char*>(kv.rotary_sin);
  load_row(dt, cb + pos * kv.rotary_cos_stride * dtype_size(dt), half, cos);
  load_row(dt, sb + pos * kv.rotary_sin_stride * dtype_size(dt), half, sin);
  for (int64_t i = 0; i < half; ++i) {
    const int64_t ia = kv.rotary_interleaved ? 2 * i : i;
    const int64_t ib = kv.rotary_interleaved ? 2 * i + 1 : i + half;
    const float a = x[ia], b = x[ib];
    x[ia] = a * cos[i] - b * sin[i];
    x[ib] = a * sin[i] + b * cos[i];
  }
}

// dst[i] = e4m3(x[i] / descale), n elements: a division, not a multiplication by 1 / descale,
// so every backend quantizes bit for bit alike (vLLM's scaled_fp8_conversion<false> divides
// the same way).
void store_quantized(const float* x, float descale, int64_t n, unsigned char* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = float_to_e4m3(x[i] / descale);
}

}  // namespace

void kvcache_prepare(const ForwardParams& p, std::vector<unsigned char>* q_rot,
                     ForwardParams* attend) {
  *attend = p;
  const KVCacheParams& kv = p.kv;
  const DType dt = p.dtype;  // q's, the new keys' and values', the rotary tables'
  const int64_t es = dtype_size(dt);
  const DType cdt = p.kv_dtype;  // the cache's
  const int64_t ces = dtype_size(cdt);
  // float16/bfloat16 tokens into an FP8 cache: each element is quantized once, as
  // e4m3(x / descale[b, hk]) (x after rotary), in float32 (docs/SEMANTICS.md, "FP8 KV cache").
  const bool quantize = cdt != dt;
  const int64_t d = p.head_dim, dv = p.head_dim_v;
  std::vector<float> vrow(static_cast<size_t>(dv));
  const bool rotary = kv.rotary_dim > 0;
  std::vector<float> row(static_cast<size_t>(std::max(d, dv)));
  std::vector<float> cos(static_cast<size_t>(kv.rotary_dim / 2 + 1));
  std::vector<float> sin(cos.size());

  // Append: new token t of sequence b goes to cache row cache_len(b) + t.
  for (int64_t b = 0; b < p.batch && kv.k_new != nullptr; ++b) {
    const int64_t row0 = kv.cache_len(static_cast<int>(b));
    for (int64_t t = 0; t < kv.seqlen_new; ++t) {
      const int64_t r = row0 + t;
      if (r >= kv.capacity) break;  // checked on the host already; never write past the cache
      const int64_t k_off = kv.row_offset(p.k_strides, static_cast<int>(b), r);
      const int64_t v_off = kv.row_offset(p.v_strides, static_cast<int>(b), r);
      for (int64_t h = 0; h < p.heads_k; ++h) {
        const void* ks = element_ptr(kv.k_new, dt, kv.k_new_strides, b, 0, t, h);
        const void* vs = element_ptr(kv.v_new, dt, kv.v_new_strides, b, 0, t, h);
        auto* kd = static_cast<unsigned char*>(const_cast<void*>(p.k)) + (k_off + h * p.k_strides.head) * ces;
        auto* vd = static_cast<unsigned char*>(const_cast<void*>(p.v)) + (v_off + h * p.v_strides.head) * ces;
        if (quantize) {
          load_row(dt, ks, d, row.data());
          if (rotary) rotate(kv, dt, r, row.data(), cos.data(), sin.data());
          store_quantized(row.data(), p.k_descale.at(b, h), d, kd);
          load_row(dt, vs, dv, vrow.data());
          store_quantized(vrow.data(), p.v_descale.at(b, h), dv, vd);
          continue;
        }
        if (rotary) {
          load_row(dt, ks, d, row.data());
          rotate(kv, dt, r, row.data(), cos.data(), sin.data());
          store_row(dt, row.data(), 1.0f, d, kd);
        } else {
          std::memmove(kd, ks, static_cast<size_t>(d * es));
        }
        std::memmove(vd, vs, static_cast<size_t>(dv * es));
      }
    }
  }

  if (!rotary) return;
  // q rotated at cache_len(b) (+ t when causal or windowed), into a contiguous buffer.
  const int64_t heads = p.heads;
  q_rot->assign(static_cast<size_t>(p.batch * p.seqlen_q * heads * d * es), 0);
  const Strides3 qs{p.seqlen_q * heads * d, heads * d, d};
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t base = kv.cache_len(static_cast<int>(b));
    for (int64_t t = 0; t < p.seqlen_q; ++t) {
      const int64_t pos = std::min<int64_t>(base + (kv.rotary_q_per_token ? t : 0), kv.capacity - 1);
      for (int64_t h = 0; h < heads; ++h) {
        load_row(dt, element_ptr(p.q, dt, p.q_strides, b, 0, t, h), d, row.data());
        rotate(kv, dt, pos, row.data(), cos.data(), sin.data());
        store_row(dt, row.data(), 1.0f, d, element_ptr(q_rot->data(), dt, qs, b, 0, t, h));
      }
    }
  }
  attend->q = q_rot->data();
  attend->q_strides = qs;
}

}  // namespace flashattn::cpu
