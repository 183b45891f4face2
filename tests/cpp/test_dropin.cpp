// What flash_attn users rely on beyond the core contract (issue 16), on every backend: causal
// with a window, head dims the CUDA build did not instantiate (run padded), non-finite inputs
// propagated the way torch's SDPA propagates them, empty tensors, and the varlen metadata
// checks. CUDA cases skip, and say so, without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>
#include <string>
#include <vector>

#include "test_util.h"

namespace flashattn::test {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

class Dropin : public testing::TestWithParam<Backend> {};

// A dtype both backends run: bfloat16 (the CUDA backend has no float32).
constexpr DType kDt = DType::kBFloat16;

// ---- 1. causal=true with a window -----------------------------------------------------------

// flash_attn's rule: causal clamps the right side of any window to 0, so causal + (w, w) is
// the window (w, 0) and causal + (-1, -1) is plain causal. Same inputs, bitwise equal outputs,
// and both meet the reference.
TEST_P(Dropin, CausalWithWindowIsTheLeftWindow) {
  const Backend backend = GetParam();
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  for (const auto& [left, right] : std::vector<std::pair<int, int>>{{5, 5}, {-1, -1}, {16, 3}}) {
    ProblemSpec a = ProblemSpec::dense(kDt, 2, 70, 90, 4, 2, 64, 64);
    a.causal = true, a.window_left = left, a.window_right = right;
    a.deterministic = true;  // the bitwise comparison below
    ProblemSpec b = a;
    b.causal = false, b.window_right = 0;
    const CaseOutcome oc = check_problem(backend, a, /*with_backward=*/true);
    if (oc.skipped) GTEST_SKIP() << oc.skip_reason;

    const HostProblem host = make_host_problem(a);
    DeviceProblem da(backend, a, host), db(backend, b, host);
    for (DeviceProblem* d : {&da, &db}) {
      ASSERT_TRUE(forward(d->forward_args()).ok());
      ASSERT_TRUE(backward(d->backward_args()).ok());
      d->download_forward();
      d->download_backward();
    }
    EXPECT_EQ(da.out(), db.out()) << "window (" << left << ", " << right << ")";
    EXPECT_EQ(da.grad_bytes(), db.grad_bytes()) << "window (" << left << ", " << right << ")";
  }
}

// ---- 2. head dims outside the instantiated set ----------------------------------------------

// On CUDA these run padded to the next built head dim (the softmax scale stays 1/sqrt(d) of the
// caller's d); on the CPU they run as they are. Forward and backward against the reference,
// dense and varlen, contiguous and with strides that are not multiples of 8.
TEST_P(Dropin, HeadDimsOutsideTheBuildMatchTheReference) {
  const Backend backend = GetParam();
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  int ran = 0;
  std::string skipped;
  for (int d : {16, 40, 59, 80, 160, 224}) {
    for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
      ProblemSpec s = ProblemSpec::dense(dt, 2, 70, 129, 4, 2, d, d);
      s.causal = (d % 3) != 0;
      s.data_seed = static_cast<uint32_t>(d * 7 + static_cast<int>(dt));
      std::vector<ProblemSpec> specs{s};
      s.layout = Layout::kPaddedOdd;  // strides not multiples of 8: the padding copy takes any
      s.causal = !s.causal;
      specs.push_back(s);
      ProblemSpec v;
      v.dtype = dt, v.varlen = true;
      v.seqlens_q = {7, 0, 65}, v.seqlens_k = {64, 9, 130};
      v.heads = 4, v.heads_k = 1, v.head_dim = v.head_dim_v = d;
      v.causal = true, v.window_left = 20;
      v.data_seed = static_cast<uint32_t>(d);
      specs.push_back(v);
      for (const ProblemSpec& spec : specs) {
        const CaseOutcome oc = check_problem(backend, spec, /*with_backward=*/true);
        if (oc.skipped) {
          skipped = oc.skip_reason;
        } else {
          ++ran;
        }
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << skipped;
}

// ---- 3. non-finite inputs -------------------------------------------------------------------

// The problem of the non-finite tests: causal, 70 x 70 (two 64-row tiles), GQA 2/1, d 64.
ProblemSpec nonfinite_spec() {
  ProblemSpec s = ProblemSpec::dense(kDt, 2, 70, 70, 2, 1, 64, 64);
  s.causal = true;
  return s;
}

enum class Poison { kNanQ, kNanK, kNanV, kInfK };

struct PoisonSite {
  int64_t b = 1, i = 10, h = 1, c = 3;  // q: (b, i, h, c); k/v: (b, j = i, head_k 0, c)
};

// torch SDPA (math backend) on the same inputs: scores = q.k * scale, masked scores -inf,
// softmax (a NaN or +inf among a row's visible scores makes the row NaN; a -inf score weighs 0),
// then P.V. Returns, per (row, head), whether torch's output row is non-finite (for NaN in V:
// only the column c; rows that do not see the poisoned key are left out: torch's math backend
// makes them NaN too, through 0 * NaN, a block-skipping kernel does not). `decided` marks the
// entries the contract fixes.
struct Expected {
  std::vector<char> nonfinite;  // (total_q, heads)
  std::vector<char> decided;
};

Expected expected_pattern(const HostProblem& host, Poison poison, const PoisonSite& site) {
  const auto& sh = host.shape;
  const int64_t S = sh.cu_seqlens_q[1];  // dense: every sequence has this length
  const int64_t H = sh.heads, D = sh.head_dim;
  Expected e;
  e.nonfinite.assign(static_cast<size_t>(sh.total_q() * H), 0);
  e.decided.assign(e.nonfinite.size(), 1);
  for (int64_t b = 0; b < sh.batch; ++b) {
    for (int64_t i = 0; i < S; ++i) {
      for (int64_t h = 0; h < H; ++h) {
        const size_t idx = static_cast<size_t>((b * S + i) * H + h);
        if (poison == Poison::kNanQ) {
          e.nonfinite[idx] = b == site.b && i == site.i && h == site.h;
          continue;
        }
        // The poisoned key is j = site.i of sequence site.b, seen by rows i >= j (causal,
        // seqlen_q == seqlen_k) of both query heads (GQA group of head_k 0).
        const bool sees = b == site.b && i >= site.i;
        if (poison == Poison::kNanK) e.nonfinite[idx] = sees;
        if (poison == Poison::kNanV) {
          e.nonfinite[idx] = sees;
          e.decided[idx] = sees || b != site.b;
        }
        if (poison == Poison::kInfK && sees) {
          // k[j, c] = +inf: the score is q[i, c] * inf + finite = +inf (row NaN) or -inf
          // (the key weighs 0; the row stays finite).
          const double qc = host.q[static_cast<size_t>(((b * S + i) * H + h) * D + site.c)];
          e.nonfinite[idx] = qc > 0;
          e.decided[idx] = qc != 0;
        }
      }
    }
  }
  return e;
}

void poison_inputs(HostProblem* host, Poison poison, const PoisonSite& site) {
  const auto& sh = host->shape;
  const int64_t S = sh.cu_seqlens_q[1];
  const int64_t row = site.b * S + site.i;
  switch (poison) {
    case Poison::kNanQ:
      host->q[static_cast<size_t>((row * sh.heads + site.h) * sh.head_dim + site.c)] = kNaN;
      break;
    case Poison::kNanK:
      host->k[static_cast<size_t>((row * sh.heads_k) * sh.head_dim + site.c)] = kNaN;
      break;
    case Poison::kNanV:
      host->v[static_cast<size_t>((row * sh.heads_k) * sh.head_dim_v + site.c)] = kNaN;
      break;
    case Poison::kInfK:
      host->k[static_cast<size_t>((row * sh.heads_k) * sh.head_dim + site.c)] = kInf;
      break;
  }
}

const char* poison_name(Poison p) {
  switch (p) {
    case Poison::kNanQ: return "NaN in q";
    case Poison::kNanK: return "NaN in k";
    case Poison::kNanV: return "NaN in v";
    case Poison::kInfK: return "+inf in k";
  }
  return "?";
}

// Checks the forward's non-finite pattern, row by row, against expected_pattern.
void check_nonfinite_forward(Backend backend, int num_splits) {
  const PoisonSite site;
  for (Poison poison : {Poison::kNanQ, Poison::kNanK, Poison::kNanV, Poison::kInfK}) {
    ProblemSpec spec = nonfinite_spec();
    spec.num_splits = num_splits;
    HostProblem host = make_host_problem(spec);
    poison_inputs(&host, poison, site);
    const Expected e = expected_pattern(host, poison, site);
    DeviceProblem dev(backend, spec, host);
    const Status s = forward(dev.forward_args());
    ASSERT_TRUE(s.ok()) << s.message();
    dev.download_forward();
    const std::vector<double> out = dev.out(), lse = dev.lse();
    const int64_t rows = host.shape.total_q(), H = host.shape.heads, D = host.shape.head_dim_v;
    int64_t nonfinite_rows = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t h = 0; h < H; ++h) {
        const size_t idx = static_cast<size_t>(r * H + h);
        const double* o = out.data() + idx * static_cast<size_t>(D);
        const double l = lse[static_cast<size_t>(h * rows + r)];
        // NaN in v: only column c of the output depends on it; LSE never does.
        const bool check_all_columns = poison != Poison::kNanV;
        bool any_nan = false, all_nan = true, others_finite = true;
        for (int64_t c = 0; c < D; ++c) {
          const bool nan = std::isnan(o[c]);
          if (check_all_columns || c == site.c) {
            any_nan |= nan;
            all_nan &= nan;
          } else {
            others_finite &= std::isfinite(o[c]);
          }
        }
        const std::string where = std::string(poison_name(poison)) + ", row " + std::to_string(r) +
                                  ", head " + std::to_string(h) + ", splits " +
                                  std::to_string(num_splits);
        EXPECT_TRUE(others_finite) << where;
        if (!e.decided[idx]) continue;
        if (e.nonfinite[idx]) {
          ++nonfinite_rows;
          EXPECT_TRUE(all_nan) << where << ": torch gives a NaN row";
          if (check_all_columns) {
            EXPECT_TRUE(std::isnan(l)) << where << ": LSE " << l;
          }
        } else {
          EXPECT_FALSE(any_nan) << where << ": torch gives a finite row";
          EXPECT_TRUE(std::isfinite(l)) << where << ": LSE " << l;
        }
      }
    }
    EXPECT_GT(nonfinite_rows, 0) << poison_name(poison);
  }
}

TEST_P(Dropin, NonFiniteInputsPropagateLikeTorch) {
  const Backend backend = GetParam();
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  check_nonfinite_forward(backend, /*num_splits=*/1);
}

// The split-KV forward (flash-decoding) and its combine step must keep NaN rows NaN too.
TEST_P(Dropin, NonFiniteInputsPropagateThroughSplitKv) {
  const Backend backend = GetParam();
  if (backend != Backend::kCuda) GTEST_SKIP() << "num_splits is a CUDA option";
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  check_nonfinite_forward(backend, /*num_splits=*/3);
}

// Backward of a NaN query row: its dq row is NaN, the other dq rows stay finite, and the dk/dv
// rows of the keys it sees are NaN (torch: their gradients sum P[i, j] terms of that row).
TEST_P(Dropin, NanQueryRowPropagatesIntoGradients) {
  const Backend backend = GetParam();
  if (backend != Backend::kCpu) GTEST_SKIP() << "the CUDA backward's non-finite pattern is not yet specified";
  const PoisonSite site;
  const ProblemSpec spec = nonfinite_spec();
  HostProblem host = make_host_problem(spec);
  poison_inputs(&host, Poison::kNanQ, site);
  DeviceProblem dev(backend, spec, host);
  ASSERT_TRUE(forward(dev.forward_args()).ok());
  ASSERT_TRUE(backward(dev.backward_args()).ok());
  dev.download_backward();
  const std::vector<double> dq = dev.dq(), dk = dev.dk(), dv = dev.dv();
  const int64_t S = 70, H = 2, D = 64;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t i = 0; i < S; ++i) {
      for (int64_t h = 0; h < H; ++h) {
        const double* g = dq.data() + ((b * S + i) * H + h) * D;
        const bool poisoned = b == site.b && i == site.i && h == site.h;
        for (int64_t c = 0; c < D; ++c) {
          const bool nan = std::isnan(g[c]);
          EXPECT_EQ(nan, poisoned) << "dq row " << b * S + i << " head " << h;
        }
      }
    }
    for (int64_t j = 0; j < S; ++j) {
      if (b != site.b) {
        for (int64_t c = 0; c < D; ++c) {
          ASSERT_TRUE(std::isfinite(dk[static_cast<size_t>((b * S + j) * D + c)])) << "dk, batch 0";
          ASSERT_TRUE(std::isfinite(dv[static_cast<size_t>((b * S + j) * D + c)])) << "dv, batch 0";
        }
      } else if (j <= site.i) {  // keys the poisoned row sees (causal)
        EXPECT_TRUE(std::isnan(dv[static_cast<size_t>((b * S + j) * D)])) << "dv row " << j;
        EXPECT_TRUE(std::isnan(dk[static_cast<size_t>((b * S + j) * D)])) << "dk row " << j;
      }
    }
  }
}

