// Pieces shared by the CPU forward and backward passes: tile sizes, sequence geometry, the
// mask window, the score transform (scale, softcap, ALiBi, mask) in the log2 domain, dropout
// multipliers and per-worker scratch.
//
// Tiles come in two orientations, named after what their rows hold:
//   key rows   (forward, dQ pass):    tile[jr * ld + c] = score of key j0 + jr, query i0 + c
//   query rows (dK/dV pass):          tile[ir * ld + c] = score of query i0 + ir, key j0 + c
// Vectors always run along c. Both orientations apply the identical float operations to each
// score, so the backward recomputes exactly the forward's logits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>

#include "core/params.h"
#include "core/philox.h"
#include "cpu/block_states.h"
#include "cpu/convert.h"
#include "cpu/simd.h"

namespace flashattn::cpu {

// Tile sizes. 64 queries x 64 keys keeps the per-worker working set of the forward (Q^T, O^T,
// one score tile and one K/V tile: ~64 KiB at head dim 64) inside L2, lets the widest ISA cover
// a tile row with 4 vectors, and makes the softmax/transpose overhead per tile ~1/64 of the
// multiply-adds. Both must be multiples of kMaxWidth (16) and of 4 (dropout draws 4 keys).
constexpr int64_t kBlockQ = 64;
constexpr int64_t kBlockK = 64;

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2 = 0.693147180559945309f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

constexpr int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
constexpr int64_t ceil_div(int64_t x, int64_t m) { return (x + m - 1) / m; }

// One sequence of the batch: its first row (row_offset(b) in params.h) and its lengths.
struct Sequence {
  int64_t q_row0 = 0;
  int64_t k_row0 = 0;
  int64_t len_q = 0;
  int64_t len_k = 0;
};

inline Sequence sequence_of(const QKVParams& p, int64_t b) {
  Sequence s;
  if (p.is_varlen()) {
    s.q_row0 = p.cu_seqlens_q[b];
    s.k_row0 = p.cu_seqlens_k[b];
    s.len_q = p.cu_seqlens_q[b + 1] - s.q_row0;
    s.len_k = p.cu_seqlens_k[b + 1] - s.k_row0;
  } else {
    s.len_q = p.seqlen_q;
    s.len_k = p.seqlen_k;
  }
  return s;
}

// Address of element 0 of (sequence b, position i, head h) of an operand with these strides.
inline const void* element_ptr(const void* base, DType dt, const Strides3& s, int64_t b,
                               int64_t row0, int64_t i, int64_t h) {
  const int64_t off = b * s.batch + (row0 + i) * s.row + h * s.head;
  return static_cast<const char*>(base) + off * dtype_size(dt);
}
inline void* element_ptr(void* base, DType dt, const Strides3& s, int64_t b, int64_t row0,
                         int64_t i, int64_t h) {
  const int64_t off = b * s.batch + (row0 + i) * s.row + h * s.head;
  return static_cast<char*>(base) + off * dtype_size(dt);
}

// Rows [i0, i0 + n) of an operand (sequence b, head hh; `width` elements each) as float32:
// the tensor itself when it is float32 (*ld = its row stride), else converted into buf
// (*ld = width).
FLASHATTN_CPU_INLINE const float* rows_as_float(DType dt, const void* base, const Strides3& st,
                                                int64_t b, int64_t row0, int64_t i0, int64_t n,
                                                int64_t hh, int64_t width, float* buf,
                                                int64_t* ld) {
  if (dt == DType::kFloat32) {
    *ld = st.row;
    return static_cast<const float*>(element_ptr(base, dt, st, b, row0, i0, hh));
  }
  for (int64_t r = 0; r < n; ++r) {
    load_row(dt, element_ptr(base, dt, st, b, row0, i0 + r, hh), width, buf + r * width);
  }
  *ld = width;
  return buf;
}

// Rows [i0, i0 + n) of an operand transposed into float32 buf (width x ld): buf[c * ld + r];
// columns [n, ld) are zero. `row` is scratch for one converted row.
FLASHATTN_CPU_INLINE void rows_transposed(DType dt, const void* base, const Strides3& st, int64_t b,
                                          int64_t row0, int64_t i0, int64_t n, int64_t hh,
                                          int64_t width, float* row, float* buf, int64_t ld) {
  for (int64_t c = 0; c < width; ++c) std::fill(buf + c * ld + n, buf + (c + 1) * ld, 0.0f);
  for (int64_t r = 0; r < n; ++r) {
    load_row(dt, element_ptr(base, dt, st, b, row0, i0 + r, hh), width, row);
    for (int64_t c = 0; c < width; ++c) buf[c * ld + r] = row[c];
  }
}

// Which keys each query sees inside one sequence: key j is visible from query i iff
//   (left < 0 || j >= i + diag - left) && (right < 0 || j <= i + diag + right),
// diag = len_k - len_q (bottom-right alignment), and 0 <= j < len_k.
struct Visibility {
  int64_t diag = 0;
  int64_t len_q = 0;
  int64_t len_k = 0;
  int32_t left = -1;
  int32_t right = -1;

