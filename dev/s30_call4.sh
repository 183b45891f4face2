#!/usr/bin/env bash
# s30 call 4: paged caches keep the heuristic's split count; the decode suites again (bf16 and
# e4m3 caches, every peer) and the Python decode / KV-cache tests.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT/logs; L=$OUT/logs; R=$(pwd); T0=$(date +%s); C=${COMMIT:-x}
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -Cbuild-dir=build-py \
  -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128 \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . > $L/pip.log 2>&1
stamp "pip rc $?"
cd /tmp
timeout 200 python3 $R/bench/bench.py --suite decode --repeats 20 --out $OUT/h200-2026-12-04-decode-$C.json > $L/bench_decode.log 2>&1; stamp "bench decode rc $?"
grep "^decode" $L/bench_decode.log
timeout 200 python3 $R/bench/bench.py --suite decode --kv-dtype fp8 --repeats 20 --out $OUT/h200-2026-12-04-decode-fp8-$C.json > $L/bench_fp8.log 2>&1; stamp "bench fp8 rc $?"
grep "^decode" $L/bench_fp8.log
( timeout 200 python3 -m pytest -q $R/tests/python/test_cuda.py -k "decode or split or graph or kvcache" > $L/pytest_cuda.log 2>&1; echo "rc $?" >> $L/pytest_cuda.log ) &
( timeout 200 python3 -m pytest -q $R/tests/python/test_kvcache.py $R/tests/python/test_sink.py > $L/pytest_kv.log 2>&1; echo "rc $?" >> $L/pytest_kv.log ) &
( timeout 200 python3 -m pytest -q $R/tests/python/test_fp8.py -k "kvcache" > $L/pytest_fp8.log 2>&1; echo "rc $?" >> $L/pytest_fp8.log ) &
wait; for f in $L/pytest_*.log; do echo "$(basename $f): $(tail -2 $f | tr '\n' ' ')"; done
stamp done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
