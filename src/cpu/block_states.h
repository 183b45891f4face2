// The block-sparse mask of one call as a table of block states, built once per call from
// either form the API takes: the dense block_mask (every kept block is partial: attn_mask
// applies to it) or the compressed lists (FlexAttention's layout; listed blocks are partial or
// full, a full block does not read attn_mask). The tiled loops then look a block up in O(1)
// whatever the form; the table has the size of the dense form,
// (batch|1, heads|1, query blocks, key blocks) bytes, and is no larger than the lists.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/params.h"

namespace flashattn::cpu {

// BlockState (kBlockAbsent, kBlockPartial, kBlockFull): core/params.h, shared with the CUDA
// backend's table (cuda/block_tiles.cu).

class BlockStates {
 public:
  explicit BlockStates(const QKVParams& p) {
    if (!p.block_mask.defined() && !p.has_block_lists()) return;
    on_ = true;
    q_blocks_ = (p.seqlen_q + p.block_size_q - 1) / p.block_size_q;
    k_blocks_ = (p.seqlen_k + p.block_size_k - 1) / p.block_size_k;
    if (p.block_mask.defined()) {
      from_dense(p);
    } else {
      from_lists(p);
    }
  }

  // Whether the call has a block mask in either form.
  bool on() const { return on_; }
  // (query blocks, key blocks) states of (sequence b, head h); element (r, c) at r * cols() + c.
  const uint8_t* plane(int64_t b, int64_t h) const {
    return table_.data() + (by_batch_ ? b : 0) * batch_stride_ + (by_head_ ? h : 0) * head_stride_;
  }
  int64_t cols() const { return k_blocks_; }

 private:
  void allocate(const QKVParams& p, bool by_batch, bool by_head) {
    by_batch_ = by_batch;
    by_head_ = by_head;
    head_stride_ = q_blocks_ * k_blocks_;
    batch_stride_ = (by_head ? p.heads : 1) * head_stride_;
    table_.assign(static_cast<size_t>((by_batch ? p.batch : 1) * batch_stride_), kBlockAbsent);
  }

  void from_dense(const QKVParams& p) {
    const Broadcast4& m = p.block_mask;
    allocate(p, m.size[0] > 1, m.size[1] > 1);
    const auto* data = static_cast<const uint8_t*>(m.data);
    for (int64_t b = 0; b < m.size[0]; ++b) {
      for (int64_t h = 0; h < m.size[1]; ++h) {
        uint8_t* out = table_.data() + b * batch_stride_ + h * head_stride_;
        for (int64_t r = 0; r < q_blocks_; ++r) {
          const uint8_t* in = data + b * m.batch + h * m.head + r * m.row;
          for (int64_t c = 0; c < k_blocks_; ++c) {
            out[r * k_blocks_ + c] = in[c] != 0 ? kBlockPartial : kBlockAbsent;
          }
        }
      }
    }
  }

  // Lists already checked by validate.cpp (counts within the width, indices in range, no block
  // twice).
  void from_lists(const QKVParams& p) {
    const struct {
      const BlockList& list;
      BlockState state;
    } lists[2] = {{p.partial_blocks, kBlockPartial}, {p.full_blocks, kBlockFull}};
    const bool by_batch = p.block_lists_vary_over_batch(), by_head = p.block_lists_vary_over_heads();
    allocate(p, by_batch, by_head);
    const int64_t nb = by_batch ? p.batch : 1, nh = by_head ? p.heads : 1;
    for (int64_t b = 0; b < nb; ++b) {
      for (int64_t h = 0; h < nh; ++h) {
        uint8_t* out = table_.data() + b * batch_stride_ + h * head_stride_;
        for (const auto& l : lists) {
          if (!l.list.defined()) continue;
          for (int64_t r = 0; r < q_blocks_; ++r) {
            const int32_t* row = l.list.row_at(b, h, r);
            const int32_t n = l.list.count_at(b, h, r);
            for (int32_t e = 0; e < n; ++e) out[r * k_blocks_ + row[e]] = l.state;
          }
        }
      }
    }
  }

  std::vector<uint8_t> table_;
  int64_t q_blocks_ = 0, k_blocks_ = 0;
  int64_t batch_stride_ = 0, head_stride_ = 0;
  bool by_batch_ = false, by_head_ = false;
  bool on_ = false;
};

}  // namespace flashattn::cpu
