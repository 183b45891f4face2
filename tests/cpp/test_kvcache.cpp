// forward_kvcache (flash_attn_with_kvcache) on every backend: append-then-attend against the fp64
// reference (the cache gathered to dense in the test, rotary written again here), paged vs
// dense (bitwise), shuffled pages and page sizes 1..256, split vs unsplit, ragged cache lengths
// 0 and 1, left padding, cache_batch_idx, learnable sinks (decode GQA, whose query heads the
// CUDA backend folds into rows, included; -inf = no sink bitwise), CPU vs CUDA, and bad inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/params.h"
#include "core/switches.h"
#include "flashattn/c_api.h"
#include "test_util.h"

namespace flashattn::test {
namespace {

struct KVCase {
  DType dtype = DType::kBFloat16;
  std::vector<int> cache_seqlens{37};  // per sequence: rows already in the cache (leftpad included)
  std::vector<int> leftpad;            // empty = none
  int seqlen_q = 1;
  int seqlen_new = 0;  // 0 = no k/v
  int heads = 4;
  int heads_k = 2;
  int head_dim = 128;
  int head_dim_v = 128;
  int capacity = 96;    // rows per sequence (dense seqlen_cache, or max_blocks * page_size)
  int page_size = 0;    // 0 = dense cache
  bool shuffle_pages = true;
  bool batch_idx = false;  // dense only: sequences read shuffled cache rows out of batch + 2
  bool cache_seqlens_given = true;
  int rotary_dim = 0;
  bool rotary_interleaved = true;
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  float softcap = 0.0f;
  bool alibi = false;
  int num_splits = 0;
  std::vector<float> sink;  // learnable_sink (heads); empty = none
  // Cache rows outside [leftpad, end) hold NaN instead of random values (a kernel that read one
  // would show NaN; end = cache_seqlens + seqlen_new).
  bool nan_outside = false;
  // v_cache's rows are head_dim_v + v_row_pad elements apart in memory (the call sees a view of
  // the first head_dim_v columns), so its strides differ from k_cache's; the pad columns are
  // padding the call must not write.
  int v_row_pad = 0;
  uint32_t seed = 7;

  int batch() const { return static_cast<int>(cache_seqlens.size()); }
  int max_blocks() const { return page_size > 0 ? capacity / page_size : 0; }
};

// Everything the call produced, in raw bytes (for bitwise comparisons) and as doubles.
struct KVOutcome {
  bool skipped = false;
  std::string skip_reason;
  Status status;
  std::vector<double> out, lse;  // out (batch, seqlen_q, heads, dv); lse (batch, heads, seqlen_q)
  std::vector<unsigned char> out_bytes;
};

double uniform(std::mt19937& g) { return std::uniform_real_distribution<double>(-1.0, 1.0)(g); }

// The test's own rotary: pair (a, b) of row x at position pos -> (a c - b s, a s + b c).
void rotate_ref(std::vector<double>& x, int64_t off, int rotary_dim, bool interleaved,
                const std::vector<double>& cos, const std::vector<double>& sin, int64_t pos) {
  const int half = rotary_dim / 2;
  for (int i = 0; i < half; ++i) {
    const int64_t ia = off + (interleaved ? 2 * i : i);
    const int64_t ib = off + (interleaved ? 2 * i + 1 : i + half);
    const double c = cos[pos * half + i], s = sin[pos * half + i];
    const double a = x[ia], b = x[ib];
    x[ia] = a * c - b * s;
    x[ib] = a * s + b * c;
  }
}

class KVRun {
 public:
  KVRun(Backend backend, const KVCase& kc) : backend_(backend), kc_(kc) { build(); }

  KVCacheArgs args() const {
    const Device dev = device_of(backend_);
    const DType dt = kc_.dtype;
    const int64_t B = kc_.batch(), hk = kc_.heads_k, d = kc_.head_dim, dv = kc_.head_dim_v;
    KVCacheArgs a;
    a.q = make_contiguous_view(q_->device_data(), dt, dev, {B, kc_.seqlen_q, kc_.heads, d});
    a.k_cache = make_contiguous_view(kcache_->device_data(), dt, dev, {rows0_, rows1_, hk, d});
    a.v_cache = make_contiguous_view(vcache_->device_data(), dt, dev, {rows0_, rows1_, hk, dv});
    if (kc_.v_row_pad > 0) {  // the first dv columns of rows dv + v_row_pad wide
      const int64_t w = dv + kc_.v_row_pad;
      a.v_cache.strides[2] = w;
      a.v_cache.strides[1] = hk * w;
      a.v_cache.strides[0] = rows1_ * hk * w;
    }
    if (kc_.seqlen_new > 0) {
      a.k = make_contiguous_view(knew_->device_data(), dt, dev, {B, kc_.seqlen_new, hk, d});
      a.v = make_contiguous_view(vnew_->device_data(), dt, dev, {B, kc_.seqlen_new, hk, dv});
    }
    if (kc_.rotary_dim > 0) {
      a.rotary_cos = make_contiguous_view(cos_->device_data(), dt, dev, {kc_.capacity, kc_.rotary_dim / 2});
      a.rotary_sin = make_contiguous_view(sin_->device_data(), dt, dev, {kc_.capacity, kc_.rotary_dim / 2});
      a.rotary_interleaved = kc_.rotary_interleaved;
    }
    if (kc_.cache_seqlens_given) a.cache_seqlens = make_contiguous_view(seqlens_->device_data(), DType::kInt32, dev, {B});
    if (!kc_.leftpad.empty()) a.cache_leftpad = make_contiguous_view(leftpad_->device_data(), DType::kInt32, dev, {B});
    if (kc_.batch_idx) a.cache_batch_idx = make_contiguous_view(bidx_->device_data(), DType::kInt32, dev, {B});
    if (kc_.page_size > 0) {
      a.block_table = make_contiguous_view(table_->device_data(), DType::kInt32, dev, {B, kc_.max_blocks()});
    }
    a.out = make_contiguous_view(out_->device_data(), dt, dev, {B, kc_.seqlen_q, kc_.heads, dv});
    a.lse = make_contiguous_view(lse_->device_data(), DType::kFloat32, dev, {B, kc_.heads, kc_.seqlen_q});
    a.softmax_scale = 0.0f;
    a.causal = kc_.causal;
    a.window_left = kc_.window_left;
    a.window_right = kc_.window_right;
    a.softcap = kc_.softcap;
    if (kc_.alibi) a.alibi_slopes = make_contiguous_view(alibi_->device_data(), DType::kFloat32, dev, {kc_.heads});
    if (!kc_.sink.empty()) {
      a.learnable_sink = make_contiguous_view(sink_->device_data(), DType::kFloat32, dev, {kc_.heads});
    }
    a.num_splits = kc_.num_splits;
    return a;
  }

  KVOutcome run() {
    KVOutcome o;
    o.status = forward_kvcache(args());
    if (!o.status.ok()) return o;
    out_->download();
    lse_->download();
    kcache_->download();
    vcache_->download();
    const int64_t n_out = out_->numel(), n_lse = lse_->numel();
    for (int64_t i = 0; i < n_out; ++i) o.out.push_back(out_->get(i));
    for (int64_t i = 0; i < n_lse; ++i) o.lse.push_back(lse_->get(i));
    o.out_bytes = out_->bytes();
    return o;
  }

  // The cache rows of sequence b, head h (logical row r): arena index of element 0.
  int64_t cache_index(int b, int64_t r, int h, int width) const {
    int64_t r0, r1;
    if (kc_.page_size > 0) {
      r0 = table_host_[b * kc_.max_blocks() + r / kc_.page_size];
      r1 = r % kc_.page_size;
    } else {
      r0 = kc_.batch_idx ? bidx_host_[b] : b;
      r1 = r;
    }
    return ((r0 * rows1_ + r1) * kc_.heads_k + h) * width;
  }

