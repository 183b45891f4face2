"""One forward of flashattn and of SDPA's flash (FlashAttention-2) backend on the same shape,
inside a cudaProfilerStart/Stop window, for dev/ncu_fwd.sh. Usage: profile_fwd.py B H N D [causal]."""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn

b, h, n, d = (int(x) for x in sys.argv[1:5])
causal = len(sys.argv) > 5 and sys.argv[5] == "causal"
q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))


def sdpa():
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)


for _ in range(3):  # warm-up outside the profiled window
    flashattn.flash_attn_func(q, k, v, causal=causal)
    sdpa()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
flashattn.flash_attn_func(q, k, v, causal=causal)
sdpa()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
