#!/usr/bin/env bash
# Tenth session, branch sm90-bwd-dv: the Hopper backward at head_dim 192 / head_dim_v 128
# (BwdDvTraits: the d192 split-role kernels with V, dO and dV 128 wide; cuda_backend.cu runs such a
# call unpadded, native_head_dim_v_backward). One call on one H200 (16 cores), under 560 s:
#  1. two pip packages, head dim 192, bf16 (it serves 192/128), sm_90, built side by side: base
#     (two stages, as d192) with the head_dim_v gtest binary from the same objects, and st3
#     (-DFLASHATTN_DEV_SM90_BWD_DV_STAGES=3: a third Q/dO stage in the dK/dV kernel and K/V stage
#     in the dQ kernel, which 192/128's narrower tiles leave room for);
#  2. base: flashattn_test_head_dim_v and test_cuda.py -k head_dim_v under FLASHATTN_CUDA_PATH=sm90
#     and auto (concurrently; both take the native 192/128 backward; the new tests compare it with
#     the sm80 backward in one process and count the native calls); st3: the 192/128 sm90 tests
#     under sm90. Any failure stops the call here (st3's alone only drops st3 from the timing);
#  3. bench.py --suite dsv3 (q/k 192, v 128, 16 heads, batch 16k/N) at 2k/4k/8k, causal and not,
#     forward + backward, flashattn and SDPA cuDNN in the same process, for each package;
#  4. the tables: backward and forward TFLOP/s of the last dsv3 run on main (padded backward,
#     bench/results/h200-2026-12-02-dsv3-7a3a69e.json), base and st3 (ratios to main's; last
#     column main's ours / cuDNN), then base and st3 against this call's cuDNN.
# Writes $OUT/s10dv-*.log, $OUT/s10dv-{base,st3}.json and $OUT/s10dv-summary.txt (printed last).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}
mkdir -p "$OUT"
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
# Seconds for a step: its own cap, or what is left of the budget if less (at least 1).
cap() { local left=$(( 560 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
SUM=$OUT/s10dv-summary.txt
: > "$SUM"
log() { echo "$*" >> "$SUM"; echo "$*"; }

declare -A FLAGS=([base]="" [st3]="-DFLASHATTN_DEV_SM90_BWD_DV_STAGES=3")
declare -A TESTS=([base]=ON [st3]=OFF)
jobs=$(( $(nproc) / 2 ))
bcap=$(cap 300)
for name in base st3; do
  rm -rf /tmp/s10dv-$name  # pip --target does not replace an existing package
  CMAKE_BUILD_PARALLEL_LEVEL=$jobs timeout "$bcap" python3 -m pip install --no-build-isolation --no-deps -q \
    --target /tmp/s10dv-$name -Cbuild-dir=build-s10dv-$name -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \
    -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=192 -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 \
    -Ccmake.define.FLASHATTN_BUILD_TESTS=${TESTS[$name]} "-Ccmake.define.CMAKE_CUDA_FLAGS=${FLAGS[$name]}" . \
    > "$OUT/s10dv-pip-$name.log" 2>&1 &
done
wait
log "$(t builds)"
[ -d /tmp/s10dv-base/flashattn ] || { log "build base failed:"; tail -20 "$OUT/s10dv-pip-base.log" | tee -a "$SUM"; exit 1; }
VARIANTS=base
if [ -d /tmp/s10dv-st3/flashattn ]; then VARIANTS="base st3"; else log "build st3 failed (not timed):"; tail -5 "$OUT/s10dv-pip-st3.log" | tee -a "$SUM"; fi
timeout "$(cap 90)" cmake --build build-s10dv-base -j "$(nproc)" --target flashattn_test_head_dim_v > "$OUT/s10dv-gtest-build.log" 2>&1
log "$(t "gtest build rc=$?")"
# Resource use, dQ kernel then dK/dV kernel (expected REG 168 STACK 0 each).
for name in $VARIANTS; do
  for o in build-s10dv-$name/CMakeFiles/flashattn_sm90.dir/src/cuda/instantiations/sm90bwd_hdim192_bf16_*.cu.o; do
    log "$name $(basename "$o" .cu.o): $(cuobjdump -res-usage "$o" 2>&1 | grep -A1 'bwd_[kd][vq]_kernel' | grep -o 'REG:[0-9]* STACK:[0-9]*' | paste -sd' ')"
  done
done

# Correctness first: a failure is not timed.
bin=build-s10dv-base/tests/cpp/flashattn_test_head_dim_v
tcap=$(cap 200)
for path in sm90 auto; do
  ( if [ "$path" = auto ]; then unset FLASHATTN_CUDA_PATH; else export FLASHATTN_CUDA_PATH=$path; fi
    if [ -x $bin ]; then timeout "$tcap" $bin > "$OUT/s10dv-gtest-$path.log" 2>&1; echo $? > "$OUT/s10dv-gtest-$path.rc"
    else echo "no gtest binary" > "$OUT/s10dv-gtest-$path.log"; echo 1 > "$OUT/s10dv-gtest-$path.rc"; fi
    PYTHONPATH=/tmp/s10dv-base timeout "$tcap" python3 -X faulthandler -m pytest tests/python/test_cuda.py -k head_dim_v \
      -q -rs -p no:cacheprovider > "$OUT/s10dv-pytest-$path.log" 2>&1
    echo $? > "$OUT/s10dv-pytest-$path.rc" ) &
done
if [[ $VARIANTS == *st3* ]]; then
  ( FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/s10dv-st3 timeout "$tcap" python3 -m pytest tests/python/test_cuda.py \
      -k "192_128" -q -p no:cacheprovider > "$OUT/s10dv-pytest-st3.log" 2>&1; echo $? > "$OUT/s10dv-pytest-st3.rc" ) &
fi
wait
ok=1
for path in sm90 auto; do
  log "base FLASHATTN_CUDA_PATH=$path: gtest rc=$(cat "$OUT/s10dv-gtest-$path.rc")" \
    "$(grep -E '^\[  (PASSED|FAILED) ' "$OUT/s10dv-gtest-$path.log" | head -1);" \
    "pytest rc=$(cat "$OUT/s10dv-pytest-$path.rc") $(tail -1 "$OUT/s10dv-pytest-$path.log")"
  grep -E '^\[  FAILED ' "$OUT/s10dv-gtest-$path.log" | head -5 | tee -a "$SUM"
  grep -E '^(FAILED|ERROR) ' "$OUT/s10dv-pytest-$path.log" | head -8 | tee -a "$SUM"
  [ "$(cat "$OUT/s10dv-gtest-$path.rc")" = 0 ] && [ "$(cat "$OUT/s10dv-pytest-$path.rc")" = 0 ] || ok=0
done
grep -E "SKIPPED.*192_128_sm90" "$OUT/s10dv-pytest-sm90.log" | head -3 | tee -a "$SUM"
if [ $ok = 0 ]; then log "base failed its tests: not timed"; log "$(t done)"; cat "$SUM"; exit 1; fi
if [[ $VARIANTS == *st3* ]]; then
  log "st3 (sm90) pytest -k 192_128: rc=$(cat "$OUT/s10dv-pytest-st3.rc") $(tail -1 "$OUT/s10dv-pytest-st3.log")"
  if [ "$(cat "$OUT/s10dv-pytest-st3.rc")" != 0 ]; then
    grep -E '^(FAILED|ERROR) ' "$OUT/s10dv-pytest-st3.log" | head -5 | tee -a "$SUM"; VARIANTS=base; log "st3 not timed"
  fi
fi
log "$(t tests)"

for name in $VARIANTS; do
  PYTHONPATH=/tmp/s10dv-$name timeout "$(cap 100)" python3 bench/bench.py --suite dsv3 --seqlens 2048,4096,8192 \
    --impls flashattn,sdpa_cudnn --repeats 20 --out "$OUT/s10dv-$name.json" > "$OUT/s10dv-bench-$name.log" 2>&1
  log "$(t "bench $name rc=$?")"
  grep -E "error|Error" "$OUT/s10dv-bench-$name.log" | head -3 | tee -a "$SUM"
done
REF=bench/results/h200-2026-12-02-dsv3-7a3a69e.json
files=()
for name in $VARIANTS; do [ -f "$OUT/s10dv-$name.json" ] && files+=("$OUT/s10dv-$name.json"); done
for fig in bwd_tflops fwd_tflops; do
  python3 dev/ab_table.py --figure $fig "$REF" "${files[@]}" >> "$SUM" 2>&1
  for f in "${files[@]}"; do python3 dev/ab_table.py --figure $fig "$f" >> "$SUM" 2>&1; done
done
log "$(t done)"
echo "==== summary"; cat "$SUM"
