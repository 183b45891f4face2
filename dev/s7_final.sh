#!/usr/bin/env bash
# Seventh session, last GPU call: main + the FP8 forward branch, d64/128/192/256 bf16 with tests:
# ctest under sm90 and auto (the d192/d256 backward after this session's changes, FP8), pytest
# test_fp8/test_cuda, FP8 sanitizers, then FP8 forward timing against bf16 and cuDNN.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/pk \
  -Cbuild-dir=/tmp/bb -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128;192;256" \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 -Ccmake.define.FLASHATTN_BUILD_TESTS=ON . > /tmp/pip.log 2>&1 || { grep -E "error" /tmp/pip.log | head; exit 1; }
t "package built"
cmake --build /tmp/bb -j 16 > /tmp/gt.log 2>&1 || { grep -E "error" /tmp/gt.log | head; }
t "gtests built"
export PYTHONPATH=/tmp/pk
(FLASHATTN_CUDA_PATH=sm90 ctest --test-dir /tmp/bb -j 6 --timeout 100 -L "correctness|special|head_dim_v|fp8" > /tmp/ct-sm90.log 2>&1; echo "ctest sm90: $(grep -E 'tests passed|tests failed' /tmp/ct-sm90.log)"; grep -E "\(Failed\)|Timeout" /tmp/ct-sm90.log | head -8) &
(ctest --test-dir /tmp/bb -j 4 --timeout 100 -L "correctness|fp8|kvcache|sink|c_api" > /tmp/ct-auto.log 2>&1; echo "ctest auto: $(grep -E 'tests passed|tests failed' /tmp/ct-auto.log)"; grep -E "\(Failed\)|Timeout" /tmp/ct-auto.log | head -8) &
(timeout 200 python3 -m pytest tests/python/test_fp8.py tests/python/test_cuda.py -q -p no:cacheprovider > /tmp/pt.log 2>&1; echo "pytest fp8+cuda: $(tail -1 /tmp/pt.log)"; grep -E "^FAILED|^ERROR" /tmp/pt.log | head -6) &
wait
t "tests done"
B=/tmp/bb/tests/cpp
for tool in memcheck racecheck synccheck; do
  FLASHATTN_CUDA_PATH=sm90 timeout 40 compute-sanitizer --tool $tool --error-exitcode 9 $B/flashattn_test_fp8 \
    --gtest_filter='Cuda/Fp8CudaForward.d128_gqa:Cuda/Fp8CudaForward.d128_window' > /tmp/san-$tool.log 2>&1
  echo "fp8 $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san-$tool.log | tail -1) $(grep -E '^\[  (PASSED|FAILED) ' /tmp/san-$tool.log | head -1)"
done
t "fp8 bench"
timeout 120 python3 bench/bench.py --suite full --dtypes bf16 --head-dims 64,128,256 --seqlens 4096,16384 \
  --impls flashattn,flashattn_fp8,sdpa_cudnn --no-backward --repeats 20 --out $OUT/fp8-fwd.json 2>&1 | grep -E "^bf16|error|fp8" | head -16
t done
