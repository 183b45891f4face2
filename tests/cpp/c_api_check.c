/* The C side of the C ABI test: compiled as strict C99, so any C++-ism in flashattn/c_api.h
 * breaks the build. test_c_api.cpp calls these functions and checks their results against the
 * fp64 reference. */
#include "c_api_check.h"

#include <stdio.h>
#include <string.h>

#include "flashattn/c_api.h"

static void contiguous(flashattn_tensor* t, void* data, int32_t dtype, int ndim,
                       const int64_t* shape) {
  int i;
  int64_t stride = 1;
  memset(t, 0, sizeof(*t));
  t->data = data;
  t->dtype = dtype;
  t->device_type = FLASHATTN_DEVICE_CPU;
  t->device_index = 0;
  t->ndim = ndim;
  for (i = ndim - 1; i >= 0; --i) {
    t->shape[i] = shape[i];
    t->strides[i] = stride;
    stride *= shape[i];
  }
}

int fa_c_forward_f32(const float* q, const float* k, const float* v, float* out, float* lse,
                     int batch, int seqlen_q, int seqlen_k, int heads, int heads_k, int head_dim,
                     int causal, float softcap) {
  flashattn_forward_args a;
  const int64_t qs[4] = {batch, seqlen_q, heads, head_dim};
  const int64_t ks[4] = {batch, seqlen_k, heads_k, head_dim};
  const int64_t ls[3] = {batch, heads, seqlen_q};
  flashattn_forward_args_init(&a);
  contiguous(&a.q, (void*)q, FLASHATTN_DTYPE_FLOAT32, 4, qs);
  contiguous(&a.k, (void*)k, FLASHATTN_DTYPE_FLOAT32, 4, ks);
  contiguous(&a.v, (void*)v, FLASHATTN_DTYPE_FLOAT32, 4, ks);
  contiguous(&a.out, out, FLASHATTN_DTYPE_FLOAT32, 4, qs);
  contiguous(&a.lse, lse, FLASHATTN_DTYPE_FLOAT32, 3, ls);
  a.causal = causal;
  a.softcap = softcap;
  return flashattn_forward(&a);
}

int fa_c_defaults_ok(void) {
  flashattn_forward_args f;
  flashattn_backward_args b;
  flashattn_kvcache_args c;
  int kvcache_ok;
  memset(&f, 0x5a, sizeof(f));
  memset(&b, 0x5a, sizeof(b));
  memset(&c, 0x5a, sizeof(c));
  flashattn_forward_args_init(&f);
  flashattn_backward_args_init(&b);
  flashattn_kvcache_args_init(&c);
  kvcache_ok = c.struct_size == sizeof(c) && c.q.ndim == 0 && c.k.ndim == 0 &&
               c.rotary_cos.ndim == 0 && c.cache_seqlens.ndim == 0 && c.block_table.ndim == 0 &&
               c.lse.ndim == 0 && c.alibi_slopes.ndim == 0 && c.rotary_interleaved == 1 &&
               c.softmax_scale == 0.0f && c.causal == 0 && c.window_left == -1 &&
               c.window_right == -1 && c.softcap == 0.0f && c.num_splits == 0 &&
               c.num_threads == 0 && c.stream == NULL && c.learnable_sink.ndim == 0;
  return kvcache_ok && f.struct_size == sizeof(f) && b.struct_size == sizeof(b) && f.window_left == -1 &&
         f.window_right == -1 && b.window_left == -1 && b.window_right == -1 && f.causal == 0 &&
         f.softmax_scale == 0.0f && f.softcap == 0.0f && f.dropout_p == 0.0f && f.q.ndim == 0 &&
         f.lse.ndim == 0 && f.alibi_slopes.ndim == 0 && f.cu_seqlens_q.ndim == 0 &&
         f.stream == NULL && f.num_threads == 0 && f.num_splits == 0 && b.deterministic == 0 &&
         b.dq.ndim == 0 && f.learnable_sink.ndim == 0 && b.learnable_sink.ndim == 0 &&
         b.dsink.ndim == 0 && f.attn_bias.ndim == 0 && f.attn_mask.ndim == 0 &&
         f.block_mask.ndim == 0 && f.block_size_q == 0 && f.block_size_k == 0 &&
         b.attn_bias.ndim == 0 && b.dbias.ndim == 0 && b.block_size_k == 0 &&
         f.kv_num_blocks.ndim == 0 && f.kv_indices.ndim == 0 && f.full_kv_num_blocks.ndim == 0 &&
         f.full_kv_indices.ndim == 0 && b.kv_num_blocks.ndim == 0 && b.full_kv_indices.ndim == 0;
}

int fa_c_missing_q(char* message, int capacity) {
  flashattn_forward_args a;
  int code;
  float x[8] = {0};
  const int64_t s[4] = {1, 2, 1, 4};
  flashattn_forward_args_init(&a);
  contiguous(&a.k, x, FLASHATTN_DTYPE_FLOAT32, 4, s);
  contiguous(&a.v, x, FLASHATTN_DTYPE_FLOAT32, 4, s);
  contiguous(&a.out, x, FLASHATTN_DTYPE_FLOAT32, 4, s);
  code = flashattn_forward(&a);
  snprintf(message, (size_t)capacity, "%s", flashattn_last_error());
  return code;
}

int fa_c_null_args(char* message, int capacity) {
  int code = flashattn_backward(NULL);
  snprintf(message, (size_t)capacity, "%s", flashattn_last_error());
  return code;
}

const char* fa_c_version(void) { return flashattn_version(); }

int fa_c_cuda_available(void) { return flashattn_cuda_available(); }

static void* fa_c_no_allocate(size_t bytes, void* stream, void* context) {
  (void)bytes, (void)stream, (void)context;
  return NULL;
}
static void fa_c_no_release(void* ptr, void* stream, void* context) { (void)ptr, (void)stream, (void)context; }

void fa_c_set_allocator(int install, size_t min_bytes) {
  if (install) {
    flashattn_set_workspace_allocator(fa_c_no_allocate, fa_c_no_release, NULL, min_bytes);
  } else {
    flashattn_set_workspace_allocator(NULL, NULL, NULL, 0);
  }
}
