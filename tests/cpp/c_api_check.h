/* Functions of c_api_check.c (compiled as C99), called from test_c_api.cpp. */
#ifndef FLASHATTN_TESTS_C_API_CHECK_H_
#define FLASHATTN_TESTS_C_API_CHECK_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A dense float32 CPU forward through the C ABI; returns its status code. */
int fa_c_forward_f32(const float* q, const float* k, const float* v, float* out, float* lse,
                     int batch, int seqlen_q, int seqlen_k, int heads, int heads_k, int head_dim,
                     int causal, float softcap);
/* 1 if flashattn_*_args_init set every documented default (over garbage), else 0. */
int fa_c_defaults_ok(void);
/* A forward without q; returns the code and copies flashattn_last_error() into message. */
int fa_c_missing_q(char* message, int capacity);
/* flashattn_backward(NULL); returns the code and copies flashattn_last_error(). */
int fa_c_null_args(char* message, int capacity);
const char* fa_c_version(void);
int fa_c_cuda_available(void);
/* flashattn_set_workspace_allocator with an allocator that never allocates (install), or none. */
void fa_c_set_allocator(int install, size_t min_bytes);

#ifdef __cplusplus
}
#endif

#endif /* FLASHATTN_TESTS_C_API_CHECK_H_ */
