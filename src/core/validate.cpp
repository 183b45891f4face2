// Argument validation: public Args -> backend Params. Every message names the argument and
// says what was expected and what was given.
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/params.h"
#include "core/philox.h"
#include "flashattn/flashattn.h"

namespace flashattn {
namespace {

constexpr double kLog2e = 1.4426950408889634;
// The CPU backend handles any head dim up to this (MLA decode needs 576 for q/k); the CUDA
// backend narrows it further.
constexpr int64_t kMaxHeadDim = 1024;

std::string shape_str(const TensorView& t) {
  std::ostringstream os;
  os << "(";
  for (int i = 0; i < t.ndim; ++i) os << (i ? ", " : "") << t.shape[i];
  os << ")";
  return os.str();
}

std::string device_str(const Device& d) {
  return d.type == DeviceType::kCPU ? std::string("cpu") : "cuda:" + std::to_string(d.index);
}

// Collects the first error; later checks are skipped once one failed.
class Checker {
 public:
  bool ok() const { return status_.ok(); }
  Status status() const { return status_; }

  void fail(StatusCode code, const std::string& msg) {
    if (status_.ok()) status_ = Status(code, msg);
  }
  void invalid(const std::string& msg) { fail(StatusCode::kInvalidArgument, msg); }

  // A required tensor: defined, rank, dtype, device, non-null data, unit last stride,
  // non-negative sizes.
  void tensor(const char* name, const TensorView& t, int ndim, const char* layout) {
    if (!ok()) return;
    if (!t.defined()) {
      invalid(std::string(name) + " is required but was not given (expected " + layout + ")");
      return;
    }
    if (t.ndim != ndim) {
      invalid(std::string(name) + " must have " + std::to_string(ndim) + " dimensions " + layout +
              ", got " + std::to_string(t.ndim) + " with shape " + shape_str(t));
      return;
    }
    for (int i = 0; i < t.ndim; ++i) {
      if (t.shape[i] < 0) {
        invalid(std::string(name) + " has a negative size in shape " + shape_str(t));
        return;
      }
    }
    // An empty tensor has no element to address: frameworks export arbitrary strides for it
    // (0 in its empty dimensions, sometimes in the last one), so its strides are not checked.
    if (t.numel() == 0) return;
    for (int i = 0; i < t.ndim; ++i) {
      if (t.strides[i] < 0) {
        invalid(std::string(name) + " has a negative stride " + std::to_string(t.strides[i]) +
                " in dimension " + std::to_string(i));
        return;
      }
    }
    if (t.shape[ndim - 1] > 1 && t.strides[ndim - 1] != 1) {
      invalid(std::string(name) + " must be contiguous in its last dimension (stride 1), got stride " +
              std::to_string(t.strides[ndim - 1]));
      return;
    }
    if (t.data == nullptr) {
      invalid(std::string(name) + " has a null data pointer but " + std::to_string(t.numel()) +
              " elements");
    }
  }

  void dtype(const char* name, const TensorView& t, DType expected) {
    if (ok() && t.dtype != expected) {
      invalid(std::string(name) + " must have dtype " + dtype_name(expected) + ", got " +
              dtype_name(t.dtype));
    }
  }

  void device(const char* name, const TensorView& t, const Device& expected) {
    if (ok() && !(t.device == expected)) {
      invalid(std::string(name) + " is on " + device_str(t.device) + " but q is on " +
              device_str(expected) + "; all tensors must be on one device");
    }
  }

  void shape(const char* name, const TensorView& t, const std::vector<int64_t>& expected,
             const char* layout) {
    if (!ok()) return;
    bool same = static_cast<int>(expected.size()) == t.ndim;
    for (int i = 0; same && i < t.ndim; ++i) same = t.shape[i] == expected[i];
    if (!same) {
      TensorView e;
      e.ndim = static_cast<int32_t>(expected.size());
      for (int i = 0; i < e.ndim; ++i) e.shape[i] = expected[i];
      invalid(std::string(name) + " must have shape " + shape_str(e) + " " + layout + ", got " +
              shape_str(t));
    }
  }

 private:
  Status status_;
};

// Whether each of the first n dimensions of t is its full size or 1.
bool leading_dims_fit(const TensorView& t, const int64_t* full, int n) {
  for (int i = 0; i < n; ++i) {
    if (t.shape[i] != full[i] && t.shape[i] != 1) return false;
  }
  return true;
}

// Stride of dimension i as the backends use it: 0 where the dimension has size 1.
int64_t broadcast_stride(const TensorView& t, int i) { return t.shape[i] == 1 ? 0 : t.strides[i]; }

// An operand broadcast over (batch, heads, rows, cols): 4 dimensions, each leading one equal to
// its full size or 1, the last equal to cols (contiguous); dtype checked by the caller.
void check_broadcast4(Checker& c, const char* name, const TensorView& t, const int64_t (&full)[4],
                      const Device& dev, const char* layout, Broadcast4* out) {
  c.tensor(name, t, 4, layout);
  c.device(name, t, dev);
  if (!c.ok()) return;
  if (t.shape[3] != full[3] || !leading_dims_fit(t, full, 3)) {
    TensorView e;
    e.ndim = 4;
    for (int i = 0; i < 4; ++i) e.shape[i] = full[i];
    c.invalid(std::string(name) + " must be broadcastable to " + shape_str(e) + " " + layout +
              " (each leading dimension full or 1, the last one full), got " + shape_str(t));
    return;
  }
  out->data = t.data;
  out->dtype = t.dtype;
  int64_t* strides[3] = {&out->batch, &out->head, &out->row};
  for (int i = 0; i < 3; ++i) {
    out->size[i] = t.shape[i];
    *strides[i] = broadcast_stride(t, i);
  }
}

// One list pair of the compressed block mask (BlockMaskLists): int32 count (batch|1, heads|1,
// q_blocks) and indices (batch|1, heads|1, q_blocks, width), both or neither.
void check_block_list(Checker& c, const char* count_name, const char* index_name,
                      const TensorView& count, const TensorView& index, const int64_t (&full)[3],
                      const Device& dev, const std::string& q_blocks, BlockList* out) {
  if (!c.ok() || (!count.defined() && !index.defined())) return;
  if (count.defined() != index.defined()) {
    c.invalid(std::string(count_name) + " and " + index_name + " must be given together; got only " +
              (count.defined() ? count_name : index_name));
    return;
  }
  const std::string count_layout = "(batch|1, heads|1, " + q_blocks + ")";
  const std::string index_layout = "(batch|1, heads|1, " + q_blocks + ", width)";
  c.tensor(count_name, count, 3, count_layout.c_str());
  c.tensor(index_name, index, 4, index_layout.c_str());
  c.dtype(count_name, count, DType::kInt32);
  c.dtype(index_name, index, DType::kInt32);
  c.device(count_name, count, dev);
  c.device(index_name, index, dev);
  if (!c.ok()) return;
  const struct {
    const char* name;
    const TensorView& t;
    const std::string& layout;
  } both[2] = {{count_name, count, count_layout}, {index_name, index, index_layout}};
  for (const auto& x : both) {
    if (x.t.shape[2] != full[2] || !leading_dims_fit(x.t, full, 2)) {
      c.invalid(std::string(x.name) + " must have shape " + x.layout + " with " + q_blocks + " = " +
                std::to_string(full[2]) + ", batch " + std::to_string(full[0]) + " or 1 and heads " +
                std::to_string(full[1]) + " or 1, got " + shape_str(x.t));
      return;
    }
  }
  out->count = static_cast<const int32_t*>(count.data);
  out->count_batch = broadcast_stride(count, 0);
  out->count_head = broadcast_stride(count, 1);
  out->count_row = broadcast_stride(count, 2);
  out->indices.data = index.data;
  out->indices.dtype = DType::kInt32;
  int64_t* strides[3] = {&out->indices.batch, &out->indices.head, &out->indices.row};
  for (int i = 0; i < 3; ++i) {
    out->indices.size[i] = index.shape[i];
    *strides[i] = broadcast_stride(index, i);
  }
  out->width = index.shape[3];
}

// The values of the compressed block mask (host memory): every count in [0, width], every
// listed key block in [0, k_blocks), and no key block listed twice for one query block (in one
// list or across the two).
void check_block_list_values(Checker& c, const QKVParams& p, int64_t q_blocks, int64_t k_blocks) {
  const struct {
    const BlockList& list;
    const char* count_name;
    const char* index_name;
  } lists[2] = {{p.partial_blocks, "kv_num_blocks", "kv_indices"},
                {p.full_blocks, "full_kv_num_blocks", "full_kv_indices"}};
  const int64_t nb = p.block_lists_vary_over_batch() ? p.batch : 1;
  const int64_t nh = p.block_lists_vary_over_heads() ? p.heads : 1;
  // "name[b, h, r" (built only for a message).
  const auto at = [](const char* name, int64_t b, int64_t h, int64_t r) {
    std::ostringstream os;
    os << name << '[' << b << ", " << h << ", " << r;
    return os.str();
  };
  std::vector<int64_t> seen(static_cast<size_t>(k_blocks), -1);  // last (b, h, r) listing it
  int64_t stamp = 0;
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t h = 0; h < nh; ++h) {
      for (int64_t r = 0; r < q_blocks; ++r, ++stamp) {
        for (const auto& l : lists) {
          if (!l.list.defined()) continue;
          const int32_t n = l.list.count_at(b, h, r);
          if (n < 0 || n > l.list.width) {
            c.invalid(at(l.count_name, b, h, r) + "] = " + std::to_string(n) +
                      " is outside [0, " + std::to_string(l.list.width) + "], the width of " +
                      l.index_name);
            return;
          }
          const int32_t* row = l.list.row_at(b, h, r);
          for (int32_t e = 0; e < n; ++e) {
            const int32_t kb = row[e];
            if (kb < 0 || kb >= k_blocks) {
              c.invalid(at(l.index_name, b, h, r) + ", " + std::to_string(e) + "] = " +
                        std::to_string(kb) + " is outside [0, " + std::to_string(k_blocks) +
                        "), the key blocks (ceil(seqlen_k / block_size_k))");
              return;
            }
            if (seen[static_cast<size_t>(kb)] == stamp) {
              c.invalid("key block " + std::to_string(kb) + " is listed twice for query block " +
                        std::to_string(r) + " of (batch " + std::to_string(b) + ", head " +
                        std::to_string(h) + ") in kv_indices/full_kv_indices");
              return;
            }
            seen[static_cast<size_t>(kb)] = stamp;
          }
        }
      }
    }
  }
}

