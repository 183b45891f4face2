#!/usr/bin/env bash
# Builds the dev/ harnesses with nvcc directly (no CMake), all cores, for quick GPU experiments.
# Usage: dev/build.sh OUTDIR "HEAD_DIMS" (e.g. dev/build.sh /tmp/dev "64 128")
set -euo pipefail
out=${1:-/tmp/flashattn-dev}
dims=${2:-"32 64 96 128 192 256"}
mkdir -p "$out/obj"
root=$(cd "$(dirname "$0")/.." && pwd)
defs="-DFLASHATTN_CUDA_DTYPE_FP16 -DFLASHATTN_CUDA_DTYPE_BF16 -DFLASHATTN_VERSION_STRING=\"dev\""
srcs=("$root"/src/cuda/*.cu "$root"/src/cuda/sm80/*.cu "$root"/dev/fwd_check.cu)
for d in $dims; do
  defs="$defs -DFLASHATTN_CUDA_HDIM_$d"
  srcs+=("$root"/src/cuda/instantiations/*_hdim${d}_*.cu)
done
host=("$root"/src/core/api.cpp "$root"/src/core/validate.cpp "$root"/src/cpu/*.cpp)
flags="-std=c++20 -O3 -I$root/include -I$root/src -DFLASHATTN_WITH_CUDA $defs ${DEV_FLAGS:-}"
nvflags="$flags -gencode arch=compute_90,code=sm_90 -lineinfo --expt-relaxed-constexpr -Xptxas=--warn-on-spills"
printf '%s\n' "${srcs[@]}" | xargs -P "$(nproc)" -I{} sh -c 'nvcc '"$nvflags"' -c {} -o '"$out"'/obj/$(basename {}).o'
for f in "${host[@]}"; do g++ $flags -I/usr/local/cuda/include -c "$f" -o "$out/obj/$(basename "$f").o" & done
wait
nvcc -o "$out/fwd_check" "$out"/obj/*.o -lpthread
echo "built $out/fwd_check"
