#!/usr/bin/env bash
# Eleventh session, GPU call 6 (< 150 s): the forward's dense tile feed read by lane 0 alone
# (take_tile), under racecheck, where call 5 reported the producer's next write against the other
# lanes' reads. A d64 bf16 package; racecheck and a plain run of the d64 cases of
# dev/san_cases.py under sm90 (the short-rows causal forward takes the feed).
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT"
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 110 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/pk6 \
  -Cbuild-dir=/tmp/bb6 -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64 \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . > $OUT/pip6.log 2>&1
[ -d /tmp/pk6/flashattn ] || { echo "build failed"; grep error $OUT/pip6.log | head; exit 1; }
t built
export PYTHONPATH=/tmp/pk6 FLASHATTN_CUDA_PATH=sm90
timeout 60 compute-sanitizer --tool racecheck --print-limit 20 python3 dev/san_cases.py \
  --only fwd_d64_short_causal,bwd_d64_causal_2tiles > $OUT/san6-racecheck.txt 2>&1
echo "racecheck: rc $? $(grep -E 'RACECHECK SUMMARY' $OUT/san6-racecheck.txt | tail -1) | $(grep -E 'ALL OK|SOME FAILED' $OUT/san6-racecheck.txt)"
grep -A1 "Race reported" $OUT/san6-racecheck.txt | head -6
t done
