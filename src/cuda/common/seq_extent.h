// Where one batch entry's sequences lie, shared by the forward and backward kernels.
#pragma once

#include <climits>
#include <cstdint>

#include "core/host_device.h"
#include "core/params.h"

namespace flashattn::cuda {

// Varlen metadata on the device cannot be checked on the host without a synchronisation
// (docs/SEMANTICS.md "Varlen metadata"), so the kernels clamp what they read: a sequence
// [cu[b], cu[b + 1]) of a packed tensor of `total` rows starts at cu[b] clamped to [0, total]
// and is at most total - start rows and at most max_len (max_seqlen_*: the extent of a varlen
// bias, mask or block mask) long, never negative. Valid metadata (0 <= cu[b] <= cu[b + 1] <=
// total, lengths <= max_seqlen) passes unchanged; bad metadata gives wrong rows but cannot move
// any read or write outside q, k, v, out, lse, the bias / mask extents or the workspaces.
// Checked on the host (tests/cpp/test_seq_extent.cpp).
//
// 32-bit arithmetic throughout (cu_seqlens are int32, so no sequence reaches past row 2^31 - 1;
// a larger tensor only has rows no sequence can name): `total` is rows_limit(total rows).
FLASHATTN_HOST_DEVICE int32_t rows_limit(int64_t total) {
  return total < int64_t(INT32_MAX) ? int32_t(total) : INT32_MAX;
}

#if !defined(FLASHATTN_DEV_NO_VARLEN_CLAMP)
FLASHATTN_HOST_DEVICE int32_t clamp_row0(int32_t begin, int32_t total) {
  return begin < 0 ? 0 : (begin > total ? total : begin);
}

// The length of a sequence that starts at row0 (clamped) and ends at `end` (as read).
FLASHATTN_HOST_DEVICE int32_t clamp_seqlen(int32_t row0, int32_t end, int32_t total, int32_t max_len) {
  if (end <= row0) return 0;  // first, so that end - row0 cannot overflow (row0 >= 0)
  int32_t n = end - row0;
  if (n > total - row0) n = total - row0;
  return n > max_len ? max_len : n;
}

// A key count end - begin (a block table's cu_seqlens_k) in [0, max_len], without overflow.
FLASHATTN_HOST_DEVICE int32_t clamp_count(int32_t begin, int32_t end, int32_t max_len) {
  if (end <= begin) return 0;
  const uint32_t n = uint32_t(end) - uint32_t(begin);  // in [1, 2^32 - 1]
  return n > uint32_t(max_len) ? max_len : int32_t(n);
}
#else
// A/B only (dev/NOTES.md to-do 22): the values as read, as before 2026-12-05 (the clamps cost
// ptxas a few spill slots in some kernels; this measures what that costs). Not memory-safe.
FLASHATTN_HOST_DEVICE int32_t clamp_row0(int32_t begin, int32_t) { return begin; }
FLASHATTN_HOST_DEVICE int32_t clamp_seqlen(int32_t row0, int32_t end, int32_t, int32_t) { return end - row0; }
FLASHATTN_HOST_DEVICE int32_t clamp_count(int32_t begin, int32_t end, int32_t) { return end - begin; }
#endif

// One sequence of a batch entry: where its rows start in the packed tensors (varlen) and its
// lengths. Dense tensors have row offsets 0 and the common lengths.
struct SeqExtent {
  int64_t row0_q = 0, row0_k = 0;
  int seqlen_q = 0, seqlen_k = 0;
};

#if defined(__CUDACC__)
// paged_keys: a varlen call with a block table, whose cu_seqlens_k count each sequence's keys on
// its pages (rows [0, count)); pages may be shared, so the counts may add up to more than k's
// rows: row0_k is 0 and the count is clamped to [0, max_seqlen_k] only (the caller clamps it to
// the block table's capacity).
__device__ __forceinline__ SeqExtent seq_extent(const QKVParams& p, int batch, bool paged_keys = false) {
  SeqExtent e;
  e.seqlen_q = p.seqlen_q;
  e.seqlen_k = p.seqlen_k;
  if (p.is_varlen()) {
    const int32_t total_q = rows_limit(p.total_q);
    const int32_t q0 = clamp_row0(p.cu_seqlens_q[batch], total_q);
    e.row0_q = q0;
    e.seqlen_q = clamp_seqlen(q0, p.cu_seqlens_q[batch + 1], total_q, p.seqlen_q);
    if (paged_keys) {
      e.seqlen_k = clamp_count(p.cu_seqlens_k[batch], p.cu_seqlens_k[batch + 1], p.seqlen_k);
    } else {
      const int32_t total_k = rows_limit(p.total_k);
      const int32_t k0 = clamp_row0(p.cu_seqlens_k[batch], total_k);
      e.row0_k = k0;
      e.seqlen_k = clamp_seqlen(k0, p.cu_seqlens_k[batch + 1], total_k, p.seqlen_k);
    }
  }
  return e;
}

// One forward_kvcache sequence (params.h KVCacheParams), for the cache kernels of both paths
// (sm80/fwd_kernel.h, sm90/fwd_kernel.h kCache): a varlen call with a block table takes its query
// rows from cu_seqlens_q (none where the launch leaves the sequence to another one) and its key
// count from cu_seqlens_k (keys at page rows [0, count), clamped to the capacity); otherwise the
// dense queries attend to the cache rows [first, end) of the sequence: row0_k is the cache row
// of its first key (leftpad), seqlen_k their count.
__device__ __forceinline__ SeqExtent cache_seq_extent(const ForwardParams& p, int batch) {
  SeqExtent e;
  if (p.is_varlen()) {
    e = seq_extent(p, batch, /*paged_keys=*/true);
    e.seqlen_k = p.kv.clamp_rows(e.seqlen_k);
    // A call split between two launches by query rows (ForwardParams::cache_rows_min / _max):
    // the other launch's sequences have none here. Each sequence goes by its rows clamped to
    // q's rows only, the same in both launches, so that it is in exactly one of them whatever
    // max_seqlen_q each has (the decode launch's is cache_rows_max: its grid).
    if (p.cache_rows_min > 0 || p.cache_rows_max < INT32_MAX) {
      const int32_t rows = clamp_seqlen(int32_t(e.row0_q), p.cu_seqlens_q[batch + 1], rows_limit(p.total_q), INT32_MAX);
      if (rows < p.cache_rows_min || rows > p.cache_rows_max) e.seqlen_q = 0;
    }
  } else {
    e.row0_k = p.kv.first(batch);
    e.seqlen_q = p.seqlen_q;
    e.seqlen_k = p.kv.end(batch) - int(e.row0_k);
  }
  return e;
}
#endif

}  // namespace flashattn::cuda
