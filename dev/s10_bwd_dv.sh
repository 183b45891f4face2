#!/usr/bin/env bash
# Tenth session, branch sm90-bwd-dv: the Hopper backward at head_dim 192 / head_dim_v 128
# (BwdDvTraits: the d192 split-role kernels with V, dO and dV 128 wide; cuda_backend.cu runs such a
# call unpadded, native_head_dim_v_backward). One call on one H200 (16 cores), under 560 s:
#  1. the pip package, head dim 192, bf16 (it serves 192/128), sm_90, with the head_dim_v gtest
#     binary from the same objects;
#  2. flashattn_test_head_dim_v and test_cuda.py -k head_dim_v under FLASHATTN_CUDA_PATH=sm90 and
#     auto (concurrently; both take the native 192/128 backward; the new tests compare it with the
#     sm80 backward in one process and count the native calls); any failure stops the call here;
#  3. bench.py --suite dsv3 (q/k 192, v 128, 16 heads, batch 16k/N) at 2k/4k/8k, causal and not,
#     forward + backward, flashattn and SDPA cuDNN in the same process;
#  4. the table: backward and forward TFLOP/s against the last dsv3 run on main (padded backward,
#     bench/results/h200-2026-12-02-dsv3-7a3a69e.json), last column ours / cuDNN of that run, then
#     this run's own ratio to cuDNN.
# Writes $OUT/s10dv-*.log, $OUT/s10dv-dsv3.json and $OUT/s10dv-summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}
mkdir -p "$OUT"
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
# Seconds for a step: its own cap, or what is left of the budget if less (at least 1).
cap() { local left=$(( 560 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
SUM=$OUT/s10dv-summary.txt
: > "$SUM"
log() { echo "$*" | tee -a "$SUM"; }
PKG=/tmp/s10dv
BLD=build-s10dv

CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) timeout "$(cap 320)" python3 -m pip install --no-build-isolation --no-deps -q \
  --target $PKG -Cbuild-dir=$BLD -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \
  -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=192 -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 \
  -Ccmake.define.FLASHATTN_BUILD_TESTS=ON . > "$OUT/s10dv-pip.log" 2>&1
log "$(t "pip rc=$?")"
[ -d $PKG/flashattn ] || { log "build failed:"; tail -20 "$OUT/s10dv-pip.log" | tee -a "$SUM"; exit 1; }
timeout "$(cap 90)" cmake --build $BLD -j "$(nproc)" --target flashattn_test_head_dim_v > "$OUT/s10dv-gtest-build.log" 2>&1
log "$(t "gtest build rc=$?")"
for o in $BLD/CMakeFiles/flashattn_sm90.dir/src/cuda/instantiations/sm90bwd_hdim192_bf16_*.cu.o; do
  # dq kernel, then kv kernel (expected: REG 168 STACK 0 each)
  log "$(basename "$o" .cu.o): $(cuobjdump -res-usage "$o" 2>&1 | grep -A1 'bwd_[kd][vq]_kernel' | grep -o 'REG:[0-9]* STACK:[0-9]*' | paste -sd' ')"
done

# Correctness first: a failure is not timed.
bin=$BLD/tests/cpp/flashattn_test_head_dim_v
tcap=$(cap 200)
for path in sm90 auto; do
  ( if [ "$path" = auto ]; then unset FLASHATTN_CUDA_PATH; else export FLASHATTN_CUDA_PATH=$path; fi
    if [ -x $bin ]; then timeout "$tcap" $bin > "$OUT/s10dv-gtest-$path.log" 2>&1; echo $? > "$OUT/s10dv-gtest-$path.rc"
    else echo "no gtest binary" > "$OUT/s10dv-gtest-$path.log"; echo 1 > "$OUT/s10dv-gtest-$path.rc"; fi
    PYTHONPATH=$PKG timeout "$tcap" python3 -X faulthandler -m pytest tests/python/test_cuda.py -k head_dim_v -q -rs \
      -p no:cacheprovider > "$OUT/s10dv-pytest-$path.log" 2>&1
    echo $? > "$OUT/s10dv-pytest-$path.rc" ) &
done
wait
ok=1
for path in sm90 auto; do
  log "FLASHATTN_CUDA_PATH=$path: gtest rc=$(cat "$OUT/s10dv-gtest-$path.rc")" \
    "$(grep -E '^\[  (PASSED|FAILED) ' "$OUT/s10dv-gtest-$path.log" | head -1);" \
    "pytest rc=$(cat "$OUT/s10dv-pytest-$path.rc") $(tail -1 "$OUT/s10dv-pytest-$path.log")"
  grep -E '^\[  FAILED ' "$OUT/s10dv-gtest-$path.log" | head -5 | tee -a "$SUM"
  grep -E '^(FAILED|ERROR) ' "$OUT/s10dv-pytest-$path.log" | head -8 | tee -a "$SUM"
  [ "$(cat "$OUT/s10dv-gtest-$path.rc")" = 0 ] && [ "$(cat "$OUT/s10dv-pytest-$path.rc")" = 0 ] || ok=0
done
grep -E "SKIPPED.*192_128_sm90" "$OUT/s10dv-pytest-sm90.log" | head -3 | tee -a "$SUM"
if [ $ok = 0 ]; then log "tests failed: not timed"; log "$(t done)"; exit 1; fi
log "$(t tests)"

PYTHONPATH=$PKG timeout "$(cap 150)" python3 bench/bench.py --suite dsv3 --seqlens 2048,4096,8192 \
  --impls flashattn,sdpa_cudnn --repeats 20 --out "$OUT/s10dv-dsv3.json" > "$OUT/s10dv-bench.log" 2>&1
log "$(t "bench rc=$?")"
grep -E "error|Error" "$OUT/s10dv-bench.log" | head -3 | tee -a "$SUM"
REF=bench/results/h200-2026-12-02-dsv3-7a3a69e.json
for fig in bwd_tflops fwd_tflops; do
  python3 dev/ab_table.py --figure $fig "$REF" "$OUT/s10dv-dsv3.json" | tee -a "$SUM"
  python3 dev/ab_table.py --figure $fig "$OUT/s10dv-dsv3.json" | tee -a "$SUM"
done
log "$(t done)"
