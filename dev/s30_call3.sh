#!/usr/bin/env bash
# s30 call 3: the cluster merge at 8 splits where the grid is small (launch_fwd's rule): tests
# (C++ bitwise merges, Python decode / KV cache / FP8 cache / sinks), the decode suites (bf16 and
# e4m3 caches) with cuDNN in the same process, and the merge A/B at the capped split counts.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT/logs; L=$OUT/logs; R=$(pwd); T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
C=${COMMIT:-x}
( cmake -S . -B build-c -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA_ARCHITECTURES=90 \
    "-DFLASHATTN_CUDA_HEAD_DIMS=128" -DFLASHATTN_CUDA_DTYPES=bf16 > $L/cmake.log 2>&1 &&
  cmake --build build-c -j 8 -t flashattn_test_special flashattn_test_kvcache flashattn_test_fp8 >> $L/cmake.log 2>&1
  echo "cmake rc $?" >> $L/cmake.log ) &
CB=$!
CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install --no-build-isolation --no-deps -q -Cbuild-dir=build-py \
  -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128 \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . > $L/pip.log 2>&1
stamp "pip rc $?"
cd /tmp
timeout 240 python3 $R/bench/bench.py --suite decode --repeats 20 \
  --out $OUT/h200-2026-12-04-decode-$C.json > $L/bench_decode.log 2>&1; stamp "bench decode rc $?"
grep "^decode" $L/bench_decode.log
wait $CB; stamp "cmake: $(tail -1 $L/cmake.log)"
G=$R/build-c/tests/cpp
( timeout 200 $G/flashattn_test_special --gtest_filter='*FusedSplitCombine*:*SplitKv*:*SeqlenOne*:*Decode*' > $L/gt_special.log 2>&1; echo "rc $?" >> $L/gt_special.log ) &
( timeout 200 $G/flashattn_test_kvcache > $L/gt_kvcache.log 2>&1; echo "rc $?" >> $L/gt_kvcache.log ) &
( timeout 200 python3 -m pytest -q -x $R/tests/python/test_cuda.py -k "decode or split or graph or kvcache" > $L/pytest_cuda.log 2>&1; echo "rc $?" >> $L/pytest_cuda.log ) &
( timeout 200 python3 -m pytest -q $R/tests/python/test_kvcache.py $R/tests/python/test_sink.py > $L/pytest_kv.log 2>&1; echo "rc $?" >> $L/pytest_kv.log ) &
( timeout 200 python3 -m pytest -q $R/tests/python/test_fp8.py -k "kvcache" > $L/pytest_fp8.log 2>&1; echo "rc $?" >> $L/pytest_fp8.log ) &
( timeout 200 $G/flashattn_test_fp8 --gtest_filter='*Cache*:*cache*' > $L/gt_fp8.log 2>&1; echo "rc $?" >> $L/gt_fp8.log ) &
wait; stamp "tests:"
for f in $L/gt_*.log; do echo "$(basename $f): $(grep -E '^\[  (PASSED|FAILED)' $f | tr '\n' ' ') $(tail -1 $f)"; done
for f in $L/pytest_*.log; do echo "$(basename $f): $(tail -2 $f | tr '\n' ' ')"; done
grep -hE "^\[  FAILED|^FAILED|Failure" $L/gt_*.log $L/pytest_*.log | head -10
timeout 240 python3 $R/bench/bench.py --suite decode --kv-dtype fp8 --repeats 20 \
  --out $OUT/h200-2026-12-04-decode-fp8-$C.json > $L/bench_fp8.log 2>&1; stamp "bench fp8 rc $?"
grep "^decode" $L/bench_fp8.log
timeout 100 python3 $R/dev/decode_splits.py --shapes 1x4096,2x4096,4x4096,1x8192 --splits 0,16 --merges cluster,counter \
  --passes 2 --repeats 30 --out $OUT/s30-merge-capped.json 2>&1 | grep -v Warn
stamp done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