  Visibility(const QKVParams& p, const Sequence& s)
      : diag(s.len_k - s.len_q),
        len_q(s.len_q),
        len_k(s.len_k),
        left(p.window_left),
        right(p.window_right) {}

  // Visible keys of query i: [first_key(i), last_key(i)], empty when first > last.
  int64_t first_key(int64_t i) const {
    return left < 0 ? 0 : std::max<int64_t>(0, i + diag - left);
  }
  int64_t last_key(int64_t i) const {
    return right < 0 ? len_k - 1 : std::min<int64_t>(len_k - 1, i + diag + right);
  }
  // Queries that see key j: [first_query(j), last_query(j)].
  int64_t first_query(int64_t j) const {
    return right < 0 ? 0 : std::max<int64_t>(0, j - diag - right);
  }
  int64_t last_query(int64_t j) const {
    return left < 0 ? len_q - 1 : std::min<int64_t>(len_q - 1, j - diag + left);
  }
  // Whether every key of [j0, j1) is visible from every query of [i0, i1) (both non-empty).
  // The window edges are monotone in i, so the corners decide.
  bool all_visible(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
    return first_key(i1 - 1) <= j0 && last_key(i0) >= j1 - 1;
  }
};

// What turns a dot product q.k into the logit x used with exp2 (x = s * log2(e)):
//   softcap == 0:  x = dot * scale_log2
//   softcap  > 0:  t = tanh(dot * cap_in), x = cap_out * t   (cap_in = scale / softcap,
//                                                              cap_out = softcap * log2(e))
//   ALiBi:         x += -slope * log2(e) * |i + diag - j|
// FP8 descale factors (q_descale * k_descale of the head's kv head; 1 otherwise) multiply the
// scale, as in FlashAttention-3: the raw dot products are those of the stored e4m3 values.
// Without softcap and ALiBi (`plain`) the tiles keep the raw dot products and the scale is
// folded into the exponent: exp2(dot * exp_scale - m) in one multiply-add. Otherwise tiles hold
// x and exp_scale is 1. Either way max(tile) * exp_scale is the maximum logit (exp_scale > 0).
struct ScoreTransform {
  float scale_log2 = 0.0f;
  bool softcap = false;
  float cap_in = 0.0f;
  float cap_out = 0.0f;
  bool alibi = false;
  float alibi_log2 = 0.0f;  // -slope(b, h) * log2(e)
  bool plain = true;
  float exp_scale = 1.0f;

