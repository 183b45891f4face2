#!/usr/bin/env bash
# Eleventh session, branch sm90-bwd-persistent (issue 20): the Hopper backward's fused dK/dV/dQ
# kernel on a persistent grid (FLASHATTN_DEV_SM90_BWD_PERSISTENT, src/cuda/sm90/bwd_persistent.h)
# against the one-CTA-per-tile launch. One call on one H200 (16 cores), under 560 s:
#  1. two pip packages side by side, d64;128 bf16, sm_90: base (default code) and pers (the macro
#     via CMAKE_CUDA_FLAGS); the persistent kernel's resource use from pers's objects (expected
#     REG 168, a stack of 24-40 bytes: the producer's and the dQ writer's per-tile values);
#  2. test_cuda.py under FLASHATTN_CUDA_PATH=sm90 on pers (every d64/d128 backward call on the
#     fused kernel, hence the persistent one); a failure (or a hang: the timeout) stops the call
#     before any timing;
#  3. bench.py full suite, bf16, d64/d128, 512..16k, flashattn and SDPA cuDNN in the same process,
#     pers first, then base (if base runs out of time the table falls back to the last full run
#     on main, bench/results/h200-2026-12-02-full-828b790.json);
#  4. dev/ab_table.py --figure bwd_tflops base pers (ratios to base; last column base / cuDNN).
# Writes $OUT/s11p-{base,pers}.json, $OUT/s11p-*.log and $OUT/s11p-summary.txt (printed last).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}
mkdir -p "$OUT"
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
# Seconds for a step: its own cap, or what is left of the budget if less (at least 1).
cap() { local left=$(( 560 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
SUM=$OUT/s11p-summary.txt
: > "$SUM"
log() { echo "$*" >> "$SUM"; echo "$*"; }

declare -A FLAGS=([base]="" [pers]="-DFLASHATTN_DEV_SM90_BWD_PERSISTENT")
jobs=$(( $(nproc) / 2 ))
bcap=$(cap 280)
for name in base pers; do
  rm -rf /tmp/s11p-$name  # pip --target does not replace an existing package
  CMAKE_BUILD_PARALLEL_LEVEL=$jobs timeout "$bcap" python3 -m pip install --no-build-isolation --no-deps -q \
    --target /tmp/s11p-$name -Cbuild-dir=build-s11p-$name -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \
    "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 \
    "-Ccmake.define.CMAKE_CUDA_FLAGS=${FLAGS[$name]}" . > "$OUT/s11p-pip-$name.log" 2>&1 &
done
wait
log "$(t builds)"
for name in base pers; do
  [ -d /tmp/s11p-$name/flashattn ] || { log "build $name failed:"; grep -E "error" "$OUT/s11p-pip-$name.log" | head -5 | tee -a "$SUM"; exit 1; }
done
# The macro reached the kernels: the persistent kernel exists in pers's objects (and not in base's).
for name in base pers; do
  for o in build-s11p-$name/CMakeFiles/*/src/cuda/instantiations/sm90bwd_hdim{64,128}_bf16_{nomask,window}.cu.o; do
    [ -f "$o" ] || continue
    log "$name $(basename "$o" .cu.o): $(cuobjdump -res-usage "$o" 2>&1 | grep -A1 'bwd_kv_persistent_kernel' | grep -o 'REG:[0-9]* STACK:[0-9]*' | paste -sd' ')"
  done
done

# Correctness first: a failure or a timeout (a hang of the persistent kernel) is not timed.
r=$(FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/s11p-pers timeout "$(cap 120)" python3 -m pytest tests/python/test_cuda.py -q \
  -p no:cacheprovider 2>&1 | tee "$OUT/s11p-test-pers.log" | tail -1)
rc=${PIPESTATUS[0]}
log "$(t "test_cuda (sm90, pers): $r")"
if [ "$rc" -ne 0 ] || echo "$r" | grep -qE "failed|error" || ! echo "$r" | grep -q passed; then
  log "pers failed or timed out (rc $rc): not timed"
  grep -E "FAILED|Error|Timeout" "$OUT/s11p-test-pers.log" | head -10 | tee -a "$SUM"
  exit 1
fi

for name in pers base; do
  PYTHONPATH=/tmp/s11p-$name timeout "$(cap 140)" python3 bench/bench.py --suite full --dtypes bf16 --head-dims 64,128 \
    --seqlens 512,1024,2048,4096,16384 --impls flashattn,sdpa_cudnn --repeats 20 --out "$OUT/s11p-$name.json" \
    > "$OUT/s11p-bench-$name.log" 2>&1
  log "$(t "bench $name rc=$?")"
done
BASE=$OUT/s11p-base.json
[ -f "$BASE" ] || { BASE=bench/results/h200-2026-12-02-full-828b790.json; log "base not timed: table against $BASE"; }
[ -f "$OUT/s11p-pers.json" ] && python3 dev/ab_table.py --figure bwd_tflops "$BASE" "$OUT/s11p-pers.json" 2>&1 | tee -a "$SUM"
log "$(t done)"
