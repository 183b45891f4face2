// The element-wise work of the ring around the attention calls, on the tensors' device: the
// workspace, packing K/V into contiguous buffers that can travel, merging partial (O, LSE),
// accumulating gradients in float32 and writing the results out.
//
// Every tensor argument is a TensorView of rank 3 or 4 with a contiguous last dimension; the
// shapes of the two operands of an operation are equal. Rank 3 is the LSE layout
// (batch, heads, rows); rank 4 is (batch, rows, heads, dim).
#pragma once

#include <cstddef>
#include <memory>

#include "flashattn/types.h"

namespace flashattn::ring {

class RingOps {
 public:
  virtual ~RingOps() = default;

  // Workspace on the device (CUDA: stream-ordered on the ops' stream). Freed by free().
  virtual Status alloc(size_t bytes, void** ptr) = 0;
  virtual void free(void* ptr) = 0;

  // dst = src, converting the dtype when they differ (strided views either side).
  virtual Status copy(const TensorView& src, const TensorView& dst) = 0;
  // dst = value (float32 dst).
  virtual Status fill(const TensorView& dst, float value) = 0;
  // acc += src (acc float32, src any floating dtype).
  virtual Status accumulate(const TensorView& acc, const TensorView& src) = 0;
  // Merges a partial result into the running one, row by row (merge.h):
  //   o_acc (batch, rows, heads, dv) f32, lse_acc (batch, heads, rows) f32 <- merge with
  //   o_part (batch, rows, heads, dv) any dtype, lse_part (batch, heads, rows) f32.
  virtual Status merge(const TensorView& o_acc, const TensorView& lse_acc, const TensorView& o_part,
                       const TensorView& lse_part) = 0;
};

// Host memory and loops, spread over the CPU backend's worker threads.
std::unique_ptr<RingOps> make_cpu_ops(int num_threads);

#if defined(FLASHATTN_WITH_CUDA)
// cudaMallocAsync workspace and small kernels on `stream` of CUDA device `device`
// (src/ring/ops_cuda.cu).
std::unique_ptr<RingOps> make_cuda_ops(int device, void* stream);
#endif

}  // namespace flashattn::ring
