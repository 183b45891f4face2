// A varlen forward whose K and V are pages (ForwardArgs::block_table; flash_attn 2.x's
// flash_attn_varlen_func(block_table=...)) on every backend: against the fp64 reference (the
// pages gathered to packed keys in the test), against the same call on packed K/V, against
// forward_kvcache on the same pages (bitwise: the same kernels), page sizes 1..256, shuffled
// pages, pages shared between sequences (a common prefix), sequences without queries or keys,
// causal / window / softcap / ALiBi / sinks / GQA, forced splits, and bad input. Pages a call
// must not read hold NaN (an Arena's uncovered elements): a read would show in the output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/params.h"
#include "core/switches.h"
#include "test_util.h"

namespace flashattn::test {
namespace {

struct PagedCase {
  DType dtype = DType::kBFloat16;
  std::vector<int> seqlens_q{3, 1, 0, 7};
  std::vector<int> seqlens_k{40, 1, 0, 70};  // keys of each sequence, on its pages
  int heads = 4;
  int heads_k = 2;
  int head_dim = 64;
  int head_dim_v = 64;
  int page_size = 16;
  int extra_blocks = 1;       // table entries past the longest sequence's pages (hold -1)
  bool shuffle_pages = true;  // pages in random order in the pool
  bool share_prefix = false;  // every sequence's first page is sequence 0's (same contents)
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  float softcap = 0.0f;
  bool alibi = false;
  std::vector<float> sink;  // learnable_sink (heads); empty = none
  int num_splits = 0;
  uint32_t seed = 11;

  int batch() const { return static_cast<int>(seqlens_q.size()); }
  int total_q() const { return std::accumulate(seqlens_q.begin(), seqlens_q.end(), 0); }
  int max_q() const { return *std::max_element(seqlens_q.begin(), seqlens_q.end()); }
  int max_k() const { return *std::max_element(seqlens_k.begin(), seqlens_k.end()); }
  int max_blocks() const { return (max_k() + page_size - 1) / page_size + extra_blocks; }
};

struct PagedOutcome {
  Status status;
  std::vector<double> out, lse;  // out (total_q, heads, dv); lse (heads, total_q)
  std::vector<unsigned char> out_bytes;
};

double uniform(std::mt19937& g) { return std::uniform_real_distribution<double>(-1.0, 1.0)(g); }

class PagedRun {
 public:
  PagedRun(Backend backend, const PagedCase& pc) : backend_(backend), pc_(pc) { build(); }

  // The paged call (paged = true) or the same problem on packed K/V.
  ForwardArgs args(bool paged) const {
    const Device dev = device_of(backend_);
    const DType dt = pc_.dtype;
    const int64_t B = pc_.batch(), H = pc_.heads, HK = pc_.heads_k, d = pc_.head_dim, dv = pc_.head_dim_v;
    ForwardArgs a;
    a.q = make_contiguous_view(q_->device_data(), dt, dev, {pc_.total_q(), H, d});
    if (paged) {
      a.k = make_contiguous_view(kpages_->device_data(), dt, dev, {num_pages_, pc_.page_size, HK, d});
      a.v = make_contiguous_view(vpages_->device_data(), dt, dev, {num_pages_, pc_.page_size, HK, dv});
      a.block_table = make_contiguous_view(table_->device_data(), DType::kInt32, dev, {B, pc_.max_blocks()});
    } else {
      a.k = make_contiguous_view(kpacked_->device_data(), dt, dev, {total_k_, HK, d});
      a.v = make_contiguous_view(vpacked_->device_data(), dt, dev, {total_k_, HK, dv});
    }
    a.cu_seqlens_q = make_contiguous_view(cu_q_->device_data(), DType::kInt32, dev, {B + 1});
    a.cu_seqlens_k = make_contiguous_view(cu_k_->device_data(), DType::kInt32, dev, {B + 1});
    a.max_seqlen_q = pc_.max_q();
    a.max_seqlen_k = pc_.max_k();
    a.out = make_contiguous_view(out_->device_data(), dt, dev, {pc_.total_q(), H, dv});
    a.lse = make_contiguous_view(lse_->device_data(), DType::kFloat32, dev, {H, pc_.total_q()});
    set_options(&a);
    return a;
  }

  // The options both entry points share (ForwardArgs, KVCacheArgs).
  template <class Args>
  void set_options(Args* a) const {
    const Device dev = device_of(backend_);
    a->causal = pc_.causal;
    a->window_left = pc_.window_left;
    a->window_right = pc_.window_right;
    a->softcap = pc_.softcap;
    if (pc_.alibi) a->alibi_slopes = make_contiguous_view(alibi_->device_data(), DType::kFloat32, dev, {pc_.heads});
    if (!pc_.sink.empty()) {
      a->learnable_sink = make_contiguous_view(sink_->device_data(), DType::kFloat32, dev, {pc_.heads});
    }
    a->num_splits = pc_.num_splits;
  }

