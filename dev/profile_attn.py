"""One call of flashattn and of SDPA's flash (FlashAttention-2) backend on the same shape, inside
a cudaProfilerStart/Stop window, for dev/ncu_attn.sh. The pass is "fwd" (one forward each) or
"bwd" (one backward each, from a forward run outside the window).
Usage: profile_attn.py fwd|bwd B H N D [causal]."""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn

pass_ = sys.argv[1]
b, h, n, d = (int(x) for x in sys.argv[2:6])
causal = len(sys.argv) > 6 and sys.argv[6] == "causal"
backward = pass_ == "bwd"
q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
           for _ in range(3))
qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_(backward) for x in (q, k, v))
dout = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16)


def ours():
    return flashattn.flash_attn_func(q, k, v, causal=causal)


def sdpa():
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)


for _ in range(3):  # warm-up outside the profiled window
    for f in (ours, sdpa):
        o = f()
        if backward:
            o.backward(dout)
outs = [f() for f in (ours, sdpa)] if backward else None
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
if backward:
    for o in outs:
        o.backward(dout)
else:
    ours()
    sdpa()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
