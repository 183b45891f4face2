// The torch fast path of flashattn._C: flash_attn_func (forward, and backward for its training
// call) and flash_attn_with_kvcache on plain torch tensors, with the whole host side of a call in
// C++ (issue 17, "a thin host path").
//
// The DLPack path (module.cpp) costs a Python wrapper per call: two torch.empty, one DLPack
// export per tensor, the dispatcher-state checks, shape tuples and a call with 26 keywords
// (dev/NOTES.md, "Host path of flash_attn_func"). Here the tensors arrive as Python objects and
// are read through the CPython API: type, dtype, device, shape, stride() and data_ptr(); the
// outputs are allocated by calling torch.empty_like / Tensor.new_empty, the stream is read with
// torch._C._cuda_getCurrentRawStream, and the library runs with the GIL released. Nothing links
// against libtorch: every torch object used is handed over once by flashattn._torch_ops
// (torch_init) and kept.
//
// The path is all-or-nothing: whenever a call is anything but the common case (a tensor that is
// not a plain cpu/cuda torch.Tensor, a dtype other than float32/float16/bfloat16/int32, an
// operand the Python layer would copy first, a GPU that is not the current one, an argument of
// an unexpected Python type, ...) the entry point returns None before it has allocated or run
// anything, and the caller takes the DLPack path, which copies, converts, validates and raises
// exactly as before. Every check of the library itself (flashattn::forward and forward_kvcache
// validate their arguments) runs on both paths, so errors name the same argument either way.
//
// Results: None (not handled here), (out, lse) (done; the backward: (dq, dk, dv, dsink or None)),
// or (exception class name, message) for the caller to raise (flashattn._lowlevel.raise_error);
// flash_attn_func's direct call also returns True for a call that records an autograd graph,
// which _torch_ops.FuncAutograd then runs through torch_forward and torch_backward.
#include <Python.h>
#include <nanobind/nanobind.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "binding.h"

