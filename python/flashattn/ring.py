"""Ring attention (context parallelism) over ``torch.distributed``.

The sequence is sharded over the ranks of a process group; each rank keeps its query shard
while the K/V shards travel around the ring (rank r sends to r + 1, receives from r - 1), one
step per rank. Per step the rank calls flashattn on its queries against the K/V shard it holds
and merges the partial (out, lse) with the log-sum-exp merge, so the result equals one call on
the whole sequence up to rounding. The backward passes the dK/dV accumulators around the ring
with the shards, back to their owners.

    from flashattn.ring import ring_flash_attn_func, ring_shard
    q_local = ring_shard(q, world_size, rank, causal=True)   # (batch, local_seqlen, heads, d)
    out_local = ring_flash_attn_func(q_local, k_local, v_local, group, causal=True)

Causal attention uses the zig-zag layout (the sequence cut into 2R chunks, rank r holding
chunks r and 2R-1-r, concatenated) so that every rank does the same work; non-causal attention
uses contiguous shards. ``ring_shard`` cuts a full tensor accordingly.

This module mirrors the C++ ring (``src/ring/schedule.cpp``: ``Sharding``,
``window_block_call``, ``plan_step``, ``sink_calls``; ``src/ring/merge.h``) line for line. Keep
the two in sync: the C++ tests check the schedule exhaustively, and tests/python/test_ring.py
checks this port against one call on the whole sequence. The derivation of the local windows is
in docs/RING.md.

Status: tested on CPU tensors with the gloo backend (2 processes). The NCCL path (CUDA tensors)
has not run yet (no multi-GPU machine); with NCCL set the device of each rank
(``torch.cuda.set_device``) before the first call, and keep ``NCCL_NVLS_ENABLE=0``.
``softcap``, ``window_size`` and ``learnable_sink`` (with its gradient) are taken; dropout,
ALiBi and varlen are not (the dropout mask and ALiBi depend on global positions; docs/RING.md),
so they are not parameters here. All ranks must pass the same ``global_seqlen``, ``layout``,
``causal``, ``window_size`` and shapes: a mismatch between ranks cannot be detected without
communicating (gloo then aborts on a size mismatch, NCCL may hang).
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from ._lowlevel import backward as _lowlevel_backward
from .flash_attn_interface import flash_attn_func

__all__ = ["ring_flash_attn_func", "ring_shard", "ring_shard_spans"]

Span = Tuple[int, int]
# (query rows, key rows, window_left, window_right): one local flashattn call.
Call = Tuple[Span, Span, int, int]

_UNBOUNDED = 1 << 62  # stands for window_right = -1 among diagonal offsets
_INT32_MAX = (1 << 31) - 1


# ---- sharding (src/ring/schedule.h: Sharding) ----------------------------------------------

def _resolve_layout(layout: str, causal: bool) -> str:
    if layout == "auto":
        return "zigzag" if causal else "contiguous"
    if layout not in ("zigzag", "contiguous"):
        raise ValueError(f"layout must be 'auto', 'zigzag' or 'contiguous', got {layout!r}")
    return layout


class _Sharding:
    def __init__(self, seqlen: int, world: int, layout: str):
        if world < 1:
            raise ValueError(f"ring world_size must be >= 1, got {world}")
        self.seqlen, self.world, self.layout = int(seqlen), int(world), layout
        self.num_chunks = 2 * world if layout == "zigzag" else world
        self.chunks_per_rank = 2 if layout == "zigzag" else 1
        if self.seqlen < self.num_chunks:
            raise ValueError(
                f"ring global seqlen must be at least the number of chunks ({self.num_chunks}) "
                f"so that no shard is empty, got {self.seqlen}")

    def chunk(self, c: int) -> Span:
        return (c * self.seqlen // self.num_chunks, (c + 1) * self.seqlen // self.num_chunks)

    def chunks_of(self, rank: int) -> List[int]:
        if self.layout == "zigzag":
            return [rank, 2 * self.world - 1 - rank]
        return [rank]

    def global_span(self, rank: int, i: int) -> Span:
        return self.chunk(self.chunks_of(rank)[i])

    def local_span(self, rank: int, i: int) -> Span:
        begin = sum(_length(self.global_span(rank, p)) for p in range(i))
        return (begin, begin + _length(self.global_span(rank, i)))

    def shard_length(self, rank: int) -> int:
        return sum(_length(self.global_span(rank, i)) for i in range(self.chunks_per_rank))


def _length(s: Span) -> int:
    return s[1] - s[0]


def _kv_source_rank(rank: int, step: int, world: int) -> int:
    return (rank - step) % world


# ---- local calls (src/ring/schedule.cpp: window_block_call, plan_step) ---------------------

def _window_block_call(q: Span, k: Span, left: int, right: int) -> Optional[Call]:
    """The global window mask (key j visible to query i iff -left <= j - i <= right, -1 =
    unbounded; causal is (-1, 0)) of query rows q against key rows k as one call over trimmed
    rows, in global positions; None if nothing is visible.

    Local positions i' = i - qa, j' = j - ka; flashattn's bottom-right window (l, r) shows
    i' + sk - sq - l <= j' <= i' + sk - sq + r, so r = right + qb - kb and l = left + kb - qb.
    Keys and queries that see nothing of the block are trimmed first, edge by edge until
    stable, which makes both >= 0; an edge that hides no pair is -1.
    """
    (qa, qb), (ka, kb) = q, k
    while True:
        before = (qa, qb, ka, kb)
        if right >= 0:
            kb = min(kb, qb + right)
            qa = max(qa, ka - right)
        if left >= 0:
            ka = max(ka, qa - left)
            qb = min(qb, kb + left)
        if qb <= qa or kb <= ka:
            return None
        if (qa, qb, ka, kb) == before:
            break
    wr = right + qb - kb if right >= 0 and (kb - 1) - qa > right else -1
    wl = left + kb - qb if left >= 0 and ka - (qb - 1) < -left else -1
    return ((qa, qb), (ka, kb), wl, wr)


def _plan_step(sh: _Sharding, rank: int, step: int, causal: bool,
               window: Tuple[int, int] = (-1, -1)) -> List[Call]:
    kv_rank = _kv_source_rank(rank, step, sh.world)
    # The global mask: -left <= j - i <= right (-1: unbounded); causal clamps right to 0.
    left, right = window[0], (0 if causal else window[1])
    if left < 0 and right < 0:
        return [((0, sh.shard_length(rank)), (0, sh.shard_length(kv_rank)), -1, -1)]
    n = sh.chunks_per_rank
    q_off = [sh.global_span(rank, a)[0] - sh.local_span(rank, a)[0] for a in range(n)]
    k_off = [sh.global_span(kv_rank, b)[0] - sh.local_span(kv_rank, b)[0] for b in range(n)]

    pairs: List[Call] = []
    for a in range(n):
        for b in range(n):
            c = _window_block_call(sh.global_span(rank, a), sh.global_span(kv_rank, b), left, right)
            if c is None:
                continue
            (q0, q1), (k0, k1), wl, wr = c
            pairs.append(((q0 - q_off[a], q1 - q_off[a]), (k0 - k_off[b], k1 - k_off[b]), wl, wr))
    # Coalescing is derived for the causal mask alone; windows keep one call per pair.
    if len(pairs) <= 1 or left >= 0 or right != 0:
        return pairs

    # One call over the hull of the pairs if a single window reproduces every block's mask:
    # in the call's coordinates a block is "visible iff j - i <= delta"; two deltas agree on a
    # block iff equal once clamped to [d_min - 1, d_max].
    hq = (min(c[0][0] for c in pairs), max(c[0][1] for c in pairs))
    hk = (min(c[1][0] for c in pairs), max(c[1][1] for c in pairs))
    blocks = []
    for a in range(n):
        for b in range(n):
            ra, rb = sh.local_span(rank, a), sh.local_span(kv_rank, b)
            rows = (max(ra[0], hq[0]), min(ra[1], hq[1]))
            cols = (max(rb[0], hk[0]), min(rb[1], hk[1]))
            if rows[1] <= rows[0] or cols[1] <= cols[0]:
                continue
            truth = q_off[a] - k_off[b] + hq[0] - hk[0]
            d_min = (cols[0] - hk[0]) - (rows[1] - 1 - hq[0])
            d_max = (cols[1] - 1 - hk[0]) - (rows[0] - hq[0])
            blocks.append((truth, d_min, d_max))

    def clamp(delta: int, d_min: int, d_max: int) -> int:
        return min(max(delta, d_min - 1), d_max)

    base = _length(hk) - _length(hq)
    candidates = [_UNBOUNDED]
    for truth, d_min, d_max in blocks:
        candidates += [truth, d_min - 1, d_max]
    for delta in candidates:
        w = -1 if delta == _UNBOUNDED else delta - base
        if delta != _UNBOUNDED and not 0 <= w <= _INT32_MAX:
            continue
        if all(clamp(delta, lo, hi) == clamp(t, lo, hi) for t, lo, hi in blocks):
            return [(hq, hk, -1, w)]
    return pairs


# ---- public helpers ---------------------------------------------------------------------------

def _sink_calls(calls: List[Call], local_rows: int) -> List[bool]:
    """Which calls carry the learnable sink (a key without a value row, added to each row's
    softmax exactly once): the longest first, each unless its query rows lie inside a taken
    call's; used with step 0's calls, which every local row is in (src/ring/schedule.h:
    sink_calls)."""
    carries, taken, covered = [False] * len(calls), [], 0
    order = sorted(range(len(calls)), key=lambda i: -_length(calls[i][0]))  # stable
    for i in order:
        q0, q1 = calls[i][0]
        if q1 <= q0:
            continue
        if any(t0 <= q0 and q1 <= t1 for t0, t1 in taken):
            continue
        if any(max(q0, t0) < min(q1, t1) for t0, t1 in taken):
            raise RuntimeError("ring: the calls' query rows overlap partly; the learnable sink "
                               "cannot be added exactly once per row")
        taken.append((q0, q1))
        covered += q1 - q0
        carries[i] = True
    if covered != local_rows:
        raise RuntimeError(f"ring: the calls of the step that adds the learnable sink cover "
                           f"{covered} of the {local_rows} local rows")
    return carries


def ring_shard_spans(seqlen: int, world_size: int, rank: int, causal: bool,
                     layout: str = "auto") -> List[Span]:
    """The global rows [begin, end) making up ``rank``'s shard, in local order."""
    sh = _Sharding(seqlen, world_size, _resolve_layout(layout, causal))
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    return [sh.global_span(rank, i) for i in range(sh.chunks_per_rank)]


