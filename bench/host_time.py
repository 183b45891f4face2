"""Host time per call of flashattn's torch entry points against SDPA (cuDNN) on the same CUDA
tensors (issue 17: "host time per call of flash_attn_func and flash_attn_with_kvcache <= SDPA's
on the same tensors").

    pip install --no-build-isolation .        # on the GPU machine, from the repository root
    python3 bench/host_time.py --out host_time.json [--calls 2000] [--rounds 5]
                             [--cache-lens 4096,128] [--host-calls 32] [--host-rounds 5]
                             [--profile flash_attn_func_train,sdpa_cudnn_train]
                             [--rows flash_attn_func_train,...]

Shape: decode, batch 1, one query token, 32 query heads over 8 KV heads, head dim 128, bf16,
a cache of --cache-lens keys (each length is one set of rows). Per implementation and cache
length, --rounds rounds of --calls back-to-back eager calls, the implementations alternating
round by round; each round is timed on the CPU clock with torch.cuda.synchronize only before
its first and after its last call:

    wall_us     (time to the final synchronize) / calls: the larger of host time and GPU time
                per call. At 4096 keys the GPU kernels take ~17-24 us, about the host time, so
                this can be GPU-bound; the 128-key rows are host-bound.
    enqueue_us  (time to the last call's return, before the final synchronize) / calls: host
                time while the launch queue has room. It fills within a round of 1000 calls
                (the 2026-12-02 run's enqueue_us equals wall_us on every row, GPU-bound ones
                included), so on CUDA this column does not separate host from GPU time.
    host_us     host time alone: a round of --host-calls calls (few enough that their launches
                fit the queue) enqueued behind torch.cuda._sleep, which keeps the GPU busy past
                the round's last call, so no call can wait for a kernel of its own. gpu_busy
                says the sleep was still running when the last call returned (False: the sleep
                was too short, or a call synchronised with the GPU, and host_us includes GPU
                time). On the CPU device this is a plain round like wall_us. Each round makes
                --host-rounds such rounds (one round of 32 calls is ~1 ms: the 2026-12-02 run,
                one per round, spread 22.6-34.8 us on one row, which made the C++ entry look
                slower than its Python caller); host_median_us and host_min_us are over all.

Implementations (all on the same q/k/v/caches):

    sdpa_cudnn        F.scaled_dot_product_attention under sdpa_kernel(CUDNN_ATTENTION), q/k/v
                      in SDPA's (batch, heads, seqlen, dim) layout, k/v expanded to 32 heads
                      beforehand (copies; cuDNN's GQA support varies by version)
    sdpa_default      the same with enable_gqa=True and torch's own backend choice
    flash_attn_func   flashattn.flash_attn_func(q, k, v) (inference: every row but the training
                      ones runs under torch.no_grad, entered once per round)
    kvcache           flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                      cache_seqlens=...): one decode step, appending one token (at the same
                      row every call, so the cache never fills)
    kvcache_read      the same without k_new/v_new (no append)
    c_torch_forward, c_torch_forward_kvcache
                      the extension's torch fast-path entries called directly (no Python
                      wrapper): the C++ side's share of the two calls above
    flash_attn_func_train, sdpa_cudnn_train
                      a training step's attention, forward + backward (q/k/v require grad,
                      grad enabled), flash_attn_func against SDPA under cuDNN
    flash_attn_func_train_fwd, sdpa_cudnn_train_fwd
                      the forward alone of those (the graph recorded, then dropped)
    c_torch_backward  the extension's backward entry alone (_C.torch_backward, direct=False,
                      gradients allocated there) on the training row's tensors: its C++ side
                      and the library's host side (workspace, launches)
    function_floor_train
                      a Python autograd.Function that does nothing on the training row's
                      tensors (forward: one empty_like; backward: three empty_like), forward +
                      backward: what recording a Python Function and running it through the
                      engine costs. flash_attn_func_train - function_floor_train -
                      c_torch_forward - c_torch_backward is what flashattn's own Python adds.
    function_floor_train_fwd
                      its forward alone (against flash_attn_func_train_fwd)

Also, where torch.cuda.graphs works: the kvcache decode step and sdpa_cudnn captured in a CUDA
graph, replayed --calls times per round (graph_replay_us: wall per replay).

The JSON (--out) holds the environment, the per-round figures and their medians, whether
the fast path took the calls (fast_path: the extension's torch_forward / torch_forward_kvcache
returned a result rather than None), the routes the training call took (train_route:
flashattn._torch_ops.last_route after one call: "fast_autograd"/"fast" is the extension's
path, "eager_autograd"/"direct" the op's code without the dispatcher, "op" the registered op)
and, with --profile ROW[,ROW], cProfile's top functions (by own time) over --calls calls of
those rows.
"""
import argparse
import cProfile
import io
import json
import pstats
import statistics
import time

