#!/usr/bin/env bash
# s16 call 2 (< 400 s, from the repo root): the dsv3 suite on the three-stage 192/128 backward
# (record), per-kernel split of the 192/128 backward against cuDNN (where the causal gap is), and
# the batch-1 decode: per-kernel device time and the split sweep (issue 17's 4k latency).
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 300 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/pk \
  -Cbuild-dir=/tmp/bpk -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128;192" \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . > /tmp/logs/pip.log 2>&1 || { tail -20 /tmp/logs/pip.log; exit 1; }
t built
export PYTHONPATH=/tmp/pk
timeout 150 python3 bench/bench.py --suite dsv3 --impls flashattn,sdpa_cudnn --dtypes bf16 --repeats 20 \
  --out $OUT/dsv3.json > /tmp/logs/dsv3.log 2>&1; t "dsv3 rc $?"
timeout 90 python3 dev/kernel_split.py --shapes 192/128:8192:c,192/128:8192,192/128:2048:c --impls flashattn,sdpa_cudnn \
  --out $OUT/split-dv.json > $OUT/split-dv.txt 2>&1; t "split rc $?"
timeout 60 python3 dev/decode_splits.py --shapes 1x4096,1x16384 --splits 0,1,2,4,8,16,32 --out $OUT/dec-splits.json \
  > /tmp/logs/dec.log 2>&1; t "decode splits rc $?"; cat /tmp/logs/dec.log | tail -4
timeout 60 python3 - > $OUT/dec-kernels.txt 2>&1 <<'PY'
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import profile, ProfilerActivity
import flashattn
q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, 4096, 8, 128, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
def cudnn():
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
calls = {"flash_attn_func": lambda: flashattn.flash_attn_func(q, k, v),
         "flash_attn_with_kvcache": lambda: flashattn.flash_attn_with_kvcache(q, k, v), "sdpa_cudnn": cudnn}
for name, fn in calls.items():
    for _ in range(20): fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(50): fn()
        torch.cuda.synchronize()
    ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    agg = {}
    for e in ev:
        agg.setdefault(e.name, []).append(getattr(e, "device_time_total", 0.0))
    print(name, {n[:80]: (round(sum(x) / 50, 2), len(x) // 50) for n, x in agg.items()})
PY
t "dec kernels rc $?"; cat $OUT/dec-kernels.txt | cut -c1-400
grep -E "^ *[0-9.]+ us|us per call" $OUT/split-dv.txt | cut -c1-140
grep -E "^bf16" /tmp/logs/dsv3.log | cut -c1-150
