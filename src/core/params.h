// Validated, resolved parameters handed from src/core to a backend. Built once on the host by
// make_forward_params / make_backward_params (validate.cpp); backends never re-check arguments.
//
// Indexing convention (dense and varlen alike): the row of sequence b at position i is
//   ptr + b * batch_stride + (row_offset(b) + i) * row_stride + head * head_stride
// where row_offset(b) = cu_seqlens[b] in varlen mode and 0 otherwise (batch_stride is then 0).
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "flashattn/types.h"

namespace flashattn {

// Strides of one (batch, seq, head, dim) operand, in elements; the dim stride is 1.
struct Strides3 {
  int64_t batch = 0;
  int64_t row = 0;
  int64_t head = 0;
};

// An operand broadcast over (batch, heads, seqlen_q, seqlen_k) (attn_bias, attn_mask, the
// dbias output) or over (batch, heads, query blocks, key blocks) (block_mask): element
// (b, h, r, c) is at data + b * batch + h * head + r * row + c (elements); a size-1 dimension
// has stride 0. Null data = not given.
struct Broadcast4 {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  int64_t batch = 0;
  int64_t head = 0;
  int64_t row = 0;
  int64_t size[3] = {0, 0, 0};  // sizes of the three leading dimensions (1 = broadcast)
  FLASHATTN_HOST_DEVICE bool defined() const { return data != nullptr; }
};

// One list pair of the compressed block mask (FlexAttention's BlockMask layout): query block r
// of (sequence b, head h) lists the key blocks indices[b, h, r, e] for e < count[b, h, r].
// count (b, h, r) is at count + b * count_batch + h * count_head + r * count_row; indices are a
// Broadcast4 over (batch|1, heads|1, query blocks, width). A size-1 dimension has stride 0.
// Null count = not given.
struct BlockList {
  const int32_t* count = nullptr;
  int64_t count_batch = 0, count_head = 0, count_row = 0;
  Broadcast4 indices;
  int64_t width = 0;
  FLASHATTN_HOST_DEVICE bool defined() const { return count != nullptr; }
  FLASHATTN_HOST_DEVICE int32_t count_at(int64_t b, int64_t h, int64_t r) const {
    return count[b * count_batch + h * count_head + r * count_row];
  }
  // Whether the list differs between sequences (heads): a dimension of size 1 or stride 0
  // holds one list for all.
  FLASHATTN_HOST_DEVICE bool varies_over_batch() const {
    return count_batch != 0 || indices.batch != 0;
  }
  FLASHATTN_HOST_DEVICE bool varies_over_heads() const {
    return count_head != 0 || indices.head != 0;
  }
  FLASHATTN_HOST_DEVICE const int32_t* row_at(int64_t b, int64_t h, int64_t r) const {
    return static_cast<const int32_t*>(indices.data) + b * indices.batch + h * indices.head +
           r * indices.row;
  }
};

// The state of one (query block, key block) pair of a block mask, as backends tabulate either
// form (cpu/block_states.h, cuda/block_tiles.cu). One byte per block.
enum BlockState : uint8_t {
  kBlockAbsent = 0,   // no pair of the block is visible: skipped
  kBlockPartial = 1,  // visible where attn_mask keeps (everywhere without attn_mask)
  kBlockFull = 2,     // visible everywhere; attn_mask is not read
};

// The CUDA forward's plan for a block mask (either form), built on the device by the launcher
// (cuda/block_tiles.h) for the kernel's own tiles of kBlockM x kBlockN; off (states null) for
// calls without one. Planes are (sequence, head) pairs, one per sequence (head) only when the
// block mask differs between them.
struct BlockTilePlan {
  // BlockState of (plane, query block r, key block c) at states[plane * q_blocks * k_blocks +
  // r * k_blocks + c]: the user's blocks of block_size_q x block_size_k.
  const uint8_t* states = nullptr;
  // Per (plane, query tile m): lists[(plane * m_tiles + m) * (n_tiles + 1)] is the number of key
  // tiles to visit, followed by their entries (tile index | kind << kTileKindShift), in
  // descending tile order.
  const int32_t* lists = nullptr;
  int32_t q_blocks = 0, k_blocks = 0, m_tiles = 0, n_tiles = 0;
  bool by_batch = false, by_head = false;
  FLASHATTN_HOST_DEVICE bool on() const { return states != nullptr; }
  FLASHATTN_HOST_DEVICE int64_t plane(int64_t b, int64_t h, int64_t heads) const {
    return (by_batch ? b : 0) * (by_head ? heads : 1) + (by_head ? h : 0);
  }
};

// The CUDA backward's table of tile kinds for one kernel tiling (cuda/block_tiles.h): the
// kind of (plane, query tile m, key tile n) at kinds[(plane * m_tiles + m) * n_tiles + n], a
// TileKind (cuda/common/tile_kind.h) or -1 (no kept block: the step is skipped). Off (null)
// without a block mask.
struct TileKinds {
  const int8_t* kinds = nullptr;
  int32_t m_tiles = 0, n_tiles = 0;
  FLASHATTN_HOST_DEVICE bool on() const { return kinds != nullptr; }
};

// A float32 factor per (sequence b, kv head hk) for an FP8 operand (docs/SEMANTICS.md, "FP8"):
// data[b * batch + hk * head]; a stride of 0 broadcasts. Null data = 1 (no descale).
struct Descale {
  const float* data = nullptr;
  int64_t batch = 0;
  int64_t head = 0;
  FLASHATTN_HOST_DEVICE float at(int64_t b, int64_t hk) const {
    return data == nullptr ? 1.0f : data[b * batch + hk * head];
  }
};

struct QKVParams {
  DType dtype = DType::kFloat16;  // q's dtype
  // k's and v's: dtype, except for an FP8 KV cache read by float16/bfloat16 queries.
  DType kv_dtype = DType::kFloat16;
  // out's (and dout's): dtype, except bfloat16 for float8_e4m3 q.
  DType out_dtype = DType::kFloat16;
  Device device{};

