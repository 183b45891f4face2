"""Small calls of the Hopper kernels for compute-sanitizer (racecheck, synccheck, memcheck), each
long enough that every ring reuses its stages (>= 8 query blocks per key block), and each
checked against a float32 PyTorch reference so that a call that ran wrong is not reported as a
clean one. One process per tool:

  compute-sanitizer --tool racecheck python3 dev/san_cases.py [--only NAME,...]

Cases: the backward at d64 (128-row steps) and d128, unmasked and causal, 140-tile calls that
give persistent CTAs a second tile (static rounds and the tile feed), varlen with an empty sequence (tiles without steps; causal, and at d64 unmasked too), the deterministic d64 form, 192/128
causal (the split-role kernel), the d64 and d256 short-rows forwards (causal), the deterministic
backward (two kernels) at d128, and the forward
with attn_mask alone (the mask tile), with a key-padding mask, and attn_bias with attn_mask (the
mask as bits) at d64 and d128, and the backward with attn_bias and dbias (d128 causal, d64 key
padding; with softcap too), and the block-sparse backward at d64 and d128 (more tiles than SMs, tiles without a
step), and paged K/V in varlen calls (the sm80-class cache kernels and the sm90 cache kernel), and
device cu_seqlens out of every bound (the kernels' clamps). Needs a GPU and torch."""
import argparse
import sys

import torch

import flashattn


def ref(q, k, v, causal, keep=None, bias=None, softcap=0.0):
    """float32 attention on (B, N, H, D) tensors; keep: bool (B, 1, Nq, Nk) or None; bias:
    (B, H, Nq, Nk) added after the scale and softcap (SEMANTICS.md's order), or None."""
    qf, kf, vf = (x.float().transpose(1, 2) for x in (q, k, v))
    s = qf @ kf.transpose(-1, -2) * q.shape[-1] ** -0.5
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias.float()
    if causal:
        nq, nk = s.shape[-2:]
        i = torch.arange(nq, device=s.device)[:, None]
        j = torch.arange(nk, device=s.device)[None, :]
        s = s.masked_fill(j > i + nk - nq, float("-inf"))
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    return (torch.softmax(s, -1) @ vf).transpose(1, 2)


def rnd(*shape, d=torch.bfloat16, grad=False):
    return torch.randn(*shape, device="cuda", dtype=d).requires_grad_(grad)


def check(name, got, want, tol):
    # A sequence without query rows has nothing to compare (its shapes must still agree).
    assert got.shape == want.shape, (name, got.shape, want.shape)
    err = (got.float() - want.float()).abs().max().item() if got.numel() else 0.0
    ok = err <= tol
    print(f"{name}: max|d| {err:.4f} {'ok' if ok else 'FAIL'}", flush=True)
    return ok


def bwd_case(name, b, n, h, d, dv, causal, deterministic=False, bias_shape=None, with_mask=False, softcap=0.0):
    """A backward against float32 autograd; bias_shape: a bf16 attn_bias of that shape that
    requires grad (the Hopper bias backward), its dbias checked too; with_mask: an attn_mask
    (packed into bits there) that keeps every row's first key; softcap: the cap (with a bias
    that requires grad, the sm80 backward's own kernel that leaves the cap's factor for later)."""
    q, k = rnd(b, n, h, d, grad=True), rnd(b, n, h, d, grad=True)
    v = rnd(b, n, h, dv, grad=True)
    bias = rnd(*bias_shape, grad=True) if bias_shape is not None else None
    keep = None
    if with_mask:
        keep = torch.rand(b, 1, n, n, device="cuda") < 0.6
        keep[..., 0] = True
    inputs = (q, k, v) + ((bias,) if bias is not None else ())
    out = flashattn.flash_attn_func(q, k, v, causal=causal, deterministic=deterministic, attn_bias=bias,
                                    attn_mask=keep, softcap=softcap)
    do = torch.randn_like(out)
    g = torch.autograd.grad(out, inputs, do)
    refs = tuple(x.detach().float().requires_grad_() for x in inputs)
    o_ref = ref(*refs[:3], causal, keep, refs[3] if bias is not None else None, softcap)
    g_ref = torch.autograd.grad(o_ref, refs, do.float())
    ok = check(f"{name} out", out, o_ref, 0.03)
    for label, x, y in zip(("dq", "dk", "dv", "dbias"), g, g_ref):
        ok &= check(f"{name} {label}", x, y, 0.05 * max(1.0, y.abs().max().item()))
    return ok


