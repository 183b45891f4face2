#!/usr/bin/env bash
# Session script (s28 call 4, deleted after its run): why flash_attn_with_kvcache on a dense cache
# took 555 us at b8 x 64k in call 3 against flash_attn_func's 485 on the same keys (473 / 473 on
# 2026-12-02): per-kernel device time of both and of the paged-16 cache, and kvcache's time per
# fixed split count.
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
timeout 200 python3 - <<'PY' 2>&1 | grep -v Warning | tee "$OUT/r/probe.log"
import sys, torch
sys.path.insert(0, "bench"); sys.path.insert(0, "dev")
import bench, flashattn
from kernel_split import kernel_times
for b, sk in ((8, 65536), (64, 16384), (1, 4096)):
    q = torch.randn(b, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, sk, 8, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    seqlens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    pages = b * sk // 16
    perm = torch.randperm(pages, device="cuda")
    kc = torch.empty((pages, 16, 8, 128), dtype=k.dtype, device="cuda"); vc = torch.empty_like(kc)
    kc[perm] = k.reshape(pages, 16, 8, 128); vc[perm] = v.reshape(pages, 16, 8, 128)
    table = perm.to(torch.int32).view(b, sk // 16)
    calls = {
        "func": lambda: flashattn.flash_attn_func(q, k, v),
        "kvcache": lambda: flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens),
        "kvcache_noseqlens": lambda: flashattn.flash_attn_with_kvcache(q, k, v),
        "paged16": lambda: flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table),
    }
    for s in (1, 2, 4, 8, 16):
        calls[f"kvcache_s{s}"] = (lambda s=s: flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, num_splits=s))
    with torch.no_grad():
        for name, fn in calls.items():
            t = bench.median_ms(fn, 10) * 1e3
            rows = kernel_times(fn, 10)
            ks = "; ".join(f"{us:.1f} x{cnt:.0f} {nm[:90]}" for us, cnt, nm in rows[:3])
            print(f"b{b} sk{sk} {name}: {t:.1f} us | {ks}", flush=True)
PY
echo "$(el) done"
tar czf "$OUT/s28c4.tgz" -C "$OUT" r && rm -rf "$OUT/r"
