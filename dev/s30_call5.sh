#!/usr/bin/env bash
# s30 call 5: per-phase trace of the batch-1 decode with the cluster merge (a package built with
# -DFLASHATTN_DEV_DECODE_TRACE), beside the plain package's test_cuda.py / test_kvcache.py /
# test_sink.py in full.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT/logs; L=$OUT/logs; R=$(pwd); T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
common=(--no-build-isolation --no-deps -q -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90
        -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128 -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16)
( CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install "${common[@]}" -Cbuild-dir=build-py . > $L/pip.log 2>&1; echo "rc $?" >> $L/pip.log ) &
( CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install "${common[@]}" --target /tmp/ab-trace -Cbuild-dir=build-trace \
    "-Ccmake.define.CMAKE_CUDA_FLAGS=-DFLASHATTN_DEV_DECODE_TRACE" . > $L/pip_trace.log 2>&1; echo "rc $?" >> $L/pip_trace.log ) &
wait; stamp "built: $(tail -1 $L/pip.log) / $(tail -1 $L/pip_trace.log)"
cd /tmp
( timeout 300 python3 -m pytest -q $R/tests/python/test_cuda.py > $L/pytest_cuda.log 2>&1; echo "rc $?" >> $L/pytest_cuda.log ) &
( timeout 300 python3 -m pytest -q $R/tests/python/test_kvcache.py $R/tests/python/test_sink.py $R/tests/python/test_host_path.py > $L/pytest_kv.log 2>&1; echo "rc $?" >> $L/pytest_kv.log ) &
wait; for f in $L/pytest_*.log; do echo "$(basename $f): $(tail -2 $f | tr '\n' ' ')"; done
grep -h "^FAILED" $L/pytest_*.log | head
cd $R/dev && PYTHONPATH=/tmp/ab-trace timeout 120 python3 decode_trace.py \
  --shapes 4096:0:func,4096:16:func,4096:0:kvcache,4096:0:paged16,4096:8:paged16 2>&1 | tee $OUT/s30-decode-trace.txt
stamp done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