namespace flashattn_py {
namespace {

// ---- the torch objects, handed over once --------------------------------------------------

// Strong references kept for the life of the process (the module is never unloaded).
struct Torch {
  PyTypeObject* tensor = nullptr;     // torch.Tensor
  PyTypeObject* parameter = nullptr;  // torch.nn.Parameter (learnable sinks are parameters)
  PyObject* empty_like = nullptr;     // torch.empty_like
  PyObject* float32 = nullptr;        // dtypes, compared by identity
  PyObject* float16 = nullptr;
  PyObject* bfloat16 = nullptr;
  PyObject* int32 = nullptr;
  PyObject* raw_stream = nullptr;      // torch._C._cuda_getCurrentRawStream(index) -> int, or None
  PyObject* current_device = nullptr;  // torch._C._cuda_getDevice() -> int, or None
  PyObject* num_threads = nullptr;     // torch.get_num_threads
  PyObject* grad_enabled = nullptr;    // torch.is_grad_enabled
  // Queries whose truthy result means the registered op is needed (jit tracing, a torch.func
  // transform, a torch function or dispatch mode, the profiler): checked by direct calls only.
  std::vector<PyObject*> busy;
  // Interned names.
  PyObject *s_dtype, *s_is_cuda, *s_is_cpu, *s_get_device, *s_shape, *s_stride, *s_data_ptr,
      *s_requires_grad, *s_new_empty, *kw_dtype;
  bool ready = false;
};

Torch g_torch;

PyObject* keep(nb::handle h) {
  Py_INCREF(h.ptr());
  return h.ptr();
}

nb::object torch_init(nb::handle tensor, nb::handle parameter, nb::handle empty_like,
                      nb::handle dtypes, nb::handle raw_stream, nb::handle current_device,
                      nb::handle num_threads, nb::handle grad_enabled, nb::handle busy) {
  Torch& t = g_torch;
  if (!PyType_Check(tensor.ptr()) || !PyType_Check(parameter.ptr())) {
    return to_python({"TypeError", "torch_init: tensor and parameter must be types"});
  }
  t.tensor = reinterpret_cast<PyTypeObject*>(keep(tensor));
  t.parameter = reinterpret_cast<PyTypeObject*>(keep(parameter));
  t.empty_like = keep(empty_like);
  t.float32 = keep(dtypes[0]);
  t.float16 = keep(dtypes[1]);
  t.bfloat16 = keep(dtypes[2]);
  t.int32 = keep(dtypes[3]);
  t.raw_stream = raw_stream.is_none() ? nullptr : keep(raw_stream);
  t.current_device = current_device.is_none() ? nullptr : keep(current_device);
  t.num_threads = keep(num_threads);
  t.grad_enabled = keep(grad_enabled);
  t.busy.clear();
  for (nb::handle q : busy) t.busy.push_back(keep(q));
  t.s_dtype = PyUnicode_InternFromString("dtype");
  t.s_is_cuda = PyUnicode_InternFromString("is_cuda");
  t.s_is_cpu = PyUnicode_InternFromString("is_cpu");
  t.s_get_device = PyUnicode_InternFromString("get_device");
  t.s_shape = PyUnicode_InternFromString("shape");
  t.s_stride = PyUnicode_InternFromString("stride");
  t.s_data_ptr = PyUnicode_InternFromString("data_ptr");
  t.s_requires_grad = PyUnicode_InternFromString("requires_grad");
  t.s_new_empty = PyUnicode_InternFromString("new_empty");
  t.kw_dtype = Py_BuildValue("(s)", "dtype");
  t.ready = true;
  return nb::none();
}

// ---- reading Python values without raising -------------------------------------------------

// Every reader returns false when the value is not what the fast path takes (the caller then
// returns None and the DLPack path handles the call); a Python error raised on the way is
// cleared, since that path will meet the same value and report it properly.
bool fail() {
  PyErr_Clear();
  return false;
}

bool read_int64(PyObject* obj, int64_t* out) {
  if (!PyLong_CheckExact(obj)) return false;
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
  if (overflow != 0 || (v == -1 && PyErr_Occurred())) return fail();
  *out = v;
  return true;
}

bool read_int32(PyObject* obj, int32_t* out) {
  int64_t v = 0;
  if (!read_int64(obj, &v) || v < std::numeric_limits<int32_t>::min() ||
      v > std::numeric_limits<int32_t>::max()) {
    return false;
  }
  *out = static_cast<int32_t>(v);
  return true;
}

// A float or int, as float(x) reads it.
bool read_double(PyObject* obj, double* out) {
  if (PyFloat_CheckExact(obj)) {
    *out = PyFloat_AS_DOUBLE(obj);
    return true;
  }
  int64_t v = 0;
  if (!read_int64(obj, &v)) return false;
  *out = static_cast<double>(v);
  return true;
}

bool read_bool(PyObject* obj, bool* out) {
  const int v = PyObject_IsTrue(obj);
  if (v < 0) return fail();
  *out = v != 0;
  return true;
}

// softmax_scale: None -> 0 (the library's 1/sqrt(head_dim)). A user's value (direct) must be
// > 0 in float32, where the library reads it (resolve_scale raises for anything else, a value
// that rounds to 0 included, on the DLPack path); an op's is already resolved (0 = the default).
bool read_scale(PyObject* obj, bool direct, float* out) {
  if (obj == Py_None) {
    *out = 0.0f;
    return true;
  }
  double v = 0.0;
  if (!read_double(obj, &v)) return false;
  *out = static_cast<float>(v);
  return !direct || *out > 0.0f;
}

// window_size: a tuple or list of two ints that fit int32 (resolve_window's checks).
bool read_window(PyObject* obj, int32_t* left, int32_t* right) {
  if ((!PyTuple_CheckExact(obj) && !PyList_CheckExact(obj)) || PySequence_Fast_GET_SIZE(obj) != 2) {
    return false;
  }
  return read_int32(PySequence_Fast_GET_ITEM(obj, 0), left) &&
         read_int32(PySequence_Fast_GET_ITEM(obj, 1), right);
}

// The scalar options forward and backward share (the varlen maxima, softmax_scale, causal,
// window_size, softcap, dropout_p as float() reads it, the dropout seed, an int taken modulo
// 2**64, and check_cu_seqlens) into *o.
bool read_options(nb::handle max_seqlen_q, nb::handle max_seqlen_k, nb::handle softmax_scale,
                  nb::handle causal, nb::handle window_size, nb::handle softcap,
                  nb::handle dropout_p, nb::handle seed, bool check_cu_seqlens, bool direct,
                  fa::AttentionOptions* o) {
  double softcap_v = 0.0, dropout_v = 0.0;
  if (!read_int32(max_seqlen_q.ptr(), &o->max_seqlen_q) ||
      !read_int32(max_seqlen_k.ptr(), &o->max_seqlen_k) ||
      !read_scale(softmax_scale.ptr(), direct, &o->softmax_scale) ||
      !read_bool(causal.ptr(), &o->causal) ||
      !read_window(window_size.ptr(), &o->window_left, &o->window_right) ||
      !read_double(softcap.ptr(), &softcap_v) || !read_double(dropout_p.ptr(), &dropout_v) ||
      !PyLong_CheckExact(seed.ptr())) {
    return false;
  }
  o->check_cu_seqlens = check_cu_seqlens;
  o->softcap = static_cast<float>(softcap_v);
  o->dropout_p = static_cast<float>(dropout_v);
  o->seed = PyLong_AsUnsignedLongLongMask(seed.ptr());
  if (PyErr_Occurred()) return fail();
  return true;
}

// A call obj.name() or attribute obj.name, owned; invalid (and the error cleared) on failure.
nb::object attr(PyObject* obj, PyObject* name) {
  PyObject* r = PyObject_GetAttr(obj, name);
  if (r == nullptr) PyErr_Clear();
  return nb::steal(r);
}

nb::object call_method(PyObject* obj, PyObject* name) {
  PyObject* r = PyObject_CallMethodNoArgs(obj, name);
  if (r == nullptr) PyErr_Clear();
  return nb::steal(r);
}

// A tuple of ints (torch.Size is a tuple subclass) into dims[0..n).
bool read_dims(PyObject* tuple, int64_t* dims, int* n) {
  if (!PyTuple_Check(tuple)) return false;
  const Py_ssize_t size = PyTuple_GET_SIZE(tuple);
  if (size < 1 || size > fa::TensorView::kMaxDims) return false;
  for (Py_ssize_t i = 0; i < size; ++i) {
    if (!read_int64(PyTuple_GET_ITEM(tuple, i), &dims[i])) return false;
  }
  *n = static_cast<int>(size);
  return true;
}

// ---- torch tensors -> TensorView -----------------------------------------------------------

// What a Reader does with a tensor that requires grad.
enum class GradCheck {
  kIgnore,  // inside an op or an autograd formula, or grad mode is off
  kRefuse,  // a direct call that cannot record a graph (flash_attn_with_kvcache): decline
  kNote,    // a direct call that can (flash_attn_func): note it, see needs_graph()
};

class Reader {
 public:
  explicit Reader(GradCheck grad) : grad_(grad) {}