// attn_bias, attn_mask, block_mask or block_mask_lists (AttentionOptions), into p (shapes
// already resolved; varlen: seqlen_q/k are the maxima).
Status check_score_mods(const AttentionOptions& o, QKVParams* p) {
  Checker c;
  const bool varlen = p->is_varlen();
  const int64_t full[4] = {p->batch, p->heads, p->seqlen_q, p->seqlen_k};
  const char* layout = varlen ? "(batch|1, heads|1, max_seqlen_q|1, max_seqlen_k)"
                              : "(batch|1, heads|1, seqlen_q|1, seqlen_k)";
  if (o.attn_bias.defined()) {
    check_broadcast4(c, "attn_bias", o.attn_bias, full, p->device, layout, &p->bias);
    // A float8_e4m3 q takes a float32 bias only (an e4m3 bias would need its own descale).
    const bool fp8 = p->dtype == DType::kFloat8E4M3;
    if (c.ok() && o.attn_bias.dtype != DType::kFloat32 && (fp8 || o.attn_bias.dtype != p->dtype)) {
      c.invalid(fp8 ? std::string("attn_bias must have dtype float32 with float8_e4m3 q, got ") +
                          dtype_name(o.attn_bias.dtype)
                    : std::string("attn_bias must have dtype float32 or q's dtype (") +
                          dtype_name(p->dtype) + "), got " + dtype_name(o.attn_bias.dtype));
    }
  }
  if (o.attn_mask.defined()) {
    check_broadcast4(c, "attn_mask", o.attn_mask, full, p->device, layout, &p->mask);
    c.dtype("attn_mask", o.attn_mask, DType::kUInt8);
  }
  const bool lists = o.block_mask_lists.defined();
  if (!o.block_mask.defined() && !lists) {
    if (c.ok() && (o.block_size_q != 0 || o.block_size_k != 0)) {
      c.invalid("block_size_q/block_size_k were given without block_mask");
    }
    return c.status();
  }
  if (c.ok() && o.block_mask.defined() && lists) {
    c.invalid("block_mask and block_mask_lists (its compressed form) were both given; pass one");
  }
  if (c.ok() && (o.block_size_q < 1 || o.block_size_k < 1)) {
    c.invalid("block_size_q and block_size_k must be >= 1 with block_mask, got (" +
              std::to_string(o.block_size_q) + ", " + std::to_string(o.block_size_k) + ")");
  }
  if (!c.ok()) return c.status();
  // In 64 bits: seqlen + block_size - 1 overflows int32 for block sizes near 2^31.
  const int64_t blocks[4] = {p->batch, p->heads,
                             (int64_t{p->seqlen_q} + o.block_size_q - 1) / o.block_size_q,
                             (int64_t{p->seqlen_k} + o.block_size_k - 1) / o.block_size_k};
  const std::string q_blocks = varlen ? "ceil(max_seqlen_q / block_size_q)" : "ceil(seqlen_q / block_size_q)";
  const std::string k_blocks = varlen ? "ceil(max_seqlen_k / block_size_k)" : "ceil(seqlen_k / block_size_k)";
  if (o.block_mask.defined()) {
    const std::string block_layout = "(batch|1, heads|1, " + q_blocks + ", " + k_blocks + ")";
    check_broadcast4(c, "block_mask", o.block_mask, blocks, p->device, block_layout.c_str(),
                     &p->block_mask);
    c.dtype("block_mask", o.block_mask, DType::kUInt8);
    if (c.ok() && blocks[2] > 1 && o.block_mask.shape[2] == 1) {
      c.invalid("block_mask must have " + std::to_string(blocks[2]) + " query blocks (" +
                q_blocks + "), got 1");
    }
  } else {
    const BlockMaskLists& l = o.block_mask_lists;
    const int64_t lead[3] = {blocks[0], blocks[1], blocks[2]};
    check_block_list(c, "kv_num_blocks", "kv_indices", l.kv_num_blocks, l.kv_indices, lead,
                     p->device, q_blocks, &p->partial_blocks);
    check_block_list(c, "full_kv_num_blocks", "full_kv_indices", l.full_kv_num_blocks,
                     l.full_kv_indices, lead, p->device, q_blocks, &p->full_blocks);
    if (c.ok() && p->device.type == DeviceType::kCPU) {
      check_block_list_values(c, *p, blocks[2], blocks[3]);
    }
  }
  // A block at least as long as the sequences is one block whatever its size (every position
  // i has i / block_size = 0), so cap it there: the backends then never form seqlen +
  // block_size - 1 near the int32 limits (as the window sides are capped in make_qkv_params).
  p->block_size_q = std::min(o.block_size_q, std::max(p->seqlen_q, int32_t{1}));
  p->block_size_k = std::min(o.block_size_k, std::max(p->seqlen_k, int32_t{1}));
  return c.status();
}

Strides3 strides_of(const TensorView& t, bool varlen) {
  // Dense (b, s, h, d) or varlen (t, h, d).
  if (varlen) return Strides3{0, t.strides[0], t.strides[1]};
  return Strides3{t.strides[0], t.strides[1], t.strides[2]};
}

// n int32 values of `t` from element `at` on into dst: a CPU view's directly, a CUDA view's
// copied synchronously on `stream`.
Status read_int32s(const char* name, const TensorView& t, int64_t at, int64_t n, int32_t* dst, void* stream) {
  const int32_t* src = static_cast<const int32_t*>(t.data) + at;
  if (t.device.type == DeviceType::kCPU) {
    std::copy_n(src, n, dst);
    return Status::Ok();
  }
#if defined(FLASHATTN_WITH_CUDA)
  return cuda_copy_to_host(dst, src, sizeof(int32_t) * static_cast<size_t>(n), stream);
#else
  (void)stream;
  return Status::NotSupported(std::string(name) + " is on a CUDA device, but this flashattn build has no CUDA backend");
#endif
}

