"""A small FlashAttention-2-style forward kernel in Triton, written for bench.py as a peer.

This is this project's own kernel, not Triton's tutorial kernel and not any upstream library's:
PyTorch ships no Triton attention, so bench.py would otherwise have no Triton peer. It shows
what a straightforward Triton implementation of the same algorithm reaches on this GPU.
Forward only (no backward), no dropout/softcap/ALiBi; float16/bfloat16; layout (B, H, N, d),
as SDPA's; causal is bottom-right aligned like flashattn's. One program per (query block,
batch * head); keys are visited in two loops: blocks every query row sees in full (no mask),
then the blocks on the causal diagonal or the ragged tail (masked).

Checked against a float64 reference on the CPU with Triton's interpreter:
    TRITON_INTERPRET=1 python3 bench/triton_attention.py
"""
import math

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e))


@triton.jit
def _fwd_kernel(Q, K, V, O, scale_log2,
                s_qb, s_qh, s_qm, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_ob, s_oh, s_om,
                heads, heads_k, seqlen_q, seqlen_k,
                CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // heads
    h = bh % heads
    hk = h // (heads // heads_k)  # GQA: query head h reads kv head h / group
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols0 = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)

    q = tl.load(Q + b * s_qb + h * s_qh + rows[:, None] * s_qm + dims[None, :],
                mask=rows[:, None] < seqlen_q, other=0.0)  # (BLOCK_M, HEAD_DIM)
    k_base = K + b * s_kb + hk * s_kh
    v_base = V + b * s_vb + hk * s_vh

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running row max (log2 domain)
    l_i = tl.zeros([BLOCK_M], tl.float32)                # running row sum
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    # Key j is visible to query i iff j <= i + shift (bottom-right aligned causal mask).
    shift = seqlen_k - seqlen_q
    if CAUSAL:
        # Keys below this bound are visible to every row of the block; the block's last row sees
        # up to (its index + shift).
        full_end = tl.minimum(seqlen_k, pid_m * BLOCK_M + shift + 1)
        end = tl.minimum(seqlen_k, (pid_m + 1) * BLOCK_M + shift)
    else:
        full_end = seqlen_k
        end = seqlen_k
    full_end = tl.maximum(full_end, 0) // BLOCK_N * BLOCK_N

    # Loop 1: key blocks that need no mask.
    for start in range(0, full_end, BLOCK_N):
        cols = start + cols0
        k = tl.load(k_base + cols[None, :] * s_kn + dims[:, None])  # (HEAD_DIM, BLOCK_N)
        s = tl.dot(q, k) * scale_log2
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None] * s_vn + dims[None, :])  # (BLOCK_N, HEAD_DIM)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    # Loop 2: the causal diagonal and the ragged tail, masked.
    for start in range(full_end, end, BLOCK_N):
        cols = start + cols0
        k = tl.load(k_base + cols[None, :] * s_kn + dims[:, None], mask=cols[None, :] < seqlen_k, other=0.0)
        s = tl.dot(q, k) * scale_log2
        visible = cols[None, :] < seqlen_k
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + shift)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no visible key yet
        alpha = tl.exp2(m_i - m_ref)
        p = tl.exp2(s - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None] * s_vn + dims[None, :], mask=cols[:, None] < seqlen_k, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # rows that see no key: output 0
    tl.store(O + b * s_ob + h * s_oh + rows[:, None] * s_om + dims[None, :], out.to(O.dtype.element_ty),
             mask=rows[:, None] < seqlen_q)


# (block_m, block_n, warps, stages) per head dim, tried in order: the first that compiles is kept.
# Chosen for shared memory (Q tile + pipelined K/V tiles) and the fp32 accumulator's registers,
# not tuned by a sweep.
_CONFIGS = {
    64: ((128, 64, 4, 3), (64, 64, 4, 2)),
    128: ((128, 64, 8, 3), (128, 32, 4, 2), (64, 32, 4, 2)),
    256: ((128, 64, 8, 2), (64, 64, 4, 2), (64, 32, 4, 1)),
}
_chosen = {}


def attention(q, k, v, causal=False, softmax_scale=None):
    """softmax(q k^T * scale) v for q (B, H, Nq, d), k/v (B, Hk, Nk, d); forward only."""
    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError("triton_attention: q, k, v must all be float16 or bfloat16, "
                        f"got {q.dtype}, {k.dtype}, {v.dtype}")
    b, h, nq, d = q.shape
    hk, nk = k.shape[1], k.shape[2]
    if d not in _CONFIGS or v.shape[-1] != d or h % hk:
        raise ValueError(f"triton_attention: head dim must be one of {sorted(_CONFIGS)} (q, k, v alike) "
                         f"and heads a multiple of kv heads; got d={d}, dv={v.shape[-1]}, heads {h}/{hk}")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    key = (d, bool(causal), q.dtype, q.device.type)
    configs = [_chosen[key]] if key in _chosen else _CONFIGS[d]
    error = None
    for bm, bn, warps, stages in configs:
        try:
            grid = (triton.cdiv(nq, bm), b * h)
            _fwd_kernel[grid](q, k, v, out, scale * LOG2E,
                              q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                              v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
                              h, hk, nq, nk, CAUSAL=bool(causal), HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn,
                              num_warps=warps, num_stages=stages)
        except triton.runtime.errors.OutOfResources as e:  # e.g. shared memory on a smaller GPU
            error = e
            continue
        _chosen[key] = (bm, bn, warps, stages)
        return out
    raise RuntimeError(f"triton_attention: no configuration fits this GPU for d={d}: {error}")


def _self_test():
    """Checks against float64 on ragged shapes: on the GPU, or on the CPU with TRITON_INTERPRET=1
    (float16 only there: the interpreter's tl.dot mishandles bfloat16)."""
    import os
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    device = "cpu" if interpreted or not torch.cuda.is_available() else "cuda"
    dtypes = (torch.float16,) if device == "cpu" else (torch.float16, torch.bfloat16)
    torch.manual_seed(0)
    worst = 0.0
    shapes = ((1, 2, 2, 70, 70, 64, False), (2, 2, 1, 33, 100, 64, True), (1, 2, 2, 100, 33, 64, True),
              (1, 1, 1, 256, 256, 64, True), (1, 1, 1, 129, 129, 128, True), (1, 1, 1, 40, 72, 256, False))
    for (b, h, hk, nq, nk, d, causal), dtype in ((s, t) for s in shapes for t in dtypes):
        q = torch.randn(b, h, nq, d, dtype=dtype, device=device)
        k, v = (torch.randn(b, hk, nk, d, dtype=dtype, device=device) for _ in range(2))
        out = attention(q, k, v, causal=causal).double().cpu()
        q, k, v = q.cpu(), k.cpu(), v.cpu()
        kr, vr = (t.double().repeat_interleave(h // hk, dim=1) for t in (k, v))
        s = q.double() @ kr.transpose(-1, -2) / math.sqrt(d)
        if causal:
            i = torch.arange(nq)[:, None]
            j = torch.arange(nk)[None, :]
            s = s.masked_fill(j > i + nk - nq, float("-inf"))
        p = torch.softmax(s, -1).nan_to_num(0.0)  # rows with no visible key -> 0
        err = (out - p @ vr).abs().max().item()
        worst = max(worst, err)
        print(f"{dtype} b{b} h{h}/{hk} nq{nq} nk{nk} d{d} causal={causal}: max |err| {err:.2e}")
    assert worst < 1e-2, worst  # P is rounded to the input type before P V, as in any such kernel
    print("ok")


if __name__ == "__main__":
    _self_test()