  // forward_kvcache on the same pages (every sequence must have the same number of queries).
  KVCacheArgs kvcache_args() const {
    const Device dev = device_of(backend_);
    const DType dt = pc_.dtype;
    const int64_t B = pc_.batch(), H = pc_.heads, HK = pc_.heads_k, d = pc_.head_dim, dv = pc_.head_dim_v;
    const int64_t sq = pc_.seqlens_q[0];
    KVCacheArgs a;
    a.q = make_contiguous_view(q_->device_data(), dt, dev, {B, sq, H, d});
    a.k_cache = make_contiguous_view(kpages_->device_data(), dt, dev, {num_pages_, pc_.page_size, HK, d});
    a.v_cache = make_contiguous_view(vpages_->device_data(), dt, dev, {num_pages_, pc_.page_size, HK, dv});
    a.block_table = make_contiguous_view(table_->device_data(), DType::kInt32, dev, {B, pc_.max_blocks()});
    a.cache_seqlens = make_contiguous_view(lens_k_->device_data(), DType::kInt32, dev, {B});
    a.out = make_contiguous_view(out_->device_data(), dt, dev, {B, sq, H, dv});
    a.lse = make_contiguous_view(lse_->device_data(), DType::kFloat32, dev, {B, H, sq});
    set_options(&a);
    return a;
  }

  PagedOutcome finish(Status status) {
    PagedOutcome o;
    o.status = status;
    if (!status.ok()) return o;
    out_->download();
    lse_->download();
    for (int64_t i = 0; i < out_->numel(); ++i) o.out.push_back(out_->get(i));
    for (int64_t i = 0; i < lse_->numel(); ++i) o.lse.push_back(lse_->get(i));
    o.out_bytes = out_->bytes();
    return o;
  }
  // Every call starts from NaN outputs, so that a second call that wrote nothing cannot match
  // the first one's results.
  PagedOutcome run(bool paged = true) {
    poison_outputs();
    return finish(forward(args(paged)));
  }
  PagedOutcome run_kvcache() {
    poison_outputs();
    return finish(forward_kvcache(kvcache_args()));
  }
  void poison_outputs() {
    for (auto* a : {out_.get(), lse_.get()}) {
      for (int64_t i = 0; i < a->numel(); ++i) a->set(i, NAN);
      a->upload();
    }
  }

  // out and lse against the fp64 reference on the logical (packed) keys.
  void check(const PagedOutcome& o) const {
    const Results ref = run_reference(host_, false);
    std::vector<double> lowp_out, lowp_lse;
    if (pc_.dtype != DType::kFloat32) {
      const Results lowp = run_naive_lowp(host_, pc_.dtype, false);
      lowp_out = lowp.out;
      lowp_lse = lowp.lse;
    }
    EXPECT_TRUE(meets_criterion("out", pc_.dtype, o.out, ref.out, lowp_out));
    EXPECT_TRUE(meets_criterion("lse", pc_.dtype, o.lse, ref.lse, lowp_lse));
  }

 private:
  void build() {
    std::mt19937 g(pc_.seed);
    std::mt19937 layout_rng(pc_.seed + 1);
    const DType dt = pc_.dtype;
    const int B = pc_.batch(), H = pc_.heads, HK = pc_.heads_k, d = pc_.head_dim, dv = pc_.head_dim_v;
    const int P = pc_.page_size, mb = pc_.max_blocks();
    auto fill = [&](std::vector<double>& host, int64_t n) {
      host.resize(static_cast<size_t>(n));
      for (auto& x : host) x = round_to(dt, uniform(g));
    };

    // Logical keys of each sequence, packed (sum of seqlens_k, HK, d[v]); a shared first page
    // repeats sequence 0's first page_size keys.
    std::vector<int64_t> k0(static_cast<size_t>(B) + 1, 0);
    for (int b = 0; b < B; ++b) k0[b + 1] = k0[b] + pc_.seqlens_k[b];
    total_k_ = k0[B];
    fill(klog_, total_k_ * HK * d);
    fill(vlog_, total_k_ * HK * dv);
    const auto shares = [&](int b) { return pc_.share_prefix && b > 0 && pc_.seqlens_k[b] >= P && pc_.seqlens_k[0] >= P; };
    for (int b = 0; b < B; ++b) {
      if (!shares(b)) continue;
      std::copy_n(klog_.begin(), int64_t(P) * HK * d, klog_.begin() + k0[b] * HK * d);
      std::copy_n(vlog_.begin(), int64_t(P) * HK * dv, vlog_.begin() + k0[b] * HK * dv);
    }

    // Pages: each sequence's blocks get pages of their own (but a shared first page), then 3
    // spare pages nobody uses; the pool is shuffled.
    std::vector<std::vector<int>> blocks(static_cast<size_t>(B));
    int next = 0;
    for (int b = 0; b < B; ++b) {
      for (int i = 0; i * P < pc_.seqlens_k[b]; ++i) blocks[b].push_back(i == 0 && shares(b) ? -2 : next++);
    }
    num_pages_ = next + 3;
    std::vector<int> perm(static_cast<size_t>(num_pages_));
    std::iota(perm.begin(), perm.end(), 0);
    if (pc_.shuffle_pages) std::shuffle(perm.begin(), perm.end(), layout_rng);
    table_host_.assign(static_cast<size_t>(B) * mb, -1);
    for (int b = 0; b < B; ++b) {
      for (size_t i = 0; i < blocks[b].size(); ++i) {
        table_host_[b * mb + i] = blocks[b][i] == -2 ? table_host_[0] : perm[blocks[b][i]];
      }
    }

    auto arena = [&](DType t, int64_t n) { return std::make_shared<Arena>(backend_, t, std::max<int64_t>(n, 1)); };
    kpages_ = arena(dt, num_pages_ * P * HK * d);
    vpages_ = arena(dt, num_pages_ * P * HK * dv);
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < pc_.seqlens_k[b]; ++t) {
        const int64_t page = table_host_[b * mb + t / P];
        for (int h = 0; h < HK; ++h) {
          const int64_t kp = ((page * P + t % P) * HK + h) * d, vp = ((page * P + t % P) * HK + h) * dv;
          const int64_t kl = ((k0[b] + t) * HK + h) * d, vl = ((k0[b] + t) * HK + h) * dv;
          for (int c = 0; c < d; ++c) kpages_->set(kp + c, klog_[kl + c]);
          for (int c = 0; c < dv; ++c) vpages_->set(vp + c, vlog_[vl + c]);
        }
      }
    }
    kpacked_ = arena(dt, total_k_ * HK * d);
    vpacked_ = arena(dt, total_k_ * HK * dv);
    for (size_t i = 0; i < klog_.size(); ++i) kpacked_->set(static_cast<int64_t>(i), klog_[i]);
    for (size_t i = 0; i < vlog_.size(); ++i) vpacked_->set(static_cast<int64_t>(i), vlog_[i]);