def ring_shard(x: torch.Tensor, world_size: int, rank: int, causal: bool, dim: int = 1,
               layout: str = "auto") -> torch.Tensor:
    """``rank``'s shard of a full tensor ``x`` along ``dim`` (the sequence dimension)."""
    spans = ring_shard_spans(x.shape[dim], world_size, rank, causal, layout)
    return torch.cat([x.narrow(dim, b, e - b) for b, e in spans], dim=dim)


# ---- merge (src/ring/merge.h) -----------------------------------------------------------------

def _merge_(o_acc: torch.Tensor, lse_acc: torch.Tensor, o_part: torch.Tensor,
            lse_part: torch.Tensor) -> None:
    """(o_acc, lse_acc) <- merge with (o_part, lse_part), in place.

    o: (batch, rows, heads, dv), o_acc float32; lse: (batch, heads, rows) float32. A part whose
    lse is -inf weighs exactly 0; both -inf gives o = 0, lse = -inf (never NaN).
    """
    neg_inf = float("-inf")
    hi = torch.maximum(lse_acc, lse_part)
    lo = torch.minimum(lse_acc, lse_part)
    empty = hi == neg_inf
    lse = torch.where(empty, hi, hi + torch.log1p(torch.exp(lo - torch.where(empty, 0.0, hi))))
    zero = torch.zeros((), dtype=torch.float32, device=lse.device)
    w_a = torch.where(lse_acc == neg_inf, zero, torch.exp(lse_acc - lse))
    w_b = torch.where(lse_part == neg_inf, zero, torch.exp(lse_part - lse))
    w_a = w_a.transpose(1, 2).unsqueeze(-1)  # (batch, rows, heads, 1)
    w_b = w_b.transpose(1, 2).unsqueeze(-1)
    o_part = o_part.float()
    merged = (torch.where(w_a == 0, zero, w_a * o_acc) +
              torch.where(w_b == 0, zero, w_b * o_part))
    o_acc.copy_(merged)
    lse_acc.copy_(lse)


