#!/usr/bin/env bash
# For the next GPU session (dev/NOTES.md "Measurements written for the next GPU session", item 5):
# is the Hopper backward's racecheck report (the copy engine's next LSE/D writes against every
# lane's reads, 16 sites on the block-sparse backward) a real race or the tool's? The dense d128
# correctness cases were too short to reuse a stage, so this runs one dense backward long enough
# to (1 x 2 x 1024, d128: 16 steps per CTA over 2 stages) under racecheck, on main and with
# FLASHATTN_DEV_SM90_BWD_SYNCWARP_RELEASE. One call on one H200, about 4 min.
# Writes $OUT/rc-{base,sw}.txt; the summary lines on stdout.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT"
PIP="python3 -m pip install --no-build-isolation --no-deps -q"
declare -A FLAGS=([base]="" [sw]="-DFLASHATTN_DEV_SM90_BWD_SYNCWARP_RELEASE")
for n in base sw; do
  (CMAKE_BUILD_PARALLEL_LEVEL=8 $PIP --target /tmp/rc-$n -Cbuild-dir=/tmp/rcb-$n -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \
    -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128 -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 \
    "-Ccmake.define.CMAKE_CUDA_FLAGS=${FLAGS[$n]}" . > /tmp/rc-pip-$n.log 2>&1 || { echo "$n build failed"; grep error /tmp/rc-pip-$n.log | head; }) &
done
wait; t built
cat > /tmp/rc_case.py <<'PY'
import torch, flashattn
torch.manual_seed(0)
for causal in (False, True):
    q, k, v = (torch.randn(1, 1024, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    out = flashattn.flash_attn_func(q, k, v, causal=causal)
    out.backward(torch.randn_like(out))
torch.cuda.synchronize()
print("ran; sm90 backward calls", flashattn._C._backward_calls()[0])
PY
for n in base sw; do
  PYTHONPATH=/tmp/rc-$n FLASHATTN_CUDA_PATH=sm90 timeout 150 compute-sanitizer --tool racecheck --print-limit 10 \
    python3 /tmp/rc_case.py > $OUT/rc-$n.txt 2>&1
  echo "$n: rc $? $(grep -E 'RACECHECK SUMMARY' $OUT/rc-$n.txt | tail -1) $(grep -E '^ran' $OUT/rc-$n.txt)"
done
t done