    const int64_t total_q = pc_.total_q();
    fill(q_host_, total_q * H * d);
    q_ = arena(dt, total_q * H * d);
    for (size_t i = 0; i < q_host_.size(); ++i) q_->set(static_cast<int64_t>(i), q_host_[i]);
    cu_q_ = arena(DType::kInt32, B + 1);
    cu_k_ = arena(DType::kInt32, B + 1);
    lens_k_ = arena(DType::kInt32, B);
    host_.shape.cu_seqlens_q = {0};
    host_.shape.cu_seqlens_k = {0};
    for (int b = 0; b < B; ++b) {
      host_.shape.cu_seqlens_q.push_back(host_.shape.cu_seqlens_q.back() + pc_.seqlens_q[b]);
      host_.shape.cu_seqlens_k.push_back(host_.shape.cu_seqlens_k.back() + pc_.seqlens_k[b]);
      lens_k_->set(b, pc_.seqlens_k[b]);
    }
    for (int b = 0; b <= B; ++b) {
      cu_q_->set(b, host_.shape.cu_seqlens_q[b]);
      cu_k_->set(b, host_.shape.cu_seqlens_k[b]);
    }
    table_ = arena(DType::kInt32, static_cast<int64_t>(table_host_.size()));
    for (size_t i = 0; i < table_host_.size(); ++i) table_->set(static_cast<int64_t>(i), table_host_[i]);
    alibi_ = arena(DType::kFloat32, H);
    sink_ = arena(DType::kFloat32, H);
    for (int h = 0; h < H; ++h) {
      alibi_host_.push_back(static_cast<float>(0.05 * (h + 1)));
      alibi_->set(h, alibi_host_.back());
      if (!pc_.sink.empty()) sink_->set(h, pc_.sink[h]);
    }
    out_ = arena(dt, total_q * H * dv);
    lse_ = arena(DType::kFloat32, H * total_q);
    for (auto* a : {&kpages_, &vpages_, &kpacked_, &vpacked_, &q_, &cu_q_, &cu_k_, &lens_k_, &table_, &alibi_,
                    &sink_, &out_, &lse_}) {
      (*a)->upload();
    }

    host_.shape.batch = B;
    host_.shape.heads = H;
    host_.shape.heads_k = HK;
    host_.shape.head_dim = d;
    host_.shape.head_dim_v = dv;
    host_.q = q_host_;
    host_.k = klog_;
    host_.v = vlog_;
    host_.opt.scale = 1.0 / std::sqrt(static_cast<double>(d));
    host_.opt.window_left = pc_.window_left;
    host_.opt.window_right = pc_.causal ? 0 : pc_.window_right;
    host_.opt.softcap = pc_.softcap;
    if (pc_.alibi) {
      for (int b = 0; b < B; ++b) host_.opt.alibi.insert(host_.opt.alibi.end(), alibi_host_.begin(), alibi_host_.end());
    }
    host_.opt.sink.assign(pc_.sink.begin(), pc_.sink.end());
  }

  Backend backend_;
  PagedCase pc_;
  int64_t num_pages_ = 0, total_k_ = 0;
  std::vector<int> table_host_;
  std::vector<double> q_host_, klog_, vlog_;
  std::vector<float> alibi_host_;
  HostProblem host_;
  std::shared_ptr<Arena> kpages_, vpages_, kpacked_, vpacked_, q_, cu_q_, cu_k_, lens_k_, table_, alibi_, sink_,
      out_, lse_;
};

// Whether a CUDA kNotSupported is what this build legitimately says for the case.
bool cuda_may_not_support(const PagedCase& pc) {
  ProblemSpec s;
  s.dtype = pc.dtype;
  s.head_dim = pc.head_dim;
  s.head_dim_v = pc.head_dim_v;
  return test::cuda_may_not_support(s) || pc.head_dim != pc.head_dim_v;
}

