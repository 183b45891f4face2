// CUDA backend entry points: device selection, the checks only the GPU path needs (dtype,
// head dim, alignment, architecture), then the kernel dispatch: directly, on zero-padded
// copies for a head dim the build did not instantiate or a head_dim_v that differs from
// head_dim, or no kernel at all for empty inputs.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "core/backend.h"
#include "core/switches.h"
#include "cuda/bwd_dbias.h"
#include "cuda/common/build_config.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/kernel_facts.h"
#include "cuda/common/variants.h"
#include "cuda/common/workspace.h"
#include "cuda/kvcache.h"
#include "cuda/mla/mla.h"
#include "cuda/pad.h"
#include "cuda/sm80/bwd.h"
#include "cuda/sm80/fwd.h"
#include "cuda/sm90/bwd.h"
#include "cuda/sm90/fwd.h"

namespace flashattn {
namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// The kernels copy 16-byte chunks: 16-byte aligned data and strides of whole chunks (8 16-bit
// or 16 e4m3 elements; elem_bytes is the operand's element size).
Status check_operand(const char* name, const void* ptr, const Strides3& s, int elem_bytes = 2) {
  if (!aligned16(ptr)) {
    return Status::NotSupported(std::string(name) +
                                ": the CUDA backend needs 16-byte aligned data pointers");
  }
  const int64_t chunk = 16 / elem_bytes;
  if (s.batch % chunk != 0 || s.row % chunk != 0 || s.head % chunk != 0) {
    return Status::NotSupported(std::string(name) + ": the CUDA backend needs strides that are multiples of " +
                                std::to_string(chunk) + " elements, got (" +
                                std::to_string(s.batch) + ", " + std::to_string(s.row) + ", " +
                                std::to_string(s.head) + ")");
  }
  return Status::Ok();
}

// Makes `device` current and reads its compute capability's major version; the kernels need 8+.
Status use_device(int device, int* major) {
  FLASHATTN_CUDA_TRY(cudaSetDevice(device));
  FLASHATTN_CUDA_TRY(cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, device));
  if (*major < 8) {
    return Status::NotSupported("the CUDA backend needs compute capability 8.0 or newer; device " +
                                std::to_string(device) + " is " + std::to_string(*major) + ".x");
  }
  return Status::Ok();
}

// Which kernels a Hopper GPU runs, from FLASHATTN_CUDA_PATH (read once per process):
//   unset/auto  the sm90 kernels where they take the problem and are expected to be faster,
//               the sm80 kernels for the rest (sm90/fwd.h says which);
//   sm90        the sm90 kernels wherever they can run the problem at all (tests use this so
//               that small shapes reach them), and their errors are returned, not fallen back;
//   sm80        the sm80 kernels only.
// scripts/gpu-check.sh runs the GPU tests under each, so one H200 covers both paths.
enum class CudaPath { kAuto, kSm90, kSm80 };

CudaPath cuda_path() {
  static const CudaPath path = [] {
    const char* v = std::getenv("FLASHATTN_CUDA_PATH");
    if (v != nullptr && std::strcmp(v, "sm80") == 0) return CudaPath::kSm80;
    if (v != nullptr && std::strcmp(v, "sm90") == 0) return CudaPath::kSm90;
    return CudaPath::kAuto;
  }();
  return path;
}

// Head dims: every head dim up to kMaxCudaHeadDim runs. One the build instantiated runs
// directly; any other runs at the next larger built one, on zero-padded copies of the operands
// (zero columns add nothing to q.k nor to P.V, and their gradients are zero), with the
// softmax scale already resolved from the caller's head dim (validate.cpp), then the first
// head_dim columns of the results are copied back.
//
// Why padding rather than more instantiations: every head dim costs 28 instantiations (forward,
// KV-cache forward and backward x no mask / window x plain / score modifiers, plus the forward's
// and the backward's bias-and-mask variants, x fp16 / bf16). flash_attn's sizes 160 and 224
// would add 56 (168 -> 224 sm80-class files, a third more build time); every multiple of 8 up
// to 256 would add 728 (about 5x the build).
// Padding costs, per call, one copy of each padded operand (q, k, v; out, dout, dq, dk, dv in
// the backward) at copy bandwidth, plus the matrix products over the padded width: d 80 -> 96 and 160 -> 192
// are 20% more FLOPs, 224 -> 256 14%, 40 -> 64 60%, 16 -> 32 100%. Not yet timed on a GPU;
// docs/SEMANTICS.md states the rule.
//
// head_dim_v != head_dim (DeepSeek-V3 prefill 192/128, or 128/64, 64/128, ...) runs the same
// way: the kernels know one head dim, so the call runs as the same-d problem at
// D = run_head_dim(max(head_dim, head_dim_v)), padding only the side whose width is not D:
//   q-side  q, k (and dq, dk)        when head_dim   != D;
//   v-side  v, out (and dout, dv)    when head_dim_v != D.
// Why this is exact, with S = scale * Q K^T and P = softmax(S) (row statistics m, l, LSE):
//   forward   Q K^T sums over the q-side columns: zero columns of q and k add 0, so S, P,
//             the row max, the row sum and the LSE (sink included) are those of the caller.
//             O = P V: column c of O is P times column c of V, so the zero columns of V give
//             zero columns of O and the first head_dim_v columns are the caller's O.
//   backward  D_i = rowsum(dO o O): the padded columns of dO and O are both 0, so D (and with
//             it dsink = -sum P_sink D) is unchanged. dP = dO V^T sums over the v-side columns,
//             where the padded ones contribute 0 * 0: unchanged, hence dS = P o (dP - D)
//             unchanged. dQ = dS K and dK = dS^T Q are column by column in K and Q: the first
//             head_dim columns are the caller's, the rest (k, q zero) are 0 and dropped.
//             dV = P^T dO: column c is P^T times column c of dO; the zero columns of dO give
//             zero columns of dV, dropped. Dropout draws its mask from (batch, head, row,
//             col), none of which the padding changes.
// Rounding: the padded call is the width-D kernel on zero-padded data, so it is bit for bit
// what a caller who zero-pads v (and dout) to D gets (tests/cpp/test_head_dim_v.cpp checks
// that, and the values against the float64 reference).
// Cost (docs/SEMANTICS.md): the matrix products at width D, e.g. 192/128 forward
// (192 + 192) / (192 + 128) = 1.2x the FLOPs, backward (5 * 192) / (3 * 192 + 2 * 128) = 1.15x;
// plus a copy of v (and out; backward: v, out, dout in and dv out) at copy bandwidth.
// One exception, 192/128 on a Hopper GPU: the sm90 forward and backward have kernels of that
// shape (Q, K, dQ, dK 192 wide; V, O, dO, dV 128), and where they take the call (sm90/fwd.h
// fwd_declines, sm90/bwd.h bwd_declines) the call runs on them unpadded (native_head_dim_v,
// native_head_dim_v_backward). The forward's out and LSE are what the padded call computes (up
// to rounding: the key blocks differ, 128 against 112). The backward's kernels are the d192
// split-role ones with V-side products over 128 columns (the same 64-key and 64-query blocks), so
// where the padded call would run the sm90 d192 backward the native one gives its bits: the
// padded columns only add zero products (dP) or are dropped (dV). A backward the sm90 backward
// declines at 192/128 (softcap, ALiBi, a block mask, dropout, ...) stays padded, as before:
// sm90 d192 where it takes the padded call, else sm80; the padding of out and dout leaves
// D_i = rowsum(dO o O) unchanged.
// kMaxCudaHeadDim bounds both head dims here; forward_kvcache at MLA decode's 576/512 runs on
// its own kernel (cuda/mla, mla_kvcache below), every other pair above 256 is NotSupported.
constexpr int kMaxCudaHeadDim = 256;

