#!/usr/bin/env bash
# Written in the ninth session for the next one (dev/NOTES.md, "Measurements written for the next
# GPU session", item 1): is the Hopper backward's racecheck report the lane-0 stage release?
# Two CMake builds of d128 bf16 (main, and FLASHATTN_DEV_SM90_BWD_SYNCWARP_RELEASE) with the
# sparse and correctness test binaries; racecheck on two SparseSm90Bwd cases and on the dense
# bf16 d128 backward cases of the correctness suite under sm90, each build. If the macro build is
# quiet, its cost is a separate A/B (bench.py needs the Python package): dev/ab.sh "64,128"
# "1024,4096,16384" "base=" "sw=-DFLASHATTN_DEV_SM90_BWD_SYNCWARP_RELEASE" with
# IMPLS=flashattn,sdpa_cudnn. Writes $OUT/rc-{base,sw}-{sparse,dense}.txt.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT"
for v in "base=" "sw=-DFLASHATTN_DEV_SM90_BWD_SYNCWARP_RELEASE"; do
  n=${v%%=*} f=${v#*=}
  ( cmake -S . -B /tmp/rc-$n -DFLASHATTN_CUDA_ARCHITECTURES=90 -DFLASHATTN_CUDA_HEAD_DIMS=128 -DFLASHATTN_CUDA_DTYPES=bf16 \
      -DFLASHATTN_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_FLAGS=$f" > /tmp/rc-$n.log 2>&1 \
    && cmake --build /tmp/rc-$n -j 8 --target flashattn_test_sparse flashattn_test_correctness >> /tmp/rc-$n.log 2>&1 \
    || { echo "$n build failed"; grep error /tmp/rc-$n.log | head -5; } ) &
done
wait; t "built"
C='*SparseSm90Bwd.MatchesReference/sm90bwd_'
SPARSE="${C}varlen_lists_causal_ragged:${C}lists_96x80_mixed_mask_gqa"
for n in base sw; do
  SP=$(find /tmp/rc-$n -name flashattn_test_sparse -type f | head -1)
  CO=$(find /tmp/rc-$n -name flashattn_test_correctness -type f | head -1)
  FLASHATTN_CUDA_PATH=sm90 timeout 120 compute-sanitizer --tool racecheck --print-limit 10 $SP --gtest_filter="$SPARSE" \
    > $OUT/rc-$n-sparse.txt 2>&1
  echo "$n sparse bwd racecheck: $(grep -E 'RACECHECK SUMMARY' $OUT/rc-$n-sparse.txt | tail -1) ok $(grep -c 'OK \]' $OUT/rc-$n-sparse.txt)"
  FLASHATTN_CUDA_PATH=sm90 timeout 120 compute-sanitizer --tool racecheck --print-limit 10 $CO \
    --gtest_filter='All/Correctness.MatchesReference/cuda_*bf16_b*_d128_*_bwd' > $OUT/rc-$n-dense.txt 2>&1
  echo "$n dense racecheck: $(grep -E 'RACECHECK SUMMARY' $OUT/rc-$n-dense.txt | tail -1) ok $(grep -c 'OK \]' $OUT/rc-$n-dense.txt)"
done
t "racecheck"
