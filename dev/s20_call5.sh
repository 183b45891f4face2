#!/usr/bin/env bash
# Session script (s20 call 5, deleted after its run): branch dbias-reduce-rows on a d64 bf16 build:
# the reduction's time at 2 x 32 x 8k (1,H,N,N) first, then test_bias.py (its d64 bf16 cases).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT"
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -Cbuild-dir=build-gpu/python \
  -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64 \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . >"$OUT/pip.log" 2>&1 || { tail -30 "$OUT/pip.log"; exit 1; }
echo "$(el) built"
python3 - <<'PY' 2>&1 | grep -v Warn | tail -8
import torch, flashattn
from torch.profiler import profile, ProfilerActivity
for b, n, bb in ((2, 8192, 1), (8, 2048, 1)):
    h, d = 32, 64
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(bb, h, n, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = flashattn.flash_attn_func(q, k, v, attn_bias=bias)
    fn = lambda: torch.autograd.grad(out, (q, k, v, bias), dout, retain_graph=True)
    fn(); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(2): fn()
        torch.cuda.synchronize()
    for e in sorted(p.key_averages(), key=lambda e: -e.device_time_total)[:4]:
        print(f"{b}x{h}x{n} ({bb},H) {e.device_time_total / 2:10.1f}  {e.key[:80]}")
    del q, k, v, bias, out
    torch.cuda.empty_cache()
PY
echo "$(el) profiled"
python3 -m pytest tests/python/test_bias.py -q -x -p no:cacheprovider 2>&1 | tail -3
echo "total $(el)"