// The built head dim that head_dim runs at (itself when built); 0 when none is large enough.
int run_head_dim(int head_dim) {
  for (int d : cuda::kAllHeadDims) {  // ascending
    if (d >= head_dim && cuda::head_dim_built(d)) return d;
  }
  return 0;
}

// Which operands of a call run on zero-padded workspace copies: the q-side ones when head_dim
// is not the width the kernels run at, the v-side ones when head_dim_v is not (see above).
struct PadPlan {
  int run_dim = 0;  // D, the head dim the kernels run at
  bool qk = false;  // q, k, dq, dk
  bool v = false;   // v, out, dout, dv
  bool any() const { return qk || v; }
};

// Checks common to forward and backward; selects the device. *plan receives the head dim the
// kernels run at and which operands are padded, *major the device's compute capability major
// version.
Status prepare(const QKVParams& p, PadPlan* plan, int* major_out = nullptr) {
  // FP8 (issue 21): an e4m3 KV cache read by float16/bfloat16 queries runs on the sm80 cache
  // kernels (FwdTraits::Fp8Cache); the FP8 forward (an e4m3 q) runs on the sm90 kernels, and
  // only from cuda_forward (fp8_forward, before this): forward_kvcache with an e4m3 q has no
  // CUDA kernel.
  if (p.dtype == DType::kFloat8E4M3) {
    return Status::NotSupported("q has dtype float8_e4m3: the CUDA backend runs the FP8 forward only "
                                "(flash_attn_func / varlen, on Hopper GPUs), not forward_kvcache "
                                "(the cpu backend implements it; an e4m3 k_cache/v_cache with "
                                "float16/bfloat16 q runs on CUDA)");
  }
  const bool fp8_cache = p.kv_dtype == DType::kFloat8E4M3;
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) {
    return Status::NotSupported(std::string("q has dtype ") + dtype_name(p.dtype) +
                                "; the CUDA backend supports float16 and bfloat16 "
                                "(float32 runs on the cpu backend)");
  }
  if (!cuda::dtype_built(p.dtype)) {
    return Status::NotSupported(std::string("dtype ") + dtype_name(p.dtype) +
                                " was not built into this flashattn (FLASHATTN_CUDA_DTYPES)");
  }
  const struct {
    const char* name;
    int value;
  } dims[] = {{"head_dim", p.head_dim}, {"head_dim_v", p.head_dim_v}};
  for (const auto& d : dims) {
    if (d.value > kMaxCudaHeadDim) {
      return Status::NotSupported(std::string(d.name) + " " + std::to_string(d.value) +
                                  " is not supported by the CUDA backend; supported: head_dim and "
                                  "head_dim_v 1.." + std::to_string(kMaxCudaHeadDim) +
                                  ", and forward_kvcache at head_dim 576 with head_dim_v 512 (MLA decode)"
                                  " (the cpu backend takes up to 1024)");
    }
  }
  const int widest = p.head_dim > p.head_dim_v ? p.head_dim : p.head_dim_v;
  plan->run_dim = run_head_dim(widest);
  if (plan->run_dim == 0) {
    const std::string which = p.head_dim_v == p.head_dim
                                  ? "head_dim " + std::to_string(p.head_dim)
                                  : (p.head_dim > p.head_dim_v ? "head_dim " : "head_dim_v ") +
                                        std::to_string(widest) + " (the larger of head_dim " +
                                        std::to_string(p.head_dim) + " and head_dim_v " +
                                        std::to_string(p.head_dim_v) + ")";
    return Status::NotSupported(which +
                                " was not built into this flashattn (FLASHATTN_CUDA_HEAD_DIMS), "
                                "nor any larger head dim to pad it to");
  }
  plan->qk = p.head_dim != plan->run_dim;
  plan->v = p.head_dim_v != plan->run_dim;
  // An e4m3 cache runs at the head dims of its own instantiations, unpadded (a padded copy of
  // the cache would be a 16-bit one, and would cost more than the attention).
  if (fp8_cache && cuda::head_dim_in(p.head_dim, cuda::kFp8CacheHeadDims) && !cuda::head_dim_built(p.head_dim)) {
    return Status::NotSupported("head_dim " + std::to_string(p.head_dim) + " with a float8_e4m3 k_cache/v_cache "
                                "was not built into this flashattn (FLASHATTN_CUDA_HEAD_DIMS)");
  }
  if (fp8_cache && (plan->any() || !cuda::head_dim_in(p.head_dim, cuda::kFp8CacheHeadDims))) {
    return Status::NotSupported("head_dim " + std::to_string(p.head_dim) +
                                " with a float8_e4m3 k_cache/v_cache is not supported by the CUDA backend "
                                "(head dims 64, 128 and 256; the cpu backend takes any)");
  }
  if (p.batch > 65535 || p.heads > 65535) {
    return Status::NotSupported("the CUDA backend supports batch and heads up to 65535, got batch " +
                                std::to_string(p.batch) + " and heads " + std::to_string(p.heads));
  }
  // The padded operands are copied with a strided kernel, so only those the kernels read
  // directly need their 16-byte alignment.
  if (!plan->qk) {
    if (Status s = check_operand("q", p.q, p.q_strides); !s.ok()) return s;
    if (Status s = check_operand("k", p.k, p.k_strides, int(dtype_size(p.kv_dtype))); !s.ok()) return s;
  }
  if (!plan->v) {
    if (Status s = check_operand("v", p.v, p.v_strides, int(dtype_size(p.kv_dtype))); !s.ok()) return s;
  }

  int major = 0;
  if (Status s = use_device(p.device.index, &major); !s.ok()) return s;
  if (major_out != nullptr) *major_out = major;
  return Status::Ok();
}

