// cuTensorMapEncodeTiled through the runtime's driver entry point, so the library does not link
// libcuda (the driver provides it at run time).
#include "cuda/sm90/tensor_map.h"

#include <cuda_runtime.h>

#include <mutex>
#include <string>

namespace flashattn::cuda::sm90 {
namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encode_fn(cudaError_t* err) {
  static EncodeTiled fn = nullptr;
  static cudaError_t status = cudaSuccess;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    status = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found);
    if (status == cudaSuccess && found == cudaDriverEntryPointSuccess) fn = reinterpret_cast<EncodeTiled>(p);
  });
  *err = status;
  return fn;
}

}  // namespace

Status make_operand_map(CUtensorMap* map, const void* ptr, DType dtype, int head_dim, int64_t rows, int heads,
                        int batch, const Strides3& strides, int box_rows, int box_cols, int swizzle_bytes) {
  cudaError_t err = cudaSuccess;
  const EncodeTiled encode = encode_fn(&err);
  if (encode == nullptr) {
    return Status::NotSupported(std::string("cuTensorMapEncodeTiled is not available from the driver (") +
                                cudaGetErrorName(err) + ")");
  }
  const uint64_t es = dtype_size(dtype);
  // A dimension of extent 1 never steps, but the encoder still wants a valid stride there (a
  // varlen operand's batch stride is 0). Any other stride goes as it is: a broadcast (0) one
  // is rejected by the encoder, and the call then runs on the sm80 kernels.
  const auto stride_of = [](int64_t s, int64_t extent, uint64_t fallback) {
    return extent == 1 && s <= 0 ? fallback : uint64_t(s);
  };
  const uint64_t row_bytes = stride_of(strides.row, rows, head_dim) * es;
  const uint64_t head_bytes = stride_of(strides.head, heads, head_dim) * es;
  const uint64_t batch_bytes = stride_of(strides.batch, batch, uint64_t(rows) * head_dim * heads) * es;
  const cuuint64_t dims[4] = {cuuint64_t(head_dim), cuuint64_t(rows), cuuint64_t(heads), cuuint64_t(batch)};
  const cuuint64_t byte_strides[3] = {row_bytes, head_bytes, batch_bytes};
  const cuuint32_t box[4] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1, 1};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  // e4m3 codes (and attn_mask's uint8) travel as bytes: the copy engine only moves them.
  const CUtensorMapDataType type = dtype == DType::kBFloat16    ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                   : dtype == DType::kFloat8E4M3 || dtype == DType::kUInt8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                                                 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const CUtensorMapSwizzle swizzle = swizzle_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B;
  const CUresult r = encode(map, type, 4, const_cast<void*>(ptr), dims, byte_strides, box, unit,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return Status::NotSupported("the copy engine cannot describe this operand (cuTensorMapEncodeTiled error " +
                                std::to_string(int(r)) + "; strides in bytes " + std::to_string(row_bytes) + ", " +
                                std::to_string(head_bytes) + ", " + std::to_string(batch_bytes) + ")");
  }
  return Status::Ok();
}

const char* bias_map_declines(const Broadcast4& b) {
  if (b.dtype == DType::kFloat32) return "a float32 attn_bias runs on sm80 (sm90: q's dtype)";
  if (reinterpret_cast<uintptr_t>(b.data) % 16 != 0 || (b.batch | b.head | b.row) % 8 != 0) {
    return "attn_bias with strides or a base not 16-byte aligned runs on sm80";
  }
  return nullptr;
}

Status make_bias_map(CUtensorMap* map, const Broadcast4& b, int seqlen_q, int seqlen_k, int box_rows) {
  const int rows = b.row == 0 ? 1 : seqlen_q;
  const int heads = b.head == 0 ? 1 : int(b.size[1]);
  const int batch = b.batch == 0 ? 1 : int(b.size[0]);
  // A dimension of extent 1 never steps, but the encoder wants a nonzero 16-byte multiple there
  // (make_operand_map's fallback, seqlen_k elements, need not be one).
  const int64_t pitch = (int64_t(seqlen_k) + 7) / 8 * 8;
  const Strides3 strides{b.batch != 0 ? b.batch : pitch, b.row != 0 ? b.row : pitch, b.head != 0 ? b.head : pitch};
  if (Status s = make_operand_map(map, b.data, b.dtype, seqlen_k, rows, heads, batch, strides,
                                  b.row == 0 ? 1 : box_rows, 64, 128);
      !s.ok()) {
    return Status::NotSupported("attn_bias: " + s.message());
  }
  return Status::Ok();
}

}  // namespace flashattn::cuda::sm90