// The values of cu_seqlens_q/k (int32 (batch + 1) views already checked for rank, dtype and
// equal length): each starts at 0, never decreases, ends within the total_q / total_k rows,
// and, where max_seqlen_* > 0, holds no sequence longer than it. CUDA views are copied to the
// host synchronously on `stream`. longest[0], longest[1] receive the longest q and k sequences.
// forward(), backward() and check_varlen_metadata() all check through this one function.
Status check_cu_seqlens_values(const TensorView& cu_q, const TensorView& cu_k, int64_t total_q,
                               int64_t total_k, int32_t max_seqlen_q, int32_t max_seqlen_k,
                               void* stream, int64_t longest[2]) {
  const int64_t batch = cu_q.shape[0] - 1;
  if ((batch > 0 && cu_q.strides[0] != 1) || (batch > 0 && cu_k.strides[0] != 1)) {
    return Status::InvalidArgument("cu_seqlens_q and cu_seqlens_k must be contiguous");
  }
  std::vector<int32_t> cq(batch + 1), ck(batch + 1);
  if (Status s = read_int32s("cu_seqlens_q", cu_q, 0, batch + 1, cq.data(), stream); !s.ok()) return s;
  if (Status s = read_int32s("cu_seqlens_k", cu_k, 0, batch + 1, ck.data(), stream); !s.ok()) return s;
  const struct {
    const char* name;
    const char* max_name;
    const char* rows_of;
    const std::vector<int32_t>& cu;
    int64_t total;
    int32_t max_given;
  } sides[2] = {{"cu_seqlens_q", "max_seqlen_q", "q", cq, total_q, max_seqlen_q},
                {"cu_seqlens_k", "max_seqlen_k", "k", ck, total_k, max_seqlen_k}};
  for (int s = 0; s < 2; ++s) {
    const auto& cu = sides[s].cu;
    const std::string name = sides[s].name;
    if (cu[0] != 0) return Status::InvalidArgument(name + "[0] must be 0, got " + std::to_string(cu[0]));
    longest[s] = 0;
    for (int64_t b = 0; b < batch; ++b) {
      if (cu[b + 1] < cu[b]) {
        return Status::InvalidArgument(
            name + " must be non-decreasing, but entry " + std::to_string(b + 1) + " (" +
            std::to_string(cu[b + 1]) + ") < entry " + std::to_string(b) + " (" +
            std::to_string(cu[b]) + ")");
      }
      longest[s] = std::max<int64_t>(longest[s], cu[b + 1] - cu[b]);
    }
    if (cu[batch] > sides[s].total) {
      return Status::InvalidArgument(name + "[batch] = " + std::to_string(cu[batch]) +
                                     " exceeds the " + std::to_string(sides[s].total) +
                                     " rows of " + sides[s].rows_of);
    }
    if (sides[s].max_given > 0 && longest[s] > sides[s].max_given) {
      return Status::InvalidArgument(std::string(sides[s].max_name) + " is " +
                                     std::to_string(sides[s].max_given) + " but " + name +
                                     " holds a sequence of length " + std::to_string(longest[s]));
    }
  }
  return Status::Ok();
}

// Shared part of forward and backward: q, k, v and the options. fp8_cache: k and v are a KV
// cache, which may be float8_e4m3 under float16/bfloat16 queries (forward_kvcache).
Status make_qkv_params(const AttentionOptions& o, const TensorView& q, const TensorView& k,
                       const TensorView& v, QKVParams* p, bool fp8_cache = false) {
  Checker c;
  const bool varlen = o.cu_seqlens_q.defined() || o.cu_seqlens_k.defined();
  if (o.cu_seqlens_q.defined() != o.cu_seqlens_k.defined()) {
    c.invalid(std::string("cu_seqlens_q and cu_seqlens_k must be given together; got only ") +
              (o.cu_seqlens_q.defined() ? "cu_seqlens_q" : "cu_seqlens_k"));
    return c.status();
  }
  const int rank = varlen ? 3 : 4;
  const char* q_layout = varlen ? "(total_q, heads, head_dim)" : "(batch, seqlen_q, heads, head_dim)";
  const char* k_layout =
      varlen ? "(total_k, heads_k, head_dim)" : "(batch, seqlen_k, heads_k, head_dim)";
  const char* v_layout =
      varlen ? "(total_k, heads_k, head_dim_v)" : "(batch, seqlen_k, heads_k, head_dim_v)";
  c.tensor("q", q, rank, q_layout);
  c.tensor("k", k, rank, k_layout);
  c.tensor("v", v, rank, v_layout);
  if (!c.ok()) return c.status();

  const Device dev = q.device;
  c.device("k", k, dev);
  c.device("v", v, dev);
  if (dev.type == DeviceType::kCUDA && dev.index < 0) {
    c.invalid("q is on cuda:" + std::to_string(dev.index) + "; the device index must be >= 0");
  }
  if (q.dtype != DType::kFloat32 && q.dtype != DType::kFloat16 && q.dtype != DType::kBFloat16 &&
      q.dtype != DType::kFloat8E4M3) {
    c.fail(StatusCode::kNotSupported, std::string("q has dtype ") + dtype_name(q.dtype) +
                                          "; supported: float32 (cpu), float16, bfloat16, "
                                          "float8_e4m3");
  }
  // An FP8 cache under 16-bit queries: k decides, v must follow it.
  const bool fp8_kv = fp8_cache && k.dtype == DType::kFloat8E4M3 &&
                      (q.dtype == DType::kFloat16 || q.dtype == DType::kBFloat16);
  const DType kv_dtype = fp8_kv ? DType::kFloat8E4M3 : q.dtype;
  if (fp8_kv) {
    c.dtype("v", v, kv_dtype);
  } else {
    c.dtype("k", k, q.dtype);
    c.dtype("v", v, q.dtype);
  }
  if (c.ok() && q.dtype == DType::kFloat8E4M3 && o.dropout_p > 0.0f) {
    c.fail(StatusCode::kNotSupported,
           "dropout_p = " + std::to_string(o.dropout_p) +
               " is not supported with float8_e4m3 inputs: the FP8 forward is for inference "
               "(it has no backward); pass dropout_p = 0");
  }
  if (!c.ok()) return c.status();

  const int off = varlen ? 1 : 0;  // dimension shift for varlen
  const int64_t heads = q.shape[2 - off];
  const int64_t head_dim = q.shape[3 - off];
  const int64_t heads_k = k.shape[2 - off];
  const int64_t head_dim_v = v.shape[3 - off];
  if (head_dim < 1 || head_dim > kMaxHeadDim) {
    c.fail(StatusCode::kNotSupported, "q has head_dim " + std::to_string(head_dim) +
                                          "; supported: 1.." + std::to_string(kMaxHeadDim));
  } else if (head_dim_v < 1 || head_dim_v > kMaxHeadDim) {
    c.fail(StatusCode::kNotSupported, "v has head_dim_v " + std::to_string(head_dim_v) +
                                          "; supported: 1.." + std::to_string(kMaxHeadDim));
  } else if (heads < 1) {
    c.invalid("q must have at least one head, got shape " + shape_str(q));
  } else if (heads_k < 1 || heads % heads_k != 0) {
    c.invalid("heads (" + std::to_string(heads) + ", from q) must be a positive multiple of heads_k (" +
              std::to_string(heads_k) + ", from k)");
  } else if (k.shape[3 - off] != head_dim) {
    c.invalid("k must have head_dim " + std::to_string(head_dim) + " like q, got " +
              std::to_string(k.shape[3 - off]));
  }
  if (!c.ok()) return c.status();

  int64_t batch = 0, seqlen_q = 0, seqlen_k = 0;
  if (varlen) {
    c.tensor("cu_seqlens_q", o.cu_seqlens_q, 1, "(batch + 1)");
    c.tensor("cu_seqlens_k", o.cu_seqlens_k, 1, "(batch + 1)");
    c.dtype("cu_seqlens_q", o.cu_seqlens_q, DType::kInt32);
    c.dtype("cu_seqlens_k", o.cu_seqlens_k, DType::kInt32);
    c.device("cu_seqlens_q", o.cu_seqlens_q, dev);
    c.device("cu_seqlens_k", o.cu_seqlens_k, dev);
    if (!c.ok()) return c.status();
    if (o.cu_seqlens_q.shape[0] < 1) {
      c.invalid("cu_seqlens_q must have batch + 1 >= 1 entries, got 0");
    } else if (o.cu_seqlens_k.shape[0] != o.cu_seqlens_q.shape[0]) {
      c.invalid("cu_seqlens_k must have " + std::to_string(o.cu_seqlens_q.shape[0]) +
                " entries like cu_seqlens_q, got " + std::to_string(o.cu_seqlens_k.shape[0]));
    }
    if (!c.ok()) return c.status();
    batch = o.cu_seqlens_q.shape[0] - 1;
    seqlen_q = o.max_seqlen_q;
    seqlen_k = o.max_seqlen_k;
    if (o.max_seqlen_q < 0 || o.max_seqlen_k < 0) {
      c.invalid("max_seqlen_q and max_seqlen_k must be >= 0, got " + std::to_string(o.max_seqlen_q) +
                " and " + std::to_string(o.max_seqlen_k));
      return c.status();
    }
    const bool on_cpu = dev.type == DeviceType::kCPU;
    // On CUDA the lengths live on the device, so the grid is sized from max_seqlen_*; a side
    // without rows (total 0) needs none.
    if (!on_cpu && batch > 0 &&
        ((o.max_seqlen_q == 0 && q.shape[0] > 0) || (o.max_seqlen_k == 0 && k.shape[0] > 0))) {
      c.invalid("max_seqlen_q and max_seqlen_k are required (> 0) with varlen CUDA tensors, got " +
                std::to_string(o.max_seqlen_q) + " and " + std::to_string(o.max_seqlen_k));
      return c.status();
    }
    // Read cu_seqlens when we must (CPU defaults) or were asked to check them.
    if (on_cpu || o.check_cu_seqlens) {
      int64_t longest[2] = {0, 0};
      if (Status s = check_cu_seqlens_values(o.cu_seqlens_q, o.cu_seqlens_k, q.shape[0], k.shape[0],
                                             o.max_seqlen_q, o.max_seqlen_k, o.stream, longest);
          !s.ok()) {
        return s;
      }
      if (o.max_seqlen_q == 0) seqlen_q = longest[0];
      if (o.max_seqlen_k == 0) seqlen_k = longest[1];
    }
  } else {
    batch = q.shape[0];
    seqlen_q = q.shape[1];
    seqlen_k = k.shape[1];
    if (k.shape[0] != batch) {
      c.invalid("k must have batch " + std::to_string(batch) + " like q, got " +
                std::to_string(k.shape[0]));
    }
  }
  if (!c.ok()) return c.status();
  const std::vector<int64_t> v_expect =
      varlen ? std::vector<int64_t>{k.shape[0], heads_k, head_dim_v}
             : std::vector<int64_t>{batch, seqlen_k, heads_k, head_dim_v};
  c.shape("v", v, v_expect, v_layout);
  if (!c.ok()) return c.status();

  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  if (batch > kIntMax || seqlen_q > kIntMax || seqlen_k > kIntMax) {
    c.invalid("batch and sequence lengths must fit in int32, got batch " + std::to_string(batch) +
              ", seqlen_q " + std::to_string(seqlen_q) + ", seqlen_k " + std::to_string(seqlen_k));
    return c.status();
  }

  // Options.
  if (!std::isfinite(o.softmax_scale)) {
    c.invalid("softmax_scale must be finite, got " + std::to_string(o.softmax_scale));
  } else if (!(o.softcap >= 0.0f) || !std::isfinite(o.softcap)) {
    c.invalid("softcap must be >= 0 and finite (0 = off), got " + std::to_string(o.softcap));
  } else if (!(o.dropout_p >= 0.0f && o.dropout_p < 1.0f)) {
    c.invalid("dropout_p must be in [0, 1), got " + std::to_string(o.dropout_p));
  } else if (o.window_left < -1 || o.window_right < -1) {
    c.invalid("window_left and window_right must be >= -1 (-1 = unbounded), got (" +
              std::to_string(o.window_left) + ", " + std::to_string(o.window_right) + ")");
  } else if (o.num_threads < 0) {
    c.invalid("num_threads must be >= 0 (0 = all hardware threads), got " +
              std::to_string(o.num_threads));
  }
  if (!c.ok()) return c.status();

  if (o.alibi_slopes.defined()) {
    const TensorView& a = o.alibi_slopes;
    if (a.ndim != 1 && a.ndim != 2) {
      c.invalid("alibi_slopes must have shape (heads) or (batch, heads), got " + shape_str(a));
      return c.status();
    }
    c.tensor("alibi_slopes", a, a.ndim, "(heads) or (batch, heads)");
    c.dtype("alibi_slopes", a, DType::kFloat32);
    c.device("alibi_slopes", a, dev);
    if (a.ndim == 1) c.shape("alibi_slopes", a, {heads}, "(heads)");
    if (a.ndim == 2) c.shape("alibi_slopes", a, {batch, heads}, "(batch, heads)");
    if (!c.ok()) return c.status();
    p->alibi = static_cast<const float*>(a.data);
    p->alibi_batch_stride = a.ndim == 2 ? a.strides[0] : 0;
  }

  if (o.learnable_sink.defined()) {
    const TensorView& sk = o.learnable_sink;
    c.tensor("learnable_sink", sk, 1, "(heads)");
    c.dtype("learnable_sink", sk, DType::kFloat32);
    c.device("learnable_sink", sk, dev);
    c.shape("learnable_sink", sk, {heads}, "(heads)");
    if (!c.ok()) return c.status();
    p->learnable_sink = static_cast<const float*>(sk.data);
  }

  p->dtype = q.dtype;
  p->kv_dtype = kv_dtype;
  p->out_dtype = q.dtype == DType::kFloat8E4M3 ? DType::kBFloat16 : q.dtype;
  p->device = dev;
  p->q = q.data;
  p->k = k.data;
  p->v = v.data;
  p->q_strides = strides_of(q, varlen);
  p->k_strides = strides_of(k, varlen);
  p->v_strides = strides_of(v, varlen);
  p->batch = static_cast<int32_t>(batch);
  p->heads = static_cast<int32_t>(heads);
  p->heads_k = static_cast<int32_t>(heads_k);
  p->head_dim = static_cast<int32_t>(head_dim);
  p->head_dim_v = static_cast<int32_t>(head_dim_v);
  p->seqlen_q = static_cast<int32_t>(seqlen_q);
  p->seqlen_k = static_cast<int32_t>(seqlen_k);
  p->total_q = varlen ? q.shape[0] : batch * seqlen_q;
  p->total_k = varlen ? k.shape[0] : batch * seqlen_k;
  if (varlen) {
    p->cu_seqlens_q = static_cast<const int32_t*>(o.cu_seqlens_q.data);
    p->cu_seqlens_k = static_cast<const int32_t*>(o.cu_seqlens_k.data);
  }
  p->scale = o.softmax_scale > 0.0f ? o.softmax_scale
                                    : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  p->softcap = o.softcap;
  // With softcap the exponent is taken after tanh, so the log2(e) factor cannot be folded into
  // the scale; backends use scale_log2 only when softcap == 0.
  p->scale_log2 = static_cast<float>(p->scale * kLog2e);
  // causal=true clamps the right side to 0 whatever window_right says, as flash_attn 2.x does:
  // causal + (left, right) is the window (left, 0), causal + (-1, -1) is (-1, 0).
  p->window_left = o.window_left;
  p->window_right = o.causal ? 0 : o.window_right;
  // A side at least as wide as the sequences hides nothing (right >= seqlen_q: every row's
  // bound i + seqlen_k - seqlen_q + right >= seqlen_k - 1; left >= seqlen_k likewise), so make it
  // unbounded: backends then never form d + right or d - left near the int32 limits. Varlen
  // lengths are maxima, so this holds for every sequence.
  if (p->window_right >= seqlen_q) p->window_right = -1;
  if (p->window_left >= seqlen_k) p->window_left = -1;
  p->is_causal = p->window_left < 0 && p->window_right == 0;
  p->dropout_p = o.dropout_p;
  p->dropout_threshold = dropout_threshold(o.dropout_p);
  p->dropout_rescale = static_cast<float>(1.0 / (1.0 - static_cast<double>(o.dropout_p)));
  p->seed = o.seed;
  p->offset = o.offset;
  p->stream = o.stream;
  p->num_threads = o.num_threads;
  return check_score_mods(o, p);
}

