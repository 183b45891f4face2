#!/usr/bin/env bash
# s30 call 1 (device tool): build the C++ tests and the Python package (d128, bf16, sm_90) in
# parallel, run the split-KV decode tests (cluster / counter / kernel merges bitwise), then time
# the decode with the cluster merge against the counter merge in one process.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT/logs
L=$OUT/logs
T0=$(date +%s); R=$(pwd)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
( cmake -S . -B build-c -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA_ARCHITECTURES=90 \
    "-DFLASHATTN_CUDA_HEAD_DIMS=128" -DFLASHATTN_CUDA_DTYPES=bf16 > $L/cmake.log 2>&1 &&
  cmake --build build-c -j 8 -t flashattn_test_special flashattn_test_kvcache flashattn_test_fp8 >> $L/cmake.log 2>&1
  echo "cmake rc $?" >> $L/cmake.log ) &
CB=$!
CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install --no-build-isolation --no-deps -q -Cbuild-dir=build-py \
  -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128 \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . > $L/pip.log 2>&1
stamp "pip rc $?"; tail -3 $L/pip.log
grep -h "spill" build-py/*.log 2>/dev/null | head -2
cd /tmp
python3 - <<'PY'
import torch, flashattn
print("cluster build", flashattn._C._cuda_sm90_built(), torch.cuda.get_device_name())
PY
cd - > /dev/null
# Python tests (one process per file) while the C++ build finishes.
( cd /tmp && timeout 300 python3 -m pytest -q -x $R/tests/python/test_cuda.py -k "decode or split or graph or kvcache" > $L/pytest_cuda.log 2>&1; echo "rc $?" >> $L/pytest_cuda.log ) &
P1=$!
( cd /tmp && timeout 300 python3 -m pytest -q $R/tests/python/test_kvcache.py $R/tests/python/test_sink.py > $L/pytest_kv.log 2>&1; echo "rc $?" >> $L/pytest_kv.log ) &
P2=$!
( cd /tmp && timeout 300 python3 -m pytest -q $R/tests/python/test_fp8.py -k "kvcache" > $L/pytest_fp8.log 2>&1; echo "rc $?" >> $L/pytest_fp8.log ) &
P3=$!
wait $CB; stamp "cmake done: $(tail -1 $L/cmake.log)"
G=build-c/tests/cpp
timeout 240 $G/flashattn_test_special --gtest_filter='*FusedSplitCombine*:*SplitKv*:*SeqlenOne*:*Decode*' > $L/gt_special.log 2>&1; stamp "gt special rc $? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' $L/gt_special.log | tr '\n' ' ')"
timeout 240 $G/flashattn_test_kvcache > $L/gt_kvcache.log 2>&1; stamp "gt kvcache rc $? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' $L/gt_kvcache.log | tr '\n' ' ')"
timeout 240 $G/flashattn_test_fp8 --gtest_filter='*Cache*:*cache*' > $L/gt_fp8.log 2>&1; stamp "gt fp8 rc $? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' $L/gt_fp8.log | tr '\n' ' ')"
grep -E "FAILED|Failure|error" $L/gt_*.log | head -20
wait $P1 $P2 $P3; stamp "pytest:"; for f in $L/pytest_*.log; do echo "$f: $(tail -2 $f | tr '\n' ' ')"; done
grep -E "^FAILED|Error" $L/pytest_*.log | head -10
# Sanitizers on the cluster merge (KV cache test: dense and paged, 3 / 16 / 36 / heuristic splits).
( timeout 200 compute-sanitizer --tool memcheck $G/flashattn_test_kvcache --gtest_filter='*FusedSplitCombine*' > $L/san_memcheck.log 2>&1; echo "rc $?" >> $L/san_memcheck.log ) &
S1=$!
( timeout 200 compute-sanitizer --tool racecheck $G/flashattn_test_kvcache --gtest_filter='*FusedSplitCombine*' > $L/san_racecheck.log 2>&1; echo "rc $?" >> $L/san_racecheck.log ) &
S2=$!
( timeout 200 compute-sanitizer --tool synccheck $G/flashattn_test_kvcache --gtest_filter='*FusedSplitCombine*' > $L/san_synccheck.log 2>&1; echo "rc $?" >> $L/san_synccheck.log ) &
S3=$!
wait $S1 $S2 $S3; stamp "sanitizers:"; for f in $L/san_*.log; do echo "$f: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' $f | tr '\n' ' ') $(tail -1 $f)"; done
# Decode timing: cluster vs counter merge, alternated in one process.
cd /tmp && timeout 200 python3 $R/dev/decode_splits.py --shapes 1x4096,1x16384,8x8192,1x131072,64x4096 \
  --splits 0,8,16 --merges cluster,counter --passes 2 --repeats 30 --out $OUT/s30-merge-ab.json 2>&1 | tee $L/merge_ab.log
cd - > /dev/null
stamp "done"
cd $OUT && tar czf logs.tgz logs && rm -rf logs