from bench import capture_graph, git_state  # bench/bench.py, beside this file (imports without torch)


def build(cache_len: int, device: str, dtype):
    """The callables of one cache length, all on one set of tensors."""
    import torch
    import torch.nn.functional as F

    import flashattn
    from flashattn import _C

    b, h, hk, d = 1, 32, 8, 128
    g = torch.Generator(device="cpu").manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g).to(device=device, dtype=dtype)  # noqa: E731
    q = r(b, 1, h, d)
    k_cache, v_cache = r(b, cache_len, hk, d), r(b, cache_len, hk, d)
    k_new, v_new = r(b, 1, hk, d), r(b, 1, hk, d)
    # The decode step appends at row cache_len - 1 and attends cache_len keys.
    seqlens_append = torch.full((b,), cache_len - 1, dtype=torch.int32, device=device)
    seqlens_full = torch.full((b,), cache_len, dtype=torch.int32, device=device)
    # SDPA's layout; k/v expanded to all query heads for the cuDNN backend.
    q_t = q.transpose(1, 2).contiguous()
    k_t, v_t = (x.transpose(1, 2).contiguous() for x in (k_cache, v_cache))
    k_x, v_x = (x.repeat_interleave(h // hk, dim=1).contiguous() for x in (k_t, v_t))

    # Training: separate leaves that require grad; dout like the output.
    q_g, k_g, v_g = (x.detach().clone().requires_grad_() for x in (q, k_cache, v_cache))
    qt_g, kx_g, vx_g = (x.detach().clone().requires_grad_() for x in (q_t, k_x, v_x))
    dout, dout_t = torch.randn_like(q), torch.randn_like(q_t)

    def train_func():
        flashattn.flash_attn_func(q_g, k_g, v_g).backward(dout)

    def train_sdpa():
        F.scaled_dot_product_attention(qt_g, kx_g, vx_g).backward(dout_t)

    class Floor(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q_, k_, v_):
            ctx.save_for_backward(q_, k_, v_)
            return torch.empty_like(q_)

        @staticmethod
        def backward(ctx, grad):
            return tuple(torch.empty_like(t) for t in ctx.saved_tensors)

    def train_floor():
        Floor.apply(q_g, k_g, v_g).backward(dout)

    fns = {
        "sdpa_cudnn": lambda: F.scaled_dot_product_attention(q_t, k_x, v_x),
        "sdpa_default": lambda: F.scaled_dot_product_attention(q_t, k_t, v_t, enable_gqa=True),
        "flash_attn_func": lambda: flashattn.flash_attn_func(q, k_cache, v_cache),
        "kvcache": lambda: flashattn.flash_attn_with_kvcache(
            q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens_append),
        "kvcache_read": lambda: flashattn.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=seqlens_full),
    }
    fast = {}
    if hasattr(_C, "torch_forward"):
        fwd_args = (q, k_cache, v_cache, None, None, 0, 0, None, None, False, (-1, -1), 0.0,
                    0.0, 0, None, False, True)
        kv_args = (q, k_cache, v_cache, k_new, v_new, None, None, seqlens_append, None, None,
                   None, None, None, False, (-1, -1), 0.0, True, 0, None, True)
        fns["c_torch_forward"] = lambda: _C.torch_forward(*fwd_args)
        fns["c_torch_forward_kvcache"] = lambda: _C.torch_forward_kvcache(*kv_args)
        fast = {"flash_attn_func": _C.torch_forward(*fwd_args) is not None,
                "kvcache": _C.torch_forward_kvcache(*kv_args) is not None}
    if hasattr(_C, "torch_backward"):
        out_g, lse_g = _C.torch_forward(q_g, k_g, v_g, None, None, 0, 0, None, None, False,
                                        (-1, -1), 0.0, 0.0, 0, None, False, False)
        bwd_args = (dout, q_g, k_g, v_g, out_g, lse_g, None, None, None, None, None, 0, 0, None,
                    None, None, False, (-1, -1), 0.0, 0.0, 0, False, False, False)
        fns["c_torch_backward"] = lambda: _C.torch_backward(*bwd_args)
        fast["c_torch_backward"] = _C.torch_backward(*bwd_args) is not None
    fns["flash_attn_func_train"] = train_func
    fns["sdpa_cudnn_train"] = train_sdpa
    fns["flash_attn_func_train_fwd"] = lambda: flashattn.flash_attn_func(q_g, k_g, v_g)
    fns["sdpa_cudnn_train_fwd"] = lambda: F.scaled_dot_product_attention(qt_g, kx_g, vx_g)
    fns["function_floor_train"] = train_floor
    fns["function_floor_train_fwd"] = lambda: Floor.apply(q_g, k_g, v_g)
    with torch.enable_grad():
        train_func()
    fast["train_route"] = dict(getattr(flashattn._torch_ops, "last_route", {}))
    graphs = {"kvcache": fns["kvcache"], "sdpa_cudnn": fns["sdpa_cudnn"]}
    return fns, graphs, fast


def context(name: str):
    """What a round of `name` runs under, entered once per round (not per call): grad enabled
    only for the training rows, cuDNN as SDPA's only backend for the sdpa_cudnn rows."""
    import contextlib

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    stack = contextlib.ExitStack()
    stack.enter_context(torch.enable_grad() if "_train" in name else torch.no_grad())
    if name.startswith("sdpa_cudnn"):
        stack.enter_context(sdpa_kernel(SDPBackend.CUDNN_ATTENTION))
    return stack


def timed_round(fn, calls: int, sync) -> tuple:
    """(wall_us, enqueue_us) per call of one round."""
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    enqueued = time.perf_counter()
    sync()
    end = time.perf_counter()
    return (end - start) / calls * 1e6, (enqueued - start) / calls * 1e6


def sleep_cycles_per_us() -> float:
    """torch.cuda._sleep's clock cycles per microsecond on this GPU (one timed 10M-cycle sleep)."""
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)  # loads the kernel
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return 10_000_000 / (start.elapsed_time(end) * 1e3)


