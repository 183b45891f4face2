// forward_kvcache on the CUDA backend, before attention: the new keys and values appended into
// the cache in place (rotary applied to the keys), and the rotary embedding of q.
#pragma once

#include <cuda_runtime.h>

#include "core/params.h"

namespace flashattn::cuda {

// Writes p.kv's new tokens into the cache at cache_len(b) + t (rows at or past the capacity are
// skipped, so a device-side cache_seqlens the host could not check never writes outside the
// cache). With rotary, also writes q rotated at its positions to q_rot, contiguous
// (batch, seqlen_q, heads, head_dim) in q's dtype. Same arithmetic as the CPU backend
// (cpu/kvcache.cpp): in float, each product rounded on its own (no fused multiply-add).
Status kvcache_append(const ForwardParams& p, void* q_rot, cudaStream_t stream);

}  // namespace flashattn::cuda
