"""Varlen forward and backward device time for an A/B of the kernels' prologue (s36's cu_seqlens
clamps, dev/NOTES.md to-do 22): ragged packs of ~16k query rows (lengths drawn once from a fixed
seed, so every variant times the same pack), bf16, 16 heads, causal and not, on the path
FLASHATTN_CUDA_PATH selects; softcap 30 on request (the sm90 modifier backward). Also times one
varlen decode step (64 sequences of one query against 4k keys each, packed K/V). TFLOP/s with the
FLOPs of each sequence's own rectangle (4 * H * d * sum(nq_i * nk_i), halved under causal as
bench.py does for square pairs; backward 2.5x). Device time (CUDA events, median of --repeats).
Usage: python3 dev/varlen_probe.py --out X.json [--head-dims 64,128] [--softcap 30]"""
import argparse
import json
import os
import random

import torch

import flashattn
from probe_timing import timed

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--repeats", type=int, default=20)
ap.add_argument("--head-dims", default="128")
ap.add_argument("--softcap", type=float, default=0.0)
args = ap.parse_args()

rng = random.Random(1234)
packs = {
    # (name, query lengths, key lengths): short documents, long ones, and a decode step
    "short": [rng.randint(100, 1100) for _ in range(28)],
    "long": [rng.randint(2000, 6000) for _ in range(4)],
}
h = 16
rows = []
for d in (int(x) for x in args.head_dims.split(",")):
    for name, lens in packs.items():
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
        total, mx = int(cu[-1]), max(lens)
        for causal in (False, True):
            fl = 4.0 * h * d * sum(n * n for n in lens) / (2 if causal else 1)
            q, k, v = (torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            dout = torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16)

            def fwd():
                return flashattn.flash_attn_varlen_func(q, k, v, cu, cu, mx, mx, causal=causal,
                                                        softcap=args.softcap)
            out = fwd()
            row = {"d": d, "pack": name, "total": total, "causal": causal, "softcap": args.softcap}
            with torch.no_grad():
                row["fwd_tflops"] = fl / timed(fwd, args.repeats) / 1e12
            t = timed(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), args.repeats)
            row["bwd_tflops"] = 2.5 * fl / t / 1e12
            rows.append(row)
            print(" ".join(f"{a}={b:.4g}" if isinstance(b, float) else f"{a}={b}" for a, b in row.items()),
                  flush=True)
            del q, k, v, out, dout
    # one decode step: 64 sequences x 1 query against 4096 packed keys each, 32 heads over 8
    bq, nk, hq, hk = 64, 4096, 32, 8
    q = torch.randn(bq, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(bq * nk, hk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(bq * nk, hk, d, device="cuda", dtype=torch.bfloat16)
    cu_q = torch.arange(bq + 1, dtype=torch.int32, device="cuda")
    cu_k = torch.arange(bq + 1, dtype=torch.int32, device="cuda") * nk
    with torch.no_grad():
        t = timed(lambda: flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 1, nk, causal=True), args.repeats)
    row = {"d": d, "pack": "decode64x4k", "tb_per_s": 2 * bq * nk * hk * d * 2 / t / 1e12, "us": t * 1e6}
    rows.append(row)
    print(" ".join(f"{a}={b:.4g}" if isinstance(b, float) else f"{a}={b}" for a, b in row.items()), flush=True)
env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
       "path": os.environ.get("FLASHATTN_CUDA_PATH", "auto"), "flashattn": flashattn.__file__}
json.dump({"environment": env, "rows": rows}, open(args.out, "w"), indent=1)
