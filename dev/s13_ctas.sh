#!/usr/bin/env bash
# Twelfth session: two CTAs per SM for the short-row forward (fwd_tile.h ctas_per_sm), A/B in one
# call (< 420 s), run from .carry/snap:
#  base: the default tiles; x1: d64 short rows {1 consumer, 128 keys, 2 stages, 2 CTAs/SM} and
#  d128 {1, 64, 2, 2 CTAs/SM}; x2: d64 short rows {1, 128, 3, 2 CTAs} and d128 {1, 80, 2, 2 CTAs}.
# d64;128 bf16 packages side by side; test_cuda.py -k "fwd or forward" under sm90 on x1 and x2;
# forward timings (512, 1k, 2k, 16k; causal and not) of each against cuDNN, one process each.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cap() { local left=$(( 410 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs4
PIP="python3 -m pip install --no-build-isolation --no-deps -q -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128"
X1="-DFLASHATTN_DEV_SM90_SHORT_CONSUMERS=1 -DFLASHATTN_DEV_SM90_SHORT_BN=128 -DFLASHATTN_DEV_SM90_SHORT_STAGES=2 -DFLASHATTN_DEV_SM90_SHORT_PINGPONG=0 -DFLASHATTN_DEV_SM90_SHORT_CTAS=2 -DFLASHATTN_DEV_SM90_HDIM=128 -DFLASHATTN_DEV_SM90_CONSUMERS=1 -DFLASHATTN_DEV_SM90_BN=64 -DFLASHATTN_DEV_SM90_STAGES=2 -DFLASHATTN_DEV_SM90_PINGPONG=0 -DFLASHATTN_DEV_SM90_CTAS=2"
X2="-DFLASHATTN_DEV_SM90_SHORT_CONSUMERS=1 -DFLASHATTN_DEV_SM90_SHORT_BN=128 -DFLASHATTN_DEV_SM90_SHORT_STAGES=3 -DFLASHATTN_DEV_SM90_SHORT_PINGPONG=0 -DFLASHATTN_DEV_SM90_SHORT_CTAS=2 -DFLASHATTN_DEV_SM90_HDIM=128 -DFLASHATTN_DEV_SM90_CONSUMERS=1 -DFLASHATTN_DEV_SM90_BN=80 -DFLASHATTN_DEV_SM90_STAGES=2 -DFLASHATTN_DEV_SM90_PINGPONG=0 -DFLASHATTN_DEV_SM90_CTAS=2"
for n in base x1 x2; do
  case $n in base) F="";; x1) F="$X1";; x2) F="$X2";; esac
  (CMAKE_BUILD_PARALLEL_LEVEL=6 timeout 200 $PIP --target /tmp/pk-$n -Cbuild-dir=/tmp/bb-$n \
     "-Ccmake.define.CMAKE_CUDA_FLAGS=$F" . > /tmp/logs4/pip-$n.log 2>&1) &
done
wait; t built
for n in base x1 x2; do [ -d /tmp/pk-$n/flashattn ] || { echo "package $n failed"; grep -E "error" /tmp/logs4/pip-$n.log | head -5; }; done
for n in x1 x2; do
  [ -d /tmp/pk-$n/flashattn ] || continue
  (PYTHONPATH=/tmp/pk-$n FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 120)" python3 -m pytest tests/python/test_cuda.py -q -p no:cacheprovider \
     -x > /tmp/logs4/py-$n.log 2>&1; echo "pytest test_cuda (sm90) $n: $(tail -1 /tmp/logs4/py-$n.log)"; grep -E "^FAILED|^ERROR" /tmp/logs4/py-$n.log | head -5) &
done
wait; t tested
for n in base x1 x2 base2; do
  pk=/tmp/pk-${n%2}
  [ -d $pk/flashattn ] || continue
  PYTHONPATH=$pk timeout "$(cap 50)" python3 bench/bench.py --suite full --dtypes bf16 --head-dims 64,128 \
    --seqlens 512,1024,2048,16384 --impls flashattn,sdpa_cudnn --repeats 20 --no-backward --out $OUT/ctas-$n.json > /tmp/logs4/bench-$n.log 2>&1
  t "bench $n rc $?"
done
tar czf $OUT/logs4.tgz -C /tmp/logs4 .
python3 dev/ab_table.py $OUT/ctas-base.json $OUT/ctas-x1.json $OUT/ctas-x2.json $OUT/ctas-base2.json 2>&1 | tail -30
