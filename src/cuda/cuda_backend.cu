// CUDA backend entry points: device selection, the checks only the GPU path needs (dtype,
// head dim, alignment, architecture), then the kernel dispatch: directly, on zero-padded
// copies for a head dim the build did not instantiate, or no kernel at all for empty inputs.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "core/backend.h"
#include "cuda/common/build_config.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/workspace.h"
#include "cuda/pad.h"
#include "cuda/sm80/bwd.h"
#include "cuda/sm80/fwd.h"
#include "cuda/sm90/fwd.h"

namespace flashattn {
namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

Status check_operand(const char* name, const void* ptr, const Strides3& s) {
  if (!aligned16(ptr)) {
    return Status::NotSupported(std::string(name) +
                                ": the CUDA backend needs 16-byte aligned data pointers");
  }
  if (s.batch % 8 != 0 || s.row % 8 != 0 || s.head % 8 != 0) {
    return Status::NotSupported(std::string(name) + ": the CUDA backend needs strides that are multiples of 8 elements, got (" +
                                std::to_string(s.batch) + ", " + std::to_string(s.row) + ", " +
                                std::to_string(s.head) + ")");
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
// Why padding rather than more instantiations: every head dim costs 16 instantiations (forward
// and backward x no mask / window x plain / score modifiers x fp16 / bf16). flash_attn's sizes
// 160 and 224 would add 32 (96 -> 128 files, a third more build time: about 56 s -> 75 s on the
// 16-core H200 machine); every multiple of 8 up to 256 would add 416 (about 5x the build).
// Padding costs, per call, one copy of q, k, v (and out, dout, dq, dk, dv in the backward) at
// copy bandwidth, plus the matrix products over the padded width: d 80 -> 96 and 160 -> 192
// are 20% more FLOPs, 224 -> 256 14%, 40 -> 64 60%, 16 -> 32 100%. Not yet timed on a GPU;
// docs/SEMANTICS.md states the rule.
constexpr int kMaxCudaHeadDim = 256;

// The built head dim that head_dim runs at (itself when built); 0 when none is large enough.
int run_head_dim(int head_dim) {
  for (int d : cuda::kAllHeadDims) {  // ascending
    if (d >= head_dim && cuda::head_dim_built(d)) return d;
  }
  return 0;
}

// Checks common to forward and backward; selects the device. *run_dim receives the head dim
// the kernels run at, *major the device's compute capability major version.
Status prepare(const QKVParams& p, int* run_dim, int* major_out = nullptr) {
  // Checked first, so that neither the sm80 nor the sm90 path is ever reached with them.
  const struct {
    const char* name;
    bool given;
  } not_yet[] = {{"attn_bias", p.bias.defined()},
                 {"attn_mask", p.mask.defined()},
                 {"block_mask", p.block_mask.defined()},
                 {"block_mask_lists (the compressed block_mask)", p.has_block_lists()}};
  for (const auto& m : not_yet) {
    if (m.given) {
      return Status::NotSupported(std::string(m.name) +
                                  " is not supported by the CUDA backend yet (the cpu backend "
                                  "implements it)");
    }
  }
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) {
    return Status::NotSupported(std::string("q has dtype ") + dtype_name(p.dtype) +
                                "; the CUDA backend supports float16 and bfloat16 "
                                "(float32 runs on the cpu backend)");
  }
  if (!cuda::dtype_built(p.dtype)) {
    return Status::NotSupported(std::string("dtype ") + dtype_name(p.dtype) +
                                " was not built into this flashattn (FLASHATTN_CUDA_DTYPES)");
  }
  if (p.head_dim > kMaxCudaHeadDim) {
    return Status::NotSupported("head_dim " + std::to_string(p.head_dim) +
                                " is not supported by the CUDA backend; supported: 1.." +
                                std::to_string(kMaxCudaHeadDim) + " (the cpu backend takes up to 1024)");
  }
  if (p.head_dim_v != p.head_dim) {
    return Status::NotSupported("head_dim_v (" + std::to_string(p.head_dim_v) +
                                ") must equal head_dim (" + std::to_string(p.head_dim) +
                                ") on the CUDA backend");
  }
  *run_dim = run_head_dim(p.head_dim);
  if (*run_dim == 0) {
    return Status::NotSupported("head_dim " + std::to_string(p.head_dim) +
                                " was not built into this flashattn (FLASHATTN_CUDA_HEAD_DIMS), "
                                "nor any larger head dim to pad it to");
  }
  if (p.batch > 65535 || p.heads > 65535) {
    return Status::NotSupported("the CUDA backend supports batch and heads up to 65535, got batch " +
                                std::to_string(p.batch) + " and heads " + std::to_string(p.heads));
  }
  // The padded path copies the operands with a strided kernel, so only a direct run needs the
  // kernels' 16-byte alignment.
  if (*run_dim == p.head_dim) {
    if (Status s = check_operand("q", p.q, p.q_strides); !s.ok()) return s;
    if (Status s = check_operand("k", p.k, p.k_strides); !s.ok()) return s;
    if (Status s = check_operand("v", p.v, p.v_strides); !s.ok()) return s;
  }

  FLASHATTN_CUDA_TRY(cudaSetDevice(p.device.index));
  int major = 0;
  FLASHATTN_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, p.device.index));
  if (major < 8) {
    return Status::NotSupported("the CUDA backend needs compute capability 8.0 or newer; device " +
                                std::to_string(p.device.index) + " is " + std::to_string(major) + ".x");
  }
  if (major_out != nullptr) *major_out = major;
  return Status::Ok();
}

