"""The forward with attn_bias / attn_mask on the Hopper bias kernel (sm90/fwd_kernel.h,
FwdBiasTraits) against the sm80 bias kernel (the fwd_sm80 switch, same process) and SDPA with the
same additive float attn_mask (memory-efficient and cuDNN backends), bf16, 16 heads. Bias kinds:
(B, H, N, N), (1, H, N, N) (T5-style), (B, 1, 1, N) (key padding) and an element mask alone
(B, 1, N, N; SDPA takes it as a bool mask), or a key-padding element mask (kind maskkp: B, 1, 1, N), or a (B, H, N, N) bias with a (B, 1, N, N)
element mask (kind BHNNm; SDPA takes the bias with -inf where the mask drops), or the element mask alone in rows of N + 8
bytes (kind maskodd: not 16-byte multiples, so no mask tile: packed into bits, sm90/mask_bits.h; maskkpodd: the
key-padding mask so). TFLOP/s with the attention
FLOPs (4 B H N^2 d; no causal rows). Each row also prints ours' max |difference| from SDPA-efficient, and records whether
the sm90 forward ran (sm90_ran), packed the mask into bits (mask_bits; builds with _C._sm90_mask_bits_calls) and ran
on the mask kernel (mask_kernel: attn_mask alone; builds with _C._sm90_mask_kernel_calls).
Usage: python3 dev/bias90_probe.py --out X.json [--head-dims 64,128] [--shapes 8x2048,1x16384]
       [--kinds BHNN,1HNN,B11N,mask,maskkp,BHNNm,maskodd,maskkpodd] [--no-sm80]"""
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
ap.add_argument("--head-dims", default="64,128")
ap.add_argument("--shapes", default="8x2048,1x16384", help="batch x seqlen, comma separated")
ap.add_argument("--kinds", default="BHNN,1HNN,B11N,mask")
ap.add_argument("--no-sm80", action="store_true", help="skip the sm80 bias kernel's timing")
ap.add_argument("--alibi0", action="store_true",
                help="also time ours with ALiBi at zero slopes (flashattn_alibi0_fwd): the bias kernel's "
                     "scores in log2 units whatever form a call without ALiBi takes (the A/B of branch "
                     "bias-natural-units, dev/NOTES.md)")
args = ap.parse_args()

h = 16
backends = {"sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}
rows = []


def ours(q, k, v, bias, mask, sm80, alibi=None):
    saved = flashattn._C._set_switch("fwd_sm80", sm80)
    try:
        return flashattn.flash_attn_func(q, k, v, attn_bias=bias, attn_mask=mask, alibi_slopes=alibi)
    finally:
        flashattn._C._set_switch("fwd_sm80", saved)


for d in (int(x) for x in args.head_dims.split(",")):
    for shape in args.shapes.split(","):
        b, n = (int(x) for x in shape.split("x"))
        fl = 4.0 * b * h * n * n * d
        q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        for kind in args.kinds.split(","):
            bias = mask = None
            if kind in ("mask", "maskkp", "maskodd", "maskkpodd"):
                pad = 8 if kind.endswith("odd") else 0
                rows_m = 1 if kind.startswith("maskkp") else n
                mask = (torch.rand(b, 1, rows_m, n + pad, device="cuda") < 0.9)[..., :n]
                sdpa_mask = mask
            else:
                lead = {"BHNN": (b, h, n), "1HNN": (1, h, n), "B11N": (b, 1, 1), "BHNNm": (b, h, n)}[kind]
                bias = torch.randn(*lead, n, device="cuda", dtype=torch.bfloat16)
                sdpa_mask = bias
                if kind == "BHNNm":
                    mask = torch.rand(b, 1, n, n, device="cuda") < 0.9
                    sdpa_mask = bias.masked_fill(~mask, float("-inf"))
            row = {"d": d, "batch": b, "seqlen": n, "heads": h, "kind": kind}
            with torch.no_grad():
                bits_calls = getattr(flashattn._C, "_sm90_mask_bits_calls", lambda: 0)
                mask_kernel_calls = getattr(flashattn._C, "_sm90_mask_kernel_calls", lambda: 0)
                before, bits_before, mk_before = flashattn._C._sm90_forward_calls(), bits_calls(), mask_kernel_calls()
                out = ours(q, k, v, bias, mask, False)
                row["sm90_ran"] = flashattn._C._sm90_forward_calls() > before
                row["mask_bits"] = bits_calls() > bits_before
                row["mask_kernel"] = mask_kernel_calls() > mk_before
                row["flashattn_fwd"] = fl / timed(lambda: ours(q, k, v, bias, mask, False), args.repeats) / 1e12
                if args.alibi0:
                    zero = torch.zeros(h, device="cuda", dtype=torch.float32)
                    out0 = ours(q, k, v, bias, mask, False, zero)
                    row["alibi0_max_abs_diff"] = (out0.float() - out.float()).abs().max().item()
                    row["flashattn_alibi0_fwd"] = fl / timed(lambda: ours(q, k, v, bias, mask, False, zero),
                                                             args.repeats) / 1e12
                if not args.no_sm80:
                    row["flashattn_sm80_fwd"] = fl / timed(lambda: ours(q, k, v, bias, mask, True), args.repeats) / 1e12
                for name, be in backends.items():
                    try:
                        with sdpa_kernel([be]):
                            ref = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=sdpa_mask)
                        if name == "sdpa_efficient":
                            row["max_abs_diff"] = (out - ref.transpose(1, 2)).abs().max().item()

                        def fwd():
                            with sdpa_kernel([be]):
                                F.scaled_dot_product_attention(qt, kt, vt, attn_mask=sdpa_mask)
                        row[f"{name}_fwd"] = fl / timed(fwd, args.repeats) / 1e12
                        del ref
                    except Exception as e:  # noqa: BLE001
                        row[f"{name}_error"] = str(e).splitlines()[0][:120]
            rows.append(row)
            print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
            del bias, mask, sdpa_mask, out
            torch.cuda.empty_cache()
        del q, k, v, qt, kt, vt
        torch.cuda.empty_cache()

env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}
json.dump({"environment": env, "rows": rows}, open(args.out, "w"), indent=1)


def f(r, key):
    v = r.get(key)
    return f"{v:7.1f}" if isinstance(v, float) else "      -"


print("\nforward TFLOP/s (bf16, 16 heads)      ours  ours-sm80  sdpa-eff  sdpa-cudnn  ours/eff  sm90  bits  max|d|"
      + ("  alibi0" if args.alibi0 else ""))
for r in rows:
    eff = r.get("sdpa_efficient_fwd")
    ratio = f"{r['flashattn_fwd'] / eff:8.2f}x" if isinstance(eff, float) else "        -"
    print(f"d{r['d']:<3} {r['batch']:>2}x{r['seqlen']:<6} {r['kind']:<6}          {f(r, 'flashattn_fwd')}  "
          f"{f(r, 'flashattn_sm80_fwd')}   {f(r, 'sdpa_efficient_fwd')}    {f(r, 'sdpa_cudnn_fwd')}  {ratio}  "
          f"{'y' if r['sm90_ran'] else 'n':>4}  {'y' if r.get('mask_bits') else 'n':>4}  "
          f"{r.get('max_abs_diff', float('nan')):.3g}" + (f"  {f(r, 'flashattn_alibi0_fwd')}" if args.alibi0 else ""))
