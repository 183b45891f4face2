#!/usr/bin/env bash
# Session script (s20 call 4, deleted after its run): branch s20-dbias16 with the reduction from -0:
# test_bias.py (auto and -k sm90 under sm90), flashattn_test_bias (auto), and where the d64
# (1,H,N,N) dbias call at 2 x 32 x 8k spends its time (torch.profiler).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT"
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -Cbuild-dir=build-gpu/python \
  -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" \
  -Ccmake.define.FLASHATTN_BUILD_TESTS=ON . >"$OUT/pip.log" 2>&1 || { tail -30 "$OUT/pip.log"; exit 1; }
echo "$(el) built"
cmake --build build-gpu/python -j 16 --target flashattn_test_bias >"$OUT/gtest-build.log" 2>&1 \
  || { tail -30 "$OUT/gtest-build.log"; exit 1; }
build-gpu/python/tests/cpp/flashattn_test_bias >"$OUT/gt-bias.log" 2>&1 &
python3 -m pytest tests/python/test_bias.py -q -rs -p no:cacheprovider >"$OUT/t-bias.log" 2>&1 &
FLASHATTN_CUDA_PATH=sm90 python3 -m pytest tests/python/test_bias.py -k "sm90 or dbias_in_bias" -q -rs -p no:cacheprovider >"$OUT/t-bias90.log" 2>&1 &
wait
echo "$(el) flashattn_test_bias: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/gt-bias.log" | tr '\n' ' ')"; grep -E '^\[  FAILED  \] [A-Z]' "$OUT/gt-bias.log" | head -6
for t in bias bias90; do echo "$(el) test_$t.py: $(tail -1 "$OUT/t-$t.log")"; grep -E "^(FAILED|ERROR)|Error:" "$OUT/t-$t.log" | head -8; done
python3 - <<'PY' 2>&1 | grep -v Warn | tail -12
import torch, flashattn
from torch.profiler import profile, ProfilerActivity
b, n, h, d = 2, 8192, 32, 64
q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
dout = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16)
bias = torch.randn(1, h, n, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
out = flashattn.flash_attn_func(q, k, v, attn_bias=bias)
fn = lambda: torch.autograd.grad(out, (q, k, v, bias), dout, retain_graph=True)
for _ in range(2): fn()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as p:
    for _ in range(3): fn()
    torch.cuda.synchronize()
print("== d64 2 x 32 x 8k bias (1,H,N,N) dbias, per call us (device, then CPU-side):")
for e in sorted(p.key_averages(), key=lambda e: -e.device_time_total)[:5]:
    print(f"  {e.device_time_total / 3:10.1f}  {e.key[:90]}")
for e in sorted(p.key_averages(), key=lambda e: -e.cpu_time_total)[:5]:
    print(f"  cpu {e.cpu_time_total / 3:10.1f}  {e.key[:90]}")
PY
( cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log )
echo "total $(el)"