// Runs a forward the kernels take directly: on a Hopper GPU (compute capability 9) the sm90
// kernels where cuda_path() lets them, else the sm80 kernels.
Status dispatch_forward(const ForwardParams& p, int major, cudaStream_t stream) {
#if defined(FLASHATTN_CUDA_SM90)
  const CudaPath path = cuda_path();
  if (major == 9 && path != CudaPath::kSm80 && cuda::sm90::fwd_declines(p, path == CudaPath::kSm90).empty()) {
    // NotSupported: nothing was launched (an operand the copy engine cannot describe).
    Status s = cuda::sm90::dispatch_fwd(p, stream);
    if (s.code() != StatusCode::kNotSupported || path == CudaPath::kSm90) return s;
  }
#else
  (void)major;
#endif
  return cuda::dispatch_fwd(p, stream);
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

Status padded_forward(const ForwardParams& p, int run_dim, int major, cudaStream_t stream) {
  const bool varlen = p.is_varlen();
  const RowSpace qr = q_rows(p), kr = k_rows(p);
  const int64_t d = p.head_dim, w = run_dim;
  const int64_t elems = 2 * qr.batch * qr.rows * p.heads * w + 2 * kr.batch * kr.rows * p.heads_k * w;
  ScopedWorkspace ws(stream);
  if (Status s = ws.alloc(static_cast<size_t>(elems) * sizeof(uint16_t)); !s.ok()) return s;
  uint16_t* cursor = ws.data();
  const PaddedOperand q = carve(&cursor, qr, p.heads, w, varlen);
  const PaddedOperand k = carve(&cursor, kr, p.heads_k, w, varlen);
  const PaddedOperand v = carve(&cursor, kr, p.heads_k, w, varlen);
  const PaddedOperand out = carve(&cursor, qr, p.heads, w, varlen);
  if (Status s = pad_in(q, w, p.q, p.q_strides, d, qr, p.heads, stream); !s.ok()) return s;
  if (Status s = pad_in(k, w, p.k, p.k_strides, d, kr, p.heads_k, stream); !s.ok()) return s;
  if (Status s = pad_in(v, w, p.v, p.v_strides, d, kr, p.heads_k, stream); !s.ok()) return s;

  ForwardParams pp = p;  // scale and scale_log2 stay those of the caller's head dim
  pp.head_dim = pp.head_dim_v = run_dim;
  pp.q = q.data, pp.q_strides = q.strides;
  pp.k = k.data, pp.k_strides = k.strides;
  pp.v = v.data, pp.v_strides = v.strides;
  pp.out = out.data, pp.out_strides = out.strides;
  if (Status s = dispatch_forward(pp, major, stream); !s.ok()) return s;
  return pad_out(p.out, p.out_strides, d, out, w, qr, p.heads, stream);
}

Status padded_backward(const BackwardParams& p, int run_dim, cudaStream_t stream) {
  const bool varlen = p.is_varlen();
  const RowSpace qr = q_rows(p), kr = k_rows(p);
  const int64_t d = p.head_dim, w = run_dim;
  const int64_t elems = 4 * qr.batch * qr.rows * p.heads * w + 4 * kr.batch * kr.rows * p.heads_k * w;
  ScopedWorkspace ws(stream);
  if (Status s = ws.alloc(static_cast<size_t>(elems) * sizeof(uint16_t)); !s.ok()) return s;
  uint16_t* cursor = ws.data();
  const PaddedOperand q = carve(&cursor, qr, p.heads, w, varlen);
  const PaddedOperand out = carve(&cursor, qr, p.heads, w, varlen);
  const PaddedOperand dout = carve(&cursor, qr, p.heads, w, varlen);
  const PaddedOperand dq = carve(&cursor, qr, p.heads, w, varlen);
  const PaddedOperand k = carve(&cursor, kr, p.heads_k, w, varlen);
  const PaddedOperand v = carve(&cursor, kr, p.heads_k, w, varlen);
  const PaddedOperand dk = carve(&cursor, kr, p.heads_k, w, varlen);
  const PaddedOperand dv = carve(&cursor, kr, p.heads_k, w, varlen);
  if (Status s = pad_in(q, w, p.q, p.q_strides, d, qr, p.heads, stream); !s.ok()) return s;
  if (Status s = pad_in(out, w, p.out, p.out_strides, d, qr, p.heads, stream); !s.ok()) return s;
  if (Status s = pad_in(dout, w, p.dout, p.dout_strides, d, qr, p.heads, stream); !s.ok()) return s;
  if (Status s = pad_in(k, w, p.k, p.k_strides, d, kr, p.heads_k, stream); !s.ok()) return s;
  if (Status s = pad_in(v, w, p.v, p.v_strides, d, kr, p.heads_k, stream); !s.ok()) return s;

  BackwardParams pp = p;  // scale and scale_log2 stay those of the caller's head dim
  pp.head_dim = pp.head_dim_v = run_dim;
  pp.q = q.data, pp.q_strides = q.strides;
  pp.k = k.data, pp.k_strides = k.strides;
  pp.v = v.data, pp.v_strides = v.strides;
  pp.out = out.data, pp.out_strides = out.strides;
  pp.dout = dout.data, pp.dout_strides = dout.strides;
  pp.dq = dq.data, pp.dq_strides = dq.strides;
  pp.dk = dk.data, pp.dk_strides = dk.strides;
  pp.dv = dv.data, pp.dv_strides = dv.strides;
  if (Status s = cuda::dispatch_bwd(pp, stream); !s.ok()) return s;
  if (Status s = pad_out(p.dq, p.dq_strides, d, dq, w, qr, p.heads, stream); !s.ok()) return s;
  if (Status s = pad_out(p.dk, p.dk_strides, d, dk, w, kr, p.heads_k, stream); !s.ok()) return s;
  return pad_out(p.dv, p.dv_strides, d, dv, w, kr, p.heads_k, stream);
}

}  // namespace

