// Instruction-set configurations of the CPU kernels and the runtime choice between them.
//
// The kernels are compiled once per configuration (functions with a `target` attribute, see
// simd.h), and the fastest one the running CPU supports is picked at run time, so the library
// itself is built with the compiler's default flags. FLASHATTN_CPU_ISA=generic|avx2|avx512
// forces a lower one (for tests of every path); a request above what the CPU has is capped.
#pragma once

#include <cstdlib>
#include <cstring>

namespace flashattn::cpu {

enum class CpuIsa { kGeneric = 0, kAvx2 = 1, kAvx512 = 2 };

// Register blocking of the matrix micro-kernel (gemm.h): kTileRows rows of A times
// kTileVecs * kWidth columns of B held in kTileRows * kTileVecs vector accumulators.
// The numbers keep accumulators + B row + broadcast within the register file: 16 registers
// for SSE2 and AVX2, 32 for AVX-512.
struct GenericIsa {  // SSE2 on x86-64 (or the target's baseline vectors elsewhere)
  static constexpr int kWidth = 4;
  static constexpr int kTileRows = 6;
  static constexpr int kTileVecs = 2;
};
struct Avx2Isa {  // AVX2 + FMA: 6 x 16 floats in 12 ymm accumulators
  static constexpr int kWidth = 8;
  static constexpr int kTileRows = 6;
  static constexpr int kTileVecs = 2;
};
struct Avx512Isa {  // AVX-512 F/BW/DQ/VL: 6 x 64 floats in 24 zmm accumulators
  static constexpr int kWidth = 16;
  static constexpr int kTileRows = 6;
  static constexpr int kTileVecs = 4;
};

// The widest vector of any configuration; scratch buffers are padded to it.
constexpr int kMaxWidth = 16;

#if defined(__x86_64__) || defined(_M_X64)
#define FLASHATTN_CPU_X86 1
#define FLASHATTN_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define FLASHATTN_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))
#else
#define FLASHATTN_CPU_X86 0
#endif

inline CpuIsa detect_cpu_isa() {
  CpuIsa best = CpuIsa::kGeneric;
#if FLASHATTN_CPU_X86
  __builtin_cpu_init();
  // __builtin_cpu_supports also checks that the OS saves the wider registers (XCR0).
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = CpuIsa::kAvx2;
  if (best == CpuIsa::kAvx2 && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl")) {
    best = CpuIsa::kAvx512;
  }
#endif
  const char* env = std::getenv("FLASHATTN_CPU_ISA");
  if (env != nullptr) {
    CpuIsa wanted = best;
    if (std::strcmp(env, "generic") == 0) wanted = CpuIsa::kGeneric;
    if (std::strcmp(env, "avx2") == 0) wanted = CpuIsa::kAvx2;
    if (std::strcmp(env, "avx512") == 0) wanted = CpuIsa::kAvx512;
    if (static_cast<int>(wanted) < static_cast<int>(best)) best = wanted;
  }
  return best;
}

// The configuration used by this process (detected once).
inline CpuIsa cpu_isa() {
  static const CpuIsa isa = detect_cpu_isa();
  return isa;
}

}  // namespace flashattn::cpu
