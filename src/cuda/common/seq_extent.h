// Where one batch entry's sequences lie, shared by the forward and backward kernels.
#pragma once

#include <cstdint>

#include "core/params.h"

namespace flashattn::cuda {

// One sequence of a batch entry: where its rows start in the packed tensors (varlen) and its
// lengths. Dense tensors have row offsets 0 and the common lengths.
struct SeqExtent {
  int64_t row0_q = 0, row0_k = 0;
  int seqlen_q = 0, seqlen_k = 0;
};

__device__ __forceinline__ SeqExtent seq_extent(const QKVParams& p, int batch) {
  SeqExtent e;
  e.seqlen_q = p.seqlen_q;
  e.seqlen_k = p.seqlen_k;
  if (p.is_varlen()) {
    e.row0_q = p.cu_seqlens_q[batch];
    e.row0_k = p.cu_seqlens_k[batch];
    e.seqlen_q = p.cu_seqlens_q[batch + 1] - int(e.row0_q);
    e.seqlen_k = p.cu_seqlens_k[batch + 1] - int(e.row0_k);
  }
  return e;
}

}  // namespace flashattn::cuda
