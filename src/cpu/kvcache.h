// CPU side of forward_kvcache before attention: the append of the new keys/values into the
// cache (rotary applied to the keys) and the rotary embedding of q into a private buffer.
#pragma once

#include <cstdint>
#include <vector>

#include "core/params.h"

namespace flashattn::cpu {

// Writes params.kv's new tokens into the cache (in place); rows at or past the capacity are
// skipped. With rotary, fills q_rot with q rotated at its positions (q's dtype, contiguous
// (batch, seqlen_q, heads, head_dim)) and points attend->q at it; attend is otherwise params.
void kvcache_prepare(const ForwardParams& params, std::vector<unsigned char>* q_rot,
                     ForwardParams* attend);

}  // namespace flashattn::cpu
