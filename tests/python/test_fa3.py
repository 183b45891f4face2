"""flashattn.fa3: FlashAttention-3's functions (argument order, return values, the kvcache
call's varlen query and int cache_seqlens, what is refused) against flashattn's flash_attn 2.x
functions and a float64 reference, on CPU tensors (CUDA too when there is a GPU), and the
``flash_attn_interface`` import alias."""
import sys

import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
import flashattn.fa3 as fa3  # noqa: E402
import torch_ref  # noqa: E402

DEVICES = ["cpu"]
if flashattn.cuda_built() and flashattn.cuda_available() and torch.cuda.is_available():
    DEVICES.append("cuda")
DTYPE = {"cpu": torch.float32, "cuda": torch.bfloat16}
TOL = {"cpu": 1e-5, "cuda": 2e-2}


def rnd(g, *shape, device):
    return torch.randn(*shape, generator=g, device=device, dtype=DTYPE[device])


@pytest.mark.parametrize("device", DEVICES)
def test_positional_order_and_returns(device):
    # FlashAttention-3's fourth positional argument is softmax_scale, the fifth causal.
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = rnd(g, 2, 37, 4, 64, device=device), rnd(g, 2, 45, 2, 64, device=device), \
        rnd(g, 2, 45, 2, 64, device=device)
    out = fa3.flash_attn_func(q, k, v, 0.3, True)
    want, lse, _ = flashattn.flash_attn_func(q, k, v, 0.0, 0.3, True, return_attn_probs=True)
    assert torch.equal(out, want)
    got = fa3.flash_attn_func(q, k, v, 0.3, True, window_size=(5, 0), softcap=4.0,
                              return_attn_probs=True)
    assert isinstance(got, tuple) and len(got) == 2
    ref, ref_lse = flashattn.flash_attn_func(q, k, v, 0.0, 0.3, True, (5, 0), 4.0,
                                             return_attn_probs=True)[:2]
    assert torch.equal(got[0], ref) and torch.equal(got[1], ref_lse)
    r64 = torch_ref.attention(q.double(), k.double(), v.double(), scale=0.3, causal=True)[0]
    torch.testing.assert_close(out.double(), r64, atol=TOL[device], rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_match_flash_attn_2_functions(device):
    g = torch.Generator(device=device).manual_seed(1)
    q, k, v = (rnd(g, 1, 29, 2, 32, device=device).requires_grad_() for _ in range(3))
    dout = rnd(g, 1, 29, 2, 32, device=device)
    out = fa3.flash_attn_func(q, k, v, causal=True, deterministic=True)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref = flashattn.flash_attn_func(q, k, v, causal=True, deterministic=True)
    want = torch.autograd.grad(ref, (q, k, v), dout)
    for a, b in zip(grads, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_packed_and_varlen(device):
    g = torch.Generator(device=device).manual_seed(2)
    qkv = rnd(g, 2, 21, 3, 4, 64, device=device)
    out = fa3.flash_attn_qkvpacked_func(qkv, None, True)
    assert torch.equal(out, flashattn.flash_attn_qkvpacked_func(qkv, causal=True))
    # The 4-d form: nheads_q + 2 * nheads_k heads.
    packed = rnd(g, 2, 21, 4 + 2 * 2, 64, device=device)
    out = fa3.flash_attn_qkvpacked_func(packed, causal=True, num_heads_q=4)
    q, k, v = packed.split([4, 2, 2], dim=2)
    assert torch.equal(out, flashattn.flash_attn_func(q, k, v, causal=True))
    with pytest.raises(ValueError, match="num_heads_q"):
        fa3.flash_attn_qkvpacked_func(packed)

    lens = [5, 17, 1]
    cu = torch.tensor([0, 5, 22, 23], dtype=torch.int32, device=device)
    q, k, v = rnd(g, 23, 4, 64, device=device), rnd(g, 23, 2, 64, device=device), \
        rnd(g, 23, 2, 64, device=device)
    out, lse = fa3.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), None, None, 0.25,
                                          True, return_attn_probs=True)
    want = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), 0.0, 0.25,
                                            True, return_attn_probs=True)
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_varlen_query_reads_the_cache(device, paged):
    # Chunked prefill / mixed batch: sequence b's queries are rows [cu[b], cu[b + 1]) of q,
    # its keys the first cache_seqlens[b] rows of its cache (bottom-right causal).
    g = torch.Generator(device=device).manual_seed(3)
    hk, h, d, cap = 2, 4, 64, 48
    lens_q, lens_k = [3, 1, 20], [30, 7, 48]
    batch = len(lens_q)
    dense_k = rnd(g, batch, cap, hk, d, device=device)
    dense_v = rnd(g, batch, cap, hk, d, device=device)
    cu_q = torch.tensor([0, 3, 4, 24], dtype=torch.int32, device=device)
    q = rnd(g, 24, h, d, device=device)
    seqlens = torch.tensor(lens_k, dtype=torch.int32, device=device)
    if paged:  # pages of 16 rows, shuffled
        page = 16
        perm = torch.randperm(batch * cap // page, generator=torch.Generator().manual_seed(4))
        table = perm.reshape(batch, cap // page).to(device=device, dtype=torch.int32)
        k_cache = torch.empty(batch * cap // page, page, hk, d, device=device, dtype=q.dtype)
        v_cache = torch.empty_like(k_cache)
        k_cache[table.long()] = dense_k.reshape(batch, cap // page, page, hk, d)
        v_cache[table.long()] = dense_v.reshape(batch, cap // page, page, hk, d)
        out = fa3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                          page_table=table, cu_seqlens_q=cu_q, max_seqlen_q=20,
                                          causal=True, scheduler_metadata=None, pack_gqa=True)
    else:
        out, lse = fa3.flash_attn_with_kvcache(q, dense_k, dense_v, cache_seqlens=seqlens,
                                               cu_seqlens_q=cu_q, max_seqlen_q=20, causal=True,
                                               return_softmax_lse=True)
        assert lse.shape == (h, 24)
        # A strided cache (a slice of a longer one, rows in another order by cache_batch_idx)
        # with a window and window_size=(None, None)-style edges.
        big_k = torch.zeros(batch, cap + 8, hk, d, device=device, dtype=q.dtype)
        big_v = torch.zeros_like(big_k)
        order = torch.tensor([2, 0, 1], dtype=torch.int32, device=device)
        big_k[order.long(), :cap], big_v[order.long(), :cap] = dense_k, dense_v
        win = fa3.flash_attn_with_kvcache(q, big_k[:, :cap], big_v[:, :cap], cache_seqlens=seqlens,
                                          cache_batch_idx=order, cu_seqlens_q=cu_q,
                                          max_seqlen_q=20, causal=True, window_size=(6, None))
        for b in range(batch):
            rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
            want = flashattn.flash_attn_func(q[None, rows], dense_k[b:b + 1, :lens_k[b]],
                                             dense_v[b:b + 1, :lens_k[b]], causal=True,
                                             window_size=(6, -1))[0]
            torch.testing.assert_close(win[rows], want, atol=TOL[device], rtol=0)
    for b in range(batch):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        want = flashattn.flash_attn_func(q[None, rows], dense_k[b:b + 1, :lens_k[b]],
                                         dense_v[b:b + 1, :lens_k[b]], causal=True)[0]
        torch.testing.assert_close(out[rows], want, atol=TOL[device], rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_kvcache_batch_call_and_int_seqlens(device):
    g = torch.Generator(device=device).manual_seed(5)
    q = rnd(g, 2, 1, 4, 64, device=device)
    k_cache, v_cache = rnd(g, 2, 40, 2, 64, device=device), rnd(g, 2, 40, 2, 64, device=device)
    out = fa3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=25, causal=True)
    want = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache,
                                             cache_seqlens=torch.full((2,), 25, dtype=torch.int32,
                                                                      device=device),
                                             causal=True)
    assert torch.equal(out, want)
    assert fa3.get_scheduler_metadata(2, 1, 40, 4, 2, 64, torch.zeros(2)) is None


@pytest.mark.parametrize("kwargs, name", [
    (dict(qv=1), "qv"), (dict(attention_chunk=8), "attention_chunk"),
])
def test_unsupported_arguments_are_named(kwargs, name):
    q = torch.randn(1, 4, 2, 16)
    for fn in (fa3.flash_attn_func,):
        with pytest.raises(NotImplementedError, match=name):
            fn(q, q, q, **kwargs)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="seqused_k"):
        fa3.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 4, 4, seqused_k=cu[1:])
    with pytest.raises(NotImplementedError, match="rotary_seqlens"):
        fa3.flash_attn_with_kvcache(q, q, q, rotary_seqlens=cu)
    with pytest.raises(NotImplementedError, match="cu_seqlens_k_new"):
        fa3.flash_attn_with_kvcache(q, q, q, cu_seqlens_k_new=cu)
    with pytest.raises(NotImplementedError, match="k is not supported together with cu_seqlens_q"):
        fa3.flash_attn_with_kvcache(q[0], q, q, k=q, v=q, cu_seqlens_q=cu, max_seqlen_q=4)
    with pytest.raises(NotImplementedError, match="rotary_sin is not supported together"):
        fa3.flash_attn_with_kvcache(q[0], q, q, rotary_sin=q, cu_seqlens_q=cu, max_seqlen_q=4)
    with pytest.raises(NotImplementedError, match="q_descale is not supported together"):
        fa3.flash_attn_with_kvcache(q[0], q, q, q_descale=q, cu_seqlens_q=cu, max_seqlen_q=4)


def test_flash_attn_interface_alias():
    saved = sys.modules.pop("flash_attn_interface", None)
    try:
        flashattn.install_as_flash_attn_interface()
        import flash_attn_interface  # noqa: PLC0415
        assert flash_attn_interface is fa3
        assert flash_attn_interface.flash_attn_func is fa3.flash_attn_func
        flashattn.install_as_flash_attn_interface()  # again: harmless
    finally:
        sys.modules.pop("flash_attn_interface", None)
        if saved is not None:
            sys.modules["flash_attn_interface"] = saved
    fake = type(sys)("flash_attn_interface")
    sys.modules["flash_attn_interface"] = fake
    try:
        with pytest.raises(RuntimeError, match="before anything imports flash_attn_interface"):
            flashattn.install_as_flash_attn_interface()
    finally:
        del sys.modules["flash_attn_interface"]