  // Whether logical cache row r of sequence b lies outside the rows the call attends to,
  // [leftpad, cache_seqlens + seqlen_new).
  bool outside(int b, int64_t r) const {
    const int64_t lp = kc_.leftpad.empty() ? 0 : kc_.leftpad[b];
    return r < lp || r >= int64_t(seqlens_host_[b]) + kc_.seqlen_new;
  }

  // Checks out/lse against the fp64 reference and the cache against the expected append.
  void check(const KVOutcome& o) const {
    const int B = kc_.batch(), H = kc_.heads, HK = kc_.heads_k, d = kc_.head_dim,
              dv = kc_.head_dim_v, sq = kc_.seqlen_q;
    const int half = kc_.rotary_dim / 2;
    const bool per_token = kc_.causal || kc_.window_left >= 0 || kc_.window_right >= 0;
    // Expected cache contents after the append: the logical cache with new rows rotated.
    std::vector<double> kexp = klog_, vexp = vlog_;  // (B, capacity, HK, d[v])
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < kc_.seqlen_new; ++t) {
        const int64_t r = seqlens_host_[b] + t;
        for (int h = 0; h < HK; ++h) {
          const int64_t ko = ((int64_t(b) * kc_.capacity + r) * HK + h) * d;
          const int64_t kn = ((int64_t(b) * kc_.seqlen_new + t) * HK + h) * d;
          for (int c = 0; c < d; ++c) kexp[ko + c] = knew_host_[kn + c];
          if (half > 0) {
            rotate_ref(kexp, ko, kc_.rotary_dim, kc_.rotary_interleaved, cos_host_, sin_host_, r);
            for (int c = 0; c < d; ++c) kexp[ko + c] = round_to(kc_.dtype, kexp[ko + c]);
          }
          const int64_t vo = ((int64_t(b) * kc_.capacity + r) * HK + h) * dv;
          const int64_t vn = ((int64_t(b) * kc_.seqlen_new + t) * HK + h) * dv;
          for (int c = 0; c < dv; ++c) vexp[vo + c] = vnew_host_[vn + c];
        }
      }
    }
    // The cache as written: every row the call may touch, compared with the expected one (the
    // rotated rows within 2 units of rounding: ours rotates in float32, the test in float64).
    const double u = unit_roundoff(kc_.dtype);
    int64_t bad = 0;
    for (int b = 0; b < B; ++b) {
      for (int64_t r = 0; r < kc_.capacity; ++r) {
        if (kc_.page_size > 0 && table_host_[b * kc_.max_blocks() + r / kc_.page_size] < 0) continue;
        if (kc_.nan_outside && outside(b, r)) continue;  // NaN before and after
        for (int h = 0; h < HK; ++h) {
          const int64_t ki = cache_index(b, r, h, d), vi = cache_index(b, r, h, dv + kc_.v_row_pad);
          const int64_t ko = ((int64_t(b) * kc_.capacity + r) * HK + h) * d;
          const int64_t vo = ((int64_t(b) * kc_.capacity + r) * HK + h) * dv;
          for (int c = 0; c < d; ++c) {
            const double tol = half > 0 && r >= seqlens_host_[b] ? 4 * u * 2.0 : 0.0;
            if (!(std::abs(kcache_->get(ki + c) - kexp[ko + c]) <= tol)) ++bad;
          }
          for (int c = 0; c < dv; ++c) {
            if (!(vcache_->get(vi + c) == vexp[vo + c])) ++bad;
          }
        }
      }
    }
    EXPECT_EQ(bad, 0) << "cache elements differ from the expected append";
    EXPECT_TRUE(kcache_->padding_untouched("k_cache"));
    EXPECT_TRUE(vcache_->padding_untouched("v_cache"));