// Checks an output/input tensor that must look like `like_shape` in the same layout.
void check_like(Checker& c, const char* name, const TensorView& t, const std::vector<int64_t>& shape,
                DType dtype, const Device& dev, const char* layout) {
  c.tensor(name, t, static_cast<int>(shape.size()), layout);
  c.dtype(name, t, dtype);
  c.device(name, t, dev);
  c.shape(name, t, shape, layout);
}

// A tensor the call writes (an output, or a cache it appends to): a stride of 0 in a dimension
// of size > 1 (an expand()ed view) makes elements share memory, which would end up holding
// whichever write came last (on a GPU, a race between threads).
void check_writable(Checker& c, const char* name, const TensorView& t) {
  if (!c.ok() || !t.defined() || t.numel() == 0) return;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] > 1 && t.strides[i] == 0) {
      c.invalid(std::string(name) + " is written by the call and must not have stride 0 in dimension " +
                std::to_string(i) + " (size " + std::to_string(t.shape[i]) +
                "): its elements would share memory; pass a tensor of its own");
      return;
    }
  }
}

void check_lse(Checker& c, const char* name, const TensorView& lse, const QKVParams& p, QKVParams* out) {
  const bool varlen = p.is_varlen();
  const char* layout = varlen ? "(heads, total_q)" : "(batch, heads, seqlen_q)";
  const std::vector<int64_t> shape = varlen ? std::vector<int64_t>{p.heads, p.total_q}
                                            : std::vector<int64_t>{p.batch, p.heads, p.seqlen_q};
  check_like(c, name, lse, shape, DType::kFloat32, p.device, layout);
  if (!c.ok()) return;
  out->lse = static_cast<float*>(lse.data);
  out->lse_batch_stride = varlen ? 0 : lse.strides[0];
  out->lse_head_stride = varlen ? lse.strides[0] : lse.strides[1];
}

std::vector<int64_t> q_like_shape(const QKVParams& p, int64_t head_dim) {
  if (p.is_varlen()) return {p.total_q, p.heads, head_dim};
  return {p.batch, p.seqlen_q, p.heads, head_dim};
}

