"""CUDA: bf16/fp16 values and gradients against float64, torch.compile, CUDA graphs, streams,
strided inputs, device checks, dropout mask shared with the CPU backend. Skipped (with the
reason) without a CUDA build, a GPU or torch with CUDA."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import attn_ref  # noqa: E402
import flashattn  # noqa: E402
import torch_ref  # noqa: E402

if not flashattn.cuda_built():
    pytest.skip("flashattn was built without the CUDA backend", allow_module_level=True)
if not flashattn.cuda_available():
    pytest.skip("no usable CUDA GPU for flashattn", allow_module_level=True)
if not torch.cuda.is_available():
    pytest.skip("torch has no CUDA support here", allow_module_level=True)

DEV = torch.device("cuda", torch.cuda.current_device())
# Absolute slack of the criterion; the 2 * naive-bf16/fp16 error term dominates.
ATOL = {torch.bfloat16: 1e-3, torch.float16: 2e-4}

SHAPES = [
    dict(b=2, sq=128, sk=128, h=4, hk=4, d=64),
    dict(b=2, sq=113, sk=203, h=6, hk=2, d=128),
    dict(b=1, sq=1, sk=257, h=8, hk=1, d=128),
    dict(b=3, sq=77, sk=45, h=4, hk=2, d=64),
    dict(b=2, sq=65, sk=65, h=2, hk=2, d=256),
]
OPTIONS = [
    dict(),
    dict(causal=True),
    dict(window=(32, 8)),
    dict(softcap=30.0, causal=True),
    dict(alibi=True),
]


def make(s, dtype, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    def r(*shape):
        return torch.randn(*shape, generator=g, device=DEV, dtype=dtype)
    return (r(s["b"], s["sq"], s["h"], s["d"]), r(s["b"], s["sk"], s["hk"], s["d"]),
            r(s["b"], s["sk"], s["hk"], s["d"]), r(s["b"], s["sq"], s["h"], s["d"]))


def check(fa_fn, ref_fn, inputs, dout, dtype):
    ours = torch_ref.values_and_grads(fa_fn, inputs, dout)
    ref = torch_ref.values_and_grads(ref_fn, [t.double() for t in inputs], dout)
    naive = torch_ref.values_and_grads(ref_fn, inputs, dout)
    for name, o, r, n in zip(["out", "dq", "dk", "dv"], ours, ref, naive):
        attn_ref.assert_fa_close(name, o, r, n, ATOL[dtype] * (1 if name == "out" else 4))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{b}_sq{sq}_sk{sk}_h{h}_hk{hk}_d{d}".format(**s))
@pytest.mark.parametrize("opt", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "plain")
def test_values_and_grads_match_float64(dtype, shape, opt):
    q, k, v, dout = make(shape, dtype)
    alibi = (torch.rand(shape["h"], device=DEV) * 0.2 + 0.01) if opt.get("alibi") else None
    kw = dict(causal=opt.get("causal", False), softcap=opt.get("softcap", 0.0), alibi_slopes=alibi)
    window = opt.get("window", (-1, -1))
    check(lambda q, k, v: flashattn.flash_attn_func(q, k, v, window_size=window, **kw),
          lambda q, k, v: torch_ref.attention(q, k, v, causal=kw["causal"], window=window,
                                              softcap=kw["softcap"], alibi=alibi)[0],
          [q, k, v], dout, dtype)


def packed_varlen(lens_q, lens_k, h, hk, d, seed):
    """Random packed q, k, v (total, heads, d) bf16 and their cu_seqlens, run causally through
    flash_attn_varlen_func; yields (i, out, q, k, v) per sequence, each with a batch dim of 1."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    q = torch.randn(sum(lens_q), h, d, generator=g, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(sum(lens_k), hk, d, generator=g, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(sum(lens_k), hk, d, generator=g, device=DEV, dtype=torch.bfloat16)
    cu_q = torch.tensor(np.cumsum([0] + lens_q), dtype=torch.int32, device=DEV)
    cu_k = torch.tensor(np.cumsum([0] + lens_k), dtype=torch.int32, device=DEV)
    out = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True)
    for i in range(len(lens_q)):
        sq, sk = slice(cu_q[i].item(), cu_q[i + 1].item()), slice(cu_k[i].item(), cu_k[i + 1].item())
        yield i, out[None, sq], q[None, sq], k[None, sk], v[None, sk]


def test_varlen_matches_per_sequence():
    for _, out, q, k, v in packed_varlen([65, 1, 130, 17], [70, 33, 130, 200], 4, 2, 128, seed=1):
        ref = flashattn.flash_attn_func(q, k, v, causal=True)
        torch.testing.assert_close(out, ref, rtol=0, atol=2e-2)