  const void* q = nullptr;  // (batch, seqlen_q, heads, head_dim)
  const void* k = nullptr;  // (batch, seqlen_k, heads_k, head_dim)
  const void* v = nullptr;  // (batch, seqlen_k, heads_k, head_dim_v)
  Strides3 q_strides, k_strides, v_strides;

  int32_t batch = 0;
  int32_t heads = 0;
  int32_t heads_k = 0;
  int32_t head_dim = 0;
  int32_t head_dim_v = 0;
  // Dense: the sequence lengths. Varlen: the largest ones (max_seqlen_*).
  int32_t seqlen_q = 0;
  int32_t seqlen_k = 0;
  int64_t total_q = 0;  // rows of q in varlen mode (= batch * seqlen_q when dense; token rows
                        // under ForwardParams::q_fold, where seqlen_q counts folded rows)
  int64_t total_k = 0;

  // Varlen: int32 (batch + 1), on the tensors' device. Null when dense.
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  FLASHATTN_HOST_DEVICE bool is_varlen() const { return cu_seqlens_q != nullptr; }

  float scale = 0.0f;       // softmax_scale
  float scale_log2 = 0.0f;  // softmax_scale * log2(e) (softcap == 0), used with exp2
  float softcap = 0.0f;     // 0 = off

  // Window around the bottom-right diagonal; -1 = unbounded. Causal is (-1, 0).
  int32_t window_left = -1;
  int32_t window_right = -1;
  bool is_causal = false;  // window == (-1, 0)
  FLASHATTN_HOST_DEVICE bool has_window() const { return window_left >= 0 || window_right >= 0; }

  // ALiBi slopes, float32: slope(b, h) = alibi[b * alibi_batch_stride + h]. Null when off.
  const float* alibi = nullptr;
  int64_t alibi_batch_stride = 0;

  float dropout_p = 0.0f;
  uint32_t dropout_threshold = 0;  // keep iff philox draw >= threshold (see philox.h)
  float dropout_rescale = 1.0f;    // 1 / (1 - p)
  uint64_t seed = 0;
  uint64_t offset = 0;
  FLASHATTN_HOST_DEVICE bool has_dropout() const { return dropout_p > 0.0f; }

