// The C ABI (flashattn/c_api.h): converts the plain C structs to ForwardArgs / BackwardArgs and
// forwards to the C++ entry points. No exception crosses the C boundary.
#include "flashattn/c_api.h"

#include <cstddef>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include "flashattn/flashattn.h"

namespace flashattn {
namespace {

// The C enums are defined to equal the C++ ones; keep them in lock step.
static_assert(FLASHATTN_DTYPE_FLOAT32 == static_cast<int>(DType::kFloat32));
static_assert(FLASHATTN_DTYPE_FLOAT16 == static_cast<int>(DType::kFloat16));
static_assert(FLASHATTN_DTYPE_BFLOAT16 == static_cast<int>(DType::kBFloat16));
static_assert(FLASHATTN_DTYPE_FLOAT8_E4M3 == static_cast<int>(DType::kFloat8E4M3));
static_assert(FLASHATTN_DTYPE_INT32 == static_cast<int>(DType::kInt32));
static_assert(FLASHATTN_DTYPE_UINT8 == static_cast<int>(DType::kUInt8));
static_assert(FLASHATTN_DEVICE_CPU == static_cast<int>(DeviceType::kCPU));
static_assert(FLASHATTN_DEVICE_CUDA == static_cast<int>(DeviceType::kCUDA));
static_assert(FLASHATTN_OK == static_cast<int>(StatusCode::kOk));
static_assert(FLASHATTN_ERROR_INVALID_ARGUMENT == static_cast<int>(StatusCode::kInvalidArgument));
static_assert(FLASHATTN_ERROR_NOT_SUPPORTED == static_cast<int>(StatusCode::kNotSupported));
static_assert(FLASHATTN_ERROR_CUDA == static_cast<int>(StatusCode::kCudaError));
static_assert(FLASHATTN_ERROR_INTERNAL == static_cast<int>(StatusCode::kInternal));
static_assert(FLASHATTN_MAX_DIMS == TensorView::kMaxDims);
static_assert(std::is_standard_layout_v<flashattn_forward_args> &&
              std::is_trivially_copyable_v<flashattn_forward_args>);
static_assert(std::is_standard_layout_v<flashattn_backward_args> &&
              std::is_trivially_copyable_v<flashattn_backward_args>);

// The smallest struct_size each entry point accepts: the first published layout (everything
// before the learnable-sink fields). Fields appended since are read only when struct_size
// covers them, so callers compiled against an older header get their defaults.
constexpr size_t kForwardArgsMinSize = offsetof(flashattn_forward_args, learnable_sink);
constexpr size_t kBackwardArgsMinSize = offsetof(flashattn_backward_args, learnable_sink);

// Whether a caller's struct of `struct_size` bytes contains the field ending at `end`.
constexpr bool has_field(size_t struct_size, size_t end) { return struct_size >= end; }

thread_local std::string g_last_error;

int fail(StatusCode code, std::string message) {
  g_last_error = std::move(message);
  return static_cast<int>(code);
}

int report(const Status& s) {
  if (s.ok()) return FLASHATTN_OK;
  return fail(s.code(), s.message());
}

// Converts one C tensor; rejects codes that have no C++ enumerator (the C++ side could not
// represent them).
Status to_view(const char* name, const flashattn_tensor& t, TensorView* out) {
  *out = TensorView{};
  if (t.ndim == 0) return Status::Ok();  // not given
  if (t.ndim < 0 || t.ndim > TensorView::kMaxDims) {
    return Status::InvalidArgument(std::string(name) + ".ndim must be in [0, " +
                                   std::to_string(TensorView::kMaxDims) + "], got " +
                                   std::to_string(t.ndim));
  }
  if (t.dtype < FLASHATTN_DTYPE_FLOAT32 || t.dtype > FLASHATTN_DTYPE_UINT8) {
    return Status::InvalidArgument(std::string(name) + ".dtype must be a FLASHATTN_DTYPE_* code " +
                                   "(0..5), got " + std::to_string(t.dtype));
  }
  if (t.device_type != FLASHATTN_DEVICE_CPU && t.device_type != FLASHATTN_DEVICE_CUDA) {
    return Status::InvalidArgument(std::string(name) +
                                   ".device_type must be FLASHATTN_DEVICE_CPU (0) or "
                                   "FLASHATTN_DEVICE_CUDA (1), got " +
                                   std::to_string(t.device_type));
  }
  out->data = t.data;
  out->dtype = static_cast<DType>(t.dtype);
  out->device = Device{static_cast<DeviceType>(t.device_type), t.device_index};
  out->ndim = t.ndim;
  for (int i = 0; i < t.ndim; ++i) {
    out->shape[i] = t.shape[i];
    out->strides[i] = t.strides[i];
  }
  return Status::Ok();
}

// One C tensor to convert: its name (for messages), the C field and the C++ destination.
struct CTensor {
  const char* name;
  const flashattn_tensor& from;
  TensorView& to;
};

// Converts each tensor with to_view; the first failure is returned.
Status to_views(std::initializer_list<CTensor> tensors) {
  for (const CTensor& t : tensors) {
    if (Status s = to_view(t.name, t.from, &t.to); !s.ok()) return s;
  }
  return Status::Ok();
}

// struct_size must be one of the published layouts: the first, one of the later ones (each
// ends where the next version's fields begin) or the current one (the last entry).
Status struct_size_ok(const char* what, size_t given, std::initializer_list<size_t> published) {
  for (size_t size : published) {
    if (given == size) return Status::Ok();
  }
  return Status::InvalidArgument(std::string(what) + ".struct_size must be sizeof(" + what +
                                 ") = " + std::to_string(*(published.end() - 1)) + " (call " +
                                 what + "_init first), got " + std::to_string(given));
}

// The options common to both structs; C is the C struct type.
template <typename C>
Status to_options(const C& a, AttentionOptions* o) {
  o->softmax_scale = a.softmax_scale;
  o->causal = a.causal != 0;
  o->window_left = a.window_left;
  o->window_right = a.window_right;
  o->softcap = a.softcap;
  if (Status s = to_view("alibi_slopes", a.alibi_slopes, &o->alibi_slopes); !s.ok()) return s;
  o->dropout_p = a.dropout_p;
  o->seed = a.seed;
  o->offset = a.offset;
  if (Status s = to_view("cu_seqlens_q", a.cu_seqlens_q, &o->cu_seqlens_q); !s.ok()) return s;
  if (Status s = to_view("cu_seqlens_k", a.cu_seqlens_k, &o->cu_seqlens_k); !s.ok()) return s;
  o->max_seqlen_q = a.max_seqlen_q;
  o->max_seqlen_k = a.max_seqlen_k;
  o->check_cu_seqlens = a.check_cu_seqlens != 0;
  o->stream = a.stream;
  o->num_threads = a.num_threads;
  return Status::Ok();
}

template <typename C>
void init_options(C* a) {
  const AttentionOptions d;
  a->softmax_scale = d.softmax_scale;
  a->causal = d.causal ? 1 : 0;
  a->window_left = d.window_left;
  a->window_right = d.window_right;
  a->softcap = d.softcap;
  a->dropout_p = d.dropout_p;
  a->seed = d.seed;
  a->offset = d.offset;
  a->max_seqlen_q = d.max_seqlen_q;
  a->max_seqlen_k = d.max_seqlen_k;
  a->check_cu_seqlens = d.check_cu_seqlens ? 1 : 0;
  a->num_threads = d.num_threads;
  a->stream = d.stream;
}

// attn_bias, attn_mask, block_mask and the block sizes (the fields appended in 0.3).
template <class CArgs>
Status score_mods_from(const CArgs& c, AttentionOptions* a) {
  if (Status s = to_view("attn_bias", c.attn_bias, &a->attn_bias); !s.ok()) return s;
  if (Status s = to_view("attn_mask", c.attn_mask, &a->attn_mask); !s.ok()) return s;
  if (Status s = to_view("block_mask", c.block_mask, &a->block_mask); !s.ok()) return s;
  a->block_size_q = c.block_size_q;
  a->block_size_k = c.block_size_k;
  return Status::Ok();
}

// The compressed block mask (the fields appended in 0.4).
template <class CArgs>
Status block_lists_from(const CArgs& c, BlockMaskLists* l) {
  return to_views({{"kv_num_blocks", c.kv_num_blocks, l->kv_num_blocks},
                   {"kv_indices", c.kv_indices, l->kv_indices},
                   {"full_kv_num_blocks", c.full_kv_num_blocks, l->full_kv_num_blocks},
                   {"full_kv_indices", c.full_kv_indices, l->full_kv_indices}});
}

// The FP8 descale factors (the fields appended in 0.6).
template <class CArgs>
Status descales_from(const CArgs& c, TensorView* q, TensorView* k, TensorView* v) {
  return to_views({{"q_descale", c.q_descale, *q},
                   {"k_descale", c.k_descale, *k},
                   {"v_descale", c.v_descale, *v}});
}

// Whether a caller's struct of `struct_size` bytes has the 0.6 fields.
template <class CArgs>
constexpr bool has_descales(size_t struct_size) {
  return has_field(struct_size, offsetof(CArgs, v_descale) + sizeof(flashattn_tensor));
}

// Whether a caller's struct of `struct_size` bytes has the 0.4 fields.
template <class CArgs>
constexpr bool has_block_lists(size_t struct_size) {
  return has_field(struct_size, offsetof(CArgs, full_kv_indices) + sizeof(flashattn_tensor));
}

Status run_forward(const flashattn_forward_args* c) {
  if (c == nullptr) return Status::InvalidArgument("args is a null pointer (flashattn_forward)");
  if (Status s = struct_size_ok("flashattn_forward_args", c->struct_size,
                                {kForwardArgsMinSize, offsetof(flashattn_forward_args, attn_bias),
                                 offsetof(flashattn_forward_args, kv_num_blocks),
                                 offsetof(flashattn_forward_args, q_descale),
                                 offsetof(flashattn_forward_args, block_table),
                                 sizeof(flashattn_forward_args)});
      !s.ok()) {
    return s;
  }
  ForwardArgs a;
  if (Status s = to_options(*c, &a); !s.ok()) return s;
  if (Status s = to_views({{"q", c->q, a.q},
                           {"k", c->k, a.k},
                           {"v", c->v, a.v},
                           {"out", c->out, a.out},
                           {"lse", c->lse, a.lse}});
      !s.ok()) {
    return s;
  }
  a.num_splits = c->num_splits;
  if (has_field(c->struct_size, offsetof(flashattn_forward_args, learnable_sink) + sizeof(flashattn_tensor))) {
    if (Status s = to_view("learnable_sink", c->learnable_sink, &a.learnable_sink); !s.ok()) return s;
  }
  if (has_field(c->struct_size, offsetof(flashattn_forward_args, block_size_k) + sizeof(int32_t))) {
    if (Status s = score_mods_from(*c, &a); !s.ok()) return s;
  }
  if (has_block_lists<flashattn_forward_args>(c->struct_size)) {
    if (Status s = block_lists_from(*c, &a.block_mask_lists); !s.ok()) return s;
  }
  if (has_descales<flashattn_forward_args>(c->struct_size)) {
    if (Status s = descales_from(*c, &a.q_descale, &a.k_descale, &a.v_descale); !s.ok()) return s;
  }
  if (has_field(c->struct_size, offsetof(flashattn_forward_args, block_table) + sizeof(flashattn_tensor))) {
    if (Status s = to_view("block_table", c->block_table, &a.block_table); !s.ok()) return s;
  }
  return forward(a);
}

Status run_backward(const flashattn_backward_args* c) {
  if (c == nullptr) return Status::InvalidArgument("args is a null pointer (flashattn_backward)");
  if (Status s = struct_size_ok("flashattn_backward_args", c->struct_size,
                                {kBackwardArgsMinSize, offsetof(flashattn_backward_args, attn_bias),
                                 offsetof(flashattn_backward_args, kv_num_blocks),
                                 sizeof(flashattn_backward_args)});
      !s.ok()) {
    return s;
  }
  BackwardArgs a;
  if (Status s = to_options(*c, &a); !s.ok()) return s;
  if (Status s = to_views({{"q", c->q, a.q},       {"k", c->k, a.k},          {"v", c->v, a.v},
                           {"out", c->out, a.out}, {"dout", c->dout, a.dout}, {"lse", c->lse, a.lse},
                           {"dq", c->dq, a.dq},    {"dk", c->dk, a.dk},       {"dv", c->dv, a.dv}});
      !s.ok()) {
    return s;
  }
  a.deterministic = c->deterministic != 0;
  if (has_field(c->struct_size, offsetof(flashattn_backward_args, dsink) + sizeof(flashattn_tensor))) {
    if (Status s = to_view("learnable_sink", c->learnable_sink, &a.learnable_sink); !s.ok()) return s;
    if (Status s = to_view("dsink", c->dsink, &a.dsink); !s.ok()) return s;
  }
  if (has_field(c->struct_size, offsetof(flashattn_backward_args, dbias) + sizeof(flashattn_tensor))) {
    if (Status s = score_mods_from(*c, &a); !s.ok()) return s;
    if (Status s = to_view("dbias", c->dbias, &a.dbias); !s.ok()) return s;
  }
  if (has_block_lists<flashattn_backward_args>(c->struct_size)) {
    if (Status s = block_lists_from(*c, &a.block_mask_lists); !s.ok()) return s;
  }
  return backward(a);
}

static_assert(std::is_standard_layout_v<flashattn_kvcache_args> &&
              std::is_trivially_copyable_v<flashattn_kvcache_args>);
// The first published layout of flashattn_kvcache_args ends at stream (the sink came in 0.5).
constexpr size_t kKVCacheArgsMinSize = offsetof(flashattn_kvcache_args, learnable_sink);

Status run_forward_kvcache(const flashattn_kvcache_args* c) {
  if (c == nullptr) return Status::InvalidArgument("args is a null pointer (flashattn_forward_kvcache)");
  if (Status s = struct_size_ok("flashattn_kvcache_args", c->struct_size,
                                {kKVCacheArgsMinSize, offsetof(flashattn_kvcache_args, q_descale),
                                 sizeof(flashattn_kvcache_args)});
      !s.ok()) {
    return s;
  }
  KVCacheArgs a;
  if (Status s = to_views({{"q", c->q, a.q},
                           {"k_cache", c->k_cache, a.k_cache},
                           {"v_cache", c->v_cache, a.v_cache},
                           {"k", c->k, a.k},
                           {"v", c->v, a.v},
                           {"rotary_cos", c->rotary_cos, a.rotary_cos},
                           {"rotary_sin", c->rotary_sin, a.rotary_sin},
                           {"cache_seqlens", c->cache_seqlens, a.cache_seqlens},
                           {"cache_batch_idx", c->cache_batch_idx, a.cache_batch_idx},
                           {"cache_leftpad", c->cache_leftpad, a.cache_leftpad},
                           {"block_table", c->block_table, a.block_table},
                           {"out", c->out, a.out},
                           {"lse", c->lse, a.lse},
                           {"alibi_slopes", c->alibi_slopes, a.alibi_slopes}});
      !s.ok()) {
    return s;
  }
  a.rotary_interleaved = c->rotary_interleaved != 0;
  a.softmax_scale = c->softmax_scale;
  a.causal = c->causal != 0;
  a.window_left = c->window_left;
  a.window_right = c->window_right;
  a.softcap = c->softcap;
  a.num_splits = c->num_splits;
  a.num_threads = c->num_threads;
  a.stream = c->stream;
  if (has_field(c->struct_size, offsetof(flashattn_kvcache_args, learnable_sink) + sizeof(flashattn_tensor))) {
    if (Status s = to_view("learnable_sink", c->learnable_sink, &a.learnable_sink); !s.ok()) return s;
  }
  if (has_descales<flashattn_kvcache_args>(c->struct_size)) {
    if (Status s = descales_from(*c, &a.q_descale, &a.k_descale, &a.v_descale); !s.ok()) return s;
  }
  return forward_kvcache(a);
}

// Runs f, turning any escaping exception into an error code.
template <typename F>
int guarded(F&& f) {
  try {
    return report(f());
  } catch (const std::exception& e) {
    return fail(StatusCode::kInternal, std::string("unexpected exception: ") + e.what());
  } catch (...) {
    return fail(StatusCode::kInternal, "unexpected exception");
  }
}

}  // namespace
}  // namespace flashattn

