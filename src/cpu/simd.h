// SIMD vocabulary of the CPU backend: GCC/Clang vector extensions of a compile-time width W
// (in floats) and the few helpers the kernels need (load, store, broadcast, max, exp2).
//
// The kernels are templates on an ISA config (isa.h) that are instantiated inside functions
// carrying a `target` attribute, so one source compiles to SSE2, AVX2+FMA and AVX-512 code.
// Rules that make this work:
//   * every helper is always_inline, so its body is compiled with the caller's target;
//   * vectors cross helper boundaries by reference only: a vector wider than the default ISA
//     passed or returned by value changes the calling convention (GCC -Wpsabi), and these
//     helpers are shared by all ISAs;
//   * vector types come from explicit specialisations: GCC ignores `vector_size` on an alias
//     template whose size depends on a template parameter.
#pragma once

#include <cstdint>

#define FLASHATTN_CPU_INLINE inline __attribute__((always_inline))

namespace flashattn::cpu {

template <int W>
struct VecTypes;

template <>
struct VecTypes<4> {
  typedef float F __attribute__((vector_size(16)));
  typedef float FUnaligned __attribute__((vector_size(16), aligned(4), may_alias));
  typedef int32_t I __attribute__((vector_size(16)));
};
template <>
struct VecTypes<8> {
  typedef float F __attribute__((vector_size(32)));
  typedef float FUnaligned __attribute__((vector_size(32), aligned(4), may_alias));
  typedef int32_t I __attribute__((vector_size(32)));
};
template <>
struct VecTypes<16> {
  typedef float F __attribute__((vector_size(64)));
  typedef float FUnaligned __attribute__((vector_size(64), aligned(4), may_alias));
  typedef int32_t I __attribute__((vector_size(64)));
};

template <int W>
using VecF = typename VecTypes<W>::F;  // W floats
template <int W>
using VecI = typename VecTypes<W>::I;  // W int32 (comparison results: -1 true, 0 false)

// Unaligned load / store of W floats.
template <int W>
FLASHATTN_CPU_INLINE void vload(VecF<W>& v, const float* p) {
  v = *reinterpret_cast<const typename VecTypes<W>::FUnaligned*>(p);
}
template <int W>
FLASHATTN_CPU_INLINE void vstore(float* p, const VecF<W>& v) {
  *reinterpret_cast<typename VecTypes<W>::FUnaligned*>(p) = v;
}

// v = (s, s, ..., s). `s - 0` is exact for every s (also -0), so it folds to a broadcast.
template <int W>
FLASHATTN_CPU_INLINE void vsplat(VecF<W>& v, float s) {
  v = s - VecF<W>{};
}

// v = (base, base + 1, ..., base + W - 1).
template <int W>
FLASHATTN_CPU_INLINE void viota(VecF<W>& v, float base) {
  for (int i = 0; i < W; ++i) v[i] = base + static_cast<float>(i);
}

// a = max(a, b) lane-wise. Written as `a > b ? a : b`, which is exactly the x86 max
// instruction's rule (the second operand when either is NaN), so it compiles to one maxps.
template <int W>
FLASHATTN_CPU_INLINE void vmax_inplace(VecF<W>& a, const VecF<W>& b) {
  a = a > b ? a : b;
}

// a = min(a, b) lane-wise (one minps, see vmax_inplace).
template <int W>
FLASHATTN_CPU_INLINE void vmin_inplace(VecF<W>& a, const VecF<W>& b) {
  a = a < b ? a : b;
}

// |v| lane-wise.
template <int W>
FLASHATTN_CPU_INLINE void vabs_inplace(VecF<W>& v) {
  v = v < 0.0f ? -v : v;
}

// Whether any lane of v differs from s.
template <int W>
FLASHATTN_CPU_INLINE bool vany_ne(const VecF<W>& v, float s) {
  bool any = false;
  for (int i = 0; i < W; ++i) any |= v[i] != s;
  return any;
}

// Polynomial for 2^f on f in [-1/2, 1/2], degree 6. Coefficients: a least-squares fit of the
// relative error, iteratively reweighted towards the minimax solution (Lawson), rounded to
// float32. Evaluated in float32 the maximum relative error is below 1e-7 (under 1.7 ulp),
// the same as the degree-7 Taylor series, one multiply-add cheaper.
namespace exp2_detail {
constexpr float kC1 = 0.6931471824645996f;
constexpr float kC2 = 0.24022646248340607f;
constexpr float kC3 = 0.05550328642129898f;
constexpr float kC4 = 0.009618489071726799f;
constexpr float kC5 = 0.0013399930903688073f;
constexpr float kC6 = 0.00015345810970757157f;
// Adding then subtracting 1.5 * 2^23 rounds a float of magnitude < 2^22 to an integer
// (round to nearest even, the default mode).
constexpr float kRoundMagic = 12582912.0f;
// Below this the result is flushed to 0; keeps 2^n a normal float.
constexpr float kMinExponent = -125.0f;
constexpr float kMaxExponent = 127.0f;
}  // namespace exp2_detail

// x = 2^x lane-wise. Exact 0 for x < -125 (and for -inf, the masked-score value); NaN stays
// NaN, so that a NaN score reaches its row's sum and output as it does in torch (SEMANTICS.md,
// "Non-finite inputs"). The mask that flushes to 0 keeps NaN (`!(x < min)`), the clamps put the
// bound first (`bound > x ? bound : x` returns x when x is NaN), and a NaN n converts to the
// integer 0x80000000 (x86; 0 on Arm), whose shift by 23 adds 0 to the NaN's bits. With AVX2
// this is the same 33 instructions as the NaN-dropping version (GCC 12: the `x < min` compare
// now serves both the clamp and the flush; a pand became a blend with zero).
template <int W>
FLASHATTN_CPU_INLINE void vexp2_inplace(VecF<W>& x) {
  using namespace exp2_detail;
  using F = VecF<W>;
  using I = VecI<W>;
  const I keep = ~(x < kMinExponent);  // NaN: kept
  const F lo = kMinExponent - F{};
  const F hi = kMaxExponent - F{};
  F xc = x;
  xc = lo > xc ? lo : xc;
  xc = hi < xc ? hi : xc;
  const F n = (xc + kRoundMagic) - kRoundMagic;
  const F f = xc - n;  // in [-1/2, 1/2]
  F p = f * kC6 + kC5;
  p = p * f + kC4;
  p = p * f + kC3;
  p = p * f + kC2;
  p = p * f + kC1;
  p = p * f + 1.0f;
  // Scale by 2^n by adding n to the exponent field.
  const I bits = __builtin_bit_cast(I, p) + (__builtin_convertvector(n, I) << 23);
  x = __builtin_bit_cast(F, bits & keep);
}

// Odd polynomial for tanh on |y| < kSmall: tanh(y) = y + y^3 * Q(y^2), Q of degree 4 (a
// relative-error least-squares fit reweighted towards minimax, rounded to float32). Measured in
// float32: below 0.8 ulp on [0, kSmall).
namespace tanh_detail {
constexpr float kSmall = 0.625f;
constexpr float kQ0 = -0.3333328068256378f;
constexpr float kQ1 = 0.13331441581249237f;
constexpr float kQ2 = -0.05373971536755562f;
constexpr float kQ3 = 0.0206390880048275f;
constexpr float kQ4 = -0.00570498825982213f;
constexpr float kTwoLog2e = 2.88539008177792681f;  // 2 * log2(e)
}  // namespace tanh_detail

// y = tanh(y) lane-wise, within about 2 ulp: the polynomial above for |y| < 0.625, else
// 1 - 2 / (e^(2|y|) + 1) (no cancellation there: the subtracted term is below 0.45), with the
// sign of y restored; NaN stays NaN.
template <int W>
FLASHATTN_CPU_INLINE void vtanh_inplace(VecF<W>& y) {
  using namespace tanh_detail;
  using F = VecF<W>;
  using I = VecI<W>;
  const I bits = __builtin_bit_cast(I, y);
  const F a = __builtin_bit_cast(F, bits & 0x7fffffff);
  const F z = a * a;
  F q = z * kQ4 + kQ3;
  q = q * z + kQ2;
  q = q * z + kQ1;
  q = q * z + kQ0;
  const F small = a + (a * z) * q;
  F e = a * kTwoLog2e;
  vexp2_inplace<W>(e);
  const F large = 1.0f - 2.0f / (e + 1.0f);
  F t = a < kSmall ? small : large;
  t = a == a ? t : a;  // NaN
  y = __builtin_bit_cast(F, __builtin_bit_cast(I, t) | (bits & static_cast<int32_t>(0x80000000u)));
}

}  // namespace flashattn::cpu