  // float32 log-sum-exp: lse[b * lse_batch_stride + h * lse_head_stride + row_offset(b) + i].
  float* lse = nullptr;
  int64_t lse_batch_stride = 0;
  int64_t lse_head_stride = 0;

  void* stream = nullptr;
  int32_t num_threads = 0;

  // Learnable sink logits, float32 (heads), natural log (core/sink.h). Null when off.
  const float* learnable_sink = nullptr;

  // FP8: the scores are scale * q_descale * k_descale * (q . k) and the output is
  // v_descale * (P . v) / rowsum, per (sequence, kv head); all 1 unless an operand is
  // float8_e4m3. With a float8_e4m3 q the probabilities are rounded to e4m3 before P.V
  // (core/fp8.h); an FP8 KV cache read by float16/bfloat16 queries only dequantizes.
  Descale q_descale, k_descale, v_descale;
  FLASHATTN_HOST_DEVICE bool rounds_p_to_fp8() const { return dtype == DType::kFloat8E4M3; }

  // attn_bias (float32 or dtype), attn_mask (uint8), block_mask (uint8 over blocks of
  // block_size_q x block_size_k); see Broadcast4. Varlen: over (max_seqlen_q, max_seqlen_k),
  // indexed by positions inside each sequence.
  Broadcast4 bias, mask, block_mask;
  // The compressed block mask instead of block_mask (never both): partial blocks take attn_mask,
  // full blocks do not read it, unlisted blocks are absent. Values checked on the host for CPU
  // tensors only (docs/SEMANTICS.md).
  BlockList partial_blocks, full_blocks;
  int32_t block_size_q = 0;
  int32_t block_size_k = 0;
  FLASHATTN_HOST_DEVICE bool has_block_lists() const {
    return partial_blocks.defined() || full_blocks.defined();
  }
  // Whether the given lists differ between sequences (heads); otherwise one serves them all.
  FLASHATTN_HOST_DEVICE bool block_lists_vary_over_batch() const {
    return (partial_blocks.defined() && partial_blocks.varies_over_batch()) ||
           (full_blocks.defined() && full_blocks.varies_over_batch());
  }
  FLASHATTN_HOST_DEVICE bool block_lists_vary_over_heads() const {
    return (partial_blocks.defined() && partial_blocks.varies_over_heads()) ||
           (full_blocks.defined() && full_blocks.varies_over_heads());
  }
  FLASHATTN_HOST_DEVICE bool has_score_mods() const {
    return bias.defined() || mask.defined() || block_mask.defined() || has_block_lists();
  }
};

// The KV cache of forward_kvcache, resolved on the host. Off (page_size == 0 and !enabled) for
// plain forward calls. A varlen forward with a block table (ForwardArgs::block_table) is a paged
// cache too, without cache_seqlens, leftpad or an append: its sequences' query rows and key
// counts come from cu_seqlens (QKVParams), the keys being cache rows [0, count) clamped to the
// capacity (cpu/forward.cpp forward_sequence, sm80/fwd_kernel.h). Otherwise sequence b attends
// to the cache rows [leftpad(b), end(b)) of its cache
// (dense: cache row batch_idx[b]; paged: pages block_table[b][row / page_size]), where
// end(b) = cache_len(b) + seqlen_new. The accessors clamp every index into the cache, so a
// device-side value that could not be checked on the host never moves a read or write outside
// it (the result for such a sequence is then unspecified, see docs/SEMANTICS.md).
struct KVCacheParams {
  bool enabled = false;
  const int32_t* cache_seqlens = nullptr;  // (batch); null = every sequence fills the capacity
  const int32_t* leftpad = nullptr;        // (batch); null = 0
  const int32_t* batch_idx = nullptr;      // (batch); null = b (dense cache only)
  const int32_t* block_table = nullptr;    // (batch, max_blocks); null = dense cache
  int64_t block_table_stride = 0;          // elements between two batch rows of block_table
  int32_t page_size = 0;                   // rows per page; 0 = dense cache
  int32_t num_blocks = 0;                  // pages in the paged cache
  int32_t batch_cache = 0;                 // dense: rows of the cache's batch dimension
  int32_t capacity = 0;                    // rows one sequence can hold (seqlen_cache or max_blocks * page_size)

