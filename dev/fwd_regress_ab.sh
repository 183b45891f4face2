#!/usr/bin/env bash
# GPU machine (device tool): is the sm90 forward slower than it was on 2026-12-03, and if so since
# which change? s38's record (bench/results/h200-2026-12-05-full-bf16-fa4-8149d27.json) has our
# forward at a median -7% of 095f963's file on the same rows from 2k, cuDNN -5% and FA4 -4% in
# their own processes: a slower GPU state that day, a regression of ours, or both.
# The SASS of the d128 kernels (sm90fwd_hdim128_bf16_{nomask,window}; s40, per commit from
# 095f963, dev/NOTES.md to-do 26) changed only at 43c62b2 / a207ccf (s32: the next tile taken
# under the last P V, multiply-shift tile coordinates), c44a802 (s33: 1/l by MUFU.RCP), d5bfca8
# (s36: the varlen cu_seqlens clamps, never A/B'd) and 8584082 (s37: same instruction count).
# So the variants, all bf16 packages timed alternately in fresh processes with cuDNN:
#   old    095f963 (64;128;256)            the 2026-12-03 record's tree
#   pre    2755787 (128)                   s32 + s33, before the clamps
#   new    this tree (64;128;256)
#   bn192  this tree, 128 x 192 tiles for unmasked d128 (FLASHATTN_DEV_SM90_UNMASKED_ONLY; ptxas
#          0 spills, 852 key-loop instructions per 192 keys against 794 per 176, 1.6% fewer
#          per key; the partial last block wastes the same 64 key slots at 2k and 128 at 4k,
#          0.8 against 1.0% of them at 16k): predicted 0 to +2% unmasked from 2k
# On the dev machine first (the old trees travel as carries, ~10 MB each):
#   for c in 095f963 2755787; do rm -rf .carry/$c && mkdir -p .carry/$c && git archive $c | tar -x -C .carry/$c; done
# then the device tool with carry [".carry/095f963", ".carry/2755787"] and
# "OUT=$OUT bash dev/fwd_regress_ab.sh" (builds, then pass 1); on the warm machine again
# "OUT=$OUT PASSES='2 3' bash dev/fwd_regress_ab.sh" (packages found: no build).
# Result: $OUT/regress.tar.gz (JSON per pass) and dev/ab_table.py's tables printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=/tmp/regress; mkdir -p $L
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
pkg() {  # name source-dir head-dims [cuda flags]
  [ -d /tmp/rg-$1/flashattn ] && { echo "pip $1: found"; return; }
  [ -f "$2/CMakeLists.txt" ] || { echo "no tree $2 (see the header)"; return; }
  ( cd "$2" && CMAKE_BUILD_PARALLEL_LEVEL=4 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/rg-$1 \
      -Cbuild-dir=/tmp/rg-build-$1 -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \
      "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=$3" -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 \
      "-Ccmake.define.CMAKE_CUDA_FLAGS=${4:-}" . >$L/pip-$1.log 2>&1 )
  echo "pip $1 rc=$? $(el)"
}
BN192="-DFLASHATTN_DEV_SM90_HDIM=128 -DFLASHATTN_DEV_SM90_BN=192 -DFLASHATTN_DEV_SM90_CONSUMERS=2 -DFLASHATTN_DEV_SM90_STAGES=2 -DFLASHATTN_DEV_SM90_PINGPONG=1 -DFLASHATTN_DEV_SM90_UNMASKED_ONLY"
pkg new . "64;128;256" &
pkg old .carry/095f963 "64;128;256" &
pkg pre .carry/2755787 "128" &
pkg bn192 . "128" "$BN192" &
wait
for p in ${PASSES:-1}; do
  order="new old pre bn192"; [ $((p % 2)) = 0 ] && order="bn192 pre old new"
  for v in $order; do
    [ -d /tmp/rg-$v/flashattn ] || continue
    dims=128; case $v in new|old) dims=64,128,256 ;; esac
    PYTHONPATH=/tmp/rg-$v timeout 90 python3 bench/bench.py --suite full --impls flashattn,sdpa_cudnn --dtypes bf16 \
      --no-backward --head-dims $dims --seqlens 2048,4096,16384 --repeats 20 --gpu-state \
      --out $L/ab-$v-$p.json >>$L/bench.txt 2>&1
    echo "pass $p $v rc=$? $(el)"
    tar -czf "$OUT/regress.tar.gz" -C $L .  # after each variant: a call cut at 600 s keeps what ran
  done
done
python3 dev/ab_table.py "old=$L/ab-old-*.json" "new=$L/ab-new-*.json" 2>&1 | tail -22
python3 dev/ab_table.py "pre=$L/ab-pre-*.json" "new=$L/ab-new-*.json" "bn192=$L/ab-bn192-*.json" 2>&1 | tail -12
