"""Host replay of the CUDA backward's dbias error for a bias broadcast over the query rows
(sparse-bwd's first GPU failure, tests/python/test_bias.py
test_cuda_backward_matches_float64[False-float32-7], H200 2026-12-01: dbias max error 0.0547,
mean 0.00064, against 2 x naive 0.0111 + 0.01).

1. Replays the numpy draws test_bias.py makes, in pytest's collection order, up to each of the
   four variants of case 7 (test_bias.py draws every case from one module-level generator, so
   the four variants see different data).
2. Emulates the kernel's dbias on that data: everything exact (P, dP in float32 from bf16
   inputs are exact to ~1e-7 here) except D = rowsum(dO * out), read from the bf16 out of the
   forward (whose P is rounded to bf16 before P V); and the naive yardstick's dbias (bf16 q.k,
   softmax in float32 with a float32 bias, in bf16 with a bf16 one; dP rounded to bf16).
3. --sweep N: the same over N fresh draws of the case: how often each bound fails.

No race is modelled: if the replay gives the GPU's numbers, the failure is the bound.
Usage: python3 dev/dbias_replay.py [--sweep 1000]   (numpy only; imports tests/python)
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
U = 2.0**-8  # bf16 unit roundoff as the suites use it (dbias_atol, unit_roundoff)


def bf16(x):
    """Round to bfloat16 (nearest even), as float64."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32).astype(np.float64)


def f32(x):
    return np.asarray(x, np.float32).astype(np.float64)


def dbias_errors(q, k, v, do, bias, keep, bias_bf16):
    """(kernel's max and mean error, naive's max error, max|dbias|) of dbias summed over rows."""
    q, k, v, do = (bf16(x) for x in (q, k, v, do))
    bias = bf16(bias) if bias_bf16 else np.asarray(bias, np.float64)
    g = q.shape[2] // k.shape[2]
    ke, ve = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    qk = np.einsum("bihd,bjhd->bhij", q, ke)
    scale = 1 / np.sqrt(q.shape[-1])
    s = np.where(keep, scale * qk + bias, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    l = e.sum(-1, keepdims=True)
    p = e / l
    dp = np.einsum("bihd,bjhd->bhij", do, ve)
    d_exact = np.einsum("bihd,bihd->bhi", do, np.einsum("bhij,bjhd->bihd", p, ve))[..., None]
    ref = (p * (dp - d_exact)).sum(2, keepdims=True)
    out_bf16 = bf16(np.einsum("bhij,bjhd->bihd", bf16(e) / l, ve))
    d_kernel = f32(np.einsum("bihd,bihd->bhi", do, out_bf16))[..., None]
    ours = (p * (dp - d_kernel)).sum(2, keepdims=True)
    sn = bf16(scale * bf16(qk))
    sn = np.where(keep, bf16(sn + bias) if bias_bf16 else f32(sn + bias), -np.inf)
    en = np.exp(sn - sn.max(-1, keepdims=True))
    pn = en / en.sum(-1, keepdims=True)
    rnd = bf16 if bias_bf16 else f32
    pn, gn = rnd(pn), bf16(dp)
    naive = rnd(pn * (gn - rnd((pn * gn).sum(-1, keepdims=True)))).sum(2, keepdims=True)
    if bias_bf16:
        naive = bf16(naive)
    err = np.abs(ours - ref)
    return err.max(), err.mean(), np.abs(naive - ref).max(), np.abs(ref).max()


def replay():
    import test_bias as T
    mc = T.make_case
    for c in range(9):
        mc(T.CASES[c])                          # test_numpy_forward_and_backward
    mc(T.CASES[0])
    T.randn(2, 4, 3, 53)                        # test_block_size_is_checked
    for c in list(range(9)) * 2 + [3] + list(range(9)) * 2:
        mc(T.CASES[c])                          # torch_autograd x 2, opcheck (case 3), cuda forward x 2
    for det in ("False", "True"):
        for dt in ("float32", "bfloat16"):
            for c in range(9):
                q, k, v, do, bias, mask, block, bs, keep = mc(T.CASES[c])
                if c != 7:
                    continue
                em, mean, nv, m = dbias_errors(q, k, v, do, bias, keep, dt == "bfloat16")
                old = 2 * nv + 0.01
                new = 2 * nv + max(1e-2, 2 * U * (m + 0.3))
                print(f"[{det}-{dt}-7] kernel {em:.4f} (mean {mean:.5f}), naive {nv:.4f}, max|dbias| {m:.2f}: "
                      f"old bound {old:.4f} {'FAIL' if em > old else 'pass'}, "
                      f"dbias_atol bound {new:.4f} {'FAIL' if em > new else 'pass'}")


def sweep(n):
    b, sq, sk, h, hk, d = 2, 37, 53, 4, 2, 16
    keep = (np.arange(sk)[None, :] <= np.arange(sq)[:, None] + sk - sq)[None, None]
    for bias_bf16 in (False, True):
        fails = np.zeros(3, int)
        for seed in range(n):
            rng = np.random.default_rng(seed)
            x = [rng.standard_normal(sh).astype(np.float32)
                 for sh in ((b, sq, h, d), (b, sk, hk, d), (b, sk, hk, d), (b, sq, h, d))]
            bias = 2 * rng.standard_normal((b, h, 1, sk)).astype(np.float32)
            em, _, nv, m = dbias_errors(*x, bias, keep, bias_bf16)
            fails += [em > 2 * nv + 0.01, em > 2 * nv + max(1e-2, 2 * U * (m + 0.3)), em > 2 * U * (m + 0.3)]
        print(f"bias {'bf16' if bias_bf16 else 'f32 '}, {n} draws: fails 2 naive + 0.01: {fails[0]}, "
              f"2 naive + dbias_atol: {fails[1]}, C++ 2u(M + 0.3) alone: {fails[2]}")


if __name__ == "__main__":
    replay()
    if "--sweep" in sys.argv:
        sweep(int(sys.argv[sys.argv.index("--sweep") + 1]))