class PagedVarlen : public testing::TestWithParam<Backend> {
 protected:
  std::string run_on_sm90_cache_kernel(const std::vector<int>& seqlens_q, const std::vector<int>& seqlens_k);

  // Runs the case and checks it against the reference; false when the test is to be skipped.
  bool run_checked(const PagedCase& pc, PagedOutcome* out = nullptr, std::string* skip = nullptr) {
    if (!backend_available(GetParam())) {
      *skip = "no CUDA device";
      return false;
    }
    PagedRun run(GetParam(), pc);
    const PagedOutcome o = run.run();
    if (!o.status.ok()) {
      if (GetParam() == Backend::kCuda && o.status.code() == StatusCode::kNotSupported && cuda_may_not_support(pc)) {
        *skip = o.status.message();
        return false;
      }
      ADD_FAILURE() << "paged varlen forward on " << backend_name(GetParam()) << ": " << o.status.message();
      return false;
    }
    run.check(o);
    if (out != nullptr) *out = o;
    return true;
  }
};

#define PAGED_RUN_OR_SKIP(pc)                                \
  do {                                                       \
    std::string skip_;                                       \
    if (!run_checked(pc, nullptr, &skip_) && !skip_.empty()) \
      GTEST_SKIP() << skip_;                                 \
  } while (0)

TEST_P(PagedVarlen, RaggedAgainstReference) {
  for (bool causal : {false, true}) {
    PagedCase pc;
    pc.causal = causal;
    SCOPED_TRACE(causal ? "causal" : "full");
    PAGED_RUN_OR_SKIP(pc);
  }
}

TEST_P(PagedVarlen, AllPageSizes) {
  for (int page : {1, 16, 64, 256}) {
    PagedCase pc;
    pc.page_size = page;
    pc.seqlens_q = {5, 2, 16, 1};
    pc.seqlens_k = {300, 2, 129, 64};
    pc.causal = true;
    SCOPED_TRACE("page size " + std::to_string(page));
    PAGED_RUN_OR_SKIP(pc);
  }
}

// A decode step of several sequences (one query each) and a chunked prefill (one sequence with
// many queries among decoding ones), GQA 8/2, in order and shuffled pages.
TEST_P(PagedVarlen, DecodeAndChunkedPrefill) {
  for (bool prefill : {false, true}) {
    for (bool shuffle : {false, true}) {
      PagedCase pc;
      pc.heads = 8;
      pc.heads_k = 2;
      pc.head_dim = pc.head_dim_v = 128;
      pc.seqlens_q = prefill ? std::vector<int>{1, 150, 1, 1} : std::vector<int>{1, 1, 1, 1, 1};
      pc.seqlens_k = prefill ? std::vector<int>{517, 400, 33, 1} : std::vector<int>{517, 1000, 33, 1, 256};
      pc.causal = true;
      pc.shuffle_pages = shuffle;
      SCOPED_TRACE(std::string(prefill ? "chunked prefill" : "decode") + (shuffle ? " shuffled" : " in order"));
      PAGED_RUN_OR_SKIP(pc);
    }
  }
}

// A chunked-prefill step whose sequences of a few tokens run in a launch of their own on the
// decode tiles (cuda_backend.cu run_kvcache decode_share, under detail::Switch::kDecodeShare;
// here with it on and off): as many tokens as the GQA token fold
// takes (12 at 32/8 heads, 13 at 6/1) or, unfolded, 16 (4/4 heads, ALiBi). Sequences at that
// bound and one past it (one of them without keys), of 16 and 17 tokens, one empty and one
// without keys, beside a 150-row chunk, under each option; on CUDA with the switch on the call
// splits (detail::decode_share_calls) and its decode launch folds once where GQA allows it
// (detail::token_fold_calls; the chunk's launch does not: 150 rows).
TEST_P(PagedVarlen, DecodesOnTheirOwnBesideChunks) {
  struct Option {
    const char* name;
    int heads, heads_k, bound;  // bound: decode_tokens_max for the case
    bool folds;
    PagedCase pc;
  };
  std::vector<Option> options;
  auto add = [&](const char* name, int heads, int heads_k, int bound, bool folds, auto&& edit) {
    Option o{name, heads, heads_k, bound, folds, {}};
    o.pc.heads = heads;
    o.pc.heads_k = heads_k;
    o.pc.head_dim = o.pc.head_dim_v = 128;
    o.pc.causal = true;
    edit(o.pc);
    options.push_back(o);
  };
  add("gqa 32/8", 32, 8, 12, true, [](PagedCase&) {});
  add("mqa 6/1 window", 6, 1, 13, true, [](PagedCase& pc) {
    pc.causal = false;
    pc.window_left = 40;
    pc.window_right = 2;
  });
  add("gqa 8/2 softcap, page 1", 8, 2, 12, true, [](PagedCase& pc) {
    pc.softcap = 8.0f;
    pc.page_size = 1;
  });
  add("gqa 8/2 sink", 8, 2, 12, true, [](PagedCase& pc) {
    pc.sink = {0.5f, -1.0f, 2.0f, -INFINITY, 0.0f, 1.0f, -2.0f, 3.0f};
  });
  add("gqa 8/2 alibi (unfolded)", 8, 2, 16, false, [](PagedCase& pc) { pc.alibi = true; });
  add("mha 4/4 (unfolded)", 4, 4, 16, false, [](PagedCase&) {});
  for (Option& o : options) {
    const int t = o.bound;
    o.pc.seqlens_q = {1, 150, t, t + 1, 0, 16, 17, 3, 1, 2, t + 1};
    o.pc.seqlens_k = {517, 400, 60, 33, 9, 16, 300, 0, 1, 129, 0};
    o.pc.seed = 5;
    for (bool share : {true, false}) {
      SCOPED_TRACE(std::string(o.name) + (share ? ", decodes on their own" : ", one launch"));
      ScopedSwitch on(detail::Switch::kDecodeShare, share);
      const unsigned long long folds = detail::token_fold_calls(), shares = detail::decode_share_calls();
      std::string skip;
      if (!run_checked(o.pc, nullptr, &skip)) {
        if (!skip.empty()) GTEST_SKIP() << skip;
        continue;
      }
      const bool cuda = GetParam() == Backend::kCuda;
      EXPECT_EQ(detail::decode_share_calls() - shares, cuda && share ? 1u : 0u);
      EXPECT_EQ(detail::token_fold_calls() - folds, cuda && share && o.folds ? 1u : 0u);
    }
  }
}

