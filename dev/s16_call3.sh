#!/usr/bin/env bash
# s16 call 3 (< 450 s, from the repo root): the split-role backward's role P issuing the next
# S^T before its exponentials (-DFLASHATTN_DEV_SM90_BWD_PIPE_P) against the default, head dim
# 192 bf16 packages side by side (base also d128 for the decode look); test_cuda head_dim_v and
# d192 cases under sm90 on pipe; dsv3 2k/4k/8k base, pipe, base, pipe (own processes); then on
# base: the per-kernel split of the 192/128 backward against cuDNN and the batch-1 decode
# (per-kernel device time, the split sweep).
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs
declare -A flags=([base]="" [pipe]="-DFLASHATTN_DEV_SM90_BWD_PIPE_P")
declare -A dims=([base]="128;192" [pipe]="192")
for v in base pipe; do
  CMAKE_BUILD_PARALLEL_LEVEL=8 timeout 260 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/dv-$v \
    -Cbuild-dir=/tmp/bdv-$v -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=${dims[$v]}" \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 "-Ccmake.define.CMAKE_CUDA_FLAGS=${flags[$v]}" . > /tmp/logs/pip-$v.log 2>&1 &
done
wait; for v in base pipe; do [ -d /tmp/dv-$v/flashattn ] || { echo "build $v failed"; grep error /tmp/logs/pip-$v.log | head -5; exit 1; }; done
t built
FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/dv-pipe timeout 150 python3 -m pytest tests/python/test_cuda.py -q -p no:cacheprovider \
  -k "head_dim_v or 192" 2>&1 | tail -2
t tested
for v in base pipe base2 pipe2; do
  PYTHONPATH=/tmp/dv-${v%2} timeout 90 python3 bench/bench.py --suite dsv3 --impls flashattn,sdpa_cudnn --dtypes bf16 \
    --seqlens 2048,4096,8192 --repeats 20 --out $OUT/dv-$v.json > /tmp/logs/b-$v.log 2>&1; t "bench $v rc $?"
  grep -E "^bf16" /tmp/logs/b-$v.log | cut -c1-150
done
export PYTHONPATH=/tmp/dv-base
timeout 90 python3 dev/kernel_split.py --shapes 192/128:8192:c,192/128:8192,192/128:2048:c --impls flashattn,sdpa_cudnn \
  --out $OUT/split-dv.json > /tmp/logs/split-dv.txt 2>&1; t "split rc $?"
timeout 60 python3 dev/decode_splits.py --shapes 1x4096,1x16384 --splits 0,1,2,4,8,16,32 --out $OUT/dec-splits.json \
  > /tmp/logs/dec.log 2>&1; t "decode splits rc $?"; tail -4 /tmp/logs/dec.log
timeout 60 python3 - > /tmp/logs/dec-kernels.txt 2>&1 <<'PY'
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
    agg = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            agg.setdefault(e.name, []).append(getattr(e, "device_time_total", 0.0))
    print(name, {n[:70]: (round(sum(x) / 50, 2), len(x) // 50) for n, x in agg.items()})
PY
t "dec kernels rc $?"; cut -c1-400 /tmp/logs/dec-kernels.txt
tar czf $OUT/logs.tgz -C /tmp/logs .
grep -E "^ *[0-9.]+ us|us per call" /tmp/logs/split-dv.txt | cut -c1-140