def varlen_case(d=128, causal=True):
    lens = [700, 0, 1024, 129]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device="cuda", dtype=torch.int32)
    total, h = sum(lens), 2
    q, k, v = (rnd(total, h, d, grad=True) for _ in range(3))
    out = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=causal)
    do = torch.randn_like(out)
    g = torch.autograd.grad(out, (q, k, v), do)
    ok = True
    for i, n in enumerate(lens):
        if n == 0:
            continue
        sl = slice(int(cu[i]), int(cu[i + 1]))
        qr, kr, vr = (x.detach()[sl].float()[None].requires_grad_() for x in (q, k, v))
        o_ref = ref(qr, kr, vr, causal)
        g_ref = torch.autograd.grad(o_ref, (qr, kr, vr), do[sl].float()[None])
        ok &= check(f"varlen seq {i} out", out[sl], o_ref[0], 0.03)
        for label, x, y in zip("qkv", g, g_ref):
            ok &= check(f"varlen seq {i} d{label}", x[sl], y[0], 0.05 * max(1.0, y.abs().max().item()))
    return ok


def fwd_mask_case(name, b, n, h, d, key_padding, with_bias=False):
    q, k, v = (rnd(b, n, h, d) for _ in range(3))
    if key_padding:
        keep = torch.arange(n, device="cuda")[None, None, None, :] < torch.tensor([n, n // 3], device="cuda")[:, None, None, None]
    else:
        keep = torch.rand(b, 1, n, n, device="cuda") < 0.6
        keep[..., 0] = True
    bias = rnd(b, h, n, n) if with_bias else None
    out = flashattn.flash_attn_func(q, k, v, attn_mask=keep, attn_bias=bias)
    return check(name, out, ref(q, k, v, False, keep.expand(b, 1, n, n), bias), 0.03)


def fwd_case(name, b, sq, sk, h, d, causal):
    """The forward alone at many tiles per CTA (the persistent loop's later tiles, Q slots reused;
    sq > sk under causal: rows with no key, O = 0 where the float32 softmax gives NaN)."""
    q, k, v = rnd(b, sq, h, d), rnd(b, sk, h, d), rnd(b, sk, h, d)
    out = flashattn.flash_attn_func(q, k, v, causal=causal)
    return check(f"{name} out", out, torch.nan_to_num(ref(q, k, v, causal), nan=0.0), 0.03)


def sparse_case(name, n, h, d, bs=64, density=0.4):
    """The block-sparse backward (block_mask over bs x bs blocks) against float32 autograd on the
    expanded mask. Every query block keeps key block 0; key blocks 2 and 3 are dropped in every
    head, so one 128-key tile has no step (its CTA's kNoStep hand-over)."""
    q, k, v = (rnd(1, n, h, d, grad=True) for _ in range(3))
    nb = -(-n // bs)
    block = torch.rand(1, h, nb, nb, device="cuda") < density
    block[..., 0] = True
    block[..., 2:4] = False
    out = flashattn.flash_attn_func(q, k, v, block_mask=block, block_size=bs)
    do = torch.randn_like(out)
    g = torch.autograd.grad(out, (q, k, v), do)
    keep = block.repeat_interleave(bs, 2).repeat_interleave(bs, 3)[..., :n, :n]
    refs = tuple(x.detach().float().requires_grad_() for x in (q, k, v))
    o_ref = ref(*refs, False, keep)
    g_ref = torch.autograd.grad(o_ref, refs, do.float())
    ok = check(f"{name} out", out, o_ref, 0.03)
    for label, x, y in zip(("dq", "dk", "dv"), g, g_ref):
        ok &= check(f"{name} {label}", x, y, 0.05 * max(1.0, y.abs().max().item()))
    return ok


def paged_varlen_case(name, seqlens_q, seqlens_k, h=8, hk=2, d=128, page=16, sm90=False, share=False):
    """flash_attn_varlen_func with block_table (the KV-cache kernels, sm80-class; sm90: the sm90
    cache kernel under its switch; its grids need enough query tiles that the split heuristic
    does not leave them to sm80; share: the decode_share switch on, the sequences of a few tokens
    in a launch of their own on the decode tiles): shuffled 16-row pages, GQA, causal, NaN in every
    page row past a sequence's keys (no kernel may read them), against float32 attention on the
    gathered keys, sequence by sequence."""
    b = len(seqlens_q)
    blocks = [-(-n // page) for n in seqlens_k]
    perm = torch.randperm(sum(blocks), device="cuda").to(torch.int32)
    table = torch.full((b, max(blocks)), -1, dtype=torch.int32, device="cuda")
    at = 0
    for i, nb in enumerate(blocks):
        table[i, :nb] = perm[at:at + nb]
        at += nb
    kp, vp = rnd(sum(blocks), page, hk, d), rnd(sum(blocks), page, hk, d)
    for i, nb in enumerate(blocks):
        if nb and seqlens_k[i] % page:
            last = int(table[i, nb - 1])
            kp[last, seqlens_k[i] % page:] = float("nan")
            vp[last, seqlens_k[i] % page:] = float("nan")
    cu_q = torch.tensor([0] + seqlens_q, device="cuda").cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + seqlens_k, device="cuda").cumsum(0).to(torch.int32)
    q = rnd(int(cu_q[-1]), h, d)
    was = flashattn._C._set_switch("sm90_cache", sm90)
    was_share = flashattn._C._set_switch("decode_share", share)
    try:
        calls = flashattn._C._sm90_forward_calls()
        shares = flashattn._C._decode_share_calls()
        out = flashattn.flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, max(seqlens_q), max(seqlens_k), causal=True,
                                               block_table=table)
        torch.cuda.synchronize()
        if share and flashattn._C._decode_share_calls() == shares:
            print(f"{name}: the decodes did not run in a launch of their own FAIL", flush=True)
            return False
        if sm90 and flashattn._C._sm90_forward_calls() == calls:
            print(f"{name}: did not run on the sm90 cache kernel FAIL", flush=True)
            return False
    finally:
        flashattn._C._set_switch("sm90_cache", was)
        flashattn._C._set_switch("decode_share", was_share)
    ok = True
    for i in range(b):
        rows = table[i, :blocks[i]].long()
        k = kp[rows].reshape(-1, hk, d)[:seqlens_k[i]].repeat_interleave(h // hk, 1)
        v = vp[rows].reshape(-1, hk, d)[:seqlens_k[i]].repeat_interleave(h // hk, 1)
        qi = q[cu_q[i]:cu_q[i + 1]]
        ok &= check(f"{name} seq {i}", out[cu_q[i]:cu_q[i + 1]], ref(qi[None], k[None], v[None], True)[0], 0.03)
    return ok


def bad_cu_case(d=128):
    """Device cu_seqlens past the rows, decreasing and negative, max_seqlen below a real length
    (the kernels clamp them: docs/SEMANTICS.md "Varlen metadata"): forward and backward, plus a
    paged varlen call whose key count is past every bound. Run memcheck with
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 so that each tensor is its own allocation. Where the
    clamped sequences tile the rows ([0, 64), [64, 164) and [164, 200) of 200 rows) they are
    checked; a negative last entry (undefined values: the split-KV combine stops there) only
    runs."""
    total, h = 200, 2
    cu = torch.tensor([0, 64, 1 << 30, 164, 200], device="cuda", dtype=torch.int32)
    q, k, v = (rnd(total, h, d, grad=True) for _ in range(3))
    out = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 100, 100, causal=True)
    g = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    ok = True
    neg = torch.tensor([0, 64, -5], device="cuda", dtype=torch.int32)
    o2 = flashattn.flash_attn_varlen_func(q, k, v, neg, neg, 100, 100, causal=True)
    torch.autograd.grad(o2, (q, k, v), torch.ones_like(o2))
    for lo, hi in [(0, 64), (64, 164), (164, 200)]:
        qr, kr, vr = (x.detach()[lo:hi].float()[None] for x in (q, k, v))
        ok &= check(f"bad cu rows {lo}:{hi} out", out[lo:hi], ref(qr, kr, vr, True)[0], 0.03)
        ok &= bool(all(torch.isfinite(x[lo:hi]).all() for x in g))
    page, blocks = 16, 4
    kp, vp = rnd(blocks, page, h, d), rnd(blocks, page, h, d)
    table = torch.arange(blocks, device="cuda", dtype=torch.int32)[None]
    cu_q = torch.tensor([0, 3], device="cuda", dtype=torch.int32)
    cu_k = torch.tensor([-7, 1 << 30], device="cuda", dtype=torch.int32)  # count cut to max_seqlen_k 40
    out = flashattn.flash_attn_varlen_func(q[:3], kp, vp, cu_q, cu_k, 3, 40, causal=True, block_table=table)
    kk, vv = (x.reshape(-1, h, d)[:40][None] for x in (kp, vp))
    ok &= check("bad cu paged", out, ref(q.detach()[:3][None], kk, vv, True)[0], 0.03)
    return ok


def token_fold_case(name, h=32, hk=8, sq=4, d=128, page=16):
    """flash_attn_with_kvcache with several query tokens and GQA (the group's (token, query head)
    pairs folded into the rows of one KV head's decode tiles), q with its heads
    outermost, a shuffled paged cache, causal, unsplit / 3 splits / the heuristic's, against
    float32 attention per sequence."""
    lens = [sq, 300, 1000]
    b, nblk = len(lens), -(-max(lens) // page)
    table = torch.randperm(b * nblk, device="cuda").to(torch.int32).view(b, nblk)
    kp, vp = rnd(b * nblk, page, hk, d), rnd(b * nblk, page, hk, d)
    q = rnd(b, h, sq, d).transpose(1, 2)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    ok = True
    for splits in (1, 3, 0):
        out = flashattn.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=seqlens, block_table=table, causal=True,
                                                num_splits=splits)
        for i in range(b):
            rows = table[i].long()
            k = kp[rows].reshape(-1, hk, d)[:lens[i]].repeat_interleave(h // hk, 1)
            v = vp[rows].reshape(-1, hk, d)[:lens[i]].repeat_interleave(h // hk, 1)
            ok &= check(f"{name} splits {splits} seq {i}", out[i], ref(q[i][None], k[None], v[None], True)[0], 0.03)
    return ok


def bad_cu_fold_case():
    """Bad device cu_seqlens on a varlen decode call with grouped heads (the token fold: rows are
    (token, query head) pairs of each sequence's clamped tokens): past the rows, decreasing,
    negative, a token count past max_seqlen_q; packed and paged K/V, splits by the heuristic.
    Values undefined; memcheck (PYTORCH_NO_CUDA_MEMORY_CACHING=1) says whether every access stays
    inside q, k, v, out, lse and the pages. Then a valid call of the same shape is checked."""
    h, hk, d, total_q, total_k = 8, 2, 128, 12, 600
    q = rnd(total_q, h, d)
    k, v = rnd(total_k, hk, d), rnd(total_k, hk, d)
    cu_q = torch.tensor([0, 1, 1 << 30, 3, -5, 12], device="cuda", dtype=torch.int32)
    cu_k = torch.tensor([0, 64, 1 << 30, 100, -5, 600], device="cuda", dtype=torch.int32)
    page, blocks = 16, 80
    kp, vp = rnd(blocks, page, hk, d), rnd(blocks, page, hk, d)
    table = torch.randperm(blocks, device="cuda").to(torch.int32).view(5, 16)
    # Each split-KV merge (cluster, counters, the combine kernel): the partials' rows too.
    for merge in (None, "split_combine_counter", "split_combine_kernel"):
        was = flashattn._C._set_switch(merge, True) if merge else None
        try:
            flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 300, causal=True)
            flashattn.flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, 4, 256, causal=True, block_table=table)
            torch.cuda.synchronize()
        finally:
            if merge:
                flashattn._C._set_switch(merge, was)
    good_q = torch.tensor([0, 1, 4, 5, 9, 12], device="cuda", dtype=torch.int32)
    good_k = torch.tensor([0, 64, 200, 260, 500, 600], device="cuda", dtype=torch.int32)
    out = flashattn.flash_attn_varlen_func(q, k, v, good_q, good_k, 4, 240, causal=True)
    ok = True
    for i in range(5):
        a, b_, c, e = int(good_q[i]), int(good_q[i + 1]), int(good_k[i]), int(good_k[i + 1])
        kk = k[c:e].repeat_interleave(h // hk, 1)[None]
        vv = v[c:e].repeat_interleave(h // hk, 1)[None]
        ok &= check(f"bad cu fold valid seq {i}", out[a:b_], ref(q[a:b_][None], kk, vv, True)[0], 0.03)
    return ok


CASES = {
    "bwd_d64": lambda: bwd_case("bwd_d64", 1, 1024, 2, 64, 64, False),
    "bwd_d64_causal": lambda: bwd_case("bwd_d64_causal", 1, 1024, 2, 64, 64, True),
    "bwd_d128": lambda: bwd_case("bwd_d128", 1, 1024, 2, 128, 128, False),
    "bwd_d128_causal": lambda: bwd_case("bwd_d128_causal", 1, 1024, 2, 128, 128, True),
    # More tiles than the H200's 132 SMs: persistent CTAs take a second tile (static rounds
    # unmasked, the tile feed under causal), so the cross-tile barriers are exercised.
    "bwd_d128_2tiles": lambda: bwd_case("bwd_d128_2tiles", 1, 256, 70, 128, 128, False),
    "bwd_d64_causal_2tiles": lambda: bwd_case("bwd_d64_causal_2tiles", 1, 256, 70, 64, 64, True),
    "bwd_varlen_causal": varlen_case,
    # d64's 128-row steps: varlen rows past a sequence (the next one's in the same 128-row box),
    # and the deterministic two-kernel form (its dK/dV kernel steps 128 rows too).
    "bwd_varlen_causal_d64": lambda: varlen_case(64),
    "bwd_varlen_d64": lambda: varlen_case(64, causal=False),  # the one-CTA-per-tile kernel
    "bwd_d64_det": lambda: bwd_case("bwd_d64_det", 1, 1024, 2, 64, 64, False, deterministic=True),
    "bwd_192_128_causal": lambda: bwd_case("bwd_192_128_causal", 1, 1024, 2, 192, 128, True),
    "fwd_d64_short_causal": lambda: bwd_case("fwd_d64_short_causal", 2, 512, 2, 64, 64, True),
    # d128's unmasked short-rows kernel (at most 512 rows): the row sums on the tensor cores.
    "fwd_d128_short": lambda: bwd_case("fwd_d128_short", 2, 512, 2, 128, 128, False),
    # The short-rows kernels with several tiles per CTA (512 d128 tiles on 132 CTAs; 2048 d64
    # tiles on 396, those of the first 400 rows without a key).
    "fwd_d128_short_tiles": lambda: fwd_case("fwd_d128_short_tiles", 8, 500, 500, 16, 128, False),
    "fwd_d128_short_tiles_causal": lambda: fwd_case("fwd_d128_short_tiles_causal", 8, 500, 500, 16, 128, True),
    # Masked d128 short rows with fewer keys than rows (causal rows without a key; s38's default).
    "fwd_d128_short_tiles_causal_nokeys": lambda: fwd_case("fwd_d128_short_tiles_causal_nokeys", 8, 500, 300, 16, 128, True),
    "fwd_d64_short_tiles_causal": lambda: fwd_case("fwd_d64_short_tiles_causal", 8, 1000, 600, 16, 64, True),
    # The window kernels with several tiles per CTA (past the short-rows bound: d64 > 1024 rows,
    # d128 > 512), the Q slot reused across tiles; sq > sk leaves rows without keys.
    "fwd_d64_window_tiles_causal": lambda: fwd_case("fwd_d64_window_tiles_causal", 4, 2000, 1500, 16, 64, True),
    "fwd_d128_window_tiles_causal": lambda: fwd_case("fwd_d128_window_tiles_causal", 8, 1000, 700, 16, 128, True),
    # d256's short masked rows (64-key blocks) and its backward (the dQ kernel's 16-byte stores).
    "fwd_d256_short_causal": lambda: bwd_case("fwd_d256_short_causal", 2, 1024, 2, 256, 256, True),
    "bwd_d128_det_causal": lambda: bwd_case("bwd_d128_det_causal", 1, 1024, 2, 128, 128, True, deterministic=True),
    "fwd_mask_tile": lambda: fwd_mask_case("fwd_mask_tile", 2, 1024, 2, 128, False),
    "fwd_mask_keypad": lambda: fwd_mask_case("fwd_mask_keypad", 2, 1024, 2, 64, True),
    # attn_bias with attn_mask: the mask packed into bits (d64 since 2026-12-03, d128 before).
    "fwd_bias_mask_bits_d64": lambda: fwd_mask_case("fwd_bias_mask_bits_d64", 2, 1024, 2, 64, False, True),
    "fwd_bias_mask_bits_d128": lambda: fwd_mask_case("fwd_bias_mask_bits_d128", 2, 1024, 2, 128, False, True),
    # The Hopper bias backward: dbias stored per element (d128, causal) and summed over the rows
    # into partials over the heads (d64 key padding).
    "bwd_bias_d128_causal": lambda: bwd_case("bwd_bias_d128_causal", 1, 1024, 2, 128, 128, True,
                                             bias_shape=(1, 2, 1024, 1024)),
    "bwd_bias_d64_keypad": lambda: bwd_case("bwd_bias_d64_keypad", 2, 1024, 2, 64, 64, False, bias_shape=(2, 1, 1, 1024)),
    "bwd_bias_mask_bits_d128": lambda: bwd_case("bwd_bias_mask_bits_d128", 2, 1024, 2, 128, 128, False,
                                                bias_shape=(2, 2, 1024, 1024), with_mask=True),
    # dbias with softcap (the sm80 backward's kFactorLater kernel: a second Q K^T per slice for the
    # cap's tanh after dbias is stored; s39, not yet run on a GPU): per-element dbias under
    # causal, and key padding summed over the rows.
    "bwd_bias_softcap_d128_causal": lambda: bwd_case("bwd_bias_softcap_d128_causal", 1, 1024, 2, 128, 128, True,
                                                     bias_shape=(1, 2, 1024, 1024), softcap=2.0),
    "bwd_bias_softcap_d64_keypad": lambda: bwd_case("bwd_bias_softcap_d64_keypad", 2, 700, 2, 64, 64, False,
                                                    bias_shape=(2, 1, 1, 700), softcap=2.0),
    # attn_mask alone on the Hopper backward: its bits copied into the bias slot per step (ragged:
    # the last query block reads the pack's padding rows).
    "bwd_mask_d128_ragged": lambda: bwd_case("bwd_mask_d128_ragged", 2, 1000, 2, 128, 128, False, with_mask=True),
    "bwd_mask_d64_causal": lambda: bwd_case("bwd_mask_d64_causal", 2, 1024, 2, 64, 64, True, with_mask=True),
    # Block-sparse backward: 4 key tiles x 36 heads = 144 tiles (more than the H200's SMs), one
    # tile per head without a step, a ragged last block.
    "bwd_sparse_d128": lambda: sparse_case("bwd_sparse_d128", 500, 36, 128),
    "bwd_sparse_d64": lambda: sparse_case("bwd_sparse_d64", 500, 36, 64),
    # Paged K/V in varlen calls (the cache kernels): a decode step (split keys, merged in-kernel)
    # and a chunked prefill among decode rows (the 128-row tile).
    "paged_varlen_decode": lambda: paged_varlen_case("paged_varlen_decode", [1] * 6, [4000, 1, 17, 900, 2048, 33]),
    "paged_varlen_prefill": lambda: paged_varlen_case("paged_varlen_prefill", [1, 300, 1], [517, 800, 33]),
    # The same with the decodes in a launch of their own (decode_share), at 32/8 heads with
    # sequences at the decode tiles' bound (12) and past it (13).
    "paged_varlen_prefill_share": lambda: paged_varlen_case("paged_varlen_prefill_share", [1, 300, 12, 13, 0, 1],
                                                            [517, 800, 33, 40, 3, 1], h=32, hk=8, share=True),
    # The sm90 cache kernel (switch sm90_cache, the whole call on it): a chunked prefill among
    # decode rows, and one at 64-row pages with more key blocks (> 8) than the ring has stages.
    "paged_varlen_prefill_sm90": lambda: paged_varlen_case("paged_varlen_prefill_sm90", [1, 700, 1], [517, 900, 33],
                                                           h=32, hk=8, sm90=True),
    "paged_varlen_prefill_sm90_p64": lambda: paged_varlen_case("paged_varlen_prefill_sm90_p64", [600, 129, 2],
                                                               [1500, 129, 70], h=32, hk=8, page=64, sm90=True),
    # A chunked prefill among decode rows (decode_share): split by query rows between the sm80
    # decode tiles (sequences of at most 12 rows at 32/8 heads, GQA folded) and the sm90 cache
    # kernel (13, 127, 128 and 300 rows), both writing out of one packed batch.
    # (paged_varlen_prefill_share above splits the same way with the sm80 cache kernels.)
    "paged_varlen_mixed_sm90": lambda: paged_varlen_case("paged_varlen_mixed_sm90", [1, 300, 12, 0, 127, 128, 13, 1, 3, 1],
                                                         [517, 400, 33, 5, 127, 300, 90, 1, 700, 17],
                                                         h=32, hk=8, sm90=True, share=True),
    "decode_tokens_fold": lambda: token_fold_case("decode_tokens_fold"),
    "decode_tokens_fold_g7": lambda: token_fold_case("decode_tokens_fold_g7", h=28, hk=4, sq=2),
    "decode_tokens_fold_2tiles": lambda: token_fold_case("decode_tokens_fold_2tiles", h=64, hk=8, sq=5),
    "varlen_bad_cu": bad_cu_case,
    "varlen_bad_cu_fold": bad_cu_fold_case,
    "varlen_bad_cu_d64": lambda: bad_cu_case(64),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(CASES)
    torch.manual_seed(0)
    ok = True
    for name in names:
        ok &= CASES[name]()
    torch.cuda.synchronize()
    print("sm90 forward calls", flashattn._C._sm90_forward_calls(), "backward calls", flashattn._C._backward_calls())
    print("ALL OK" if ok else "SOME FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