// Runs a forward the kernels take directly: on a Hopper GPU (compute capability 9) the sm90
// kernels where cuda_path() lets them, else the sm80 kernels.
Status dispatch_forward(const ForwardParams& p, int major, cudaStream_t stream) {
#if defined(FLASHATTN_CUDA_SM90)
  const CudaPath path = cuda_path();
  // detail::Switch::kFwdSm80: the sm80 forward for in-process comparisons (core/switches.h).
  if (major == 9 && path != CudaPath::kSm80 && !detail::switch_on(detail::Switch::kFwdSm80) &&
      cuda::sm90::fwd_declines(p, path == CudaPath::kSm90).empty()) {
    // NotSupported: nothing was launched (an operand the copy engine cannot describe).
    Status s = cuda::sm90::dispatch_fwd(p, stream);
    if (s.ok()) detail::count_sm90_forward();
    if (s.code() != StatusCode::kNotSupported || path == CudaPath::kSm90) return s;
  }
#else
  (void)major;
#endif
  return cuda::dispatch_fwd(p, stream);
}

// The forward of a head_dim_v != head_dim call that has kernels of its own (192 / 128 on the sm90
// forward): true, with *result, when it ran there unpadded; false (nothing launched) when the
// call goes the padding way instead: another GPU or FLASHATTN_CUDA_PATH=sm80 (the sm80 kernels
// have no such shape), a call the sm90 forward declines (dropout, requested splits, and in the
// default mode decode shapes and launches the split heuristic splits), q-side padding, v or
// out not 16-byte aligned (the padding copy takes any strides), or, in the default mode, an
// operand the copy engine cannot describe (FLASHATTN_CUDA_PATH=sm90 returns that error, as
// dispatch_forward does).
bool native_head_dim_v(const ForwardParams& p, const PadPlan& plan, int major, cudaStream_t stream, Status* result) {
#if defined(FLASHATTN_CUDA_SM90)
  const CudaPath path = cuda_path();
  if (plan.qk || major != 9 || path == CudaPath::kSm80 || detail::switch_on(detail::Switch::kFwdSm80)) return false;
  if (!cuda::sm90::fwd_declines(p, path == CudaPath::kSm90).empty()) return false;
  if (!check_operand("v", p.v, p.v_strides, int(dtype_size(p.kv_dtype))).ok() ||
      !check_operand("out", p.out, p.out_strides).ok()) {
    return false;
  }
  Status s = cuda::sm90::dispatch_fwd(p, stream);
  if (s.ok()) detail::count_sm90_forward();
  if (s.code() == StatusCode::kNotSupported && path != CudaPath::kSm90) return false;
  *result = s;
  return true;
#else
  (void)p, (void)plan, (void)major, (void)stream, (void)result;
  return false;
#endif
}

// The backward of a head_dim_v != head_dim call that has kernels of its own (192 / 128 on the
// sm90 backward, BwdDvTraits): true, with *result, when it ran there unpadded; false (nothing
// launched) when the call goes the padding way instead: another GPU, FLASHATTN_CUDA_PATH=sm80 or
// the bwd_sm80 switch, a call bwd_declines refuses, q-side padding, v, out, dout or dv not
// 16-byte aligned (the padding copy takes any strides), or, in the default mode, an operand the
// copy engine cannot describe (FLASHATTN_CUDA_PATH=sm90 returns that error, as
// dispatch_backward does).
bool native_head_dim_v_backward(const BackwardParams& p, const PadPlan& plan, cudaStream_t stream, Status* result) {
#if defined(FLASHATTN_CUDA_SM90)
  const CudaPath path = cuda_path();
  if (plan.qk || path == CudaPath::kSm80 || detail::switch_on(detail::Switch::kBwdSm80)) return false;
  if (!cuda::sm90::bwd_declines(p).empty()) return false;
  if (!check_operand("v", p.v, p.v_strides).ok() || !check_operand("out", p.out, p.out_strides).ok() ||
      !check_operand("dout", p.dout, p.dout_strides).ok() || !check_operand("dv", p.dv, p.dv_strides).ok()) {
    return false;
  }
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, p.device.index) != cudaSuccess ||
      major != 9) {
    return false;
  }
  Status s = cuda::sm90::dispatch_bwd(p, stream);
  if (s.ok()) {
    detail::count_sm90_backward();
    detail::count_native_head_dim_v_backward();
  }
  if (s.code() == StatusCode::kNotSupported && path != CudaPath::kSm90) return false;
  *result = s;
  return true;
#else
  (void)p, (void)plan, (void)stream, (void)result;
  return false;
#endif
}

