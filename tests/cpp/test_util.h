// Shared test machinery: backends, element conversions, device buffers, strided views, random
// problems, the fp64 reference and the low-precision naive emulation, and the acceptance
// criterion of DESIGN.md.
//
// Data flow of a correctness test:
//   ProblemSpec --make_host_problem--> HostProblem (random values, already rounded to the
//   storage dtype, in the reference's varlen layout)
//   HostProblem --DeviceProblem--> tensors on the backend in the requested layout
//   HostProblem --run_reference / run_naive_lowp--> expected results
//   DeviceProblem results vs expected --meets_criterion--> pass / fail
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/switches.h"
#include "flashattn/c_api.h"
#include "flashattn/flashattn.h"
#include "reference/reference.h"

namespace flashattn::test {

// Sets one of the library's process-wide switches (core/switches.h) for a scope, restoring what
// it was (also when an ASSERT leaves the scope early).
class ScopedSwitch {
 public:
  ScopedSwitch(detail::Switch s, bool on) : s_(s), saved_(detail::switch_on(s)) { detail::set_switch(s, on); }
  ~ScopedSwitch() { detail::set_switch(s_, saved_); }
  ScopedSwitch(const ScopedSwitch&) = delete;
  ScopedSwitch& operator=(const ScopedSwitch&) = delete;