std::vector<int64_t> k_like_shape(const QKVParams& p, int64_t head_dim) {
  if (p.is_varlen()) return {p.total_k, p.heads_k, head_dim};
  return {p.batch, p.seqlen_k, p.heads_k, head_dim};
}

// One FP8 descale factor (q_descale, k_descale, v_descale): given only for a float8_e4m3
// operand; float32 (batch, heads_k) on q's device with any non-negative strides, as
// FlashAttention-3 takes it (an expanded scalar has strides (0, 0)); for CPU tensors every
// value finite and > 0 (a zero or NaN factor would turn the new keys of a KV-cache append into
// NaN or saturated codes).
void check_descale(Checker& c, const char* name, const TensorView& t, const char* operand,
                   DType operand_dtype, const QKVParams& p, Descale* out) {
  if (!c.ok() || !t.defined()) return;
  const std::string n = name;
  if (operand_dtype != DType::kFloat8E4M3) {
    c.invalid(n + " was given but " + operand + " has dtype " + dtype_name(operand_dtype) +
              "; descale factors apply to float8_e4m3 operands only");
    return;
  }
  const std::vector<int64_t> expect{p.batch, p.heads_k};
  c.shape(name, t, expect, "(batch, heads_k)");
  c.dtype(name, t, DType::kFloat32);
  c.device(name, t, p.device);
  if (!c.ok()) return;
  if (t.strides[0] < 0 || t.strides[1] < 0) {
    c.invalid(n + " has a negative stride (" + std::to_string(t.strides[0]) + ", " +
              std::to_string(t.strides[1]) + ")");
    return;
  }
  if (t.numel() > 0 && t.data == nullptr) {
    c.invalid(n + " has a null data pointer but " + std::to_string(t.numel()) + " elements");
    return;
  }
  out->data = static_cast<const float*>(t.data);
  out->batch = t.strides[0];
  out->head = t.strides[1];
  if (p.device.type != DeviceType::kCPU) return;
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads_k; ++h) {
      const float f = out->at(b, h);
      if (!(f > 0.0f) || !std::isfinite(f)) {
        c.invalid(n + "[" + std::to_string(b) + ", " + std::to_string(h) + "] = " +
                  std::to_string(f) + "; a descale factor must be finite and > 0");
        return;
      }
    }
  }
}

// q_descale, k_descale, v_descale of a forward or forward_kvcache call, into p.
void check_descales(Checker& c, const TensorView& q, const TensorView& k, const TensorView& v,
                    QKVParams* p) {
  check_descale(c, "q_descale", q, "q", p->dtype, *p, &p->q_descale);
  check_descale(c, "k_descale", k, "k", p->kv_dtype, *p, &p->k_descale);
  check_descale(c, "v_descale", v, "v", p->kv_dtype, *p, &p->v_descale);
}

}  // namespace

Status check_varlen_metadata(const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                             int64_t total_q, int64_t total_k, int32_t max_seqlen_q,
                             int32_t max_seqlen_k, void* stream) {
  Checker c;
  c.tensor("cu_seqlens_q", cu_seqlens_q, 1, "(batch + 1)");
  c.tensor("cu_seqlens_k", cu_seqlens_k, 1, "(batch + 1)");
  c.dtype("cu_seqlens_q", cu_seqlens_q, DType::kInt32);
  c.dtype("cu_seqlens_k", cu_seqlens_k, DType::kInt32);
  if (!c.ok()) return c.status();
  if (!(cu_seqlens_k.device == cu_seqlens_q.device)) {
    return Status::InvalidArgument("cu_seqlens_k is on " + device_str(cu_seqlens_k.device) +
                                   " but cu_seqlens_q is on " + device_str(cu_seqlens_q.device));
  }
  if (cu_seqlens_q.shape[0] < 1) {
    return Status::InvalidArgument("cu_seqlens_q must have batch + 1 >= 1 entries, got 0");
  }
  if (cu_seqlens_k.shape[0] != cu_seqlens_q.shape[0]) {
    return Status::InvalidArgument("cu_seqlens_k must have " + std::to_string(cu_seqlens_q.shape[0]) +
                                   " entries like cu_seqlens_q, got " +
                                   std::to_string(cu_seqlens_k.shape[0]));
  }
  if (total_q < 0 || total_k < 0 || max_seqlen_q < 0 || max_seqlen_k < 0) {
    return Status::InvalidArgument(
        "total_q, total_k, max_seqlen_q and max_seqlen_k must be >= 0, got " +
        std::to_string(total_q) + ", " + std::to_string(total_k) + ", " +
        std::to_string(max_seqlen_q) + ", " + std::to_string(max_seqlen_k));
  }
  int64_t longest[2] = {0, 0};
  return check_cu_seqlens_values(cu_seqlens_q, cu_seqlens_k, total_q, total_k, max_seqlen_q,
                                 max_seqlen_k, stream, longest);
}

