// dev A/B (s34, FLASHATTN_DEV_SM90_FWD_SHORT128_MASKED): not generated; remove with the macro.
#include "cuda/sm90/fwd_launch.h"

namespace flashattn::cuda {
#if defined(FLASHATTN_DEV_SM90_FWD_SHORT128_MASKED)
template Status sm90::run_fwd<sm90::FwdShortRowsTraits<__nv_bfloat16, 128, MaskMode::kWindow>>(const ForwardParams&, cudaStream_t);
#endif
}  // namespace flashattn::cuda
