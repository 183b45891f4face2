#!/usr/bin/env bash
# s32 call 3 (GPU machine): issue 15, the next tile's work taken under the last P V (kTakeAhead)
# against main's order (-DFLASHATTN_DEV_SM90_FWD_NO_TAKE_AHEAD): three packages in parallel (base,
# new, new traced), test_cuda.py under sm90 on new, the per-tile trace, then one forward pass of
# each package against cuDNN (PASS=1; call 4 runs PASS=2 in the other order on the warm machine).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
pipb() {  # name dims [cuda flags]
  CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-$1 \
    -Cbuild-dir=build-ab-$1 -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS="$2" \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 ${3:+-Ccmake.define.CMAKE_CUDA_FLAGS="$3"} . >"$OUT/pip-$1.log" 2>&1
  echo "pip $1 rc=$? $(el)"
}
bench() {  # name
  PYTHONPATH=/tmp/ab-$1 python3 bench/bench.py --suite full --impls flashattn,sdpa_cudnn --dtypes bf16 --no-backward \
    --head-dims 64,128,256 --seqlens 512,1024,2048,16384 --repeats 20 --out "$OUT/ab-$1-$PASS.json" 2>&1 |
    grep -E "^bf16 |error" | sed "s/^/$1 /"
}
if [ "${BUILD:-1}" = 1 ]; then
  pipb base "64;128;256" -DFLASHATTN_DEV_SM90_FWD_NO_TAKE_AHEAD &
  pipb new "64;128;256" &
  pipb tr "64;128" -DFLASHATTN_DEV_FWD_TRACE &
  wait
  grep -h "C751" "$OUT"/pip-*.log | sort | uniq -c | head -5
  echo "== test_cuda (sm90) on new $(el)"
  FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/ab-new timeout 200 python3 -m pytest tests/python/test_cuda.py -q -x \
    -p no:cacheprovider >"$OUT/test-new-sm90.log" 2>&1; echo "rc=$? $(tail -1 "$OUT/test-new-sm90.log") $(el)"
  echo "== trace $(el)"
  ( cd dev && PYTHONPATH=/tmp/ab-tr timeout 120 python3 fwd_trace.py --shapes 4x32x1024x64:causal,8x16x512x128,8x16x1024x128 ) >"$OUT/trace.txt" 2>&1
  echo "trace rc=$?"; grep -v "^  nb [3567]" "$OUT/trace.txt" | tail -20
fi
echo "== bench pass ${PASS:=1} $(el)"
if [ "$PASS" = 1 ]; then bench base; bench new; else bench new; bench base; fi
echo "done $(el)"
