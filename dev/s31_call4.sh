#!/usr/bin/env bash
# s31 call 4 (session script, deleted at the session's end): the warp-0 __syncwarp fix of the
# split-key merge (e4m3 cache 128-key tiles, d256, bias tiles) under racecheck, and test_cuda's
# decode cluster test under FLASHATTN_CUDA_PATH=sm90 and auto. d128 bf16, sm_90.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/pkg \
  -Cbuild-dir=build-pkg -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128 \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . >/tmp/pip.log 2>&1 &
( cmake -S . -B build-c -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA_ARCHITECTURES=90 \
    -DFLASHATTN_CUDA_HEAD_DIMS=128 -DFLASHATTN_CUDA_DTYPES=bf16 >/tmp/cmake.log 2>&1 &&
  cmake --build build-c -j 8 --target flashattn_test_fp8 >>/tmp/cmake.log 2>&1 ) &
wait; echo "builds: $(( $(date +%s) - start )) s"
{
  for tool in racecheck memcheck; do
    compute-sanitizer --tool $tool --error-exitcode 9 build-c/tests/cpp/flashattn_test_fp8 \
      --gtest_filter='Cases/Fp8CudaCache.*' >/tmp/san-$tool.log 2>&1
    echo "$tool fp8 cache: exit $? ($(grep -cE 'ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards' /tmp/san-$tool.log) clean summaries): $(grep -E 'SUMMARY|PASSED|FAILED' /tmp/san-$tool.log | tr '\n' ' ')"
  done
  for path in sm90 auto; do
    echo "test_cuda decode ($path): $(FLASHATTN_CUDA_PATH=$path PYTHONPATH=/tmp/pkg python3 -m pytest -q -p no:cacheprovider tests/python/test_cuda.py -k "graph or decode or split" 2>&1 | tail -1)"
  done
  echo "test_fp8 cache: $(PYTHONPATH=/tmp/pkg python3 -m pytest -q -p no:cacheprovider tests/python/test_fp8.py -k cache 2>&1 | tail -1)"
} 2>&1 | tee "$OUT/call4.txt"
