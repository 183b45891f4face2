"""Bitwise A/B of the attn_bias paths (dev/NOTES.md "Bias tiles through shared memory"): run
once per build, each writing its outputs, LSEs and gradients for a fixed set of seeded cases,
then compare (the ninth session compared the FLASHATTN_DEV_BIAS_SMEM build, since made the
default at d128 and the macro removed, against the per-element reads). The cases cover what
the copy handles (full and broadcast biases, a key-padding row of stride 0, ragged tiles, a padded row stride, varlen, fp16, the
window / softcap / ALiBi / attn_mask modifiers around it) and what falls back to the per-element
reads (a float32 bias, an odd key count). Usage:
  PYTHONPATH=/tmp/ab-base python3 dev/bias_smem_check.py --save /tmp/base.pt
  PYTHONPATH=/tmp/ab-bsm python3 dev/bias_smem_check.py --save /tmp/bsm.pt --compare /tmp/base.pt
--compare exits 1 unless every tensor is bitwise equal."""
import argparse
import sys
import zlib

import torch

import flashattn

ap = argparse.ArgumentParser()
ap.add_argument("--save", required=True)
ap.add_argument("--compare")
ap.add_argument("--no-fp16", action="store_true", help="skip the fp16 case (a bf16-only build)")
args = ap.parse_args()

dev = "cuda"
results = {}


def rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device=dev, dtype=dtype)


def run(name, q, k, v, leaf, view, fn, **kw):
    """Forward and backward (deterministic: dQ comes from the dQ kernel, which reads the bias per
    element either way; dK, dV and dBias from the main kernel) of one case."""
    grad_bias = not kw.get("softcap")  # (dbias with softcap was declined when this was written)
    for x in (q, k, v, leaf) if grad_bias else (q, k, v):
        x.requires_grad_(True)
    out, lse, _ = fn(q, k, v, attn_bias=view(leaf), return_attn_probs=True, deterministic=True, **kw)
    out.backward(torch.randn_like(out))
    dbias = leaf.grad if grad_bias else torch.zeros(0)
    results[name] = [t.detach().cpu() for t in (out, lse, q.grad, k.grad, v.grad, dbias)]


def dense(name, b, h, nq, nk, leaf, view=lambda x: x, dtype=torch.bfloat16, **kw):
    torch.manual_seed(zlib.crc32(name.encode()))
    q, k, v = rand(b, nq, h, 128, dtype=dtype), rand(b, nk, h, 128, dtype=dtype), rand(b, nk, h, 128, dtype=dtype)
    run(name, q, k, v, leaf, view, flashattn.flash_attn_func, **kw)


torch.manual_seed(0)
dense("full", 2, 4, 2048, 2048, rand(2, 4, 2048, 2048))
dense("shared_heads", 2, 4, 2048, 2048, rand(1, 4, 2048, 2048))
dense("key_padding", 2, 4, 1024, 1024, rand(2, 1, 1, 1024), lambda x: x.expand(2, 4, 1024, 1024))
dense("ragged_1000", 2, 4, 1000, 1000, rand(2, 4, 1000, 1000))
dense("ragged_q_only", 2, 4, 1000, 1024, rand(2, 4, 1000, 1024))
dense("padded_stride", 2, 4, 1000, 1000, rand(2, 4, 1000, 1024), lambda x: x[..., :1000])
dense("odd_keys_fallback", 2, 4, 1001, 1001, rand(2, 4, 1001, 1001))
dense("float32_fallback", 2, 4, 1024, 1024, rand(2, 4, 1024, 1024, dtype=torch.float32))
if not args.no_fp16:
    dense("fp16", 2, 4, 1024, 1024, rand(2, 4, 1024, 1024, dtype=torch.float16), dtype=torch.float16)
dense("causal", 2, 4, 1000, 1000, rand(2, 4, 1000, 1000), causal=True)
dense("window", 2, 4, 2048, 2048, rand(2, 4, 2048, 2048), window_size=(300, 100))
dense("softcap_alibi", 2, 4, 1024, 1024, rand(2, 4, 1024, 1024), softcap=30.0,
      alibi_slopes=torch.rand(4, device=dev, dtype=torch.float32))
dense("with_mask", 2, 4, 1024, 1024, rand(2, 4, 1024, 1024),
      attn_mask=torch.rand(2, 4, 1024, 1024, device=dev) > 0.2)

# Varlen: the bias over (max_seqlen_q, max_seqlen_k), indexed inside each sequence.
torch.manual_seed(1)
lens = [1000, 517, 333]
cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device=dev, dtype=torch.int32)
total = sum(lens)
run("varlen", rand(total, 4, 128), rand(total, 4, 128), rand(total, 4, 128), rand(3, 4, 1000, 1000), lambda x: x,
    lambda q, k, v, **kw: flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 1000, 1000, **kw))

torch.save(results, args.save)
if args.compare:
    ref = torch.load(args.compare)
    bad = 0
    names = ("out", "lse", "dq", "dk", "dv", "dbias")
    for name, tensors in results.items():
        diff = [n for n, a, b in zip(names, tensors, ref[name]) if not torch.equal(a, b)]
        bad += bool(diff)
        print(f"{name}: {'bitwise equal' if not diff else 'DIFFERS in ' + ', '.join(diff)}")
    sys.exit(1 if bad else 0)
