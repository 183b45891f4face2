#!/usr/bin/env bash
# Session script (s20 call 2, deleted after its run): branch s20-maskslot (dbias zeroing by memset,
# zero / reduce kernels with many rows per block; the sm90 backward's attn_mask rows copied into
# the bias slot and read by ldmatrix): test_bias.py (auto, and -k sm90 under sm90),
# flashattn_test_bias (auto and sm90: the strided dbias takes the zero kernel), memcheck /
# racecheck / synccheck of the mask san cases; kernel times under torch.profiler of the dbias calls
# and of the attn_mask-only backward; bias_probe --mask at d128 and d64.
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
gt() { ( [ "$2" = auto ] || export FLASHATTN_CUDA_PATH=$2; build-gpu/python/tests/cpp/$1 >"$OUT/gt-$1-$2.log" 2>&1 )
       echo "$(el) $1 ($2): $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/gt-$1-$2.log" | tr '\n' ' ')"; grep -E '^\[  FAILED  \] [A-Z]' "$OUT/gt-$1-$2.log" | head -6; }
python3 -m pytest tests/python/test_bias.py -q -rs -p no:cacheprovider >"$OUT/t-bias.log" 2>&1 &
FLASHATTN_CUDA_PATH=sm90 python3 -m pytest tests/python/test_bias.py -k sm90 -q -rs -p no:cacheprovider >"$OUT/t-bias90.log" 2>&1 &
gt flashattn_test_bias sm90 & gt flashattn_test_bias auto &
wait; for t in bias bias90; do echo "$(el) test_$t: $(tail -1 "$OUT/t-$t.log")"; grep -E "^(FAILED|ERROR)" "$OUT/t-$t.log" | head -8; done
san() { FLASHATTN_CUDA_PATH=sm90 timeout 200 compute-sanitizer --tool $1 --error-exitcode 9 python3 dev/san_cases.py \
          --only bwd_mask_d128_ragged,bwd_mask_d64_causal,bwd_bias_mask_bits_d128 >"$OUT/san-$1.log" 2>&1
        echo "$(el) $1 rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|SYNCCHECK SUMMARY' "$OUT/san-$1.log" | tail -1) $(grep -cE ' ok$' "$OUT/san-$1.log") ok, $(grep -c FAIL "$OUT/san-$1.log") FAIL"; }
san memcheck & san racecheck & san synccheck & wait
python3 - <<'PY' 2>&1 | grep -v Warn | tail -60
import torch, flashattn
from torch.profiler import profile, ProfilerActivity
torch.manual_seed(0)
def prof(label, fn, reps=5):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(reps): fn()
        torch.cuda.synchronize()
    print(f"== {label} per call, us:")
    for e in sorted(p.key_averages(), key=lambda e: -e.device_time_total)[:6]:
        print(f"  {e.device_time_total / reps:9.1f}  {e.key[:100]}")
b, h, n, d = 8, 16, 2048, 128
q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
dout = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16)
for label, bb, causal in (("bias B,H causal dbias", 8, True), ("bias 1,H dbias", 1, False)):
    bias = torch.randn(bb, h, n, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = flashattn.flash_attn_func(q, k, v, attn_bias=bias, causal=causal)
    prof(label, lambda: torch.autograd.grad(out, (q, k, v, bias), dout, retain_graph=True))
    del bias, out
bias = torch.randn(b, h, n, n, device="cuda", dtype=torch.bfloat16)
out = flashattn.flash_attn_func(q, k, v, attn_bias=bias)
prof("bias B,H no dbias", lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
keep = torch.rand(b, 1, n, n, device="cuda") < 0.9
out = flashattn.flash_attn_func(q, k, v, attn_mask=keep)
prof("mask B,1,N,N random", lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
pad = torch.arange(n, device="cuda")[None, None, None, :] < torch.tensor([n, n - 100, n // 2, n - 1] * 2, device="cuda")[:, None, None, None]
out = flashattn.flash_attn_func(q, k, v, attn_mask=pad)
prof("mask B,1,1,N key padding", lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
out = flashattn.flash_attn_func(q, k, v)
prof("no mask", lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
PY
echo "$(el) profiles"
python3 dev/bias_probe.py --seqlens 2048,8192 --mask --out "$OUT/bias-probe-d128.json" 2>&1 | tail -6
python3 dev/bias_probe.py --seqlens 2048,8192 --head-dim 64 --mask --out "$OUT/bias-probe-d64.json" 2>&1 | tail -6
( cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log )
echo "total $(el)"
