#!/usr/bin/env bash
# s16 call 6 (< 150 s, from the repo root): the decode split model with the merge term
# (split_heuristic.h kDecodeMerge): one d128 bf16 package, test_kvcache.py and test_cuda.py -k
# "decode or split or graph" (auto), then dev/decode_splits.py (s0 = the model's choice).
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 120 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/m \
  -Cbuild-dir=/tmp/bm -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128 \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . > /tmp/logs/pip.log 2>&1 || { grep error /tmp/logs/pip.log | head; exit 1; }
t built
export PYTHONPATH=/tmp/m
(timeout 60 python3 -m pytest tests/python/test_kvcache.py -q -p no:cacheprovider > /tmp/logs/py-kv.log 2>&1) &
(timeout 60 python3 -m pytest tests/python/test_cuda.py -q -p no:cacheprovider -k "decode or split or graph" > /tmp/logs/py-cuda.log 2>&1) &
wait; t tested
echo "test_kvcache: $(tail -1 /tmp/logs/py-kv.log)"; grep -E "^FAILED" /tmp/logs/py-kv.log | head -5
echo "test_cuda decode/split/graph: $(tail -1 /tmp/logs/py-cuda.log)"; grep -E "^FAILED" /tmp/logs/py-cuda.log | head -5
timeout 40 python3 dev/decode_splits.py --shapes 1x4096,1x16384,8x65536,64x4096 --splits 0,3,6,16,32 \
  --out $OUT/dec-splits.json 2>&1 | tail -4; t "decode"