    // Reference: q rotated (rounded to the dtype, as stored), keys [leftpad, end) from kexp.
    HostProblem hp;
    hp.shape.batch = B;
    hp.shape.heads = H;
    hp.shape.heads_k = HK;
    hp.shape.head_dim = d;
    hp.shape.head_dim_v = dv;
    hp.shape.cu_seqlens_q = {0};
    hp.shape.cu_seqlens_k = {0};
    for (int b = 0; b < B; ++b) {
      const int64_t lp = kc_.leftpad.empty() ? 0 : kc_.leftpad[b];
      const int64_t end = seqlens_host_[b] + kc_.seqlen_new;
      hp.shape.cu_seqlens_q.push_back(hp.shape.cu_seqlens_q.back() + sq);
      hp.shape.cu_seqlens_k.push_back(hp.shape.cu_seqlens_k.back() + (end - lp));
      for (int t = 0; t < sq; ++t) {
        for (int h = 0; h < H; ++h) {
          const int64_t qo = ((int64_t(b) * sq + t) * H + h) * d;
          const int64_t at = static_cast<int64_t>(hp.q.size());
          hp.q.insert(hp.q.end(), q_host_.begin() + qo, q_host_.begin() + qo + d);
          if (half > 0) {
            rotate_ref(hp.q, at, kc_.rotary_dim, kc_.rotary_interleaved, cos_host_, sin_host_,
                       seqlens_host_[b] + (per_token ? t : 0));
            for (int c = 0; c < d; ++c) hp.q[at + c] = round_to(kc_.dtype, hp.q[at + c]);
          }
        }
      }
      for (int64_t r = lp; r < end; ++r) {
        const int64_t ko = (int64_t(b) * kc_.capacity + r) * HK * d;
        const int64_t vo = (int64_t(b) * kc_.capacity + r) * HK * dv;
        hp.k.insert(hp.k.end(), kexp.begin() + ko, kexp.begin() + ko + HK * d);
        hp.v.insert(hp.v.end(), vexp.begin() + vo, vexp.begin() + vo + HK * dv);
      }
    }
    hp.opt.scale = 1.0 / std::sqrt(static_cast<double>(d));
    hp.opt.window_left = kc_.window_left;
    hp.opt.window_right = kc_.causal ? 0 : kc_.window_right;
    hp.opt.softcap = kc_.softcap;
    if (kc_.alibi) {
      for (int b = 0; b < B; ++b) {
        for (int h = 0; h < H; ++h) hp.opt.alibi.push_back(alibi_host_[h]);
      }
    }
    hp.opt.sink.assign(kc_.sink.begin(), kc_.sink.end());
    const Results ref = run_reference(hp, false);
    std::vector<double> lowp_out, lowp_lse;
    if (kc_.dtype != DType::kFloat32) {
      const Results lowp = run_naive_lowp(hp, kc_.dtype, false);
      lowp_out = lowp.out;
      lowp_lse = lowp.lse;
    }
    // Ours -> reference layout: out (B*sq, H, dv) is the same; lse (B, H, sq) -> (H, B*sq).
    std::vector<double> lse_ref_layout(o.lse.size());
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < H; ++h) {
        for (int t = 0; t < sq; ++t) {
          lse_ref_layout[static_cast<size_t>(h) * B * sq + b * sq + t] =
              o.lse[(static_cast<size_t>(b) * H + h) * sq + t];
        }
      }
    }
    EXPECT_TRUE(meets_criterion("out", kc_.dtype, o.out, ref.out, lowp_out));
    EXPECT_TRUE(meets_criterion("lse", kc_.dtype, lse_ref_layout, ref.lse, lowp_lse));
  }

 private:
  void build() {
    std::mt19937 g(kc_.seed);
    std::mt19937 layout_rng(kc_.seed + 1);  // page and row shuffles: values do not depend on them
    const DType dt = kc_.dtype;
    const Backend be = backend_;
    const int B = kc_.batch(), H = kc_.heads, HK = kc_.heads_k, d = kc_.head_dim,
              dv = kc_.head_dim_v;
    const int64_t cap = kc_.capacity;
    seqlens_host_ = kc_.cache_seqlens;
    if (!kc_.cache_seqlens_given) seqlens_host_.assign(B, kc_.capacity);

    // Physical cache shape: dense (batch_cache, capacity) or paged (num_blocks, page_size).
    if (kc_.page_size > 0) {
      const int mb = kc_.max_blocks();
      rows0_ = int64_t(B) * mb + 3;  // spare pages nobody uses
      rows1_ = kc_.page_size;
      std::vector<int> pages(static_cast<size_t>(rows0_));
      std::iota(pages.begin(), pages.end(), 0);
      if (kc_.shuffle_pages) std::shuffle(pages.begin(), pages.end(), layout_rng);
      table_host_.resize(static_cast<size_t>(B) * mb);
      for (int b = 0; b < B; ++b) {
        for (int i = 0; i < mb; ++i) {
          // Blocks past the last row the call uses hold -1: never dereferenced.
          const int64_t end = seqlens_host_[b] + kc_.seqlen_new;
          table_host_[b * mb + i] = int64_t(i) * kc_.page_size < end ? pages[b * mb + i] : -1;
        }
      }
    } else {
      rows0_ = kc_.batch_idx ? B + 2 : B;
      rows1_ = cap;
      bidx_host_.resize(static_cast<size_t>(rows0_));
      std::iota(bidx_host_.begin(), bidx_host_.end(), 0);
      std::shuffle(bidx_host_.begin(), bidx_host_.end(), layout_rng);
      bidx_host_.resize(B);
    }

    auto fill = [&](std::vector<double>& host, int64_t n) {
      host.resize(static_cast<size_t>(n));
      for (auto& x : host) x = round_to(dt, uniform(g));
    };
    fill(q_host_, int64_t(B) * kc_.seqlen_q * H * d);
    fill(klog_, int64_t(B) * cap * HK * d);
    fill(vlog_, int64_t(B) * cap * HK * dv);
    if (kc_.nan_outside) {
      for (int b = 0; b < B; ++b) {
        for (int64_t r = 0; r < cap; ++r) {
          if (!outside(b, r)) continue;
          std::fill_n(klog_.begin() + ((int64_t(b) * cap + r) * HK) * d, HK * d, std::nan(""));
          std::fill_n(vlog_.begin() + ((int64_t(b) * cap + r) * HK) * dv, HK * dv, std::nan(""));
        }
      }
    }
    fill(knew_host_, int64_t(B) * kc_.seqlen_new * HK * d);
    fill(vnew_host_, int64_t(B) * kc_.seqlen_new * HK * dv);
    const int half = kc_.rotary_dim / 2;
    cos_host_.resize(static_cast<size_t>(cap * half));
    sin_host_.resize(cos_host_.size());
    for (int64_t p = 0; p < cap; ++p) {
      for (int i = 0; i < half; ++i) {
        const double angle = p * std::pow(10000.0, -2.0 * i / std::max(kc_.rotary_dim, 1));
        cos_host_[p * half + i] = round_to(dt, std::cos(angle));
        sin_host_[p * half + i] = round_to(dt, std::sin(angle));
      }
    }

    auto arena = [&](DType t, int64_t n) { return std::make_shared<Arena>(be, t, std::max<int64_t>(n, 1)); };
    q_ = arena(dt, q_host_.size());
    for (size_t i = 0; i < q_host_.size(); ++i) q_->set(i, q_host_[i]);
    kcache_ = arena(dt, rows0_ * rows1_ * HK * d);
    vcache_ = arena(dt, rows0_ * rows1_ * HK * (dv + kc_.v_row_pad));
    // Rows of the logical cache that exist physically: all of them (dense), those on a page
    // (paged). Rows outside [leftpad, end) hold random values the call must not read (it would
    // change the result) and rows past end must not be written except by the append.
    for (int b = 0; b < B; ++b) {
      for (int64_t r = 0; r < cap; ++r) {
        if (kc_.page_size > 0 && table_host_[b * kc_.max_blocks() + r / kc_.page_size] < 0) continue;
        for (int h = 0; h < HK; ++h) {
          const int64_t ki = cache_index(b, r, h, d), vi = cache_index(b, r, h, dv + kc_.v_row_pad);
          const int64_t ko = ((int64_t(b) * cap + r) * HK + h) * d;
          const int64_t vo = ((int64_t(b) * cap + r) * HK + h) * dv;
          for (int c = 0; c < d; ++c) {
            kcache_->set(ki + c, klog_[ko + c]);
            kcache_->mark_covered(ki + c);
          }
          for (int c = 0; c < dv; ++c) {
            vcache_->set(vi + c, vlog_[vo + c]);
            vcache_->mark_covered(vi + c);
          }
        }
      }
    }
    knew_ = arena(dt, knew_host_.size());
    vnew_ = arena(dt, vnew_host_.size());
    for (size_t i = 0; i < knew_host_.size(); ++i) knew_->set(i, knew_host_[i]);
    for (size_t i = 0; i < vnew_host_.size(); ++i) vnew_->set(i, vnew_host_[i]);
    cos_ = arena(dt, cos_host_.size());
    sin_ = arena(dt, sin_host_.size());
    for (size_t i = 0; i < cos_host_.size(); ++i) {
      cos_->set(i, cos_host_[i]);
      sin_->set(i, sin_host_[i]);
    }
    seqlens_ = arena(DType::kInt32, B);
    leftpad_ = arena(DType::kInt32, B);
    bidx_ = arena(DType::kInt32, B);
    for (int b = 0; b < B; ++b) {
      seqlens_->set(b, seqlens_host_[b]);
      leftpad_->set(b, kc_.leftpad.empty() ? 0 : kc_.leftpad[b]);
      bidx_->set(b, kc_.batch_idx ? bidx_host_[b] : b);
    }
    table_ = arena(DType::kInt32, static_cast<int64_t>(table_host_.size()));
    for (size_t i = 0; i < table_host_.size(); ++i) table_->set(i, table_host_[i]);
    alibi_ = arena(DType::kFloat32, H);
    for (int h = 0; h < H; ++h) {
      alibi_host_.push_back(static_cast<float>(0.05 * (h + 1)));
      alibi_->set(h, alibi_host_.back());
    }
    sink_ = arena(DType::kFloat32, H);
    for (size_t h = 0; h < kc_.sink.size(); ++h) sink_->set(static_cast<int64_t>(h), kc_.sink[h]);
    out_ = arena(dt, int64_t(B) * kc_.seqlen_q * H * dv);
    lse_ = arena(DType::kFloat32, int64_t(B) * H * kc_.seqlen_q);
    for (auto* a : {&q_, &kcache_, &vcache_, &knew_, &vnew_, &cos_, &sin_, &seqlens_, &leftpad_,
                    &bidx_, &table_, &alibi_, &sink_, &out_, &lse_}) {
      (*a)->upload();
    }
  }

  Backend backend_;
  KVCase kc_;
  int64_t rows0_ = 0, rows1_ = 0;
  std::vector<int> seqlens_host_, table_host_, bidx_host_;
  std::vector<double> q_host_, klog_, vlog_, knew_host_, vnew_host_, cos_host_, sin_host_;
  std::vector<float> alibi_host_;
  std::shared_ptr<Arena> q_, kcache_, vcache_, knew_, vnew_, cos_, sin_, seqlens_, leftpad_, bidx_,
      table_, alibi_, sink_, out_, lse_;
};

bool cuda_may_not_support(const KVCase& kc) {
  ProblemSpec s;
  s.dtype = kc.dtype;
  s.head_dim = kc.head_dim;
  s.head_dim_v = kc.head_dim_v;
  // Head dims the build did not instantiate run on padded copies of the cache; head_dim_v !=
  // head_dim is NotSupported on CUDA.
  return test::cuda_may_not_support(s) || kc.head_dim != kc.head_dim_v;
}

// Runs the case; returns the outcome, or skipped (no GPU, or a CUDA kNotSupported that the
// build legitimately gives).
KVOutcome run_case(Backend backend, const KVCase& kc, bool check) {
  KVOutcome o;
  if (!backend_available(backend)) {
    o.skipped = true;
    o.skip_reason = "no CUDA device";
    return o;
  }
  KVRun run(backend, kc);
  o = run.run();
  if (!o.status.ok()) {
    if (backend == Backend::kCuda && o.status.code() == StatusCode::kNotSupported && cuda_may_not_support(kc)) {
      o.skipped = true;
      o.skip_reason = o.status.message();
      return o;
    }
    ADD_FAILURE() << "forward_kvcache on " << backend_name(backend) << ": " << o.status.message();
    return o;
  }
  if (check) run.check(o);
  return o;
}

