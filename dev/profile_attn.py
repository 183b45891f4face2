"""One call of flashattn and of each peer on the same shape, inside a cudaProfilerStart/Stop
window, for dev/ncu_attn.sh. The pass is "fwd" (one forward each), "fwd8" (ours with q, k, v
converted to float8 e4m3, descales 1; the peers in bf16 as with "fwd") or "bwd" (one backward
each, from a forward run outside the window). Peers (PEERS, comma-separated, default sdpa_flash):
sdpa_flash (FlashAttention-2), sdpa_cudnn, fa4 (flash_attn.cute, forward and backward on the same
q, k, v as ours; its JIT compiles happen in the warm-up, outside the window).
D may be D/DV: v and out have head dim DV (e.g. 192/128, DeepSeek-V3's prefill). BIAS=full: a bf16
(B, H, N, N) attn_bias (the peers' attn_mask) that requires grad in the backward (not with causal).
MASK=full: a bool (B, 1, N, N) attn_mask, a random half of the keys of each row kept (the peers'
bool attn_mask; not with BIAS or causal).
Usage: [PEERS=sdpa_cudnn,fa4] [BIAS=full | MASK=full] profile_attn.py fwd|fwd8|bwd B H N D[/DV] [causal]."""
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn

pass_ = sys.argv[1]
b, h, n = (int(x) for x in sys.argv[2:5])
d, dv = (int(x) for x in (sys.argv[5] + "/" + sys.argv[5]).split("/")[:2])
causal = len(sys.argv) > 6 and sys.argv[6] == "causal"
backward = pass_ == "bwd"
q, k, v = (torch.randn(b, n, h, x, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
           for x in (d, d, dv))
qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_(backward) for x in (q, k, v))
dout = torch.randn(b, n, h, dv, device="cuda", dtype=torch.bfloat16)
bias = None
if os.environ.get("BIAS") == "full":
    bias = torch.randn(b, h, n, n, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
mask = None
if os.environ.get("MASK") == "full":
    mask = torch.rand(b, 1, n, n, device="cuda") < 0.5


q8, k8, v8 = ((x.detach().to(torch.float8_e4m3fn) for x in (q, k, v)) if pass_ == "fwd8" else (q, k, v))


def ours():
    return flashattn.flash_attn_func(q8, k8, v8, causal=causal, attn_bias=bias, attn_mask=mask)


def sdpa(backend):
    def call():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=bias if mask is None else mask,
                                                  is_causal=causal).transpose(1, 2)
    return call


def fa4():
    from flash_attn.cute import flash_attn_func as fa4_func
    out = fa4_func(q, k, v, causal=causal)
    return out[0] if isinstance(out, tuple) else out


peers = {"sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION), "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
         "sdpa_efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION), "fa4": fa4}
names = os.environ.get("PEERS", "sdpa_flash").split(",")
unknown = [n for n in names if n not in peers]
if unknown:
    sys.exit(f"PEERS: unknown {unknown}; known: {sorted(peers)}")
calls = [ours] + [peers[n] for n in names]

for _ in range(3):  # warm-up outside the profiled window
    for f in calls:
        o = f()
        if backward:
            o.backward(dout)
outs = [f() for f in calls] if backward else None
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
if backward:
    for o in outs:
        o.backward(dout)
else:
    for f in calls:
        f()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
