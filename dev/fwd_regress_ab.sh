#!/usr/bin/env bash
# GPU machine (device tool): is the sm90 forward slower than it was on 2026-12-03? s38's record
# (bench/results/h200-2026-12-05-full-bf16-fa4-8149d27.json) has our forward at a median -7% of
# 095f963's file on the same rows from 2k, cuDNN -5% and FA4 -4% in their own processes: a
# slower GPU state that day, a regression of ours since 095f963, or both. This builds both
# trees' packages (bf16, 64;128;256) and times them alternately in fresh processes with cuDNN.
# On the dev machine first (the old tree travels as a carry, ~10 MB; the device copies only the
# working tree):
#   rm -rf .carry/old && mkdir -p .carry/old && git archive 095f963 | tar -x -C .carry/old
# then the device tool with carry [".carry/old"] and "OUT=$OUT bash dev/fwd_regress_ab.sh".
# Result: $OUT/regress.tar.gz (JSON per pass) and the ab_table printed last (old = 095f963).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=/tmp/regress; mkdir -p $L
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
[ -f .carry/old/CMakeLists.txt ] || { echo "no .carry/old tree (see the header)"; exit 1; }
pkg() {  # name source-dir
  ( cd "$2" && CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/rg-$1 \
      -Cbuild-dir=/tmp/rg-build-$1 -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \
      "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128;256" -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . \
      >$L/pip-$1.log 2>&1 )
  echo "pip $1 rc=$? $(el)"
}
pkg new . &
pkg old .carry/old &
wait
for p in 1 2 3; do
  order="new old"; [ $((p % 2)) = 0 ] && order="old new"
  for v in $order; do
    PYTHONPATH=/tmp/rg-$v timeout 120 python3 bench/bench.py --suite full --impls flashattn,sdpa_cudnn --dtypes bf16 \
      --no-backward --head-dims 64,128,256 --seqlens 2048,4096,16384 --repeats 20 --gpu-state \
      --out $L/ab-$v-$p.json >>$L/bench.txt 2>&1
    echo "pass $p $v rc=$? $(el)"
  done
  tar -czf "$OUT/regress.tar.gz" -C $L .
done
python3 dev/ab_table.py "old=$L/ab-old-*.json" "new=$L/ab-new-*.json" 2>&1 | tail -22
