"""Speculative-decoding steps (2-4 query tokens, causal, against a KV cache; bf16, d128, 32 query
heads over 8 KV heads): flash_attn_with_kvcache with the GQA group folded into the decode tile's
rows (the default) and without (the no_token_fold switch, one query head per CTA), dense and paged
(16-row pages), and SDPA cuDNN on the same tensors (enable_gqa, no mask: the same bytes; its
causal mask would be top-left aligned), all in one process. --timing device (default): bench.py's
median_ms with a GPU sleep queued before each timed call, so the figure is GPU execution alone;
eager: CUDA events around each call on an idle GPU, host dispatch included (the first run,
2026-12-05, was eager: its batch-1 rows were host-bound). Effective bandwidth = the cache bytes
the step reads (2 * B * N * Hk * d * 2) / time.
Usage: python3 dev/spec_decode_probe.py --out X.json"""
import argparse
import json

import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import bench  # noqa: E402  (median_ms and its device timing)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--repeats", type=int, default=30)
ap.add_argument("--timing", choices=("device", "eager"), default="device")
args = ap.parse_args()
bench.TIMING["mode"] = args.timing


def timed(fn, repeats):
    """Median seconds of one call (bench.median_ms)."""
    return bench.median_ms(fn, repeats) * 1e-3


h, hk, d, page = 32, 8, 128, 16
rows = []
for b, n in ((1, 4096), (8, 4096), (8, 16384), (32, 8192), (64, 4096)):
    kc = torch.randn(b, n, hk, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn(b, n, hk, d, device="cuda", dtype=torch.bfloat16)
    nblk = n // page
    table = torch.randperm(b * nblk, device="cuda").to(torch.int32).view(b, nblk)
    kp = kc.reshape(b * nblk, page, hk, d)[table.view(-1).argsort()].contiguous()
    vp = vc.reshape(b * nblk, page, hk, d)[table.view(-1).argsort()].contiguous()
    seqlens = torch.full((b,), n, dtype=torch.int32, device="cuda")
    kt, vt = kc.transpose(1, 2), vc.transpose(1, 2)
    gbytes = 2 * b * n * hk * d * 2
    for sq in (2, 4):
        q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
        row = {"kind": "spec_decode", "batch": b, "seqlen_k": n, "seqlen_q": sq}
        for name, kk, vv, tab in (("dense", kc, vc, None), ("paged16", kp, vp, table)):
            def step():
                return flashattn.flash_attn_with_kvcache(q, kk, vv, cache_seqlens=seqlens, block_table=tab, causal=True)
            for fold in (True, False):
                was = flashattn._C._set_switch("no_token_fold", not fold)
                try:
                    with torch.no_grad():
                        t = timed(step, args.repeats)
                finally:
                    flashattn._C._set_switch("no_token_fold", was)
                key = f"{name}_{'fold' if fold else 'nofold'}"
                row[key + "_us"] = t * 1e6
                row[key + "_tbs"] = gbytes / t / 1e12
        qt = q.transpose(1, 2)

        def cudnn():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]), torch.no_grad():
                return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
        try:
            t = timed(cudnn, args.repeats)
            row["cudnn_us"], row["cudnn_tbs"] = t * 1e6, gbytes / t / 1e12
        except Exception as e:  # noqa: BLE001
            row["cudnn_error"] = str(e)[:200]
        rows.append(row)
        print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
env = bench.environment()  # GPU, versions, date, git state (bench.py's)
json.dump({"suite": "spec_decode", "repeats": args.repeats, "timing_mode": args.timing, "environment": env,
           "rows": rows}, open(args.out, "w"), indent=1)
