"""A GPT attention block as model code writes it with flash_attn, run with
``import flashattn as flash_attn`` against the same block on torch SDPA."""

import copy

import torch
import torch.nn.functional as F

import attn_ref
import torch_ref


class Block(torch.nn.Module):
    def __init__(self, dim, heads, use_flash):
        super().__init__()
        self.heads, self.use_flash = heads, use_flash
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        import flashattn as flash_attn

        b, s, dim = x.shape
        qkv = self.qkv(x).reshape(b, s, 3, self.heads, dim // self.heads)
        if self.use_flash:
            y = flash_attn.flash_attn_qkvpacked_func(qkv, causal=True)
        else:
            q, k, v = qkv.unbind(2)
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=True).transpose(1, 2)
        return self.proj(y.reshape(b, s, dim))


def outputs(model, x, dy):
    """[y, dx, *parameter grads] as numpy float64."""
    x = x.detach().clone().requires_grad_()
    model.zero_grad()
    y = model(x)
    y.backward(dy.to(y.dtype))
    grads = [torch_ref.to_numpy(p.grad) for p in model.parameters()]
    return [torch_ref.to_numpy(y), torch_ref.to_numpy(x.grad)] + grads


def run_check(device, dtype, atol, dim=64, heads=4):
    """flashattn block in dtype vs the SDPA block in float64 (reference) and in dtype (naive
    baseline), same weights; checks the output, dx and every parameter gradient."""
    torch.manual_seed(0)
    sdpa = Block(dim, heads, use_flash=False).to(device)
    flash = copy.deepcopy(sdpa)
    flash.use_flash = True
    x = torch.randn(2, 37, dim, device=device)
    dy = torch.randn(2, 37, dim, device=device)
    ref = outputs(copy.deepcopy(sdpa).double().cpu(), x.double().cpu(), dy.double().cpu())
    naive = outputs(copy.deepcopy(sdpa).to(dtype), x.to(dtype), dy)
    ours = outputs(flash.to(dtype), x.to(dtype), dy)
    names = ["y", "dx", "dWqkv", "dbqkv", "dWproj", "dbproj"]
    for name, o, r, n in zip(names, ours, ref, naive):
        attn_ref.assert_fa_close(name, o, r, n, atol)
