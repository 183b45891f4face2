// RingOps on the host: loops over rows, spread over the CPU backend's thread pool. This work
// is O(rows * heads * dim) per ring step against O(rows^2 * heads * dim) for the attention
// calls, so plain scalar loops are enough.
#include <algorithm>
#include <cstdint>
#include <new>
#include <string>

#include "cpu/convert.h"
#include "cpu/thread_pool.h"
#include "ring/merge.h"
#include "ring/ops.h"

namespace flashattn::ring {
namespace {

// A view seen as rank 4 (leading size-1 dimensions added); the last dimension is contiguous.
struct View4 {
  char* data;
  DType dtype;
  int64_t shape[4];
  int64_t strides[4];

  explicit View4(const TensorView& t) : data(static_cast<char*>(t.data)), dtype(t.dtype) {
    const int pad = 4 - t.ndim;
    for (int i = 0; i < 4; ++i) {
      shape[i] = i < pad ? 1 : t.shape[i - pad];
      strides[i] = i < pad ? 0 : t.strides[i - pad];
    }
  }
  int64_t rows() const { return shape[0] * shape[1] * shape[2]; }
  // Start of the contiguous innermost row number `row` (row-major over the first three dims).
  char* row(int64_t r) const {
    const int64_t i2 = r % shape[2];
    const int64_t i1 = (r / shape[2]) % shape[1];
    const int64_t i0 = r / (shape[2] * shape[1]);
    const int64_t e = i0 * strides[0] + i1 * strides[1] + i2 * strides[2];
    return data + e * dtype_size(dtype);
  }
};

float load(DType dt, const char* p, int64_t i) {
  switch (dt) {
    case DType::kFloat16:
      return cpu::half_to_float(reinterpret_cast<const uint16_t*>(p)[i]);
    case DType::kBFloat16:
      return cpu::bf16_to_float(reinterpret_cast<const uint16_t*>(p)[i]);
    default:
      return reinterpret_cast<const float*>(p)[i];
  }
}

void store(DType dt, char* p, int64_t i, float x) {
  switch (dt) {
    case DType::kFloat16:
      reinterpret_cast<uint16_t*>(p)[i] = cpu::float_to_half(x);
      break;
    case DType::kBFloat16:
      reinterpret_cast<uint16_t*>(p)[i] = cpu::float_to_bf16(x);
      break;
    default:
      reinterpret_cast<float*>(p)[i] = x;
      break;
  }
}

class CpuOps final : public RingOps {
 public:
  explicit CpuOps(int num_threads) : threads_(cpu::resolve_num_threads(num_threads)) {}

  Status alloc(size_t bytes, void** ptr) override {
    // 64-byte aligned like the backend's scratch; at least one byte so the pointer is unique.
    const size_t size = (bytes + 63) / 64 * 64 + 64;
    *ptr = ::operator new (size, std::align_val_t{64}, std::nothrow);
    if (*ptr == nullptr) {
      return Status::Internal("ring workspace: out of host memory allocating " +
                              std::to_string(bytes) + " bytes");
    }
    return Status::Ok();
  }

  void free(void* ptr) override {
    if (ptr != nullptr) ::operator delete (ptr, std::align_val_t{64});
  }

  Status copy(const TensorView& src, const TensorView& dst) override {
    const View4 s(src), d(dst);
    const int64_t n = s.shape[3];
    for_rows(s.rows(), [&](int64_t r) {
      const char* in = s.row(r);
      char* out = d.row(r);
      for (int64_t c = 0; c < n; ++c) store(d.dtype, out, c, load(s.dtype, in, c));
    });
    return Status::Ok();
  }

  Status fill(const TensorView& dst, float value) override {
    const View4 d(dst);
    const int64_t n = d.shape[3];
    for_rows(d.rows(), [&](int64_t r) {
      float* out = reinterpret_cast<float*>(d.row(r));
      for (int64_t c = 0; c < n; ++c) out[c] = value;
    });
    return Status::Ok();
  }

  Status accumulate(const TensorView& acc, const TensorView& src) override {
    const View4 a(acc), s(src);
    const int64_t n = a.shape[3];
    for_rows(a.rows(), [&](int64_t r) {
      float* out = reinterpret_cast<float*>(a.row(r));
      const char* in = s.row(r);
      for (int64_t c = 0; c < n; ++c) out[c] += load(s.dtype, in, c);
    });
    return Status::Ok();
  }

  Status merge(const TensorView& o_acc, const TensorView& lse_acc, const TensorView& o_part,
               const TensorView& lse_part) override {
    // o: (batch, rows, heads, dv); lse: (batch, heads, rows).
    const View4 oa(o_acc), op(o_part);
    const int64_t heads = oa.shape[2], rows = oa.shape[1], dv = oa.shape[3];
    for_rows(oa.rows(), [&](int64_t r) {
      const int64_t h = r % heads, i = (r / heads) % rows, b = r / (heads * rows);
      float* la = static_cast<float*>(lse_acc.data) + b * lse_acc.strides[0] +
                  h * lse_acc.strides[1] + i * lse_acc.strides[2];
      const float lb = static_cast<const float*>(
          lse_part
              .data)[b * lse_part.strides[0] + h * lse_part.strides[1] + i * lse_part.strides[2]];
      const char* in = op.row(r);
      const DType dt = op.dtype;
      merge_into(reinterpret_cast<float*>(oa.row(r)), la, static_cast<int>(dv), lb,
                 [&](int c) { return load(dt, in, c); });
    });
    return Status::Ok();
  }

 private:
  // Runs body(row) for rows [0, count) in blocks of rows on the pool.
  template <class Body>
  void for_rows(int64_t count, Body body) {
    constexpr int64_t kRowsPerItem = 256;
    const int64_t items = (count + kRowsPerItem - 1) / kRowsPerItem;
    auto item = [&](int64_t it, int) {
      const int64_t end = std::min(count, (it + 1) * kRowsPerItem);
      for (int64_t r = it * kRowsPerItem; r < end; ++r) body(r);
    };
    cpu::parallel_for(items, threads_, cpu::ItemFunction(item));
  }

  int threads_;
};

}  // namespace

std::unique_ptr<RingOps> make_cpu_ops(int num_threads) {
  return std::make_unique<CpuOps>(num_threads);
}

}  // namespace flashattn::ring
