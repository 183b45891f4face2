#!/usr/bin/env bash
# Session script (s29 call 5, deleted after its run): the decode suite with every decode peer
# (sdpa_math included) under bench.py's time-based warm-up (WARMUP_MS), bf16 cache, then the
# e4m3 cache; both JSONs for bench/results.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT/r"
if [ ! -d /tmp/ab-m/flashattn ]; then
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-m \
  -Cbuild-dir=build-ab-m -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128" \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . >"$OUT/r/pip.log" 2>&1 || { tail -30 "$OUT/r/pip.log"; exit 1; }
fi
export PYTHONPATH=/tmp/ab-m
T0=$(date +%s)
timeout 330 python3 bench/bench.py --suite decode --repeats 20 --out "$OUT/r/decode-bf16.json" 2>&1 | grep -v -i warn | tee "$OUT/r/decode-bf16.log"
echo "bf16 decode done at $(( $(date +%s) - T0 )) s"
timeout $(( 540 - ($(date +%s) - T0) )) python3 bench/bench.py --suite decode --kv-dtype fp8 --repeats 20 \
  --out "$OUT/r/decode-fp8.json" 2>&1 | grep -v -i warn | tee "$OUT/r/decode-fp8.log"
echo "fp8 decode done at $(( $(date +%s) - T0 )) s"
tar czf "$OUT/s29c5.tgz" -C "$OUT" r && rm -rf "$OUT/r"
