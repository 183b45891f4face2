"""Additive bias (issue 18's "bias >= 1.0x SDPA") against SDPA with the same float attn_mask,
cuDNN and memory-efficient backends, same process, bf16, d128 (--head-dim), 2048 / d heads, batch = 16k / N:
forward, backward, and backward with the bias's gradient. Bias shapes (B, H, N, N) and
(1, H, N, N) (T5-style, shared over the batch). TFLOP/s with the attention FLOPs (4 B H N^2 d
forward, 2.5x backward; "bwd" with a bias that needs no gradient, "bwd_dbias" with it).
Usage: python3 dev/bias_probe.py --out X.json [--seqlens 1024,4096] [--head-dim 64] [--sm80] [--variants] [--mask]"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn
from probe_timing import timed

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--repeats", type=int, default=10)
ap.add_argument("--seqlens", default="1024,2048,4096")
ap.add_argument("--sm80", action="store_true", help="also time our backward on the sm80 kernels (flashattn_sm80_*)")
ap.add_argument("--variants", action="store_true",
                help="also time our backward without a bias and with ALiBi at zero slopes (flashattn_nobias_*, _alibi0_*)")
ap.add_argument("--head-dim", type=int, default=128)
ap.add_argument("--mask", action="store_true", help="also rows with attn_mask alone (flashattn sm90 / sm80 against SDPA)")
args = ap.parse_args()


def timed_r(fn):
    return timed(fn, args.repeats)


def record(row):
    rows.append(row)
    print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)


def sdpa_peer(row, name, be, mask, out, qt, kt, vt, doutt, fl, bias_grad=False):
    """SDPA's backend `be` with attn_mask `mask` (B, H, N, D tensors qt, kt, vt): its largest
    difference from our `out` and its backward TFLOP/s; with bias_grad (`mask` a float bias that
    requires grad) also its forward, and its backward without dbias (`_bwd`) and with it
    (`_bwd_dbias`). A backend that refuses the call leaves `{name}_error`."""
    try:
        with sdpa_kernel([be]):
            ref = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)
        row[f"{name}_max_abs_diff"] = (out - ref.transpose(1, 2)).abs().max().item()
        if not bias_grad:
            row[f"{name}_bwd"] = 2.5 * fl / timed_r(
                lambda: torch.autograd.grad(ref, (qt, kt, vt), doutt, retain_graph=True)) / 1e12
            return

        def fwd():
            with sdpa_kernel([be]), torch.no_grad():
                F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)
        row[f"{name}_fwd"] = fl / timed_r(fwd) / 1e12
        with sdpa_kernel([be]):
            ref_nograd = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask.detach())
        row[f"{name}_bwd"] = 2.5 * fl / timed_r(
            lambda: torch.autograd.grad(ref_nograd, (qt, kt, vt), doutt, retain_graph=True)) / 1e12
        del ref_nograd
        row[f"{name}_bwd_dbias"] = 2.5 * fl / timed_r(
            lambda: torch.autograd.grad(ref, (qt, kt, vt, mask), doutt, retain_graph=True)) / 1e12
    except Exception as e:  # noqa: BLE001
        row[f"{name}_error"] = str(e).splitlines()[0][:160]


rows = []
d = args.head_dim
h = 2048 // d
backends = {"sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}
for n in (int(x) for x in args.seqlens.split(",")):
    b = max(1, 16384 // n)
    for shared in (False, True):
        fl = 4.0 * b * h * n * n * d
        q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        bias = torch.randn(1 if shared else b, h, n, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dout = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16)
        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_(True) for x in (q, k, v))
        doutt = dout.transpose(1, 2)
        row = {"d": d, "seqlen": n, "batch": b, "heads": h, "bias": "1,H,N,N" if shared else "B,H,N,N"}
        out = flashattn.flash_attn_func(q, k, v, attn_bias=bias)
        with torch.no_grad():
            row["flashattn_fwd"] = fl / timed_r(lambda: flashattn.flash_attn_func(q, k, v, attn_bias=bias)) / 1e12
        # bwd: a bias that needs no gradient (no dbias); bwd_dbias: with it.
        out_nograd = flashattn.flash_attn_func(q, k, v, attn_bias=bias.detach())
        row["flashattn_bwd"] = 2.5 * fl / timed_r(
            lambda: torch.autograd.grad(out_nograd, (q, k, v), dout, retain_graph=True)) / 1e12
        row["flashattn_bwd_dbias"] = 2.5 * fl / timed_r(
            lambda: torch.autograd.grad(out, (q, k, v, bias), dout, retain_graph=True)) / 1e12
        if args.variants:
            # Our backward without a bias (the plain kernels), and with ALiBi at zero slopes (the
            # bias kernel's softcap / ALiBi pass, same values).
            out_plain = flashattn.flash_attn_func(q, k, v)
            row["flashattn_nobias_bwd"] = 2.5 * fl / timed_r(
                lambda: torch.autograd.grad(out_plain, (q, k, v), dout, retain_graph=True)) / 1e12
            zero = torch.zeros(h, device="cuda", dtype=torch.float32)
            out_a0 = flashattn.flash_attn_func(q, k, v, attn_bias=bias, alibi_slopes=zero)
            row["flashattn_alibi0_bwd_dbias"] = 2.5 * fl / timed_r(
                lambda: torch.autograd.grad(out_a0, (q, k, v, bias), dout, retain_graph=True)) / 1e12
            del out_plain, out_a0
        if args.sm80:  # the same backward on the sm80 kernels (switch bwd_sm80), same process
            saved = flashattn._C._set_switch("bwd_sm80", True)
            try:
                row["flashattn_sm80_bwd_dbias"] = 2.5 * fl / timed_r(
                    lambda: torch.autograd.grad(out, (q, k, v, bias), dout, retain_graph=True)) / 1e12
            finally:
                flashattn._C._set_switch("bwd_sm80", saved)
        del out_nograd
        for name, be in backends.items():
            sdpa_peer(row, name, be, bias, out, qt, kt, vt, doutt, fl, bias_grad=True)
        record(row)
        del q, k, v, qt, kt, vt, out, bias
        torch.cuda.empty_cache()
# --mask: attn_mask alone (a boolean (B, 1, N, N) mask keeping 90% of the keys, every row's first
# kept), our backward on sm90 (the mask packed into bits) and sm80, SDPA with the same mask.
if args.mask:
    for n in (int(x) for x in args.seqlens.split(",")):
        b = max(1, 16384 // n)
        fl = 4.0 * b * h * n * n * d
        q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        keep = torch.rand(b, 1, n, n, device="cuda") < 0.9
        keep[..., 0] = True
        dout = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16)
        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_(True) for x in (q, k, v))
        doutt = dout.transpose(1, 2)
        row = {"d": d, "seqlen": n, "batch": b, "heads": h, "mask": "B,1,N,N"}
        out = flashattn.flash_attn_func(q, k, v, attn_mask=keep)
        with torch.no_grad():
            row["flashattn_fwd"] = fl / timed_r(lambda: flashattn.flash_attn_func(q, k, v, attn_mask=keep)) / 1e12
        row["flashattn_bwd"] = 2.5 * fl / timed_r(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)) / 1e12
        saved = flashattn._C._set_switch("bwd_sm80", True)
        try:
            row["flashattn_sm80_bwd"] = 2.5 * fl / timed_r(
                lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)) / 1e12
        finally:
            flashattn._C._set_switch("bwd_sm80", saved)
        for name, be in backends.items():
            sdpa_peer(row, name, be, keep, out, qt, kt, vt, doutt, fl)
        record(row)
        del q, k, v, qt, kt, vt, out, keep
        torch.cuda.empty_cache()
env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
       "date_utc": __import__("datetime").datetime.now(__import__("datetime").timezone.utc).isoformat(timespec="seconds")}
json.dump({"environment": env, "rows": rows}, open(args.out, "w"), indent=1)
