/* flashattn C ABI: plain C (C99 and C++), for inference engines and other languages.
 *
 * Mirrors the C++ API of flashattn/flashattn.h one to one: a tensor struct, one args struct per
 * entry point, and functions that return a status code (0 = ok). The semantics, layouts and
 * defaults are those of flashattn::ForwardArgs / flashattn::BackwardArgs.
 *
 * Usage:
 *   flashattn_forward_args a;
 *   flashattn_forward_args_init(&a);          // defaults; sets a.struct_size
 *   a.q = ...; a.k = ...; a.v = ...; a.out = ...;
 *   if (flashattn_forward(&a) != FLASHATTN_OK) fprintf(stderr, "%s\n", flashattn_last_error());
 *
 * ABI evolution: each args struct starts with struct_size, which the caller sets (through the
 * _init function) to sizeof the struct it was compiled against. Fields are only ever appended;
 * a library accepts any struct_size from the first published layout up to its own.
 */
#ifndef FLASHATTN_C_API_H_
#define FLASHATTN_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types (values of flashattn_tensor.dtype); equal to flashattn::DType. */
enum {
  FLASHATTN_DTYPE_FLOAT32 = 0,
  FLASHATTN_DTYPE_FLOAT16 = 1,
  FLASHATTN_DTYPE_BFLOAT16 = 2,
  FLASHATTN_DTYPE_FLOAT8_E4M3 = 3, /* OCP E4M3FN; FP8 forward and FP8 KV cache (cpu backend) */
  FLASHATTN_DTYPE_INT32 = 4,       /* cu_seqlens */
  FLASHATTN_DTYPE_UINT8 = 5        /* boolean masks (bool or uint8 storage) */
};

/* Device types (values of flashattn_tensor.device_type); equal to flashattn::DeviceType. */
enum { FLASHATTN_DEVICE_CPU = 0, FLASHATTN_DEVICE_CUDA = 1 };

/* Status codes returned by every entry point; equal to flashattn::StatusCode. */
enum {
  FLASHATTN_OK = 0,
  FLASHATTN_ERROR_INVALID_ARGUMENT = 1, /* a shape, dtype, stride, pointer or option is wrong */
  FLASHATTN_ERROR_NOT_SUPPORTED = 2,    /* valid, but this backend/build/GPU cannot run it */
  FLASHATTN_ERROR_CUDA = 3,             /* a CUDA runtime call failed */
  FLASHATTN_ERROR_INTERNAL = 4          /* a bug in flashattn */
};

#define FLASHATTN_MAX_DIMS 4

/* A non-owning strided view. Shapes and strides are in elements; the last dimension must have
 * stride 1. ndim == 0 means "not given" (optional arguments). */
typedef struct flashattn_tensor {
  void* data;
  int32_t dtype;        /* FLASHATTN_DTYPE_* */
  int32_t device_type;  /* FLASHATTN_DEVICE_* */
  int32_t device_index; /* CUDA ordinal; ignored for the CPU */
  int32_t ndim;         /* 0..4 */
  int64_t shape[FLASHATTN_MAX_DIMS];
  int64_t strides[FLASHATTN_MAX_DIMS];
} flashattn_tensor;

