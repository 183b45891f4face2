// CUDA forward_kvcache: not implemented yet. Issue 17's phase 1 ships the API, the CPU backend
// and the Python layer; the sm80 paged K/V tile loads and the append + rotary kernel are the
// next step. Until then CUDA tensors get a NotSupported status that says so (no silent
// fallback: DESIGN.md).
#include "core/backend.h"

namespace flashattn {

Status cuda_forward_kvcache(const ForwardParams& params) {
  (void)params;
  return Status::NotSupported(
      "forward_kvcache (flash_attn_with_kvcache) is not implemented on the CUDA backend yet; "
      "pass CPU tensors (the CPU backend implements every option)");
}

}  // namespace flashattn
