#!/usr/bin/env bash
# compute-sanitizer over what merged this session without one: the fused split-KV combine's
# bitwise tests, the native 192/128 forward (HeadDimV cases, bf16) and the d192 backward
# (Correctness cases by name), under FLASHATTN_CUDA_PATH=sm90 where the Hopper kernels apply.
# Sized for the last ~4 device minutes of a session: memcheck of all three, racecheck of the combine.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
cmake -S . -B /tmp/bs -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA_ARCHITECTURES=90 \
  "-DFLASHATTN_CUDA_HEAD_DIMS=128;192" -DFLASHATTN_CUDA_DTYPES=bf16 >/tmp/bs.log 2>&1 &&
  cmake --build /tmp/bs -j 16 --target flashattn_test_special flashattn_test_head_dim_v flashattn_test_correctness >>/tmp/bs.log 2>&1 || { tail -20 /tmp/bs.log; exit 1; }
echo "build $(( $(date +%s) - start )) s"
b=/tmp/bs/tests/cpp
san() {  # tool path binary filter
  FLASHATTN_CUDA_PATH=$2 timeout 40 compute-sanitizer --tool $1 --error-exitcode 9 $b/$3 --gtest_filter="$4" >/tmp/san.log 2>&1
  echo "$1 $3 ($2): rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.log | tail -1) $(grep -E '^\[  (PASSED|FAILED) ' /tmp/san.log | head -1) [$(( $(date +%s) - start )) s]"
  grep -E '^\[  FAILED  \] [A-Z]|Invalid|Race reported' /tmp/san.log | head -3
}
corr='*cuda_g47_*:*cuda_g137_*:*cuda_e_dv_192_128_causal_bf16'
san memcheck auto flashattn_test_special '*FusedSplitCombine*/cuda'
san racecheck auto flashattn_test_special '*FusedSplitCombine*/cuda'
san memcheck sm90 flashattn_test_head_dim_v '*cuda_192_128_causal_gqa_bf16:*cuda_192_128_window_gqa_bf16'
san memcheck sm90 flashattn_test_correctness "$corr"
echo "total $(( $(date +%s) - start )) s"