// Rows that see no key stay 0 / -inf even next to non-finite inputs elsewhere, and finite
// inputs never produce NaN (the -inf guards still hold with NaN-propagating exp2).
TEST_P(Dropin, FullyMaskedRowsStayZeroWithFiniteInputs) {
  const Backend backend = GetParam();
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  ProblemSpec spec = ProblemSpec::dense(kDt, 1, 80, 30, 2, 1, 64, 64);
  spec.causal = true;  // rows 0..49 see no key
  const CaseOutcome oc = check_problem(backend, spec, /*with_backward=*/true);
  if (oc.skipped) GTEST_SKIP() << oc.skip_reason;
}

// ---- 4. empty tensors -----------------------------------------------------------------------

// A bfloat16 tensor on a backend, its host image, and its view.
struct Tensor16 {
  Tensor16(Backend backend, std::vector<int64_t> shape_in, uint16_t fill)
      : shape(std::move(shape_in)), buffer(backend, std::max<size_t>(2, 2 * count(shape))) {
    host.assign(count(shape), fill);
    if (!host.empty()) buffer.upload(host.data());
  }
  static size_t count(const std::vector<int64_t>& s) {
    size_t n = 1;
    for (int64_t x : s) n *= static_cast<size_t>(x);
    return n;
  }
  TensorView view(Backend backend, bool zero_strides_if_empty = true) const {
    TensorView t;
    t.data = buffer.data();
    t.dtype = kDt;
    t.device = device_of(backend);
    t.ndim = static_cast<int32_t>(shape.size());
    int64_t stride = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      t.shape[d] = shape[static_cast<size_t>(d)];
      t.strides[d] = stride;
      stride *= shape[static_cast<size_t>(d)];
    }
    // What DLPack exporters hand over for empty tensors: strides of 0 (the error of issue 16).
    if (zero_strides_if_empty && host.empty()) {
      for (int d = 0; d < t.ndim; ++d) t.strides[d] = 0;
    }
    return t;
  }
  std::vector<double> read() {
    if (!host.empty()) buffer.download(host.data());
    std::vector<double> r;
    for (uint16_t x : host) r.push_back(bf16_bits_to_float(x));
    return r;
  }

  std::vector<int64_t> shape;
  std::vector<uint16_t> host;
  DeviceBuffer buffer;
};

