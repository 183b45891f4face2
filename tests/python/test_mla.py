"""MLA decode (DeepSeek-V3: head_dim 576, head_dim_v 512, one latent KV head) through
flash_attn_with_kvcache on CUDA, with the shared latent cache v_cache = k_cache[..., :512] (a
view) or a separate v_cache, against a float64 torch reference written here (the cache gathered
to dense by hand). Skipped, visibly, without torch, a CUDA build or a GPU."""

import math

import numpy as np
import pytest

import flashattn
from cuda_ready import cuda_torch

D, DV = 576, 512


def reference(torch, q, k_rows, v_rows, seqlens, causal, sink):
    """float64 attention of q (b, sq, h, D) over each sequence's rows: k_rows[b] (n_b, hk, D),
    v_rows[b] (n_b, hk, DV); bottom-right causal; sink (h,) or None. Returns out, lse."""
    b, sq, h, _ = q.shape
    out = torch.zeros(b, sq, h, DV, dtype=torch.float64)
    lse = torch.full((b, h, sq), -math.inf, dtype=torch.float64)
    for i in range(b):
        n = int(seqlens[i])
        k = k_rows[i].double()
        v = v_rows[i].double()
        hk = k.shape[1]
        group = h // hk
        for head in range(h):
            kh, vh = k[:, head // group], v[:, head // group]
            s = (q[i, :, head].double() @ kh.T) / math.sqrt(D)  # (sq, n)
            if causal:
                rows = torch.arange(sq)[:, None]
                cols = torch.arange(n)[None, :]
                s = s.masked_fill(cols > n - sq + rows, -math.inf)
            if sink is not None:
                s = torch.cat([s, torch.full((sq, 1), float(sink[head]), dtype=torch.float64)], dim=1)
            m = s.max(dim=1, keepdim=True).values
            m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
            p = torch.exp(s - m)
            total = p.sum(dim=1, keepdim=True)
            lse[i, head] = torch.where(total[:, 0] > 0, (m + torch.log(total))[:, 0], torch.full_like(total[:, 0], -math.inf))
            pk = p[:, :n]
            out[i, :, head] = torch.where(total > 0, (pk @ vh) / total, torch.zeros(sq, DV, dtype=torch.float64))
    return out, lse


CASES = [
    dict(seqlens=[1, 7, 63, 64, 65, 1000, 4097], h=16, capacity=4352),
    dict(seqlens=[1, 7, 63, 64, 65, 1000, 4097], h=16, capacity=4352, page_size=64),
    dict(seqlens=[5, 130, 700], h=128, sq=2, causal=True, capacity=768, page_size=16),
    dict(seqlens=[33, 200], h=16, hk=2, sq=2, causal=True, capacity=256, page_size=1),
    dict(seqlens=[17, 300], h=16, sq=16, causal=True, capacity=512, page_size=256),
    dict(seqlens=[17, 300], h=16, sq=2, causal=True, capacity=320, latent=False),
    dict(seqlens=[0, 9, 300], h=16, sq=2, causal=True, capacity=320, page_size=16, sink=True, num_splits=5),
    dict(seqlens=[9, 300], h=16, sq=1, capacity=320, snew=1, page_size=16, sink=True),
    dict(seqlens=[9, 300], h=16, sq=2, capacity=320, snew=2, causal=True, dtype="float16"),
]


@pytest.mark.parametrize("spec", CASES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items() if k != "seqlens"))
def test_mla_decode_matches_float64_reference(spec):
    torch = cuda_torch()
    seqlens = spec["seqlens"]
    b, h, hk, sq = len(seqlens), spec["h"], spec.get("hk", 1), spec.get("sq", 1)
    capacity, page_size, snew = spec["capacity"], spec.get("page_size", 0), spec.get("snew", 0)
    latent, causal = spec.get("latent", True), spec.get("causal", False)
    dtype = getattr(torch, spec.get("dtype", "bfloat16"))
    gen = torch.Generator().manual_seed(576)
    rnd = lambda *s: torch.randn(*s, generator=gen).to(dtype)  # noqa: E731
    q = rnd(b, sq, h, D)
    k_log = rnd(b, capacity, hk, D)  # the logical cache
    v_log = None if latent else rnd(b, capacity, hk, DV)
    k_new = rnd(b, snew, hk, D) if snew else None
    v_new = None if not snew else (k_new[..., :DV] if latent else rnd(b, snew, hk, DV))
    # Rows past each sequence's end are NaN: a kernel that reads them into the sums fails.
    for i in range(b):
        k_log[i, seqlens[i]:] = float("nan")
        if v_log is not None:
            v_log[i, seqlens[i]:] = float("nan")
    sink = torch.randn(h, generator=gen).float() if spec.get("sink") else None
    if sink is not None:
        sink[1::4] = -math.inf

    # Physical cache: dense (b, capacity) or shuffled pages (num_blocks, page_size).
    if page_size:
        blocks = capacity // page_size
        perm = torch.randperm(b * blocks, generator=gen)
        table = perm.view(b, blocks).to(torch.int32)
        k_cache = torch.zeros(b * blocks, page_size, hk, D, dtype=dtype)
        for i in range(b):
            for j in range(blocks):
                k_cache[int(table[i, j])] = k_log[i, j * page_size:(j + 1) * page_size]
        v_full = None
        if not latent:
            v_full = torch.zeros(b * blocks, page_size, hk, DV, dtype=dtype)
            for i in range(b):
                for j in range(blocks):
                    v_full[int(table[i, j])] = v_log[i, j * page_size:(j + 1) * page_size]
    else:
        table = None
        k_cache = k_log.clone()
        v_full = None if latent else v_log.clone()

    cuda = lambda x: None if x is None else x.cuda()  # noqa: E731
    k_cache_d = k_cache.cuda()
    v_cache_d = k_cache_d[..., :DV] if latent else v_full.cuda()
    k_new_d = cuda(k_new)
    v_new_d = None if not snew else (k_new_d[..., :DV] if latent else v_new.cuda())
    out, lse = flashattn.flash_attn_with_kvcache(
        q.cuda(), k_cache_d, v_cache_d, k=k_new_d, v=v_new_d,
        cache_seqlens=torch.tensor(seqlens, dtype=torch.int32).cuda(), block_table=cuda(table),
        causal=causal, num_splits=spec.get("num_splits", 0), return_softmax_lse=True, learnable_sink=cuda(sink))
    torch.cuda.synchronize()

    # The reference: each sequence's rows, the appended ones included.
    k_rows, v_rows, ends = [], [], []
    for i in range(b):
        k_seq = k_log[i, :seqlens[i]]
        v_seq = k_log[i, :seqlens[i], :, :DV] if latent else v_log[i, :seqlens[i]]
        if snew:
            k_seq = torch.cat([k_seq, k_new[i]])
            v_seq = torch.cat([v_seq, v_new[i]])
        k_rows.append(k_seq)
        v_rows.append(v_seq)
        ends.append(seqlens[i] + snew)
    ref_out, ref_lse = reference(torch, q, k_rows, v_rows, ends, causal, sink)

    # The appended rows, read back through the cache (V from the same bytes when latent).
    if snew:
        for i in range(b):
            for t in range(snew):
                r = seqlens[i] + t
                page = int(table[i, r // page_size]) if page_size else 0
                row = k_cache_d[page, r % page_size] if page_size else k_cache_d[i, r]
                assert torch.equal(row.cpu(), k_new[i, t])
                vrow = (row[..., :DV] if latent else
                        (v_cache_d[page, r % page_size] if page_size else v_cache_d[i, r]))
                assert torch.equal(vrow.cpu(), v_new[i, t])

    u = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    err = (out.cpu().double() - ref_out).abs().max().item()
    assert err <= 4 * u * max(1.0, ref_out.abs().max().item()), err
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), finite)
    assert (lse.cpu().double()[finite] - ref_lse[finite]).abs().max().item() <= 1e-2


def test_mla_declines_rotary_on_latent_cache():
    torch = cuda_torch()
    q = torch.randn(1, 1, 16, D, dtype=torch.bfloat16, device="cuda")
    k_cache = torch.randn(1, 64, 1, D, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(1, 1, 1, D, dtype=torch.bfloat16, device="cuda")
    cos = torch.ones(64, 32, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(NotImplementedError) as raised:
        flashattn.flash_attn_with_kvcache(q, k_cache, k_cache[..., :DV], k=k, v=k[..., :DV], rotary_cos=cos,
                                          rotary_sin=cos, cache_seqlens=torch.tensor([10], dtype=torch.int32,
                                                                                     device="cuda"))
    if "was not built into this flashattn" in str(raised.value):  # a build without head dim 576
        pytest.skip(f"trimmed build: {raised.value}")
    assert "rotary_cos/rotary_sin with v_cache a view of k_cache" in str(raised.value)