/* Mirrors flashattn::ForwardArgs (flashattn.h documents every field). Booleans are int (0/1). */
typedef struct flashattn_forward_args {
  size_t struct_size; /* sizeof(flashattn_forward_args); set by flashattn_forward_args_init */

  flashattn_tensor q; /* (batch, seqlen_q, heads, head_dim)     varlen (total_q, heads, head_dim) */
  flashattn_tensor
      k; /* (batch, seqlen_k, heads_k, head_dim)   varlen (total_k, heads_k, head_dim) */
  flashattn_tensor
      v; /* (batch, seqlen_k, heads_k, head_dim_v) varlen (total_k, heads_k, head_dim_v) */
  flashattn_tensor
      out; /* (batch, seqlen_q, heads, head_dim_v)   varlen (total_q, heads, head_dim_v) */
  flashattn_tensor lse; /* optional float32 (batch, heads, seqlen_q), varlen (heads, total_q) */

  float softmax_scale; /* <= 0: 1/sqrt(head_dim) */
  int32_t causal; /* nonzero: window_right is clamped to 0 (causal = window (-1, 0)) */
  int32_t window_left; /* -1 = unbounded */
  int32_t window_right;
  float softcap;                 /* 0 = off */
  flashattn_tensor alibi_slopes; /* optional float32 (heads) or (batch, heads) */
  float dropout_p;
  uint64_t seed;
  uint64_t offset;
  flashattn_tensor cu_seqlens_q; /* optional int32 (batch + 1); both or neither */
  flashattn_tensor cu_seqlens_k;
  int32_t max_seqlen_q;
  int32_t max_seqlen_k;
  int32_t check_cu_seqlens;
  int32_t num_threads; /* CPU workers; 0 = all hardware threads */
  void* stream;        /* cudaStream_t; NULL = legacy default stream */

  int32_t num_splits; /* CUDA split-KV; 0 = heuristic, 1 = never split */

  /* Appended in 0.2 (issue 19): */
  flashattn_tensor learnable_sink; /* optional float32 (heads): sink logits (see flashattn.h) */

  /* Appended in 0.3 (issue 18), see flashattn.h: */
  flashattn_tensor attn_bias;  /* optional float32 or q's dtype, broadcast to (b, h, sq, sk) */
  flashattn_tensor attn_mask;  /* optional uint8, broadcast like attn_bias; nonzero = keep */
  flashattn_tensor block_mask; /* optional uint8 (b|1, h|1, ceil(sq/bsq), ceil(sk/bsk)) */
  int32_t block_size_q;
  int32_t block_size_k;

  /* Appended in 0.4 (issue 18): the compressed block mask (FlexAttention's BlockMask layout;
   * flashattn::BlockMaskLists documents it), instead of block_mask. Optional int32 tensors. */
  flashattn_tensor kv_num_blocks;      /* (b|1, h|1, ceil(sq/bsq)) */
  flashattn_tensor kv_indices;         /* (b|1, h|1, ceil(sq/bsq), width): partial blocks */
  flashattn_tensor full_kv_num_blocks; /* like kv_num_blocks */
  flashattn_tensor full_kv_indices;    /* like kv_indices: full blocks */

  /* Appended in 0.6 (issue 21): FP8 descale factors for float8_e4m3 q, k, v (out bfloat16);
   * optional float32 (batch, heads_k), any strides; see flashattn::ForwardArgs. */
  flashattn_tensor q_descale;
  flashattn_tensor k_descale;
  flashattn_tensor v_descale;

  /* Appended in 0.7 (issue 17): paged K/V in a varlen call (flash_attn_varlen_func's
   * block_table); optional int32 (batch, max_blocks), k and v then (num_blocks, page_size,
   * heads_k, head_dim[_v]); see flashattn::ForwardArgs::block_table. */
  flashattn_tensor block_table;
} flashattn_forward_args;

/* Mirrors flashattn::BackwardArgs. */
typedef struct flashattn_backward_args {
  size_t struct_size; /* sizeof(flashattn_backward_args); set by flashattn_backward_args_init */

  flashattn_tensor q, k, v;
  flashattn_tensor out;  /* the forward's output */
  flashattn_tensor dout; /* like out */
  flashattn_tensor lse;  /* required: the forward's float32 LSE */
  flashattn_tensor dq;   /* like q */
  flashattn_tensor dk;   /* like k (summed over each GQA group) */
  flashattn_tensor dv;   /* like v */

  float softmax_scale;
  int32_t causal; /* nonzero: window_right is clamped to 0 (causal = window (-1, 0)) */
  int32_t window_left;
  int32_t window_right;
  float softcap;
  flashattn_tensor alibi_slopes;
  float dropout_p;
  uint64_t seed;
  uint64_t offset;
  flashattn_tensor cu_seqlens_q;
  flashattn_tensor cu_seqlens_k;
  int32_t max_seqlen_q;
  int32_t max_seqlen_k;
  int32_t check_cu_seqlens;
  int32_t num_threads;
  void* stream;

  int32_t deterministic; /* bitwise reproducible gradients */

  /* Appended in 0.2 (issue 19): */
  flashattn_tensor learnable_sink; /* optional float32 (heads), as in the forward */
  flashattn_tensor dsink;          /* optional float32 (heads) output: its gradient */

  /* Appended in 0.3 (issue 18): as in the forward, and dbias, the optional output with
   * attn_bias's shape (its gradient, summed over broadcast dimensions): float32, or the bias's
   * own dtype when that is float16 / bfloat16 (rounded once from the float32 value). */
  flashattn_tensor attn_bias;
  flashattn_tensor attn_mask;
  flashattn_tensor block_mask;
  int32_t block_size_q;
  int32_t block_size_k;
  flashattn_tensor dbias;

  /* Appended in 0.4 (issue 18): the compressed block mask, as in the forward. */
  flashattn_tensor kv_num_blocks;
  flashattn_tensor kv_indices;
  flashattn_tensor full_kv_num_blocks;
  flashattn_tensor full_kv_indices;
} flashattn_backward_args;

