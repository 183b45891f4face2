// MLA decode (DeepSeek-V3: head_dim 576, head_dim_v 512, one latent KV head) through
// forward_kvcache on every backend, against the float64 reference and the CPU backend: ragged
// cache lengths, dense and paged caches (page sizes 1..256, shuffled pages), causal and not,
// seqlen_q 1 / 2 / 16, 16 and 128 query heads over one KV head and a GQA case over two, the
// shared latent cache (v_cache = k_cache[..., :512], a view) and a separate v_cache, the append
// into either, learnable sinks (-inf = no sink, bitwise), forced split counts, LSE; and the
// arguments the CUDA MLA kernel declines, each named. Without a GPU the CUDA cases skip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"

namespace flashattn::test {
namespace {

constexpr int kD = 576;   // q and k
constexpr int kDv = 512;  // v: the first 512 columns of the latent cache

struct MlaCase {
  DType dtype = DType::kBFloat16;
  std::vector<int> cache_seqlens{37};  // per sequence: rows already in the cache
  std::vector<int> leftpad;            // per sequence: first cache row attended to; empty = 0
  int seqlen_q = 1;
  int seqlen_new = 0;  // 0 = no k/v appended
  int heads = 16;
  int heads_k = 1;
  int capacity = 128;  // rows per sequence (dense seqlen_cache, or max_blocks * page_size)
  int page_size = 0;   // 0 = dense cache
  // v_cache = k_cache[..., :512] (and v = k[..., :512] for the append): the shared latent cache.
  bool latent = true;
  bool causal = false;
  int rotary_dim = 0;  // separate caches only (the latent cache declines rotary on CUDA)
  int num_splits = 0;
  std::vector<float> sink;  // (heads); empty = none
  uint32_t seed = 11;

  int batch() const { return static_cast<int>(cache_seqlens.size()); }
  int max_blocks() const { return page_size > 0 ? capacity / page_size : 0; }
};

struct MlaOutcome {
  bool skipped = false;
  std::string skip_reason;
  Status status;
  std::vector<double> out, lse;  // out (batch, seqlen_q, heads, 512); lse (batch, heads, seqlen_q)
  std::vector<unsigned char> out_bytes;
};

double uniform(std::mt19937& g) { return std::uniform_real_distribution<double>(-1.0, 1.0)(g); }

// Pair (a, b) of x[off..] at table row pos -> (a c - b s, a s + b c), non-interleaved halves.
void rotate_ref(std::vector<double>& x, int64_t off, int rotary_dim, const std::vector<double>& cos,
                const std::vector<double>& sin, int64_t pos) {
  const int half = rotary_dim / 2;
  for (int i = 0; i < half; ++i) {
    const double c = cos[pos * half + i], s = sin[pos * half + i];
    const double a = x[off + i], b = x[off + i + half];
    x[off + i] = a * c - b * s;
    x[off + i + half] = a * s + b * c;
  }
}

// One call's tensors on a backend. The logical cache is (batch, capacity, heads_k, 576) (klog_)
// and, when separate, (batch, capacity, heads_k, 512) (vlog_); latent: V is klog_'s first 512
// columns. Rows past each sequence's end hold NaN-free random values the call must not read.
class MlaRun {
 public:
  MlaRun(Backend backend, const MlaCase& mc) : backend_(backend), mc_(mc) { build(); }