// The decodes' own launch splits keys where the heuristic would and q's packed rows are few (58
// here, at most 16 per sequence on average: the partials' workspace is indexed by packed row) and
// merges each row group's splits in the kernel: by counters (GQA 8/2 folded: three tiles per row
// group, ~11 splits over 4000 keys) or, by the heuristic's count on a 132-SM GPU (one unfolded
// tile per row group, ~6 splits over 1500 keys, 40 CTAs), within a cluster; under the
// combine-kernel switch it runs unsplit. Against the reference under each merge; one decode
// has rows but no keys.
TEST_P(PagedVarlen, DecodesOnTheirOwnSplitKeys) {
  for (int heads_k : {2, 8}) {
    for (const char* merge : {"default", "counter", "kernel"}) {
      PagedCase pc;
      pc.heads = 8;
      pc.heads_k = heads_k;
      pc.head_dim = pc.head_dim_v = 128;
      pc.causal = true;
      pc.seqlens_q = {1, 40, 3, 2, 12};
      pc.seqlens_k = heads_k == 2 ? std::vector<int>{4000, 300, 2500, 0, 1500}
                                  : std::vector<int>{1500, 300, 1200, 0, 1000};
      SCOPED_TRACE(std::string(heads_k == 2 ? "gqa 8/2" : "mha 8/8") + ", merge " + merge);
      ScopedSwitch on(detail::Switch::kDecodeShare, true);
      ScopedSwitch counter(detail::Switch::kSplitCombineCounter, std::string(merge) == "counter");
      ScopedSwitch kernel(detail::Switch::kSplitCombineKernel, std::string(merge) == "kernel");
      const unsigned long long shares = detail::decode_share_calls();
      std::string skip;
      if (!run_checked(pc, nullptr, &skip)) {
        if (!skip.empty()) GTEST_SKIP() << skip;
        continue;
      }
      EXPECT_EQ(detail::decode_share_calls() - shares, GetParam() == Backend::kCuda ? 1u : 0u);
    }
  }
}

// A chunked-prefill batch (d128, 8 query heads over 2, pages of 16 and 64 rows, causal or with
// softcap, no split keys) with the sm90 cache kernel switched on (detail::Switch::kSm90Cache),
// against the reference; on a Hopper GPU (sm90_cache_expected) the cache kernel must have run
// once per call. Returns why the backend skipped it, or an empty string.
std::string PagedVarlen::run_on_sm90_cache_kernel(const std::vector<int>& seqlens_q, const std::vector<int>& seqlens_k) {
  for (int page : {16, 64}) {
    for (bool causal : {true, false}) {
      PagedCase pc;
      pc.heads = 8;
      pc.heads_k = 2;
      pc.head_dim = pc.head_dim_v = 128;
      pc.page_size = page;
      pc.seqlens_q = seqlens_q;
      pc.seqlens_k = seqlens_k;
      pc.causal = causal;
      pc.softcap = causal ? 0.0f : 20.0f;
      pc.num_splits = 1;  // small grids: the split heuristic would leave them to sm80
      for (bool share : {true, false}) {
        SCOPED_TRACE("page size " + std::to_string(page) + (causal ? " causal" : " softcap") +
                     (share ? ", decodes on their own" : ", one launch"));
        ScopedSwitch on(detail::Switch::kSm90Cache, true);
        ScopedSwitch decodes(detail::Switch::kDecodeShare, share);
        const unsigned long long before = detail::sm90_forward_calls(), shares = detail::decode_share_calls();
        std::string skip;
        if (!run_checked(pc, nullptr, &skip) && !skip.empty()) return skip;
        const unsigned long long expected = GetParam() == Backend::kCuda && sm90_cache_expected(pc.head_dim) ? 1u : 0u;
        EXPECT_EQ(detail::sm90_forward_calls() - before, expected);
        EXPECT_EQ(detail::decode_share_calls() - shares, GetParam() == Backend::kCuda && share ? 1u : 0u);
      }
    }
  }
  return {};
}