namespace {

// make_forward_params; fp8_cache as in make_qkv_params.
Status forward_params(const ForwardArgs& args, ForwardParams* p, bool fp8_cache) {
  if (Status s = make_qkv_params(args, args.q, args.k, args.v, p, fp8_cache); !s.ok()) return s;
  Checker c;
  const bool varlen = p->is_varlen();
  const char* o_layout = varlen ? "(total_q, heads, head_dim_v)" : "(batch, seqlen_q, heads, head_dim_v)";
  if (args.out.defined() && p->dtype == DType::kFloat8E4M3 && args.out.dtype != p->out_dtype) {
    // As FlashAttention-3: an FP8 forward writes bfloat16 (an e4m3 output would need an output
    // scale, and float16 would overflow where bfloat16 does not).
    c.fail(StatusCode::kNotSupported, std::string("out must have dtype bfloat16 with float8_e4m3 "
                                                  "q, got ") + dtype_name(args.out.dtype));
  }
  check_like(c, "out", args.out, q_like_shape(*p, p->head_dim_v), p->out_dtype, p->device, o_layout);
  check_writable(c, "out", args.out);
  check_descales(c, args.q_descale, args.k_descale, args.v_descale, p);
  if (args.lse.defined()) check_lse(c, "lse", args.lse, *p, p);
  check_writable(c, "lse", args.lse);
  if (c.ok() && args.num_splits < 0) {
    c.invalid("num_splits must be >= 0 (0 = heuristic), got " + std::to_string(args.num_splits));
  }
  if (!c.ok()) return c.status();
  p->out = args.out.data;
  p->out_strides = strides_of(args.out, varlen);
  p->num_splits = args.num_splits;
  return Status::Ok();
}

// The values of a paged varlen call, in host memory: every sequence's key count (cu_k[b + 1] -
// cu_k[b]) fits in its block-table row of `capacity` keys, and the entries covering them are
// pages in [0, num_blocks). check_paged_metadata and the forward on CPU tensors share it.
void check_paged_values(Checker& c, const int32_t* table, int64_t table_stride, const int32_t* cu_k, int64_t batch,
                        int64_t capacity, int64_t page_size, int64_t num_blocks) {
  for (int64_t b = 0; b < batch && c.ok(); ++b) {
    const int64_t len = int64_t(cu_k[b + 1]) - cu_k[b];
    std::ostringstream at_os;  // (not "[" + to_string(b): GCC 12's -Wrestrict false positive)
    at_os << '[' << b << ']';
    const std::string at = at_os.str();
    if (len < 0) {
      c.invalid("cu_seqlens_k must be non-decreasing, but entry " + std::to_string(b + 1) + " < entry " +
                std::to_string(b));
    } else if (len > capacity) {
      c.invalid("sequence " + std::to_string(b) + " has " + std::to_string(len) +
                " keys (cu_seqlens_k) but block_table" + at + " holds " + std::to_string(capacity) +
                " rows (max_blocks * page_size, 0 when k has no pages)");
    }
    for (int64_t blk = 0; blk * page_size < len && c.ok(); ++blk) {
      const int32_t page = table[b * table_stride + blk];
      if (page < 0 || page >= num_blocks) {
        c.invalid("block_table" + at + "[" + std::to_string(blk) + "] = " + std::to_string(page) +
                  " is outside [0, " + std::to_string(num_blocks) +
                  "), the pages of k (the block holds keys of the sequence)");
      }
    }
  }
}

// make_forward_params with a block table: a varlen call whose k and v are pages (flashattn.h
// ForwardArgs::block_table). q, out, lse, the options and cu_seqlens go through the varlen
// checks, with k and v seen as (rows, heads_k, d) views of the pages whose row count bounds
// nothing (a page may serve several sequences); then the pages and the table are checked and
// the call becomes a forward_kvcache without an append (params.h KVCacheParams).
Status paged_forward_params(const ForwardArgs& a, ForwardParams* p) {
  Checker c;
  const char* k_layout = "(num_blocks, page_size, heads_k, head_dim) with block_table";
  const char* v_layout = "(num_blocks, page_size, heads_k, head_dim_v) with block_table";
  if (!a.cu_seqlens_q.defined() || !a.cu_seqlens_k.defined()) {
    c.invalid("block_table needs cu_seqlens_q and cu_seqlens_k (a varlen call, as flash_attn_varlen_func); "
              "for a batch of equal-length queries against paged caches use forward_kvcache");
    return c.status();
  }
  c.tensor("k", a.k, 4, k_layout);
  c.tensor("v", a.v, 4, v_layout);
  c.tensor("block_table", a.block_table, 2, "(batch, max_blocks)");
  c.dtype("block_table", a.block_table, DType::kInt32);
  if (!c.ok()) return c.status();
  const TensorView &k = a.k, &v = a.v;
  if (v.shape[0] != k.shape[0] || v.shape[1] != k.shape[1] || v.shape[2] != k.shape[2]) {
    c.invalid("v must match k in its first three dimensions (num_blocks, page_size, heads_k): the same pages, "
              "got k " + shape_str(k) + " and v " + shape_str(v));
  } else if (k.shape[1] < 1) {
    c.invalid("k must have a page size (dimension 1) >= 1 with block_table, got shape " + shape_str(k));
  } else if (a.dropout_p > 0.0f) {
    c.fail(StatusCode::kNotSupported, "dropout_p = " + std::to_string(a.dropout_p) +
                                          " is not supported with block_table (paged K/V is forward only); pass 0");
  } else if (a.attn_bias.defined() || a.attn_mask.defined() || a.block_mask.defined() ||
             a.block_mask_lists.defined()) {
    c.fail(StatusCode::kNotSupported,
           "attn_bias, attn_mask and block masks are not supported with block_table (paged K/V)");
  } else if (a.q.defined() && a.q.dtype == DType::kFloat8E4M3) {
    c.fail(StatusCode::kNotSupported,
           "float8_e4m3 q is not supported with block_table; pass q in bfloat16 or float16 (the pages may "
           "be float8_e4m3, with k_descale / v_descale)");
  }
  if (!c.ok()) return c.status();
  const int64_t num_blocks = k.shape[0], page_size = k.shape[1];
  const int64_t capacity = a.block_table.shape[1] * page_size;
  if (capacity > std::numeric_limits<int32_t>::max() || num_blocks > std::numeric_limits<int32_t>::max()) {
    c.invalid("block_table must address at most 2^31 - 1 rows per sequence and k at most 2^31 - 1 pages, got " +
              std::to_string(capacity) + " rows and " + std::to_string(num_blocks) + " pages");
    return c.status();
  }
  // The varlen views: rows of one page after another as far as strides go; their count only
  // has to admit any cu_seqlens_k (no pages: no keys).
  const int64_t rows = num_blocks * page_size == 0 ? 0 : std::numeric_limits<int32_t>::max();
  ForwardArgs f = a;
  f.block_table = TensorView{};
  for (auto [from, to] : {std::pair{&k, &f.k}, std::pair{&v, &f.v}}) {
    *to = *from;
    to->ndim = 3;
    for (int i = 1; i < 4; ++i) {
      to->shape[i - 1] = i == 1 ? rows : from->shape[i];
      to->strides[i - 1] = from->strides[i];
    }
    to->shape[3] = to->strides[3] = 0;
  }
  if (Status s = forward_params(f, p, /*fp8_cache=*/true); !s.ok()) return s;
  c.device("block_table", a.block_table, p->device);
  if (c.ok() && a.block_table.shape[0] != p->batch) {
    c.invalid("block_table must have batch = " + std::to_string(p->batch) + " rows (cu_seqlens_q has batch + 1 "
              "entries), got shape " + shape_str(a.block_table));
  }
  if (!c.ok()) return c.status();
  p->k_strides = strides_of(k, false);  // the batch stride is the page stride
  p->v_strides = strides_of(v, false);
  p->total_k = num_blocks * page_size;
  KVCacheParams& kv = p->kv;
  kv.enabled = true;
  // No pages: no key (the clamps would otherwise aim at page -1).
  kv.capacity = num_blocks == 0 ? 0 : static_cast<int32_t>(capacity);
  kv.block_table = static_cast<const int32_t*>(a.block_table.data);
  kv.block_table_stride = a.block_table.strides[0];
  kv.page_size = static_cast<int32_t>(page_size);
  kv.num_blocks = static_cast<int32_t>(num_blocks);
  if (p->device.type == DeviceType::kCPU) {
    check_paged_values(c, kv.block_table, kv.block_table_stride, p->cu_seqlens_k, p->batch, kv.capacity, page_size,
                       num_blocks);
  }
  return c.status();
}

}  // namespace

Status make_forward_params(const ForwardArgs& args, ForwardParams* p) {
  if (args.block_table.defined()) return paged_forward_params(args, p);
  return forward_params(args, p, /*fp8_cache=*/false);
}

Status check_paged_metadata(const TensorView& block_table, const TensorView& cu_seqlens_k, int64_t num_blocks,
                            int64_t page_size, void* stream) {
  Checker c;
  c.tensor("block_table", block_table, 2, "(batch, max_blocks)");
  c.tensor("cu_seqlens_k", cu_seqlens_k, 1, "(batch + 1)");
  c.dtype("block_table", block_table, DType::kInt32);
  c.dtype("cu_seqlens_k", cu_seqlens_k, DType::kInt32);
  if (!c.ok()) return c.status();
  const int64_t batch = block_table.shape[0];
  if (cu_seqlens_k.shape[0] != batch + 1) {
    return Status::InvalidArgument("cu_seqlens_k must have batch + 1 = " + std::to_string(batch + 1) +
                                   " entries (block_table has batch rows), got " +
                                   std::to_string(cu_seqlens_k.shape[0]));
  }
  if (num_blocks < 0 || page_size < 1) {
    return Status::InvalidArgument("num_blocks must be >= 0 and page_size >= 1, got " + std::to_string(num_blocks) +
                                   " and " + std::to_string(page_size));
  }
  if (batch > 0 && cu_seqlens_k.strides[0] != 1) return Status::InvalidArgument("cu_seqlens_k must be contiguous");
  if (block_table.strides[0] < 0) return Status::InvalidArgument("block_table must have a row stride >= 0");
  const int64_t width = block_table.shape[1];
  std::vector<int32_t> table(static_cast<size_t>(batch * width)), ck(static_cast<size_t>(batch + 1));
  // The table's span in one read (one synchronisation for a device table), then its rows, whose
  // stride may differ from the width.
  const int64_t stride = block_table.strides[0];
  if (batch > 0 && width > 0) {
    std::vector<int32_t> span(static_cast<size_t>((batch - 1) * stride + width));
    if (Status s = read_int32s("block_table", block_table, 0, int64_t(span.size()), span.data(), stream); !s.ok()) {
      return s;
    }
    for (int64_t b = 0; b < batch; ++b) std::copy_n(span.begin() + b * stride, width, table.begin() + b * width);
  }
  if (Status s = read_int32s("cu_seqlens_k", cu_seqlens_k, 0, batch + 1, ck.data(), stream); !s.ok()) return s;
  if (ck[0] != 0) return Status::InvalidArgument("cu_seqlens_k[0] must be 0, got " + std::to_string(ck[0]));
  const int64_t capacity = num_blocks == 0 ? 0 : width * page_size;
  check_paged_values(c, table.data(), width, ck.data(), batch, capacity, page_size, num_blocks);
  return c.status();
}