def host_round(fn, calls: int, sleep_cycles: int, sync) -> tuple:
    """(host_us per call, gpu_busy) of one round enqueued behind a GPU sleep of sleep_cycles
    (0: no sleep, the CPU device; gpu_busy is then None)."""
    import torch
    sync()
    slept = None
    if sleep_cycles:
        torch.cuda._sleep(sleep_cycles)
        slept = torch.cuda.Event()
        slept.record()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    end = time.perf_counter()
    busy = None if slept is None else not slept.query()
    sync()
    return (end - start) / calls * 1e6, busy


def profile(fn, calls: int, name: str, top: int = 30) -> str:
    """cProfile's top functions by own time over calls calls of fn (under name's context)."""
    prof = cProfile.Profile()
    with context(name):
        prof.enable()
        for _ in range(calls):
            fn()
        prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON output path")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--cache-lens", default="4096,128")
    p.add_argument("--device", default="cuda", help="cuda (the figures that matter) or cpu")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--host-calls", type=int, default=32,
                   help="calls per host_us round (their launches must fit the launch queue)")
    p.add_argument("--host-rounds", type=int, default=5,
                   help="host_us rounds per round of each row")
    p.add_argument("--profile", default="",
                   help="comma-separated rows to run under cProfile (e.g. flash_attn_func_train)")
    p.add_argument("--rows", default="",
                   help="comma-separated rows to run (default: all), e.g. one row under nsys")
    a = p.parse_args(argv)

    import torch

    import flashattn

    cuda = a.device.startswith("cuda")
    dtype = getattr(torch, a.dtype if cuda else "float32")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    report = {
        "what": "host time per call, eager, CPU wall clock, synchronize only at round ends",
        "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "flashattn": flashattn.__version__, "git": git_state(),
        "shape": {"batch": 1, "seqlen_q": 1, "heads": 32, "heads_k": 8, "head_dim": 128,
                  "dtype": str(dtype).replace("torch.", "")},
        "calls": a.calls, "rounds": a.rounds, "host_calls": a.host_calls,
        "host_rounds": a.host_rounds, "by_cache_len": {},
    }
    cycles_per_us = sleep_cycles_per_us() if cuda else 0.0
    report["sleep_cycles_per_us"] = round(cycles_per_us, 1)
    for cache_len in (int(x) for x in a.cache_lens.split(",") if x):
        fns, graph_fns, fast = build(cache_len, a.device, dtype)
        if a.rows:
            wanted = set(a.rows.split(","))
            fns = {name: fn for name, fn in fns.items() if name in wanted}
            graph_fns = {name: fn for name, fn in graph_fns.items() if f"graph_{name}" in wanted}
        rows = {}
        for name, fn in fns.items():
            try:
                with context(name):
                    for _ in range(a.warmup):
                        fn()
                sync()
                rows[name] = {"wall_us": [], "enqueue_us": [], "host_us": [], "gpu_busy": []}
            except Exception as e:  # noqa: BLE001 - record the peer as unavailable
                rows[name] = {"error": f"{type(e).__name__}: {e}"}
        for _ in range(a.rounds):
            for name, fn in fns.items():
                if "error" in rows[name]:
                    continue
                with context(name):
                    wall, enq = timed_round(fn, a.calls, sync)
                    # A sleep of 4x the round's wall time, at least 20 ms.
                    cycles = int(cycles_per_us * max(4 * wall * a.host_calls, 20_000))
                    for _ in range(a.host_rounds):
                        host, busy = host_round(fn, a.host_calls, cycles, sync)
                        rows[name]["host_us"].append(host)
                        rows[name]["gpu_busy"].append(busy)
                rows[name]["wall_us"].append(wall)
                rows[name]["enqueue_us"].append(enq)
        if cuda:
            for name, fn in graph_fns.items():
                key = f"graph_{name}"
                try:
                    with context(name):
                        graph = capture_graph(fn)
                    rows[key] = {"graph_replay_us": [timed_round(graph.replay, a.calls, sync)[0]
                                                     for _ in range(a.rounds)]}
                except Exception as e:  # noqa: BLE001
                    rows[key] = {"error": f"{type(e).__name__}: {e}"}
        for row in rows.values():
            for key in ("wall_us", "enqueue_us", "host_us", "graph_replay_us"):
                if row.get(key):
                    row[key.replace("_us", "_median_us")] = round(statistics.median(row[key]), 2)
                    row[key] = [round(x, 2) for x in row[key]]
            if row.get("host_us"):
                row["host_min_us"] = min(row["host_us"])
        profiles = {name: profile(fns[name], a.calls, name)
                    for name in a.profile.split(",") if name in fns}
        report["by_cache_len"][str(cache_len)] = {"fast_path": fast, "results": rows,
                                                  "profiles": profiles}
        base = rows.get("sdpa_cudnn", {}).get("wall_median_us")
        print(f"cache {cache_len}: fast path {fast}")
        for name, row in rows.items():
            if "error" in row:
                print(f"  {name:24s} {row['error']}")
                continue
            if "graph_replay_median_us" in row:
                print(f"  {name:24s} replay {row['graph_replay_median_us']:8.2f} us")
                continue
            line = (f"  {name:24s} wall {row['wall_median_us']:8.2f} us  "
                    f"enqueue {row['enqueue_median_us']:8.2f} us  "
                    f"host {row['host_median_us']:8.2f} us (min {row['host_min_us']:8.2f})")
            if False in row["gpu_busy"]:
                line += " (GPU idle before the end: not host time alone)"
            if base:
                line += f"  {row['wall_median_us'] / base:5.2f}x sdpa_cudnn"
            print(line)
        for name, text in profiles.items():
            print(f"cProfile of {name}, {a.calls} calls:\n{text}")
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
