#!/usr/bin/env bash
# Session script (s20 call 1, deleted after its run): branch s20-batch = dbias-rows + sm90-bwd-mask.
# test_bias.py (auto, and -k sm90 under sm90), flashattn_test_bias under sm90, memcheck / racecheck /
# synccheck of the mask-bits bias backward, the dbias kernels' times under torch.profiler
# (causal: zeroing; (1,H,N,N): the reduction), dev/bias_probe.py --sm80 --variants --mask.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT"
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -Cbuild-dir=build-gpu/python \
  -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" \
  -Ccmake.define.FLASHATTN_BUILD_TESTS=ON . >"$OUT/pip.log" 2>&1 || { tail -30 "$OUT/pip.log"; exit 1; }
echo "$(el) built"; grep -h "spill" "$OUT/pip.log" | sort | uniq -c | head -5
cmake --build build-gpu/python -j 16 --target flashattn_test_bias >"$OUT/gtest-build.log" 2>&1 \
  || { tail -30 "$OUT/gtest-build.log"; exit 1; }
echo "$(el) gtests built"
gt() { FLASHATTN_CUDA_PATH=sm90 build-gpu/python/tests/cpp/$1 >"$OUT/gt-$1.log" 2>&1
       echo "$(el) $1 (sm90): $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/gt-$1.log" | tr '\n' ' ')"; grep -E '^\[  FAILED  \] [A-Z]' "$OUT/gt-$1.log" | head -6; }
run() { local path=$1 name=$2; shift 2
  ( [ "$path" = auto ] || export FLASHATTN_CUDA_PATH=$path
    python3 -m pytest "$@" -q -rs -p no:cacheprovider >"$OUT/t-$name.log" 2>&1
    echo "$(el) $name: $(tail -1 "$OUT/t-$name.log")"; grep -E "^(FAILED|ERROR)" "$OUT/t-$name.log" | head -8 ); }
run auto bias-auto tests/python/test_bias.py &
run sm90 bias-sm90 tests/python/test_bias.py -k "sm90" &
gt flashattn_test_bias &
wait
san() { FLASHATTN_CUDA_PATH=sm90 timeout 200 compute-sanitizer --tool $1 --error-exitcode 9 python3 dev/san_cases.py \
          --only bwd_bias_mask_bits_d128,bwd_bias_d128_causal >"$OUT/san-$1.log" 2>&1
        echo "$(el) $1 rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|SYNCCHECK SUMMARY' "$OUT/san-$1.log" | tail -1) $(grep -cE ' ok$' "$OUT/san-$1.log") ok, $(grep -c FAIL "$OUT/san-$1.log") FAIL"; }
san memcheck & san racecheck & san synccheck & wait
python3 - <<'PY' 2>&1 | tail -30
import torch, flashattn
from torch.profiler import profile, ProfilerActivity
torch.manual_seed(0)
for label, bb, causal in (("B,H causal", 8, True), ("1,H", 1, False), ("B,H", 8, False)):
    b, h, n, d = 8, 16, 2048, 128
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    bias = torch.randn(bb, h, n, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = flashattn.flash_attn_func(q, k, v, attn_bias=bias, causal=causal)
    dout = torch.randn_like(out)
    for _ in range(3): torch.autograd.grad(out, (q, k, v, bias), dout, retain_graph=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(5): torch.autograd.grad(out, (q, k, v, bias), dout, retain_graph=True)
        torch.cuda.synchronize()
    print(f"== 8x16x2k d128 bias ({label}) per call, us:")
    for e in sorted(p.key_averages(), key=lambda e: -e.device_time_total)[:6]:
        print(f"  {e.device_time_total / 5:9.1f}  {e.key[:90]}")
PY
python3 dev/bias_probe.py --seqlens 2048,8192 --sm80 --variants --mask --out "$OUT/bias-probe-d128.json" 2>&1 | tail -6
( cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log )
echo "total $(el)"