  KVCacheArgs args() const {
    const Device dev = device_of(backend_);
    const DType dt = mc_.dtype;
    const int64_t B = mc_.batch(), hk = mc_.heads_k;
    KVCacheArgs a;
    a.q = make_contiguous_view(q_->device_data(), dt, dev, {B, mc_.seqlen_q, mc_.heads, kD});
    a.k_cache = make_contiguous_view(kcache_->device_data(), dt, dev, {rows0_, rows1_, hk, kD});
    if (mc_.latent) {
      a.v_cache = a.k_cache;  // k_cache[..., :512]: the same pointer and strides
      a.v_cache.shape[3] = kDv;
    } else {
      a.v_cache = make_contiguous_view(vcache_->device_data(), dt, dev, {rows0_, rows1_, hk, kDv});
    }
    if (mc_.seqlen_new > 0) {
      a.k = make_contiguous_view(knew_->device_data(), dt, dev, {B, mc_.seqlen_new, hk, kD});
      if (mc_.latent) {
        a.v = a.k;  // k[..., :512]
        a.v.shape[3] = kDv;
      } else {
        a.v = make_contiguous_view(vnew_->device_data(), dt, dev, {B, mc_.seqlen_new, hk, kDv});
      }
    }
    if (mc_.rotary_dim > 0) {
      a.rotary_cos = make_contiguous_view(cos_->device_data(), dt, dev, {mc_.capacity, mc_.rotary_dim / 2});
      a.rotary_sin = make_contiguous_view(sin_->device_data(), dt, dev, {mc_.capacity, mc_.rotary_dim / 2});
      a.rotary_interleaved = false;
    }
    a.cache_seqlens = make_contiguous_view(seqlens_->device_data(), DType::kInt32, dev, {B});
    if (!mc_.leftpad.empty()) a.cache_leftpad = make_contiguous_view(leftpad_->device_data(), DType::kInt32, dev, {B});
    if (mc_.page_size > 0) {
      a.block_table = make_contiguous_view(table_->device_data(), DType::kInt32, dev, {B, mc_.max_blocks()});
    }
    a.out = make_contiguous_view(out_->device_data(), dt, dev, {B, mc_.seqlen_q, mc_.heads, kDv});
    a.lse = make_contiguous_view(lse_->device_data(), DType::kFloat32, dev, {B, mc_.heads, mc_.seqlen_q});
    a.causal = mc_.causal;
    if (!mc_.sink.empty()) {
      a.learnable_sink = make_contiguous_view(sink_->device_data(), DType::kFloat32, dev, {mc_.heads});
    }
    a.num_splits = mc_.num_splits;
    return a;
  }

  MlaOutcome run() {
    MlaOutcome o;
    o.status = forward_kvcache(args());
    if (!o.status.ok()) return o;
    out_->download();
    lse_->download();
    kcache_->download();
    if (vcache_) vcache_->download();
    for (int64_t i = 0; i < out_->numel(); ++i) o.out.push_back(out_->get(i));
    for (int64_t i = 0; i < lse_->numel(); ++i) o.lse.push_back(lse_->get(i));
    o.out_bytes = out_->bytes();
    return o;
  }

  // Arena index of element 0 of logical cache row r of sequence b, KV head h (width w).
  int64_t cache_index(int b, int64_t r, int h, int w) const {
    const int64_t r0 = mc_.page_size > 0 ? table_host_[b * mc_.max_blocks() + r / mc_.page_size] : b;
    const int64_t r1 = mc_.page_size > 0 ? r % mc_.page_size : r;
    return ((r0 * rows1_ + r1) * mc_.heads_k + h) * w;
  }
  bool row_exists(int b, int64_t r) const {
    return mc_.page_size == 0 || table_host_[b * mc_.max_blocks() + r / mc_.page_size] >= 0;
  }
  double v_cache_at(int b, int64_t r, int h, int c) const {
    return mc_.latent ? kcache_->get(cache_index(b, r, h, kD) + c) : vcache_->get(cache_index(b, r, h, kDv) + c);
  }

  // Checks the cache against the expected append, and out / LSE against the float64 reference.
  void check(const MlaOutcome& o) const {
    const int B = mc_.batch(), H = mc_.heads, HK = mc_.heads_k, sq = mc_.seqlen_q;
    const int half = mc_.rotary_dim / 2;
    // Expected logical cache after the append (new keys rotated when rotary is on).
    std::vector<double> kexp = klog_, vexp = vlog_;
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < mc_.seqlen_new; ++t) {
        const int64_t r = seqlens_host_[b] + t;
        for (int h = 0; h < HK; ++h) {
          const int64_t ko = ((int64_t(b) * mc_.capacity + r) * HK + h) * kD;
          const int64_t kn = ((int64_t(b) * mc_.seqlen_new + t) * HK + h) * kD;
          for (int c = 0; c < kD; ++c) kexp[ko + c] = knew_host_[kn + c];
          if (half > 0) {
            rotate_ref(kexp, ko, mc_.rotary_dim, cos_host_, sin_host_, r);
            for (int c = 0; c < kD; ++c) kexp[ko + c] = round_to(mc_.dtype, kexp[ko + c]);
          }
          if (!mc_.latent) {
            const int64_t vo = ((int64_t(b) * mc_.capacity + r) * HK + h) * kDv;
            const int64_t vn = ((int64_t(b) * mc_.seqlen_new + t) * HK + h) * kDv;
            for (int c = 0; c < kDv; ++c) vexp[vo + c] = vnew_host_[vn + c];
          }
        }
      }
    }
    const auto v_exp = [&](int b, int64_t r, int h, int c) {
      return mc_.latent ? kexp[((int64_t(b) * mc_.capacity + r) * HK + h) * kD + c]
                        : vexp[((int64_t(b) * mc_.capacity + r) * HK + h) * kDv + c];
    };
    const double u = unit_roundoff(mc_.dtype);
    int64_t bad = 0;
    for (int b = 0; b < B; ++b) {
      for (int64_t r = 0; r < mc_.capacity; ++r) {
        if (!row_exists(b, r)) continue;
        for (int h = 0; h < HK; ++h) {
          const int64_t ki = cache_index(b, r, h, kD), ko = ((int64_t(b) * mc_.capacity + r) * HK + h) * kD;
          const double tol = half > 0 && r >= seqlens_host_[b] ? 8 * u : 0.0;  // float32 vs float64 rotary
          for (int c = 0; c < kD; ++c) {
            if (!(std::abs(kcache_->get(ki + c) - kexp[ko + c]) <= tol)) ++bad;
          }
          for (int c = 0; c < kDv; ++c) {
            if (!(std::abs(v_cache_at(b, r, h, c) - v_exp(b, r, h, c)) <= tol)) ++bad;
          }
        }
      }
    }
    EXPECT_EQ(bad, 0) << "cache elements differ from the expected append";

