#!/usr/bin/env bash
# Session script (s29 call 4, deleted after its run): the decode-after-sdpa_math slowdown (NOTES
# item 14) inside bench.py's own flow. The decode suite with flashattn, kvcache, sdpa_math; at
# b8 x 64k and b64 x 16k, inside the flashattn and the kvcache peers' rows, both kernels (func and
# kvcache) are timed on that row's tensors and on fresh clones of them: a slow figure that follows
# the tensors (both kernels) is placement, one that follows the kernel is the kernel.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT/r"
if [ ! -d /tmp/ab-m/flashattn ]; then
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-m \
  -Cbuild-dir=build-ab-m -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128" \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . >"$OUT/r/pip.log" 2>&1 || { tail -30 "$OUT/r/pip.log"; exit 1; }
fi
export PYTHONPATH=/tmp/ab-m
timeout 400 python3 - <<'PY' 2>&1 | grep -v -i "warn\|return F" | tee "$OUT/r/probe.log"
import sys, torch
sys.path.insert(0, "bench")
import bench, flashattn
impls, _ = bench.attention_impls(["flashattn", "kvcache", "sdpa_math"])
def t(fn): return bench.median_ms(fn, 10) * 1e3
def probe(tag, q, k, v):
    b, sk = k.shape[0], k.shape[1]
    if (b, sk) not in ((8, 65536), (64, 16384)):
        return
    sl = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    kc, vc = k.clone(), v.clone()
    f = lambda kk, vv: (lambda: flashattn.flash_attn_func(q, kk, vv))
    c = lambda kk, vv: (lambda: flashattn.flash_attn_with_kvcache(q, kk, vv, cache_seqlens=sl))
    print(f"probe b{b} sk{sk} in {tag} row (k at {k.data_ptr():#x}, v at {v.data_ptr():#x}, clones {kc.data_ptr():#x}, {vc.data_ptr():#x}): "
          f"func {t(f(k, v)):.1f} kvcache {t(c(k, v)):.1f} | on clones func {t(f(kc, vc)):.1f} kvcache {t(c(kc, vc)):.1f} | "
          f"again func {t(f(k, v)):.1f} kvcache {t(c(k, v)):.1f} us", flush=True)
    del kc, vc
for name in ("flashattn", "kvcache"):
    inner = impls[name].fn
    def wrapped(q, k, v, causal, inner=inner, name=name, seen=set()):
        key = (k.data_ptr(), tuple(k.shape))
        if key not in seen:
            seen.add(key)
            with torch.no_grad():
                probe(name, q, k, v)
        return inner(q, k, v, causal)
    impls[name].fn = wrapped
bench.run_decode_suite(impls, 10)
PY
tar czf "$OUT/s29c4.tgz" -C "$OUT" r && rm -rf "$OUT/r"
