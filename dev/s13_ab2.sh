#!/usr/bin/env bash
# Thirteenth session (s13), second A/B call (one H200, < 480 s): the short-rows tile's two score
# buffers. Four d64 bf16 packages built in parallel:
#   base  the default code
#   rs    FLASHATTN_DEV_SM90_ROWSUM_MMA + FLASHATTN_DEV_SM90_MASKBITS (as in the first A/B)
#   ts0   FLASHATTN_DEV_SM90_TWO_S (the short-rows tile: S_{i+1} under block i's softmax)
#   ts    ts0 + rs
# test_cuda.py under FLASHATTN_CUDA_PATH=sm90 on ts0 and ts, racecheck and synccheck
# of the short-rows case (dev/san_cases.py) on ts, then the forward against SDPA cuDNN (one
# process per variant) at d64 512-16k, causal and not. Writes $OUT/ab2-*.json, $OUT/logs.tgz.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cap() { local left=$(( 470 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs
RS="-DFLASHATTN_DEV_SM90_ROWSUM_MMA -DFLASHATTN_DEV_SM90_MASKBITS"
declare -A FLAGS=([base]="" [rs]="$RS" [ts0]="-DFLASHATTN_DEV_SM90_TWO_S" [ts]="-DFLASHATTN_DEV_SM90_TWO_S $RS")
NAMES=(base rs ts0 ts)
# The tested variants carry d128 too (test_cuda.py's shapes); rs passed it in the first A/B.
declare -A DIMS=([base]="64" [rs]="64" [ts0]="64;128" [ts]="64;128")
for n in "${NAMES[@]}"; do
  CMAKE_BUILD_PARALLEL_LEVEL=4 timeout 200 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-$n \
    -Cbuild-dir=/tmp/bab-$n -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=${DIMS[$n]}" \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 "-Ccmake.define.CMAKE_CUDA_FLAGS=${FLAGS[$n]}" . > /tmp/logs/pip-$n.log 2>&1 &
done
wait
for n in "${NAMES[@]}"; do [ -d /tmp/ab-$n/flashattn ] || { echo "build $n failed"; grep -E "error" /tmp/logs/pip-$n.log | head; }; done
t built
for n in ts0 ts; do
  ( PYTHONPATH=/tmp/ab-$n FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 120)" python3 -m pytest tests/python/test_cuda.py -q \
      -p no:cacheprovider > /tmp/logs/test-$n.log 2>&1; echo "test_cuda sm90 $n: $(tail -1 /tmp/logs/test-$n.log)" ) &
done
wait
grep -hE "^FAILED|Error" /tmp/logs/test-*.log | head -6
t tested
for tool in racecheck synccheck; do
  PYTHONPATH=/tmp/ab-ts FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 60)" compute-sanitizer --tool $tool --print-limit 20 \
    python3 dev/san_cases.py --only fwd_d64_short_causal > /tmp/logs/san-$tool-ts.txt 2>&1
  t "$tool ts rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/logs/san-$tool-ts.txt | tail -1) $(grep -c 'ok$' /tmp/logs/san-$tool-ts.txt) ok"
done
for n in "${NAMES[@]}"; do
  PYTHONPATH=/tmp/ab-$n timeout "$(cap 60)" python3 bench/bench.py --suite full --dtypes bf16 --head-dims 64 \
    --seqlens 512,1024,2048,4096,16384 --impls flashattn,sdpa_cudnn --no-backward --repeats 20 --out $OUT/ab2-$n.json \
    > /tmp/logs/bench-$n.log 2>&1
  t "bench $n rc $?"
done
tar czf $OUT/logs.tgz -C /tmp/logs .
python3 dev/ab_table.py $OUT/ab2-base.json $OUT/ab2-rs.json $OUT/ab2-ts0.json $OUT/ab2-ts.json 2>&1 | tail -14
