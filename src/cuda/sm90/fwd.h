// The Hopper forward path: which problems it takes, and its dispatch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "core/params.h"
#include "cuda/sm90/mask_bits.h"

namespace flashattn::cuda::sm90 {

// Built when FLASHATTN_CUDA_SM90 is defined (CMake: 90 among the CUDA architectures).
// Why the sm90 forward does not take p (empty when it does). What it leaves to the sm80 kernels
// (docs/SEMANTICS.md): head dims other than 64, 128, 192 and 256; head_dim_v != head_dim except
// 192 / 128, which has its own kernels (cuda_backend.cu tries it unpadded first; every other pair
// it turns into the zero-padded same-d problem, which this path may take); dropout; attn_bias
// with a block mask (a block mask in either form, with attn_mask as its element mask or
// without, runs here on FwdSparseTraits); attn_bias / attn_mask without a block mask other than
// at head dims 64 and 128 with a bias (if any) in q's dtype whose base and strides the copy
// engine takes (16-byte multiples, 0 where it broadcasts): those run here on FwdBiasTraits, a
// float32 bias stays on sm80; attn_mask alone (no softcap or ALiBi) runs here on FwdMaskTraits
// at 64, 128 and 256; requested key splits; and,
// unless `any_runnable` (tests), at most 16 query rows (the sm80 decode shape) and launches
// that the split-KV heuristic would split.
std::string fwd_declines(const ForwardParams& p, bool any_runnable = false);

// Runs p, which fwd_declines accepted, on the sm90 kernels. NotSupported (nothing launched) when
// the copy engine cannot describe an operand.
Status dispatch_fwd(const ForwardParams& p, cudaStream_t stream);

// Defined in fwd_launch.h; each traits is instantiated in its own generated .cu file.
template <typename Traits>
Status run_fwd(const ForwardParams& params, cudaStream_t stream);

// attn_mask packed into bits for the bias kernels, forward and backward (mask_bits.h,
// mask_bits.cu): the bytes of workspace p's mask takes, and the pack into `workspace` (that many
// bytes, 16-byte aligned) on `stream`: one read of the mask's bytes, one write of the bits, no
// host synchronisation (capturable). *out gets the words and their strides. The forward packs
// row-major, the backward group-major (mask_bits.h).
size_t mask_bits_bytes(const QKVParams& p, MaskBitsOrder order = MaskBitsOrder::kRowMajor);
Status build_mask_bits(const QKVParams& p, void* workspace, cudaStream_t stream, MaskBits* out,
                       MaskBitsOrder order = MaskBitsOrder::kRowMajor);

// KV-cache calls (forward_kvcache, varlen calls with a block table: p.kv) of prefill shape on
// the cache kernel (fwd_traits.h FwdCacheTraits: K and V copied from a dense or paged cache by
// the producer warpgroup with cp.async, eight lanes a row, each row looked up once). Why it does
// not take p (empty when it does): not a cache call, a head dim other than 64, 128 and 256 or
// head_dim_v != head_dim, a head dim not built, a float8_e4m3 cache, dropout, bias / masks,
// requested splits, folded rows, fewer than
// kFwdCacheMinQueries query rows in every sequence (decode shapes stay on the sm80 cache
// kernels), a broadcast q, a grid the split heuristic would split. A varlen call's sequences of
// a few tokens (decoding among a chunked-prefill step's chunks) are not its under
// Switch::kDecodeShare: cuda_backend.cu run_kvcache gives them to the sm80 decode tiles in a
// launch of their own and this kernel the rest (ForwardParams::cache_rows_min / _max).
// Not yet the default: cuda_backend.cu takes it only under Switch::kSm90Cache.
std::string fwd_cache_declines(const ForwardParams& p);
Status dispatch_fwd_cache(const ForwardParams& p, cudaStream_t stream);

// The FP8 forward (q, k, v float8 e4m3, out bf16; fwd8_kernel.h). Why it does not take p (empty
// when it does): a head dim other than 64, 128 and 256, head_dim_v != head_dim, a head dim not
// built, dropout, attn_bias / attn_mask / block masks, requested key splits, a broadcast
// operand. No other path runs an e4m3 q on CUDA, so a declined call is NotSupported.
std::string fwd8_declines(const ForwardParams& p);

// Runs p, which fwd8_declines accepted. NotSupported (nothing launched) when the copy engine
// cannot describe an operand. Only built head dims are referenced when called.
Status dispatch_fwd8(const ForwardParams& p, cudaStream_t stream);

// Defined in fwd8_launch.h, instantiated in the generated sm90fwd8_*.cu files.
template <typename Traits>
Status run_fwd8(const ForwardParams& params, cudaStream_t stream);

}  // namespace flashattn::cuda::sm90
