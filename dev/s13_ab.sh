#!/usr/bin/env bash
# Thirteenth session (s13), A/B call (one H200, < 560 s): the forward's per-tile and per-block
# instruction counts (ncu of d64 causal 1k: ours 94.4 M instructions at IPC 1.74 against cuDNN's
# 86.6 M at 1.92). Three packages (d64;128, bf16) built in parallel:
#   base  the default code
#   rsmb  FLASHATTN_DEV_SM90_ROWSUM_MMA (d64: row sums on the tensor cores, m64n72 over a ones
#         panel) + FLASHATTN_DEV_SM90_MASKBITS (the window mask as bits: R2P + FSEL per score)
#   all   rsmb + FLASHATTN_DEV_SM90_TREE (max and sum in four interleaved chains)
# test_cuda.py under FLASHATTN_CUDA_PATH=sm90 on rsmb and all, then the forward (ours and SDPA
# cuDNN in each process) at d64/d128, 512-16k, causal and not; nvidia-smi clocks and power sampled
# beside base's run. Writes $OUT/ab-{base,rsmb,all}.json, $OUT/logs.tgz.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cap() { local left=$(( 550 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs
declare -A FLAGS=([base]="" [rsmb]="-DFLASHATTN_DEV_SM90_ROWSUM_MMA -DFLASHATTN_DEV_SM90_MASKBITS"
                  [all]="-DFLASHATTN_DEV_SM90_ROWSUM_MMA -DFLASHATTN_DEV_SM90_MASKBITS -DFLASHATTN_DEV_SM90_TREE")
NAMES=(base rsmb all)
for n in "${NAMES[@]}"; do
  CMAKE_BUILD_PARALLEL_LEVEL=6 timeout 240 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-$n \
    -Cbuild-dir=/tmp/bab-$n -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 "-Ccmake.define.CMAKE_CUDA_FLAGS=${FLAGS[$n]}" . > /tmp/logs/pip-$n.log 2>&1 &
done
wait
for n in "${NAMES[@]}"; do [ -d /tmp/ab-$n/flashattn ] || { echo "build $n failed"; grep -E "error" /tmp/logs/pip-$n.log | head; }; done
t built
for n in rsmb all; do
  ( PYTHONPATH=/tmp/ab-$n FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 120)" python3 -m pytest tests/python/test_cuda.py -q -x \
      -p no:cacheprovider > /tmp/logs/test-$n.log 2>&1; echo "test_cuda sm90 $n: $(tail -1 /tmp/logs/test-$n.log)" ) &
done
wait
grep -hE "^FAILED|Error" /tmp/logs/test-*.log | head -6
t tested
for n in "${NAMES[@]}"; do
  [ "$n" = base ] && { nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 200 > /tmp/logs/smi-base.csv 2>&1 & smi=$!; }
  PYTHONPATH=/tmp/ab-$n timeout "$(cap 90)" python3 bench/bench.py --suite full --dtypes bf16 --head-dims 64,128 \
    --seqlens 512,1024,2048,4096,16384 --impls flashattn,sdpa_cudnn --no-backward --repeats 20 --out $OUT/ab-$n.json \
    > /tmp/logs/bench-$n.log 2>&1
  [ "$n" = base ] && kill $smi 2>/dev/null
  t "bench $n rc $?"
done
tar czf $OUT/logs.tgz -C /tmp/logs .
python3 dev/ab_table.py $OUT/ab-base.json $OUT/ab-rsmb.json $OUT/ab-all.json 2>&1 | tail -30