#define KV_RUN_OR_SKIP(var, backend, kc, check)                 \
  const KVOutcome var = run_case(backend, kc, check);           \
  if (var.skipped) GTEST_SKIP() << var.skip_reason;             \
  ASSERT_TRUE(var.status.ok())

class KVCache : public testing::TestWithParam<Backend> {};

TEST_P(KVCache, DecodeDenseNoAppend) {
  KVCase kc;
  kc.cache_seqlens = {37, 1, 96, 50};
  KV_RUN_OR_SKIP(o, GetParam(), kc, true);
}

TEST_P(KVCache, AppendThenAttend) {
  for (bool causal : {false, true}) {
    KVCase kc;
    kc.cache_seqlens = {0, 1, 40, 90};
    kc.seqlen_new = 3;
    kc.seqlen_q = 3;
    kc.causal = causal;
    SCOPED_TRACE(causal ? "causal" : "full");
    KV_RUN_OR_SKIP(o, GetParam(), kc, true);
  }
}

TEST_P(KVCache, CacheSeqlensZeroAndOne) {
  for (int new_tokens : {0, 1}) {
    KVCase kc;
    kc.cache_seqlens = {0, 1, 0};
    kc.seqlen_new = new_tokens;
    kc.seqlen_q = 2;
    kc.causal = true;  // with 0 keys every row is empty: out 0, lse -inf
    SCOPED_TRACE(new_tokens);
    KV_RUN_OR_SKIP(o, GetParam(), kc, true);
  }
}

TEST_P(KVCache, RotaryInterleavedAndHalf) {
  for (bool interleaved : {true, false}) {
    for (int rotary_dim : {128, 32}) {
      for (bool causal : {false, true}) {
        KVCase kc;
        kc.cache_seqlens = {5, 60, 17};
        kc.seqlen_new = 4;
        kc.seqlen_q = 4;
        kc.rotary_dim = rotary_dim;
        kc.rotary_interleaved = interleaved;
        kc.causal = causal;
        SCOPED_TRACE(std::string(interleaved ? "interleaved" : "half") + " rotary_dim " +
                     std::to_string(rotary_dim) + (causal ? " causal" : ""));
        KV_RUN_OR_SKIP(o, GetParam(), kc, true);
      }
    }
  }
}

TEST_P(KVCache, PagedAllPageSizes) {
  for (int page : {1, 16, 64, 256}) {
    KVCase kc;
    kc.capacity = page == 256 ? 512 : 192;
    kc.page_size = page;
    kc.cache_seqlens = {0, 17, 130, 150};
    kc.seqlen_new = 2;
    kc.seqlen_q = 2;
    kc.causal = true;
    kc.rotary_dim = 64;
    SCOPED_TRACE("page size " + std::to_string(page));
    KV_RUN_OR_SKIP(o, GetParam(), kc, true);
  }
}

// Paged and dense caches with the same logical contents give bitwise identical results: the
// kernels read the same rows in the same order.
TEST_P(KVCache, PagedEqualsDenseBitwise) {
  for (int page : {1, 16, 64}) {
    KVCase dense;
    dense.capacity = 192;
    dense.cache_seqlens = {3, 100, 191, 64};
    dense.seqlen_new = 1;
    dense.seqlen_q = 1;
    KVCase paged = dense;
    paged.page_size = page;
    SCOPED_TRACE("page size " + std::to_string(page));
    KV_RUN_OR_SKIP(a, GetParam(), dense, true);
    KV_RUN_OR_SKIP(b, GetParam(), paged, true);
    EXPECT_EQ(a.out_bytes, b.out_bytes);
    EXPECT_EQ(a.lse, b.lse);
  }
}

// Left padding, a dense cache read through cache_batch_idx, rotary, causal, 2 query tokens.
KVCase left_pad_case() {
  KVCase kc;
  kc.cache_seqlens = {40, 10, 80};
  kc.leftpad = {7, 10, 0};
  kc.seqlen_new = 2;
  kc.seqlen_q = 2;
  kc.causal = true;
  kc.rotary_dim = 128;
  kc.batch_idx = true;
  return kc;
}

// Window, softcap and ALiBi with 8 query heads over one KV head, paged, 5 query tokens.
KVCase modifiers_case() {
  KVCase kc;
  kc.cache_seqlens = {70, 33};
  kc.heads = 8;
  kc.heads_k = 1;
  kc.seqlen_new = 5;
  kc.seqlen_q = 5;
  kc.window_left = 20;
  kc.window_right = 0;
  kc.softcap = 15.0f;
  kc.alibi = true;
  kc.page_size = 16;
  return kc;
}

TEST_P(KVCache, LeftPadAndBatchIdx) {
  const KVCase kc = left_pad_case();
  KV_RUN_OR_SKIP(o, GetParam(), kc, true);
  KVCase paged = kc;
  paged.batch_idx = false;
  paged.page_size = 16;
  KV_RUN_OR_SKIP(p, GetParam(), paged, true);
}

TEST_P(KVCache, ModifiersWindowSoftcapAlibiGqa) {
  KV_RUN_OR_SKIP(o, GetParam(), modifiers_case(), true);
}

TEST_P(KVCache, NoCacheSeqlensMeansFullCache) {
  KVCase kc;
  kc.cache_seqlens_given = false;
  kc.cache_seqlens = {0, 0};  // only the batch size counts
  kc.seqlen_q = 16;
  kc.causal = true;
  KV_RUN_OR_SKIP(o, GetParam(), kc, true);
}

TEST_P(KVCache, SplitEqualsUnsplitWithinCriterion) {
  for (int splits : {1, 3, 0}) {
    KVCase kc;
    kc.capacity = 1024;
    kc.page_size = 16;
    kc.cache_seqlens = {1000, 513, 7};
    kc.seqlen_new = 1;
    kc.num_splits = splits;
    SCOPED_TRACE("num_splits " + std::to_string(splits));
    KV_RUN_OR_SKIP(o, GetParam(), kc, true);
  }
}