// Runs a backward the kernels take directly: on a Hopper GPU the sm90 backward where cuda_path()
// lets it (sm90/bwd.h: every call its kernels can run), else the sm80 kernels.
// detail::Switch::kBwdSm80: the sm80 backward for in-process comparisons (core/switches.h).
Status dispatch_backward(const BackwardParams& p, cudaStream_t stream) {
#if defined(FLASHATTN_CUDA_SM90)
  const CudaPath path = cuda_path();
  if (path != CudaPath::kSm80 && !detail::switch_on(detail::Switch::kBwdSm80) &&
      cuda::sm90::bwd_declines(p).empty()) {
    int major = 0;
    FLASHATTN_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, p.device.index));
    if (major == 9) {
      Status s = cuda::sm90::dispatch_bwd(p, stream);
      if (s.ok()) detail::count_sm90_backward();
      if (s.code() != StatusCode::kNotSupported || path == CudaPath::kSm90) return s;
    }
  }
#endif
  return cuda::dispatch_bwd(p, stream);
}

// The (batch, rows) index space of the q-like and k-like operands: dense (batch, seqlen),
// varlen (1, total) with the sequences found through cu_seqlens.
struct RowSpace {
  int64_t batch;
  int64_t rows;
};
RowSpace q_rows(const QKVParams& p) {
  return p.is_varlen() ? RowSpace{1, p.total_q} : RowSpace{p.batch, p.seqlen_q};
}
RowSpace k_rows(const QKVParams& p) {
  return p.is_varlen() ? RowSpace{1, p.total_k} : RowSpace{p.batch, p.seqlen_k};
}

// Zero-fills a (rows, heads, width) operand of the caller.
Status zero_fill(void* data, const Strides3& strides, RowSpace rs, int64_t heads, int64_t width,
                 cudaStream_t stream) {
  return cuda::copy_rows16(data, strides, width, cuda::Rows16{}, rs.batch, rs.rows, heads, stream);
}

// A forward with nothing to compute: no query row (nothing to write), or no key anywhere: every
// row has out 0 and LSE -inf, or its head's learnable sink, the only term of its softmax
// (SEMANTICS.md, empty tensors and sinks). True when it took the call (*result says how).
bool empty_forward(const ForwardParams& p, cudaStream_t stream, Status* result) {
  const RowSpace qr = q_rows(p);
  if (p.batch == 0 || p.seqlen_q == 0 || qr.rows == 0) {
    *result = Status::Ok();
    return true;
  }
  if (p.seqlen_k != 0 && k_rows(p).rows != 0) return false;
  *result = zero_fill(p.out, p.out_strides, qr, p.heads, p.head_dim_v, stream);
  if (result->ok()) {
    *result = cuda::fill_lse(p.lse, p.lse_batch_stride, p.lse_head_stride, qr.batch, p.heads, qr.rows,
                             -std::numeric_limits<float>::infinity(), stream, p.learnable_sink);
  }
  return true;
}

// Stream-ordered workspace freed when the scope ends (also on an early error return).
class ScopedWorkspace {
 public:
  explicit ScopedWorkspace(cudaStream_t stream) : stream_(stream) {}
  ~ScopedWorkspace() {
    if (ptr_ != nullptr) (void)cuda::workspace_free(ptr_, stream_);
  }
  ScopedWorkspace(const ScopedWorkspace&) = delete;
  ScopedWorkspace& operator=(const ScopedWorkspace&) = delete;
  Status alloc(size_t bytes) { return cuda::workspace_alloc(&ptr_, bytes, stream_); }
  uint16_t* data() const { return static_cast<uint16_t*>(ptr_); }

 private:
  cudaStream_t stream_;
  void* ptr_ = nullptr;
};

// A padded operand in the workspace: (rows, heads, width) contiguous per batch entry (varlen:
// batch stride 0, as params.h indexes varlen operands).
struct PaddedOperand {
  uint16_t* data;
  Strides3 strides;
};
PaddedOperand carve(uint16_t** cursor, RowSpace rs, int64_t heads, int64_t width, bool varlen) {
  PaddedOperand op{*cursor, Strides3{varlen ? 0 : rs.rows * heads * width, heads * width, width}};
  *cursor += rs.batch * rs.rows * heads * width;  // a multiple of 8 elements: 16-byte aligned
  return op;
}

// Copies the caller's (rows, heads, width) operand into a zero-padded workspace operand.
Status pad_in(const PaddedOperand& dst, int64_t dst_width, const void* src, const Strides3& ss,
              int64_t src_width, RowSpace rs, int64_t heads, cudaStream_t stream) {
  return cuda::copy_rows16(dst.data, dst.strides, dst_width, cuda::Rows16{src, ss, src_width},
                           rs.batch, rs.rows, heads, stream);
}

// Copies the first `width` columns of a workspace operand back to the caller's tensor.
Status pad_out(void* dst, const Strides3& ds, int64_t width, const PaddedOperand& src,
               int64_t src_width, RowSpace rs, int64_t heads, cudaStream_t stream) {
  return cuda::copy_rows16(dst, ds, width, cuda::Rows16{src.data, src.strides, src_width},
                           rs.batch, rs.rows, heads, stream);
}

