// flashattn: exact, IO-aware attention (FlashAttention) for CPUs and NVIDIA GPUs.
//
// Two entry points, forward() and backward(). Every tensor is passed as a non-owning
// TensorView; outputs are preallocated by the caller. The backend is chosen from the device of
// the tensors (all must be on one device). The full contract is in docs/SEMANTICS.md.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashattn/types.h"

namespace flashattn {

// The compressed form of a block-sparse mask, in FlexAttention's BlockMask layout (so a Flex
// mask converts by handing over its tensors): for query block r of (sequence b, head h), the
// key blocks kv_indices[b, h, r, e] with e < kv_num_blocks[b, h, r] are partial (they take
// attn_mask, when given) and full_kv_indices[b, h, r, e] with e < full_kv_num_blocks[b, h, r]
// are full (attn_mask is not read there); every other key block is absent and skipped (no
// loads, no math). int32, on q's device; the two leading dimensions are full or 1 each; the
// index tensors' last dimension is any width >= the counts (Flex: the number of key blocks),
// contiguous. Either pair may be left out (no partial, or no full blocks), not both. A block
// listed twice, a count outside [0, width] or an index outside [0, ceil(seqlen_k /
// block_size_k)) is an error (checked for CPU tensors; unspecified for device tensors). Blocks
// are block_size_q x block_size_k (AttentionOptions), counted from each sequence's start.
struct BlockMaskLists {
  TensorView kv_num_blocks;       // (batch|1, heads|1, ceil(seqlen_q / block_size_q))
  TensorView kv_indices;          // (batch|1, heads|1, ceil(seqlen_q / block_size_q), width)
  TensorView full_kv_num_blocks;  // like kv_num_blocks
  TensorView full_kv_indices;     // like kv_indices
  bool defined() const {
    return kv_num_blocks.defined() || kv_indices.defined() || full_kv_num_blocks.defined() ||
           full_kv_indices.defined();
  }
};

// Options shared by forward and backward. They must be identical in the two calls of one
// training step (the backward recomputes P from them).
struct AttentionOptions {
  // Scores are s = softmax_scale * q.k. A value <= 0 (the default) means 1/sqrt(head_dim).
  float softmax_scale = 0.0f;
  // Bottom-right aligned causal mask; equivalent to window (-1, 0). With a window it clamps
  // window_right to 0, as flash_attn does: causal + (left, right) is the window (left, 0).
  bool causal = false;
  // Sliding window (left, right) around the bottom-right diagonal; -1 means unbounded.
  int32_t window_left = -1;
  int32_t window_right = -1;
  // softcap > 0: s = softcap * tanh(s / softcap), applied after scaling.
  float softcap = 0.0f;
  // float32 (heads) or (batch, heads); s += -slope * |i + seqlen_k - seqlen_q - j|. Optional.
  TensorView alibi_slopes;
  // Dropout probability on P; the keep mask is Philox4x32-10 keyed by (seed, offset).
  float dropout_p = 0.0f;
  uint64_t seed = 0;
  uint64_t offset = 0;
  // Varlen: int32 (batch + 1) prefix sums of sequence lengths. Both given or neither.
  TensorView cu_seqlens_q;
  TensorView cu_seqlens_k;
  // With varlen: the largest sequence lengths (used to size grids); 0 = read from cu_seqlens
  // on the CPU, required (> 0) for CUDA tensors, where cu_seqlens live on the device.
  int32_t max_seqlen_q = 0;
  int32_t max_seqlen_k = 0;
  // Check that cu_seqlens start at 0, are non-decreasing, end within the rows of q / k and
  // hold no sequence longer than max_seqlen_q / max_seqlen_k (reads device memory synchronously
  // for CUDA tensors). Always done on the CPU, where the values are host memory anyway.
  bool check_cu_seqlens = false;
  // CUDA stream (cudaStream_t) to run on; nullptr = the legacy default stream.
  void* stream = nullptr;
  // CPU backend: worker threads; 0 = all hardware threads (or FLASHATTN_NUM_THREADS).
  int32_t num_threads = 0;
  // Learnable attention sink: float32 (heads), one logit per query head (natural-log units; not
  // scaled, softcapped or biased) that joins each row's softmax denominator with no value row;
  // the LSE includes it. Optional. See docs/SEMANTICS.md.
  TensorView learnable_sink;
  // Additive bias on the scores (after softcap, before ALiBi and the mask; docs/SEMANTICS.md):
  // float32 or q's dtype, broadcastable to (batch, heads, seqlen_q, seqlen_k): each leading
  // dimension is full or 1 (a full one may have stride 0), the last is seqlen_k, contiguous.
  // Varlen: (batch|1, heads|1, max_seqlen_q|1, max_seqlen_k), element (b, h, i, j) for query i
  // and key j of sequence b (positions inside the sequence, as a padded batch would hold them).
  // The CPU backend only for now. Optional.
  TensorView attn_bias;
  // Boolean mask, uint8 (bool storage; nonzero = keep), broadcast like attn_bias: the bias's
  // -inf case (a hidden score gets no gradient). With block_mask_lists it applies to the
  // partial blocks only. Optional.
  TensorView attn_mask;
  // Block-sparse mask, uint8 (batch|1, heads|1, ceil(seqlen_q / block_size_q),
  // ceil(seqlen_k / block_size_k)) (varlen: of max_seqlen_q/k, blocks counted from each
  // sequence's start): query block r sees key block c iff block_mask[.., r, c] != 0.
  // Absent blocks are skipped (no loads, no math); kept blocks combine with attn_mask.
  // block_size_q/k (>= 1) are required with it. The CPU backend only for now.
  TensorView block_mask;
  // The same mask in compressed form (see BlockMaskLists), instead of block_mask.
  BlockMaskLists block_mask_lists;
  int32_t block_size_q = 0;
  int32_t block_size_k = 0;
};

struct ForwardArgs : AttentionOptions {
  TensorView q;    // (batch, seqlen_q, heads, head_dim)     varlen: (total_q, heads, head_dim)
  TensorView k;    // (batch, seqlen_k, heads_k, head_dim)   varlen: (total_k, heads_k, head_dim)
  TensorView v;    // (batch, seqlen_k, heads_k, head_dim_v) varlen: (total_k, heads_k, head_dim_v)
  // q's dtype, bfloat16 when q is float8_e4m3.
  TensorView out;  // (batch, seqlen_q, heads, head_dim_v)   varlen: (total_q, heads, head_dim_v)
  // Optional float32 log-sum-exp (natural log): (batch, heads, seqlen_q), varlen (heads, total_q).
  TensorView lse;
  // CUDA: number of key/value splits (flash-decoding); 0 = heuristic, 1 = never split.
  int32_t num_splits = 0;
  // FP8 (q, k, v float8_e4m3; out bfloat16): optional float32 descale factors, each
  // (batch, heads_k) with any strides (0 broadcasts one factor), as FlashAttention-3 takes them.
  // The values q, k, v stand for are q * q_descale[b, h / (heads / heads_k)], k * k_descale[b,
  // hk], v * v_descale[b, hk]; not given = 1. Only with float8_e4m3 operands. Forward only.
  // docs/SEMANTICS.md, "FP8", defines the arithmetic (P is rounded to e4m3 before P.V).
  TensorView q_descale;
  TensorView k_descale;
  TensorView v_descale;
  // Paged K/V for a varlen call (flash_attn 2.x's flash_attn_varlen_func(block_table=...); the
  // chunked prefill of vLLM-style engines): int32 (batch, max_blocks). With it k and v are pages
  // (num_blocks, page_size, heads_k, head_dim[_v]), any page_size >= 1, and sequence b's keys are
  // the positions 0 .. cu_seqlens_k[b + 1] - cu_seqlens_k[b] - 1 of its pages: position t is row
  // t % page_size of page block_table[b][t / page_size]. cu_seqlens_k then only counts keys (a
  // page may serve several sequences, so the sum may exceed the pages' rows). Needs cu_seqlens;
  // forward only; no dropout, attn_bias, attn_mask or block mask. k and v may be float8_e4m3
  // under float16 / bfloat16 q (an FP8 cache, k_descale / v_descale as in KVCacheArgs). Runs the
  // KV-cache kernels (docs/SEMANTICS.md, "KV cache"). Optional.
  TensorView block_table;
};

struct BackwardArgs : AttentionOptions {
  TensorView q, k, v, out;  // as in ForwardArgs; out is the forward output
  TensorView dout;          // like out
  TensorView lse;           // required: the forward's LSE
  TensorView dq;            // like q
  TensorView dk;            // like k (summed over the query heads of each GQA group)
  TensorView dv;            // like v
  // Bitwise reproducible gradients run to run (fixed reduction order).
  bool deterministic = false;
  // Optional float32 (heads) output: the gradient of learnable_sink (requires learnable_sink).
  // Its reduction order is fixed, so it is reproducible whatever `deterministic` says.
  TensorView dsink;
  // Optional output with attn_bias's shape: the gradient of attn_bias, summed over its broadcast
  // (size-1) dimensions in a fixed order (reproducible). float32, or attn_bias's dtype when that
  // is 16-bit (the float32 value rounded once: the bits of a cast). Requires attn_bias.
  TensorView dbias;
};

Status forward(const ForwardArgs& args);
Status backward(const BackwardArgs& args);

// The checks of check_cu_seqlens on their own, without attention: cu_seqlens_q/k (int32
// (batch + 1), on the CPU or a CUDA device, read synchronously on `stream` there) start at 0,
// never decrease, end within total_q / total_k rows, and (where max_seqlen_* > 0) hold no
// sequence longer than max_seqlen_*. For callers that hold the values on the host while the
// attention tensors are on a GPU: checking them there costs no device synchronisation.
Status check_varlen_metadata(const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                             int64_t total_q, int64_t total_k, int32_t max_seqlen_q,
                             int32_t max_seqlen_k, void* stream = nullptr);

// The value checks of ForwardArgs::block_table on their own, without attention: every sequence's
// key count (cu_seqlens_k[b + 1] - cu_seqlens_k[b], int32 (batch + 1)) fits in its row of
// block_table (int32 (batch, max_blocks): max_blocks * page_size keys; none when num_blocks is
// 0) and the entries that cover its keys are pages in [0, num_blocks). Both on the CPU or a CUDA
// device (read synchronously on `stream` there). A forward with CPU tensors runs them itself;
// for callers that hold the table on the host while the pages are on a GPU they cost no
// device synchronisation.
Status check_paged_metadata(const TensorView& block_table, const TensorView& cu_seqlens_k, int64_t num_blocks,
                            int64_t page_size, void* stream = nullptr);

// Whether this build has the CUDA backend and at least one usable GPU.
bool cuda_available();

// Library version string, e.g. "0.1.0".
const char* version();

// Where the CUDA backend takes its larger scratch memory from. Every call that needs a workspace
// (the backward's float32 dQ accumulator and dbias partials, split-KV partials, block-sparse
// plans) takes it for the call's duration, by default with cudaMallocAsync on the call's stream
// from the device's default memory pool. That pool keeps 1 GiB between calls (the library raises
// its release threshold from 0 once, if the application left it there) and maps anything beyond
// afresh on each call: about 1 ms per GB on an H200, as long as the kernels for a dbias over a
// broadcast batch. An application with a caching allocator of its own can take the workspaces of
// at least `min_bytes` instead; flashattn's Python package installs PyTorch's at import, so that
// they count in torch.cuda.memory_allocated and torch.cuda.empty_cache returns them. While the
// call's stream is being captured into a CUDA graph the pool serves every workspace (its
// allocation becomes a memory node the graph owns; a block handed back to the application's
// allocator when the call returns would be reused while replays still write it).
struct WorkspaceAllocator {
  // `bytes` of device memory on the current CUDA device, 256-byte aligned, for work queued on
  // `stream` (a cudaStream_t) from now on; nullptr when it cannot (the pool then serves the call;
  // a misaligned block is given back and the pool serves too).
  void* (*allocate)(size_t bytes, void* stream, void* context) = nullptr;
  // Takes back `ptr` (from allocate) once the work queued on `stream` so far is done, as
  // cudaFreeAsync does; an allocator that reuses a block only for later work on the same stream
  // (PyTorch's) may take it back at once. Called by the thread that finishes the call.
  void (*release)(void* ptr, void* stream, void* context) = nullptr;
  void* context = nullptr;
  size_t min_bytes = size_t(256) << 20;  // smaller workspaces keep coming from the pool
};

// Installs `allocator` for every device and returns the one it replaces. One without allocate or
// release (the default) sends every workspace to the pool again. A block is always given back to
// the allocator that handed it out, also after a change, so an allocator's functions and context
// must outlive the calls that may still be using it (calls running when it is replaced, and their
// blocks). Thread-safe.
WorkspaceAllocator set_workspace_allocator(const WorkspaceAllocator& allocator);

// Attention against a KV cache (flash_attn's flash_attn_with_kvcache): optionally appends new
// keys/values into the cache in place at each sequence's cache length, applies rotary
// embeddings to q and the new keys at their cache positions, then attends q to the cache.
// Forward only. The contract (positions, masks, paging, what is checked where) is in
// docs/SEMANTICS.md, "KV cache".
struct KVCacheArgs {
  TensorView q;  // (batch, seqlen_q, heads, head_dim)
  // Dense: (batch_cache, seqlen_cache, heads_k, head_dim[_v]). Paged (block_table given):
  // (num_blocks, page_size, heads_k, head_dim[_v]), any page_size >= 1. Written in place when
  // k/v are given.
  TensorView k_cache;
  TensorView v_cache;
  // Optional new tokens, appended at rows cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1
  // before attending: (batch, seqlen_new, heads_k, head_dim[_v]). Both or neither; they need
  // cache_seqlens.
  TensorView k;
  TensorView v;
  // Optional rotary tables (seqlen_ro, rotary_dim / 2), q's dtype; rotary_dim <= head_dim, even;
  // seqlen_ro >= the cache capacity. Need k/v. Token t of sequence b sits at position
  // cache_seqlens[b] + t (q: the same position for every token unless causal or windowed).
  TensorView rotary_cos;
  TensorView rotary_sin;
  // true: rotate pairs (0, 1), (2, 3), ... (GPT-J); false: pairs (i, i + rotary_dim / 2) (NeoX).
  bool rotary_interleaved = true;
  // int32 (batch): tokens already in each sequence's cache (absolute row index, leftpad
  // included). Not given: every sequence fills the whole cache.
  TensorView cache_seqlens;
  // int32 (batch): cache row (dense cache) of each sequence; default b. Not with block_table.
  TensorView cache_batch_idx;
  // int32 (batch): first valid cache row of each sequence (left padding); default 0.
  TensorView cache_leftpad;
  // int32 (batch, max_blocks): page of each sequence's block of page_size rows.
  TensorView block_table;

