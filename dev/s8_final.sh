#!/usr/bin/env bash
# Eighth session, last GPU call: main with the block-sparse Hopper forward merged: build d64/128
# bf16 with tests; the sparse, bias, fp8, correctness and special suites under sm90 and the
# sparse suite under the default dispatch; sanitizers on the sparse kernel; pytest; block-sparse
# timing against FlexAttention; host time.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/pk \
  -Cbuild-dir=/tmp/bb -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 -Ccmake.define.FLASHATTN_BUILD_TESTS=ON . > /tmp/pip.log 2>&1 \
  || { grep -E "error" /tmp/pip.log | head; exit 1; }
t "package built"
cmake --build /tmp/bb -j 16 > /tmp/gt.log 2>&1 || grep -E "error" /tmp/gt.log | head -5
t "gtests built"
export PYTHONPATH=/tmp/pk
(FLASHATTN_CUDA_PATH=sm90 ctest --test-dir /tmp/bb -j 6 --timeout 110 -L "sparse|bias|fp8|correctness|special" > /tmp/ct-sm90.log 2>&1
 echo "ctest sm90 sparse|bias|fp8|correctness|special: $(grep -E 'tests passed|tests failed' /tmp/ct-sm90.log)"
 grep -E "\(Failed\)|Timeout|SEGFAULT|Exception" /tmp/ct-sm90.log) &
(ctest --test-dir /tmp/bb -j 2 --timeout 110 -L "sparse" > /tmp/ct-auto.log 2>&1
 echo "ctest auto sparse: $(grep -E 'tests passed|tests failed' /tmp/ct-auto.log)"
 grep -E "\(Failed\)|Timeout|SEGFAULT|Exception" /tmp/ct-auto.log) &
wait; t "ctest"
SP=$(find /tmp/bb -name flashattn_test_sparse -type f | head -1)
C=All/SparseSm90.MatchesReference
F=$C/sm90_varlen_lists_causal_ragged:$C/sm90_dense_64x192_window:$C/sm90_lists_128x64_softcap_alibi_gqa
for tool in synccheck racecheck memcheck; do
  FLASHATTN_CUDA_PATH=sm90 timeout 60 compute-sanitizer --tool $tool $SP \
    --gtest_filter="$F" > /tmp/san-$tool.txt 2>&1
  echo "$tool: rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san-$tool.txt | tail -1) ok $(grep -c 'OK \]' /tmp/san-$tool.txt)"
done; t "sanitizers"
timeout 120 python3 -m pytest tests/python/test_block_sparse.py tests/python/test_host_path.py -q -p no:cacheprovider 2>&1 | tail -2
FLASHATTN_CUDA_PATH=sm90 timeout 60 python3 -m pytest tests/python/test_block_sparse.py -q -p no:cacheprovider 2>&1 | tail -1
t "pytest"
timeout 170 python3 bench/bench.py --suite sparse --block-density 1,0.25,0.108 --impls flashattn,flex --repeats 10 \
  --out $OUT/sparse.json 2>&1 | grep -E "^bf16|wrote|Error|error" | head -8
t "sparse bench"
timeout 70 python3 bench/host_time.py --calls 300 --rounds 3 --out $OUT/host-time.json 2>&1 | grep -E "cache|flash_attn_func |sdpa_cudnn |kvcache |train" | head -14
t "host time"
