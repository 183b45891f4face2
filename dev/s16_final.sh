#!/usr/bin/env bash
# s16 final call (< 560 s, from the repo root or a snapshot): one pip package at d64;128;192;256,
# bf16 and fp16 (the defaults as merged: O_TMA gone, 192/128 three stages, attn_mask bits), the
# Python GPU suites under sm90 and auto (4 processes at a time), then the dsv3 suite against
# cuDNN for the record. A short summary last.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 260 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/pk \
  -Cbuild-dir=/tmp/bpk -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 . > /tmp/logs/pip.log 2>&1 ||
  { grep -E "error" /tmp/logs/pip.log | head; exit 1; }
t built
export PYTHONPATH=/tmp/pk
runs=("sm90 test_cuda" "auto test_cuda" "sm90 test_torch" "sm90 test_bias" "auto test_bias" "sm90 test_block_sparse"
      "auto test_training" "sm90 test_sink" "sm90 test_fp8" "auto test_kvcache")
for r in "${runs[@]}"; do
  read -r path f <<<"$r"
  while [ "$(jobs -pr | wc -l)" -ge 4 ]; do wait -n || true; done
  ( if [ "$path" = auto ]; then unset FLASHATTN_CUDA_PATH; else export FLASHATTN_CUDA_PATH=$path; fi
    timeout 240 python3 -m pytest tests/python/$f.py -q -p no:cacheprovider > /tmp/logs/py-$path-$f.log 2>&1 ) &
done
wait; t tested
for r in "${runs[@]}"; do read -r path f <<<"$r"; echo "$f ($path): $(tail -1 /tmp/logs/py-$path-$f.log)";
  grep -E "^FAILED|^ERROR" /tmp/logs/py-$path-$f.log | head -5; done > $OUT/summary.txt
timeout 120 python3 bench/bench.py --suite dsv3 --impls flashattn,sdpa_cudnn --dtypes bf16 --repeats 20 \
  --out $OUT/dsv3.json > /tmp/logs/dsv3.log 2>&1; t "dsv3 rc $?"
grep -E "^bf16" /tmp/logs/dsv3.log | cut -c1-150 >> $OUT/summary.txt
tar czf $OUT/logs.tgz -C /tmp/logs .
cat $OUT/summary.txt