  TensorView out;  // (batch, seqlen_q, heads, head_dim_v); q's dtype (bfloat16 for a float8 q)
  TensorView lse;  // optional float32 (batch, heads, seqlen_q), natural log

  float softmax_scale = 0.0f;  // <= 0: 1/sqrt(head_dim)
  bool causal = false;         // bottom-right aligned over each sequence's keys
  int32_t window_left = -1;
  int32_t window_right = -1;
  float softcap = 0.0f;
  TensorView alibi_slopes;  // optional float32 (heads) or (batch, heads)
  int32_t num_splits = 0;   // CUDA split-KV: 0 = heuristic (from shapes only), 1 = never
  void* stream = nullptr;   // cudaStream_t
  int32_t num_threads = 0;  // CPU workers; 0 = all
  // Optional float32 (heads), on q's device: learnable sink logits, as in AttentionOptions
  // (checked the same way); the LSE includes them, and a sequence with no key to attend to
  // gets out 0 and LSE = sink.
  TensorView learnable_sink;
  // FP8 KV cache (docs/SEMANTICS.md, "FP8 KV cache"): k_cache/v_cache in float8_e4m3 with q
  // (and the new k/v) in float16 or bfloat16; the cache holds k / k_descale and v / v_descale,
  // and the new tokens are quantized into it with the same factors. Or q, the cache and the new
  // k/v all in float8_e4m3: the FP8 forward against the cache (out bfloat16). Optional float32
  // (batch, heads_k), any strides; not given = 1. q_descale only with a float8_e4m3 q.
  TensorView q_descale;
  TensorView k_descale;
  TensorView v_descale;
};

Status forward_kvcache(const KVCacheArgs& args);

}  // namespace flashattn