Status make_backward_params(const BackwardArgs& args, BackwardParams* p) {
  if (args.q.defined() && args.q.dtype == DType::kFloat8E4M3) {
    // FlashAttention-3 has no FP8 backward either (only cuDNN does): training in FP8 needs
    // scaled dO and dS, and P's rounding to e4m3 in the forward has no derivative of its own.
    return Status::NotSupported(
        "backward is not supported for float8_e4m3 inputs (q has dtype float8_e4m3): the FP8 "
        "forward is inference-only; train in bfloat16 or float16");
  }
  if (Status s = make_qkv_params(args, args.q, args.k, args.v, p); !s.ok()) return s;
  Checker c;
  const bool varlen = p->is_varlen();
  const char* q_layout = varlen ? "(total_q, heads, head_dim)" : "(batch, seqlen_q, heads, head_dim)";
  const char* o_layout = varlen ? "(total_q, heads, head_dim_v)" : "(batch, seqlen_q, heads, head_dim_v)";
  const char* k_layout = varlen ? "(total_k, heads_k, head_dim)" : "(batch, seqlen_k, heads_k, head_dim)";
  const char* v_layout =
      varlen ? "(total_k, heads_k, head_dim_v)" : "(batch, seqlen_k, heads_k, head_dim_v)";
  const auto o_shape = q_like_shape(*p, p->head_dim_v);
  check_like(c, "out", args.out, o_shape, p->dtype, p->device, o_layout);
  check_like(c, "dout", args.dout, o_shape, p->dtype, p->device, o_layout);
  check_lse(c, "lse", args.lse, *p, p);
  check_like(c, "dq", args.dq, q_like_shape(*p, p->head_dim), p->dtype, p->device, q_layout);
  check_like(c, "dk", args.dk, k_like_shape(*p, p->head_dim), p->dtype, p->device, k_layout);
  check_like(c, "dv", args.dv, k_like_shape(*p, p->head_dim_v), p->dtype, p->device, v_layout);
  check_writable(c, "dq", args.dq);
  check_writable(c, "dk", args.dk);
  check_writable(c, "dv", args.dv);
  if (!c.ok()) return c.status();
  p->out = args.out.data;
  p->dout = args.dout.data;
  p->dq = args.dq.data;
  p->dk = args.dk.data;
  p->dv = args.dv.data;
  p->out_strides = strides_of(args.out, varlen);
  p->dout_strides = strides_of(args.dout, varlen);
  p->dq_strides = strides_of(args.dq, varlen);
  p->dk_strides = strides_of(args.dk, varlen);
  p->dv_strides = strides_of(args.dv, varlen);
  p->deterministic = args.deterministic;
  if (args.dsink.defined()) {
    if (!args.learnable_sink.defined()) {
      c.invalid("dsink (the gradient of learnable_sink) was given without learnable_sink");
      return c.status();
    }
    check_like(c, "dsink", args.dsink, {p->heads}, DType::kFloat32, p->device, "(heads)");
    check_writable(c, "dsink", args.dsink);
    if (!c.ok()) return c.status();
    p->dsink = static_cast<float*>(args.dsink.data);
  }
  if (args.dbias.defined()) {
    if (!args.attn_bias.defined()) {
      c.invalid("dbias (the gradient of attn_bias) was given without attn_bias");
      return c.status();
    }
    const TensorView& b = args.attn_bias;
    // float32, or the bias's own 16-bit dtype (the gradient rounded once, as a cast of the float32
    // one would be, without the float32 tensor).
    const bool bias16 = b.dtype == DType::kFloat16 || b.dtype == DType::kBFloat16;
    if (args.dbias.dtype != DType::kFloat32 && !(bias16 && args.dbias.dtype == b.dtype)) {
      c.invalid(std::string("dbias must have dtype float32") +
                (bias16 ? std::string(" or attn_bias's ") + dtype_name(b.dtype) : std::string()) + ", got " +
                dtype_name(args.dbias.dtype));
      return c.status();
    }
    check_like(c, "dbias", args.dbias, {b.shape[0], b.shape[1], b.shape[2], b.shape[3]}, args.dbias.dtype,
               p->device, "(attn_bias's shape)");
    if (!c.ok()) return c.status();
    const int64_t full[4] = {b.shape[0], b.shape[1], b.shape[2], b.shape[3]};
    check_broadcast4(c, "dbias", args.dbias, full, p->device, "(attn_bias's shape)", &p->dbias);
    for (int i = 0; c.ok() && i < 3; ++i) {
      if (args.dbias.shape[i] > 1 && args.dbias.strides[i] == 0) {
        c.invalid("dbias is an output and must not have stride 0 in dimension " +
                  std::to_string(i) + " (size " + std::to_string(args.dbias.shape[i]) +
                  "); pass the bias's own shape, with size 1 where it broadcasts");
      }
    }
    if (!c.ok()) return c.status();
  }
  return Status::Ok();
}

// ---- forward_kvcache ---------------------------------------------------------------------------

namespace {

// An optional int32 (batch) index tensor: contiguous, on q's device.
void check_index_vector(Checker& c, const char* name, const TensorView& t, int64_t batch,
                        const Device& dev) {
  if (!t.defined() || !c.ok()) return;
  check_like(c, name, t, {batch}, DType::kInt32, dev, "(batch)");
  if (c.ok() && batch > 1 && t.strides[0] != 1) {
    c.invalid(std::string(name) + " must be contiguous (stride 1), got stride " +
              std::to_string(t.strides[0]));
  }
}

// Host-side checks of the index tensors' values (CPU tensors only: reading device memory
// would need a synchronisation, which also breaks CUDA graph capture).
void check_kvcache_values(Checker& c, const KVCacheArgs& a, const ForwardParams& p) {
  const KVCacheParams& kv = p.kv;
  const auto* seqlens = static_cast<const int32_t*>(a.cache_seqlens.data);
  const auto* leftpad = static_cast<const int32_t*>(a.cache_leftpad.data);
  const auto* bidx = static_cast<const int32_t*>(a.cache_batch_idx.data);
  for (int64_t b = 0; b < p.batch && c.ok(); ++b) {
    const int64_t len = seqlens != nullptr ? seqlens[b] : kv.capacity;
    std::ostringstream at_os;
    at_os << '[' << b << ']';
    const std::string at = at_os.str();
    if (len < 0) {
      c.invalid("cache_seqlens" + at + " must be >= 0, got " + std::to_string(len));
    } else if (kv.seqlen_new == 0 && len > kv.capacity) {
      c.invalid("cache_seqlens" + at + " = " + std::to_string(len) + " is beyond the cache, which holds " +
                std::to_string(kv.capacity) + " rows per sequence");
    } else if (len + kv.seqlen_new > kv.capacity) {
      c.invalid("the cache is too short for the append: cache_seqlens" + at + " + seqlen_new = " +
                std::to_string(len) + " + " + std::to_string(kv.seqlen_new) + " > " +
                std::to_string(kv.capacity) + " rows per sequence");
    }
    const int64_t lp = leftpad != nullptr ? leftpad[b] : 0;
    if (c.ok() && (lp < 0 || lp > len)) {
      c.invalid("cache_leftpad" + at + " must be in [0, cache_seqlens" + at + " = " +
                std::to_string(len) + "], got " + std::to_string(lp));
    }
    if (c.ok() && bidx != nullptr && (bidx[b] < 0 || bidx[b] >= kv.batch_cache)) {
      c.invalid("cache_batch_idx" + at + " = " + std::to_string(bidx[b]) + " is outside [0, " +
                std::to_string(kv.batch_cache) + "), the batch of k_cache");
    }
    if (c.ok() && kv.paged()) {
      const int64_t end = len + kv.seqlen_new;
      for (int64_t blk = lp / kv.page_size; blk * kv.page_size < end && c.ok(); ++blk) {
        const int32_t page = kv.block_table[b * kv.block_table_stride + blk];
        if (page < 0 || page >= kv.num_blocks) {
          c.invalid("block_table" + at + "[" + std::to_string(blk) + "] = " + std::to_string(page) +
                    " is outside [0, " + std::to_string(kv.num_blocks) +
                    "), the pages of k_cache (the block holds rows the call reads or writes)");
        }
      }
    }
  }
}

}  // namespace