    HostProblem hp;
    hp.shape.batch = B;
    hp.shape.heads = H;
    hp.shape.heads_k = HK;
    hp.shape.head_dim = kD;
    hp.shape.head_dim_v = kDv;
    hp.shape.cu_seqlens_q = {0};
    hp.shape.cu_seqlens_k = {0};
    for (int b = 0; b < B; ++b) {
      const int64_t end = seqlens_host_[b] + mc_.seqlen_new;
      const int64_t first = mc_.leftpad.empty() ? 0 : mc_.leftpad[b];
      hp.shape.cu_seqlens_q.push_back(hp.shape.cu_seqlens_q.back() + sq);
      hp.shape.cu_seqlens_k.push_back(hp.shape.cu_seqlens_k.back() + (end - first));
      for (int t = 0; t < sq; ++t) {
        for (int h = 0; h < H; ++h) {
          const int64_t qo = ((int64_t(b) * sq + t) * H + h) * kD;
          const int64_t at = static_cast<int64_t>(hp.q.size());
          hp.q.insert(hp.q.end(), q_host_.begin() + qo, q_host_.begin() + qo + kD);
          if (half > 0) {
            rotate_ref(hp.q, at, mc_.rotary_dim, cos_host_, sin_host_, seqlens_host_[b] + (mc_.causal ? t : 0));
            for (int c = 0; c < kD; ++c) hp.q[at + c] = round_to(mc_.dtype, hp.q[at + c]);
          }
        }
      }
      for (int64_t r = first; r < end; ++r) {
        for (int h = 0; h < HK; ++h) {
          const int64_t ko = ((int64_t(b) * mc_.capacity + r) * HK + h) * kD;
          hp.k.insert(hp.k.end(), kexp.begin() + ko, kexp.begin() + ko + kD);
          for (int c = 0; c < kDv; ++c) hp.v.push_back(v_exp(b, r, h, c));
        }
      }
    }
    hp.opt.scale = 1.0 / std::sqrt(static_cast<double>(kD));
    hp.opt.window_right = mc_.causal ? 0 : -1;
    hp.opt.sink.assign(mc_.sink.begin(), mc_.sink.end());
    const Results ref = run_reference(hp, false);
    const Results lowp = run_naive_lowp(hp, mc_.dtype, false);
    // lse (B, H, sq) -> the reference's (H, B * sq).
    std::vector<double> lse(o.lse.size());
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < sq; ++t) lse[(size_t(h) * B + b) * sq + t] = o.lse[(size_t(b) * H + h) * sq + t];
    EXPECT_TRUE(meets_criterion("out", mc_.dtype, o.out, ref.out, lowp.out));
    EXPECT_TRUE(meets_criterion("lse", mc_.dtype, lse, ref.lse, lowp.lse));
  }

 private:
  void build() {
    std::mt19937 g(mc_.seed);
    std::mt19937 layout_rng(mc_.seed + 1);
    const DType dt = mc_.dtype;
    const int B = mc_.batch(), H = mc_.heads, HK = mc_.heads_k;
    const int64_t cap = mc_.capacity;
    seqlens_host_ = mc_.cache_seqlens;
    if (mc_.page_size > 0) {
      const int mb = mc_.max_blocks();
      rows0_ = int64_t(B) * mb + 3;  // spare pages nobody uses
      rows1_ = mc_.page_size;
      std::vector<int> pages(static_cast<size_t>(rows0_));
      std::iota(pages.begin(), pages.end(), 0);
      std::shuffle(pages.begin(), pages.end(), layout_rng);
      table_host_.resize(static_cast<size_t>(B) * mb);
      for (int b = 0; b < B; ++b) {
        const int64_t end = seqlens_host_[b] + mc_.seqlen_new;
        for (int i = 0; i < mb; ++i) table_host_[b * mb + i] = int64_t(i) * mc_.page_size < end ? pages[b * mb + i] : -1;
      }
    } else {
      rows0_ = B;
      rows1_ = cap;
    }
    const auto fill = [&](std::vector<double>& host, int64_t n) {
      host.resize(static_cast<size_t>(n));
      for (auto& x : host) x = round_to(dt, uniform(g));
    };
    fill(q_host_, int64_t(B) * mc_.seqlen_q * H * kD);
    fill(klog_, int64_t(B) * cap * HK * kD);
    if (!mc_.latent) fill(vlog_, int64_t(B) * cap * HK * kDv);
    fill(knew_host_, int64_t(B) * mc_.seqlen_new * HK * kD);
    if (!mc_.latent) fill(vnew_host_, int64_t(B) * mc_.seqlen_new * HK * kDv);
    const int half = mc_.rotary_dim / 2;
    for (int64_t p = 0; p < cap; ++p) {
      for (int i = 0; i < half; ++i) {
        const double angle = p * std::pow(10000.0, -2.0 * i / mc_.rotary_dim);
        cos_host_.push_back(round_to(dt, std::cos(angle)));
        sin_host_.push_back(round_to(dt, std::sin(angle)));
      }
    }
    const auto arena = [&](DType t, int64_t n) { return std::make_shared<Arena>(backend_, t, std::max<int64_t>(n, 1)); };
    q_ = arena(dt, static_cast<int64_t>(q_host_.size()));
    for (size_t i = 0; i < q_host_.size(); ++i) q_->set(static_cast<int64_t>(i), q_host_[i]);
    kcache_ = arena(dt, rows0_ * rows1_ * HK * kD);
    if (!mc_.latent) vcache_ = arena(dt, rows0_ * rows1_ * HK * kDv);
    for (int b = 0; b < B; ++b) {
      for (int64_t r = 0; r < cap; ++r) {
        if (!row_exists(b, r)) continue;
        for (int h = 0; h < HK; ++h) {
          const int64_t ki = cache_index(b, r, h, kD), ko = ((int64_t(b) * cap + r) * HK + h) * kD;
          for (int c = 0; c < kD; ++c) kcache_->set(ki + c, klog_[ko + c]);
          if (mc_.latent) continue;
          const int64_t vi = cache_index(b, r, h, kDv), vo = ((int64_t(b) * cap + r) * HK + h) * kDv;
          for (int c = 0; c < kDv; ++c) vcache_->set(vi + c, vlog_[vo + c]);
        }
      }
    }
    knew_ = arena(dt, static_cast<int64_t>(knew_host_.size()));
    for (size_t i = 0; i < knew_host_.size(); ++i) knew_->set(static_cast<int64_t>(i), knew_host_[i]);
    vnew_ = arena(dt, static_cast<int64_t>(vnew_host_.size()));
    for (size_t i = 0; i < vnew_host_.size(); ++i) vnew_->set(static_cast<int64_t>(i), vnew_host_[i]);
    cos_ = arena(dt, static_cast<int64_t>(cos_host_.size()));
    sin_ = arena(dt, static_cast<int64_t>(sin_host_.size()));
    for (size_t i = 0; i < cos_host_.size(); ++i) {
      cos_->set(static_cast<int64_t>(i), cos_host_[i]);
      sin_->set(static_cast<int64_t>(i), sin_host_[i]);
    }
    seqlens_ = arena(DType::kInt32, B);
    for (int b = 0; b < B; ++b) seqlens_->set(b, seqlens_host_[b]);
    leftpad_ = arena(DType::kInt32, B);
    for (int b = 0; b < B; ++b) leftpad_->set(b, mc_.leftpad.empty() ? 0 : mc_.leftpad[b]);
    table_ = arena(DType::kInt32, static_cast<int64_t>(table_host_.size()));
    for (size_t i = 0; i < table_host_.size(); ++i) table_->set(static_cast<int64_t>(i), table_host_[i]);
    sink_ = arena(DType::kFloat32, H);
    for (size_t h = 0; h < mc_.sink.size(); ++h) sink_->set(static_cast<int64_t>(h), mc_.sink[h]);
    out_ = arena(dt, int64_t(B) * mc_.seqlen_q * H * kDv);
    lse_ = arena(DType::kFloat32, int64_t(B) * H * mc_.seqlen_q);
    for (const auto& a : {q_, kcache_, vcache_, knew_, vnew_, cos_, sin_, seqlens_, leftpad_, table_, sink_, out_, lse_}) {
      if (a) a->upload();
    }
  }

  Backend backend_;
  MlaCase mc_;
  int64_t rows0_ = 0, rows1_ = 0;
  std::vector<int> seqlens_host_, table_host_;
  std::vector<double> q_host_, klog_, vlog_, knew_host_, vnew_host_, cos_host_, sin_host_;
  std::shared_ptr<Arena> q_, kcache_, vcache_, knew_, vnew_, cos_, sin_, seqlens_, leftpad_, table_, sink_, out_,
      lse_;
};