extern "C" {

void flashattn_forward_args_init(flashattn_forward_args* args) {
  if (args == nullptr) return;
  std::memset(args, 0, sizeof(*args));
  args->struct_size = sizeof(*args);
  flashattn::init_options(args);
  args->num_splits = flashattn::ForwardArgs{}.num_splits;
}

void flashattn_backward_args_init(flashattn_backward_args* args) {
  if (args == nullptr) return;
  std::memset(args, 0, sizeof(*args));
  args->struct_size = sizeof(*args);
  flashattn::init_options(args);
  args->deterministic = flashattn::BackwardArgs{}.deterministic ? 1 : 0;
}

int flashattn_forward(const flashattn_forward_args* args) {
  return flashattn::guarded([&] { return flashattn::run_forward(args); });
}

int flashattn_backward(const flashattn_backward_args* args) {
  return flashattn::guarded([&] { return flashattn::run_backward(args); });
}

void flashattn_kvcache_args_init(flashattn_kvcache_args* args) {
  if (args == nullptr) return;
  std::memset(args, 0, sizeof(*args));
  args->struct_size = sizeof(*args);
  const flashattn::KVCacheArgs d;
  args->rotary_interleaved = d.rotary_interleaved ? 1 : 0;
  args->softmax_scale = d.softmax_scale;
  args->causal = d.causal ? 1 : 0;
  args->window_left = d.window_left;
  args->window_right = d.window_right;
  args->softcap = d.softcap;
  args->num_splits = d.num_splits;
  args->num_threads = d.num_threads;
  args->stream = d.stream;
}

int flashattn_forward_kvcache(const flashattn_kvcache_args* args) {
  return flashattn::guarded([&] { return flashattn::run_forward_kvcache(args); });
}

const char* flashattn_last_error(void) { return flashattn::g_last_error.c_str(); }

const char* flashattn_version(void) { return flashattn::version(); }

int flashattn_cuda_available(void) {
  try {
    return flashattn::cuda_available() ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

void flashattn_set_workspace_allocator(flashattn_workspace_allocate_fn allocate,
                                       flashattn_workspace_release_fn release, void* context,
                                       size_t min_bytes) {
  flashattn::WorkspaceAllocator a;
  a.allocate = allocate, a.release = release, a.context = context, a.min_bytes = min_bytes;
  try {
    flashattn::set_workspace_allocator(a);
  } catch (...) {  // a failed lock: the previous allocator stays
  }
}

}  // extern "C"