  ScoreTransform(const QKVParams& p, int64_t b, int64_t h) {
    const int64_t hk = h / (p.heads / p.heads_k);
    const float descale = p.q_descale.at(b, hk) * p.k_descale.at(b, hk);
    scale_log2 = p.scale_log2 * descale;
    softcap = p.softcap > 0.0f;
    if (softcap) {
      cap_in = p.scale * descale / p.softcap;
      cap_out = p.softcap * kLog2e;
    }
    alibi = p.alibi != nullptr;
    if (alibi) alibi_log2 = -p.alibi[b * p.alibi_batch_stride + h] * kLog2e;
    plain = !softcap && !alibi && !p.has_score_mods();
    exp_scale = plain ? scale_log2 : 1.0f;
  }
};

// Transforms n (a multiple of W) raw dot products in place (nothing to do when tf.plain).
// Element c has ALiBi distance dist0 + step * c (step = +1 for key rows, -1 for query rows).
// With softcap, tanh values are also written to `tanh_out` when given (the backward needs
// 1 - t^2).
template <int W>
FLASHATTN_CPU_INLINE void transform_scores(const ScoreTransform& tf, float* __restrict x,
                                           float* __restrict tanh_out, int64_t n, int64_t dist0,
                                           float step) {
  using V = VecF<W>;
  if (tf.plain) return;
  if (tf.softcap) {
    V cap_in, cap_out;
    vsplat<W>(cap_in, tf.cap_in);
    vsplat<W>(cap_out, tf.cap_out);
    for (int64_t c = 0; c < n; c += W) {
      V t;
      vload<W>(t, x + c);
      t *= cap_in;
      vtanh_inplace<W>(t);
      if (tanh_out != nullptr) vstore<W>(tanh_out + c, t);
      t *= cap_out;
      vstore<W>(x + c, t);
    }
  } else {
    V scale;
    vsplat<W>(scale, tf.scale_log2);
    for (int64_t c = 0; c < n; c += W) {
      V v;
      vload<W>(v, x + c);
      v *= scale;
      vstore<W>(x + c, v);
    }
  }
  if (tf.alibi) {
    V lane, slope;
    viota<W>(lane, 0.0f);
    lane *= step;
    vsplat<W>(slope, tf.alibi_log2);
    for (int64_t c = 0; c < n; c += W) {
      V dist, v;
      vsplat<W>(dist, static_cast<float>(dist0) + step * static_cast<float>(c));
      dist += lane;
      vabs_inplace<W>(dist);
      vload<W>(v, x + c);
      v += slope * dist;
      vstore<W>(x + c, v);
    }
  }
}

// attn_bias, attn_mask and the block mask (either form, as BlockStates) of one (sequence b,
// head h); i and j are positions inside the sequence. Off (`on` false) for calls without them,
// so the tiled loops test one flag per tile row and nothing else.
struct ScoreMods {
  bool on = false;
  const char* bias = nullptr;  // element (i, j) at bias + (i * bias_row + j) * bias_size
  DType bias_dtype = DType::kFloat32;
  int64_t bias_row = 0, bias_size = 4;
  const uint8_t* mask = nullptr;  // (i, j) at mask + i * mask_row + j
  int64_t mask_row = 0;
  // BlockState of (i / bm, j / bn) at block + (i / bm) * block_row + j / bn.
  const uint8_t* block = nullptr;
  int64_t block_row = 0, bm = 1, bn = 1;

  ScoreMods(const QKVParams& p, const BlockStates& blocks, int64_t b, int64_t h) {
    on = p.has_score_mods();
    if (!on) return;
    if (p.bias.defined()) {
      bias_dtype = p.bias.dtype;
      bias_size = dtype_size(bias_dtype);
      bias = static_cast<const char*>(p.bias.data) +
             (b * p.bias.batch + h * p.bias.head) * bias_size;
      bias_row = p.bias.row;
    }
    if (p.mask.defined()) {
      mask = static_cast<const uint8_t*>(p.mask.data) + b * p.mask.batch + h * p.mask.head;
      mask_row = p.mask.row;
    }
    if (blocks.on()) {
      block = blocks.plane(b, h);
      block_row = blocks.cols();
      bm = p.block_size_q;
      bn = p.block_size_k;
    }
  }