struct FloatTensor {
  FloatTensor(Backend backend, std::vector<int64_t> shape_in, float fill)
      : shape(std::move(shape_in)), buffer(backend, std::max<size_t>(4, 4 * Tensor16::count(shape))) {
    host.assign(Tensor16::count(shape), fill);
    if (!host.empty()) buffer.upload(host.data());
  }
  TensorView view(Backend backend) const {
    TensorView t = make_contiguous_view(buffer.data(), DType::kFloat32, device_of(backend), {});
    t.ndim = static_cast<int32_t>(shape.size());
    int64_t stride = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      t.shape[d] = shape[static_cast<size_t>(d)];
      t.strides[d] = stride;
      stride *= shape[static_cast<size_t>(d)];
    }
    return t;
  }
  std::vector<float> read() {
    if (!host.empty()) buffer.download(host.data());
    return host;
  }
  std::vector<int64_t> shape;
  std::vector<float> host;
  DeviceBuffer buffer;
};

constexpr uint16_t kBf16One = 0x3f80;
constexpr uint16_t kBf16NaN = 0x7fc0;  // outputs start as NaN: unwritten elements show

struct EmptyCase {
  const char* name;
  int64_t batch, seqlen_q, seqlen_k;
};

TEST_P(Dropin, EmptyTensorsGiveEmptyOrZeroOutputs) {
  const Backend backend = GetParam();
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  const int64_t H = 4, Hk = 2, D = 64;
  for (const EmptyCase& ec : {EmptyCase{"batch 0", 0, 5, 7}, EmptyCase{"seqlen_q 0", 2, 0, 7},
                              EmptyCase{"seqlen_k 0", 2, 5, 0}, EmptyCase{"all 0", 0, 0, 0}}) {
    SCOPED_TRACE(ec.name);
    const int64_t B = ec.batch, Sq = ec.seqlen_q, Sk = ec.seqlen_k;
    Tensor16 q(backend, {B, Sq, H, D}, kBf16One), k(backend, {B, Sk, Hk, D}, kBf16One),
        v(backend, {B, Sk, Hk, D}, kBf16One), out(backend, {B, Sq, H, D}, kBf16NaN),
        dout(backend, {B, Sq, H, D}, kBf16One), dq(backend, {B, Sq, H, D}, kBf16NaN),
        dk(backend, {B, Sk, Hk, D}, kBf16NaN), dv(backend, {B, Sk, Hk, D}, kBf16NaN);
    FloatTensor lse(backend, {B, H, Sq}, std::numeric_limits<float>::quiet_NaN());
    ForwardArgs f;
    f.q = q.view(backend), f.k = k.view(backend), f.v = v.view(backend);
    f.out = out.view(backend), f.lse = lse.view(backend);
    f.causal = true;
    Status s = forward(f);
    ASSERT_TRUE(s.ok()) << s.message();
    for (double x : out.read()) EXPECT_EQ(x, 0.0) << "out with no key";
    for (float x : lse.read()) EXPECT_EQ(x, -std::numeric_limits<float>::infinity()) << "lse with no key";

    BackwardArgs g;
    g.q = f.q, g.k = f.k, g.v = f.v, g.out = f.out, g.lse = f.lse, g.causal = true;
    g.dout = dout.view(backend), g.dq = dq.view(backend), g.dk = dk.view(backend), g.dv = dv.view(backend);
    s = backward(g);
    ASSERT_TRUE(s.ok()) << s.message();
    for (Tensor16* t : {&dq, &dk, &dv}) {
      for (double x : t->read()) EXPECT_EQ(x, 0.0) << "gradient without any (query, key) pair";
    }
  }
}

