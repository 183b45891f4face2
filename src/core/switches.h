// Process-wide switches between two equivalent kernel paths, for tests and dev A/B runs. Each is
// read from its environment variable once, at its first use, and then kept in an atomic: no call
// reads the environment (issue 17: nothing per call beyond the arguments). Tests flip a switch
// in-process with set_switch (the Python tests through _C._set_switch) and put it back after.
#pragma once

namespace flashattn::detail {

enum class Switch {
  // FLASHATTN_SPLIT_COMBINE=kernel: split-KV decode merges its partials with the combine kernel
  // instead of in the last split CTA of each row group (sm80/fwd_launch.h). Same bits either way.
  kSplitCombineKernel,
  // FLASHATTN_SPLIT_COMBINE=counter: on sm90 the decode kernels merge their split-KV partials in
  // the last split CTA of each row group (global counters) instead of within a thread-block
  // cluster of the group's splits (sm80/fwd_launch.h). Same bits either way.
  kSplitCombineCounter,
  // FLASHATTN_DEV_BWD_SINGLE_BUFFER=1: the sm80 backward uses one Q/dO step buffer on any GPU,
  // the variant an A100 takes at head dim >= 64 (sm80/bwd_launch.h).
  kBwdSingleBuffer,
  // FLASHATTN_DEV_FWD_SM80=1: the CUDA forward keeps to the sm80 kernels on a Hopper GPU, as
  // under FLASHATTN_CUDA_PATH=sm80 but for the forward only and switchable in-process, so that a
  // test compares the sm90 forward with the sm80 one in one process (tests/cpp/
  // test_sparse_cuda.cpp, SparseSm90VsSm80).
  kFwdSm80,
  // FLASHATTN_DEV_BWD_SM80=1: the CUDA backward keeps to the sm80 kernels on a Hopper GPU, the
  // backward's kFwdSm80 (tests/cpp/test_sparse_cuda.cpp compares the sm90 block-sparse backward
  // with the sm80 one in one process).
  kBwdSm80,
  // FLASHATTN_DEV_NO_TOKEN_FOLD=1: decode calls of 1-16 query tokens with GQA keep one query
  // head per CTA instead of folding the group's (token, head) pairs into the rows of one KV head
  // (sm80/fwd_dispatch.cu fold_gqa_tokens), so that tests and A/B runs compare the two in one
  // process. It does not turn off fold_gqa_decode (one token, evenly spaced rows).
  kNoTokenFold,
  // FLASHATTN_DEV_NO_DECODE_FOLD=1: one-token calls skip fold_gqa_decode (the group's query heads
  // as evenly spaced rows), so that fold_gqa_tokens takes them: the dev A/B and the test of
  // whether the token fold can replace the one-token fold (same rows, same bits expected).
  kNoDecodeFold,
  // FLASHATTN_DEV_SM90_CACHE=1: KV-cache calls of prefill shape (forward_kvcache, varlen calls
  // with a block table; sm90/fwd.h fwd_cache_declines) run on the sm90 cache kernel instead of
  // the sm80 cache kernels on a Hopper GPU. Off by default until the kernel has run on a GPU
  // (written in s39 without one; dev/NOTES.md "The sm90 cache kernel").
  kSm90Cache,
  // FLASHATTN_DEV_DECODE_SHARE=1: a varlen cache call's sequences of a few tokens (decoding
  // among a chunked prefill's chunks) run in a launch of their own on the sm80 decode tiles, GQA
  // folded, and the rest in a second (cuda_backend.cu run_kvcache decode_share), instead of all
  // in one launch of 128-row tiles. Off by default until it has run on a GPU (written in s41
  // after that session's device time was spent; dev/NOTES.md "Chunked prefill: decodes on
  // their own").
  kDecodeShare,
  kCount,
};

bool switch_on(Switch s);
void set_switch(Switch s, bool on);

// Backward calls the sm90 kernels have run in this process (cuda_backend.cu counts each one that
// launched there), so that a test can assert a call reached them rather than the sm80 fallback.
unsigned long long sm90_backward_calls();
void count_sm90_backward();
// Of those, the calls at head_dim_v != head_dim that ran unpadded on kernels of their own shape
// (192 / 128: cuda_backend.cu, native_head_dim_v_backward), so that a test can tell them from the
// padded call (which counts in sm90_backward_calls alone when it reaches the sm90 kernels).
unsigned long long native_head_dim_v_backward_calls();
void count_native_head_dim_v_backward();
// Forward calls the sm90 kernels have run in this process (cuda_backend.cu counts each 16-bit
// forward that launched there: dense, block-sparse and bias; tests/cpp/test_bias.cpp,
// tests/python/test_bias.py through _C._sm90_forward_calls).
// Decode launches whose split-KV partials were merged within thread-block clusters
// (sm80/fwd_launch.h), so that a test can tell that path ran (tests/cpp/test_special.cpp).
unsigned long long split_cluster_launches();
void count_split_cluster_launch();
// Forward calls whose GQA groups fold_gqa_tokens folded into the decode tiles' rows (1-16 query
// tokens; one token only where fold_gqa_decode declines: a left window, an LSE head stride other
// than 1, varlen calls), so that a test can tell the fold ran (sm80/fwd_dispatch.cu).
unsigned long long token_fold_calls();
void count_token_fold();
// Varlen cache calls whose sequences of a few tokens ran in a launch of their own
// (Switch::kDecodeShare, cuda_backend.cu run_kvcache), so that a test can tell the split ran.
unsigned long long decode_share_calls();
void count_decode_share();
unsigned long long sm90_forward_calls();
void count_sm90_forward();
// Of those, the bias-kernel calls whose attn_mask was packed into bits before the launch
// (sm90/fwd_launch.h, sm90/mask_bits.h: every attn_mask), so that a test can tell that the pack
// ran (tests/cpp/test_bias.cpp, tests/python/test_bias.py through _C._sm90_mask_bits_calls).
unsigned long long sm90_mask_bits_calls();
void count_sm90_mask_bits();
// Of those, the calls on the mask kernel (attn_mask alone, without attn_bias, softcap or ALiBi:
// sm90/fwd_traits.h FwdMaskTraits) rather than the bias kernel (tests as above, through
// _C._sm90_mask_kernel_calls).
unsigned long long sm90_mask_kernel_calls();
void count_sm90_mask_kernel();
// Whether this build instantiated the CUDA kernels of head dim d (FLASHATTN_CUDA_HEAD_DIMS), so
// that a test of one head dim's kernels skips on a trimmed build instead of timing a padded call
// (_C._cuda_head_dim_built). Defined by the CUDA backend (cuda_backend.cu): CUDA builds only.
bool cuda_head_dim_built(int d);
// Whether this build compiled its kernels for sm_90a too (FLASHATTN_CUDA_ARCHITECTURES has 90):
// the Hopper kernels, and the cluster paths of the others. CUDA builds only.
bool cuda_sm90_built();

}  // namespace flashattn::detail