# ---- the ring ---------------------------------------------------------------------------------

class _Ring:
    """The process group, this rank's place in it and the sharding."""

    def __init__(self, group, local_seqlen: int, causal: bool, global_seqlen: Optional[int],
                 layout: str, window: Tuple[int, int] = (-1, -1)):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("ring_flash_attn_func needs an initialised torch.distributed "
                               "process group")
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if self.rank < 0:
            raise ValueError("this process is not a member of the ring's process group")
        self.causal = bool(causal)
        self.window = (int(window[0]), int(window[1]))
        seqlen = int(global_seqlen) if global_seqlen else self.world * int(local_seqlen)
        self.sharding = _Sharding(seqlen, self.world, _resolve_layout(layout, causal))
        expected = self.sharding.shard_length(self.rank)
        if local_seqlen != expected:
            hint = "" if global_seqlen else "; pass global_seqlen when the shards are unequal"
            raise ValueError(
                f"rank {self.rank} must hold {expected} rows of the global sequence of "
                f"{seqlen} ({self.sharding.layout} layout, see ring_shard), got q and k with "
                f"seqlen {local_seqlen}{hint}")
        self.next = self._global((self.rank + 1) % self.world)
        self.prev = self._global((self.rank - 1) % self.world)

    def _global(self, group_rank: int) -> int:
        if self.group is None:
            return group_rank
        return dist.get_global_rank(self.group, group_rank)

    def kv_len(self, step: int) -> int:
        return self.sharding.shard_length(_kv_source_rank(self.rank, step, self.world))

    def plan(self, step: int) -> List[Call]:
        return _plan_step(self.sharding, self.rank, step, self.causal, self.window)

    def exchange(self, sends: Sequence[torch.Tensor], recvs: Sequence[torch.Tensor]):
        """Starts sending ``sends`` to rank + 1 and receiving ``recvs`` from rank - 1."""
        if not sends and not recvs:
            return []
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in sends]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group) for t in recvs]
        return dist.batch_isend_irecv(ops)


