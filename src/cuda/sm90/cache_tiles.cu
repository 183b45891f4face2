// The list of a varlen cache launch's tiles (cache_tiles.h).
#include "cuda/sm90/cache_tiles.h"

#include "cuda/common/cuda_check.h"
#include "cuda/common/seq_extent.h"

namespace flashattn::cuda::sm90 {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

// One CTA: the sequences in chunks of kThreads, a thread per sequence; a block-wide prefix sum of
// the query blocks places each sequence's pairs after those of the sequences before it (the
// list in sequence order), and the count goes to slot 0 last. Ran on an H100 in s41 (split calls).
__global__ void __launch_bounds__(kThreads) list_cache_tiles(const __grid_constant__ ForwardParams p, int block_m,
                                                             int64_t cap, int2* list) {
  __shared__ long long warp_sums[kWarps];  // 64-bit: ill-formed cu_seqlens may ask for more than 2^31
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  int64_t base = 0;  // pairs of the chunks before this one (the same in every thread)
  for (int b0 = 0; b0 < p.batch; b0 += kThreads) {
    const int b = b0 + tid;
    // The launch's own view of the sequence: none of the other launch's (cache_rows_min / _max).
    const int rows = b < p.batch ? cache_seq_extent(p, b).seqlen_q : 0;
    const long long n = rows / block_m + (rows % block_m != 0);
    long long x = n;  // inclusive prefix sum over the warp, then over the warps' sums
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const long long y = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
      long long s = warp_sums[lane];
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const long long y = __shfl_up_sync(0xffffffffu, s, o);
        if (lane >= o) s += y;
      }
      warp_sums[lane] = s;
    }
    __syncthreads();
    const int64_t first = base + (warp > 0 ? warp_sums[warp - 1] : 0) + x - n;
    // Each sequence's last query blocks first: under a causal mask they see the most keys, and
    // the persistent CTAs take the list in order (heaviest first within a sequence; across
    // sequences the list keeps their order, which the other launches do not).
    for (int64_t m = 0; m < n && first + m < cap; ++m) list[1 + first + m] = make_int2(b, int(n - 1 - m));
    base += warp_sums[kWarps - 1];
    __syncthreads();  // warp_sums is rewritten by the next chunk
  }
  if (tid == 0) list[0] = make_int2(int(base < cap ? base : cap), 0);
}

}  // namespace

Status build_cache_tiles(const ForwardParams& p, int block_m, int64_t cap, void* workspace, cudaStream_t stream) {
  static_assert(kWarps == 32, "one warp scans the warps' sums");
  list_cache_tiles<<<1, kThreads, 0, stream>>>(p, block_m, cap, static_cast<int2*>(workspace));
  return cuda_status(cudaGetLastError(), "launching the sm90 cache kernel's tile list");
}

}  // namespace flashattn::cuda::sm90
