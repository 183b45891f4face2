// The one place where the backward's run-time options become template arguments.
#include "cuda/common/variants.h"
#include "cuda/sm80/bwd.h"
#include "cuda/sm80/bwd_common.h"

namespace flashattn::cuda {

Status dispatch_bwd(const BackwardParams& p, cudaStream_t stream) {
  return dispatch_variant</*kBiasMask=*/true>(p, [&]<typename Element, int kHeadDim, MaskMode kMask, ScoreMods kMods>() {
    return run_bwd<BwdTraits<Element, kHeadDim, kMask, kMods>>(p, stream);
  });
}

}  // namespace flashattn::cuda