@pytest.mark.parametrize("d", [64, 128])
def test_bad_device_cu_seqlens_stay_inside_the_rows(d):
    """cu_seqlens on the device past the rows and decreasing, and a max_seqlen below a real length:
    the kernels clamp what they read (docs/SEMANTICS.md "Varlen metadata"), so the call returns
    without a CUDA error, and here, where the clamped sequences still tile the rows, what they
    define is exact attention, forward and backward: over 200 rows, cu = [0, 64, 2^30, 164, 200]
    with max_seqlen 100 is the sequences [0, 64), [64, 164) (cut at max_seqlen), an empty one
    (from row 2^30 clamped to 200, to 164) and [164, 200). A negative last entry returns without
    a CUDA error too (its values are undefined: the split-KV combine stops at that entry)."""
    total, h, hk = 200, 4, 2
    g = torch.Generator(device=DEV).manual_seed(45)
    q = torch.randn(total, h, d, generator=g, device=DEV, dtype=torch.bfloat16)
    k, v = (torch.randn(total, hk, d, generator=g, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    dout = torch.randn(total, h, d, generator=g, device=DEV, dtype=torch.bfloat16)
    cu = torch.tensor([0, 64, 1 << 30, 164, 200], dtype=torch.int32, device=DEV)
    fa = torch_ref.values_and_grads(
        lambda q, k, v: flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 100, 100, causal=True),
        [q, k, v], dout)
    torch.cuda.synchronize()  # a kernel that left its rows would fail here (or under memcheck)
    for lo, hi in [(0, 64), (64, 164), (164, 200)]:
        sl = slice(lo, hi)
        part = [t[None, sl] for t in (q, k, v)]
        fn = lambda q, k, v: torch_ref.attention(q, k, v, causal=True)[0]  # noqa: E731
        ref = torch_ref.values_and_grads(fn, [t.double() for t in part], dout[None, sl])
        naive = torch_ref.values_and_grads(fn, part, dout[None, sl])
        for name, o, r, n in zip(["out", "dq", "dk", "dv"], fa, ref, naive):
            attn_ref.assert_fa_close(f"{name}[{lo}:{hi}]", o[None, sl], r, n,
                                     ATOL[torch.bfloat16] * (1 if name == "out" else 4))
    neg = torch.tensor([0, 64, -5], dtype=torch.int32, device=DEV)
    qg = q.detach().requires_grad_()
    out = flashattn.flash_attn_varlen_func(qg, k, v, neg, neg, 100, 100, causal=True)
    torch.autograd.grad(out, qg, torch.ones_like(out))
    torch.cuda.synchronize()


def test_noncontiguous_inputs():
    b, sq, sk, h, d = 2, 100, 150, 4, 64
    g = torch.Generator(device=DEV).manual_seed(2)
    def r(*shape):
        return torch.randn(*shape, generator=g, device=DEV, dtype=torch.bfloat16)
    q = r(b, h, sq, d).transpose(1, 2)
    k = r(b, sk, 2 * h, d)[:, :, ::2]
    v = r(b, sk + 7, h, d)[:, 7:]
    dout = r(b, h, sq, d).transpose(1, 2)
    check(lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True),
          lambda q, k, v: torch_ref.attention(q, k, v, causal=True)[0],
          [q, k, v], dout, torch.bfloat16)


def test_misaligned_inputs_are_copied():
    # A 2-byte storage offset (pointer not 16-byte aligned) and an odd row stride: the CUDA
    # kernels' 16-byte copies cannot read these in place, so the wrapper copies them (the C ABI
    # reports NotSupported naming the argument instead).
    b, sq, sk, h, d = 2, 70, 90, 4, 64
    g = torch.Generator(device=DEV).manual_seed(3)
    def r(*shape):
        return torch.randn(*shape, generator=g, device=DEV, dtype=torch.bfloat16)
    q = r(b * sq * h * d + 1)[1:].view(b, sq, h, d)
    k = r(b, sk, h, d + 1)[..., :d]
    v = r(b, sk, h, d)
    dout = r(b, sq, h, d + 3)[..., 3:]
    assert q.data_ptr() % 16 != 0 and k.stride(1) % 8 != 0 and dout.data_ptr() % 16 != 0
    check(lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True),
          lambda q, k, v: torch_ref.attention(q, k, v, causal=True)[0],
          [q, k, v], dout, torch.bfloat16)


@pytest.mark.parametrize("d", [64, 128])
def test_causal_grid_with_several_cta_groups(d):
    # 40 planes of 16 key blocks (and of 16 query blocks at d64): causal launches start them in
    # the interleaved order of cuda/common/cta_order.h, on a 132-SM GPU in several groups of
    # planes, the smaller one first (d128 backward: 6, 17, 17). The forward interleaves at every
    # head dim, the backward where its tile says so (d128).
    s = dict(b=1, sq=2048, sk=2048, h=40, hk=40, d=d)
    q, k, v, dout = make(s, torch.bfloat16, seed=4)
    check(lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True),
          lambda q, k, v: torch_ref.attention(q, k, v, causal=True)[0],
          [q, k, v], dout, torch.bfloat16)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
def test_long_backward_both_forms_match_float64(d, deterministic):
    """Long enough for the fused Hopper backward of the default path (no mask, 4096 keys: dQ
    added in f32 by the copy engine) and, with deterministic=True, the two-kernel form; GQA and
    a ragged query length, against float64. Other GPUs run the sm80 backward both ways."""
    s = dict(b=1, sq=1000, sk=4096, h=4, hk=2, d=d)
    q, k, v, dout = make(s, torch.bfloat16, seed=31)
    check(lambda q, k, v: flashattn.flash_attn_func(q, k, v, deterministic=deterministic),
          lambda q, k, v: torch_ref.attention(q, k, v)[0], [q, k, v], dout, torch.bfloat16)


def check_varlen_unmasked(lens_q, lens_k, d, seed):
    """Packed sequences without a mask (4 query heads, 2 KV heads, bf16): values and gradients
    against float64, the reference one sequence at a time."""
    h, hk = 4, 2
    g = torch.Generator(device=DEV).manual_seed(seed)
    def r(n, heads):
        return torch.randn(n, heads, d, generator=g, device=DEV, dtype=torch.bfloat16)
    q, k, v, dout = r(sum(lens_q), h), r(sum(lens_k), hk), r(sum(lens_k), hk), r(sum(lens_q), h)
    cq, ck = np.cumsum([0] + lens_q).tolist(), np.cumsum([0] + lens_k).tolist()
    cu_q = torch.tensor(cq, dtype=torch.int32, device=DEV)
    cu_k = torch.tensor(ck, dtype=torch.int32, device=DEV)

    def ref(q, k, v):
        return torch.cat([torch_ref.attention(q[None, cq[i]:cq[i + 1]], k[None, ck[i]:ck[i + 1]],
                                              v[None, ck[i]:ck[i + 1]])[0][0] for i in range(len(lens_q))])

    check(lambda q, k, v: flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k)),
          ref, [q, k, v], dout, torch.bfloat16)


