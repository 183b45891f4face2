#!/usr/bin/env bash
# Session script (s28 call 6, deleted after its run): call 5 reproduced kvcache's slow rows only
# with sdpa_flash / sdpa_efficient / sdpa_math in the suite. In one process: the (1, 131072) row
# with every decode peer, then at b8 x 64k func and kvcache on the SAME fresh tensors, each
# alternated, then kvcache on new tensors; per-kernel time of the slow case.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT/r"
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
if [ ! -d /tmp/ab-m/flashattn ]; then
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-m \
  -Cbuild-dir=build-ab-m -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128;576" \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . >"$OUT/r/pip.log" 2>&1 || { tail -30 "$OUT/r/pip.log"; exit 1; }
fi
echo "$(el) built"
export PYTHONPATH=/tmp/ab-m
timeout 200 python3 - <<'PY' 2>&1 | grep -v -i warn | tee "$OUT/r/probe.log"
import sys, torch
sys.path.insert(0, "bench"); sys.path.insert(0, "dev")
import bench, flashattn
from kernel_split import kernel_times
impls, _ = bench.attention_impls(list(bench.DECODE_IMPLS))
def t(fn): return bench.median_ms(fn, 10) * 1e3
def pair(tag, b, sk):
    q = torch.randn(b, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, sk, 8, 128, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
    sl = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    f = lambda: flashattn.flash_attn_func(q, k, v)
    c = lambda: flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=sl)
    c0 = lambda: flashattn.flash_attn_with_kvcache(q, k, v)
    with torch.no_grad():
        print(f"{tag} b{b} sk{sk}: func {t(f):.1f} kvcache {t(c):.1f} func {t(f):.1f} kvcache {t(c):.1f} "
              f"kvcache(no seqlens) {t(c0):.1f} | k at {k.data_ptr():#x}", flush=True)
        return c
with torch.no_grad():
    pair("clean", 8, 65536)
    for name in ("flashattn", "kvcache", "kvcache_paged16", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "sdpa_math"):
        r = bench.measure(impls[name], name, (1, 32, 8, 1, 131072, 128, False), torch.bfloat16, False, 10, graph=True)
        print(f"row 1x131072 {name}: {r.get('fwd_ms', 0) * 1e3:.1f} graph {r.get('fwd_ms_graph', 0) * 1e3:.1f}", flush=True)
    print("allocated", torch.cuda.memory_allocated() >> 20, "MiB reserved", torch.cuda.memory_reserved() >> 20, "MiB")
    c = pair("after-row", 8, 65536)
    pair("after-row again", 8, 65536)
    for us, cnt, nm in kernel_times(c, 10)[:4]:
        print(f"  kvcache kernels: {us:.1f} x{cnt:.0f} {nm[:150]}")
    torch.cuda.empty_cache()
    pair("after empty_cache", 8, 65536)
PY
echo "$(el) done"
tar czf "$OUT/s28c6.tgz" -C "$OUT" r && rm -rf "$OUT/r"