// A CUDA build trimmed without the MLA kernel (FLASHATTN_CUDA_HEAD_DIMS without 576) or the
// case's dtype says so; such a case is skipped, any other kNotSupported fails.
bool not_built(const Status& s) {
  return s.code() == StatusCode::kNotSupported && s.message().find("was not built into this flashattn") != std::string::npos;
}

MlaOutcome run_case(Backend backend, const MlaCase& mc, bool check = true) {
  MlaOutcome o;
  if (!backend_available(backend)) {
    o.skipped = true;
    o.skip_reason = "no CUDA device";
    return o;
  }
  MlaRun run(backend, mc);
  o = run.run();
  if (!o.status.ok()) {
    if (backend == Backend::kCuda && not_built(o.status)) {
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

#define MLA_RUN_OR_SKIP(var, backend, mc)                \
  const MlaOutcome var = run_case(backend, mc);          \
  if (var.skipped) GTEST_SKIP() << var.skip_reason;      \
  ASSERT_TRUE(var.status.ok())

class Mla : public testing::TestWithParam<Backend> {};

// The ragged lengths around the kernel's 64-key tiles, dense and paged (shuffled pages).
TEST_P(Mla, RaggedDenseAndPaged) {
  for (int page : {0, 1, 16, 64, 256}) {
    MlaCase mc;
    mc.cache_seqlens = {1, 7, 63, 64, 65, 1000, 4097};
    mc.capacity = 4352;  // 17 pages of 256
    mc.page_size = page;
    SCOPED_TRACE("page size " + std::to_string(page));
    MLA_RUN_OR_SKIP(o, GetParam(), mc);
  }
}

TEST_P(Mla, CausalAndSeqlenQ) {
  for (int sq : {1, 2, 16}) {
    for (bool causal : {false, true}) {
      for (int page : {0, 64}) {
        MlaCase mc;
        mc.cache_seqlens = {1, 7, 65, 300};
        mc.capacity = 384;
        mc.page_size = page;
        mc.seqlen_q = sq;
        mc.causal = causal;
        SCOPED_TRACE("seqlen_q " + std::to_string(sq) + (causal ? " causal" : "") + " page " + std::to_string(page));
        MLA_RUN_OR_SKIP(o, GetParam(), mc);
      }
    }
  }
}

TEST_P(Mla, Heads128) {
  for (int sq : {1, 2}) {
    MlaCase mc;
    mc.heads = 128;
    mc.cache_seqlens = {5, 130, 700};
    mc.capacity = 768;
    mc.page_size = 64;
    mc.seqlen_q = sq;
    mc.causal = sq > 1;
    SCOPED_TRACE("seqlen_q " + std::to_string(sq));
    MLA_RUN_OR_SKIP(o, GetParam(), mc);
  }
}

// Two KV heads of 8 query heads each; 3 query tokens make 24 rows: a 32-row block, part empty.
TEST_P(Mla, GqaTwoKVHeads) {
  for (bool latent : {true, false}) {
    for (int sq : {2, 3}) {
      MlaCase mc;
      mc.heads = 16;
      mc.heads_k = 2;
      mc.cache_seqlens = {33, 200, 64};
      mc.capacity = 256;
      mc.page_size = 16;
      mc.seqlen_q = sq;
      mc.causal = true;
      mc.latent = latent;
      mc.sink = sink_logits(mc.heads, 4);
      SCOPED_TRACE(std::string(latent ? "latent" : "separate v_cache") + " seqlen_q " + std::to_string(sq));
      MLA_RUN_OR_SKIP(o, GetParam(), mc);
    }
  }
}

TEST_P(Mla, SeparateVCache) {
  for (int page : {0, 16}) {
    MlaCase mc;
    mc.latent = false;
    mc.cache_seqlens = {1, 64, 65, 500};
    mc.capacity = 512;
    mc.page_size = page;
    mc.seqlen_q = 2;
    mc.causal = true;
    SCOPED_TRACE("page " + std::to_string(page));
    MLA_RUN_OR_SKIP(o, GetParam(), mc);
  }
}

// Appending into the latent cache: k (576 columns) and v = k[..., :512] land in the same row;
// the row read back is k's, and V (its first 512 columns) is what the query attends to.
TEST_P(Mla, AppendIntoLatentCache) {
  for (int page : {0, 16}) {
    for (bool causal : {false, true}) {
      MlaCase mc;
      mc.cache_seqlens = {0, 5, 64, 126};
      mc.capacity = 128;
      mc.page_size = page;
      mc.seqlen_new = 2;
      mc.seqlen_q = 2;
      mc.causal = causal;
      SCOPED_TRACE("page " + std::to_string(page) + (causal ? " causal" : ""));
      MLA_RUN_OR_SKIP(o, GetParam(), mc);
    }
  }
}

// Separate caches keep the generic append, rotary included (q and the new keys rotated).
TEST_P(Mla, AppendWithRotarySeparateCaches) {
  MlaCase mc;
  mc.latent = false;
  mc.cache_seqlens = {3, 90};
  mc.capacity = 128;
  mc.page_size = 16;
  mc.seqlen_new = 2;
  mc.seqlen_q = 2;
  mc.causal = true;
  mc.rotary_dim = 64;
  MLA_RUN_OR_SKIP(o, GetParam(), mc);
}

// Left padding moves the first key (and the causal diagonal stays bottom-right over the rest).
TEST_P(Mla, LeftPadding) {
  for (int page : {0, 16}) {
    MlaCase mc;
    mc.cache_seqlens = {70, 300, 12};
    mc.leftpad = {5, 200, 12};  // the last sequence: no key left
    mc.capacity = 320;
    mc.page_size = page;
    mc.seqlen_q = 2;
    mc.causal = true;
    mc.sink = sink_logits(mc.heads, 9);
    SCOPED_TRACE("page " + std::to_string(page));
    MLA_RUN_OR_SKIP(o, GetParam(), mc);
  }
}

TEST_P(Mla, ForcedSplits) {
  for (int splits : {1, 2, 3, 7, 64}) {
    MlaCase mc;
    mc.cache_seqlens = {1, 65, 1000, 2049};
    mc.capacity = 2112;
    mc.page_size = 64;
    mc.seqlen_q = 2;
    mc.causal = true;
    mc.num_splits = splits;
    SCOPED_TRACE("num_splits " + std::to_string(splits));
    MLA_RUN_OR_SKIP(o, GetParam(), mc);
  }
}

// Both stages of the latent kernel, small enough for the sanitizers: every split covers 2+ key
// tiles, so tile j + 1 is copied into one stage while tile j's V is read from the other. 16 rows
// (one token, 16 heads) and 32 rows (two tokens), dense and paged. The first GPU run read the
// latent V from the wrong stage (the next K tile, or past the 183 KB of 16-row blocks: an
// illegal address), which the cases with one tile per split did not show.
TEST_P(Mla, BothStagesSmall) {
  for (int sq : {1, 2}) {
    for (int splits : {1, 2}) {
      for (int page : {0, 16}) {
        MlaCase mc;
        mc.cache_seqlens = {1, 130, 256};
        mc.capacity = 256;  // 4 tiles: 4 per CTA unsplit, 2 per split
        mc.page_size = page;
        mc.seqlen_q = sq;
        mc.causal = sq > 1;
        mc.num_splits = splits;
        SCOPED_TRACE("seqlen_q " + std::to_string(sq) + " num_splits " + std::to_string(splits) + " page " +
                     std::to_string(page));
        MLA_RUN_OR_SKIP(o, GetParam(), mc);
      }
    }
  }
}

// More splits than one pass of the MLA combine's warps takes (8 warps x 32 = 256 splits): 261
// one-tile splits, so each warp of mla_combine_kernel makes two passes.
TEST_P(Mla, CombineManySplits) {
  MlaCase mc;
  mc.cache_seqlens = {261 * 64, 100};
  mc.capacity = 261 * 64;
  mc.page_size = 64;
  mc.num_splits = 261;
  mc.sink = sink_logits(mc.heads, 6);
  MLA_RUN_OR_SKIP(o, GetParam(), mc);
}

TEST_P(Mla, LearnableSink) {
  for (int splits : {1, 5}) {
    for (bool empty_sequence : {false, true}) {
      MlaCase mc;
      mc.cache_seqlens = {empty_sequence ? 0 : 9, 300, 70};
      mc.capacity = 320;
      mc.page_size = 16;
      mc.seqlen_q = 2;
      mc.causal = true;
      mc.num_splits = splits;
      mc.sink = sink_logits(mc.heads, 5);
      SCOPED_TRACE("num_splits " + std::to_string(splits) + (empty_sequence ? " with an empty sequence" : ""));
      MLA_RUN_OR_SKIP(o, GetParam(), mc);
    }
  }
}

TEST_P(Mla, SinkNegInfEqualsNoSinkBitwise) {
  for (int splits : {1, 4}) {
    MlaCase plain;
    plain.cache_seqlens = {50, 260};
    plain.capacity = 320;
    plain.num_splits = splits;
    MlaCase neg_inf = plain;
    neg_inf.sink.assign(plain.heads, -std::numeric_limits<float>::infinity());
    const MlaOutcome a = run_case(GetParam(), plain, false);
    if (a.skipped) GTEST_SKIP() << a.skip_reason;
    const MlaOutcome b = run_case(GetParam(), neg_inf, false);
    ASSERT_TRUE(a.status.ok() && b.status.ok());
    EXPECT_EQ(a.out_bytes, b.out_bytes) << "num_splits " << splits;
    EXPECT_EQ(a.lse, b.lse) << "num_splits " << splits;
  }
}

TEST_P(Mla, Float16) {
  MlaCase mc;
  mc.dtype = DType::kFloat16;
  mc.cache_seqlens = {17, 400};
  mc.capacity = 448;
  mc.page_size = 64;
  mc.seqlen_q = 2;
  mc.causal = true;
  MLA_RUN_OR_SKIP(o, GetParam(), mc);
}

// Paged and dense caches with the same contents: bitwise equal (the same rows in the same order).
TEST_P(Mla, PagedEqualsDenseBitwise) {
  MlaCase dense;
  dense.cache_seqlens = {3, 100, 191, 64};
  dense.capacity = 192;
  dense.seqlen_q = 2;
  dense.causal = true;
  const MlaOutcome d = run_case(GetParam(), dense, false);
  if (d.skipped) GTEST_SKIP() << d.skip_reason;
  for (int page : {1, 16, 64}) {
    MlaCase paged = dense;
    paged.page_size = page;
    const MlaOutcome p = run_case(GetParam(), paged, false);
    ASSERT_TRUE(d.status.ok() && p.status.ok());
    EXPECT_EQ(d.out_bytes, p.out_bytes) << "page size " << page;
    EXPECT_EQ(d.lse, p.lse) << "page size " << page;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Mla, testing::ValuesIn(all_backends()),
                         [](const testing::TestParamInfo<Backend>& param_info) {
                           return std::string(backend_name(param_info.param));
                         });

// CUDA and the CPU backend on the same inputs (each also meets the criterion on its own).
TEST(MlaCpuVsCuda, SameInputs) {
  if (!backend_available(Backend::kCuda)) GTEST_SKIP() << "no CUDA device";
  for (bool latent : {true, false}) {
    MlaCase mc;
    mc.cache_seqlens = {100, 5, 64, 777};
    mc.capacity = 832;
    mc.page_size = 64;
    mc.seqlen_new = 1;
    mc.seqlen_q = 2;
    mc.causal = true;
    mc.latent = latent;
    mc.sink = sink_logits(mc.heads, 3);
    const MlaOutcome cpu = run_case(Backend::kCpu, mc);
    const MlaOutcome gpu = run_case(Backend::kCuda, mc);
    if (gpu.skipped) GTEST_SKIP() << gpu.skip_reason;
    ASSERT_TRUE(cpu.status.ok() && gpu.status.ok());
    ASSERT_EQ(cpu.out.size(), gpu.out.size());
    double worst = 0.0;
    for (size_t i = 0; i < cpu.out.size(); ++i) worst = std::max(worst, std::abs(cpu.out[i] - gpu.out[i]));
    EXPECT_LE(worst, 8 * unit_roundoff(mc.dtype)) << (latent ? "latent" : "separate");
  }
}

// What the CUDA MLA kernel declines: kNotSupported naming the argument. The CPU backend runs
// every one of these calls.
class MlaDeclines : public testing::Test {
 protected:
  void SetUp() override {
    if (!backend_available(Backend::kCuda)) GTEST_SKIP() << "no CUDA device";
  }
  static MlaCase base() {
    MlaCase mc;
    mc.cache_seqlens = {20, 40};
    mc.capacity = 64;
    mc.seqlen_q = 2;
    return mc;
  }
  static void expect_declined(const Status& s, const std::string& needle) {
    if (not_built(s)) GTEST_SKIP() << s.message();
    EXPECT_EQ(s.code(), StatusCode::kNotSupported) << s.message();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  }
};

TEST_F(MlaDeclines, ScoreOptions) {
  MlaRun run(Backend::kCuda, base());
  {
    KVCacheArgs a = run.args();
    a.softcap = 30.0f;
    expect_declined(forward_kvcache(a), "softcap");
  }
  {
    KVCacheArgs a = run.args();
    a.window_left = 8;
    expect_declined(forward_kvcache(a), "window_size");
  }
  {
    std::vector<float> slopes(16, 0.5f);
    auto arena = std::make_shared<Arena>(Backend::kCuda, DType::kFloat32, 16);
    for (int h = 0; h < 16; ++h) arena->set(h, slopes[h]);
    arena->upload();
    KVCacheArgs a = run.args();
    a.alibi_slopes = make_contiguous_view(arena->device_data(), DType::kFloat32, device_of(Backend::kCuda), {16});
    expect_declined(forward_kvcache(a), "alibi_slopes");
  }
}

TEST_F(MlaDeclines, SeqlenQAbove16) {
  MlaCase mc = base();
  mc.seqlen_q = 17;
  MlaRun run(Backend::kCuda, mc);
  expect_declined(forward_kvcache(run.args()), "seqlen_q 17");
}

TEST_F(MlaDeclines, RotaryOnLatentCache) {
  MlaCase mc = base();
  mc.seqlen_new = 1;
  mc.rotary_dim = 64;
  MlaRun run(Backend::kCuda, mc);
  expect_declined(forward_kvcache(run.args()), "rotary_cos/rotary_sin with v_cache a view of k_cache");
}

// Other head-dim pairs above 256 stay kNotSupported naming head_dim (the CPU backend runs them).
TEST_F(MlaDeclines, OtherLargeHeadDims) {
  const Device dev = device_of(Backend::kCuda);
  const int64_t d = 320, B = 1, cap = 16;
  auto q = std::make_shared<Arena>(Backend::kCuda, DType::kBFloat16, B * d);
  auto kc = std::make_shared<Arena>(Backend::kCuda, DType::kBFloat16, B * cap * d);
  auto out = std::make_shared<Arena>(Backend::kCuda, DType::kBFloat16, B * d);
  for (int64_t i = 0; i < B * d; ++i) q->set(i, 0.5);
  for (int64_t i = 0; i < B * cap * d; ++i) kc->set(i, 0.25);
  q->upload();
  kc->upload();
  out->upload();
  KVCacheArgs a;
  a.q = make_contiguous_view(q->device_data(), DType::kBFloat16, dev, {B, 1, 1, d});
  a.k_cache = make_contiguous_view(kc->device_data(), DType::kBFloat16, dev, {B, cap, 1, d});
  a.v_cache = a.k_cache;
  a.out = make_contiguous_view(out->device_data(), DType::kBFloat16, dev, {B, 1, 1, d});
  const Status s = forward_kvcache(a);
  EXPECT_EQ(s.code(), StatusCode::kNotSupported) << s.message();
  EXPECT_NE(s.message().find("head_dim 320"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace flashattn::test