  // Appended tokens (null when none): (batch, seqlen_new, heads_k, head_dim[_v]).
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  Strides3 k_new_strides, v_new_strides;
  int32_t seqlen_new = 0;

  // Rotary tables (seqlen_ro, rotary_dim / 2) in q's dtype; rotary_dim == 0 = off.
  const void* rotary_cos = nullptr;
  const void* rotary_sin = nullptr;
  int64_t rotary_cos_stride = 0;
  int64_t rotary_sin_stride = 0;
  int32_t rotary_dim = 0;
  bool rotary_interleaved = true;
  // Whether query token t sits at cache_len + t (causal or windowed) or at cache_len.
  bool rotary_q_per_token = false;

  FLASHATTN_HOST_DEVICE bool paged() const { return block_table != nullptr; }
  FLASHATTN_HOST_DEVICE int32_t clamp_rows(int64_t x) const {
    return x < 0 ? 0 : (x > capacity ? capacity : static_cast<int32_t>(x));
  }
  // Rows already in the cache before the append (absolute row index, leftpad included).
  FLASHATTN_HOST_DEVICE int32_t cache_len(int b) const {
    return cache_seqlens == nullptr ? capacity : clamp_rows(cache_seqlens[b]);
  }
  // One past the last row attended to (after the append).
  FLASHATTN_HOST_DEVICE int32_t end(int b) const {
    return clamp_rows(static_cast<int64_t>(cache_len(b)) + seqlen_new);
  }
  FLASHATTN_HOST_DEVICE int32_t first(int b) const {
    if (leftpad == nullptr) return 0;
    const int32_t e = end(b), l = leftpad[b];
    return l < 0 ? 0 : (l > e ? e : l);
  }
  // The dense cache's batch row of sequence b.
  FLASHATTN_HOST_DEVICE int32_t cache_batch(int b) const {
    const int32_t cb = batch_idx == nullptr ? b : batch_idx[b];
    return cb < 0 ? 0 : (cb >= batch_cache ? batch_cache - 1 : cb);
  }
  // Element offset (without the head) of absolute cache row `row` (0 <= row < capacity) of
  // sequence b, for a cache with strides s (batch = the page stride when paged). The page
  // arithmetic is 32-bit (rows are below the int32 capacity): a 64-bit division is a long
  // software sequence on the GPU.
  FLASHATTN_HOST_DEVICE int64_t row_offset(const Strides3& s, int b, int64_t row) const {
    if (block_table == nullptr) return cache_batch(b) * s.batch + row * s.row;
    const int32_t r = static_cast<int32_t>(row), block = r / page_size;
    int32_t page = block_table[b * block_table_stride + block];
    page = page < 0 ? 0 : (page >= num_blocks ? num_blocks - 1 : page);
    return page * s.batch + int64_t(r - block * page_size) * s.row;
  }
};

struct ForwardParams : QKVParams {
  void* out = nullptr;  // (batch, seqlen_q, heads, head_dim_v)
  Strides3 out_strides;
  // Requested key/value splits (0 = heuristic). The CUDA backend resolves it to >= 1 and, when
  // > 1, points split_out / split_lse at its workspace:
  //   split_out (num_splits, split_rows(), heads, head_dim_v) f32, normalised per split
  //   split_lse (num_splits, heads, split_rows()) f32
  // where a row's global index is cu_seqlens_q[b] * q_fold + i (varlen) or b * seqlen_q + i
  // (dense); split_rows() = total_q * q_fold (q_fold 1 unless the CUDA backend folded tokens).
  int32_t num_splits = 0;
  float* split_out = nullptr;
  float* split_lse = nullptr;
  // Set by the CUDA backend for the fused split-KV combine of the decode kernels (sm80/fwd_kernel.h
  // merge_if_last_split): one zeroed counter per (batch, head, query block) row group,
  // (batch, heads, m_blocks); the last split CTA of a group merges its partials and sets the
  // counter back to 0. Null: the partials are merged by fwd_combine_kernel, or (no split_out
  // either) within the thread-block cluster of the group's splits (merge_splits_in_cluster).
  uint32_t* split_counters = nullptr;
  // Set by the CUDA backend: causal launches start their CTAs in groups of this many
  // (head, batch[, split]) planes, heaviest blocks first (cuda/common/cta_order.h); 1 = plain order.
  int32_t cta_group_planes = 1;
  // Set by the CUDA backend when it folds a GQA group of query heads into the query rows
  // (decode): row i of head h belongs to query head h * sink_fold + i % sink_fold, whose
  // learnable sink that row uses. 1 = no folding.
  int32_t sink_fold = 1;
  // forward_kvcache only: k/v (and k_strides/v_strides) then describe the cache; see above.
  KVCacheParams kv;
  // Set by the CUDA launcher for calls with a block mask (either form).
  BlockTilePlan block_tiles;
  // (Below: last, so that the fields above keep their offsets in the kernels' parameter space.)
  // Set by the CUDA backend when it folds a GQA group's query tokens (1-16) into the rows of the
  // decode tiles (sm80/fwd_dispatch.cu fold_gqa_tokens): row r of kernel head h (a KV head) is
  // token r / q_fold of query head h * q_fold + r % q_fold, so rows are not evenly spaced in q
  // and out: their offsets are (r / q_fold) * strides.row + (r % q_fold) * the *_fold_head
  // stride below (the query head's own stride; strides.head then steps a whole group), and the
  // LSE's (r % q_fold) * lse_fold_head + r / q_fold. The mask sees tokens (seqlen_q / q_fold of
  // them). 1 = rows are rows (fold_gqa_decode's one-token fold keeps evenly spaced rows and 1).
  // seqlen_q then counts rows (max tokens x q_fold) and total_q still counts q's token rows (the
  // clamps of varlen metadata: common/seq_extent.h); the split-KV workspace holds split_rows().
  int32_t q_fold = 1;
  int64_t q_fold_head = 0, out_fold_head = 0, lse_fold_head = 0;
  // Set by the CUDA backend when it splits a varlen KV-cache call between two launches by each
  // sequence's query rows (a chunked-prefill step among decoding sequences: cuda_backend.cu
  // run_kvcache): a launch attends the sequences of cache_rows_min to cache_rows_max rows only,
  // and the others have no rows in it (cuda/common/seq_extent.h cache_seq_extent). Every
  // sequence by default.
  int32_t cache_rows_min = 0;
  int32_t cache_rows_max = INT32_MAX;
  // Set by the sm90 launcher for a varlen call on its cache kernel (such a launch's share too):
  // the (sequence, query block) pairs it attends, listed on the device (cuda/sm90/cache_tiles.h).
  // Null otherwise.
  const int32_t* cache_tiles = nullptr;

  // Rows of the split-KV partials (num_splits > 1): one per kernel row.
  FLASHATTN_HOST_DEVICE int64_t split_rows() const { return total_q * q_fold; }
};

struct BackwardParams : QKVParams {
  const void* out = nullptr;
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  Strides3 out_strides, dout_strides, dq_strides, dk_strides, dv_strides;
  bool deterministic = false;
  // float32 (heads): the gradient of learnable_sink; null when not requested.
  float* dsink = nullptr;
  // float32, attn_bias's shape: the gradient of attn_bias; data null when not requested.
  Broadcast4 dbias;
};

// Converts/validates public arguments. On error the params are unspecified.
Status make_forward_params(const struct ForwardArgs& args, ForwardParams* params);
Status make_backward_params(const struct BackwardArgs& args, BackwardParams* params);
Status make_kvcache_params(const struct KVCacheArgs& args, ForwardParams* params);

}  // namespace flashattn
