"""Ring attention in Python (flashattn.ring) on CPU tensors.

* The schedule port: every (query, key) pair covered exactly once by the derived local calls
  (the same brute-force check as tests/cpp/test_ring.cpp, on the Python port), one call per
  step, zig-zag balance.
* The merge against a softmax over the union of key sets.
* ring_flash_attn_func over gloo (3 processes, torch.multiprocessing): a ring of 3 on the
  default group and a ring of 2 on a subgroup, against one flash_attn_func call on the whole
  sequence: out, lse and the gradients of q, k, v (and of a learnable sink, summed over the
  ranks; softcap too).

Skipped without torch or without torch.distributed's gloo backend. The NCCL path (CUDA
tensors, several GPUs) is not exercised here.
"""

import importlib.util
import os
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import flashattn  # noqa: E402


def _import_ring():
    """flashattn.ring, from the installed package or else from this checkout's python/."""
    try:
        from flashattn import ring  # noqa: PLC0415
        return ring
    except ImportError:
        path = pathlib.Path(__file__).resolve().parents[2] / "python" / "flashattn" / "ring.py"
        spec = importlib.util.spec_from_file_location("flashattn.ring", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["flashattn.ring"] = module
        spec.loader.exec_module(module)
        flashattn.ring = module
        return module


ring = _import_ring()

needs_gloo = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="no torch.distributed gloo")


# ---- schedule ---------------------------------------------------------------------------------

def _call_sees(i, j, sq, sk, left, right):
    diag = i + sk - sq
    return (left < 0 or j >= diag - left) and (right < 0 or j <= diag + right)


def _coverage(n, world, layout, causal, window=(-1, -1)):
    sh = ring._Sharding(n, world, layout)
    rows = [[p for i in range(sh.chunks_per_rank)
             for p in range(*sh.global_span(r, i))] for r in range(world)]
    count = {}
    work = [0] * world
    max_calls = 0
    for r in range(world):
        for s in range(world):
            kv = (r - s) % world
            calls = ring._plan_step(sh, r, s, causal, window)
            max_calls = max(max_calls, len(calls))
            for (q0, q1), (k0, k1), wl, wr in calls:
                sq, sk = q1 - q0, k1 - k0
                for i in range(sq):
                    for j in range(sk):
                        if _call_sees(i, j, sq, sk, wl, wr):
                            key = (rows[r][q0 + i], rows[kv][k0 + j])
                            count[key] = count.get(key, 0) + 1
                            work[r] += 1
    for i in range(n):
        for j in range(n):
            left, right = window[0], (0 if causal else window[1])
            want = 1 if ((left < 0 or j >= i - left) and (right < 0 or j <= i + right)) else 0
            assert count.get((i, j), 0) == want, (n, world, layout, causal, i, j)
    return work, max_calls


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_schedule_covers_every_pair_once(world):
    for layout in ("zigzag", "contiguous"):
        for causal in (True, False):
            for n in (2 * world, 2 * world + 1, 7 * world + 3, 24):
                _, max_calls = _coverage(n, world, layout, causal)
                assert max_calls <= 1


def test_sink_calls_cover_every_row_once_in_step_zero():
    for world in (1, 2, 3, 4):
        for layout in ("zigzag", "contiguous"):
            for causal in (True, False):
                sh = ring._Sharding(5 * world + 3, world, layout)
                for r in range(world):
                    calls = ring._plan_step(sh, r, 0, causal)
                    hits = [0] * sh.shard_length(r)
                    for ((q0, q1), _, _, _), carry in zip(calls, ring._sink_calls(calls, len(hits))):
                        for row in range(q0, q1):
                            hits[row] += carry
                    assert hits == [1] * len(hits), (world, layout, causal, r)
    with pytest.raises(RuntimeError, match="overlap partly"):
        ring._sink_calls([((0, 5), (0, 5), -1, -1), ((3, 8), (0, 8), -1, -1)], 8)
    with pytest.raises(RuntimeError, match="cover 5 of the 8"):
        ring._sink_calls([((0, 5), (0, 5), -1, -1)], 8)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_windowed_schedule_covers_every_pair_once(world):
    for layout in ("zigzag", "contiguous"):
        for causal in (True, False):
            for window in ((0, 0), (3, 0), (5, 2), (-1, 4), (2, -1), (40, 0)):
                for n in (2 * world + 1, 7 * world + 3):
                    _coverage(n, world, layout, causal, window)