Status make_kvcache_params(const KVCacheArgs& a, ForwardParams* p) {
  Checker c;
  const bool paged = a.block_table.defined();
  const char* cache_layout =
      paged ? "(num_blocks, page_size, heads_k, head_dim)" : "(batch_cache, seqlen_cache, heads_k, head_dim)";
  c.tensor("q", a.q, 4, "(batch, seqlen_q, heads, head_dim)");
  c.tensor("k_cache", a.k_cache, 4, cache_layout);
  c.tensor("v_cache", a.v_cache, 4, cache_layout);
  if (!c.ok()) return c.status();
  const int64_t batch = a.q.shape[0];
  const TensorView& kc = a.k_cache;
  const TensorView& vc = a.v_cache;
  if (vc.shape[0] != kc.shape[0] || vc.shape[1] != kc.shape[1] || vc.shape[2] != kc.shape[2]) {
    c.invalid(std::string("v_cache must match k_cache in its first three dimensions ") + cache_layout +
              (paged ? " (the same pages and page size)" : "") + ", got k_cache " + shape_str(kc) +
              " and v_cache " + shape_str(vc));
    return c.status();
  }

  int64_t capacity = kc.shape[1];
  if (paged) {
    c.tensor("block_table", a.block_table, 2, "(batch, max_blocks)");
    c.dtype("block_table", a.block_table, DType::kInt32);
    c.device("block_table", a.block_table, a.q.device);
    if (!c.ok()) return c.status();
    if (a.block_table.shape[0] != batch) {
      c.invalid("block_table must have batch " + std::to_string(batch) + " rows like q, got shape " +
                shape_str(a.block_table));
    } else if (kc.shape[1] < 1) {
      c.invalid("k_cache must have a page size (dimension 1) >= 1 with block_table, got shape " +
                shape_str(kc));
    } else if (a.cache_batch_idx.defined()) {
      c.invalid("cache_batch_idx cannot be combined with block_table: the block table already "
                "maps each sequence to its pages");
    }
    if (!c.ok()) return c.status();
    capacity = a.block_table.shape[1] * kc.shape[1];
  }
  if (capacity > std::numeric_limits<int32_t>::max() || kc.shape[0] > std::numeric_limits<int32_t>::max()) {
    c.invalid("the cache must hold at most 2^31 - 1 rows per sequence and pages, got capacity " +
              std::to_string(capacity) + " and " + std::to_string(kc.shape[0]) + " pages/rows");
    return c.status();
  }

  // Validate q, the cache (seen as a dense (batch, capacity, heads_k, d) operand), out, lse and
  // the options (ALiBi and the learnable sink included) through the plain forward's checks.
  ForwardArgs f;
  f.q = a.q;
  f.out = a.out;
  f.lse = a.lse;
  for (auto [from, to] : {std::pair{&kc, &f.k}, std::pair{&vc, &f.v}}) {
    *to = *from;
    to->shape[0] = batch;
    to->shape[1] = kc.shape[0] == 0 ? 0 : capacity;  // a cache without rows: an empty view
  }
  f.softmax_scale = a.softmax_scale;
  f.causal = a.causal;
  f.window_left = a.window_left;
  f.window_right = a.window_right;
  f.softcap = a.softcap;
  f.alibi_slopes = a.alibi_slopes;
  f.learnable_sink = a.learnable_sink;
  f.num_splits = a.num_splits;
  f.stream = a.stream;
  f.num_threads = a.num_threads;
  f.q_descale = a.q_descale;
  f.k_descale = a.k_descale;
  f.v_descale = a.v_descale;
  if (Status s = forward_params(f, p, /*fp8_cache=*/true); !s.ok()) {
    // The cache's messages name the synthetic views "k"/"v"; rename them.
    std::string m = s.message();
    if (m.size() > 2 && (m[0] == 'k' || m[0] == 'v') && m[1] == ' ') m.insert(1, "_cache");
    return Status(s.code(), m);
  }
  const Device dev = p->device;
  KVCacheParams& kv = p->kv;
  kv.enabled = true;
  // A cache without pages (paged) or cache rows (dense) holds no row: the clamps would
  // otherwise aim at page or cache row -1.
  kv.capacity = kc.shape[0] == 0 ? 0 : static_cast<int32_t>(capacity);
  if (paged) {
    kv.block_table = static_cast<const int32_t*>(a.block_table.data);
    kv.block_table_stride = a.block_table.strides[0];
    kv.page_size = static_cast<int32_t>(kc.shape[1]);
    kv.num_blocks = static_cast<int32_t>(kc.shape[0]);
  } else {
    kv.batch_cache = static_cast<int32_t>(kc.shape[0]);
    if (!a.cache_batch_idx.defined() && kc.shape[0] < batch) {
      c.invalid("k_cache has batch " + std::to_string(kc.shape[0]) + " but q has batch " +
                std::to_string(batch) + "; give cache_batch_idx to map sequences to cache rows");
    }
  }

  check_index_vector(c, "cache_seqlens", a.cache_seqlens, batch, dev);
  check_index_vector(c, "cache_batch_idx", a.cache_batch_idx, batch, dev);
  check_index_vector(c, "cache_leftpad", a.cache_leftpad, batch, dev);
  if (!c.ok()) return c.status();
  kv.cache_seqlens = static_cast<const int32_t*>(a.cache_seqlens.data);
  kv.batch_idx = static_cast<const int32_t*>(a.cache_batch_idx.data);
  kv.leftpad = static_cast<const int32_t*>(a.cache_leftpad.data);

  // New tokens.
  if (a.k.defined() != a.v.defined()) {
    c.invalid(std::string("k and v (the new tokens) must be given together; got only ") +
              (a.k.defined() ? "k" : "v"));
    return c.status();
  }
  if (a.k.defined()) {
    if (!a.cache_seqlens.defined()) {
      c.invalid("k/v (new tokens) need cache_seqlens: where to append them in the cache");
      return c.status();
    }
    c.tensor("k", a.k, 4, "(batch, seqlen_new, heads_k, head_dim)");
    c.tensor("v", a.v, 4, "(batch, seqlen_new, heads_k, head_dim_v)");
    if (!c.ok()) return c.status();
    const int64_t seqlen_new = a.k.shape[1];
    check_like(c, "k", a.k, {batch, seqlen_new, p->heads_k, p->head_dim}, p->dtype, dev,
               "(batch, seqlen_new, heads_k, head_dim)");
    check_like(c, "v", a.v, {batch, seqlen_new, p->heads_k, p->head_dim_v}, p->dtype, dev,
               "(batch, seqlen_new, heads_k, head_dim_v)");
    // The append writes into the caches.
    check_writable(c, "k_cache", kc);
    check_writable(c, "v_cache", vc);
    if (c.ok() && seqlen_new > capacity) {
      c.invalid("the cache is too short for the append: k has seqlen_new " + std::to_string(seqlen_new) +
                " but the cache holds " + std::to_string(capacity) + " rows per sequence");
    }
    if (!c.ok()) return c.status();
    kv.k_new = a.k.data;
    kv.v_new = a.v.data;
    kv.k_new_strides = strides_of(a.k, false);
    kv.v_new_strides = strides_of(a.v, false);
    kv.seqlen_new = static_cast<int32_t>(seqlen_new);
  }

  // Rotary.
  if (a.rotary_cos.defined() != a.rotary_sin.defined()) {
    c.invalid(std::string("rotary_cos and rotary_sin must be given together; got only ") +
              (a.rotary_cos.defined() ? "rotary_cos" : "rotary_sin"));
    return c.status();
  }
  if (a.rotary_cos.defined()) {
    if (p->dtype == DType::kFloat8E4M3) {
      c.fail(StatusCode::kNotSupported,
             "rotary_cos/rotary_sin are not supported with float8_e4m3 q and new k: rotating "
             "e4m3 values would round them twice; rotate before quantizing, or pass q and k/v in "
             "bfloat16 with an FP8 cache (the new keys are rotated, then quantized)");
      return c.status();
    }
    if (!a.k.defined()) {
      c.invalid("rotary_cos/rotary_sin need k and v: the rotary embedding is applied to the new "
                "keys and to q at their cache positions");
      return c.status();
    }
    c.tensor("rotary_cos", a.rotary_cos, 2, "(seqlen_ro, rotary_dim / 2)");
    if (!c.ok()) return c.status();
    const int64_t seqlen_ro = a.rotary_cos.shape[0], half = a.rotary_cos.shape[1];
    check_like(c, "rotary_cos", a.rotary_cos, {seqlen_ro, half}, p->dtype, dev, "(seqlen_ro, rotary_dim / 2)");
    check_like(c, "rotary_sin", a.rotary_sin, {seqlen_ro, half}, p->dtype, dev, "(seqlen_ro, rotary_dim / 2)");
    if (c.ok() && (half < 1 || 2 * half > p->head_dim)) {
      c.invalid("rotary_dim = 2 * rotary_cos.shape[1] must be in [2, head_dim = " +
                std::to_string(p->head_dim) + "], got " + std::to_string(2 * half));
    } else if (c.ok() && seqlen_ro < capacity) {
      c.invalid("rotary_cos/rotary_sin must have at least as many positions as the cache holds rows (" +
                std::to_string(capacity) + "), got seqlen_ro " + std::to_string(seqlen_ro));
    }
    if (!c.ok()) return c.status();
    kv.rotary_cos = a.rotary_cos.data;
    kv.rotary_sin = a.rotary_sin.data;
    kv.rotary_cos_stride = a.rotary_cos.strides[0];
    kv.rotary_sin_stride = a.rotary_sin.strides[0];
    kv.rotary_dim = static_cast<int32_t>(2 * half);
    kv.rotary_interleaved = a.rotary_interleaved;
    // As flash_attn: queries advance with their token index when causal or windowed (a side
    // at least as wide as the cache is no window); otherwise all sit at cache_len.
    kv.rotary_q_per_token = a.causal || (a.window_left >= 0 && a.window_left < capacity) ||
                            (a.window_right >= 0 && a.window_right < capacity);
    // A cache without rows: no key to attend to and none to append, so q's rotation changes
    // nothing (out 0, LSE -inf or the sink), and its position (capacity - 1) would be -1.
    if (kv.capacity == 0) kv.rotary_dim = 0;
  }

  if (dev.type == DeviceType::kCPU) check_kvcache_values(c, a, *p);
  return c.status();
}

}  // namespace flashattn