// Varlen with no key rows at all (total_k 0): on CUDA max_seqlen_k may then be 0.
TEST_P(Dropin, VarlenWithoutKeysGivesZeroOutputs) {
  const Backend backend = GetParam();
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  const int64_t H = 2, D = 64, Tq = 9;
  Tensor16 q(backend, {Tq, H, D}, kBf16One), k(backend, {0, H, D}, kBf16One),
      v(backend, {0, H, D}, kBf16One), out(backend, {Tq, H, D}, kBf16NaN);
  FloatTensor lse(backend, {H, Tq}, 0.0f);
  const std::vector<int32_t> cu_q = {0, 4, 9}, cu_k = {0, 0, 0};
  DeviceBuffer cq(backend, 12), ck(backend, 12);
  cq.upload(cu_q.data());
  ck.upload(cu_k.data());
  ForwardArgs f;
  f.q = q.view(backend), f.k = k.view(backend), f.v = v.view(backend);
  f.out = out.view(backend), f.lse = lse.view(backend);
  f.cu_seqlens_q = make_contiguous_view(cq.data(), DType::kInt32, device_of(backend), {3});
  f.cu_seqlens_k = make_contiguous_view(ck.data(), DType::kInt32, device_of(backend), {3});
  f.max_seqlen_q = 5, f.max_seqlen_k = 0;
  const Status s = forward(f);
  ASSERT_TRUE(s.ok()) << s.message();
  for (double x : out.read()) EXPECT_EQ(x, 0.0);
  for (float x : lse.read()) EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
}

