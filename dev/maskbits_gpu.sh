#!/usr/bin/env bash
# attn_mask packed into bits on the Hopper bias forward (branch sm90-mask-bits; dev/NOTES.md
# "attn_mask as bits on the Hopper forward"). One H200, 16 cores, < 500 s, from the worktree root:
#   bash dev/maskbits_gpu.sh
#  1. one d64;128 fp16+bf16 sm90 package (pip, with the gtests configured);
#  2. while the gtest binary builds: tests/python/test_bias.py under FLASHATTN_CUDA_PATH=sm90 (its
#     SM90_CASES assert that the bits path ran exactly where expected, _C._sm90_mask_bits_calls);
#  3. the BiasSm90 gtests under sm90 (bits cases counted too), then compute-sanitizer memcheck on
#     two small bits cases (d128 bias + contiguous mask over 264 keys, causal; odd 267-byte rows);
#  4. dev/bias90_probe.py, ours against SDPA (efficient, cuDNN) in one process: bias + mask
#     (BHNNm: bits at d128, the mask slot at d64), bias alone, mask alone (tile) and mask alone in
#     rows of N + 8 bytes (maskodd: bits), d128 and d64, 8 x 2k and 1 x 16k.
# Writes $OUT/probe.json and $OUT/logs.tgz; a short table last.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cap() { local left=$(( 490 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 280 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/pk \
  -Cbuild-dir=/tmp/bld -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" \
  -Ccmake.define.FLASHATTN_BUILD_TESTS=ON . > /tmp/logs/pip.log 2>&1
[ -d /tmp/pk/flashattn ] || { echo "package build failed"; grep -E "error" /tmp/logs/pip.log | head -20; exit 1; }
t "package built"
export PYTHONPATH=/tmp/pk
(timeout "$(cap 150)" cmake --build /tmp/bld -j 12 --target flashattn_test_bias > /tmp/logs/gt.log 2>&1 ||
   grep -E "error" /tmp/logs/gt.log | head -5; t "gtest built") &
FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 170)" python3 -m pytest tests/python/test_bias.py -q -p no:cacheprovider \
  > /tmp/logs/py-sm90.log 2>&1
PY="pytest test_bias.py (sm90): $(tail -1 /tmp/logs/py-sm90.log)"
echo "$PY"; grep -E "^FAILED|^ERROR" /tmp/logs/py-sm90.log | head -10
wait; t "pytest"
BI=$(find /tmp/bld -name flashattn_test_bias -type f | head -1)
GT="BiasSm90 gtests: binary not built"; MC="memcheck: not run"
if [ -n "$BI" ]; then
  FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 90)" "$BI" --gtest_filter='*BiasSm90*' > /tmp/logs/gt-sm90.log 2>&1
  GT="BiasSm90 gtests (sm90): rc $? $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' /tmp/logs/gt-sm90.log | paste -sd' ')"
  echo "$GT"; grep -E '^\[  FAILED  \] All' /tmp/logs/gt-sm90.log | head -8
  F='*BiasSm90*sm90_d128_bias_mask_bits_causal:*BiasSm90*sm90_d128_fp16_bias_mask_bits_odd_rows_window'
  FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 90)" compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 10 \
    "$BI" --gtest_filter="$F" > /tmp/logs/san-memcheck.txt 2>&1
  MC="memcheck (2 bits cases): rc $? $(grep -E 'ERROR SUMMARY' /tmp/logs/san-memcheck.txt | tail -1) ok $(grep -c 'OK \]' /tmp/logs/san-memcheck.txt)"
  echo "$MC"
fi
t "gtests, memcheck"
tar czf "$OUT/logs.tgz" -C /tmp/logs .
timeout "$(cap 200)" python3 dev/bias90_probe.py --out "$OUT/probe.json" --no-sm80 --head-dims 128,64 \
  --shapes 8x2048,1x16384 --kinds BHNNm,BHNN,mask,maskodd > /tmp/logs/probe.log 2>&1
t "probe rc $?"
tar czf "$OUT/logs.tgz" -C /tmp/logs .
echo "$PY"; echo "$GT"; echo "$MC"
python3 - "$OUT/probe.json" <<'EOF'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except Exception as e:  # noqa: BLE001
    sys.exit(f"no probe table: {e}")
print("forward TFLOP/s, bf16, 16 heads   ours  cuDNN  ours/cuDNN  bits  sm90")
for r in rows:
    cu = r.get("sdpa_cudnn_fwd")
    ratio = f"{r['flashattn_fwd'] / cu:9.2f}x" if isinstance(cu, float) else "        -"
    cus = f"{cu:6.1f}" if isinstance(cu, float) else "     -"
    print(f"d{r['d']:<3} {r['batch']}x{r['seqlen']:<6} {r['kind']:<8}      {r['flashattn_fwd']:6.1f} {cus} {ratio}"
          f"  {'y' if r.get('mask_bits') else 'n':>4}  {'y' if r['sm90_ran'] else 'n':>4}")
EOF
