#!/usr/bin/env bash
# s32 call 5 (GPU machine): issue 15, the tile coordinates by multiply-shift divisors (FastDiv)
# with and without taking the next tile under the last P V. Packages: base = main at 3dc0214
# (carried in .carry/base), fd = FastDiv (-DFLASHATTN_DEV_SM90_FWD_NO_TAKE_AHEAD), fdta = the
# tree's default (both). test_cuda (sm90) and test_fp8 on fdta, then the forward against cuDNN,
# each package twice in alternating order.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=/tmp/s32logs; mkdir -p $L
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
pipb() {  # name tree [cuda flags]
  ( cd "$2" && CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-$1 \
    -Cbuild-dir=build-ab-$1 -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128;256" \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 ${3:+-Ccmake.define.CMAKE_CUDA_FLAGS="$3"} . >"$L/pip-$1.log" 2>&1 )
  echo "pip $1 rc=$? $(el)"
}
bench() {  # name pass
  PYTHONPATH=/tmp/ab-$1 python3 bench/bench.py --suite full --impls flashattn,sdpa_cudnn --dtypes bf16 --no-backward \
    --head-dims 64,128,256 --seqlens 512,1024,2048,16384 --repeats 20 --out "$OUT/ab-$1-$2.json" 2>&1 |
    grep -E "^bf16 |error" | sed "s/^/$1 /"
}
pipb base .carry/base &
pipb fd . -DFLASHATTN_DEV_SM90_FWD_NO_TAKE_AHEAD &
pipb fdta . &
wait
grep -h "C751" $L/pip-*.log | sort | uniq -c | head -5
echo "== tests on fdta $(el)"
FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/ab-fdta timeout 150 python3 -m pytest tests/python/test_cuda.py -q -x \
  -p no:cacheprovider >$L/test-cuda-fdta.log 2>&1; echo "test_cuda sm90 rc=$? $(tail -1 $L/test-cuda-fdta.log) $(el)"
PYTHONPATH=/tmp/ab-fdta timeout 120 python3 -m pytest tests/python/test_fp8.py -q -x -p no:cacheprovider \
  >$L/test-fp8-fdta.log 2>&1; echo "test_fp8 rc=$? $(tail -1 $L/test-fp8-fdta.log) $(el)"
echo "== bench $(el)"
for n in base fd fdta; do bench $n 1; done
for n in fdta fd base; do bench $n 2; done
tar -czf "$OUT/logs.tar.gz" -C $L .
echo "done $(el)"
