#!/usr/bin/env bash
# attn_mask as a tile on the Hopper forward (issue 18, branch sm90-mask-tile, dev macro
# FLASHATTN_DEV_SM90_MASK_TILE; dev/NOTES.md "attn_mask as a tile on the Hopper forward"). One GPU
# call (one H200, 16 cores, < 560 s):
#  1. two d64;128 bf16 packages side by side (8 jobs each): base (today's per-element mask reads)
#     and mt (-DFLASHATTN_DEV_SM90_MASK_TILE; its build dir also configures the gtests);
#  2. pytest tests/python/test_bias.py under FLASHATTN_CUDA_PATH=sm90 on mt (mask-only cases take
#     the tile, the 520/257-key ones and bias+mask the per-element fallback); a failure stops
#     here, before any timing;
#  3. dev/bias90_probe.py on each package (kinds mask (B,1,N,N), maskkp (key padding B,1,1,N),
#     BHNNm (a B,H,N,N bias + a B,1,N,N mask: both tiles at d64 under the macro, per element at
#     d128 in both packages, so d128 BHNNm is the control); 8x2048 and 1x16384; d64, d128; no sm80
#     timing), printing both tables (rows also stream into /tmp/logs/probe-*.log);
#  4. if time is left: the BiasSm90 gtests on mt under sm90 (mask-only d128 tile, d64 fallback).
# Writes $OUT/probe-{base,mt}.json, $OUT/logs.tgz; the summary on stdout.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cap() { local left=$(( 555 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs
for v in base= mt=-DFLASHATTN_DEV_SM90_MASK_TILE; do
  n=${v%%=*}
  tests=OFF; [ "$n" = mt ] && tests=ON
  (CMAKE_BUILD_PARALLEL_LEVEL=8 timeout 280 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/pk-$n \
     -Cbuild-dir=/tmp/bb-$n -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" \
     -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 -Ccmake.define.FLASHATTN_BUILD_TESTS=$tests \
     "-Ccmake.define.CMAKE_CUDA_FLAGS=${v#*=}" . > /tmp/logs/pip-$n.log 2>&1
   [ -d /tmp/pk-$n/flashattn ] || { echo "package $n failed"; grep -E "error" /tmp/logs/pip-$n.log | head -10; }) &
done
wait; t "packages built"
for n in base mt; do [ -d /tmp/pk-$n/flashattn ] || { tar czf $OUT/logs.tgz -C /tmp/logs .; exit 1; }; done
r=$(PYTHONPATH=/tmp/pk-mt FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 120)" python3 -m pytest tests/python/test_bias.py -q \
      -p no:cacheprovider 2>&1 | tee /tmp/logs/py-mt-sm90.log | tail -1)
echo "test_bias (mt, sm90): $r"; t "tests"
if echo "$r" | grep -qE "failed|error" || ! echo "$r" | grep -q passed; then
  grep -E "^FAILED|^ERROR|Error" /tmp/logs/py-mt-sm90.log | head -12; tar czf $OUT/logs.tgz -C /tmp/logs .; exit 1
fi
for n in base mt; do
  PYTHONPATH=/tmp/pk-$n timeout "$(cap 120)" python3 dev/bias90_probe.py --out "$OUT/probe-$n.json" \
    --kinds mask,maskkp,BHNNm --no-sm80 > /tmp/logs/probe-$n.log 2>&1
  t "probe $n"
done
for n in base mt; do echo "== $n"; sed -n '/^forward TFLOP/,$p' /tmp/logs/probe-$n.log | head -16; done
if timeout "$(cap 90)" cmake --build /tmp/bb-mt -j 16 --target flashattn_test_bias > /tmp/logs/gt.log 2>&1; then
  BI=$(find /tmp/bb-mt -name flashattn_test_bias -type f | head -1)
  FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 60)" "$BI" --gtest_filter='*BiasSm90*' > /tmp/logs/gt-mt-sm90.log 2>&1
  echo "BiasSm90 (mt, sm90): rc $? $(grep -E '^\[  (PASSED|FAILED)' /tmp/logs/gt-mt-sm90.log | paste -sd' ')"
  grep -E "^\[  FAILED" /tmp/logs/gt-mt-sm90.log | head -5
else
  echo "gtest build not finished: $(tail -1 /tmp/logs/gt.log)"
fi
t "done"
tar czf $OUT/logs.tgz -C /tmp/logs .
