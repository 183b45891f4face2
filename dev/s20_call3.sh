#!/usr/bin/env bash
# Session script (s20 call 3, deleted after its run): branch s20-dbias16 (the dbias reduction loads
# eight terms ahead; dbias in the bias's 16-bit dtype): test_bias.py (auto, and -k sm90 under
# sm90), flashattn_test_bias (auto and sm90), test_cuda + test_block_sparse, the dbias kernels'
# times under torch.profiler, bias_probe at d128 and d64.
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
FLASHATTN_CUDA_PATH=sm90 build-gpu/python/tests/cpp/flashattn_test_bias >"$OUT/gt-bias90.log" 2>&1 &
python3 -m pytest tests/python/test_bias.py -q -rs -p no:cacheprovider >"$OUT/t-bias.log" 2>&1 &
FLASHATTN_CUDA_PATH=sm90 python3 -m pytest tests/python/test_bias.py -k sm90 -q -rs -p no:cacheprovider >"$OUT/t-bias90.log" 2>&1 &
timeout 240 python3 -m pytest tests/python/test_cuda.py tests/python/test_block_sparse.py -q -rs -p no:cacheprovider >"$OUT/t-cuda.log" 2>&1 &
wait
echo "$(el) test_cuda + test_block_sparse: $(tail -1 "$OUT/t-cuda.log")"; grep -E "^(FAILED|ERROR)" "$OUT/t-cuda.log" | head -8
for t in bias bias90; do
  echo "$(el) flashattn_test_$t: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/gt-$t.log" | tr '\n' ' ')"; grep -E '^\[  FAILED  \] [A-Z]' "$OUT/gt-$t.log" | head -6
  echo "$(el) test_$t.py: $(tail -1 "$OUT/t-$t.log")"; grep -E "^(FAILED|ERROR)" "$OUT/t-$t.log" | head -8
done
python3 - <<'PY' 2>&1 | grep -v Warn | tail -20
import torch, flashattn
from torch.profiler import profile, ProfilerActivity
torch.manual_seed(0)
for d, h, bb in ((128, 16, 1), (64, 32, 1), (128, 16, 8)):
    b, n = 8, 2048
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(bb, h, n, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = flashattn.flash_attn_func(q, k, v, attn_bias=bias)
    fn = lambda: torch.autograd.grad(out, (q, k, v, bias), dout, retain_graph=True)
    dbias_dtype = fn()[3].dtype
    for _ in range(3): fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(5): fn()
        torch.cuda.synchronize()
    print(f"== d{d} 8 x {h} x 2k bias ({bb},H,N,N) dbias {dbias_dtype}, per call us:")
    for e in sorted(p.key_averages(), key=lambda e: -e.device_time_total)[:4]:
        print(f"  {e.device_time_total / 5:9.1f}  {e.key[:100]}")
    del q, k, v, bias, out
PY
python3 dev/bias_probe.py --seqlens 2048,8192 --out "$OUT/bias-probe-d128.json" 2>&1 | tail -4
python3 dev/bias_probe.py --seqlens 2048,8192 --head-dim 64 --out "$OUT/bias-probe-d64.json" 2>&1 | tail -4
( cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log )
echo "total $(el)"