Status cuda_forward(const ForwardParams& p) {
  cuda::DeviceScope restore_device;  // prepare() selects the tensors' device
  int run_dim = 0, major = 0;
  if (Status s = prepare(p, &run_dim, &major); !s.ok()) return s;
  if (run_dim == p.head_dim) {
    if (Status s = check_operand("out", p.out, p.out_strides); !s.ok()) return s;
  }
  const auto stream = static_cast<cudaStream_t>(p.stream);
  const RowSpace qr = q_rows(p);
  if (p.batch == 0 || p.seqlen_q == 0 || qr.rows == 0) return Status::Ok();
  if (p.seqlen_k == 0 || k_rows(p).rows == 0) {
    // No key anywhere: every row has out 0 and LSE -inf (SEMANTICS.md, empty tensors).
    if (Status s = zero_fill(p.out, p.out_strides, qr, p.heads, p.head_dim_v, stream); !s.ok()) return s;
    return cuda::fill_lse(p.lse, p.lse_batch_stride, p.lse_head_stride, qr.batch, p.heads, qr.rows,
                          -std::numeric_limits<float>::infinity(), stream);
  }
  if (run_dim != p.head_dim) return padded_forward(p, run_dim, major, stream);
  return dispatch_forward(p, major, stream);
}

Status cuda_backward(const BackwardParams& p) {
  cuda::DeviceScope restore_device;  // prepare() selects the tensors' device
  int run_dim = 0;
  if (Status s = prepare(p, &run_dim); !s.ok()) return s;
  if (run_dim == p.head_dim) {
    const struct {
      const char* name;
      const void* ptr;
      const Strides3& strides;
    } outs[] = {{"out", p.out, p.out_strides}, {"dout", p.dout, p.dout_strides}, {"dq", p.dq, p.dq_strides},
                {"dk", p.dk, p.dk_strides},   {"dv", p.dv, p.dv_strides}};
    for (const auto& o : outs) {
      if (Status s = check_operand(o.name, o.ptr, o.strides); !s.ok()) return s;
    }
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
    if (p.batch == 0) return Status::Ok();
    if (Status s = zero_fill(p.dq, p.dq_strides, qr, p.heads, p.head_dim, stream); !s.ok()) return s;
    if (Status s = zero_fill(p.dk, p.dk_strides, kr, p.heads_k, p.head_dim, stream); !s.ok()) return s;
    return zero_fill(p.dv, p.dv_strides, kr, p.heads_k, p.head_dim_v, stream);
  }
  if (run_dim != p.head_dim) return padded_backward(p, run_dim, stream);
  return cuda::dispatch_bwd(p, stream);
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

}  // namespace flashattn