// Runs p at plan.run_dim with the operands plan says on zero-padded workspace copies, then
// copies the first head_dim (q-side) / head_dim_v (v-side) columns of the padded outputs back.
// k and v are (kr.batch, kr.rows, heads_k) operands (k_rows(p), or a KV cache's pages);
// run(pp) runs the padded problem, a plain same-d one (head_dim == head_dim_v), so a forward
// may give it to the sm90 kernels like any other call.
template <typename Run>
Status padded_forward(const ForwardParams& p, const PadPlan& plan, RowSpace kr, cudaStream_t stream, const Run& run) {
  const bool varlen = p.is_varlen();
  // A varlen call's k and v are packed rows, except pages with a block table (batch = pages).
  const bool kv_varlen = varlen && !p.kv.enabled;
  const RowSpace qr = q_rows(p);
  const int64_t w = plan.run_dim;
  const int64_t q_elems = qr.batch * qr.rows * p.heads * w, k_elems = kr.batch * kr.rows * p.heads_k * w;
  // q-side: q, k; v-side: v, out.
  const int64_t elems = (plan.qk ? q_elems + k_elems : 0) + (plan.v ? k_elems + q_elems : 0);
  ScopedWorkspace ws(stream);
  if (Status s = ws.alloc(static_cast<size_t>(elems) * sizeof(uint16_t)); !s.ok()) return s;
  uint16_t* cursor = ws.data();

  ForwardParams pp = p;  // scale and scale_log2 stay those of the caller's head dim
  pp.head_dim = pp.head_dim_v = plan.run_dim;
  if (plan.qk) {
    const PaddedOperand q = carve(&cursor, qr, p.heads, w, varlen);
    const PaddedOperand k = carve(&cursor, kr, p.heads_k, w, kv_varlen);
    if (Status s = pad_in(q, w, p.q, p.q_strides, p.head_dim, qr, p.heads, stream); !s.ok()) return s;
    if (Status s = pad_in(k, w, p.k, p.k_strides, p.head_dim, kr, p.heads_k, stream); !s.ok()) return s;
    pp.q = q.data, pp.q_strides = q.strides;
    pp.k = k.data, pp.k_strides = k.strides;
  }
  PaddedOperand out{};
  if (plan.v) {
    const PaddedOperand v = carve(&cursor, kr, p.heads_k, w, kv_varlen);
    out = carve(&cursor, qr, p.heads, w, varlen);
    if (Status s = pad_in(v, w, p.v, p.v_strides, p.head_dim_v, kr, p.heads_k, stream); !s.ok()) return s;
    pp.v = v.data, pp.v_strides = v.strides;
    pp.out = out.data, pp.out_strides = out.strides;
  }
  if (Status s = run(pp); !s.ok()) return s;
  if (!plan.v) return Status::Ok();  // the kernels wrote the caller's out directly
  return pad_out(p.out, p.out_strides, p.head_dim_v, out, w, qr, p.heads, stream);
}

Status padded_backward(const BackwardParams& p, const PadPlan& plan, cudaStream_t stream) {
  const bool varlen = p.is_varlen();
  const RowSpace qr = q_rows(p), kr = k_rows(p);
  const int64_t w = plan.run_dim;
  const int64_t q_elems = qr.batch * qr.rows * p.heads * w, k_elems = kr.batch * kr.rows * p.heads_k * w;
  // q-side: q, dq, k, dk; v-side: out, dout, v, dv.
  const int64_t elems = (plan.qk ? 2 * (q_elems + k_elems) : 0) + (plan.v ? 2 * (q_elems + k_elems) : 0);
  ScopedWorkspace ws(stream);
  if (Status s = ws.alloc(static_cast<size_t>(elems) * sizeof(uint16_t)); !s.ok()) return s;
  uint16_t* cursor = ws.data();

  BackwardParams pp = p;  // scale and scale_log2 stay those of the caller's head dim
  pp.head_dim = pp.head_dim_v = plan.run_dim;
  PaddedOperand dq{}, dk{}, dv{};
  if (plan.qk) {
    const PaddedOperand q = carve(&cursor, qr, p.heads, w, varlen);
    dq = carve(&cursor, qr, p.heads, w, varlen);
    const PaddedOperand k = carve(&cursor, kr, p.heads_k, w, varlen);
    dk = carve(&cursor, kr, p.heads_k, w, varlen);
    if (Status s = pad_in(q, w, p.q, p.q_strides, p.head_dim, qr, p.heads, stream); !s.ok()) return s;
    if (Status s = pad_in(k, w, p.k, p.k_strides, p.head_dim, kr, p.heads_k, stream); !s.ok()) return s;
    pp.q = q.data, pp.q_strides = q.strides;
    pp.k = k.data, pp.k_strides = k.strides;
    pp.dq = dq.data, pp.dq_strides = dq.strides;
    pp.dk = dk.data, pp.dk_strides = dk.strides;
  }
  if (plan.v) {
    const PaddedOperand out = carve(&cursor, qr, p.heads, w, varlen);
    const PaddedOperand dout = carve(&cursor, qr, p.heads, w, varlen);
    const PaddedOperand v = carve(&cursor, kr, p.heads_k, w, varlen);
    dv = carve(&cursor, kr, p.heads_k, w, varlen);
    if (Status s = pad_in(out, w, p.out, p.out_strides, p.head_dim_v, qr, p.heads, stream); !s.ok()) return s;
    if (Status s = pad_in(dout, w, p.dout, p.dout_strides, p.head_dim_v, qr, p.heads, stream); !s.ok()) return s;
    if (Status s = pad_in(v, w, p.v, p.v_strides, p.head_dim_v, kr, p.heads_k, stream); !s.ok()) return s;
    pp.out = out.data, pp.out_strides = out.strides;
    pp.dout = dout.data, pp.dout_strides = dout.strides;
    pp.v = v.data, pp.v_strides = v.strides;
    pp.dv = dv.data, pp.dv_strides = dv.strides;
  }
  if (Status s = dispatch_backward(pp, stream); !s.ok()) return s;
  if (plan.qk) {
    if (Status s = pad_out(p.dq, p.dq_strides, p.head_dim, dq, w, qr, p.heads, stream); !s.ok()) return s;
    if (Status s = pad_out(p.dk, p.dk_strides, p.head_dim, dk, w, kr, p.heads_k, stream); !s.ok()) return s;
  }
  if (plan.v) return pad_out(p.dv, p.dv_strides, p.head_dim_v, dv, w, kr, p.heads_k, stream);
  return Status::Ok();
}