  // Whether the block mask keeps any (query, key) pair of [i0, i1) x [j0, j1) (non-empty).
  // Without a block mask every tile is kept.
  bool keeps_any(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
    if (block == nullptr) return true;
    for (int64_t r = i0 / bm; r <= (i1 - 1) / bm; ++r) {
      for (int64_t c = j0 / bn; c <= (j1 - 1) / bn; ++c) {
        if (block[r * block_row + c] != kBlockAbsent) return true;
      }
    }
    return false;
  }

  float bias_at(int64_t i, int64_t j) const {
    const char* e = bias + (i * bias_row + j) * bias_size;
    switch (bias_dtype) {
      case DType::kFloat16: return half_to_float(*reinterpret_cast<const uint16_t*>(e));
      case DType::kBFloat16: return bf16_to_float(*reinterpret_cast<const uint16_t*>(e));
      default: return *reinterpret_cast<const float*>(e);
    }
  }

  // Logits x[c] (log2 domain) of the pairs (i0 + c * di, j0 + c * dj), c < n: adds
  // bias * log2(e) and sets -inf where the pair is hidden: its block is absent, or attn_mask
  // hides it and its block (if there is a block mask) is partial. Full blocks never read
  // attn_mask.
  void apply(float* x, int64_t n, int64_t i0, int64_t di, int64_t j0, int64_t dj) const {
    if (bias != nullptr) {
      for (int64_t c = 0; c < n; ++c) x[c] += bias_at(i0 + c * di, j0 + c * dj) * kLog2e;
    }
    const auto masked_out = [&](int64_t i, int64_t j) {
      return mask != nullptr && mask[i * mask_row + j] == 0;
    };
    if (block != nullptr) {
      for (int64_t c = 0; c < n; ++c) {
        const int64_t i = i0 + c * di, j = j0 + c * dj;
        const uint8_t state = block[i / bm * block_row + j / bn];
        if (state == kBlockAbsent || (state == kBlockPartial && masked_out(i, j))) x[c] = kNegInf;
      }
    } else if (mask != nullptr) {
      for (int64_t c = 0; c < n; ++c) {
        if (masked_out(i0 + c * di, j0 + c * dj)) x[c] = kNegInf;
      }
    }
  }
};

// Sets row[c] = -inf for c in [0, n) outside [lo, hi] (lo/hi may lie outside [0, n)).
inline void mask_outside(float* row, int64_t n, int64_t lo, int64_t hi) {
  const int64_t a = std::clamp<int64_t>(lo, 0, n);
  const int64_t b = std::clamp<int64_t>(hi + 1, a, n);
  for (int64_t c = 0; c < a; ++c) row[c] = kNegInf;
  for (int64_t c = b; c < n; ++c) row[c] = kNegInf;
}

// Dropout keep decisions of queries [i0, i0 + n) (n <= kBlockQ) for the 4 keys of Philox
// column group `group`: words[w][r] is the draw of query i0 + r, key 4 * group + w. A plain loop
// over independent queries, so that it vectorises (the 32x32->64-bit products become vpmuludq).
FLASHATTN_CPU_INLINE void dropout_draw_queries(const QKVParams& p, uint32_t batch_head, int64_t i0,
                                               int64_t n, uint32_t group,
                                               uint32_t (&words)[4][kBlockQ]) {
  uint32_t* __restrict w0 = words[0];
  uint32_t* __restrict w1 = words[1];
  uint32_t* __restrict w2 = words[2];
  uint32_t* __restrict w3 = words[3];
  const uint32_t row0 = static_cast<uint32_t>(i0);
  for (int64_t r = 0; r < n; ++r) {
    const Philox4 d =
        dropout_draws(p.seed, p.offset, batch_head, row0 + static_cast<uint32_t>(r), group);
    w0[r] = d.x;
    w1[r] = d.y;
    w2[r] = d.z;
    w3[r] = d.w;
  }
}

// Dropout: mult = dropout_rescale where the keep mask keeps (query i, key j), else 0.
// Key-rows tile: mult[jr * ld + c] for key j0 + jr (jr < nk), query i0 + c (c < nq); the
// padding columns [nq, ld) are set to 0. j0 must be a multiple of 4 (each Philox call draws 4
// consecutive keys).
FLASHATTN_CPU_INLINE void dropout_key_rows(const QKVParams& p, uint32_t batch_head, int64_t i0,
                                           int64_t nq, int64_t j0, int64_t nk, float* mult,
                                           int64_t ld) {
  uint32_t words[4][kBlockQ];
  for (int64_t g = 0; g < nk; g += 4) {
    dropout_draw_queries(p, batch_head, i0, nq, static_cast<uint32_t>((j0 + g) >> 2), words);
    const int64_t nw = std::min<int64_t>(4, nk - g);
    for (int64_t w = 0; w < nw; ++w) {
      float* __restrict out = mult + (g + w) * ld;
      const uint32_t* __restrict draw = words[w];
      for (int64_t c = 0; c < nq; ++c) {
        out[c] = draw[c] >= p.dropout_threshold ? p.dropout_rescale : 0.0f;
      }
      std::fill(out + nq, out + ld, 0.0f);
    }
  }
}

// Query-rows tile: mult[ir * ld + c] for query i0 + ir (ir < nq), key j0 + c (c < nk); the
// padding columns [nk, ld) are set to 0.
FLASHATTN_CPU_INLINE void dropout_query_rows(const QKVParams& p, uint32_t batch_head, int64_t i0,
                                             int64_t nq, int64_t j0, int64_t nk, float* mult,
                                             int64_t ld) {
  uint32_t words[4][kBlockQ];
  for (int64_t ir = 0; ir < nq; ++ir) std::fill(mult + ir * ld + nk, mult + (ir + 1) * ld, 0.0f);
  for (int64_t g = 0; g < nk; g += 4) {
    dropout_draw_queries(p, batch_head, i0, nq, static_cast<uint32_t>((j0 + g) >> 2), words);
    const int64_t nw = std::min<int64_t>(4, nk - g);
    for (int64_t ir = 0; ir < nq; ++ir) {
      for (int64_t w = 0; w < nw; ++w) {
        mult[ir * ld + g + w] = words[w][ir] >= p.dropout_threshold ? p.dropout_rescale : 0.0f;
      }
    }
  }
}

// Per-worker float32 scratch: a layout of named regions (offsets in floats, each rounded up to
// a 64-byte multiple) and one 64-byte aligned allocation holding one copy per worker.
class ScratchLayout {
 public:
  int64_t add(int64_t floats) {
    const int64_t offset = size_;
    size_ += round_up(std::max<int64_t>(floats, 1), kFloatsPer64Bytes);
    return offset;
  }
  int64_t size() const { return size_; }

 private:
  static constexpr int64_t kFloatsPer64Bytes = 16;
  int64_t size_ = 0;
};

class ScratchBuffer {
 public:
  // Throws std::bad_alloc on failure (the backend entry points turn it into a Status).
  ScratchBuffer(int64_t per_worker_floats, int workers)
      : per_worker_(per_worker_floats),
        data_(static_cast<float*>(::operator new(
            static_cast<size_t>(per_worker_floats) * static_cast<size_t>(workers) * sizeof(float),
            std::align_val_t(64)))) {}
  float* worker(int w) const { return data_.get() + static_cast<int64_t>(w) * per_worker_; }

 private:
  struct Free {
    void operator()(float* f) const { ::operator delete(f, std::align_val_t(64)); }
  };
  int64_t per_worker_;
  std::unique_ptr<float, Free> data_;
};

}  // namespace flashattn::cpu
