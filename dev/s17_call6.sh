#!/usr/bin/env bash
# s17 call 6 (written, not run; < 300 s, from the repo root): the fused d64 / d128 backward with LSE
# read before S^T / dP^T are issued (-DFLASHATTN_DEV_SM90_BWD_LSE_FIRST; ncu at d64 4 x 32 x 4k: the
# first exponentials' FFMAs waited 12% of the samples on the LSE loads, which returned behind the
# products' operand traffic) against the default: two d64;128 bf16 packages, test_cuda
# (backward cases) under sm90 on lse, bench.py d64 / d128 at 2k / 16k (cuDNN in each process)
# base, lse, base, lse.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs
declare -A flags=([base]="" [lse]="-DFLASHATTN_DEV_SM90_BWD_LSE_FIRST")
for v in base lse; do
  CMAKE_BUILD_PARALLEL_LEVEL=8 timeout 200 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/m-$v \
    -Cbuild-dir=/tmp/bm-$v -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 "-Ccmake.define.CMAKE_CUDA_FLAGS=${flags[$v]}" . > /tmp/logs/pip-$v.log 2>&1 &
done
wait; for v in base lse; do [ -d /tmp/m-$v/flashattn ] || { echo "build $v failed"; exit 1; }; done; t built
FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/m-lse timeout 80 python3 -m pytest tests/python/test_cuda.py -q -p no:cacheprovider \
  -k "backward or grad" > /tmp/logs/py.log 2>&1; echo "test_cuda sm90 lse: $(tail -1 /tmp/logs/py.log)"; t tested
for v in base lse base2 lse2; do
  PYTHONPATH=/tmp/m-${v%2} timeout 60 python3 bench/bench.py --suite issue3 --impls flashattn,sdpa_cudnn --dtypes bf16 \
    --head-dims 64,128 --seqlens 2048,16384 --repeats 10 --out $OUT/b-$v.json > /tmp/logs/b-$v.log 2>&1
  t "$v"; grep -E "^bf16" /tmp/logs/b-$v.log | sed -E 's/ +/ /g' | cut -c1-120
done
