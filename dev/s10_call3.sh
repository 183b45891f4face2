#!/usr/bin/env bash
# Tenth session, third GPU call (one H200, 16 cores, < 560 s). Three d64/d128 bf16 packages:
#  main   the Hopper backward's dK/dV CTAs started in groups of planes under causal (cta_order.h)
#  plain  the same with FLASHATTN_DEV_SM90_BWD_PLAIN_ORDER (blockIdx order, as before)
#  fwin   main with FLASHATTN_DEV_SM90_FWD_SHORT_UNMASKED_WINDOW (unmasked d128 <= 1024 keys on the
#         window kernel: 128 x 128 tile, dynamic feed)
# test_cuda.py under sm90 on main and fwin (a failure stops the timings), then the full suite's
# rows (d64/d128, 1k-16k, fwd+bwd) for main and plain, and the forward at 512-2k for fwin,
# each in its own process against cuDNN. Writes $OUT/{main,plain,fwin}.json, $OUT/summary.txt.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cap() { local left=$(( 560 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs
PIP="python3 -m pip install --no-build-isolation --no-deps -q"
declare -A FLAGS=([main]="" [plain]="-DFLASHATTN_DEV_SM90_BWD_PLAIN_ORDER" [fwin]="-DFLASHATTN_DEV_SM90_FWD_SHORT_UNMASKED_WINDOW")
for n in main plain fwin; do
  (CMAKE_BUILD_PARALLEL_LEVEL=6 $PIP --target /tmp/p-$n -Cbuild-dir=/tmp/b-$n -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \
    "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 \
    "-Ccmake.define.CMAKE_CUDA_FLAGS=${FLAGS[$n]}" . > /tmp/logs/pip-$n.log 2>&1 \
    || { echo "$n build failed"; grep -E "error" /tmp/logs/pip-$n.log | head; }) &
done
wait; t "built"
for n in main fwin; do
  r=$(PYTHONPATH=/tmp/p-$n FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 90)" python3 -m pytest tests/python/test_cuda.py -q -x \
    -p no:cacheprovider 2>&1 | tee /tmp/logs/py-$n.log | tail -1)
  echo "test_cuda $n (sm90): $r"
  if echo "$r" | grep -qE "failed|error" || ! echo "$r" | grep -q passed; then
    grep -E "FAILED|Error" /tmp/logs/py-$n.log | head -5; tar czf $OUT/logs.tgz -C /tmp/logs .; exit 1
  fi
done
t "tests"
for n in main plain; do
  PYTHONPATH=/tmp/p-$n timeout "$(cap 110)" python3 bench/bench.py --suite full --dtypes bf16 --head-dims 64,128 \
    --seqlens 1024,2048,4096,16384 --impls flashattn,sdpa_cudnn --repeats 20 --out $OUT/$n.json > /tmp/logs/bench-$n.log 2>&1
  t "bench $n"
done
PYTHONPATH=/tmp/p-fwin timeout "$(cap 60)" python3 bench/bench.py --suite full --dtypes bf16 --head-dims 128 \
  --seqlens 512,1024,2048 --impls flashattn,sdpa_cudnn --no-backward --repeats 20 --out $OUT/fwin.json > /tmp/logs/bench-fwin.log 2>&1
t "bench fwin"
tar czf $OUT/logs.tgz -C /tmp/logs .
python3 dev/ab_table.py --figure bwd_tflops $OUT/plain.json $OUT/main.json
python3 dev/ab_table.py --figure fwd_tflops --peer sdpa_cudnn $OUT/main.json $OUT/fwin.json
python3 dev/ab_table.py --figure fwd_tflops --peer sdpa_cudnn $OUT/fwin.json
