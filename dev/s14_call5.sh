#!/usr/bin/env bash
# Fourteenth session (s14), GPU call 5 (< 220 s): the 16k causal rows alone, in fresh processes
# (the suite's tail runs at the power limit, s13): a d64;128 bf16 package, then d64 and d128 16k
# forward and backward (causal and not) against cuDNN, the peers in both orders. Writes $OUT/alone-*.json.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT"
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 120 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/pk \
  -Cbuild-dir=/tmp/b-pk -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . > /tmp/pip.log 2>&1 || { tail -20 /tmp/pip.log; exit 1; }
t built
for order in flashattn,sdpa_cudnn sdpa_cudnn,flashattn; do
  PYTHONPATH=/tmp/pk timeout 45 python3 bench/bench.py --suite full --dtypes bf16 --head-dims 64,128 --seqlens 16384 \
    --impls $order --repeats 10 --out $OUT/alone-${order%%,*}-first.json 2>&1 | grep -E "^bf16|rror"
  t "order $order"
done
