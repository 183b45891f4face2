#!/usr/bin/env bash
# Fourteenth session (s14), GPU call 6 (< 150 s, the session's last device time): the new 10-run
# bitwise test of the deterministic backward on a d64;128;256 bf16 package (d192 skips), and one
# bench row with --gpu-state.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT"
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 95 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/pk \
  -Cbuild-dir=/tmp/b-pk -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128;256" \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . > /tmp/pip.log 2>&1 || { tail -5 /tmp/pip.log; exit 1; }
t built
PYTHONPATH=/tmp/pk timeout 40 python3 -m pytest tests/python/test_cuda.py -q -p no:cacheprovider \
  -k "bitwise_stable_over_ten_runs" 2>&1 | tail -3
t tested
PYTHONPATH=/tmp/pk timeout 15 python3 bench/bench.py --suite full --dtypes bf16 --head-dims 128 --seqlens 4096 \
  --impls flashattn,sdpa_cudnn --repeats 10 --gpu-state --out $OUT/gpu-state.json 2>&1 | grep -E "^bf16|rror" | head -3
python3 -c "
import json; r=json.load(open('$OUT/gpu-state.json'))['rows'][0]; print({k: r[k].get('gpu_state') for k in ('flashattn','sdpa_cudnn')})" 2>&1 | tail -1
t done
