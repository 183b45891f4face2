#!/usr/bin/env bash
# Tenth session, second GPU call (one H200, 16 cores, < 560 s): main with the d64 backward's dQ
# column split as default (the fused kernel at d64 1k too) and d64's short-rows forward tile
# (FwdShortRowsTraits: masked launches of at most 1024 rows):
#  1. the d64/d128 bf16 package with tests, and (side by side) a CMake build of the d128 test
#     binaries with FLASHATTN_DEV_SM90_BWD_SYNCWARP_RELEASE (__syncwarp before the lane-0 stage
#     release of the Hopper backward);
#  2. pytest test_cuda.py under FLASHATTN_CUDA_PATH=sm90 and auto (a failure stops the timings);
#  3. bench.py full suite d64/d128 bf16 at 512..4k, forward and backward, against cuDNN;
#  4. racecheck of the sparse and dense Hopper backward on the SYNCWARP build (the ninth session's
#     main build reported 16 hazard sites on the sparse cases).
# Writes $OUT/bench.json, $OUT/logs.tgz, $OUT/summary.txt (the caller tees it).
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cap() { local left=$(( 560 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs
PIP="python3 -m pip install --no-build-isolation --no-deps -q"
(CMAKE_BUILD_PARALLEL_LEVEL=10 $PIP --target /tmp/pk -Cbuild-dir=/tmp/bb -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \
  "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . > /tmp/logs/pip.log 2>&1 \
  || { echo "package build failed"; grep -E "error" /tmp/logs/pip.log | head; }) &
( cmake -S . -B /tmp/rc -DFLASHATTN_CUDA_ARCHITECTURES=90 -DFLASHATTN_CUDA_HEAD_DIMS=128 -DFLASHATTN_CUDA_DTYPES=bf16 \
    -DFLASHATTN_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_FLAGS=-DFLASHATTN_DEV_SM90_BWD_SYNCWARP_RELEASE > /tmp/logs/rc.log 2>&1 \
  && cmake --build /tmp/rc -j 6 --target flashattn_test_sparse flashattn_test_correctness >> /tmp/logs/rc.log 2>&1 \
  || { echo "racecheck build failed"; grep error /tmp/logs/rc.log | head -5; } ) &
wait; t "built"
export PYTHONPATH=/tmp/pk
r1=$(FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 100)" python3 -m pytest tests/python/test_cuda.py -q -p no:cacheprovider 2>&1 | tee /tmp/logs/py-sm90.log | tail -1)
echo "test_cuda (sm90): $r1"
r2=$(timeout "$(cap 80)" python3 -m pytest tests/python/test_cuda.py -q -p no:cacheprovider 2>&1 | tee /tmp/logs/py-auto.log | tail -1)
echo "test_cuda (auto): $r2"
t "tests"
if echo "$r1 $r2" | grep -qE "failed|error" || ! echo "$r1" | grep -q passed; then
  grep -E "FAILED|Error" /tmp/logs/py-sm90.log /tmp/logs/py-auto.log | head -10; tar czf $OUT/logs.tgz -C /tmp/logs .; exit 1
fi
timeout "$(cap 120)" python3 bench/bench.py --suite full --dtypes bf16 --head-dims 64,128 --seqlens 512,1024,2048,4096 \
  --impls flashattn,sdpa_cudnn --repeats 20 --out $OUT/bench.json > /tmp/logs/bench.log 2>&1
t "bench"
SP=$(find /tmp/rc -name flashattn_test_sparse -type f | head -1)
CO=$(find /tmp/rc -name flashattn_test_correctness -type f | head -1)
C='*SparseSm90Bwd.MatchesReference/sm90bwd_'
FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 100)" compute-sanitizer --tool racecheck --print-limit 10 $SP \
  --gtest_filter="${C}varlen_lists_causal_ragged:${C}lists_96x80_mixed_mask_gqa" > /tmp/logs/rc-sw-sparse.txt 2>&1
echo "sparse bwd racecheck (syncwarp build): rc $? $(grep -E 'RACECHECK SUMMARY' /tmp/logs/rc-sw-sparse.txt | tail -1) ok $(grep -c 'OK \]' /tmp/logs/rc-sw-sparse.txt)"
FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 120)" compute-sanitizer --tool racecheck --print-limit 10 $CO \
  --gtest_filter='All/Correctness.MatchesReference/cuda_*bf16_b*_d128_*_bwd' > /tmp/logs/rc-sw-dense.txt 2>&1
echo "dense bwd racecheck (syncwarp build): rc $? $(grep -E 'RACECHECK SUMMARY' /tmp/logs/rc-sw-dense.txt | tail -1) ok $(grep -c 'OK \]' /tmp/logs/rc-sw-dense.txt)"
t "racecheck"
tar czf $OUT/logs.tgz -C /tmp/logs .
python3 dev/ab_table.py --figure fwd_tflops --peer sdpa_cudnn $OUT/bench.json 2>&1 | tail -20
python3 dev/ab_table.py --figure bwd_tflops --peer sdpa_cudnn $OUT/bench.json 2>&1 | tail -20