def _wait(reqs) -> None:
    for r in reqs:
        r.wait()


def _step_sink(step: int, calls: List[Call], sink, local_rows: int) -> List[bool]:
    if sink is not None and step == 0:
        return _sink_calls(calls, local_rows)
    return [False] * len(calls)


def _ring_forward(q, k, v, sink, ring: _Ring, scale: float, softcap: float):
    b, seqlen, heads, _ = q.shape
    heads_k, d, dv = k.shape[2], k.shape[3], v.shape[3]
    o_acc = torch.zeros((b, seqlen, heads, dv), dtype=torch.float32, device=q.device)
    lse_acc = torch.full((b, heads, seqlen), float("-inf"), dtype=torch.float32, device=q.device)
    k_cur, v_cur = k.contiguous(), v.contiguous()
    for step in range(ring.world):
        reqs = []
        if step + 1 < ring.world:
            ln = ring.kv_len(step + 1)
            k_next = k.new_empty((b, ln, heads_k, d))
            v_next = v.new_empty((b, ln, heads_k, dv))
            reqs = ring.exchange([k_cur, v_cur], [k_next, v_next])
        calls = ring.plan(step)
        carries = _step_sink(step, calls, sink, seqlen)
        for ((q0, q1), (k0, k1), wl, wr), carry in zip(calls, carries):
            out_s, lse_s, _ = flash_attn_func(
                q[:, q0:q1], k_cur[:, k0:k1], v_cur[:, k0:k1], softmax_scale=scale,
                causal=False, window_size=(wl, wr), softcap=softcap, return_attn_probs=True,
                learnable_sink=sink if carry else None)
            _merge_(o_acc[:, q0:q1], lse_acc[:, :, q0:q1], out_s, lse_s)
        if reqs:
            _wait(reqs)
            k_cur, v_cur = k_next, v_next
    return o_acc.to(q.dtype), lse_acc


