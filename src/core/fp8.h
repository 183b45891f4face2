// The FP8 (float8_e4m3) contract shared by every backend (docs/SEMANTICS.md, "FP8"): where the
// probabilities are rounded to e4m3 before P.V and what they are taken relative to.
#pragma once

#include <cmath>

#include "core/host_device.h"

namespace flashattn {

// Largest finite float8_e4m3 (S.1111.110 = 1.75 * 2^8). Conversions saturate to it (PTX
// cvt.rn.satfinite, the only e4m3 conversion Hopper has): no value becomes NaN by overflow.
constexpr float kFp8E4M3Max = 448.0f;

// The probabilities of a row are rounded to e4m3 as P = e4m3(2^(x - r)), x a logit in log2
// units, with the reference r = fp8_p_reference(m) for the maximum logit m the row has seen:
//   r = ceil(m) - kFp8POffset.
// The offset puts the largest probability in (2^7, 2^8] instead of (1/2, 1]: the whole normal
// range of e4m3 (2^-6 .. 448) is used and a probability underflows only below 2^-17 of the
// largest (FlashAttention-3 shifts its maximum by 8 for the same reason). Rounding m up to an
// integer makes every rescale 2^(r_old - r_new) a power of two, which commutes with rounding to
// e4m3 (away from its subnormals): a tiled kernel whose running maximum grows block by block
// rounds every probability exactly as a naive computation with the row's final maximum would,
// so the result does not depend on tile sizes, the order of the key blocks or split-KV.
// A row that has seen no visible key (m = -inf) keeps r = -inf.
constexpr int kFp8POffset = 8;

FLASHATTN_HOST_DEVICE float fp8_p_reference(float m) {
  return ceilf(m) - static_cast<float>(kFp8POffset);
}

}  // namespace flashattn