  // Whether a tensor read so far requires grad (GradCheck::kNote).
  bool needs_graph() const { return needs_graph_; }

  // A tensor argument, or None (an undefined view). kernel_operand: q, k, v, which the
  // Python layer would copy unless their last dimension is contiguous and, on a GPU, pointer
  // and strides allow 16-byte copies (_torch_ops._kernel_ready); such calls are not taken.
  bool tensor(PyObject* obj, fa::TensorView* t, bool kernel_operand = false) {
    *t = {};
    if (obj == Py_None) return true;
    const Torch& T = g_torch;
    if (Py_TYPE(obj) != T.tensor && Py_TYPE(obj) != T.parameter) return false;
    if (grad_ != GradCheck::kIgnore) {
      nb::object rg = attr(obj, T.s_requires_grad);
      if (!rg.is_valid() || (rg.ptr() != Py_False && rg.ptr() != Py_True)) return false;
      if (rg.ptr() == Py_True) {
        if (grad_ == GradCheck::kRefuse) return false;
        needs_graph_ = true;
      }
    }
    nb::object dt = attr(obj, T.s_dtype);
    if (!dt.is_valid()) return false;
    if (dt.ptr() == T.float32) t->dtype = fa::DType::kFloat32;
    else if (dt.ptr() == T.float16) t->dtype = fa::DType::kFloat16;
    else if (dt.ptr() == T.bfloat16) t->dtype = fa::DType::kBFloat16;
    else if (dt.ptr() == T.int32) t->dtype = fa::DType::kInt32;
    else return false;
    nb::object is_cuda = attr(obj, T.s_is_cuda);
    if (!is_cuda.is_valid()) return false;
    if (is_cuda.ptr() == Py_True) {
      nb::object index = call_method(obj, T.s_get_device);
      int32_t i = 0;
      if (!index.is_valid() || !read_int32(index.ptr(), &i) || i < 0) return false;
      t->device = fa::Device{fa::DeviceType::kCUDA, i};
    } else {
      nb::object is_cpu = attr(obj, T.s_is_cpu);
      if (!is_cpu.is_valid() || is_cpu.ptr() != Py_True) return false;  // meta, mps, ...
      t->device = fa::Device{fa::DeviceType::kCPU, 0};
    }
    nb::object shape = attr(obj, T.s_shape);
    nb::object strides = call_method(obj, T.s_stride);
    nb::object ptr = call_method(obj, T.s_data_ptr);
    int n = 0, ns = 0;
    if (!shape.is_valid() || !strides.is_valid() || !ptr.is_valid() ||
        !read_dims(shape.ptr(), t->shape, &n) || !read_dims(strides.ptr(), t->strides, &ns) ||
        n != ns || !PyLong_CheckExact(ptr.ptr())) {
      return false;
    }
    t->ndim = n;
    const unsigned long long address = PyLong_AsUnsignedLongLong(ptr.ptr());
    if (address == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return fail();
    t->data = reinterpret_cast<void*>(static_cast<uintptr_t>(address));
    return !kernel_operand || kernel_ready(*t);
  }

  // learnable_sink, or None: taken only as the Python layer would hand it over, float32 and
  // contiguous (flash_attn_interface._torch_sink converts any other).
  bool sink(PyObject* obj, fa::TensorView* t) {
    if (!tensor(obj, t)) return false;
    return !t->defined() || (t->dtype == fa::DType::kFloat32 && t->ndim == 1 &&
                             (t->strides[0] == 1 || t->shape[0] <= 1));
  }

 private:
  // _torch_ops._kernel_ready's test: true when that function would hand t over uncopied.
  static bool kernel_ready(const fa::TensorView& t) {
    const int last = t.ndim - 1;
    if (t.strides[last] != 1 && t.shape[last] > 1) return false;
    if (t.device.type == fa::DeviceType::kCUDA && t.shape[last] % 8 == 0) {
      if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return false;
      for (int i = 0; i < last; ++i) {
        if (t.strides[i] % 8 != 0) return false;
      }
    }
    return true;
  }

  GradCheck grad_;
  bool needs_graph_ = false;
};

// What forward and backward read alike: q, k, v (kernel operands), the varlen metadata, the
// ALiBi slopes and the sink. Args: fa::ForwardArgs or fa::BackwardArgs.
template <typename Args>
bool read_attention_inputs(Reader& r, nb::handle q, nb::handle k, nb::handle v,
                           nb::handle cu_seqlens_q, nb::handle cu_seqlens_k,
                           nb::handle alibi_slopes, nb::handle learnable_sink, Args* args) {
  return r.tensor(q.ptr(), &args->q, true) && r.tensor(k.ptr(), &args->k, true) &&
         r.tensor(v.ptr(), &args->v, true) &&
         r.tensor(cu_seqlens_q.ptr(), &args->cu_seqlens_q) &&
         r.tensor(cu_seqlens_k.ptr(), &args->cu_seqlens_k) &&
         r.tensor(alibi_slopes.ptr(), &args->alibi_slopes) &&
         r.sink(learnable_sink.ptr(), &args->learnable_sink);
}

// Whether a direct call (no registered op) is allowed: _torch_ops._direct_ok's dispatcher-state
// checks (torch.compile is checked by the Python caller, where dynamo sees it). Sets
// *grad to torch.is_grad_enabled().
bool direct_ok(bool* grad) {
  for (PyObject* query : g_torch.busy) {
    PyObject* r = PyObject_CallNoArgs(query);
    if (r == nullptr) return fail();
    const int active = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (active != 0) return active < 0 ? fail() : false;
  }
  PyObject* r = PyObject_CallNoArgs(g_torch.grad_enabled);
  if (r == nullptr) return fail();
  *grad = r == Py_True;
  Py_DECREF(r);
  return true;
}

// Where the call runs: the current stream of q's GPU (only when that GPU is the current one;
// otherwise the DLPack path enters the device guard), or torch's intra-op thread count.
bool launch_target(const fa::TensorView& q, void** stream, int32_t* num_threads) {
  const Torch& T = g_torch;
  if (q.device.type == fa::DeviceType::kCPU) {
    nb::object n = nb::steal(PyObject_CallNoArgs(T.num_threads));
    if (!n.is_valid()) return fail();
    *stream = nullptr;
    return read_int32(n.ptr(), num_threads);
  }
  if (T.raw_stream == nullptr || T.current_device == nullptr) return false;
  nb::object current = nb::steal(PyObject_CallNoArgs(T.current_device));
  int32_t index = 0;
  if (!current.is_valid() || !read_int32(current.ptr(), &index)) return fail();
  if (index != q.device.index) return false;
  nb::object idx = nb::steal(PyLong_FromLong(index));
  nb::object s = nb::steal(PyObject_CallOneArg(T.raw_stream, idx.ptr()));
  if (!s.is_valid() || !PyLong_Check(s.ptr())) return fail();
  const unsigned long long v = PyLong_AsUnsignedLongLong(s.ptr());
  if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return fail();
  *stream = reinterpret_cast<void*>(static_cast<uintptr_t>(v));
  *num_threads = 0;
  return true;
}

// A contiguous view of the new tensor t (dtype, shape) in *view; t invalid if it is.
nb::object contiguous_view(nb::object t, const int64_t* shape, int ndim, fa::DType dtype,
                           fa::TensorView* view) {
  if (!t.is_valid()) return t;
  nb::object ptr = call_method(t.ptr(), g_torch.s_data_ptr);
  if (!ptr.is_valid()) return {};
  view->data = PyLong_AsVoidPtr(ptr.ptr());
  view->dtype = dtype;
  view->ndim = ndim;
  int64_t stride = 1;
  for (int i = ndim; i-- > 0;) {
    view->shape[i] = shape[i];
    view->strides[i] = stride;
    stride *= shape[i];
  }
  return t;
}

// like.new_empty(shape[0], ..., shape[ndim - 1]) (dtype nullptr: like's) or with dtype=dtype:
// an uninitialised contiguous tensor on like's device; invalid, with the Python error set, if
// it raised. The sizes go as separate arguments: given one tuple, torch's argument parser first
// tries it as a single int, and the TypeError that PyNumber_Index raises (and the parser
// clears) made a tuple call ~1.2 us dearer (dev machine, timeit: 2.5 against 3.7 us).
nb::object new_empty(PyObject* like, const int64_t* shape, int ndim, PyObject* dtype) {
  if (ndim < 1 || ndim > fa::TensorView::kMaxDims) return {};
  nb::object dims[fa::TensorView::kMaxDims];
  PyObject* args[fa::TensorView::kMaxDims + 2] = {like};
  for (int i = 0; i < ndim; ++i) {
    dims[i] = nb::steal(PyLong_FromLongLong(shape[i]));
    if (!dims[i].is_valid()) return {};
    args[1 + i] = dims[i].ptr();
  }
  args[1 + ndim] = dtype;
  return nb::steal(PyObject_VectorcallMethod(g_torch.s_new_empty, args, size_t(1 + ndim),
                                             dtype != nullptr ? g_torch.kw_dtype : nullptr));
}

bool row_major(const fa::TensorView& t) {
  int64_t stride = 1;
  for (int i = t.ndim; i-- > 0;) {
    if (t.strides[i] != stride) return false;
    stride *= t.shape[i];
  }
  return true;
}

// out (q's shape with v's last dimension, q's dtype) and lse (float32 lse_shape) on q's device,
// both contiguous: what torch.empty(shape, dtype=..., device=q.device) gives, allocated the
// cheapest way (torch.empty costs ~2 us of argument parsing per call on the dev machine,
// q.new_empty ~1.6, torch.empty_like ~0.9: dev/NOTES.md, "Host path of flash_attn_func").
// On failure (an allocation error: out of memory) the Python error is turned into a result.
// The Python error an allocation raised (out of memory, most likely), cleared and turned into a
// result naming its message.
nb::object allocation_error() {
  std::string message = "flashattn could not allocate its outputs";
  PyObject *type = nullptr, *value = nullptr, *trace = nullptr;
  PyErr_Fetch(&type, &value, &trace);
  if (value != nullptr) {
    if (PyObject* text = PyObject_Str(value)) {
      if (const char* c = PyUnicode_AsUTF8(text)) message += std::string(": ") + c;
      Py_DECREF(text);
    }
  }
  PyErr_Clear();
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(trace);
  return to_python({"RuntimeError", message});
}

struct Outputs {
  nb::object out, lse, error;
};

Outputs allocate(PyObject* q_obj, const fa::TensorView& q, int64_t head_dim_v,
                 const int64_t* lse_shape, int lse_ndim, fa::TensorView* out,
                 fa::TensorView* lse) {
  const Torch& T = g_torch;
  Outputs o;
  int64_t out_shape[fa::TensorView::kMaxDims];
  for (int i = 0; i < q.ndim; ++i) out_shape[i] = q.shape[i];
  out_shape[q.ndim - 1] = head_dim_v;
  if (head_dim_v == q.shape[q.ndim - 1] && row_major(q)) {
    // empty_like keeps q's strides, which are the contiguous ones.
    o.out = nb::steal(PyObject_CallOneArg(T.empty_like, q_obj));
  } else {
    o.out = new_empty(q_obj, out_shape, q.ndim, nullptr);
  }
  o.out = contiguous_view(std::move(o.out), out_shape, q.ndim, q.dtype, out);
  if (o.out.is_valid()) {
    o.lse = new_empty(q_obj, lse_shape, lse_ndim, T.float32);
    o.lse = contiguous_view(std::move(o.lse), lse_shape, lse_ndim, fa::DType::kFloat32, lse);
  }
  if (!o.out.is_valid() || !o.lse.is_valid()) o.error = allocation_error();
  return o;
}

// Runs the library call with the GIL released; (out, lse) on success, else the error.
template <typename Call>
nb::object finish(const Outputs& o, const Call& call) {
  nb::object error = run_released(call);
  if (!error.is_none()) return error;
  return nb::make_tuple(o.out, o.lse);
}

// ---- the entry points ----------------------------------------------------------------------

// flashattn::fwd's implementation (_torch_ops._run_fwd) for the unpacked, packed (q, k, v
// given as views) and varlen layouts, without bias, masks or FP8. direct: also make the checks
// of _torch_ops._direct_ok (called from flash_attn_func, outside any registered op).
nb::object torch_forward(nb::handle q_obj, nb::handle k_obj, nb::handle v_obj,
                         nb::handle cu_seqlens_q, nb::handle cu_seqlens_k,
                         nb::handle max_seqlen_q, nb::handle max_seqlen_k,
                         nb::handle alibi_slopes, nb::handle softmax_scale, nb::handle causal,
                         nb::handle window_size, nb::handle softcap, nb::handle dropout_p,
                         nb::handle seed, nb::handle learnable_sink, bool check_cu_seqlens,
                         bool direct, nb::handle block_table) {
  if (!g_torch.ready) return nb::none();
  bool grad = false;
  if (direct && !direct_ok(&grad)) return nb::none();
  fa::ForwardArgs args;
  if (!read_options(max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size, softcap,
                    dropout_p, seed, check_cu_seqlens, direct, &args)) {
    return nb::none();
  }

  Reader r(direct && grad ? GradCheck::kNote : GradCheck::kIgnore);
  if (!read_attention_inputs(r, q_obj, k_obj, v_obj, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
                             learnable_sink, &args) ||
      !r.tensor(block_table.ptr(), &args.block_table)) {
    return nb::none();
  }
  const bool varlen = !cu_seqlens_q.is_none();
  // q's rank and v's head dim decide the output shapes (the DLPack path names a wrong rank or a
  // missing v).
  if (args.q.dtype == fa::DType::kInt32 || args.q.ndim != (varlen ? 3 : 4) || !args.v.defined()) {
    return nb::none();
  }
  if (!launch_target(args.q, &args.stream, &args.num_threads)) return nb::none();
  // A direct call that records an autograd graph is flash_attn_func's autograd.Function's to
  // run (_torch_ops.FuncAutograd: it draws the dropout seed and calls back with direct=false):
  // True says the call is one this path takes. Without a graph a direct call draws no seed
  // either (the op path does that in Python).
  if (direct && r.needs_graph()) return nb::bool_(true);
  if (direct && args.dropout_p != 0.0f) return nb::none();

  // lse: dense (batch, heads, seqlen_q); varlen (heads, total_q).
  const int64_t lse_dense[] = {args.q.shape[0], args.q.shape[2], args.q.shape[1]};
  const int64_t lse_varlen[] = {args.q.shape[1], args.q.shape[0]};
  const Outputs o = allocate(q_obj.ptr(), args.q, args.v.shape[args.v.ndim - 1],
                             varlen ? lse_varlen : lse_dense, varlen ? 2 : 3, &args.out, &args.lse);
  if (o.error.is_valid()) return o.error;
  args.out.device = args.lse.device = args.q.device;
  return finish(o, [&] { return fa::forward(args); });
}

// flashattn::fwd_kvcache's implementation (_torch_ops._fwd_kvcache_impl) without FP8. direct:
// as for torch_forward (called from flash_attn_with_kvcache).
nb::object torch_forward_kvcache(nb::handle q_obj, nb::handle k_cache, nb::handle v_cache,
                                 nb::handle k, nb::handle v, nb::handle rotary_cos,
                                 nb::handle rotary_sin, nb::handle cache_seqlens,
                                 nb::handle cache_batch_idx, nb::handle cache_leftpad,
                                 nb::handle block_table, nb::handle alibi_slopes,
                                 nb::handle softmax_scale, nb::handle causal,
                                 nb::handle window_size, nb::handle softcap,
                                 nb::handle rotary_interleaved, nb::handle num_splits,
                                 nb::handle learnable_sink, bool direct) {
  if (!g_torch.ready) return nb::none();
  bool grad = false;
  if (direct && !direct_ok(&grad)) return nb::none();
  fa::KVCacheArgs args;
  double softcap_v = 0.0;
  if (!read_scale(softmax_scale.ptr(), direct, &args.softmax_scale) ||
      !read_bool(causal.ptr(), &args.causal) ||
      !read_window(window_size.ptr(), &args.window_left, &args.window_right) ||
      !read_double(softcap.ptr(), &softcap_v) ||
      !read_bool(rotary_interleaved.ptr(), &args.rotary_interleaved) ||
      !read_int32(num_splits.ptr(), &args.num_splits)) {
    return nb::none();
  }
  args.softcap = static_cast<float>(softcap_v);

  Reader r(direct && grad ? GradCheck::kRefuse : GradCheck::kIgnore);
  if (!r.tensor(q_obj.ptr(), &args.q, true) || !r.tensor(k_cache.ptr(), &args.k_cache) ||
      !r.tensor(v_cache.ptr(), &args.v_cache) || !r.tensor(k.ptr(), &args.k, true) ||
      !r.tensor(v.ptr(), &args.v, true) || !r.tensor(rotary_cos.ptr(), &args.rotary_cos) ||
      !r.tensor(rotary_sin.ptr(), &args.rotary_sin) ||
      !r.tensor(cache_seqlens.ptr(), &args.cache_seqlens) ||
      !r.tensor(cache_batch_idx.ptr(), &args.cache_batch_idx) ||
      !r.tensor(cache_leftpad.ptr(), &args.cache_leftpad) ||
      !r.tensor(block_table.ptr(), &args.block_table) ||
      !r.tensor(alibi_slopes.ptr(), &args.alibi_slopes) ||
      !r.sink(learnable_sink.ptr(), &args.learnable_sink)) {
    return nb::none();
  }
  if (args.q.dtype == fa::DType::kInt32 || args.q.ndim != 4 || !args.v_cache.defined()) {
    return nb::none();
  }
  if (!launch_target(args.q, &args.stream, &args.num_threads)) return nb::none();

  const int64_t lse_shape[] = {args.q.shape[0], args.q.shape[2], args.q.shape[1]};
  const Outputs o = allocate(q_obj.ptr(), args.q, args.v_cache.shape[args.v_cache.ndim - 1],
                             lse_shape, 3, &args.out, &args.lse);
  if (o.error.is_valid()) return o.error;
  args.out.device = args.lse.device = args.q.device;
  return finish(o, [&] { return fa::forward_kvcache(args); });
}


// An uninitialised contiguous tensor like t (torch.empty(t.shape, dtype=t.dtype,
// device=t.device), as _torch_ops._empty makes the gradients), its view in *view; invalid,
// with the Python error set, if the allocation raised.
nb::object empty_contiguous(PyObject* obj, const fa::TensorView& t, fa::TensorView* view) {
  nb::object r;
  if (row_major(t)) {
    r = nb::steal(PyObject_CallOneArg(g_torch.empty_like, obj));  // keeps t's (contiguous) strides
  } else {
    r = new_empty(obj, t.shape, t.ndim, nullptr);
  }
  r = contiguous_view(std::move(r), t.shape, t.ndim, t.dtype, view);
  view->device = t.device;
  return r;
}

// A gradient: the caller's tensor grad_obj (a view into a packed gradient) read into *view, or,
// for None, a new one like t (empty_contiguous). Invalid, with the Python error set, if the
// allocation raised; invalid without an error if the caller's tensor is not one this path takes.
nb::object gradient(PyObject* grad_obj, PyObject* obj, const fa::TensorView& t, Reader* r,
                    fa::TensorView* view) {
  if (grad_obj == Py_None) return empty_contiguous(obj, t, view);
  if (!r->tensor(grad_obj, view)) return {};
  return nb::borrow(grad_obj);
}

// The op's backward implementation (_torch_ops._run_bwd) on every layout (q, k, v given as views)
// and varlen, without bias or masks, for _run_bwd and for FuncAutograd's backward: dq, dk, dv
// are the caller's tensors (views into a packed gradient) or, given None, allocated here like q,
// k, v (contiguous), and dsink (float32 (heads)) with a sink. direct (FuncAutograd, outside any
// registered op): the options are flash_attn_func's own (softmax_scale None or > 0), and
// _direct_ok's checks are made too (torch.compile's is the caller's). Returns None (the caller
// then takes the DLPack path), (dq, dk, dv, dsink or None), or (exception class name, message).
nb::object torch_backward(nb::handle dout_obj, nb::handle q_obj, nb::handle k_obj,
                          nb::handle v_obj, nb::handle out_obj, nb::handle lse_obj,
                          nb::handle dq_obj, nb::handle dk_obj, nb::handle dv_obj,
                          nb::handle cu_seqlens_q, nb::handle cu_seqlens_k,
                          nb::handle max_seqlen_q, nb::handle max_seqlen_k,
                          nb::handle alibi_slopes, nb::handle learnable_sink,
                          nb::handle softmax_scale, nb::handle causal, nb::handle window_size,
                          nb::handle softcap, nb::handle dropout_p, nb::handle seed,
                          nb::handle deterministic, bool check_cu_seqlens, bool direct) {
  if (!g_torch.ready) return nb::none();
  bool grad = false;
  if (direct && !direct_ok(&grad)) return nb::none();
  fa::BackwardArgs args;
  if (!read_options(max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size, softcap,
                    dropout_p, seed, check_cu_seqlens, direct, &args) ||
      !read_bool(deterministic.ptr(), &args.deterministic)) {
    return nb::none();
  }

  // A graph recorded by the backward itself (create_graph=True) is the op path's business.
  Reader r(direct && grad ? GradCheck::kRefuse : GradCheck::kIgnore);
  if (!r.tensor(dout_obj.ptr(), &args.dout, true) ||
      !read_attention_inputs(r, q_obj, k_obj, v_obj, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
                             learnable_sink, &args) ||
      !r.tensor(out_obj.ptr(), &args.out) || !r.tensor(lse_obj.ptr(), &args.lse)) {
    return nb::none();
  }
  const bool varlen = !cu_seqlens_q.is_none();
  if (args.q.dtype == fa::DType::kInt32 || args.q.ndim != (varlen ? 3 : 4) ||
      !args.out.defined() || !args.lse.defined()) {
    return nb::none();
  }
  if (!launch_target(args.q, &args.stream, &args.num_threads)) return nb::none();

  nb::object dq = gradient(dq_obj.ptr(), q_obj.ptr(), args.q, &r, &args.dq);
  nb::object dk = dq.is_valid() ? gradient(dk_obj.ptr(), k_obj.ptr(), args.k, &r, &args.dk)
                                : nb::object();
  nb::object dv = dk.is_valid() ? gradient(dv_obj.ptr(), v_obj.ptr(), args.v, &r, &args.dv)
                                : nb::object();
  nb::object dsink = nb::none();
  if (dv.is_valid() && args.learnable_sink.defined()) {
    const int64_t heads[] = {args.learnable_sink.shape[0]};
    dsink = new_empty(q_obj.ptr(), heads, 1, g_torch.float32);
    dsink = contiguous_view(std::move(dsink), heads, 1, fa::DType::kFloat32, &args.dsink);
    args.dsink.device = args.q.device;
  }
  if (!dv.is_valid() || !dsink.is_valid()) {
    // An allocation raised (its error is set), or a given gradient is not one this path reads.
    return PyErr_Occurred() ? allocation_error() : nb::none();
  }
  nb::object error = run_released([&] { return fa::backward(args); });
  if (!error.is_none()) return error;
  return nb::make_tuple(dq, dk, dv, dsink);
}

// ---- workspaces from PyTorch's caching allocator ---------------------------------------------

// torch._C._cuda_cudaCachingAllocator_raw_alloc(size, stream) and _raw_delete(ptr), installed
// through fa::set_workspace_allocator with one of these as the context: each install makes a new
// one and none is ever freed, so a block goes back through the functions that allocated it. The
// library calls these with the GIL released (run_released), so each call takes it back for its
// Python call, keeping any exception already set; only workspaces of at least min_bytes come
// here, whose kernels take milliseconds.
struct TorchAllocator {
  PyObject* raw_alloc;
  PyObject* raw_delete;
};

bool python_usable() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

void* torch_allocate(size_t bytes, void* stream, void* context) {
  if (!python_usable()) return nullptr;
  const auto* t = static_cast<const TorchAllocator*>(context);
  const PyGILState_STATE gil = PyGILState_Ensure();
  PyObject *type, *value, *trace;
  PyErr_Fetch(&type, &value, &trace);
  void* ptr = nullptr;
  PyObject* size = PyLong_FromSize_t(bytes);
  PyObject* handle = PyLong_FromVoidPtr(stream);
  PyObject* r = size && handle ? PyObject_CallFunctionObjArgs(t->raw_alloc, size, handle, nullptr) : nullptr;
  if (r != nullptr) ptr = PyLong_AsVoidPtr(r);
  if (PyErr_Occurred()) ptr = nullptr, PyErr_Clear();  // torch's OOM: the pool gets its turn
  Py_XDECREF(r);
  Py_XDECREF(handle);
  Py_XDECREF(size);
  PyErr_Restore(type, value, trace);
  PyGILState_Release(gil);
  return ptr;
}

void torch_release(void* ptr, void*, void* context) {
  if (!python_usable()) return;  // the process is ending: the block goes with it
  const auto* t = static_cast<const TorchAllocator*>(context);
  const PyGILState_STATE gil = PyGILState_Ensure();
  PyObject *type, *value, *trace;
  PyErr_Fetch(&type, &value, &trace);
  PyObject* handle = PyLong_FromVoidPtr(ptr);
  PyObject* r = handle ? PyObject_CallFunctionObjArgs(t->raw_delete, handle, nullptr) : nullptr;
  if (r == nullptr) PyErr_Clear();
  Py_XDECREF(r);
  Py_XDECREF(handle);
  PyErr_Restore(type, value, trace);
  PyGILState_Release(gil);
}

// raw_alloc and raw_delete (both None: the default pool for every workspace again).
void torch_workspace_allocator(nb::handle raw_alloc, nb::handle raw_delete, size_t min_bytes) {
  fa::WorkspaceAllocator a;
  if (!raw_alloc.is_none() && !raw_delete.is_none()) {
    a.allocate = torch_allocate, a.release = torch_release, a.min_bytes = min_bytes;
    a.context = new TorchAllocator{keep(raw_alloc), keep(raw_delete)};  // never freed (above)
  }
  fa::set_workspace_allocator(a);
}

}  // namespace

void register_torch_path(nb::module_& m) {
  m.def("torch_workspace_allocator", &torch_workspace_allocator, nb::arg("raw_alloc").none(),
        nb::arg("raw_delete").none(), nb::arg("min_bytes"),
        "Sends the library's CUDA workspaces of at least min_bytes to PyTorch's caching allocator "
        "(torch._C._cuda_cudaCachingAllocator_raw_alloc and _raw_delete; flashattn._torch_ops "
        "installs them at import), or, with None, back to the default memory pool.");
  m.def("torch_init", &torch_init, nb::arg("tensor"), nb::arg("parameter"), nb::arg("empty_like"),
        nb::arg("dtypes"), nb::arg("raw_stream").none(), nb::arg("current_device").none(),
        nb::arg("num_threads"), nb::arg("grad_enabled"), nb::arg("busy"),
        "Hands the torch objects of the fast path over (flashattn._torch_ops calls it once at "
        "import): torch.Tensor, torch.nn.Parameter, torch.empty_like, (float32, float16, bfloat16, "
        "int32), torch._C._cuda_getCurrentRawStream and _cuda_getDevice (or None), "
        "torch.get_num_threads, torch.is_grad_enabled and the queries that rule a direct call "
        "out.");
  m.def("torch_forward", &torch_forward, nb::arg("q").none(), nb::arg("k").none(),
        nb::arg("v").none(), nb::arg("cu_seqlens_q").none(), nb::arg("cu_seqlens_k").none(),
        nb::arg("max_seqlen_q").none(), nb::arg("max_seqlen_k").none(),
        nb::arg("alibi_slopes").none(), nb::arg("softmax_scale").none(), nb::arg("causal").none(),
        nb::arg("window_size").none(), nb::arg("softcap").none(), nb::arg("dropout_p").none(),
        nb::arg("seed").none(), nb::arg("learnable_sink").none(), nb::arg("check_cu_seqlens"),
        nb::arg("direct"), nb::arg("block_table").none() = nb::none(),
        "Attention forward on torch tensors, outputs allocated here. Returns None when the call "
        "is not one the fast path takes (the caller then uses forward), (out, lse), "
        "(exception class name, message), or, from a direct call that records an autograd "
        "graph, True (nothing run: flashattn's autograd.Function calls back with direct=False). "
        "block_table: k and v are pages (flashattn::fwd_paged).");
  m.def("torch_forward_kvcache", &torch_forward_kvcache, nb::arg("q").none(),
        nb::arg("k_cache").none(), nb::arg("v_cache").none(), nb::arg("k").none(),
        nb::arg("v").none(), nb::arg("rotary_cos").none(), nb::arg("rotary_sin").none(),
        nb::arg("cache_seqlens").none(), nb::arg("cache_batch_idx").none(),
        nb::arg("cache_leftpad").none(), nb::arg("block_table").none(),
        nb::arg("alibi_slopes").none(), nb::arg("softmax_scale").none(),
        nb::arg("causal").none(), nb::arg("window_size").none(), nb::arg("softcap").none(),
        nb::arg("rotary_interleaved").none(), nb::arg("num_splits").none(),
        nb::arg("learnable_sink").none(), nb::arg("direct"),
        "KV-cache attention on torch tensors (appends into k_cache/v_cache in place), outputs "
        "allocated here. Returns None, (out, lse) or (exception class name, message), as "
        "torch_forward.");
  m.def("torch_backward", &torch_backward, nb::arg("dout").none(), nb::arg("q").none(),
        nb::arg("k").none(), nb::arg("v").none(), nb::arg("out").none(), nb::arg("lse").none(),
        nb::arg("dq").none(), nb::arg("dk").none(), nb::arg("dv").none(),
        nb::arg("cu_seqlens_q").none(), nb::arg("cu_seqlens_k").none(),
        nb::arg("max_seqlen_q").none(), nb::arg("max_seqlen_k").none(),
        nb::arg("alibi_slopes").none(), nb::arg("learnable_sink").none(),
        nb::arg("softmax_scale").none(), nb::arg("causal").none(), nb::arg("window_size").none(),
        nb::arg("softcap").none(), nb::arg("dropout_p").none(), nb::arg("seed").none(),
        nb::arg("deterministic").none(), nb::arg("check_cu_seqlens"), nb::arg("direct"),
        "Attention backward on torch tensors, into the given dq, dk, dv or (None) ones allocated "
        "here. Returns None when the call is not one the fast path takes (the caller then uses "
        "backward), (dq, dk, dv, dsink or None), or (exception class name, message).");
}

}  // namespace flashattn_py