def _ring_backward(dout, q, k, v, out, lse, sink, ring: _Ring, scale: float, softcap: float):
    b, seqlen, heads, d = q.shape
    heads_k, dv = k.shape[2], v.shape[3]
    f32 = torch.float32
    dout = dout.contiguous()
    dq_acc = torch.zeros(q.shape, dtype=f32, device=q.device)
    dsink = None if sink is None else torch.zeros(heads, dtype=f32, device=q.device)
    k_cur, v_cur = k.contiguous(), v.contiguous()
    dk_out = dv_out = None  # the accumulator completed at the previous step
    for step in range(ring.world):
        lk = ring.kv_len(step)
        sends, recvs = [], []
        if step + 1 < ring.world:
            ln = ring.kv_len(step + 1)
            k_next = k.new_empty((b, ln, heads_k, d))
            v_next = v.new_empty((b, ln, heads_k, dv))
            sends += [k_cur, v_cur]
            recvs += [k_next, v_next]
        if step > 0:
            # Ours of the previous step goes on; rank - 1's (of the shard held now) comes in.
            dk_in = torch.empty((b, lk, heads_k, d), dtype=f32, device=q.device)
            dv_in = torch.empty((b, lk, heads_k, dv), dtype=f32, device=q.device)
            sends += [dk_out, dv_out]
            recvs += [dk_in, dv_in]
        reqs = ring.exchange(sends, recvs)

        dk_step = torch.zeros((b, lk, heads_k, d), dtype=f32, device=q.device)
        dv_step = torch.zeros((b, lk, heads_k, dv), dtype=f32, device=q.device)
        calls = ring.plan(step)
        carries = _step_sink(step, calls, sink, seqlen)
        for ((q0, q1), (k0, k1), wl, wr), carry in zip(calls, carries):
            dsink_p = torch.empty(heads, dtype=f32, device=q.device) if carry else None
            dq_p = q.new_empty((b, q1 - q0, heads, d))
            dk_p = k.new_empty((b, k1 - k0, heads_k, d))
            dv_p = v.new_empty((b, k1 - k0, heads_k, dv))
            # The final out and lse: P and D = rowsum(dout * out) are the global ones.
            _lowlevel_backward(dout[:, q0:q1], q[:, q0:q1], k_cur[:, k0:k1], v_cur[:, k0:k1],
                               out[:, q0:q1], lse[:, :, q0:q1], dq_p, dk_p, dv_p,
                               softmax_scale=scale, causal=False, window_size=(wl, wr),
                               softcap=softcap, learnable_sink=sink if carry else None,
                               dsink=dsink_p)
            if carry:
                dsink += dsink_p
            dq_acc[:, q0:q1] += dq_p
            dk_step[:, k0:k1] += dk_p
            dv_step[:, k0:k1] += dv_p
        _wait(reqs)
        if step == 0:
            dk_out, dv_out = dk_step, dv_step
        else:
            dk_out, dv_out = dk_in.add_(dk_step), dv_in.add_(dv_step)
        if step + 1 < ring.world:
            k_cur, v_cur = k_next, v_next

    if ring.world > 1:  # the last accumulator's final hop; ours comes home
        dk_home = torch.empty((b, seqlen, heads_k, d), dtype=f32, device=q.device)
        dv_home = torch.empty((b, seqlen, heads_k, dv), dtype=f32, device=q.device)
        _wait(ring.exchange([dk_out, dv_out], [dk_home, dv_home]))
        dk_out, dv_out = dk_home, dv_home
    return dq_acc.to(q.dtype), dk_out.to(k.dtype), dv_out.to(v.dtype), dsink


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sink, ring, scale, softcap):
        out, lse = _ring_forward(q, k, v, sink, ring, scale, softcap)
        ctx.save_for_backward(q, k, v, out, lse, sink)
        ctx.ring, ctx.scale, ctx.softcap = ring, scale, softcap
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, sink = ctx.saved_tensors
        dq, dk, dv, dsink = _ring_backward(dout, q, k, v, out, lse, sink, ctx.ring, ctx.scale,
                                           ctx.softcap)
        return dq, dk, dv, dsink, None, None, None