/* Fill *args with the defaults (every tensor "not given", window -1/-1, scale default, ...) and
 * set struct_size. Null is ignored. */
void flashattn_forward_args_init(flashattn_forward_args* args);
void flashattn_backward_args_init(flashattn_backward_args* args);

/* Run attention. Return FLASHATTN_OK or an error code; on error flashattn_last_error() says why. */
int flashattn_forward(const flashattn_forward_args* args);
int flashattn_backward(const flashattn_backward_args* args);

/* The message of the last failing call on this thread ("" if none). Successful calls do not
 * clear it. The pointer stays valid until the next failing call on this thread. */
const char* flashattn_last_error(void);

/* Library version, e.g. "0.1.0". */
const char* flashattn_version(void);

/* 1 if this build has the CUDA backend and a usable GPU, else 0. */
int flashattn_cuda_available(void);

/* flashattn::set_workspace_allocator (flashattn.h says when workspaces are taken and how they are
 * given back). allocate returns `bytes` of device memory for work on `stream` (a cudaStream_t), or
 * NULL for the default pool to serve; release takes a block back in stream order. Workspaces
 * smaller than min_bytes keep coming from the pool. NULL allocate or release: the pool for all. */
typedef void* (*flashattn_workspace_allocate_fn)(size_t bytes, void* stream, void* context);
typedef void (*flashattn_workspace_release_fn)(void* ptr, void* stream, void* context);
void flashattn_set_workspace_allocator(flashattn_workspace_allocate_fn allocate,
                                       flashattn_workspace_release_fn release, void* context,
                                       size_t min_bytes);

/* Mirrors flashattn::KVCacheArgs (flash_attn_with_kvcache; flashattn.h documents every field).
 * Optional tensors have ndim == 0. k_cache/v_cache are written in place when k/v are given. */
typedef struct flashattn_kvcache_args {
  size_t struct_size; /* sizeof(flashattn_kvcache_args); set by flashattn_kvcache_args_init */

  flashattn_tensor q;       /* (batch, seqlen_q, heads, head_dim) */
  flashattn_tensor k_cache; /* (batch_cache, seqlen_cache, heads_k, head_dim) or paged
                               (num_blocks, page_size, heads_k, head_dim) */
  flashattn_tensor v_cache; /* like k_cache, with head_dim_v */
  flashattn_tensor k;       /* optional new tokens (batch, seqlen_new, heads_k, head_dim) */
  flashattn_tensor v;       /* optional (batch, seqlen_new, heads_k, head_dim_v) */
  flashattn_tensor rotary_cos; /* optional (seqlen_ro, rotary_dim / 2), q's dtype */
  flashattn_tensor rotary_sin;
  int32_t rotary_interleaved;      /* 1 (default): pairs (2i, 2i+1); 0: (i, i + rotary_dim/2) */
  flashattn_tensor cache_seqlens;  /* optional int32 (batch) */
  flashattn_tensor cache_batch_idx; /* optional int32 (batch); dense cache only */
  flashattn_tensor cache_leftpad;  /* optional int32 (batch) */
  flashattn_tensor block_table;    /* optional int32 (batch, max_blocks): paged cache */
  flashattn_tensor out;            /* (batch, seqlen_q, heads, head_dim_v) */
  flashattn_tensor lse;            /* optional float32 (batch, heads, seqlen_q) */

  float softmax_scale; /* <= 0: 1/sqrt(head_dim) */
  int32_t causal;
  int32_t window_left; /* -1 = unbounded */
  int32_t window_right;
  float softcap;
  flashattn_tensor alibi_slopes;
  int32_t num_splits;
  int32_t num_threads;
  void* stream;

  /* Appended in 0.5 (issue 19): */
  flashattn_tensor learnable_sink; /* optional float32 (heads): sink logits (see flashattn.h) */

  /* Appended in 0.6 (issue 21): descale factors of an FP8 (float8_e4m3) cache, and of q when
   * q is float8_e4m3 too; optional float32 (batch, heads_k); see flashattn::KVCacheArgs. */
  flashattn_tensor q_descale;
  flashattn_tensor k_descale;
  flashattn_tensor v_descale;
} flashattn_kvcache_args;

void flashattn_kvcache_args_init(flashattn_kvcache_args* args);
/* Append (optional) and attend. Returns FLASHATTN_OK or an error code (flashattn_last_error). */
int flashattn_forward_kvcache(const flashattn_kvcache_args* args);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHATTN_C_API_H_ */
