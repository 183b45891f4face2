#!/usr/bin/env bash
# s32 call 1 (GPU machine): three builds in parallel, then issue 15's per-tile forward trace and
# issue 17's split sweep (dense and paged). Call 2 reuses build-f (FP8 cache at 64/256 + ctest).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
pipb() {  # target build-dir dims [cuda flags]
  CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target "$1" \
    -Cbuild-dir="$2" -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS="$3" \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 ${4:+-Ccmake.define.CMAKE_CUDA_FLAGS="$4"} . >"$OUT/pip-$(basename "$1").log" 2>&1
}
pipb /tmp/a build-a 128 & pa=$!
pipb /tmp/tr build-tr "64;128" -DFLASHATTN_DEV_FWD_TRACE & pt=$!
( cmake -S . -B build-f -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA_ARCHITECTURES=90 \
    "-DFLASHATTN_CUDA_HEAD_DIMS=64;128;256" "-DFLASHATTN_CUDA_DTYPES=bf16;fp16" >"$OUT/build-f.log" 2>&1 &&
  cmake --build build-f -j 16 --target flashattn_test_fp8 flashattn_test_c_api flashattn_test_memory >>"$OUT/build-f.log" 2>&1
  echo "build-f rc=$? $(el)" ) &
pf=$!
wait $pa; echo "pip a rc=$? $(el)"; wait $pt; echo "pip tr rc=$? $(el)"; wait $pf
grep -h "spill\|C751" "$OUT"/pip-*.log "$OUT/build-f.log" | grep -v " 0 bytes spill" | sort | uniq -c | head -5
echo "== trace $(el)"
( cd dev && PYTHONPATH=/tmp/tr timeout 150 python3 fwd_trace.py --shapes 4x32x1024x64:causal,8x16x512x128,8x16x1024x128 ) >"$OUT/trace.txt" 2>&1
echo "trace rc=$?"; tail -60 "$OUT/trace.txt"
echo "== splits $(el)"
PYTHONPATH=/tmp/a timeout 150 python3 dev/decode_splits.py --shapes 1x131072,8x65536,8x131072,4x4096 \
  --splits 0,4,6,8,11,32,33,49 --out "$OUT/splits-dense.json" 2>&1 | tail -6
echo "== paged $(el)"
PYTHONPATH=/tmp/a timeout 120 python3 dev/decode_splits.py --page-size 16 --shapes 1x131072,8x65536,4x4096,1x4096 \
  --splits 0,4,6,8,11,16,32,49 --out "$OUT/splits-paged16.json" 2>&1 | tail -6
echo "done $(el)"