// The FP8 forward (q, k, v float8 e4m3, out bf16; docs/SEMANTICS.md "FP8"): the sm90 kernels
// (sm90/fwd8_kernel.h) or NotSupported naming why. No padding (the copies are 16-bit) and no sm80
// kernel: a declined call is refused, never run another way. Validation (core) has checked the
// dtypes of k, v and out and the descales' shapes.
Status fp8_forward(const ForwardParams& p) {
  const std::string why = "q has dtype float8_e4m3: ";
#if defined(FLASHATTN_CUDA_SM90)
  int major = 0;
  if (Status s = use_device(p.device.index, &major); !s.ok()) return s;
  if (major != 9) {
    return Status::NotSupported(why + "the CUDA FP8 forward runs on Hopper (sm90) GPUs only; device " +
                                std::to_string(p.device.index) + " has compute capability " + std::to_string(major) +
                                ".x (the cpu backend implements the FP8 forward)");
  }
  if (cuda_path() == CudaPath::kSm80) {
    return Status::NotSupported(why + "FLASHATTN_CUDA_PATH=sm80, and the FP8 forward has only sm90 kernels");
  }
  if (std::string reason = cuda::sm90::fwd8_declines(p); !reason.empty()) {
    return Status::NotSupported(why + "the CUDA FP8 forward declines this call: " + reason +
                                " (the cpu backend implements every FP8 option)");
  }
  if (Status s = check_operand("q", p.q, p.q_strides, 1); !s.ok()) return s;
  if (Status s = check_operand("k", p.k, p.k_strides, 1); !s.ok()) return s;
  if (Status s = check_operand("v", p.v, p.v_strides, 1); !s.ok()) return s;
  if (Status s = check_operand("out", p.out, p.out_strides); !s.ok()) return s;
  const auto stream = static_cast<cudaStream_t>(p.stream);
  if (Status s; empty_forward(p, stream, &s)) return s;
  return cuda::sm90::dispatch_fwd8(p, stream);
#else
  (void)p;
  return Status::NotSupported(why + "this flashattn was built without the sm90a kernels "
                              "(CMAKE_CUDA_ARCHITECTURES without 90), and the CUDA FP8 forward runs on "
                              "Hopper (sm90) GPUs only");
#endif
}

}  // namespace

Status cuda_forward(const ForwardParams& p) {
  cuda::DeviceScope restore_device;  // prepare() selects the tensors' device
  if (p.dtype == DType::kFloat8E4M3) return fp8_forward(p);
  PadPlan plan;
  int major = 0;
  if (Status s = prepare(p, &plan, &major); !s.ok()) return s;
  if (!plan.v) {
    if (Status s = check_operand("out", p.out, p.out_strides); !s.ok()) return s;
  }
  const auto stream = static_cast<cudaStream_t>(p.stream);
  if (Status s; empty_forward(p, stream, &s)) return s;
  if (plan.any()) {
    if (Status s; native_head_dim_v(p, plan, major, stream, &s)) return s;
    return padded_forward(p, plan, k_rows(p), stream,
                          [&](const ForwardParams& pp) { return dispatch_forward(pp, major, stream); });
  }
  return dispatch_forward(p, major, stream);
}

Status cuda_backward(const BackwardParams& p) {
  // attn_bias, attn_mask and block masks run on the sm80 kernels (ScoreMods::kBiasMask) or the
  // sm90 bias kernels, dbias included; dbias with softcap on the sm80 kernels only (sm90
  // bwd_declines), whose instantiation for it leaves softcap's factor out of dS until dbias has
  // taken it (sm80/bwd_kernel.h bwd_kernel<Traits, true>; SEMANTICS.md "CUDA backward").
  cuda::DeviceScope restore_device;  // prepare() selects the tensors' device
  PadPlan plan;
  if (Status s = prepare(p, &plan); !s.ok()) return s;
  const struct {
    const char* name;
    const void* ptr;
    const Strides3& strides;
    bool padded;
  } operands[] = {{"out", p.out, p.out_strides, plan.v}, {"dout", p.dout, p.dout_strides, plan.v},
                  {"dq", p.dq, p.dq_strides, plan.qk},   {"dk", p.dk, p.dk_strides, plan.qk},
                  {"dv", p.dv, p.dv_strides, plan.v}};
  for (const auto& o : operands) {
    if (o.padded) continue;  // the kernels see a workspace copy
    if (Status s = check_operand(o.name, o.ptr, o.strides); !s.ok()) return s;
  }
  const auto stream = static_cast<cudaStream_t>(p.stream);
  const RowSpace qr = q_rows(p), kr = k_rows(p);
  if (p.batch == 0 || p.seqlen_q == 0 || qr.rows == 0 || p.seqlen_k == 0 || kr.rows == 0) {
    // No (query, key) pair: every gradient is 0 (the side without rows is empty). The sink's
    // gradient sums over the query rows: 0 without any (with rows but no keys the LSE is the
    // sink, so P_sink = 1 and D = rowsum(dO * O) = 0, as O = 0: 0 too).
    if (p.dsink != nullptr) {
      FLASHATTN_CUDA_TRY(cudaMemsetAsync(p.dsink, 0, sizeof(float) * size_t(p.heads), stream));
    }
    // dbias: 0 too (P = 0 wherever there is a pair).
    if (p.dbias.defined()) {
      if (Status s = cuda::zero_dbias(p.dbias, p.seqlen_k, stream); !s.ok()) return s;
    }
    if (p.batch == 0) return Status::Ok();
    if (Status s = zero_fill(p.dq, p.dq_strides, qr, p.heads, p.head_dim, stream); !s.ok()) return s;
    if (Status s = zero_fill(p.dk, p.dk_strides, kr, p.heads_k, p.head_dim, stream); !s.ok()) return s;
    return zero_fill(p.dv, p.dv_strides, kr, p.heads_k, p.head_dim_v, stream);
  }
  if (plan.any()) {
    if (Status s; native_head_dim_v_backward(p, plan, stream, &s)) return s;
    return padded_backward(p, plan, stream);
  }
  return dispatch_backward(p, stream);
}

