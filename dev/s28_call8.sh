#!/usr/bin/env bash
# Session script (s28 call 8, deleted after its run): the slow kvcache state after sdpa_math
# (calls 5, 7): bench.measure over row (1, 4096) with flashattn, kvcache, sdpa_math, then at
# b8 x 64k measure() of flashattn and kvcache, then func / kvcache / cuDNN SDPA on one set of
# tensors (cuDNN on the bshd tensors' bhsd views).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT/r"
if [ ! -d /tmp/ab-m/flashattn ]; then
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-m \
  -Cbuild-dir=build-ab-m -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128;576" \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . >"$OUT/r/pip.log" 2>&1 || { tail -30 "$OUT/r/pip.log"; exit 1; }
fi
export PYTHONPATH=/tmp/ab-m
timeout 200 python3 - <<'PY' 2>&1 | grep -v -i "warn\|return F" | tee "$OUT/r/probe.log"
import sys, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
sys.path.insert(0, "bench")
import bench, flashattn
impls, _ = bench.attention_impls(["flashattn", "kvcache", "sdpa_math"])
def t(fn): return bench.median_ms(fn, 10) * 1e3
def same(tag):
    b, sk = 8, 65536
    q = torch.randn(b, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, sk, 8, 128, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
    sl = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    f = lambda: flashattn.flash_attn_func(q, k, v)
    c = lambda: flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=sl)
    def cud():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)
    with torch.no_grad():
        print(f"{tag}: func {t(f):.1f} kvcache {t(c):.1f} cudnn {t(cud):.1f} func {t(f):.1f} kvcache {t(c):.1f}", flush=True)
same("clean")
for shape in ((1, 32, 8, 1, 4096, 128, False), (8, 32, 8, 1, 65536, 128, False)):
    for name in ("flashattn", "kvcache", "sdpa_math"):
        if shape[0] == 8 and name == "sdpa_math":
            continue
        r = bench.measure(impls[name], name, shape, torch.bfloat16, False, 10, graph=True)
        print(f"measure b{shape[0]} sk{shape[4]} {name}: {r.get('fwd_ms', 0) * 1e3:.1f} graph {r.get('fwd_ms_graph', 0) * 1e3:.1f}", flush=True)
same("after")
torch.cuda.empty_cache()
same("after empty_cache")
PY
tar czf "$OUT/s28c8.tgz" -C "$OUT" r && rm -rf "$OUT/r"
