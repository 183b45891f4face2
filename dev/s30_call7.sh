#!/usr/bin/env bash
# s30 call 7: host time per decode call with the cluster launch against the counter merge
# (flash_attn_func and flash_attn_with_kvcache at batch 1 x 256 keys, GQA 32/8: two splits, a
# GPU time of a few us, so back-to-back calls measure the host), alternated in one process.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; R=$(pwd)
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -Cbuild-dir=build-py \
  -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128 \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . > $OUT/pip.log 2>&1 || { tail -20 $OUT/pip.log; exit 1; }
cd /tmp && timeout 120 python3 - <<'PY' 2>&1 | tee $OUT/s30-host-time.txt
import time, torch, flashattn
q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, 256, 8, 128, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
kc = torch.zeros(1, 4096, 8, 128, device="cuda", dtype=torch.bfloat16); vc = torch.zeros_like(kc)
kc[:, :256] = k; vc[:, :256] = v
sl = torch.tensor([256], dtype=torch.int32, device="cuda")
calls = {"func": lambda: flashattn.flash_attn_func(q, k, v),
         "kvcache": lambda: flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=sl)}
def host_us(fn, n=3000):
    for _ in range(50): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / n * 1e6
for p in range(3):
    for merge in ("cluster", "counter"):
        was = flashattn._C._set_switch("split_combine_counter", merge == "counter")
        c0 = flashattn._C._split_cluster_launches()
        res = {name: host_us(fn) for name, fn in calls.items()}
        ran = flashattn._C._split_cluster_launches() - c0
        flashattn._C._set_switch("split_combine_counter", was)
        print(f"pass {p} {merge}: " + "  ".join(f"{k} {v:.2f} us" for k, v in res.items()) + f"  (cluster launches {ran})", flush=True)
PY
