#!/usr/bin/env bash
# Session script (s21 call 2, deleted after its run): branch s21-dbias with the workspace allocator
# and the 16-byte hidden zeroing: kernel times, bias_probe d64/d128 (d64 also with the pool),
# test_bias.py / test_cuda.py, flashattn_test_bias and _c_api, memcheck of the dbias tests.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT/r"
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -Cbuild-dir=build-gpu/python \
  -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" \
  -Ccmake.define.FLASHATTN_BUILD_TESTS=ON . >"$OUT/r/pip.log" 2>&1 || { tail -30 "$OUT/r/pip.log"; exit 1; }
echo "$(el) built"
(cmake --build build-gpu/python -j 16 --target flashattn_test_bias flashattn_test_c_api >"$OUT/r/gtest-build.log" 2>&1 \
  && echo "$(el) gtests built") || tail -20 "$OUT/r/gtest-build.log" &
gtb=$!
python3 - <<'PY' 2>&1 | grep -v Warn | tee "$OUT/r/profile.txt" | tail -24
import torch, flashattn
from torch.profiler import profile, ProfilerActivity
for b, n, bb, h, d, causal in ((2, 8192, 1, 32, 64, False), (8, 2048, 1, 32, 64, False),
                               (8, 2048, 8, 16, 128, True), (2, 8192, 2, 16, 128, True), (2, 8192, 1, 16, 128, True)):
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(bb, h, n, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = flashattn.flash_attn_func(q, k, v, attn_bias=bias, causal=causal)
    fn = lambda: torch.autograd.grad(out, (q, k, v, bias), dout, retain_graph=True)
    fn(); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(2): fn()
        torch.cuda.synchronize()
    for e in sorted(p.key_averages(), key=lambda e: -e.device_time_total)[:4]:
        print(f"{b}x{h}x{n} d{d} ({bb},H) causal={causal} {e.device_time_total / 2:10.1f}  {e.key[:80]}")
    del q, k, v, bias, out
    torch.cuda.empty_cache()
PY
echo "$(el) profiled"
for d in 64 128; do
  python3 dev/bias_probe.py --head-dim $d --seqlens 2048,8192 --out "$OUT/r/probe-d$d.json" 2>&1 | grep -v Warn | tail -4
done
FLASHATTN_TORCH_WORKSPACE=0 python3 dev/bias_probe.py --head-dim 64 --seqlens 2048,8192 --out "$OUT/r/probe-d64-pool.json" 2>&1 | grep -v Warn | tail -4
echo "$(el) probes"
python3 -m pytest tests/python/test_bias.py -q -x -p no:cacheprovider 2>&1 | tail -2
FLASHATTN_CUDA_PATH=sm90 python3 -m pytest tests/python/test_bias.py -q -x -p no:cacheprovider 2>&1 | tail -2
timeout 150 python3 -m pytest tests/python/test_cuda.py -q -x -p no:cacheprovider 2>&1 | tail -2
echo "$(el) pytest"
wait $gtb
T=build-gpu/python/tests/cpp
$T/flashattn_test_c_api 2>&1 | tail -2
$T/flashattn_test_bias 2>&1 | tail -3
FLASHATTN_CUDA_PATH=sm90 $T/flashattn_test_bias 2>&1 | tail -3
echo "$(el) gtest"
timeout 150 compute-sanitizer --tool memcheck python3 -m pytest tests/python/test_bias.py -q -x -p no:cacheprovider \
  -k "dbias_in_bias_dtype or broadcast_patterns or large_workspace" >"$OUT/r/memcheck.log" 2>&1; echo "memcheck rc=$?"
grep -E "ERROR SUMMARY|passed|failed" "$OUT/r/memcheck.log" | tail -3
echo "total $(el)"
tar czf "$OUT/s21c2.tgz" -C "$OUT" r && rm -rf "$OUT/r"