def test_window_block_call_matches_the_cpp_derivation():
    # Spot values of src/ring/schedule.cpp's window_block_call (tests/cpp/test_ring.cpp checks
    # it exhaustively): a causal window of 3 on chunk pairs.
    assert ring._window_block_call((0, 10), (0, 10), -1, 0) == ((0, 10), (0, 10), -1, 0)
    assert ring._window_block_call((10, 20), (0, 10), 3, 0) == ((10, 13), (7, 10), 0, -1)
    assert ring._window_block_call((20, 30), (0, 10), 3, 0) is None
    assert ring._window_block_call((0, 10), (0, 10), 3, 0) == ((0, 10), (0, 10), 3, 0)


def test_zigzag_balance():
    for world in (2, 3, 4):
        work, _ = _coverage(4 * world, world, "zigzag", True)
        assert len(set(work)) == 1, work


def test_shard_spans_match_the_cpp_layout():
    assert ring.ring_shard_spans(10, 2, 0, causal=True) == [(0, 2), (7, 10)]
    assert ring.ring_shard_spans(10, 2, 1, causal=True) == [(2, 5), (5, 7)]
    assert ring.ring_shard_spans(10, 3, 2, causal=False) == [(6, 10)]
    with pytest.raises(ValueError, match="at least the number of chunks"):
        ring.ring_shard_spans(5, 3, 0, causal=True)