// A batch whose longest query run fills a tile (max_seqlen_q >= 128): the cache kernel takes the
// whole call, or (decodes on their own) its sequences of more than 12 rows (600 and 129) while
// the sm80 decode tiles take the one-row ones in a launch of their own; the empty one is in
// neither.
TEST_P(PagedVarlen, ChunkedPrefillOnTheSm90CacheKernel) {
  if (const std::string skip = run_on_sm90_cache_kernel({1, 600, 0, 129, 1}, {517, 700, 5, 129, 1}); !skip.empty()) {
    GTEST_SKIP() << skip;
  }
}

// A chunked-prefill step among decoding sequences (56 query rows per sequence on average): on a
// Hopper GPU the whole call runs on the cache kernel, or (decodes on their own) the sequences of
// more than 12 rows (127, 128 and 300) there and the rest on the sm80 decode tiles in a launch
// of their own (cuda_backend.cu run_kvcache, ForwardParams::cache_rows_min / _max), each
// sequence in exactly one of them; one without keys and one empty among them.
TEST_P(PagedVarlen, ChunkedPrefillAmongDecodesSplitBetweenKernels) {
  if (const std::string skip = run_on_sm90_cache_kernel({1, 300, 1, 0, 127, 128, 2, 1, 3, 1},
                                                        {517, 400, 33, 5, 127, 300, 90, 0, 700, 17});
      !skip.empty()) {
    GTEST_SKIP() << skip;
  }
}

// vLLM's prefix caching: sequences share their first page.
TEST_P(PagedVarlen, SharedPrefixPages) {
  PagedCase pc;
  pc.page_size = 16;
  pc.seqlens_q = {4, 3, 2};
  pc.seqlens_k = {40, 16, 90};
  pc.share_prefix = true;
  pc.causal = true;
  PAGED_RUN_OR_SKIP(pc);
}

TEST_P(PagedVarlen, EmptySequences) {
  PagedCase pc;
  pc.seqlens_q = {0, 2, 3, 0, 1};
  pc.seqlens_k = {5, 0, 9, 0, 0};  // queries without keys: out 0, LSE -inf
  PAGED_RUN_OR_SKIP(pc);
}

TEST_P(PagedVarlen, Options) {
  PagedCase window;
  window.window_left = 20;
  window.window_right = 3;
  PagedCase softcap;
  softcap.softcap = 5.0f;
  softcap.causal = true;
  PagedCase alibi;
  alibi.alibi = true;
  alibi.causal = true;
  PagedCase sink;
  sink.sink = {0.5f, -1.0f, 2.0f, -INFINITY};
  sink.causal = true;
  PagedCase mqa;
  mqa.heads = 6;
  mqa.heads_k = 1;
  const std::pair<const char*, PagedCase> cases[] = {
      {"window", window}, {"softcap", softcap}, {"alibi", alibi}, {"sink", sink}, {"mqa", mqa}};
  for (const auto& [name, pc] : cases) {
    SCOPED_TRACE(name);
    PAGED_RUN_OR_SKIP(pc);
  }
}

TEST_P(PagedVarlen, ForcedSplits) {
  for (int splits : {1, 3, 8}) {
    PagedCase pc;
    pc.seqlens_q = {1, 2, 1};
    pc.seqlens_k = {700, 300, 1};
    pc.causal = true;
    pc.num_splits = splits;
    SCOPED_TRACE("num_splits " + std::to_string(splits));
    PAGED_RUN_OR_SKIP(pc);
  }
}

TEST_P(PagedVarlen, OtherDtypesAndHeadDims) {
  PagedCase f16;
  f16.dtype = DType::kFloat16;
  PagedCase d96;
  d96.head_dim = d96.head_dim_v = 96;
  PagedCase d40;  // not instantiated: padded copies of the pages on CUDA
  d40.head_dim = d40.head_dim_v = 40;
  PagedCase dv;  // head_dim_v != head_dim: the CPU backend (kNotSupported on CUDA)
  dv.head_dim = 64;
  dv.head_dim_v = 32;
  PagedCase f32;  // the CPU backend
  f32.dtype = DType::kFloat32;
  const std::pair<const char*, PagedCase> cases[] = {
      {"f16", f16}, {"d96", d96}, {"d40", d40}, {"head_dim_v 32", dv}, {"f32", f32}};
  if (!backend_available(GetParam())) GTEST_SKIP() << "no CUDA device";
  for (const auto& [name, pc] : cases) {
    SCOPED_TRACE(name);
    if (GetParam() == Backend::kCuda && pc.dtype == DType::kFloat32) continue;  // the CPU backend's
    std::string skip;
    if (!run_checked(pc, nullptr, &skip) && !skip.empty()) {
      std::cout << "[ skipped case ] " << name << ": " << skip << "\n";  // this build's NotSupported
    }
  }
}

