// Global loads with a placement the compiler keeps.
#pragma once

#include <cstdint>

namespace flashattn::ptx {

// A read-only 32-bit global load issued exactly here: the asm is volatile, so the compiler
// neither merges it with an earlier load of the same address (which would keep that value in a
// register until here) nor moves it. For values that are cheaper to read again after a loop
// than to hold across it. No "memory" clobber: other memory operations may still move past it.
__device__ __forceinline__ int32_t ld_global_nc_here(const int32_t* p) {
  int32_t v;
  asm volatile("ld.global.nc.b32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}

}  // namespace flashattn::ptx
