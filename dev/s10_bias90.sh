#!/usr/bin/env bash
# Tenth session: the Hopper forward with attn_bias / attn_mask (branch sm90-fwd-bias,
# FwdBiasTraits: the bias tile by the copy engine with the K tile, read with ldmatrix in the S
# accumulator layout; attn_mask per element). Written without a GPU: compiled, not yet run. One
# call on one H200 (16 cores), under 560 s:
#  1. the pip package, head dims 64;128 bf16, with the gtests (one build dir);
#  2. test_bias.py under FLASHATTN_CUDA_PATH=sm90 (every bias case the sm90 kernel takes) and
#     its sm90 cases under auto (a failure is printed; the timing still runs, so the lead sees
#     both);
#  3. dev/bias90_probe.py: forward TFLOP/s, ours (auto: the sm90 bias kernel where it takes the
#     call) / ours on sm80 / SDPA efficient / SDPA cuDNN at d64 and d128, 8 x 2k and 1 x 16k, bias
#     (B,H,N,N), (1,H,N,N), (B,1,1,N) and attn_mask alone; its table is printed last;
#  4. the gtests (built in the background meanwhile): BiasSm90 under sm90 and auto, then as time
#     allows ctest bias|sparse|layout under sm90.
# Writes $OUT/s10-bias90-summary.txt and $OUT/s10-bias90-probe.json.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}
mkdir -p "$OUT"
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
# Seconds for a step: its own cap, or what is left of the budget if less (at least 1).
cap() { local left=$(( 560 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
SUM=$OUT/s10-bias90-summary.txt
: > "$SUM"
log() { echo "$*" | tee -a "$SUM"; }

rm -rf /tmp/s10b-pk  # a stale package must not pass for this build
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout "$(cap 300)" python3 -m pip install --no-build-isolation --no-deps -q --upgrade \
  --target /tmp/s10b-pk -Cbuild-dir=/tmp/s10b-bb -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \
  "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 \
  -Ccmake.define.FLASHATTN_BUILD_TESTS=ON . > /tmp/s10b-pip.log 2>&1
[ -d /tmp/s10b-pk/flashattn ] || { log "package build failed:"; grep -E "error" /tmp/s10b-pip.log | head -20 | tee -a "$SUM"; exit 1; }
log "$(t "package built")"
# The gtests (bias, block_sparse, sparse, layout) in the same build dir, in the background
# while pytest runs.
(timeout "$(cap 200)" cmake --build /tmp/s10b-bb -j 8 --target flashattn_test_bias flashattn_test_block_sparse \
  flashattn_test_sparse flashattn_test_layout > /tmp/s10b-gt.log 2>&1; echo "gtest build rc $?" >> /tmp/s10b-gt.log) &
GT=$!
export PYTHONPATH=/tmp/s10b-pk

res=$(FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 110)" python3 -m pytest tests/python/test_bias.py -q -p no:cacheprovider \
  -k "cuda" 2>&1)
log "test_bias.py cuda (sm90): $(echo "$res" | tail -1)"
echo "$res" | grep -E "^FAILED|^E  " | head -20 | tee -a "$SUM"
res=$(timeout "$(cap 40)" python3 -m pytest tests/python/test_bias.py -q -p no:cacheprovider -k "sm90" 2>&1)
log "test_bias.py sm90 cases (auto): $(echo "$res" | tail -1)"
echo "$res" | grep -E "^FAILED|^E  " | head -10 | tee -a "$SUM"
log "$(t pytest)"

# The timing before the remaining suites, so that it is in even if they run long.
timeout "$(cap 130)" python3 dev/bias90_probe.py --out "$OUT/s10-bias90-probe.json" > /tmp/s10b-probe.log 2>&1
grep -E "Error|error" /tmp/s10b-probe.log | grep -v "_error=" | head -3 | tee -a "$SUM"
log "$(t probe)"

wait $GT
tail -1 /tmp/s10b-gt.log | tee -a "$SUM"
grep -E "error" /tmp/s10b-gt.log | head -5 | tee -a "$SUM"
bin=$(find /tmp/s10b-bb -name flashattn_test_bias -type f | head -1)
if [ -n "$bin" ]; then
  for path in sm90 auto; do
    r=$(FLASHATTN_CUDA_PATH=$path timeout "$(cap 40)" "$bin" --gtest_filter='*BiasSm90*' 2>&1)
    log "gtest BiasSm90 ($path): $(echo "$r" | grep -E "^\[  (PASSED|FAILED)  \]" | tr '\n' ' ')"
    echo "$r" | grep -E "Failure|FAILED  \]|error" | head -12 | tee -a "$SUM"
  done
fi
if [ $(( $(date +%s) - T0 )) -lt 480 ]; then
  FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 90)" ctest --test-dir /tmp/s10b-bb -j 6 --timeout 80 -L "bias|sparse|layout" \
    > /tmp/s10b-ct.log 2>&1
  log "ctest sm90 bias|sparse|layout: $(grep -E 'tests passed|tests failed' /tmp/s10b-ct.log)"
  grep -E "\(Failed\)|Timeout" /tmp/s10b-ct.log | head -8 | tee -a "$SUM"
fi
log "$(t done)"
sed -n '/^forward TFLOP/,$p' /tmp/s10b-probe.log | tee -a "$SUM"