// ---- 5. varlen metadata ---------------------------------------------------------------------

struct BadMetadata {
  const char* name;
  std::vector<int32_t> cu_q, cu_k;
  int32_t max_q, max_k;
  const char* needle;
};

std::vector<BadMetadata> bad_metadata() {
  // q has 10 rows, k 14; the good metadata is cu_q {0, 4, 4, 10}, cu_k {0, 6, 9, 14}, max 6, 6.
  return {
      {"past_the_tensor", {0, 4, 4, 11}, {0, 6, 9, 14}, 6, 6, "cu_seqlens_q[batch] = 11 exceeds the 10 rows of q"},
      {"non_monotone", {0, 4, 4, 10}, {0, 6, 3, 14}, 6, 6, "cu_seqlens_k must be non-decreasing"},
      {"max_too_small", {0, 4, 4, 10}, {0, 6, 9, 14}, 6, 5, "max_seqlen_k is 5 but cu_seqlens_k holds a sequence of length 6"},
      {"first_not_zero", {2, 4, 4, 10}, {0, 6, 9, 14}, 6, 6, "cu_seqlens_q[0] must be 0"},
  };
}

// forward(check_cu_seqlens = true) and check_varlen_metadata() report every bad case by name,
// on the CPU and, reading device memory, on CUDA.
TEST_P(Dropin, VarlenMetadataChecksNameTheProblem) {
  const Backend backend = GetParam();
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  const int64_t H = 2, D = 64;
  Tensor16 q(backend, {10, H, D}, kBf16One), k(backend, {14, H, D}, kBf16One),
      v(backend, {14, H, D}, kBf16One), out(backend, {10, H, D}, kBf16NaN);
  for (const BadMetadata& m : bad_metadata()) {
    SCOPED_TRACE(m.name);
    DeviceBuffer cq(backend, 16), ck(backend, 16);
    cq.upload(m.cu_q.data());
    ck.upload(m.cu_k.data());
    const TensorView tq = make_contiguous_view(cq.data(), DType::kInt32, device_of(backend), {4});
    const TensorView tk = make_contiguous_view(ck.data(), DType::kInt32, device_of(backend), {4});
    ForwardArgs f;
    f.q = q.view(backend), f.k = k.view(backend), f.v = v.view(backend), f.out = out.view(backend);
    f.cu_seqlens_q = tq, f.cu_seqlens_k = tk;
    f.max_seqlen_q = m.max_q, f.max_seqlen_k = m.max_k;
    f.check_cu_seqlens = true;
    Status s = forward(f);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
    EXPECT_NE(s.message().find(m.needle), std::string::npos) << s.message();
    s = check_varlen_metadata(tq, tk, 10, 14, m.max_q, m.max_k);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
    EXPECT_NE(s.message().find(m.needle), std::string::npos) << s.message();
  }
  // The good metadata passes both.
  const std::vector<int32_t> cu_q = {0, 4, 4, 10}, cu_k = {0, 6, 9, 14};
  DeviceBuffer cq(backend, 16), ck(backend, 16);
  cq.upload(cu_q.data());
  ck.upload(cu_k.data());
  const TensorView tq = make_contiguous_view(cq.data(), DType::kInt32, device_of(backend), {4});
  const TensorView tk = make_contiguous_view(ck.data(), DType::kInt32, device_of(backend), {4});
  EXPECT_TRUE(check_varlen_metadata(tq, tk, 10, 14, 6, 6).ok());
  ForwardArgs f;
  f.q = q.view(backend), f.k = k.view(backend), f.v = v.view(backend), f.out = out.view(backend);
  f.cu_seqlens_q = tq, f.cu_seqlens_k = tk, f.max_seqlen_q = 6, f.max_seqlen_k = 6;
  f.check_cu_seqlens = true;
  const Status s = forward(f);
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(DropinMetadata, CheckVarlenMetadataValidatesItsArguments) {
  std::vector<int32_t> cu = {0, 3, 5};
  const TensorView t = make_contiguous_view(cu.data(), DType::kInt32, Device{}, {3});
  TensorView f32 = t;
  f32.dtype = DType::kFloat32;
  EXPECT_NE(check_varlen_metadata(f32, t, 5, 5, 0, 0).message().find("cu_seqlens_q must have dtype int32"),
            std::string::npos);
  TensorView shorter = t;
  shorter.shape[0] = 2;
  EXPECT_NE(check_varlen_metadata(t, shorter, 5, 5, 0, 0).message().find("cu_seqlens_k must have 3 entries"),
            std::string::npos);
  EXPECT_NE(check_varlen_metadata(t, t, -1, 5, 0, 0).message().find("must be >= 0"), std::string::npos);
  EXPECT_TRUE(check_varlen_metadata(t, t, 5, 5, 3, 3).ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, Dropin, testing::ValuesIn(all_backends()),
                         [](const testing::TestParamInfo<Backend>& param_info) {
                           return std::string(backend_name(param_info.param));
                         });

}  // namespace
}  // namespace flashattn::test
