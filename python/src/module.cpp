// flashattn._C: the nanobind extension behind the Python package.
//
// Tensors arrive through DLPack (or the buffer protocol) as nb::ndarray, are turned into
// non-owning flashattn::TensorView's, and the C++ entry points run with the GIL released. These
// entry points never allocate a tensor: outputs are preallocated by the caller (the Python layer
// allocates them with torch or numpy). The extension does not link against any array framework;
// its torch fast path (torch_path.cpp) reads torch tensors through the CPython API and
// allocates with torch.empty_like / Tensor.new_empty, handed over by flashattn._torch_ops.
//
// Errors: argument problems found here and every non-ok Status come back as (exception class
// name, message), which flashattn._lowlevel raises; every message names the argument (see
// status_error for the mapping).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "binding.h"
#include "core/switches.h"
#include "flashattn/flashattn.h"

namespace {

using flashattn_py::Error;
using flashattn_py::run_released;
using flashattn_py::status_error;
using flashattn_py::to_python;

// ---- DLPack vocabulary for messages --------------------------------------------------------

std::string dlpack_dtype_name(nb::dlpack::dtype dt) {
  using Code = nb::dlpack::dtype_code;
  std::string base;
  switch (static_cast<Code>(dt.code)) {
    case Code::Int: base = "int" + std::to_string(dt.bits); break;
    case Code::UInt: base = "uint" + std::to_string(dt.bits); break;
    case Code::Float: base = "float" + std::to_string(dt.bits); break;
    case Code::Bfloat: base = "bfloat" + std::to_string(dt.bits); break;
    case Code::Complex: base = "complex" + std::to_string(dt.bits); break;
    case Code::Bool: base = "bool"; break;
    case Code::Float8_E4M3FN: base = "float8_e4m3fn"; break;
    case Code::Float8_E5M2: base = "float8_e5m2"; break;
    default: base = "dlpack_code" + std::to_string(dt.code) + "_bits" + std::to_string(dt.bits);
  }
  if (dt.lanes != 1) base += "x" + std::to_string(dt.lanes);
  return base;
}

std::string dlpack_device_name(int device_type) {
  // DLDeviceType values from dlpack.h.
  switch (device_type) {
    case 1: return "cpu";
    case 2: return "cuda";
    case 3: return "cuda_host (pinned)";
    case 4: return "opencl";
    case 7: return "vulkan";
    case 8: return "metal";
    case 10: return "rocm";
    case 11: return "rocm_host";
    case 13: return "cuda_managed";
    case 14: return "oneapi";
    default: return "DLPack device type " + std::to_string(device_type);
  }
}

// DLPack dtype -> flashattn::DType. Returns false for types the library has no name for.
bool to_dtype(nb::dlpack::dtype dt, fa::DType* out) {
  using Code = nb::dlpack::dtype_code;
  if (dt.lanes != 1) return false;
  const auto code = static_cast<Code>(dt.code);
  if (code == Code::Float && dt.bits == 32) *out = fa::DType::kFloat32;
  else if (code == Code::Float && dt.bits == 16) *out = fa::DType::kFloat16;
  else if (code == Code::Bfloat && dt.bits == 16) *out = fa::DType::kBFloat16;
  else if (code == Code::Int && dt.bits == 32) *out = fa::DType::kInt32;
  // Boolean masks: numpy/torch bool (DLPack kDLBool, 8 bits) and uint8 share one storage.
  else if ((code == Code::UInt || code == Code::Bool) && dt.bits == 8) *out = fa::DType::kUInt8;
  // Reserved for the FP8 forward path: mapped so that the library, not the binding, says
  // which backends accept it.
  else if (code == Code::Float8_E4M3FN && dt.bits == 8) *out = fa::DType::kFloat8E4M3;
  else return false;
  return true;
}

// "list", "numpy.ndarray", ...
std::string python_type_name(nb::handle obj) { return Py_TYPE(obj.ptr())->tp_name; }

std::string shape_str(const int64_t* shape, size_t ndim) {
  std::string s = "(";
  for (size_t i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

// ---- DLPack -> TensorView ------------------------------------------------------------------

// Imports arrays and keeps each one alive until the call returns (a TensorView owns nothing).
class Imports {
 public:
  // Names of the arrays that arrive as uint8 views of float8_e4m3 storage: torch exports float8
  // by DLPack only from 2.8 on, numpy's ml_dtypes never, so the Python layer passes a uint8 view
  // and names it here (a tuple of str, or None).
  explicit Imports(nb::handle float8_names = nb::none()) {
    if (float8_names.is_none()) return;
    for (nb::handle n : float8_names) float8_.emplace_back(nb::str(n).c_str());
  }

  // A tensor the library only reads. None gives an undefined view ("not given").
  // After the first failure every later call is a no-op and error() holds the reason.
  fa::TensorView input(const char* name, nb::handle obj) {
    if (error_ || obj.is_none()) return {};
    nb::ndarray<nb::ro> a;
    if (!nb::try_cast(obj, a, /*convert=*/false)) {
      error_ = import_error(name, obj, /*writable=*/false);
      return {};
    }
    fa::TensorView t = view(name, a.ndim(), a.shape_ptr(), a.stride_ptr(), a.dtype(),
                            a.device_type(), a.device_id(), const_cast<void*>(a.data()));
    inputs_.push_back(std::move(a));
    return t;
  }

  // A tensor the library writes; it must be writable.
  fa::TensorView output(const char* name, nb::handle obj) {
    if (error_ || obj.is_none()) return {};
    nb::ndarray<> a;
    if (!nb::try_cast(obj, a, /*convert=*/false)) {
      error_ = import_error(name, obj, /*writable=*/true);
      return {};
    }
    fa::TensorView t = view(name, a.ndim(), a.shape_ptr(), a.stride_ptr(), a.dtype(),
                            a.device_type(), a.device_id(), a.data());
    outputs_.push_back(std::move(a));
    return t;
  }

  const Error& error() const { return error_; }

 private:
  static Error import_error(const char* name, nb::handle obj, bool writable) {
    if (writable) {
      nb::ndarray<nb::ro> probe;
      if (nb::try_cast(obj, probe, false)) {
        return {"ValueError", std::string(name) + " is read-only, but flashattn writes it"};
      }
    }
    // The producer refused to export (nanobind swallows the reason): ask again, through the C
    // API (no C++ exception), to show its message.
    if (PyObject_HasAttrString(obj.ptr(), "__dlpack__")) {
      PyObject* capsule = PyObject_CallMethod(obj.ptr(), "__dlpack__", nullptr);
      if (capsule == nullptr) {
        PyObject *type = nullptr, *value = nullptr, *trace = nullptr;
        PyErr_Fetch(&type, &value, &trace);
        PyErr_NormalizeException(&type, &value, &trace);  // value an exception object, not a tuple
        std::string reason = "unknown reason";
        if (PyObject* text = value != nullptr ? PyObject_Str(value) : nullptr) {
          if (const char* c = PyUnicode_AsUTF8(text)) reason = c;
          Py_DECREF(text);
        }
        PyErr_Clear();
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(trace);
        return {"ValueError", std::string(name) + " could not be exported by DLPack: " + reason};
      }
      Py_DECREF(capsule);
    }
    return {"TypeError", std::string(name) +
                             " must be an array that supports DLPack or the buffer protocol "
                             "(numpy.ndarray, torch.Tensor, cupy.ndarray, ...), got " +
                             python_type_name(obj)};
  }

  fa::TensorView view(const char* name, size_t ndim, const int64_t* shape, const int64_t* strides,
                      nb::dlpack::dtype dt, int device_type, int device_id, void* data) {
    fa::TensorView t;
    if (!to_dtype(dt, &t.dtype)) {
      error_ = {"TypeError", std::string(name) + " has dtype " + dlpack_dtype_name(dt) +
                                 ", which flashattn does not support (float32, float16, bfloat16, "
                                 "float8_e4m3fn; int32 for cu_seqlens)"};
      return {};
    }
    if (t.dtype == fa::DType::kUInt8 &&
        std::find(float8_.begin(), float8_.end(), name) != float8_.end()) {
      t.dtype = fa::DType::kFloat8E4M3;
    }
    if (device_type == nb::device::cpu::value) {
      t.device = fa::Device{fa::DeviceType::kCPU, 0};
    } else if (device_type == nb::device::cuda::value) {
      t.device = fa::Device{fa::DeviceType::kCUDA, device_id};
    } else {
      error_ = {"ValueError", std::string(name) + " is on " + dlpack_device_name(device_type) +
                                  "; flashattn supports cpu and cuda tensors"};
      return {};
    }
    if (ndim == 0 || ndim > static_cast<size_t>(fa::TensorView::kMaxDims)) {
      error_ = {"ValueError", std::string(name) + " must have 1 to " +
                                  std::to_string(fa::TensorView::kMaxDims) + " dimensions, got " +
                                  std::to_string(ndim) + " with shape " + shape_str(shape, ndim)};
      return {};
    }
    t.ndim = static_cast<int32_t>(ndim);
    int64_t compact = 1;  // DLPack allows NULL strides for a compact row-major tensor
    for (size_t i = ndim; i-- > 0;) {
      t.shape[i] = shape[i];
      t.strides[i] = strides != nullptr ? strides[i] : compact;  // in elements, like TensorView's
      compact *= shape[i];
    }
    t.data = data;
    return t;
  }

  std::vector<nb::ndarray<nb::ro>> inputs_;
  std::vector<nb::ndarray<>> outputs_;
  std::vector<std::string> float8_;
  Error error_;
};

// Options shared by forward and backward, as they come from Python.
struct Options {
  nb::handle cu_seqlens_q, cu_seqlens_k, alibi_slopes;
  int32_t max_seqlen_q = 0, max_seqlen_k = 0;
  float softmax_scale = 0.0f;
  bool causal = false;
  int32_t window_left = -1, window_right = -1;
  float softcap = 0.0f;
  float dropout_p = 0.0f;
  uint64_t seed = 0, offset = 0;
  bool check_cu_seqlens = false;
  uintptr_t stream = 0;
  int32_t num_threads = 0;
  nb::handle learnable_sink;  // float32 (heads); None = no sink
  nb::handle attn_bias, attn_mask, block_mask;  // None = off (flashattn.h)
  int32_t block_size_q = 0, block_size_k = 0;
  // The compressed block mask (flashattn::BlockMaskLists); None = off.
  nb::handle kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices;

  void fill(Imports& im, fa::AttentionOptions* o) const {
    o->cu_seqlens_q = im.input("cu_seqlens_q", cu_seqlens_q);
    o->cu_seqlens_k = im.input("cu_seqlens_k", cu_seqlens_k);
    o->alibi_slopes = im.input("alibi_slopes", alibi_slopes);
    o->max_seqlen_q = max_seqlen_q;
    o->max_seqlen_k = max_seqlen_k;
    o->softmax_scale = softmax_scale;
    o->causal = causal;
    o->window_left = window_left;
    o->window_right = window_right;
    o->softcap = softcap;
    o->dropout_p = dropout_p;
    o->seed = seed;
    o->offset = offset;
    o->check_cu_seqlens = check_cu_seqlens;
    o->stream = reinterpret_cast<void*>(stream);
    o->num_threads = num_threads;
    o->learnable_sink = im.input("learnable_sink", learnable_sink);
    o->attn_bias = im.input("attn_bias", attn_bias);
    o->attn_mask = im.input("attn_mask", attn_mask);
    o->block_mask = im.input("block_mask", block_mask);
    o->block_size_q = block_size_q;
    o->block_size_k = block_size_k;
    o->block_mask_lists.kv_num_blocks = im.input("kv_num_blocks", kv_num_blocks);
    o->block_mask_lists.kv_indices = im.input("kv_indices", kv_indices);
    o->block_mask_lists.full_kv_num_blocks = im.input("full_kv_num_blocks", full_kv_num_blocks);
    o->block_mask_lists.full_kv_indices = im.input("full_kv_indices", full_kv_indices);
  }

  void set_block_lists(nb::handle num, nb::handle idx, nb::handle full_num, nb::handle full_idx) {
    kv_num_blocks = num, kv_indices = idx, full_kv_num_blocks = full_num, full_kv_indices = full_idx;
  }
};

// FP8 descale factors (float32 (batch, heads_k) or None) and the names of the uint8 views that
// hold float8_e4m3 (see Imports).
struct Fp8 {
  nb::handle q_descale, k_descale, v_descale, float8_names;
};

nb::object forward(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse,
                   const Options& opt, int32_t num_splits, const Fp8& fp8, nb::handle block_table) {
  Imports im(fp8.float8_names);
  fa::ForwardArgs args;
  args.q = im.input("q", q);
  args.k = im.input("k", k);
  args.v = im.input("v", v);
  args.out = im.output("out", out);
  args.lse = im.output("lse", lse);
  opt.fill(im, &args);
  args.num_splits = num_splits;
  args.q_descale = im.input("q_descale", fp8.q_descale);
  args.k_descale = im.input("k_descale", fp8.k_descale);
  args.v_descale = im.input("v_descale", fp8.v_descale);
  args.block_table = im.input("block_table", block_table);
  if (im.error()) return to_python(im.error());
  return run_released([&] { return fa::forward(args); });
}

nb::object backward(nb::handle dout, nb::handle q, nb::handle k, nb::handle v, nb::handle out,
                    nb::handle lse, nb::handle dq, nb::handle dk, nb::handle dv, const Options& opt,
                    bool deterministic, nb::handle dsink, nb::handle dbias) {
  Imports im;
  fa::BackwardArgs args;
  args.dout = im.input("dout", dout);
  args.q = im.input("q", q);
  args.k = im.input("k", k);
  args.v = im.input("v", v);
  args.out = im.input("out", out);
  args.lse = im.input("lse", lse);
  args.dq = im.output("dq", dq);
  args.dk = im.output("dk", dk);
  args.dv = im.output("dv", dv);
  opt.fill(im, &args);
  args.deterministic = deterministic;
  args.dsink = im.output("dsink", dsink);
  args.dbias = im.output("dbias", dbias);
  if (im.error()) return to_python(im.error());
  return run_released([&] { return fa::backward(args); });
}

nb::object check_varlen(nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, int64_t total_q,
                        int64_t total_k, int32_t max_seqlen_q, int32_t max_seqlen_k,
                        uintptr_t stream) {
  Imports im;
  const fa::TensorView cq = im.input("cu_seqlens_q", cu_seqlens_q);
  const fa::TensorView ck = im.input("cu_seqlens_k", cu_seqlens_k);
  if (im.error()) return to_python(im.error());
  return run_released([&] {
    return fa::check_varlen_metadata(cq, ck, total_q, total_k, max_seqlen_q, max_seqlen_k,
                                     reinterpret_cast<void*>(stream));
  });
}

nb::object check_paged(nb::handle block_table, nb::handle cu_seqlens_k, int64_t num_blocks, int64_t page_size,
                       uintptr_t stream) {
  Imports im;
  const fa::TensorView table = im.input("block_table", block_table);
  const fa::TensorView ck = im.input("cu_seqlens_k", cu_seqlens_k);
  if (im.error()) return to_python(im.error());
  return run_released(
      [&] { return fa::check_paged_metadata(table, ck, num_blocks, page_size, reinterpret_cast<void*>(stream)); });
}

// forward_kvcache: k_cache/v_cache are written (the append), so they are imported as outputs.
nb::object forward_kvcache(nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle k,
                           nb::handle v, nb::handle rotary_cos, nb::handle rotary_sin,
                           nb::handle cache_seqlens, nb::handle cache_batch_idx,
                           nb::handle cache_leftpad, nb::handle block_table,
                           nb::handle alibi_slopes, nb::handle out, nb::handle lse,
                           float softmax_scale, bool causal, int32_t window_left,
                           int32_t window_right, float softcap, bool rotary_interleaved,
                           int32_t num_splits, uintptr_t stream, int32_t num_threads,
                           nb::handle learnable_sink, nb::handle q_descale, nb::handle k_descale,
                           nb::handle v_descale, nb::handle float8_names) {
  Imports im(float8_names);
  fa::KVCacheArgs args;
  args.q_descale = im.input("q_descale", q_descale);
  args.k_descale = im.input("k_descale", k_descale);
  args.v_descale = im.input("v_descale", v_descale);
  args.q = im.input("q", q);
  args.k_cache = im.output("k_cache", k_cache);
  args.v_cache = im.output("v_cache", v_cache);
  args.k = im.input("k", k);
  args.v = im.input("v", v);
  args.rotary_cos = im.input("rotary_cos", rotary_cos);
  args.rotary_sin = im.input("rotary_sin", rotary_sin);
  args.cache_seqlens = im.input("cache_seqlens", cache_seqlens);
  args.cache_batch_idx = im.input("cache_batch_idx", cache_batch_idx);
  args.cache_leftpad = im.input("cache_leftpad", cache_leftpad);
  args.block_table = im.input("block_table", block_table);
  args.alibi_slopes = im.input("alibi_slopes", alibi_slopes);
  args.learnable_sink = im.input("learnable_sink", learnable_sink);
  args.out = im.output("out", out);
  args.lse = im.output("lse", lse);
  args.softmax_scale = softmax_scale;
  args.causal = causal;
  args.window_left = window_left;
  args.window_right = window_right;
  args.softcap = softcap;
  args.rotary_interleaved = rotary_interleaved;
  args.num_splits = num_splits;
  args.stream = reinterpret_cast<void*>(stream);
  args.num_threads = num_threads;
  if (im.error()) return to_python(im.error());
  return run_released([&] { return fa::forward_kvcache(args); });
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "flashattn C++ extension (DLPack in, preallocated outputs, no allocation). "
            "Use the flashattn package, not this module.";

  m.def(
      "forward",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse,
         nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, nb::handle alibi_slopes,
         int32_t max_seqlen_q, int32_t max_seqlen_k, float softmax_scale, bool causal,
         int32_t window_left, int32_t window_right, float softcap, float dropout_p,
         uint64_t seed, uint64_t offset, int32_t num_splits, bool check_cu_seqlens,
         uintptr_t stream, int32_t num_threads, nb::handle learnable_sink, nb::handle attn_bias,
         nb::handle attn_mask, nb::handle block_mask, int32_t block_size_q, int32_t block_size_k,
         nb::handle kv_num_blocks, nb::handle kv_indices, nb::handle full_kv_num_blocks,
         nb::handle full_kv_indices, nb::handle q_descale, nb::handle k_descale,
         nb::handle v_descale, nb::handle float8, nb::handle block_table) {
        Options o{cu_seqlens_q, cu_seqlens_k, alibi_slopes, max_seqlen_q, max_seqlen_k,
                  softmax_scale, causal, window_left, window_right, softcap, dropout_p,
                  seed, offset, check_cu_seqlens, stream, num_threads};
        o.learnable_sink = learnable_sink;
        o.attn_bias = attn_bias, o.attn_mask = attn_mask, o.block_mask = block_mask;
        o.block_size_q = block_size_q, o.block_size_k = block_size_k;
        o.set_block_lists(kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices);
        return forward(q, k, v, out, lse, o, num_splits, Fp8{q_descale, k_descale, v_descale, float8},
                       block_table);
      },
      nb::arg("q").none(), nb::arg("k").none(), nb::arg("v").none(), nb::arg("out").none(), nb::arg("lse").none(),
      nb::kw_only(), nb::arg("cu_seqlens_q").none() = nb::none(),
      nb::arg("cu_seqlens_k").none() = nb::none(), nb::arg("alibi_slopes").none() = nb::none(),
      nb::arg("max_seqlen_q") = 0, nb::arg("max_seqlen_k") = 0, nb::arg("softmax_scale") = 0.0f,
      nb::arg("causal") = false, nb::arg("window_left") = -1, nb::arg("window_right") = -1,
      nb::arg("softcap") = 0.0f, nb::arg("dropout_p") = 0.0f, nb::arg("seed") = 0,
      nb::arg("offset") = 0, nb::arg("num_splits") = 0, nb::arg("check_cu_seqlens") = false,
      nb::arg("stream") = 0, nb::arg("num_threads") = 0,
      nb::arg("learnable_sink").none() = nb::none(), nb::arg("attn_bias").none() = nb::none(),
      nb::arg("attn_mask").none() = nb::none(), nb::arg("block_mask").none() = nb::none(),
      nb::arg("block_size_q") = 0, nb::arg("block_size_k") = 0,
      nb::arg("kv_num_blocks").none() = nb::none(), nb::arg("kv_indices").none() = nb::none(),
      nb::arg("full_kv_num_blocks").none() = nb::none(),
      nb::arg("full_kv_indices").none() = nb::none(), nb::arg("q_descale").none() = nb::none(),
      nb::arg("k_descale").none() = nb::none(), nb::arg("v_descale").none() = nb::none(),
      nb::arg("float8").none() = nb::none(), nb::arg("block_table").none() = nb::none(),
      "Attention forward into preallocated out (and lse, when not None). float8: names of the "
      "arguments given as uint8 views of float8_e4m3 data. block_table: k and v are pages (a "
      "varlen call). Returns None, or (exception class name, message) for the caller to raise. "
      "See flashattn.forward.");

  m.def(
      "backward",
      [](nb::handle dout, nb::handle q, nb::handle k, nb::handle v, nb::handle out,
         nb::handle lse, nb::handle dq, nb::handle dk, nb::handle dv, nb::handle cu_seqlens_q,
         nb::handle cu_seqlens_k, nb::handle alibi_slopes, int32_t max_seqlen_q,
         int32_t max_seqlen_k, float softmax_scale, bool causal, int32_t window_left,
         int32_t window_right, float softcap, float dropout_p, uint64_t seed, uint64_t offset,
         bool deterministic, bool check_cu_seqlens, uintptr_t stream, int32_t num_threads,
         nb::handle learnable_sink, nb::handle dsink, nb::handle attn_bias, nb::handle attn_mask,
         nb::handle block_mask, int32_t block_size_q, int32_t block_size_k, nb::handle dbias,
         nb::handle kv_num_blocks, nb::handle kv_indices, nb::handle full_kv_num_blocks,
         nb::handle full_kv_indices) {
        Options o{cu_seqlens_q, cu_seqlens_k, alibi_slopes, max_seqlen_q, max_seqlen_k,
                  softmax_scale, causal, window_left, window_right, softcap, dropout_p,
                  seed, offset, check_cu_seqlens, stream, num_threads};
        o.learnable_sink = learnable_sink;
        o.attn_bias = attn_bias, o.attn_mask = attn_mask, o.block_mask = block_mask;
        o.block_size_q = block_size_q, o.block_size_k = block_size_k;
        o.set_block_lists(kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices);
        return backward(dout, q, k, v, out, lse, dq, dk, dv, o, deterministic, dsink, dbias);
      },
      nb::arg("dout").none(), nb::arg("q").none(), nb::arg("k").none(), nb::arg("v").none(), nb::arg("out").none(), nb::arg("lse").none(),
      nb::arg("dq").none(), nb::arg("dk").none(), nb::arg("dv").none(), nb::kw_only(),
      nb::arg("cu_seqlens_q").none() = nb::none(), nb::arg("cu_seqlens_k").none() = nb::none(),
      nb::arg("alibi_slopes").none() = nb::none(), nb::arg("max_seqlen_q") = 0,
      nb::arg("max_seqlen_k") = 0, nb::arg("softmax_scale") = 0.0f, nb::arg("causal") = false,
      nb::arg("window_left") = -1, nb::arg("window_right") = -1, nb::arg("softcap") = 0.0f,
      nb::arg("dropout_p") = 0.0f, nb::arg("seed") = 0, nb::arg("offset") = 0,
      nb::arg("deterministic") = false, nb::arg("check_cu_seqlens") = false,
      nb::arg("stream") = 0, nb::arg("num_threads") = 0,
      nb::arg("learnable_sink").none() = nb::none(), nb::arg("dsink").none() = nb::none(),
      nb::arg("attn_bias").none() = nb::none(), nb::arg("attn_mask").none() = nb::none(),
      nb::arg("block_mask").none() = nb::none(), nb::arg("block_size_q") = 0,
      nb::arg("block_size_k") = 0, nb::arg("dbias").none() = nb::none(),
      nb::arg("kv_num_blocks").none() = nb::none(), nb::arg("kv_indices").none() = nb::none(),
      nb::arg("full_kv_num_blocks").none() = nb::none(),
      nb::arg("full_kv_indices").none() = nb::none(),
      "Attention backward into preallocated dq, dk, dv (and dsink, dbias). Returns None, or (exception class name, "
      "message) for the caller to raise. See flashattn.backward.");

  m.def("check_varlen", &check_varlen, nb::arg("cu_seqlens_q").none(),
        nb::arg("cu_seqlens_k").none(), nb::arg("total_q"), nb::arg("total_k"),
        nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"), nb::arg("stream") = 0,
        "Checks varlen metadata (flashattn::check_varlen_metadata). Returns None, or (exception "
        "class name, message) for the caller to raise.");
  m.def("check_paged", &check_paged, nb::arg("block_table").none(), nb::arg("cu_seqlens_k").none(),
        nb::arg("num_blocks"), nb::arg("page_size"), nb::arg("stream") = 0,
        "Checks a paged varlen call's block table against its key counts "
        "(flashattn::check_paged_metadata). Returns None, or (exception class name, message).");
  m.def("cuda_available", &fa::cuda_available,
        "Whether this build has the CUDA backend and at least one usable GPU.");
  m.def(
      "cuda_built",
      [] {
#if defined(FLASHATTN_WITH_CUDA)
        return true;
#else
        return false;
#endif
      },
      "Whether this build contains the CUDA backend (whatever the GPUs present).");
  m.def("version", &fa::version, "Library version string.");
  m.def(
      "_set_switch",
      [](const char* name, bool on) {  // const char*: nanobind converts str to it without stl/string.h
        namespace d = fa::detail;
        const std::string_view n(name);
        d::Switch s;
        if (n == "split_combine_kernel") {
          s = d::Switch::kSplitCombineKernel;
        } else if (n == "split_combine_counter") {
          s = d::Switch::kSplitCombineCounter;
        } else if (n == "bwd_single_buffer") {
          s = d::Switch::kBwdSingleBuffer;
        } else if (n == "fwd_sm80") {
          s = d::Switch::kFwdSm80;
        } else if (n == "bwd_sm80") {
          s = d::Switch::kBwdSm80;
        } else if (n == "no_token_fold") {
          s = d::Switch::kNoTokenFold;
        } else if (n == "no_decode_fold") {
          s = d::Switch::kNoDecodeFold;
        } else if (n == "sm90_cache") {
          s = d::Switch::kSm90Cache;
        } else if (n == "decode_share") {
          s = d::Switch::kDecodeShare;
        } else {
          throw nb::value_error(("_set_switch: unknown switch '" + std::string(n) +
                                 "' (split_combine_kernel, split_combine_counter, bwd_single_buffer, fwd_sm80, bwd_sm80, "
                                 "no_token_fold, no_decode_fold, sm90_cache, decode_share)")
                                    .c_str());
        }
        const bool was = d::switch_on(s);
        d::set_switch(s, on);
        return was;
      },
      nb::arg("name"), nb::arg("on"),
      "For tests: sets a process-wide kernel switch (src/core/switches.h) and returns its "
      "previous state.");
  m.def(
      "_backward_calls",
      []() {
        namespace d = fa::detail;
        return nb::make_tuple(d::sm90_backward_calls(), d::native_head_dim_v_backward_calls());
      },
      "For tests: (backward calls that ran on the sm90 kernels, of those the head_dim_v != head_dim "
      "calls that ran unpadded) in this process (src/core/switches.h).");
  m.def(
      "_cuda_head_dim_built",
      [](int d) {
#if defined(FLASHATTN_WITH_CUDA)
        return fa::detail::cuda_head_dim_built(d);
#else
        (void)d;
        return false;
#endif
      },
      nb::arg("d"),
      "For tests: whether this build instantiated the CUDA kernels of head dim d "
      "(FLASHATTN_CUDA_HEAD_DIMS); a head dim not built runs padded to a larger one.");
  m.def(
      "_cuda_sm90_built",
      [] {
#if defined(FLASHATTN_WITH_CUDA)
        return fa::detail::cuda_sm90_built();
#else
        return false;
#endif
      },
      "For tests: whether this build compiled its CUDA kernels for sm_90a (Hopper).");
  m.def(
      "_sm90_forward_calls", [] { return fa::detail::sm90_forward_calls(); },
      "For tests: how many 16-bit forward calls the sm90 (Hopper) kernels have run in this process "
      "(src/core/switches.h).");
  m.def(
      "_split_cluster_launches", [] { return fa::detail::split_cluster_launches(); },
      "For tests: how many split-KV decode launches merged their splits within thread-block "
      "clusters (sm90) in this process (src/core/switches.h).");
  m.def(
      "_token_fold_calls", [] { return fa::detail::token_fold_calls(); },
      "For tests: how many forward calls folded their GQA groups' (token, query head) pairs into the "
      "decode tiles' rows (fold_gqa_tokens, 1-16 query tokens) in this process (src/core/switches.h).");
  m.def(
      "_decode_share_calls", [] { return fa::detail::decode_share_calls(); },
      "For tests: how many varlen cache calls ran their sequences of a few tokens in a launch of their own "
      "(the decode_share switch) in this process (src/core/switches.h).");
  m.def(
      "_sm90_mask_bits_calls", [] { return fa::detail::sm90_mask_bits_calls(); },
      "For tests: how many sm90 forward calls read attn_mask as packed bits in this process "
      "(src/core/switches.h).");
  m.def(
      "_sm90_mask_kernel_calls", [] { return fa::detail::sm90_mask_kernel_calls(); },
      "For tests: how many sm90 forward calls ran on the mask kernel (attn_mask alone, without "
      "attn_bias, softcap or ALiBi) in this process (src/core/switches.h).");

  flashattn_py::register_torch_path(m);

  m.def("forward_kvcache", &forward_kvcache, nb::arg("q").none(), nb::arg("k_cache").none(),
        nb::arg("v_cache").none(), nb::arg("k").none(), nb::arg("v").none(),
        nb::arg("rotary_cos").none(), nb::arg("rotary_sin").none(),
        nb::arg("cache_seqlens").none(), nb::arg("cache_batch_idx").none(),
        nb::arg("cache_leftpad").none(), nb::arg("block_table").none(),
        nb::arg("alibi_slopes").none(), nb::arg("out").none(), nb::arg("lse").none(),
        nb::arg("softmax_scale"), nb::arg("causal"), nb::arg("window_left"),
        nb::arg("window_right"), nb::arg("softcap"), nb::arg("rotary_interleaved"),
        nb::arg("num_splits"), nb::arg("stream"), nb::arg("num_threads"),
        nb::arg("learnable_sink").none() = nb::none(), nb::arg("q_descale").none() = nb::none(),
        nb::arg("k_descale").none() = nb::none(), nb::arg("v_descale").none() = nb::none(),
        nb::arg("float8").none() = nb::none(),
        "KV-cache attention (append into k_cache/v_cache in place, rotary, paging) into "
        "preallocated out (and lse unless None). Every argument is positional-capable so the "
        "torch path can call it without keyword parsing. Returns None, or (exception class "
        "name, message). See flashattn.flash_attn_with_kvcache.");
}