namespace {

// The most query tokens of the sequences that run_kvcache gives a launch of their own on the
// decode tiles (sm80 decode_tokens_max), or 0 for one launch: a varlen call (paged) of two or
// more sequences whose longest is longer than that, where one might be that short (q's rows
// leave room for it: total_q <= (batch - 1) x max_seqlen_q + tokens), and no forced splits;
// under detail::Switch::kDecodeShare until it has run on a GPU.
int decode_share(const ForwardParams& p) {
  if (!detail::switch_on(detail::Switch::kDecodeShare) || !p.is_varlen() || p.batch < 2 || p.num_splits > 1) {
    return 0;
  }
  const int tokens = cuda::decode_tokens_max(p);
  const bool room = p.total_q <= int64_t(p.batch - 1) * p.seqlen_q + tokens;
  return p.seqlen_q > tokens && room ? tokens : 0;
}

// forward_kvcache after the checks: the append (with rotary) into the cache, then the kernels
// reading the cache: the sm80 cache kernels (FwdTraits::kCache: decode shapes, memory-bound,
// where split keys and folded GQA groups matter and wgmma brings nothing), or for prefill shapes
// on a Hopper GPU the sm90 cache kernel (sm90 FwdCacheTraits, under Switch::kSm90Cache until it
// has run on a GPU).
Status run_kvcache(const ForwardParams& p, cudaStream_t stream) {
  const KVCacheParams& kv = p.kv;
  if (p.batch == 0 || p.seqlen_q == 0) {
    return cuda::kvcache_append(p, nullptr, stream);  // no query, but the cache still grows
  }
  ScopedWorkspace q_rot(stream);
  ForwardParams attend = p;
  if (kv.rotary_dim > 0) {
    const int64_t elems = int64_t(p.batch) * p.seqlen_q * p.heads * p.head_dim;
    if (Status s = q_rot.alloc(static_cast<size_t>(elems) * sizeof(uint16_t)); !s.ok()) return s;
    attend.q = q_rot.data();
    attend.q_strides = Strides3{int64_t(p.seqlen_q) * p.heads * p.head_dim, int64_t(p.heads) * p.head_dim,
                                p.head_dim};
  }
  if (Status s = cuda::kvcache_append(p, q_rot.data(), stream); !s.ok()) return s;
  // Sequences with no row to attend to (an empty cache included) are the kernels' empty key
  // ranges: out 0 and LSE -inf, or the sink's (SEMANTICS.md).
  if (cuda::mla::is_mla_shape(p)) return cuda::mla::dispatch_decode(attend, stream);
  // A varlen step of a chunked prefill (vLLM): decoding sequences of a few tokens among prefill
  // chunks. In one launch each decoding token fills one row of a 128-row tile per query head and
  // pays the whole tile's products over all its keys (H100, 2026-12-05: 64 one-token sequences
  // beside a 2k chunk took 1.55 ms of 1.75; dev/NOTES.md "Chunked prefill: decodes on their
  // own"). So the sequences of at most decode_tokens_max tokens run in a launch of their own on
  // the decode tiles, GQA folded, and the rest in a second; each sequence is in exactly one
  // (ForwardParams::cache_rows_min / _max, read by cache_seq_extent). The decode kernels merge
  // split keys per row group in the kernel (sm80/fwd_launch.h), so the decode launch may split,
  // but only where q's packed rows are few: the partials' workspace is indexed by packed row,
  // the chunks' included (~1 GB beside an 8k chunk at 32 heads and 8 splits), and not under the
  // combine-kernel switch. The second launch never splits: the combine kernel walks every packed
  // row. Under Switch::kDecodeShare, off by default, until it has run on a GPU.
  ForwardParams rest = attend;
  if (const int tokens = decode_share(attend); tokens > 0) {
    ForwardParams decodes = attend;
    decodes.cache_rows_max = tokens;
    decodes.seqlen_q = tokens;  // its grid: ceil(tokens x group / 16) tiles per (sequence, KV head)
    const bool few_rows = attend.total_q <= int64_t(16) * attend.batch;
    if (!few_rows || detail::switch_on(detail::Switch::kSplitCombineKernel)) decodes.num_splits = 1;
    if (Status s = cuda::dispatch_fwd_kvcache(decodes, stream); !s.ok()) return s;
    detail::count_decode_share();
    rest.cache_rows_min = tokens + 1;
    rest.num_splits = 1;
  }
#if defined(FLASHATTN_CUDA_SM90)
  // Prefill-shaped calls on the sm90 cache kernel (detail::Switch::kSm90Cache, off by default);
  // decode shapes, FP8 caches and the rest on the sm80 cache kernels.
  if (detail::switch_on(detail::Switch::kSm90Cache) && cuda_path() != CudaPath::kSm80 &&
      cuda::sm90::fwd_cache_declines(rest).empty()) {
    int major = 0;  // of the current device, which prepare() made the tensors'; cached per device
    if (Status s = cuda::compute_major(&major); !s.ok()) return s;
    if (major == 9) {
      // NotSupported: nothing was launched (q the copy engine cannot describe): the sm80 kernels.
      Status s = cuda::sm90::dispatch_fwd_cache(rest, stream);
      if (s.ok()) detail::count_sm90_forward();
      if (s.code() != StatusCode::kNotSupported) return s;
    }
  }
#endif
  return cuda::dispatch_fwd_kvcache(rest, stream);
}

// forward_kvcache at MLA decode's head dims (576 / 512) on the MLA kernel (cuda/mla/mla.h), with
// the checks of prepare() that apply, in its place (prepare() bounds head dims at 256). The
// append kernel (kvcache.cu) takes head_dim != head_dim_v as it is: k rows of 576 columns, then v
// rows of 512. With the shared latent cache (v_cache a view of k_cache[..., :512]) both land in
// the same row, v last, so its 512 columns win in the shared part, as on the CPU backend
// (cpu/kvcache.cpp writes k, then v); callers pass v = k[..., :512] and the two agree
// (docs/SEMANTICS.md, "MLA decode").
Status mla_kvcache(const ForwardParams& p) {
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) {
    return Status::NotSupported(std::string("q has dtype ") + dtype_name(p.dtype) +
                                "; the CUDA MLA decode supports float16 and bfloat16 (the cpu backend takes it)");
  }
  if (!cuda::mla_built()) {
    return Status::NotSupported("head_dim 576 (MLA decode, head_dim_v 512) was not built into this flashattn "
                                "(FLASHATTN_CUDA_HEAD_DIMS does not list 576)");
  }
  if (!cuda::dtype_built(p.dtype)) {
    return Status::NotSupported(std::string("dtype ") + dtype_name(p.dtype) +
                                " was not built into this flashattn (FLASHATTN_CUDA_DTYPES)");
  }
  if (const std::string why = cuda::mla::declines(p); !why.empty()) return Status::NotSupported(why);
  if (p.batch > 65535 || p.heads > 65535) {
    return Status::NotSupported("the CUDA backend supports batch and heads up to 65535, got batch " +
                                std::to_string(p.batch) + " and heads " + std::to_string(p.heads));
  }
  const KVCacheParams& kv = p.kv;
  const struct {
    const char* name;
    const void* ptr;
    const Strides3& strides;
  } operands[] = {{"q", p.q, p.q_strides},        {"k_cache", p.k, p.k_strides},
                  {"v_cache", p.v, p.v_strides},  {"out", p.out, p.out_strides},
                  {"k", kv.k_new, kv.k_new_strides}, {"v", kv.v_new, kv.v_new_strides}};
  for (const auto& o : operands) {
    if (o.ptr == nullptr) continue;  // no new k/v
    if (Status s = check_operand(o.name, o.ptr, o.strides); !s.ok()) return s;
  }
  int major = 0;
  if (Status s = use_device(p.device.index, &major); !s.ok()) return s;
  return run_kvcache(p, static_cast<cudaStream_t>(p.stream));
}

