#!/usr/bin/env bash
# Fourteenth session (s14), GPU call 4 (one H200, within what is left of the session's device time):
# the C++ suite under FLASHATTN_CUDA_PATH=sm90 (not run since the eleventh session's 499 cases):
# a CMake build at d64;128;192;256, bf16 and fp16, then ctest without the `large` label. Writes
# $OUT/ctest.log.gz.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
LIMIT=${LIMIT:-540}
cap() { local left=$(( LIMIT - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT"
cmake -S . -B /tmp/bc -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA_ARCHITECTURES=90 \
  "-DFLASHATTN_CUDA_HEAD_DIMS=64;128;192;256" "-DFLASHATTN_CUDA_DTYPES=bf16;fp16" > /tmp/build.log 2>&1 &&
  timeout "$(cap 300)" cmake --build /tmp/bc -j 16 >> /tmp/build.log 2>&1
rc=$?; t "build rc $rc"
[ $rc = 0 ] || { tail -30 /tmp/build.log; gzip -c /tmp/build.log > $OUT/build.log.gz; exit 1; }
FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 400)" ctest --test-dir /tmp/bc -j 6 -LE '^(large|install)$' > /tmp/ctest.log 2>&1
t "ctest rc $?"
gzip -c /tmp/ctest.log > $OUT/ctest.log.gz
grep -E "tests passed|tests failed|Total Test time" /tmp/ctest.log; grep -E "\*\*\*Failed|\*\*\*Timeout|Not Run" /tmp/ctest.log | head -20
