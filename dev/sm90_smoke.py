import torch, flashattn, sys, time
torch.manual_seed(0)
for d in (64, 128, 256):
    for causal in (False, True):
        b, s, h = 2, 1000, 8
        q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, s + 37, 2, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, s + 37, 2, d, device="cuda", dtype=torch.bfloat16)
        out = flashattn.flash_attn_func(q, k, v, causal=causal)
        torch.cuda.synchronize()
        kk = k.repeat_interleave(4, dim=2); vv = v.repeat_interleave(4, dim=2)
        ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(1,2).double(), kk.transpose(1,2).double(), vv.transpose(1,2).double(),
            attn_mask=(torch.ones(s, s+37, device="cuda", dtype=torch.bool).tril(37) if causal else None)).transpose(1,2)
        err = (out.double() - ref).abs().max().item()
        print(f"d{d} causal={causal}: max err {err:.4f} nan={torch.isnan(out).any().item()}", flush=True)