// A head dim the build did not instantiate: as flash_attn does for head dims that are not a
// multiple of 8, the call runs at the next built head dim on zero-padded copies of q, the whole
// cache (padded_forward) and the new k/v, then copies out back and, when tokens were appended,
// the cache's first head_dim columns (zero columns change neither q.k nor P.V; rotary pairs lie
// inside head_dim). Exact, but every call moves the whole cache twice (SEMANTICS.md says so):
// such head dims are far from the decode bandwidth.
Status padded_kvcache(const ForwardParams& p, const PadPlan& plan, cudaStream_t stream) {
  const KVCacheParams& kv = p.kv;
  // The cache as (pages or cache rows, rows per page or capacity, heads_k, d).
  const RowSpace cr = kv.paged() ? RowSpace{kv.num_blocks, kv.page_size} : RowSpace{kv.batch_cache, kv.capacity};
  return padded_forward(p, plan, cr, stream, [&](const ForwardParams& pp) -> Status {
    if (kv.k_new == nullptr) return run_kvcache(pp, stream);
    const RowSpace nr{p.batch, kv.seqlen_new};
    const int64_t w = plan.run_dim, d = p.head_dim;
    ScopedWorkspace ws(stream);
    if (Status s = ws.alloc(static_cast<size_t>(2 * nr.batch * nr.rows * p.heads_k * w) * sizeof(uint16_t)); !s.ok()) {
      return s;
    }
    uint16_t* cursor = ws.data();
    const PaddedOperand kn = carve(&cursor, nr, p.heads_k, w, false);
    const PaddedOperand vn = carve(&cursor, nr, p.heads_k, w, false);
    if (Status s = pad_in(kn, w, kv.k_new, kv.k_new_strides, d, nr, p.heads_k, stream); !s.ok()) return s;
    if (Status s = pad_in(vn, w, kv.v_new, kv.v_new_strides, d, nr, p.heads_k, stream); !s.ok()) return s;
    ForwardParams pa = pp;
    pa.kv.k_new = kn.data, pa.kv.k_new_strides = kn.strides;
    pa.kv.v_new = vn.data, pa.kv.v_new_strides = vn.strides;
    if (Status s = run_kvcache(pa, stream); !s.ok()) return s;
    const auto padded = [](const void* data, const Strides3& strides) {
      return PaddedOperand{static_cast<uint16_t*>(const_cast<void*>(data)), strides};
    };
    if (Status s = pad_out(const_cast<void*>(p.k), p.k_strides, d, padded(pp.k, pp.k_strides), w, cr, p.heads_k, stream);
        !s.ok()) {
      return s;
    }
    return pad_out(const_cast<void*>(p.v), p.v_strides, d, padded(pp.v, pp.v_strides), w, cr, p.heads_k, stream);
  });
}

}  // namespace

// forward_kvcache: runs directly at a built head dim, on padded copies at another (both need
// head_dim_v == head_dim: other pairs run on the CPU), and MLA decode's 576 / 512 on its own kernel.
Status cuda_forward_kvcache(const ForwardParams& p) {
  cuda::DeviceScope restore_device;  // prepare() selects the tensors' device
  if (cuda::mla::is_mla_shape(p)) return mla_kvcache(p);
  PadPlan plan;
  if (Status s = prepare(p, &plan); !s.ok()) return s;
  if (p.head_dim_v != p.head_dim) {
    return Status::NotSupported("KV-cache and paged calls (forward_kvcache, block_table) on the CUDA backend need "
                                "head_dim_v == head_dim; got head_dim " +
                                std::to_string(p.head_dim) + ", head_dim_v " + std::to_string(p.head_dim_v) +
                                " (the cpu backend takes both)");
  }
  const auto stream = static_cast<cudaStream_t>(p.stream);
  if (plan.any()) return padded_kvcache(p, plan, stream);
  const KVCacheParams& kv = p.kv;
  if (Status s = check_operand("out", p.out, p.out_strides); !s.ok()) return s;
  if (kv.k_new != nullptr) {
    if (Status s = check_operand("k", kv.k_new, kv.k_new_strides); !s.ok()) return s;
    if (Status s = check_operand("v", kv.v_new, kv.v_new_strides); !s.ok()) return s;
  }
  return run_kvcache(p, stream);
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

Status cuda_copy_to_host(void* dst, const void* src, size_t bytes, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  FLASHATTN_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
  FLASHATTN_CUDA_TRY(cudaStreamSynchronize(s));
  return Status::Ok();
}

namespace detail {
bool cuda_head_dim_built(int d) { return cuda::head_dim_built(d); }
bool cuda_sm90_built() {
#if defined(FLASHATTN_CUDA_SM90)
  return true;
#else
  return false;
#endif
}
}  // namespace detail

}  // namespace flashattn
