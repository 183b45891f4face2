// The tiles of a varlen call on the sm90 cache kernel (all its sequences, or its share of a split
// call, ForwardParams::cache_rows_min > 0: under Switch::kDecodeShare a varlen batch's sequences
// of a few tokens run on the sm80 decode tiles and the rest here; cuda_backend.cu run_kvcache).
// The persistent
// grid would otherwise walk every (query block, head, sequence) of the batch and find nearly all
// of them empty, each after an L2 round trip for its sequence's extent: with a 2k chunk among
// 200 one-row sequences at 32 heads, ~103k tiles, ~780 per CTA, for ~4 real ones each (review,
// s40). So a small kernel lists the (sequence, query block) pairs of the sequences the launch
// takes, on the device and in stream order (no host synchronisation: capturable), and the
// kernel's plane i is pair i (fwd_kernel.h tile_work), with the pairs past the list's count empty.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/params.h"
#include "cuda/sm90/fwd_tile.h"  // cache_tile_cap, cache_tiles_bytes
#include "flashattn/types.h"

namespace flashattn::cuda::sm90 {

// Writes the list of p's sequences (p.cache_rows_min / _max, as cache_seq_extent reads them) into
// `workspace` (cache_tiles_bytes(cap) bytes) on `stream`.
Status build_cache_tiles(const ForwardParams& p, int block_m, int64_t cap, void* workspace, cudaStream_t stream);

}  // namespace flashattn::cuda::sm90
