#!/usr/bin/env bash
# Session script (s21 call 1, deleted after its run): branch s21-dbias (dbias-reduce-rows merged):
# the reduction's and the causal zeroing's kernel times, bias_probe d64/d128, test_bias.py and
# flashattn_test_bias under auto and sm90, then the sm90 sparse backward gtests.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT/r"
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -Cbuild-dir=build-gpu/python \
  -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" \
  -Ccmake.define.FLASHATTN_BUILD_TESTS=ON . >"$OUT/r/pip.log" 2>&1 || { tail -30 "$OUT/r/pip.log"; exit 1; }
echo "$(el) built"
(cmake --build build-gpu/python -j 16 --target flashattn_test_bias flashattn_test_sparse >"$OUT/r/gtest-build.log" 2>&1 \
  && echo "$(el) gtests built") || tail -20 "$OUT/r/gtest-build.log" &
gtb=$!
python3 - <<'PY' 2>&1 | grep -v Warn | tee "$OUT/r/profile.txt" | tail -24
import torch, flashattn
from torch.profiler import profile, ProfilerActivity
for b, n, bb, h, d, causal in ((2, 8192, 1, 32, 64, False), (8, 2048, 1, 32, 64, False),
                               (8, 2048, 8, 16, 128, True), (2, 8192, 2, 16, 128, True)):
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(bb, h, n, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = flashattn.flash_attn_func(q, k, v, attn_bias=bias, causal=causal)
    fn = lambda: torch.autograd.grad(out, (q, k, v, bias), dout, retain_graph=True)
    fn(); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(2): fn()
        torch.cuda.synchronize()
    for e in sorted(p.key_averages(), key=lambda e: -e.device_time_total)[:5]:
        print(f"{b}x{h}x{n} d{d} ({bb},H) causal={causal} {e.device_time_total / 2:10.1f}  {e.key[:80]}")
    del q, k, v, bias, out
    torch.cuda.empty_cache()
PY
echo "$(el) profiled"
git_rev=$(git rev-parse --short HEAD 2>/dev/null || echo s21)
for d in 64 128; do
  python3 dev/bias_probe.py --head-dim $d --seqlens 2048,8192 --out "$OUT/r/probe-d$d.json" 2>&1 | grep -v Warn | tail -4
done
echo "$(el) probes"
python3 -m pytest tests/python/test_bias.py -q -x -p no:cacheprovider 2>&1 | tail -2
FLASHATTN_CUDA_PATH=sm90 python3 -m pytest tests/python/test_bias.py -q -x -p no:cacheprovider 2>&1 | tail -2
echo "$(el) pytest"
wait $gtb
T=build-gpu/python/tests/cpp
$T/flashattn_test_bias 2>&1 | tail -3
FLASHATTN_CUDA_PATH=sm90 $T/flashattn_test_bias 2>&1 | tail -3
echo "$(el) gtest bias"
FLASHATTN_CUDA_PATH=sm90 timeout 200 $T/flashattn_test_sparse \
  --gtest_filter='All/SparseSm90Bwd.*:SparseSm90BwdDispatch.*:All/SparseSm90.*' >"$OUT/r/sparse.log" 2>&1; echo "sparse rc=$?"
grep -E "FAILED|PASSED|tests ran" "$OUT/r/sparse.log" | tail -5
echo "total $(el)"
tar czf "$OUT/s21c1.tgz" -C "$OUT" r && rm -rf "$OUT/r"