def ring_flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group=None,
                         causal: bool = False, softmax_scale: Optional[float] = None, *,
                         global_seqlen: Optional[int] = None, layout: str = "auto",
                         return_lse: bool = False, softcap: float = 0.0,
                         learnable_sink: Optional[torch.Tensor] = None,
                         window_size: Tuple[int, int] = (-1, -1)):
    """Exact attention over a sequence sharded across the ranks of ``group``.

    q: (batch, local_seqlen, heads, head_dim); k, v: (batch, local_seqlen, heads_k, head_dim
    [_v]): this rank's shard (``ring_shard``), the same rows for q, k and v (self-attention).
    Every rank of ``group`` (None = the default group) calls this at the same time with the
    same arguments but its own shard. ``global_seqlen``: the whole sequence's length, needed
    only when the shards are unequal (default world_size * local_seqlen). ``layout``: 'auto'
    (zig-zag when causal, contiguous otherwise), 'zigzag' or 'contiguous'. ``softcap`` and
    ``window_size`` (a sliding window over the global sequence, -1 = unbounded; with causal the
    right side is 0): as in flash_attn_func. ``learnable_sink``: (heads,) sink logits
    (FlashAttention-4's keyword), the same on every rank; each row's softmax gets it once, and
    its gradient on each rank is that rank's rows' share: all-reduce it over the group as for
    any parameter shared by the ranks.

    Returns out (batch, local_seqlen, heads, head_dim_v) for this rank's rows, and with
    ``return_lse`` also the float32 lse (batch, heads, local_seqlen). Differentiable in q, k, v
    and learnable_sink.
    """
    if q.dim() != 4:
        raise ValueError(f"q must have shape (batch, local_seqlen, heads, head_dim), got "
                         f"{tuple(q.shape)}")
    if k.shape[1] != q.shape[1] or v.shape[1] != q.shape[1]:
        raise ValueError(f"q, k and v must hold the same shard of the sequence, got seqlens "
                         f"{q.shape[1]}, {k.shape[1]}, {v.shape[1]}")
    scale = float(softmax_scale) if softmax_scale else 1.0 / math.sqrt(q.shape[-1])
    window = tuple(-1 if w is None else w for w in window_size)
    if len(window) != 2 or not all(isinstance(w, int) and w >= -1 for w in window):
        raise ValueError(f"window_size must be (left, right), ints >= -1 (or None: unbounded), got "
                         f"{window_size}")
    ring = _Ring(group, q.shape[1], causal, global_seqlen, layout, window)
    sink = None
    if learnable_sink is not None:
        if learnable_sink.shape != (q.shape[2],):
            raise ValueError(f"learnable_sink must have shape (heads,) = ({q.shape[2]},), got "
                             f"{tuple(learnable_sink.shape)}")
        sink = learnable_sink.to(device=q.device, dtype=torch.float32).contiguous()
    out, lse = _RingAttention.apply(q, k, v, sink, ring, scale, float(softcap))
    return (out, lse) if return_lse else out
