#!/usr/bin/env bash
# s30 call 6: the whole C++ suite (d128 bf16 sm_90 build, ctest without the `large` label) on
# the default dispatch, with the decode kernels' cluster merge.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; T0=$(date +%s)
cmake -S . -B build-c -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA_ARCHITECTURES=90 \
  "-DFLASHATTN_CUDA_HEAD_DIMS=128" -DFLASHATTN_CUDA_DTYPES=bf16 > $OUT/build.log 2>&1 &&
  cmake --build build-c -j 16 >> $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "[$(( $(date +%s) - T0 )) s] built"
timeout 400 ctest --test-dir build-c -j 8 -LE large --timeout 300 > $OUT/ctest.log 2>&1
echo "[$(( $(date +%s) - T0 )) s] ctest rc $?"
grep -E "tests passed|tests failed|Total Test time" $OUT/ctest.log
grep -E "\*\*\*Failed|\*\*\*Timeout|Exception" $OUT/ctest.log | head -20
gzip -f $OUT/ctest.log $OUT/build.log
