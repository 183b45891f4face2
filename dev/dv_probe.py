"""head_dim 192 / head_dim_v 128 (DeepSeek-V3 prefill) against SDPA cuDNN, same process, bf16:
forward and backward TFLOP/s with the FLOPs of the unequal dims (forward 2*B*H*N^2*(d + dv),
halved under causal; backward 2.5x). Batch = 16k / N, 16 heads. Device time (CUDA events,
median of --repeats). Writes JSON to --out. Usage: python3 dev/dv_probe.py --out X.json"""
import argparse
import json
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn
from probe_timing import timed

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--repeats", type=int, default=20)
ap.add_argument("--seqlens", default="1024,2048,4096,8192,16384")
args = ap.parse_args()


rows = []
d, dv, h = 192, 128, 16
for n in (int(x) for x in args.seqlens.split(",")):
    b = max(1, 16384 // n)
    for causal in (False, True):
        fl = 2.0 * b * h * n * n * (d + dv) / (2 if causal else 1)
        q = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, n, h, dv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dout = torch.randn(b, n, h, dv, device="cuda", dtype=torch.bfloat16)
        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_(True) for x in (q, k, v))
        doutt = dout.transpose(1, 2)
        row = {"d": d, "dv": dv, "seqlen": n, "batch": b, "heads": h, "causal": causal}
        # ours
        out = flashattn.flash_attn_func(q, k, v, causal=causal)
        ref = None
        try:
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            row["max_abs_diff_vs_cudnn"] = (out - ref.transpose(1, 2)).abs().max().item()
        except Exception as e:  # noqa: BLE001
            row["cudnn_error"] = str(e)[:200]
        with torch.no_grad():
            t = timed(lambda: flashattn.flash_attn_func(q, k, v, causal=causal), args.repeats)
        row["ours_fwd_tflops"] = fl / t / 1e12
        t = timed(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), args.repeats)
        row["ours_bwd_tflops"] = 2.5 * fl / t / 1e12
        if ref is not None:
            def cfwd():
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]), torch.no_grad():
                    F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            row["cudnn_fwd_tflops"] = fl / timed(cfwd, args.repeats) / 1e12
            t = timed(lambda: torch.autograd.grad(ref, (qt, kt, vt), doutt, retain_graph=True), args.repeats)
            row["cudnn_bwd_tflops"] = 2.5 * fl / t / 1e12
        rows.append(row)
        print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
        del q, k, v, qt, kt, vt, out, ref
env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}
json.dump({"environment": env, "rows": rows}, open(args.out, "w"), indent=1)