std::vector<unsigned char> bytes_of(const std::vector<double>& v) {
  std::vector<unsigned char> b(v.size() * sizeof(double));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// The decode kernels merge their split-KV partials themselves: on a Hopper GPU at small grids
// within a thread-block cluster of a row group's splits (at most 8; sm80/fwd_kernel.h
// merge_splits_in_cluster), elsewhere in the last split CTA of each row group
// (merge_if_last_split, which the kSplitCombineCounter switch keeps on Hopper too); the
// kSplitCombineKernel switch merges them with the combine kernel instead. All add the splits in
// split order, so the results are the same bits: dense and paged caches, a sequence without keys
// (all its splits empty) and short ones (most splits empty), sinks, GQA folding, 3, 8 (the
// largest cluster), 16, 36 (more than a warp's 32 lanes) and the heuristic's splits. A second
// call gives the same bits again: the last CTA of every group left its counter at zero.
TEST_P(KVCache, FusedSplitCombineMatchesTheCombineKernelBitwise) {
  if (GetParam() != Backend::kCuda) GTEST_SKIP() << "the split-KV combine is a CUDA path";
  for (int page : {0, 16}) {
    for (int splits : {3, 8, 16, 36, 0}) {
      KVCase kc;
      kc.heads = 32;
      kc.heads_k = 8;
      kc.capacity = 4608;  // 36 key blocks of 128
      kc.page_size = page;
      kc.cache_seqlens = {4500, 0, 130};
      kc.seqlen_new = 1;
      kc.num_splits = splits;
      kc.sink = sink_logits(kc.heads, 93);
      SCOPED_TRACE("page " + std::to_string(page) + ", num_splits " + std::to_string(splits));
      // The default merge whatever FLASHATTN_SPLIT_COMBINE says.
      KVOutcome fused, again;
      unsigned long long ran_clusters = 0;
      {
        ScopedSwitch no_kernel(detail::Switch::kSplitCombineKernel, false);
        ScopedSwitch no_counter(detail::Switch::kSplitCombineCounter, false);
        const unsigned long long clusters = detail::split_cluster_launches();
        fused = run_case(GetParam(), kc, true);
        ran_clusters = detail::split_cluster_launches() - clusters;
        again = run_case(GetParam(), kc, false);
      }
      if (fused.skipped) GTEST_SKIP() << fused.skip_reason;
      ASSERT_TRUE(fused.status.ok()) << fused.status.message();
      ASSERT_TRUE(again.status.ok());
      if (splits == 3 || splits == 8) {
        // One query token: 3 sequences x 8 KV heads row groups (the GQA fold).
        const bool expected = split_clusters_expected(3LL * 8 * splits);
        EXPECT_EQ(ran_clusters, expected ? 1u : 0u) << "the cluster merge " << (expected ? "did not run" : "ran");
      }
      for (detail::Switch sw : {detail::Switch::kSplitCombineKernel, detail::Switch::kSplitCombineCounter}) {
        const bool kernel_switch = sw == detail::Switch::kSplitCombineKernel;
        const char* other = kernel_switch ? "combine kernel" : "counter merge";
        KVOutcome o;
        const unsigned long long before = detail::split_cluster_launches();
        {
          ScopedSwitch path(sw, true);
          o = run_case(GetParam(), kc, true);
        }
        ASSERT_TRUE(o.status.ok());
        EXPECT_EQ(detail::split_cluster_launches(), before) << other << ": the switch did not keep clusters off";
        EXPECT_TRUE(fused.out_bytes == o.out_bytes) << "out: default merge != " << other;
        EXPECT_TRUE(bytes_of(fused.lse) == bytes_of(o.lse)) << "lse: default merge != " << other;
      }
      EXPECT_TRUE(fused.out_bytes == again.out_bytes) << "out: second call differs";
      EXPECT_TRUE(bytes_of(fused.lse) == bytes_of(again.lse)) << "lse: second call differs";
    }
  }
}

TEST_P(KVCache, OtherDtypesAndHeadDims) {
  // A combination the backend declines (float32 on CUDA) is skipped alone, so the others still run.
  int ran = 0;
  std::string skipped;
  for (DType dt : {DType::kFloat32, DType::kFloat16}) {
    for (int d : {64, 40}) {
      KVCase kc;
      kc.dtype = dt;
      kc.head_dim = kc.head_dim_v = d;
      kc.cache_seqlens = {20, 3};
      kc.seqlen_new = 2;
      kc.seqlen_q = 2;
      kc.rotary_dim = d / 2;
      kc.page_size = 16;
      SCOPED_TRACE(std::string(dtype_name(dt)) + " d" + std::to_string(d));
      const KVOutcome o = run_case(GetParam(), kc, true);
      if (o.skipped) {
        skipped += std::string(dtype_name(dt)) + " d" + std::to_string(d) + ": " + o.skip_reason + "; ";
        continue;
      }
      ASSERT_TRUE(o.status.ok());
      ++ran;
    }
  }
  if (ran == 0) GTEST_SKIP() << skipped;
  if (!skipped.empty()) std::cout << "[ partly skipped ] " << skipped << "\n";
}

// ---- learnable sinks ------------------------------------------------------------------------

// Decode with grouped KV heads (32 query heads over 8 KV heads, one query token), paged, with an
// append: the CUDA backend folds each GQA group into the rows of one KV head, so every folded
// row must take its own query head's sink (ForwardParams::sink_fold), in the epilogue (no split)
// and in the split-KV combine. Ragged lengths, causal or not (one query: no key is hidden).
TEST_P(KVCache, LearnableSinkDecodeGqaPagedAppend) {
  for (int splits : {1, 3, 0}) {
    for (bool causal : {false, true}) {
      KVCase kc;
      kc.heads = 32;
      kc.heads_k = 8;
      kc.capacity = 512;
      kc.page_size = 16;
      kc.cache_seqlens = {0, 1, 300, 510};
      kc.seqlen_new = 1;
      kc.causal = causal;
      kc.num_splits = splits;
      kc.sink = sink_logits(kc.heads, 91);
      SCOPED_TRACE("num_splits " + std::to_string(splits) + (causal ? " causal" : ""));
      KV_RUN_OR_SKIP(o, GetParam(), kc, true);
    }
  }
}

// 2-16 query tokens with grouped KV heads (one token: fold_gqa_decode's): the CUDA backend folds
// the (token, query head) pairs of a group into the rows of one KV head's decode tiles
// (ForwardParams::q_fold; one tile up to 16 rows, several beyond), so each row must find its own
// q, out, LSE, mask token and sink, split or not. Groups of 4, 8 and 3, paged and dense, causal, a left window, the append with
// rotary.
TEST_P(KVCache, GqaTokensFoldedIntoRows) {
  struct Shape {
    int heads, heads_k, tokens;
  };
  const bool cuda = GetParam() == Backend::kCuda;
  ScopedSwitch fold_on(detail::Switch::kNoTokenFold, false);
  for (const Shape sh : {Shape{32, 8, 2}, Shape{32, 8, 4}, Shape{16, 2, 2}, Shape{8, 2, 3}, Shape{64, 8, 4},
                         Shape{12, 4, 9}}) {
    for (int splits : {1, 3, 0}) {
      for (int page : {0, 16}) {
        KVCase kc;
        kc.heads = sh.heads;
        kc.heads_k = sh.heads_k;
        kc.seqlen_q = kc.seqlen_new = sh.tokens;
        kc.capacity = 320;
        kc.page_size = page;
        kc.cache_seqlens = {0, 1, 150, 320 - sh.tokens};
        kc.causal = true;
        kc.window_left = splits == 3 ? 40 : -1;
        kc.rotary_dim = page == 16 ? 64 : 0;
        kc.num_splits = splits;
        kc.sink = sink_logits(kc.heads, 95);
        SCOPED_TRACE("heads " + std::to_string(sh.heads) + "/" + std::to_string(sh.heads_k) + ", tokens " +
                     std::to_string(sh.tokens) + ", num_splits " + std::to_string(splits) + ", page " +
                     std::to_string(page));
        const unsigned long long folds = detail::token_fold_calls();
        KV_RUN_OR_SKIP(o, GetParam(), kc, true);
        if (!cuda) continue;
        EXPECT_EQ(detail::token_fold_calls(), folds + 1) << "not folded";
        if (splits == 0) continue;  // the heuristic's count depends on the CTAs per row group
        // The same call with one query head per CTA: the same bits (each row's arithmetic is the
        // same at a fixed split count).
        KVOutcome plain;
        {
          ScopedSwitch off(detail::Switch::kNoTokenFold, true);
          plain = run_case(GetParam(), kc, false);
        }
        ASSERT_TRUE(plain.status.ok());
        EXPECT_EQ(o.out_bytes, plain.out_bytes) << "folded != unfolded (out)";
        EXPECT_EQ(o.lse, plain.lse) << "folded != unfolded (LSE)";
      }
    }
  }
}

// Several query tokens (folded: 2 x 2 rows) with left padding, cache_batch_idx and rotary; then the
// modifiers (window, softcap, ALiBi) with GQA.
TEST_P(KVCache, LearnableSinkWithOtherOptions) {
  KVCase kc = left_pad_case();
  kc.sink = sink_logits(kc.heads, 92);
  KV_RUN_OR_SKIP(o, GetParam(), kc, true);
  KVCase mods = modifiers_case();
  mods.sink = sink_logits(mods.heads, 93);
  KV_RUN_OR_SKIP(m, GetParam(), mods, true);
}

// A sequence with no key to attend to (an empty cache, no append) sees only the sink: out 0 and
// LSE = sink (the reference says so too), -inf for the head without a sink.
TEST_P(KVCache, LearnableSinkEmptySequence) {
  KVCase kc;
  kc.heads = 8;
  kc.heads_k = 2;
  kc.cache_seqlens = {0, 25};
  kc.sink = sink_logits(kc.heads, 94);
  KV_RUN_OR_SKIP(o, GetParam(), kc, true);
  const size_t row = static_cast<size_t>(kc.heads) * kc.head_dim_v;  // sequence 0's outputs
  for (size_t i = 0; i < row; ++i) ASSERT_EQ(o.out[i], 0.0) << "out[0] element " << i;
  EXPECT_EQ(o.lse[1], -std::numeric_limits<double>::infinity()) << "head 1 has no sink";
}

// sink = -inf for every head is exactly no sink, bitwise (out and LSE), on the folded decode
// path (split and not) and on a multi-token causal call.
TEST_P(KVCache, LearnableSinkNegInfEqualsNoSinkBitwise) {
  KVCase decode;
  decode.heads = 32;
  decode.heads_k = 8;
  decode.capacity = 256;
  decode.page_size = 16;
  decode.cache_seqlens = {0, 100, 254};
  decode.seqlen_new = 1;
  KVCase multi;
  multi.cache_seqlens = {0, 1, 40};
  multi.seqlen_new = 3;
  multi.seqlen_q = 3;
  multi.causal = true;
  multi.rotary_dim = 32;
  for (const KVCase& base : {decode, multi}) {
    for (int splits : {1, 2}) {
      KVCase without = base;
      without.num_splits = splits;
      KVCase with = without;
      with.sink.assign(static_cast<size_t>(with.heads), -std::numeric_limits<float>::infinity());
      SCOPED_TRACE("heads " + std::to_string(base.heads) + ", seqlen_q " + std::to_string(base.seqlen_q) +
                   ", num_splits " + std::to_string(splits));
      KV_RUN_OR_SKIP(a, GetParam(), without, true);
      KV_RUN_OR_SKIP(b, GetParam(), with, true);
      EXPECT_EQ(a.out_bytes, b.out_bytes);
      EXPECT_EQ(a.lse, b.lse);  // -inf == -inf; no NaN on either side
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, KVCache, testing::ValuesIn(all_backends()),
                         [](const testing::TestParamInfo<Backend>& param_info) {
                           return std::string(backend_name(param_info.param));
                         });

// CPU and CUDA agree (each already meets the criterion against the reference; here they are
// also compared with each other on the same inputs).
TEST(KVCacheCpuVsCuda, SameInputs) {
  if (!backend_available(Backend::kCuda)) GTEST_SKIP() << "no CUDA device";
  KVCase kc;
  kc.cache_seqlens = {100, 5, 64};
  kc.page_size = 16;
  kc.capacity = 128;
  kc.seqlen_new = 2;
  kc.seqlen_q = 2;
  kc.causal = true;
  kc.rotary_dim = 128;
  const KVOutcome cpu = run_case(Backend::kCpu, kc, true);
  const KVOutcome gpu = run_case(Backend::kCuda, kc, true);
  if (gpu.skipped) GTEST_SKIP() << gpu.skip_reason;
  ASSERT_TRUE(cpu.status.ok() && gpu.status.ok());
  ASSERT_EQ(cpu.out.size(), gpu.out.size());
  double worst = 0.0;
  for (size_t i = 0; i < cpu.out.size(); ++i) worst = std::max(worst, std::abs(cpu.out[i] - gpu.out[i]));
  EXPECT_LE(worst, 8 * unit_roundoff(kc.dtype));
}

// ---- the sm90 cache kernel (prefill shapes on a Hopper GPU) ---------------------------------

// Prefill-shaped calls (at least a 128-row tile of queries per sequence) with the sm90 cache
// kernel switched on, against the fp64 reference: dense and paged caches (page sizes 1 to 256,
// shuffled pages), ragged cache lengths with sequences shorter than the query count (causal rows
// with no key: out 0, lse -inf), an append with rotary, left padding and cache_batch_idx, GQA,
// windows, softcap, ALiBi and sinks, head dims 64 / 128 / 256 and both 16-bit dtypes. Each call
// must have run on the sm90 kernel where sm90_cache_expected(d); the same call with the switch off
// (the sm80 cache kernels) meets the criterion too and agrees with it within the criterion's
// own scale.
struct Sm90CacheCase {
  std::string name;
  KVCase kc;
};

std::vector<Sm90CacheCase> sm90_cache_cases() {
  std::vector<Sm90CacheCase> cases;
  const auto prefill = [](int seqlen_q) {
    KVCase kc;
    kc.num_splits = 1;  // these grids are small: the split heuristic would leave them to sm80
    kc.nan_outside = true;  // rows past each sequence in its last page or cache row: NaN
    kc.seqlen_q = seqlen_q;
    kc.capacity = 512;
    kc.cache_seqlens = {300, 0, 129, 511 - seqlen_q};
    return kc;
  };
  {
    KVCase kc = prefill(128);
    cases.push_back({"dense_full", kc});
    kc.causal = true;
    cases.push_back({"dense_causal", kc});
  }
  for (int page : {1, 16, 64, 256}) {
    KVCase kc = prefill(160);
    kc.page_size = page;
    kc.causal = true;
    kc.seqlen_new = 160;  // append the chunk, then attend to it and the cache before it
    kc.cache_seqlens = {200, 0, 37, 351 - 160 + 1};
    kc.rotary_dim = 64;
    cases.push_back({"paged" + std::to_string(page) + "_append_rotary_causal", kc});
  }
  {
    KVCase kc = prefill(130);
    kc.cache_seqlens = {140, 300, 90};
    kc.leftpad = {7, 0, 90};  // the last sequence attends to the appended rows only
    kc.batch_idx = true;
    kc.seqlen_new = 130;
    kc.causal = true;
    kc.rotary_dim = 128;
    kc.rotary_interleaved = false;
    cases.push_back({"leftpad_batch_idx", kc});
  }
  {
    KVCase kc = prefill(200);
    kc.heads = 8;
    kc.heads_k = 1;
    kc.page_size = 16;
    kc.window_left = 100;
    kc.window_right = 20;
    kc.softcap = 15.0f;
    kc.alibi = true;
    kc.sink = {0.5f, -1.0f, 2.0f, -INFINITY, 0.0f, 1.0f, -0.5f, 3.0f};
    cases.push_back({"gqa_window_softcap_alibi_sink", kc});
  }
  for (int d : {64, 256}) {
    KVCase kc = prefill(192);
    kc.head_dim = kc.head_dim_v = d;
    kc.page_size = 64;
    kc.causal = true;
    cases.push_back({"paged_causal_d" + std::to_string(d), kc});
  }
  {
    KVCase kc = prefill(256);
    kc.dtype = DType::kFloat16;
    kc.page_size = 16;
    cases.push_back({"paged_fp16", kc});
  }
  {
    // More tiles than an H100 / H200 has SMs (4 x 32 x 2 = 256 at d64), so CTAs take a second
    // tile: the K/V ring's slots and phases and the Q slot carried across tiles, tiles without
    // keys (the empty sequence, causal rows past a short one) skipped between others.
    KVCase kc = prefill(256);
    kc.head_dim = kc.head_dim_v = 64;
    kc.heads = 32;
    kc.heads_k = 8;
    kc.capacity = 640;
    kc.cache_seqlens = {600, 0, 100, 383};
    kc.page_size = 16;
    kc.causal = true;
    cases.push_back({"paged_causal_second_tiles", kc});
  }
  {
    // v_cache a view of wider rows (its strides are not k_cache's), dense and paged.
    KVCase kc = prefill(128);
    kc.v_row_pad = 64;
    kc.causal = true;
    cases.push_back({"dense_v_strides", kc});
    kc.page_size = 64;
    kc.seqlen_new = 128;
    kc.cache_seqlens = {200, 0, 37, 255};
    cases.push_back({"paged64_append_v_strides", kc});
  }
  return cases;
}

class KVCacheSm90 : public testing::TestWithParam<size_t> {};

TEST_P(KVCacheSm90, MatchesTheReferenceAndTheSm80Kernels) {
  const Sm90CacheCase c = sm90_cache_cases()[GetParam()];
  SCOPED_TRACE(c.name);
  // The case itself on the CPU backend first (so that it is checked to be a valid call whose
  // reference the CPU meets everywhere, GPU or not).
  const KVOutcome cpu = run_case(Backend::kCpu, c.kc, true);
  ASSERT_TRUE(cpu.status.ok());
  if (!backend_available(Backend::kCuda)) GTEST_SKIP() << "no CUDA device";
  KVOutcome runs[2];
  for (bool sm90 : {false, true}) {
    ScopedSwitch on(detail::Switch::kSm90Cache, sm90);
    const unsigned long long before = detail::sm90_forward_calls();
    runs[sm90] = run_case(Backend::kCuda, c.kc, true);
    if (runs[sm90].skipped) GTEST_SKIP() << runs[sm90].skip_reason;
    ASSERT_TRUE(runs[sm90].status.ok());
    const unsigned long long ran = detail::sm90_forward_calls() - before;
    const bool expected = sm90 && sm90_cache_expected(c.kc.head_dim);
    EXPECT_EQ(ran, expected ? 1u : 0u) << (sm90 ? "switch on" : "switch off");
  }
  ASSERT_EQ(runs[0].out.size(), runs[1].out.size());
  double worst = 0.0;
  for (size_t i = 0; i < runs[0].out.size(); ++i) worst = std::max(worst, std::abs(runs[0].out[i] - runs[1].out[i]));
  EXPECT_LE(worst, 8 * unit_roundoff(c.kc.dtype));
  for (size_t i = 0; i < runs[0].lse.size(); ++i) {
    const double a = runs[0].lse[i], b = runs[1].lse[i];
    if (std::isinf(a) || std::isinf(b)) {
      EXPECT_EQ(a, b) << "lse " << i;  // a row without keys on both paths
    } else {
      EXPECT_NEAR(a, b, 1e-3) << "lse " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, KVCacheSm90, testing::Range<size_t>(0, sm90_cache_cases().size()),
                         [](const testing::TestParamInfo<size_t>& param_info) { return sm90_cache_cases()[param_info.param].name; });

// ---- bad inputs (CPU tensors: every value is checkable on the host) -------------------------

class KVCacheErrors : public testing::Test {
 protected:
  KVCase base() const {
    KVCase kc;
    kc.dtype = DType::kFloat32;
    kc.head_dim = kc.head_dim_v = 16;
    kc.heads = 2;
    kc.heads_k = 1;
    kc.capacity = 32;
    kc.cache_seqlens = {10, 20};
    kc.seqlen_new = 2;
    kc.seqlen_q = 2;
    kc.page_size = 8;
    return kc;
  }
  // Expects kInvalidArgument whose message contains `needle`.
  static void expect_invalid(const Status& s, const std::string& needle) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  }
};

TEST_F(KVCacheErrors, BlockTableOutOfRange) {
  KVRun run(Backend::kCpu, base());
  KVCacheArgs a = run.args();
  static_cast<int32_t*>(a.block_table.data)[1] = 1000;  // sequence 0, block 1 holds rows 8..15
  expect_invalid(forward_kvcache(a), "block_table[0][1] = 1000");
}

TEST_F(KVCacheErrors, CacheTooShortForAppend) {
  KVCase kc = base();
  kc.cache_seqlens = {31, 3};
  kc.page_size = 0;
  KVRun run(Backend::kCpu, kc);
  expect_invalid(forward_kvcache(run.args()), "too short for the append");
}

TEST_F(KVCacheErrors, CacheSeqlensBeyondCache) {
  KVCase kc = base();
  kc.seqlen_new = 0;
  kc.page_size = 0;
  KVRun run(Backend::kCpu, kc);
  KVCacheArgs a = run.args();
  static_cast<int32_t*>(a.cache_seqlens.data)[1] = 33;
  expect_invalid(forward_kvcache(a), "beyond the cache");
  static_cast<int32_t*>(a.cache_seqlens.data)[1] = -1;
  expect_invalid(forward_kvcache(a), "cache_seqlens[1] must be >= 0");
}

TEST_F(KVCacheErrors, PageSizeMismatch) {
  KVRun run(Backend::kCpu, base());
  KVCacheArgs a = run.args();
  a.v_cache.shape[1] = 4;  // v_cache claims pages of 4 rows
  expect_invalid(forward_kvcache(a), "v_cache must match k_cache");
}

TEST_F(KVCacheErrors, OtherArguments) {
  KVRun run(Backend::kCpu, base());
  {
    KVCacheArgs a = run.args();
    a.v = TensorView{};
    expect_invalid(forward_kvcache(a), "k and v (the new tokens) must be given together");
  }
  {
    KVCacheArgs a = run.args();
    a.cache_seqlens = TensorView{};
    expect_invalid(forward_kvcache(a), "need cache_seqlens");
  }
  {
    KVCacheArgs a = run.args();
    a.block_table.shape[0] = 1;
    expect_invalid(forward_kvcache(a), "block_table must have batch 2");
  }
  {
    KVCacheArgs a = run.args();
    a.cache_batch_idx = a.cache_seqlens;
    expect_invalid(forward_kvcache(a), "cache_batch_idx cannot be combined with block_table");
  }
  {
    KVCacheArgs a = run.args();
    a.cache_leftpad = a.cache_seqlens;
    KVCacheArgs b = a;
    int32_t too_far[2] = {11, 0};
    b.cache_leftpad.data = too_far;
    expect_invalid(forward_kvcache(b), "cache_leftpad[0] must be in [0, cache_seqlens[0] = 10]");
  }
  {
    KVCacheArgs a = run.args();
    a.k_cache.dtype = DType::kFloat16;
    a.k_cache.shape[3] = 16;
    EXPECT_FALSE(forward_kvcache(a).ok());
  }
}

// The append writes into the caches: an expanded (stride 0) cache would make rows share memory
// (which write survives is unspecified, a race on a GPU); reading such a cache is fine.
TEST_F(KVCacheErrors, AppendIntoStrideZeroCache) {
  KVRun run(Backend::kCpu, base());
  KVCacheArgs a = run.args();
  a.k_cache.strides[0] = 0;  // every page is page 0
  expect_invalid(forward_kvcache(a), "k_cache is written by the call and must not have stride 0 in dimension 0");
  a = run.args();
  a.v_cache.strides[1] = 0;  // every row of a page is its row 0
  expect_invalid(forward_kvcache(a), "v_cache is written by the call and must not have stride 0 in dimension 1");
  a.k = a.v = TensorView{};  // no append: the caches are only read
  EXPECT_TRUE(forward_kvcache(a).ok()) << forward_kvcache(a).message();
}

TEST_F(KVCacheErrors, RotaryArguments) {
  KVCase kc = base();
  kc.rotary_dim = 8;
  KVRun run(Backend::kCpu, kc);
  {
    KVCacheArgs a = run.args();
    a.rotary_sin = TensorView{};
    expect_invalid(forward_kvcache(a), "rotary_cos and rotary_sin must be given together");
  }
  {
    KVCacheArgs a = run.args();
    a.rotary_cos.shape[0] = a.rotary_sin.shape[0] = 20;
    expect_invalid(forward_kvcache(a), "at least as many positions");
  }
  {
    KVCacheArgs a = run.args();
    a.k = a.v = TensorView{};
    expect_invalid(forward_kvcache(a), "rotary_cos/rotary_sin need k and v");
  }
  {
    KVCacheArgs a = run.args();
    a.rotary_cos.shape[1] = a.rotary_sin.shape[1] = 9;
    a.rotary_cos.strides[0] = a.rotary_sin.strides[0] = 9;
    expect_invalid(forward_kvcache(a), "rotary_dim");
  }
}

TEST_F(KVCacheErrors, LearnableSinkIsChecked) {
  KVRun run(Backend::kCpu, base());  // 2 query heads
  float sink[3] = {0.5f, 1.0f, 2.0f};
  uint16_t half_sink[2] = {0, 0};
  KVCacheArgs a = run.args();
  a.learnable_sink = make_contiguous_view(sink, DType::kFloat32, Device{}, {3});
  expect_invalid(forward_kvcache(a), "learnable_sink must have shape (2)");
  a.learnable_sink = make_contiguous_view(sink, DType::kFloat32, Device{}, {1, 2});
  expect_invalid(forward_kvcache(a), "learnable_sink must have 1 dimensions");
  a.learnable_sink = make_contiguous_view(half_sink, DType::kFloat16, Device{}, {2});
  expect_invalid(forward_kvcache(a), "learnable_sink must have dtype float32");
  a.learnable_sink = make_contiguous_view(sink, DType::kFloat32, Device{DeviceType::kCUDA, 0}, {2});
  expect_invalid(forward_kvcache(a), "learnable_sink is on cuda:0");
}

// The C struct of a forward_kvcache call (the fields KVRun sets).
flashattn_kvcache_args c_kvcache_args(const KVCacheArgs& a) {
  flashattn_kvcache_args c;
  flashattn_kvcache_args_init(&c);
  c.q = to_c(a.q);
  c.k_cache = to_c(a.k_cache);
  c.v_cache = to_c(a.v_cache);
  c.k = to_c(a.k);
  c.v = to_c(a.v);
  c.cache_seqlens = to_c(a.cache_seqlens);
  c.block_table = to_c(a.block_table);
  c.out = to_c(a.out);
  c.lse = to_c(a.lse);
  c.learnable_sink = to_c(a.learnable_sink);
  return c;
}

std::vector<unsigned char> out_bytes_of(const KVCacheArgs& a, size_t n) {
  std::vector<unsigned char> got(n);
  std::memcpy(got.data(), a.out.data, n);
  return got;
}

TEST(KVCacheCApi, RunsAndReportsErrors) {
  KVCase kc;
  kc.dtype = DType::kFloat32;
  kc.head_dim = kc.head_dim_v = 32;
  kc.cache_seqlens = {5};
  kc.seqlen_new = 1;
  KVRun run(Backend::kCpu, kc);
  const KVCacheArgs a = run.args();
  flashattn_kvcache_args c;
  flashattn_kvcache_args_init(&c);
  EXPECT_EQ(c.struct_size, sizeof(c));
  EXPECT_EQ(c.window_left, -1);
  EXPECT_EQ(c.rotary_interleaved, 1);
  EXPECT_EQ(c.learnable_sink.ndim, 0);
  c = c_kvcache_args(a);
  ASSERT_EQ(flashattn_forward_kvcache(&c), FLASHATTN_OK) << flashattn_last_error();
  const KVOutcome o = [&] {
    KVRun again(Backend::kCpu, kc);  // same seed: same inputs
    return again.run();
  }();
  ASSERT_TRUE(o.status.ok());
  EXPECT_EQ(out_bytes_of(a, o.out_bytes.size()), o.out_bytes);
  c.v = flashattn_tensor{};
  EXPECT_EQ(flashattn_forward_kvcache(&c), FLASHATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashattn_last_error()).find("must be given together"), std::string::npos);
}

// learnable_sink crosses the C boundary (the result equals the C++ API's bitwise); a caller of
// the first published layout (struct_size ending before learnable_sink) is accepted and the
// field is not read; any other size is refused.
TEST(KVCacheCApi, LearnableSinkAndFirstLayout) {
  KVCase kc;
  kc.dtype = DType::kFloat32;
  kc.head_dim = kc.head_dim_v = 32;
  kc.heads = 8;
  kc.heads_k = 2;
  kc.cache_seqlens = {5, 0, 17};
  kc.seqlen_new = 1;
  kc.page_size = 4;
  kc.capacity = 32;
  kc.sink = sink_logits(kc.heads, 95);
  KVCase plain = kc;
  plain.sink.clear();
  auto cpp_outcome = [](const KVCase& c) {
    KVRun r(Backend::kCpu, c);
    return r.run();
  };
  const KVOutcome with = cpp_outcome(kc), without = cpp_outcome(plain);
  ASSERT_TRUE(with.status.ok() && without.status.ok());
  ASSERT_NE(with.out_bytes, without.out_bytes);

  KVRun run(Backend::kCpu, kc);  // same seed: same inputs
  const KVCacheArgs a = run.args();
  flashattn_kvcache_args c = c_kvcache_args(a);
  ASSERT_EQ(flashattn_forward_kvcache(&c), FLASHATTN_OK) << flashattn_last_error();
  EXPECT_EQ(out_bytes_of(a, with.out_bytes.size()), with.out_bytes);

  KVRun old_run(Backend::kCpu, kc);  // fresh caches: the append above has changed run's
  const KVCacheArgs old_args = old_run.args();
  flashattn_kvcache_args old = c_kvcache_args(old_args);
  std::memset(&old.learnable_sink, 0x5a, sizeof(old.learnable_sink));  // not the caller's memory
  old.struct_size = offsetof(flashattn_kvcache_args, learnable_sink);
  ASSERT_EQ(flashattn_forward_kvcache(&old), FLASHATTN_OK) << flashattn_last_error();
  EXPECT_EQ(out_bytes_of(old_args, without.out_bytes.size()), without.out_bytes);

  old.struct_size = offsetof(flashattn_kvcache_args, learnable_sink) + 8;
  EXPECT_EQ(flashattn_forward_kvcache(&old), FLASHATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashattn_last_error()).find("struct_size"), std::string::npos)
      << flashattn_last_error();
}

// A cache without rows (dense seqlen_cache 0 or batch_cache 0, paged without pages) resolves to
// capacity 0, so that no clamp aims at row, cache row or page -1, and turns rotary off (no key
// to attend to or append: q's rotation changes nothing, and its position would be -1). The
// resolved parameters are what a device-side value meets (the host checks only CPU values).
TEST(KVCacheParamsTest, NoRowsMeansCapacityZeroAndNoRotary) {
  const int64_t d = 32, half = 8;
  std::vector<float> q(d), out(d), rot(4 * half), none(1);
  std::vector<int32_t> seqlens{0}, table{-1, -1}, bidx{0};
  const Device cuda{DeviceType::kCUDA, 0};  // values unchecked, as for device tensors
  const auto view = [&](void* p, DType dt, std::initializer_list<int64_t> shape) {
    return make_contiguous_view(p, dt, cuda, shape);
  };
  struct Layout {
    const char* name;
    std::vector<int64_t> cache_shape;
    bool paged, batch_idx;
  } layouts[] = {{"dense, seqlen_cache 0", {1, 0, 1, d}, false, false},
                 {"dense, batch_cache 0, cache_batch_idx", {0, 4, 1, d}, false, true},
                 {"paged, no pages", {0, 2, 1, d}, true, false}};
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.name);
    KVCacheArgs a;
    a.q = view(q.data(), DType::kFloat32, {1, 1, 1, d});
    a.out = view(out.data(), DType::kFloat32, {1, 1, 1, d});
    // An empty tensor's pointer, as torch exports it: null.
    TensorView c = make_contiguous_view(nullptr, DType::kFloat32, cuda, {1, 1, 1, d});
    c.ndim = 4;
    for (int i = 0; i < 4; ++i) c.shape[i] = l.cache_shape[i];
    a.k_cache = a.v_cache = c;
    a.k = a.v = view(none.data(), DType::kFloat32, {1, 0, 1, d});
    a.cache_seqlens = view(seqlens.data(), DType::kInt32, {1});
    if (l.paged) a.block_table = view(table.data(), DType::kInt32, {1, 2});
    if (l.batch_idx) a.cache_batch_idx = view(bidx.data(), DType::kInt32, {1});
    a.rotary_cos = a.rotary_sin = view(rot.data(), DType::kFloat32, {4, half});
    ForwardParams p;
    const Status s = make_kvcache_params(a, &p);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(p.kv.capacity, 0);
    EXPECT_EQ(p.kv.rotary_dim, 0);
    EXPECT_EQ(p.kv.end(0), 0);
  }
}

}  // namespace
}  // namespace flashattn::test
