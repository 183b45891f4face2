"""Times PyTorch SDPA (cuDNN and flash backends) forward at the dev/fwd_check bench shapes."""
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

def bench(fn, reps=30):
    for _ in range(5):
        fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]

for d in (64, 128, 256):
    for n in (512, 2048, 8192, 16384):
        for causal in (False, True):
            b, h = 16384 // n, 2048 // d
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            flops = 4 * b * h * n * n * d / (2 if causal else 1)
            row = f"sdpa d{d} n{n} causal{int(causal)}:"
            for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
                try:
                    with sdpa_kernel([be]):
                        ms = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                    row += f" {name} {ms:.3f} ms {flops / ms / 1e9:.1f} TF"
                except RuntimeError as e:
                    row += f" {name} n/a"
            print(row, flush=True)

# Decode: q length 1, 32 query heads over 8 KV heads (expanded for SDPA), d128, bf16.
for b, sk in ((1, 4096), (8, 65536), (8, 131072), (64, 4096), (64, 16384)):
    q = torch.randn(b, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, 8, sk, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    kv_bytes = 2 * k.numel() * 2
    row = f"sdpa decode b{b} sk{sk}:"
    for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel([be]):
                ms = bench(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
            row += f" {name} {ms * 1e3:.1f} us {kv_bytes / ms / 1e9:.2f} TB/s"
        except RuntimeError:
            row += f" {name} n/a"
    print(row, flush=True)