 private:
  detail::Switch s_;
  bool saved_;
};

// ---- backends -------------------------------------------------------------------------------

enum class Backend { kCpu, kCuda };

const char* backend_name(Backend b);
Device device_of(Backend b);
// All backends, for INSTANTIATE_TEST_SUITE_P.
std::vector<Backend> all_backends();

// Whether the backend can run here: the CPU always; CUDA when flashattn::cuda_available().
// Tests call FLASHATTN_SKIP_IF_UNAVAILABLE(backend) first; it must be a macro because
// GTEST_SKIP() returns from the test body itself.
bool backend_available(Backend b);
// Whether a split-KV decode launch of 2-8 splits and `ctas` CTAs (row groups x splits) merges
// within thread-block clusters here: a Hopper GPU, a build with sm_90a code, and at most two CTAs
// per SM (sm80/fwd_launch.h).
bool split_clusters_expected(long long ctas);
// Whether a CUDA KV-cache call of prefill shape at head dim d runs on the sm90 cache kernel here
// when detail::Switch::kSm90Cache is on (sm90/fwd.h fwd_cache_declines): a Hopper GPU, a build
// with sm_90a code, FLASHATTN_CUDA_PATH not sm80, and d running at a built 64, 128 or 256
// (cuda_run_head_dim: a head dim not built runs padded to the next built one).
bool sm90_cache_expected(int head_dim);

#define FLASHATTN_SKIP_IF_UNAVAILABLE(backend)                                            \
  do {                                                                                    \
    if (!::flashattn::test::backend_available(backend)) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// ---- element conversions --------------------------------------------------------------------

uint16_t float_to_half_bits(float f);  // round to nearest even, overflow to inf, NaN kept
float half_bits_to_float(uint16_t h);
uint16_t float_to_bf16_bits(float f);  // round to nearest even, NaN kept
float bf16_bits_to_float(uint16_t h);

// The value x becomes when stored in dtype (via float for the 16-bit types).
double round_to(DType dtype, double x);
// Unit roundoff (half an ulp at 1) of a floating dtype: 2^-24, 2^-11, 2^-8.
double unit_roundoff(DType dtype);

// ---- device memory --------------------------------------------------------------------------

// Owning byte buffer on a backend: host memory for the CPU, cudaMalloc for CUDA. Every CUDA
// call is checked; a failure throws std::runtime_error (GoogleTest reports it as a failure).
class DeviceBuffer {
 public:
  DeviceBuffer(Backend backend, size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  void upload(const void* src);    // bytes() bytes from host memory
  void download(void* dst) const;  // bytes() bytes to host memory

 private:
  Backend backend_;
  size_t bytes_;
  void* ptr_ = nullptr;
};

// A buffer of `numel` elements of one dtype with a host image. Views are carved out of it; the
// elements no view covers are padding, which must never be read (inputs: filled with NaN) nor
// written (outputs: checked by padding_untouched()).
class Arena {
 public:
  Arena(Backend backend, DType dtype, int64_t numel);  // host image: all NaN (int32: 0x7fffffff)

  DType dtype() const { return dtype_; }
  int64_t numel() const { return numel_; }
  Backend backend() const { return backend_; }
  void* device_data() const { return buffer_.data(); }

  void set(int64_t i, double v);  // rounds to the dtype
  double get(int64_t i) const;
  void mark_covered(int64_t i) { covered_[static_cast<size_t>(i)] = 1; }

  void upload();    // host image -> device; remembers the image for padding_untouched()
  void download();  // device -> host image
  // The raw bytes of the host image (for bitwise comparisons).
  const std::vector<unsigned char>& bytes() const { return image_; }
  testing::AssertionResult padding_untouched(const char* name) const;

 private:
  Backend backend_;
  DType dtype_;
  int64_t numel_;
  int elem_size_;
  std::vector<unsigned char> image_;
  std::vector<unsigned char> uploaded_;
  std::vector<unsigned char> covered_;
  DeviceBuffer buffer_;
};

// A strided view into an Arena; logical element order is row-major over shape.
struct View {
  std::shared_ptr<Arena> arena;
  int64_t offset = 0;
  int ndim = 0;
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t strides[4] = {0, 0, 0, 0};

  bool defined() const { return arena != nullptr; }
  int64_t numel() const;
  int64_t element(int64_t linear) const;          // arena index of logical element `linear`
  TensorView tensor() const;                      // the TensorView handed to flashattn
  void write(const std::vector<double>& values);  // logical order, into the host image
  std::vector<double> read() const;               // logical order, from the host image
};

// How a problem's tensors are laid out in memory (all views keep the last stride 1).
enum class Layout {
  kContiguous,  // row-major
  kPadded,      // every stride padded by 8 elements (16-byte aligned rows for 16-bit types)
  kPaddedOdd,   // every stride padded by 3 elements (rows not 16-byte aligned)
  kHeadMajor,   // memory order (batch, heads, seqlen, dim) viewed as (batch, seqlen, heads, dim)
  kPacked,      // q, k, v (and dq, dk, dv) as slices of one packed (.., heads+2*heads_k, dim)
                // buffer when the shapes allow, else k and v packed and q padded
};
const char* layout_name(Layout l);

// One view over a fresh arena with `shape` (rank 2..4, last dim contiguous).
View alloc_view(Backend backend, DType dtype, Layout layout, const std::vector<int64_t>& shape);
// Several views sharing one buffer: logical shapes prefix + {heads[i], dim}, packed along the
// head dimension of a (prefix..., sum(heads), dim) buffer.
std::vector<View> alloc_packed(Backend backend, DType dtype, const std::vector<int64_t>& prefix,
                               const std::vector<int64_t>& heads, int64_t dim);

// The C ABI's tensor for a view (for the C ABI tests).
flashattn_tensor to_c(const TensorView& t);

// ---- problems -------------------------------------------------------------------------------

enum class Alibi { kNone, kHeads, kBatchHeads };

// Learnable sink logits per query head: kRandom ~ N(0.5, 1.5) (beside the scores; with >= 3
// heads head 1 is -inf), kLarge in [4, 8] (above most scores: the sink sets the row maximum),
// kHuge in [100, 110] (exp(sink - score) overflows float32), kNegInf all -inf (= no sink).
enum class Sink { kNone, kRandom, kLarge, kHuge, kNegInf };
const char* sink_name(Sink s);

// Sink logits of a KV-cache test (test_kvcache, test_mla) for `heads` query heads, by head % 4:
// beside the scores (~N(0.5, 1.5)), -inf (that head has no sink), above every score (4..8: the
// sink sets the row maximum), beside again.
std::vector<float> sink_logits(int heads, uint32_t seed);

struct ProblemSpec {
  DType dtype = DType::kFloat16;
  bool varlen = false;
  // Per-sequence lengths (size batch). Dense problems need all entries equal.
  std::vector<int> seqlens_q{64};
  std::vector<int> seqlens_k{64};
  int heads = 1;
  int heads_k = 1;
  int head_dim = 64;
  int head_dim_v = 64;
  Layout layout = Layout::kContiguous;

  float softmax_scale = 0.0f;  // 0 = default 1/sqrt(head_dim)
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  float softcap = 0.0f;
  Alibi alibi = Alibi::kNone;
  float dropout_p = 0.0f;
  uint64_t dropout_seed = 0;
  uint64_t dropout_offset = 0;
  bool deterministic = false;
  int num_threads = 0;  // CPU workers; 0 = all
  int num_splits = 0;   // forward split-KV (CUDA); 0 = heuristic

  Sink sink = Sink::kNone;  // learnable_sink (and dsink in the backward)

  uint32_t data_seed = 1;  // seeds the random inputs
  double q_scale = 1.0;    // q ~ q_scale * N(0, 1): sharper or flatter softmax

  int batch() const { return static_cast<int>(seqlens_q.size()); }
  static ProblemSpec dense(DType dtype, int batch, int seqlen_q, int seqlen_k, int heads,
                           int heads_k, int head_dim, int head_dim_v);
  std::string describe() const;
};

// Inputs exactly as stored in the tensors (rounded to the dtype), in the reference layout.
struct HostProblem {
  reference::Shape shape;
  reference::Options opt;
  std::vector<double> q, k, v, dout;
  std::vector<float> alibi;  // as passed to flashattn: (heads) or (batch, heads)
  std::vector<float> sink;   // as passed to flashattn: (heads); empty without a sink
  std::vector<int32_t> cu_seqlens_q, cu_seqlens_k;
};

HostProblem make_host_problem(const ProblemSpec& spec);

struct Results {
  std::vector<double> out, lse;  // reference layout: out (total_q, heads, dv), lse (heads, total_q)
  std::vector<double> dq, dk, dv;
  std::vector<double> dsink;  // (heads); empty without a sink
};

Results run_reference(const HostProblem& p, bool with_backward);

// The naive attention computed the way a straightforward implementation in the storage dtype
// computes it (PyTorch eager in fp16/bf16: matmuls accumulate in fp32 and round their result
// once; elementwise ops and softmax round their result). Precisely, with R() = round_to(dtype):
//   forward:  S = R(q.k^T); S = R(S * scale); softcap: S = R(c * R(tanh(S / c)));
//             ALiBi: S = R(S + bias); attn_bias: S = R(S + attn_bias); mask (window, keep);
//             P = R(softmax(S)) (softmax and LSE in fp64 from the
//             rounded S); Pd = R(P * keep / (1-p)); out = R(Pd V).
//   backward: dV_h = R(Pd^T dout) per query head, dV = R(sum over the GQA group);
//             dPd = R(dout V^T); dP = R(dPd * keep / (1-p)); D = rowsum(dout * out) (fp64,
//             from the rounded out: the stored output is an input of the backward);
//             dS = R(P * (dP - D)); softcap: dS = R(dS * (1 - tanh^2)); dS = R(dS * scale);
//             dQ = R(dS K); dK_h = R(dS^T Q), dK = R(sum over the GQA group).
// With exact = true nothing is rounded: an independent second fp64 implementation, used to
// cross-check the reference.
Results run_naive_lowp(const HostProblem& p, DType dtype, bool with_backward, bool exact = false);

// The problem's tensors on a backend. Inputs are written and uploaded by the constructor;
// outputs start as NaN (so an unwritten output element fails the comparison).
class DeviceProblem {
 public:
  DeviceProblem(Backend backend, const ProblemSpec& spec, const HostProblem& host);

  ForwardArgs forward_args() const;
  BackwardArgs backward_args() const;  // out and lse are the tensors the forward wrote

  void download_forward();   // out, lse
  void download_backward();  // dq, dk, dv
  // Results in the reference layout (valid after the downloads).
  std::vector<double> out() const { return out_.read(); }
  std::vector<double> lse() const;
  std::vector<double> dq() const { return dq_.read(); }
  std::vector<double> dk() const { return dk_.read(); }
  std::vector<double> dv() const { return dv_.read(); }
  std::vector<double> dsink() const { return dsink_.defined() ? dsink_.read() : std::vector<double>{}; }
  // Raw bytes of the gradient buffers (after download_backward), for bitwise comparisons.
  std::vector<unsigned char> grad_bytes() const;

  testing::AssertionResult outputs_padding_untouched() const;

 private:
  Backend backend_;
  ProblemSpec spec_;
  const HostProblem& host_;
  View q_, k_, v_, out_, lse_, dout_, dq_, dk_, dv_;
  View alibi_, cu_q_, cu_k_;
  View sink_, dsink_;  // (heads) float32, when spec.sink != kNone
};

// ---- acceptance criterion -------------------------------------------------------------------

struct ErrorStats {
  double max_abs = 0.0;   // +inf if an infinity does not match or a NaN is present
  double mean_abs = 0.0;  // over the finite-reference entries
  int64_t nan_count = 0;
  int64_t worst = -1;  // index of the largest error
};
ErrorStats error_stats(const std::vector<double>& ours, const std::vector<double>& ref);

// DESIGN.md: max|ours - ref| <= 2 * max|lowp - ref| + atol, atol = 2 u (M + 0.3) with u the
// unit roundoff of dtype and M = max(max|ref|, magnitude). For float32 (lowp empty):
// max|ours - ref| <= 1e-4 * M + 1e-6. Infinite references (LSE of an empty row) must match
// exactly; a NaN never passes.
// `magnitude` gives the scale of the terms a quantity is summed from when that exceeds the
// result: a gradient can be ~0 by cancellation (one visible key: dQ = dK = 0 exactly) while the
// rounding errors scale with the other gradients. check_problem passes the largest |reference|
// over dQ, dK and dV for each gradient, and 0 for O and LSE.
testing::AssertionResult meets_criterion(const std::string& what, DType dtype,
                                         const std::vector<double>& ours,
                                         const std::vector<double>& ref,
                                         const std::vector<double>& lowp, double magnitude = 0.0);

// max |x| over the finite entries of x.
double max_abs(const std::vector<double>& x);
// The `magnitude` for gradients: max |reference| over dQ, dK and dV.
double grad_magnitude(const Results& ref);

// Whether the CUDA backend may answer kNotSupported for this problem (float32, a dtype not
// built, a head dim or head_dim_v above every built one, strides that break 16-byte alignment
// on a side read directly at a built head dim; other head dims and head_dim_v != head_dim run
// padded and must succeed). The tests skip such cases; a kNotSupported outside this domain
// fails.
bool cuda_may_not_support(const ProblemSpec& spec);

// Whether this build instantiated the CUDA kernels for `dtype` (float16 / bfloat16;
// FLASHATTN_CUDA_DTYPES).
bool cuda_dtype_built(DType dtype);

// The head dim the CUDA backend runs a (head_dim, head_dim_v) call at in this build: the
// smallest instantiated head dim >= both (FLASHATTN_CUDA_HEAD_DIMS); 0 when none is.
int cuda_run_head_dim(int head_dim, int head_dim_v);

// Runs the forward (and backward) of `spec` on `backend` and checks every output against the
// reference with meets_criterion (failures are recorded with EXPECT/ADD_FAILURE). When the case
// must be skipped (no GPU, or kNotSupported inside cuda_may_not_support) it returns
// skipped = true and the reason; the caller issues GTEST_SKIP() << reason.
struct CaseOutcome {
  bool skipped = false;
  std::string skip_reason;
};
CaseOutcome check_problem(Backend backend, const ProblemSpec& spec, bool with_backward);

}  // namespace flashattn::test