// The same problem on packed K/V: equal to rounding (the CUDA backend may run other kernels
// there), bitwise on the CPU backend, whose paged path gathers the rows it would otherwise read
// in place and then runs the same arithmetic.
TEST_P(PagedVarlen, MatchesPackedKeys) {
  for (bool causal : {false, true}) {
    PagedCase pc;
    pc.seqlens_q = {3, 17, 1};
    pc.seqlens_k = {45, 100, 7};
    pc.causal = causal;
    pc.num_splits = 1;
    SCOPED_TRACE(causal ? "causal" : "full");
    if (!backend_available(GetParam())) GTEST_SKIP() << "no CUDA device";
    PagedRun run(GetParam(), pc);
    const PagedOutcome paged = run.run(true);
    ASSERT_TRUE(paged.status.ok()) << paged.status.message();
    run.check(paged);
    const PagedOutcome packed = run.run(false);
    ASSERT_TRUE(packed.status.ok()) << packed.status.message();
    run.check(packed);
    if (GetParam() == Backend::kCpu) {
      EXPECT_EQ(paged.out_bytes, packed.out_bytes);
      EXPECT_EQ(paged.lse, packed.lse);
    }
  }
}

// Equal query counts: the same call as forward_kvcache on the same pages (cache_seqlens = the
// key counts), which runs the same kernels in the same order: bitwise equal at a forced split
// count (the heuristic sees max_seqlen_k in one and the capacity in the other).
TEST_P(PagedVarlen, EqualsKVCacheBitwise) {
  for (int sq : {1, 4}) {
    for (int splits : {1, 3}) {
      PagedCase pc;
      pc.heads = pc.heads_k = 4;  // (with GQA both fold: tests/python/test_paged_varlen.py)
      pc.seqlens_q = std::vector<int>(3, sq);
      pc.seqlens_k = {90, 1, 200};
      pc.causal = true;
      pc.num_splits = splits;
      SCOPED_TRACE("seqlen_q " + std::to_string(sq) + ", num_splits " + std::to_string(splits));
      if (!backend_available(GetParam())) GTEST_SKIP() << "no CUDA device";
      PagedRun run(GetParam(), pc);
      const PagedOutcome a = run.run();
      ASSERT_TRUE(a.status.ok()) << a.status.message();
      run.check(a);
      const PagedOutcome b = run.run_kvcache();
      ASSERT_TRUE(b.status.ok()) << b.status.message();
      EXPECT_EQ(a.out_bytes, b.out_bytes);
      // lse: (heads, total_q) here, (batch, heads, seqlen_q) there.
      const int B = pc.batch(), H = pc.heads;
      int64_t mismatches = 0;
      for (int bb = 0; bb < B; ++bb) {
        for (int h = 0; h < H; ++h) {
          for (int t = 0; t < sq; ++t) {
            const double x = a.lse[static_cast<size_t>(h) * B * sq + bb * sq + t];
            const double y = b.lse[(static_cast<size_t>(bb) * H + h) * sq + t];
            if (!(x == y || (std::isnan(x) && std::isnan(y)))) ++mismatches;
          }
        }
      }
      EXPECT_EQ(mismatches, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, PagedVarlen, testing::ValuesIn(all_backends()),
                         [](const testing::TestParamInfo<Backend>& i) { return std::string(backend_name(i.param)); });

// ---- bad input (the CPU backend: values are checked on the host there) ----------------------

class PagedVarlenErrors : public testing::Test {
 protected:
  PagedCase pc_;
  PagedRun run_{Backend::kCpu, pc_};
  ForwardArgs a_ = run_.args(true);
};

void expect_error(const ForwardArgs& a, StatusCode code, const std::string& needle) {
  const Status s = forward(a);
  EXPECT_EQ(s.code(), code) << s.message();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
}

TEST_F(PagedVarlenErrors, NeedsCuSeqlens) {
  ForwardArgs a = a_;
  a.cu_seqlens_q = a.cu_seqlens_k = TensorView{};
  expect_error(a, StatusCode::kInvalidArgument, "block_table needs cu_seqlens_q");
}

TEST_F(PagedVarlenErrors, PagesMustMatch) {
  ForwardArgs a = a_;
  a.v.shape[1] = a.k.shape[1] / 2;  // another page size
  expect_error(a, StatusCode::kInvalidArgument, "v must match k");
}

TEST_F(PagedVarlenErrors, TableRowsAreTheBatch) {
  ForwardArgs a = a_;
  a.block_table.shape[0] -= 1;
  expect_error(a, StatusCode::kInvalidArgument, "block_table must have batch");
}

TEST_F(PagedVarlenErrors, TableDtype) {
  ForwardArgs a = a_;
  a.block_table.dtype = DType::kFloat32;
  expect_error(a, StatusCode::kInvalidArgument, "block_table must have dtype int32");
}

TEST_F(PagedVarlenErrors, SequenceLongerThanItsTable) {
  ForwardArgs a = a_;
  a.block_table.shape[1] = 2;  // 32 rows; sequence 0 has 40 keys
  expect_error(a, StatusCode::kInvalidArgument, "sequence 0 has 40 keys");
}

TEST_F(PagedVarlenErrors, PageOutsideThePool) {
  PagedCase pc;
  PagedRun run(Backend::kCpu, pc);
  ForwardArgs a = run.args(true);
  a.k.shape[0] = a.v.shape[0] = 1;  // one page: the table's others are outside it
  const Status s = forward(a);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
  EXPECT_NE(s.message().find("is outside [0, 1)"), std::string::npos) << s.message();
}

// No pages: only sequences without keys are possible (the CPU backend checks the counts).
TEST_F(PagedVarlenErrors, NoPages) {
  ForwardArgs a = a_;
  a.k.shape[0] = a.v.shape[0] = 0;
  expect_error(a, StatusCode::kInvalidArgument, "exceeds the 0 rows of k");
  PagedCase pc;
  pc.seqlens_k = {0, 0, 0, 0};
  PagedRun run(Backend::kCpu, pc);
  ForwardArgs b = run.args(true);
  b.k.shape[0] = b.v.shape[0] = 0;
  b.k.data = b.v.data = nullptr;  // an empty tensor's pointer, as torch exports it
  run.poison_outputs();
  ASSERT_TRUE(forward(b).ok());
  const PagedOutcome o = run.finish(Status::Ok());
  for (double x : o.out) EXPECT_EQ(x, 0.0);
  for (double x : o.lse) EXPECT_EQ(x, -INFINITY);
}

// check_paged_metadata: the same value checks on their own (callers with host tables).
TEST(PagedMetadata, ChecksCountsAndPages) {
  // (2, 3) inside rows of 5 (a slice of a wider table: row stride 5, not the width).
  std::vector<int32_t> wide{3, 0, -1, 9, 9, 1, 4, 2, 9, 9};
  std::vector<int32_t> cu_k{0, 6, 15};  // 6 and 9 keys, pages of 4 rows
  const auto view = [](void* p, std::initializer_list<int64_t> shape) {
    return make_contiguous_view(p, DType::kInt32, Device{}, shape);
  };
  TensorView t = view(wide.data(), {2, 3});
  t.strides[0] = 5;
  const TensorView ck = view(cu_k.data(), {3});
  int32_t* const table = wide.data();  // table[b * 5 + i]
  EXPECT_TRUE(check_paged_metadata(t, ck, 5, 4).ok());
  Status s = check_paged_metadata(t, ck, 4, 4);  // page 4 is outside [0, 4)
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("block_table[1][1] = 4 is outside [0, 4)"), std::string::npos) << s.message();
  cu_k[2] = 19;  // 13 keys > 3 x 4 rows
  s = check_paged_metadata(t, ck, 5, 4);
  EXPECT_NE(s.message().find("sequence 1 has 13 keys"), std::string::npos) << s.message();
  cu_k[2] = 15;
  cu_k[1] = 8;  // sequence 0: 8 keys reach block 1 (page 0), sequence 1: 7 keys, block 1 (page 4)
  EXPECT_TRUE(check_paged_metadata(t, ck, 5, 4).ok());
  table[2] = 7;  // past sequence 0's keys: never read, never checked
  EXPECT_TRUE(check_paged_metadata(t, ck, 5, 4).ok());
  table[3] = -5;  // past the view's width: not part of the table
  EXPECT_TRUE(check_paged_metadata(t, ck, 5, 4).ok());
  cu_k[0] = 1;
  s = check_paged_metadata(t, ck, 5, 4);
  EXPECT_NE(s.message().find("cu_seqlens_k[0] must be 0"), std::string::npos) << s.message();
  cu_k[0] = 0;
  EXPECT_TRUE(check_paged_metadata(t, ck, 5, 4).ok());
  s = check_paged_metadata(t, view(cu_k.data(), {2}), 5, 4);
  EXPECT_NE(s.message().find("cu_seqlens_k must have batch + 1 = 3 entries"), std::string::npos) << s.message();
  s = check_paged_metadata(t, ck, 0, 4);  // no pages: no keys
  EXPECT_NE(s.message().find("holds 0 rows"), std::string::npos) << s.message();
}

// Without pages the call resolves to capacity 0, so that a device-side key count (not checked on
// the host) meets no page: the clamps would otherwise aim at page -1.
TEST_F(PagedVarlenErrors, NoPagesMeansCapacityZero) {
  ForwardArgs a = a_;
  a.k.shape[0] = a.v.shape[0] = 0;
  a.k.data = a.v.data = nullptr;
  for (TensorView* t : {&a.q, &a.k, &a.v, &a.out, &a.lse, &a.cu_seqlens_q, &a.cu_seqlens_k, &a.block_table}) {
    t->device = Device{DeviceType::kCUDA, 0};  // values unchecked, as for device tensors
  }
  ForwardParams p;
  const Status s = make_forward_params(a, &p);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(p.kv.enabled && p.kv.paged());
  EXPECT_EQ(p.kv.capacity, 0);
}

TEST_F(PagedVarlenErrors, NoDropoutOrMasks) {
  ForwardArgs a = a_;
  a.dropout_p = 0.1f;
  expect_error(a, StatusCode::kNotSupported, "dropout_p");
  ForwardArgs b = a_;
  b.attn_mask = b.block_table;  // any tensor: refused before its shape is looked at
  expect_error(b, StatusCode::kNotSupported, "attn_bias, attn_mask and block masks");
}

TEST_F(PagedVarlenErrors, RankOfThePages) {
  ForwardArgs a = a_;
  a.k = make_contiguous_view(a.k.data, a.k.dtype, a.k.device, {a.k.shape[0] * a.k.shape[1], a.k.shape[2], a.k.shape[3]});
  expect_error(a, StatusCode::kInvalidArgument, "k must have 4 dimensions");
}

}  // namespace
}  // namespace flashattn::test