@pytest.mark.parametrize("d", [64, 128])
def test_long_backward_window_and_varlen_match_float64(d):
    """The Hopper dK/dV steps' query blocks (128 rows at d64, 64 at d128) under a local window
    over several blocks with seqlen_q != seqlen_k (blocks that skip the mask and blocks that
    apply it), and varlen without a mask, where a step's rows past one sequence are the next
    one's (their P must be 0 through the workspace's padded LSE rows), against float64."""
    s = dict(b=2, sq=900, sk=1100, h=4, hk=2, d=d)
    q, k, v, dout = make(s, torch.bfloat16, seed=41)
    window = (300, 50)
    check(lambda q, k, v: flashattn.flash_attn_func(q, k, v, window_size=window),
          lambda q, k, v: torch_ref.attention(q, k, v, window=window)[0], [q, k, v], dout, torch.bfloat16)
    check_varlen_unmasked([300, 1, 513, 129], [257, 40, 600, 129], d, seed=42)


@pytest.mark.parametrize("d", [64, 128])
def test_long_backward_rows_without_keys_match_float64(d):
    """Query rows that no key reaches, on the fused Hopper backward: causal with seqlen_q >
    seqlen_k (bottom-right aligned: the first 700 rows see no key, whole query blocks that no key
    block adds into) and varlen sequences without keys. Their dQ is 0 and is written as such:
    the memory the backward's gradients take is first filled with NaN through the caching
    allocator, so a row left unwritten shows."""
    def dirty():
        torch.full((1 << 26,), float("nan"), device=DEV, dtype=torch.float32)  # freed at once

    s = dict(b=2, sq=1000, sk=300, h=4, hk=2, d=d)
    q, k, v, dout = make(s, torch.bfloat16, seed=43)
    dirty()
    check(lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True),
          lambda q, k, v: torch_ref.attention(q, k, v, causal=True)[0], [q, k, v], dout, torch.bfloat16)
    dirty()
    check_varlen_unmasked([200, 333, 129, 64], [300, 0, 257, 0], d, seed=44)


