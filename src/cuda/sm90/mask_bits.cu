// The pack of attn_mask into bits for the Hopper bias forward (mask_bits.h): a warp per 1024 keys
// of a mask row, each lane 8 bytes of every 256 keys (two groups), eight ballots build the eight
// words of the two groups.
#include "cuda/sm90/mask_bits.h"

#include <algorithm>

#include "cuda/common/cuda_check.h"
#include "cuda/sm90/fwd.h"

namespace flashattn::cuda::sm90 {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPairKeys = 2 * kMaskBitsGroupKeys;  // 256 keys a step of a warp: 8 bytes a lane
constexpr int kPairsPerWarp = 4;                    // steps per warp task: four loads in flight a lane

// Row `row` of the packed mask (batch, head, row: its own extents, 1 where the mask broadcasts;
// kGroupMajor's padding rows past s.rows get zero words) per warp (grid x, 8 a CTA),
// kPairsPerWarp pairs of groups (1024 keys) per warp task (grid y), so the divisions that find a
// row happen once per task. Lane l reads bytes 8l .. 8l + 7 of each
// 256 keys: chunk l % 16 of group l / 16 of the pair. vec8: the mask's base and strides are
// multiples of 8 bytes, so a lane whose 8 keys lie inside the row reads them in one load;
// otherwise, and for the row's last keys, byte by byte up to seqlen_k (keys past it are 0).
__global__ void __launch_bounds__(kThreads) pack_mask_bits(const MaskBits out, const Broadcast4 m, MaskBitsShape s,
                                                           int seqlen_k, bool vec8) {
  const int lane = threadIdx.x % 32;
  const int64_t rows = s.batch * s.heads * s.rows_stored;
  const int64_t pairs = (s.groups + 1) / 2;
  const int64_t tasks = (pairs + kPairsPerWarp - 1) / kPairsPerWarp;
  for (int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; row < rows; row += int64_t(gridDim.x) * kWarps) {
    const int64_t r = row % s.rows_stored, h = row / s.rows_stored % s.heads, b = row / (s.rows_stored * s.heads);
    const bool padding = r >= s.rows;
    const uint8_t* src = static_cast<const uint8_t*>(m.data) + b * m.batch + h * m.head + r * m.row;
    // (b, h, r index the packed extents: 0 where out's stride is 0.)
    uint32_t* dst = const_cast<uint32_t*>(out.words) + b * out.batch + h * out.head + r * out.row;
    for (int64_t task = blockIdx.y; task < tasks; task += gridDim.y) {
      uint2 bytes[kPairsPerWarp];  // the lane's 8 bytes of each pair (0 past seqlen_k)
#pragma unroll
      for (int p = 0; p < kPairsPerWarp; ++p) {
        const int64_t key0 = (task * kPairsPerWarp + p) * kPairKeys + 8 * lane;
        if (padding) {
          bytes[p] = make_uint2(0u, 0u);
        } else if (vec8 && key0 + 8 <= seqlen_k) {
          bytes[p] = __ldg(reinterpret_cast<const uint2*>(src + key0));
        } else {
          bytes[p] = make_uint2(0u, 0u);
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const uint32_t x = key0 + i < seqlen_k ? uint32_t(__ldg(src + key0 + i)) : 0u;
            (i < 4 ? bytes[p].x : bytes[p].y) |= x << (8 * (i % 4));
          }
        }
      }
#pragma unroll
      for (int p = 0; p < kPairsPerWarp; ++p) {
        uint32_t ballot[8];  // ballot[i] bit l: lane l's byte i is nonzero (its key kept)
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          ballot[i] = __ballot_sync(0xffffffffu, ((i < 4 ? bytes[p].x : bytes[p].y) & (0xffu << (8 * (i % 4)))) != 0u);
        }
        // Lanes 0..7 store the pair's eight words: group 2 pair + lane / 4, word lane % 4 (32
        // contiguous bytes).
        const int half = lane / 4, t = lane % 4;
        const int64_t group = 2 * (task * kPairsPerWarp + p) + half;
        if (lane < 8 && group < s.groups) {
          uint32_t even = ballot[0], odd = ballot[1];
#pragma unroll
          for (int i = 1; i < 4; ++i) {
            if (t == i) even = ballot[2 * i], odd = ballot[2 * i + 1];
          }
          dst[group * out.group + t] = mask_bits_word_of_ballots(even, odd, half);
        }
      }
    }
  }
}

}  // namespace

size_t mask_bits_bytes(const QKVParams& p, MaskBitsOrder order) {
  return size_t(mask_bits_shape(p.mask, p.seqlen_q, p.seqlen_k, order).words()) * sizeof(uint32_t);
}

Status build_mask_bits(const QKVParams& p, void* workspace, cudaStream_t stream, MaskBits* out, MaskBitsOrder order) {
  const MaskBitsShape s = mask_bits_shape(p.mask, p.seqlen_q, p.seqlen_k, order);
  auto* words = static_cast<uint32_t*>(workspace);
  *out = mask_bits_strides(p.mask, s, words);
  const int64_t rows = s.batch * s.heads * s.rows_stored;
  const int64_t tasks = ((s.groups + 1) / 2 + kPairsPerWarp - 1) / kPairsPerWarp;  // per row
  if (rows == 0 || tasks == 0) return Status::Ok();
  // A warp per row and task; the loops stride past what the grid covers.
  const dim3 grid(unsigned(std::min<int64_t>((rows + kWarps - 1) / kWarps, int64_t(1) << 30)),
                  unsigned(std::min<int64_t>(tasks, 65535)));
  const bool vec8 = reinterpret_cast<uintptr_t>(p.mask.data) % 8 == 0 && (p.mask.batch | p.mask.head | p.mask.row) % 8 == 0;
  pack_mask_bits<<<grid, kThreads, 0, stream>>>(*out, p.mask, s, p.seqlen_k, vec8);
  return cuda_status(cudaGetLastError(), "launching the attn_mask bit pack (sm90 bias and mask kernels)");
}

}  // namespace flashattn::cuda::sm90
