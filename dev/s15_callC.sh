#!/usr/bin/env bash
# s15 call C (< 420 s): the 192/128 backward's third stage (-DFLASHATTN_DEV_SM90_BWD_DV_STAGES=3,
# next-list item 5) against the default two, head dim 192 bf16 packages built side by side;
# test_cuda -k head_dim_v under sm90 on st3; bench dsv3 2k/4k/8k base, st3, base (own processes).
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs
declare -A flags=([base]="" [st3]="-DFLASHATTN_DEV_SM90_BWD_DV_STAGES=3")
for v in base st3; do
  CMAKE_BUILD_PARALLEL_LEVEL=8 timeout 240 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/dv-$v \
    -Cbuild-dir=/tmp/bdv-$v -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=192 \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 "-Ccmake.define.CMAKE_CUDA_FLAGS=${flags[$v]}" . > /tmp/logs/pip-$v.log 2>&1 &
done
wait; for v in base st3; do [ -d /tmp/dv-$v/flashattn ] || { echo "build $v failed"; grep error /tmp/logs/pip-$v.log | head -5; exit 1; }; done
t built
FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/dv-st3 timeout 120 python3 -m pytest tests/python/test_cuda.py -q -p no:cacheprovider -k "head_dim_v" 2>&1 | tail -1
t tested
for v in base st3 base2; do
  PYTHONPATH=/tmp/dv-${v%2} timeout 90 python3 bench/bench.py --suite dsv3 --impls flashattn,sdpa_cudnn --dtypes bf16 \
    --seqlens 2048,4096,8192 --repeats 20 --out $OUT/dv-$v.json > /tmp/logs/b-$v.log 2>&1; t "bench $v rc $?"
  grep -E "^bf16" /tmp/logs/b-$v.log | cut -c1-150
done