@pytest.mark.parametrize("d", [64, 128, 192, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["none", "causal"])
def test_deterministic_backward_is_bitwise_stable_over_ten_runs(d, causal):
    """deterministic=True (issue 20): ten backward calls on the same inputs give the same bits at
    every head dim the Hopper backward runs (its two-kernel form: dQ in the query block's
    registers, dK/dV in the key block's, GQA partials summed in a fixed order), here with a GQA
    group of 4, several query and key blocks per plane and ragged lengths. Other GPUs run the
    sm80 backward, deterministic the same way."""
    if not flashattn._C._cuda_head_dim_built(d):
        pytest.skip(f"head dim {d} was not built (FLASHATTN_CUDA_HEAD_DIMS)")
    s = dict(b=2, sq=700, sk=900, h=8, hk=2, d=d)
    q, k, v, dout = make(s, torch.bfloat16, seed=50 + d)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = flashattn.flash_attn_func(q, k, v, causal=causal, deterministic=True)
    first = None
    for _ in range(10):
        grads = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        if first is None:
            first = [g.clone() for g in grads]
            continue
        for name, x, y in zip(("dq", "dk", "dv"), first, grads):
            assert torch.equal(x, y), f"{name} differs between runs"
    assert all(bool(torch.isfinite(g).all()) for g in first)


def test_mismatched_devices_are_a_value_error():
    q, k, v, _ = make(SHAPES[0], torch.bfloat16)
    with pytest.raises(ValueError, match=r"\bk\b.*cpu"):
        flashattn.flash_attn_func(q, k.cpu(), v)
    with pytest.raises(ValueError, match="alibi_slopes"):
        flashattn.flash_attn_func(q, k, v, alibi_slopes=torch.ones(4))


def test_float32_on_cuda_is_a_type_error():
    q, k, v, _ = make(SHAPES[0], torch.float32)
    with pytest.raises(TypeError, match=r"\bq\b.*float32"):
        flashattn.flash_attn_func(q, k, v)


def test_compile_fullgraph_forward_and_backward():
    q, k, v, dout = make(SHAPES[1], torch.bfloat16, seed=3)

    def f(q, k, v):
        return flashattn.flash_attn_func(q * 1.5, k, v, causal=True).float().square().to(q.dtype)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    for x, y in zip(torch_ref.values_and_grads(f, [q, k, v], dout),
                    torch_ref.values_and_grads(compiled, [q, k, v], dout)):
        np.testing.assert_allclose(x, y, rtol=2e-2, atol=2e-2)


def test_cuda_graph_capture_and_replay():
    q, k, v, _ = make(SHAPES[1], torch.bfloat16, seed=4)
    static = [t.clone() for t in (q, k, v)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as CUDA graphs require
        flashattn.flash_attn_func(*static, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = flashattn.flash_attn_func(*static, causal=True)
    for seed in (5, 6):
        new = make(SHAPES[1], torch.bfloat16, seed=seed)[:3]
        for dst, src in zip(static, new):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        eager = flashattn.flash_attn_func(*new, causal=True)
        assert torch.equal(static_out, eager)


def test_cuda_graph_decode_split_kv_replays():
    """Decode at batch 1 x 4k keys, GQA 32/8: split CTAs per KV head merged on a Hopper GPU
    within a thread-block cluster of 8 (distributed shared memory), elsewhere 16 merged by the
    last split CTA (counters that CTA sets back to zero, never a memset). Several graph replays
    and eager calls on two streams all give the eager bits, and the counter merge
    (split_combine_counter) and the combine kernel (split_combine_kernel) give them too (the
    switches change the merge, not the split count)."""

    # The default merge whatever FLASHATTN_SPLIT_COMBINE says.
    saved = {name: flashattn._C._set_switch(name, False) for name in ("split_combine_counter", "split_combine_kernel")}
    try:
        _decode_split_kv_replays()
    finally:
        for name, was in saved.items():
            flashattn._C._set_switch(name, was)


def _decode_split_kv_replays():
    gen = torch.Generator(device="cpu").manual_seed(11)
    shape = dict(q=(1, 1, 32, 128), k=(1, 4096, 8, 128))
    q = torch.randn(shape["q"], generator=gen).to(DEV, torch.bfloat16)
    k = torch.randn(shape["k"], generator=gen).to(DEV, torch.bfloat16)
    v = torch.randn(shape["k"], generator=gen).to(DEV, torch.bfloat16)
    clusters = flashattn._C._split_cluster_launches()
    sm90_forwards = flashattn._C._sm90_forward_calls()
    eager = flashattn.flash_attn_func(q, k, v)
    # 8 KV heads x 8 splits: 64 CTAs, clustered where they are at most two per SM. Under
    # FLASHATTN_CUDA_PATH=sm90 the Hopper forward takes the decode shape (unsplit) instead.
    decode_kernel = flashattn._C._sm90_forward_calls() == sm90_forwards
    if (decode_kernel and torch.cuda.get_device_capability()[0] == 9 and flashattn._C._cuda_sm90_built()
            and 2 * torch.cuda.get_device_properties(0).multi_processor_count >= 64):
        assert flashattn._C._split_cluster_launches() == clusters + 1, "the splits did not merge in a cluster"
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        assert torch.equal(flashattn.flash_attn_func(q, k, v), eager)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = flashattn.flash_attn_func(q, k, v)
    for _ in range(3):
        static_out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_out, eager)
        assert torch.equal(flashattn.flash_attn_func(q, k, v), eager)
    for switch in ("split_combine_counter", "split_combine_kernel"):
        saved = flashattn._C._set_switch(switch, True)
        try:
            clusters = flashattn._C._split_cluster_launches()
            assert torch.equal(flashattn.flash_attn_func(q, k, v), eager), switch
            assert flashattn._C._split_cluster_launches() == clusters, switch
        finally:
            flashattn._C._set_switch(switch, saved)


def test_runs_on_the_current_stream():
    # The inputs are written on a side stream after a long sleep; reading them on any other
    # stream would race with the copy and see the old values.
    q, k, v, _ = make(SHAPES[1], torch.bfloat16, seed=7)
    q_new = make(SHAPES[1], torch.bfloat16, seed=8)[0]
    expected = flashattn.flash_attn_func(q_new, k, v)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        q.copy_(q_new)
        out = flashattn.flash_attn_func(q, k, v)
        out.record_stream(side)
    side.synchronize()
    assert torch.equal(out, expected)


def test_lowlevel_api_on_cuda_uses_the_torch_stream():
    q, k, v, _ = make(SHAPES[0], torch.bfloat16, seed=9)
    out = torch.empty_like(q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        q2 = q * 2
        flashattn.forward(q2, k, v, out)
    side.synchronize()
    assert torch.equal(out, flashattn.flash_attn_func(q * 2, k, v))


def test_dropout_mask_matches_cpu_backend():
    b, h, sq, sk, p, seed = 2, 3, 70, 96, 0.3, 4242
    masks = []
    for device, dtype in (("cpu", torch.float32), (DEV, torch.bfloat16)):
        # head_dim = head_dim_v = sk, a size the CUDA kernels are built for
        q = torch.zeros(b, sq, h, sk, device=device, dtype=dtype)
        k = torch.randn(b, sk, h, sk, device=device).to(dtype)
        v = torch.eye(sk, device=device, dtype=dtype)[None, :, None, :].expand(b, sk, h, sk).contiguous()
        out = torch.empty(b, sq, h, sk, device=device, dtype=dtype)
        flashattn.forward(q, k, v, out, dropout_p=p, seed=seed)
        masks.append((out > 0).cpu())
    assert torch.equal(masks[0], masks[1])


def test_gpt_block_bf16_matches_sdpa():
    import gpt_block

    gpt_block.run_check(DEV, torch.bfloat16, 2e-3, dim=256, heads=4)  # head_dim 64


# Shapes the Hopper forward (src/cuda/sm90) takes even in its default mode: more than 16 query
# rows and grids that fill the GPU, ragged lengths (not multiples of its 128-row and 64/80/112/128-key
# tiles), seqlen_q != seqlen_k under the masks, GQA. On other GPUs they run the sm80 kernels;
# scripts/gpu-check.sh also runs this file with FLASHATTN_CUDA_PATH=sm80 and =sm90.
LONG_SHAPES = [
    dict(b=4, sq=1000, sk=1537, h=16, hk=4, d=128),
    dict(b=3, sq=1111, sk=1111, h=16, hk=16, d=64),
    # At most 1024 query rows under a mask: d64's short-rows tile (sm90/fwd_tile.h).
    dict(b=3, sq=1000, sk=1250, h=16, hk=4, d=64),
    # The short-rows kernels at several tiles per CTA on an H200: d128 up to 512 rows (512 tiles of
    # 128 rows), d64 masked (2048 tiles of 64 rows, the causal ones of the first 400 rows without a
    # key); d128 with GQA and more keys than rows, and with fewer (causal rows without a key).
    dict(b=8, sq=500, sk=500, h=16, hk=16, d=128),
    dict(b=8, sq=1000, sk=600, h=16, hk=4, d=64),
    dict(b=3, sq=300, sk=450, h=16, hk=4, d=128),
    dict(b=4, sq=480, sk=300, h=16, hk=8, d=128),
    # d128 past 512 rows under a mask: the window kernel, several tiles per CTA.
    dict(b=4, sq=700, sk=900, h=16, hk=4, d=128),
    # Masked d256 up to 2048 query rows takes 64-key blocks (the short-rows kernel), beyond it 80.
    dict(b=2, sq=777, sk=600, h=16, hk=8, d=256),
    dict(b=1, sq=2100, sk=2300, h=8, hk=4, d=256),
    dict(b=2, sq=900, sk=1333, h=16, hk=2, d=192),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", LONG_SHAPES, ids=lambda s: "b{b}_sq{sq}_sk{sk}_h{h}_hk{hk}_d{d}".format(**s))
@pytest.mark.parametrize("mask", ["none", "causal", "window", "softcap_causal"])
def test_long_forward_and_lse_match_float64(dtype, shape, mask):
    # softcap_causal: the Hopper softcap kernels (FwdTraits::kSoftcap) under FLASHATTN_CUDA_PATH=sm90.
    q, k, v, _ = make(shape, dtype, seed=11)
    causal = mask in ("causal", "softcap_causal")
    window = (100, 20) if mask == "window" else (-1, -1)
    softcap = 30.0 if mask == "softcap_causal" else 0.0
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                            return_attn_probs=True)
    ref_out, ref_lse = torch_ref.attention(q.double(), k.double(), v.double(), causal=causal, window=window,
                                           softcap=softcap)
    naive_out, naive_lse = torch_ref.attention(q, k, v, causal=causal, window=window, softcap=softcap)
    attn_ref.assert_fa_close("out", torch_ref.to_numpy(out), torch_ref.to_numpy(ref_out),
                             torch_ref.to_numpy(naive_out), ATOL[dtype])
    attn_ref.assert_fa_close("lse", torch_ref.to_numpy(lse), torch_ref.to_numpy(ref_lse),
                             torch_ref.to_numpy(naive_lse.float()), 1e-3)


def test_long_varlen_forward_matches_per_sequence_reference():
    # Packed sequences read through one tensor map: each CTA must stay inside its own sequence's
    # rows (reads past it are masked, writes never happen).
    for i, out, q, k, v in packed_varlen([300, 1, 1025, 129, 640], [500, 77, 1025, 1000, 640], 16, 4, 128, seed=12):
        ref = torch_ref.attention(q.double(), k.double(), v.double(), causal=True)[0]
        naive = torch_ref.attention(q, k, v, causal=True)[0]
        attn_ref.assert_fa_close(f"out[{i}]", torch_ref.to_numpy(out), torch_ref.to_numpy(ref),
                                 torch_ref.to_numpy(naive), ATOL[torch.bfloat16])


def test_long_strided_views_forward():
    # (b, h, s, d) tensors viewed as (b, s, h, d), and a K that is every other head of a wider
    # tensor: strides the tensor maps must describe (or the dispatcher must decline).
    b, sq, sk, h, d = 2, 900, 1300, 16, 128
    g = torch.Generator(device=DEV).manual_seed(13)
    def r(*shape):
        return torch.randn(*shape, generator=g, device=DEV, dtype=torch.bfloat16)
    q = r(b, h, sq, d).transpose(1, 2)
    k = r(b, sk, 2 * h, d)[:, :, ::2]
    v = r(b, sk + 7, h, d)[:, 7:]
    out = flashattn.flash_attn_func(q, k, v, causal=True)
    ref = torch_ref.attention(q.double(), k.double(), v.double(), causal=True)[0]
    naive = torch_ref.attention(q, k, v, causal=True)[0]
    attn_ref.assert_fa_close("out", torch_ref.to_numpy(out), torch_ref.to_numpy(ref), torch_ref.to_numpy(naive),
                             ATOL[torch.bfloat16])


def test_nan_in_one_query_row_stays_in_that_row():
    s = LONG_SHAPES[0]
    q, k, v, _ = make(s, torch.bfloat16, seed=14)
    q[1, 123, 5, 7] = float("nan")
    out = flashattn.flash_attn_func(q, k, v)
    bad = torch.isnan(out).any(dim=-1)
    expected = torch.zeros_like(bad)
    expected[1, 123, 5] = True
    assert torch.equal(bad, expected)


# ---- drop-in edges (issue 16) -----------------------------------------------------------------

@pytest.mark.parametrize("d", [16, 40, 59, 80, 160, 224])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims_outside_the_build_run_padded(d, causal):
    # Run at the next built head dim on zero-padded copies; the scale stays 1/sqrt(d).
    s = dict(b=2, sq=70, sk=129, h=4, hk=2, d=d)
    q, k, v, dout = make(s, torch.bfloat16, seed=d)
    check(lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=causal),
          lambda q, k, v: torch_ref.attention(q, k, v, causal=causal)[0],
          [q, k, v], dout, torch.bfloat16)


def test_causal_with_window_is_the_left_window():
    s = dict(b=2, sq=70, sk=90, h=4, hk=2, d=64)
    q, k, v, _ = make(s, torch.bfloat16)
    a = flashattn.flash_attn_func(q, k, v, causal=True, window_size=(8, 8))
    b = flashattn.flash_attn_func(q, k, v, window_size=(8, 0))
    assert torch.equal(a, b)


@pytest.mark.parametrize("b,sq,sk", [(0, 5, 7), (2, 0, 7), (2, 5, 0)])
def test_empty_tensors(b, sq, sk):
    q = torch.randn(b, sq, 4, 64, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, sk, 2, 64, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, sk, 2, 64, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.shape == (b, sq, 4, 64) and torch.all(out == 0)
    assert torch.all(lse == float("-inf"))
    out.sum().backward()
    for t in (q, k, v):
        assert t.grad.shape == t.shape and torch.all(t.grad == 0)


@pytest.mark.parametrize("kind", ["nan_q", "nan_k", "inf_k"])
def test_non_finite_inputs_propagate_like_torch_sdpa(kind):
    s = dict(b=2, sq=70, sk=70, h=2, hk=2, d=64)
    q, k, v, _ = make(s, torch.bfloat16)
    target = {"nan_q": q, "nan_k": k, "inf_k": k}[kind]
    target[1, 10, 1, 3] = float("inf") if kind == "inf_k" else float("nan")
    ours = flashattn.flash_attn_func(q, k, v, causal=True)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2).float(), k.transpose(1, 2).float(), v.transpose(1, 2).float(),
            is_causal=True).transpose(1, 2)
    bad_ours = ~torch.isfinite(ours.float()).all(dim=-1)
    bad_ref = ~torch.isfinite(ref).all(dim=-1)
    if kind != "nan_q":
        # torch's math SDPA adds the causal mask to the scores, so the bad key's NaN (or
        # inf - inf) also reaches rows 0..9, which cannot see key 10 (seen with torch 2.5 on the
        # CPU and 2.11 on the H200). A masked key takes no part in a row here (SEMANTICS.md):
        # those rows must stay finite, whatever torch does.
        bad_ref[1, :10, 1] = False
    assert bad_ref.any()
    assert torch.equal(bad_ours, bad_ref)


def test_varlen_metadata_checks_on_request():
    h, d = 2, 64
    q = torch.randn(10, h, d, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(14, h, d, device=DEV, dtype=torch.bfloat16)
    cu_q = torch.tensor([0, 4, 4, 10], dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0, 6, 9, 14], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="max_seqlen_k is 5"):
        flashattn.flash_attn_varlen_func(q, k, k, cu_q, cu_k, 6, 5, check_cu_seqlens=True)
    bad = torch.tensor([0, 4, 4, 11], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="exceeds the 10 rows of q"):
        flashattn.flash_attn_varlen_func(q, k, k, bad, cu_k, 6, 6, check_cu_seqlens=True)
    # CPU cu_seqlens with GPU tensors: checked on the host for free, then used on the device.
    with pytest.raises(ValueError, match="exceeds the 10 rows of q"):
        flashattn.flash_attn_varlen_func(q, k, k, bad.cpu(), cu_k.cpu(), 6, 6)
    out = flashattn.flash_attn_varlen_func(q, k, k, cu_q.cpu(), cu_k.cpu(), 6, 6)
    torch.testing.assert_close(out, flashattn.flash_attn_varlen_func(q, k, k, cu_q, cu_k, 6, 6))


def test_long_broadcast_kv_over_batch():
    # K and V expanded over the batch (batch stride 0): the tensor maps must read the one batch
    # entry for every batch (or the dispatcher must leave the call to the sm80 kernels).
    b, sq, sk, h, hk, d = 3, 700, 900, 8, 2, 128
    g = torch.Generator(device=DEV).manual_seed(15)
    q = torch.randn(b, sq, h, d, generator=g, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(1, sk, hk, d, generator=g, device=DEV, dtype=torch.bfloat16).expand(b, -1, -1, -1)
    v = torch.randn(1, sk, hk, d, generator=g, device=DEV, dtype=torch.bfloat16).expand(b, -1, -1, -1)
    assert k.stride(0) == 0
    out = flashattn.flash_attn_func(q, k, v, causal=True)
    ref = torch_ref.attention(q.double(), k.double(), v.double(), causal=True)[0]
    naive = torch_ref.attention(q, k, v, causal=True)[0]
    attn_ref.assert_fa_close("out", torch_ref.to_numpy(out), torch_ref.to_numpy(ref), torch_ref.to_numpy(naive),
                             ATOL[torch.bfloat16])


# ---- head_dim_v != head_dim (issue 19) --------------------------------------------------------
# The CUDA backend runs such a call at D = the smallest built head dim >= both, on zero-padded
# copies of the narrow side (v, out, dout, dv when head_dim_v < D; q, k, dq, dk when head_dim < D),
# and copies the first columns back (docs/SEMANTICS.md, "Head dims on CUDA"). 128/64 runs at
# 128, where the Hopper forward may take it. 192/128 is the exception on a Hopper GPU: where the
# sm90 forward takes the call (every call here under FLASHATTN_CUDA_PATH=sm90; the long ones in
# the default mode) it runs unpadded on its own kernels, and the backward pads the out it wrote.
# scripts/gpu-check.sh also runs this file with FLASHATTN_CUDA_PATH=sm80 and =sm90.
HDV_PAIRS = [(192, 128), (128, 64), (64, 128), (256, 128), (80, 48)]


def make_dv(s, dv, dtype, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    def r(*shape):
        return torch.randn(*shape, generator=g, device=DEV, dtype=dtype)
    return (r(s["b"], s["sq"], s["h"], s["d"]), r(s["b"], s["sk"], s["hk"], s["d"]),
            r(s["b"], s["sk"], s["hk"], dv), r(s["b"], s["sq"], s["h"], dv))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("d,dv", HDV_PAIRS)
@pytest.mark.parametrize("opt", [dict(), dict(causal=True), dict(window=(32, 8), softcap=30.0),
                                 dict(alibi=True, causal=True)],
                         ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "plain")
def test_head_dim_v_values_and_grads_match_float64(dtype, d, dv, opt):
    s = dict(b=2, sq=113, sk=203, h=6, hk=2, d=d)
    q, k, v, dout = make_dv(s, dv, dtype, seed=d * 1000 + dv)
    alibi = (torch.rand(s["h"], device=DEV) * 0.2 + 0.01) if opt.get("alibi") else None
    kw = dict(causal=opt.get("causal", False), softcap=opt.get("softcap", 0.0), alibi_slopes=alibi)
    window = opt.get("window", (-1, -1))
    out = flashattn.flash_attn_func(q, k, v, window_size=window, **kw)
    assert out.shape == (s["b"], s["sq"], s["h"], dv)
    check(lambda q, k, v: flashattn.flash_attn_func(q, k, v, window_size=window, **kw),
          lambda q, k, v: torch_ref.attention(q, k, v, causal=kw["causal"], window=window,
                                              softcap=kw["softcap"], alibi=alibi)[0],
          [q, k, v], dout, dtype)


def check_varlen_dv(lens_q, lens_k, h, hk, d, dv, seed, **kw):
    """Packed causal sequences, q/k d wide and v dv wide: values and gradients of each sequence
    against float64 (an empty sequence is skipped)."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    def r(*shape):
        return torch.randn(*shape, generator=g, device=DEV, dtype=torch.bfloat16)
    q, k, v, dout = r(sum(lens_q), h, d), r(sum(lens_k), hk, d), r(sum(lens_k), hk, dv), r(sum(lens_q), h, dv)
    cu_q = torch.tensor(np.cumsum([0] + lens_q), dtype=torch.int32, device=DEV)
    cu_k = torch.tensor(np.cumsum([0] + lens_k), dtype=torch.int32, device=DEV)
    ours = torch_ref.values_and_grads(
        lambda q, k, v: flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                                         causal=True, **kw),
        [q, k, v], dout)
    for i in range(len(lens_q)):
        sq = slice(int(cu_q[i]), int(cu_q[i + 1]))
        sk = slice(int(cu_k[i]), int(cu_k[i + 1]))
        if lens_q[i] == 0:
            continue
        seq = [t[None, s] for t, s in ((q, sq), (k, sk), (v, sk))]
        fn = lambda q, k, v: torch_ref.attention(q, k, v, causal=True)[0]  # noqa: E731
        ref = torch_ref.values_and_grads(fn, [t.double() for t in seq], dout[None, sq])
        naive = torch_ref.values_and_grads(fn, seq, dout[None, sq])
        for j, name in enumerate(["out", "dq", "dk", "dv"]):
            rows = sq if name in ("out", "dq") else sk
            attn_ref.assert_fa_close(f"{name}[{i}]", ours[j][rows][None], ref[j], naive[j],
                                     ATOL[torch.bfloat16] * (1 if name == "out" else 4))


@pytest.mark.parametrize("d,dv", [(192, 128), (64, 128)])
def test_head_dim_v_varlen_matches_float64(d, dv):
    # Packed sequences with an empty one.
    check_varlen_dv([65, 1, 0, 130], [70, 33, 9, 200], 4, 2, d, dv, seed=d + dv)


@pytest.mark.parametrize("d,dv,mask,dtype", [
    (192, 128, "none", torch.bfloat16), (192, 128, "causal", torch.bfloat16), (192, 128, "window", torch.bfloat16),
    (192, 128, "none", torch.float16), (192, 128, "causal", torch.float16),
    (128, 64, "none", torch.bfloat16), (128, 64, "causal", torch.bfloat16)], ids=str)
def test_head_dim_v_long_forward_and_backward_match_float64(d, dv, mask, dtype):
    # Grids that fill the GPU and ragged tiles: in the default mode on a Hopper GPU, 192/128 runs
    # on the sm90 forward's own 192/128 kernels (no mask: fixed rounds; causal and window: the
    # tile feed) and 128/64's padded call is one the Hopper forward takes; the backward runs at
    # D on the padded out and dout (sm90 at 192 and 128 where it takes the call, else sm80).
    s = dict(b=2, sq=1000, sk=1537, h=16, hk=4, d=d)
    q, k, v, dout = make_dv(s, dv, dtype, seed=21)
    causal = mask == "causal"
    window = (300, 40) if mask == "window" else (-1, -1)
    check(lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window, deterministic=True),
          lambda q, k, v: torch_ref.attention(q, k, v, causal=causal, window=window)[0],
          [q, k, v], dout, dtype)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window, return_attn_probs=True)
    ref_lse = torch_ref.attention(q.double(), k.double(), v.double(), causal=causal, window=window)[1]
    np.testing.assert_allclose(torch_ref.to_numpy(lse), torch_ref.to_numpy(ref_lse), rtol=0, atol=1e-3)


def test_head_dim_v_192_128_long_varlen_gqa_matches_float64():
    # DeepSeek-V3's shape packed: ragged sequences (one empty, one of a single token) long enough
    # that the default mode runs the sm90 192/128 kernels (no key splits), causal, GQA 4:1.
    check_varlen_dv([1000, 1, 0, 1537], [1537, 700, 9, 1537], 16, 4, 192, 128, seed=23, deterministic=True)


def test_head_dim_v_strided_and_split_kv_forward():
    # v a slice of a wider tensor (strides of the padding copy's source), out written through
    # the low-level API with requested key splits (the combine at D, then the copy back).
    b, sq, sk, h, hk, d, dv = 2, 7, 700, 8, 2, 192, 128
    g = torch.Generator(device=DEV).manual_seed(22)
    def r(*shape):
        return torch.randn(*shape, generator=g, device=DEV, dtype=torch.bfloat16)
    q, k = r(b, sq, h, d), r(b, sk, hk, d)
    v = r(b, sk, 2 * hk, dv)[:, :, ::2]
    ref_out, ref_lse = torch_ref.attention(q.double(), k.double(), v.double())
    naive_out = torch_ref.attention(q, k, v)[0]
    for splits in (1, 3):
        out = torch.empty(b, sq, h, dv, device=DEV, dtype=torch.bfloat16)
        lse = torch.empty(b, h, sq, device=DEV, dtype=torch.float32)
        flashattn.forward(q, k, v, out, lse, num_splits=splits)
        attn_ref.assert_fa_close(f"out(splits={splits})", torch_ref.to_numpy(out), torch_ref.to_numpy(ref_out),
                                 torch_ref.to_numpy(naive_out), ATOL[torch.bfloat16])
        np.testing.assert_allclose(torch_ref.to_numpy(lse), torch_ref.to_numpy(ref_lse), rtol=0, atol=1e-3)


# ---- the Hopper backward at 192/128 (BwdDvTraits) ---------------------------------------------
# On a Hopper GPU (unless FLASHATTN_CUDA_PATH=sm80) a 192/128 backward without softcap, ALiBi,
# dropout or a block mask runs unpadded on the sm90 backward's own 192/128 kernels (the d192
# split-role kernels with 128-wide V-side products; cuda_backend.cu native_head_dim_v_backward),
# in the default mode too; _C._backward_calls() counts those calls. The bwd_sm80 switch sends the
# same call to the padded sm80 backward in the same process. Ragged shapes, GQA with split query
# heads (the f32 dK/dV partials and their reduction, dV's 128 wide), a single query row.
DV_SHAPES = [dict(b=1, sq=113, sk=257, h=4, hk=2), dict(b=2, sq=1, sk=300, h=4, hk=1),
             dict(b=2, sq=300, sk=129, h=6, hk=6)]


def _native_dv_backward_expected():
    import os
    if not flashattn._C._cuda_head_dim_built(192):
        pytest.skip("head dim 192 was not built (FLASHATTN_CUDA_HEAD_DIMS): a 192/128 call runs padded")
    return torch.cuda.get_device_capability(DEV)[0] == 9 and os.environ.get("FLASHATTN_CUDA_PATH") != "sm80"


def _dv_run(fn, inputs, dout, sm80):
    """values_and_grads of fn with the backward on sm80 (bwd_sm80 switch) or not, and how many
    backward calls ran unpadded on the 192/128 kernels meanwhile."""
    saved = flashattn._C._set_switch("bwd_sm80", sm80)
    try:
        before = flashattn._C._backward_calls()[1]
        res = torch_ref.values_and_grads(fn, inputs, dout)
        torch.cuda.synchronize()
        return res, flashattn._C._backward_calls()[1] - before
    finally:
        flashattn._C._set_switch("bwd_sm80", saved)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", DV_SHAPES, ids=lambda s: "b{b}_sq{sq}_sk{sk}_h{h}_hk{hk}".format(**s))
@pytest.mark.parametrize("mask", ["none", "causal", "window"])
def test_head_dim_v_192_128_sm90_backward_matches_float64_and_sm80(dtype, shape, mask):
    if not _native_dv_backward_expected():
        pytest.skip("the 192/128 sm90 backward runs on Hopper GPUs, not under FLASHATTN_CUDA_PATH=sm80")
    s = dict(shape, d=192)
    q, k, v, dout = make_dv(s, 128, dtype, seed=shape["sq"] + 7 * shape["sk"])
    causal = mask == "causal"
    window = (40, 7) if mask == "window" else (-1, -1)
    fa = lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window)  # noqa: E731
    ref_fn = lambda q, k, v: torch_ref.attention(q, k, v, causal=causal, window=window)[0]  # noqa: E731
    ref = torch_ref.values_and_grads(ref_fn, [t.double() for t in (q, k, v)], dout)
    naive = torch_ref.values_and_grads(ref_fn, [q, k, v], dout)
    for sm80 in (False, True):
        ours, native = _dv_run(fa, [q, k, v], dout, sm80)
        assert native == (0 if sm80 else 1), f"unpadded 192/128 backward calls: {native} (sm80 backward: {sm80})"
        for name, o, r, n in zip(["out", "dq", "dk", "dv"], ours, ref, naive):
            attn_ref.assert_fa_close(f"{name} (sm80 backward: {sm80})", o, r, n,
                                     ATOL[dtype] * (1 if name == "out" else 4))


def test_head_dim_v_192_128_sm90_backward_is_bitwise_reproducible():
    # The split-role kernels are the two-kernel form (no dQ atomics) whatever deterministic says,
    # and GQA here splits query heads over CTAs (partials reduced in a fixed order).
    if not _native_dv_backward_expected():
        pytest.skip("the 192/128 sm90 backward runs on Hopper GPUs, not under FLASHATTN_CUDA_PATH=sm80")
    s = dict(b=2, sq=700, sk=1100, h=8, hk=2, d=192)
    q, k, v, dout = make_dv(s, 128, torch.bfloat16, seed=31)
    runs = []
    for det in (True, True, False):
        fa = lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True, deterministic=det)  # noqa: E731
        grads, native = _dv_run(fa, [q, k, v], dout, False)
        assert native == 1
        runs.append(grads[1:])
    for other in runs[1:]:
        for name, x, y in zip(("dq", "dk", "dv"), runs[0], other):
            assert np.array_equal(x, y), f"{name} differs between runs"


def test_head_dim_v_192_128_sm90_backward_varlen_gqa():
    # Packed ragged sequences (an empty one, a single query row, more queries than keys) with GQA.
    if not _native_dv_backward_expected():
        pytest.skip("the 192/128 sm90 backward runs on Hopper GPUs, not under FLASHATTN_CUDA_PATH=sm80")
    before = flashattn._C._backward_calls()[1]
    check_varlen_dv([113, 1, 0, 300], [257, 300, 9, 129], 8, 2, 192, 128, seed=37)
    torch.cuda.synchronize()
    assert flashattn._C._backward_calls()[1] - before == 1


def test_head_dim_v_192_128_backward_with_softcap_stays_padded():
    # Softcap (or ALiBi, dropout, a block mask) at 192/128: the padded call, as before (values:
    # test_head_dim_v_values_and_grads_match_float64).
    if not torch.cuda.get_device_capability(DEV)[0] == 9:
        pytest.skip("the 192/128 sm90 backward runs on Hopper GPUs")
    s = dict(b=1, sq=113, sk=257, h=4, hk=2, d=192)
    q, k, v, dout = make_dv(s, 128, torch.bfloat16, seed=41)
    fa = lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True, softcap=30.0)  # noqa: E731
    _, native = _dv_run(fa, [q, k, v], dout, False)
    assert native == 0
