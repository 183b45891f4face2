#!/usr/bin/env bash
# Tenth session: the d64 Hopper backward with dQ's columns split between the consumers
# (FLASHATTN_DEV_SM90_BWD_D64_DQ_COLS: 32 each over all 128 keys from a 64-byte swizzled copy of
# K's halves; half the bulk reduce bytes and staging per step, one dS barrier per step) against
# today's key split. One call on one H200 (16 cores), under 8 minutes:
#  1. two pip packages, d64 bf16, base and the macro, built side by side (8 jobs each);
#  2. the macro's package checked against float64 under FLASHATTN_CUDA_PATH=sm90 (every
#     non-deterministic d64 backward on the fused kernel): test_cuda.py; a failure stops the call;
#  3. bench.py, full suite rows d64 bf16 at 1k/2k/4k/16k, forward + backward, flashattn and cuDNN
#     in the same process, for each package (default dispatch: d64 without a mask below 2048 keys
#     runs the two-kernel form, so 1k unmasked is the same code in both: the noise floor);
#  4. as time allows: 1k/2k again under FLASHATTN_CUDA_PATH=sm90 (the fused kernel at 1k too),
#     then test_block_sparse.py on the macro's package under sm90 (the block-sparse fused kernel
#     takes the same dQ path at d64).
# Every step's timeout is cut to what is left of a 560 s budget (the device allows 600).
# Writes $OUT/s10-{base,dqcols}[-sm90].json and $OUT/s10-summary.txt (tables via dev/ab_table.py).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}
mkdir -p "$OUT"
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
# Seconds for a step: its own cap, or what is left of the budget if less (at least 1).
cap() { local left=$(( 560 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
SUM=$OUT/s10-summary.txt
: > "$SUM"
log() { echo "$*" | tee -a "$SUM"; }

declare -A FLAGS=([base]="" [dqcols]="-DFLASHATTN_DEV_SM90_BWD_D64_DQ_COLS")
jobs=$(( $(nproc) / 2 ))
for name in base dqcols; do
  CMAKE_BUILD_PARALLEL_LEVEL=$jobs timeout 300 python3 -m pip install --no-build-isolation --no-deps -q \
    --target /tmp/s10-$name -Cbuild-dir=build-s10-$name -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \
    -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64 -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 \
    "-Ccmake.define.CMAKE_CUDA_FLAGS=${FLAGS[$name]}" . > /tmp/s10-pip-$name.log 2>&1 &
done
wait
log "$(t builds)"
for name in base dqcols; do
  [ -d /tmp/s10-$name/flashattn ] || { log "build $name failed:"; tail -20 /tmp/s10-pip-$name.log | tee -a "$SUM"; exit 1; }
done

# Correctness first: a variant that fails is not timed.
res=$(FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/s10-dqcols timeout "$(cap 120)" python3 -m pytest tests/python/test_cuda.py \
  -q -x -p no:cacheprovider 2>&1 | tail -3)
log "test_cuda dqcols (sm90): $(echo "$res" | tail -1)"
if ! echo "$res" | tail -1 | grep -q "passed" || echo "$res" | tail -1 | grep -qE "failed|error"; then
  echo "$res" | tee -a "$SUM"; log "dqcols failed its tests: not timed"; exit 1
fi
log "$(t tests)"

for name in base dqcols; do
  PYTHONPATH=/tmp/s10-$name timeout "$(cap 110)" python3 bench/bench.py --suite full --dtypes bf16 --head-dims 64 \
    --seqlens 1024,2048,4096,16384 --impls flashattn,sdpa_cudnn --repeats 20 --out "$OUT/s10-$name.json" 2>&1 |
    grep -E "error|Error" | head -3
  log "$(t "bench $name")"
done
python3 dev/ab_table.py --figure bwd_tflops "$OUT/s10-base.json" "$OUT/s10-dqcols.json" | tee -a "$SUM"
python3 dev/ab_table.py --figure fwd_tflops "$OUT/s10-base.json" "$OUT/s10-dqcols.json" | tee -a "$SUM"

if [ $(( $(date +%s) - T0 )) -lt 440 ]; then
  for name in base dqcols; do
    FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/s10-$name timeout "$(cap 40)" python3 bench/bench.py --suite full --dtypes bf16 \
      --head-dims 64 --seqlens 1024,2048 --impls flashattn,sdpa_cudnn --repeats 20 --out "$OUT/s10-$name-sm90.json" \
      2>&1 | grep -E "error|Error" | head -3
  done
  log "FLASHATTN_CUDA_PATH=sm90 (the fused kernel for every d64 call):"
  python3 dev/ab_table.py --figure bwd_tflops "$OUT/s10-base-sm90.json" "$OUT/s10-dqcols-sm90.json" | tee -a "$SUM"
fi
if [ $(( $(date +%s) - T0 )) -lt 520 ]; then
  log "test_block_sparse dqcols (sm90): $(FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/s10-dqcols timeout "$(cap 60)" \
    python3 -m pytest tests/python/test_block_sparse.py -q -p no:cacheprovider 2>&1 | tail -1)"
fi
log "$(t done)"