def test_merge_matches_softmax_over_the_union():
    g = torch.Generator().manual_seed(3)
    s = torch.randn(2, 3, 5, 17, generator=g, dtype=torch.float64) * 3  # (b, h, rows, keys)
    v = torch.randn(2, 17, 3, 4, generator=g, dtype=torch.float64)      # (b, keys, h, dv)

    def part(keys):
        if not keys:
            return (torch.zeros(2, 5, 3, 4, dtype=torch.float32),
                    torch.full((2, 3, 5), float("-inf")))
        sk = s[..., keys]
        lse = torch.logsumexp(sk, dim=-1)
        p = torch.exp(sk - lse[..., None])
        o = torch.einsum("bhik,bkhd->bihd", p, v[:, keys])
        return o.float(), lse.float()

    o_ref, lse_ref = part(list(range(17)))
    o_acc, lse_acc = part([])
    o_acc[:] = float("nan")  # a part with no visible key weighs 0 whatever its O holds
    for keys in ([0, 5, 6], [], [1, 2, 3, 4, 16], list(range(7, 16))):
        o_p, lse_p = part(keys)
        ring._merge_(o_acc, lse_acc, o_p, lse_p)
    torch.testing.assert_close(o_acc, o_ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(lse_acc, lse_ref, rtol=0, atol=1e-5)

    o_none, lse_none = part([])
    ring._merge_(o_none, lse_none, *part([]))
    assert torch.all(o_none == 0) and torch.all(lse_none == float("-inf"))


# ---- the ring over gloo ------------------------------------------------------------------------

CASES = [
    dict(n=16, causal=True, h=4, hk=2, d=16, dv=16),
    dict(n=16, causal=False, h=4, hk=2, d=16, dv=16),
    dict(n=19, causal=True, h=2, hk=1, d=8, dv=12),   # uneven shards (needs global_seqlen)
    dict(n=23, causal=False, h=3, hk=3, d=16, dv=16),
    # Learnable sinks (each row's softmax gets them once; dsink summed over the ranks) and softcap.
    dict(n=16, causal=True, h=4, hk=2, d=16, dv=16, sink=True, softcap=5.0),
    dict(n=19, causal=False, h=2, hk=1, d=8, dv=12, sink=True),
    dict(n=17, causal=True, h=2, hk=2, d=16, dv=16, softcap=3.0),
    # Sliding windows (gpt-oss's sliding layers: with a sink), causal and two-sided.
    dict(n=22, causal=True, h=4, hk=2, d=16, dv=16, window=(5, 0), sink=True),
    dict(n=21, causal=False, h=2, hk=1, d=16, dv=16, window=(3, 6)),
]


def _rel_err(got, want):
    return ((got.double() - want.double()).abs().max() /
            want.double().abs().max().clamp_min(1e-30)).item()


def _check_cases(group, world, rank, failures):
    """Every case on `group` (this process is its rank `rank` of `world`)."""
    for ci, c in enumerate(CASES):
        g = torch.Generator().manual_seed(100 + ci)
        b, n = 2, c["n"]
        q = torch.randn(b, n, c["h"], c["d"], generator=g)
        k = torch.randn(b, n, c["hk"], c["d"], generator=g)
        v = torch.randn(b, n, c["hk"], c["dv"], generator=g)
        dout = torch.randn(b, n, c["h"], c["dv"], generator=g)

        sink = 2 * torch.randn(c["h"], generator=g) + 2 if c.get("sink") else None
        opts = dict(causal=c["causal"], softcap=c.get("softcap", 0.0),
                    window_size=c.get("window", (-1, -1)))
        # One call on the whole sequence.
        qf, kf, vf = (t.clone().requires_grad_() for t in (q, k, v))
        sf = None if sink is None else sink.clone().requires_grad_()
        out, lse, _ = flashattn.flash_attn_func(qf, kf, vf, return_attn_probs=True,
                                                learnable_sink=sf, **opts)
        out.backward(dout)

        def shard(t, dim=1):
            return ring.ring_shard(t, world, rank, causal=c["causal"], dim=dim)

        ql, kl, vl = (shard(t).clone().requires_grad_() for t in (q, k, v))
        sl = None if sink is None else sink.clone().requires_grad_()
        out_l, lse_l = ring.ring_flash_attn_func(ql, kl, vl, group, global_seqlen=n,
                                                 return_lse=True, learnable_sink=sl, **opts)
        out_l.backward(shard(dout))
        checks = dict(out=(out_l, shard(out.detach())), lse=(lse_l, shard(lse, dim=2)),
                      dq=(ql.grad, shard(qf.grad)), dk=(kl.grad, shard(kf.grad)),
                      dv=(vl.grad, shard(vf.grad)))
        if sink is not None:
            dsink = sl.grad.clone()  # this rank's rows' share
            dist.all_reduce(dsink, group=group)
            checks["dsink"] = (dsink, sf.grad)
        for name, (got, want) in checks.items():
            err = _rel_err(got, want)
            if not err <= 1e-5:
                failures.put(f"world {world} rank {rank} case {c}: {name} rel err {err}")


def _worker(rank, world, init_file, failures):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        torch.set_num_threads(1)
        # The whole world on the default group (group=None) ...
        _check_cases(None, world, rank, failures)
        # ... and a ring of global ranks 1 .. world-1 on a subgroup, whose group ranks differ
        # from the global ones.
        members = list(range(1, world))
        sub = dist.new_group(members)
        if rank in members:
            _check_cases(sub, len(members), members.index(rank), failures)
    except Exception as e:  # reported to the parent, which fails the test
        failures.put(f"world {world} rank {rank}: {type(e).__name__}: {e}")
        raise
    finally:
        dist.destroy_process_group()


@needs_gloo
def test_ring_matches_one_call_over_gloo(tmp_path):
    """3 processes: a ring of 3 on the default group, then a ring of 2 on a subgroup."""
    import torch.multiprocessing as mp  # noqa: PLC0415

    world = 3
    ctx = mp.get_context("spawn")
    failures = ctx.SimpleQueue()
    init_file = os.path.join(tmp_path, "rendezvous")
    mp.start_processes(_worker, args=(world, init_file, failures), nprocs=world, join=True,
                       start_method="spawn")
    messages = []
    while not failures.empty():
        messages.append(failures.get())
    assert not messages, "\n".join(messages)


def test_ring_rejects_a_wrong_shard_without_a_group():
    q = torch.randn(1, 8, 2, 8)
    with pytest.raises(RuntimeError, match="process group"):
        ring.ring_flash_attn_func(q, q, q, None, causal=True)
    with pytest.raises(ValueError, match="same shard"):
        ring.ring_flash_attn_func(q, q[:, :4], q, None, causal=True)


def test_ring_window_size_is_checked_before_the_ring():
    q = torch.zeros(1, 4, 2, 8)
    with pytest.raises(ValueError, match="window_size"):
        ring.ring_flash_attn_func(q, q, q, None, window_size=(-2, 0))
    with pytest.raises(ValueError, match="window_size"):
        ring.ring_flash_attn_func(q, q, q, None, window_size=(3,))
