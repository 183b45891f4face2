"""Host time per call of flash_attn_func's training call (forward with inputs that require grad,
then out.backward), and of the inference calls, on CPU torch: the dev machine's figures for
issue 17 (dev/NOTES.md, "Host time of the training call"). The CUDA figures come from
bench/host_time.py on the GPU machine.

    PYTHONPATH=<a flashattn build> python3 dev/host_train_cpu.py [--calls 2000] [--repeat 7]
                                                                 [--clock cpu|wall] [--rows a,b]

Shapes: micro q/k/v (1, 1, 1, 8) (the CPU kernel nearly free, so host time dominates) and small
(1, 16, 4, 64) float32. One intra-op thread. sdpa_train_fwd_bwd is torch's own training call on
the same values (scaled_dot_product_attention, CPU flash kernel) for reference;
function_floor_fwd_bwd a Python autograd.Function that does nothing (forward: one empty_like;
backward: returns its gradient three times) on the same tensors, the floor of any training call
that records a Python Function. Rows alternate round by round (a load change hits every row
alike). --clock cpu (the default) times the calling thread's CPU time (time.thread_time), which
other processes' load disturbs far less than the wall clock on the shared 2-core dev machine;
wall is what the previous figures used. Prints one JSON line: per row the min over --repeat
rounds of --calls calls, in us per call (and the median under "median/"), and the training
call's route where the build records it (flashattn._torch_ops.last_route).

--callgrind N counts instructions instead, which the load of other processes does not move:
each row runs N calls between two marker calls, os.getppid() before and os.getpgrp() after,
and callgrind zeroes its counters at the first and writes a dump at the second (one dump per
row and shape, in the order the JSON's "rows" lists):

    PYTHONPATH=<build> valgrind --tool=callgrind --zero-before=os_getppid \
        --dump-before=os_getpgrp --callgrind-out-file=/tmp/cg.%p \
        <the python binary itself, not a pyenv shim> dev/host_train_cpu.py --callgrind 200
    # instructions per call of dump i: its "summary:" line / 200
"""
import argparse
import json
import os
import statistics
import time

import torch

import flashattn


def rows(shape):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*shape, generator=g).requires_grad_() for _ in range(3))
    dout = torch.randn(*shape, generator=g)
    b, s, h, d = shape
    kc, vc = torch.randn(b, s + 1, h, d, generator=g), torch.randn(b, s + 1, h, d, generator=g)
    kn, vn = torch.randn(b, 1, h, d, generator=g), torch.randn(b, 1, h, d, generator=g)
    append = torch.full((b,), s, dtype=torch.int32)
    full = torch.full((b,), s + 1, dtype=torch.int32)
    qd = q.detach()
    qkv = torch.stack([q.detach(), k.detach(), v.detach()], dim=2).requires_grad_()
    # SDPA on the same values in its (batch, heads, seqlen, dim) layout: torch's CPU flash
    # kernel, one C++ autograd node (the floor of a call that records a graph).
    qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    dout_t = dout.transpose(1, 2).contiguous()
    sdpa = torch.nn.functional.scaled_dot_product_attention

    class Floor(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q_, k_, v_):
            return torch.empty_like(q_)

        @staticmethod
        def backward(ctx, grad):
            return grad, grad, grad

    return {
        "function_floor_fwd_bwd": (True, lambda: Floor.apply(q, k, v).backward(dout)),
        "sdpa_train_fwd_bwd": (True, lambda: sdpa(qt, kt, vt).backward(dout_t)),
        "train_fwd_bwd": (True, lambda: flashattn.flash_attn_func(q, k, v).backward(dout)),
        "train_fwd": (True, lambda: flashattn.flash_attn_func(q, k, v)),
        "train_lse_fwd_bwd": (True, lambda: flashattn.flash_attn_func(
            q, k, v, return_attn_probs=True)[0].backward(dout)),
        "train_qkvpacked_fwd_bwd": (True, lambda: flashattn.flash_attn_qkvpacked_func(
            qkv).backward(dout)),
        "infer_func": (False, lambda: flashattn.flash_attn_func(qd, k.detach(), v.detach())),
        "kvcache_append": (False, lambda: flashattn.flash_attn_with_kvcache(
            qd[:, :1], kc, vc, kn, vn, cache_seqlens=append)),
        "kvcache_read": (False, lambda: flashattn.flash_attn_with_kvcache(
            qd[:, :1], kc, vc, cache_seqlens=full)),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    p.add_argument("--rows", default="", help="comma-separated rows (default: all)")
    p.add_argument("--callgrind", type=int, default=0,
                   help="N: each row's N calls between callgrind markers, untimed (see above)")
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.callgrind:
        order = []
        for name, shape in (("micro", (1, 1, 1, 8)), ("small", (1, 16, 4, 64))):
            for row, (grad, fn) in rows(shape).items():
                if a.rows and row not in a.rows.split(","):
                    continue
                with torch.enable_grad() if grad else torch.no_grad():
                    for _ in range(20):
                        fn()
                    os.getppid()  # callgrind --zero-before
                    for _ in range(a.callgrind):
                        fn()
                    os.getpgrp()  # callgrind --dump-before
                order.append(f"{name}/{row}")
        print(json.dumps({"torch": torch.__version__, "flashattn": flashattn.__file__,
                          "calls": a.callgrind, "rows": order}))
        return
    clock = time.thread_time if a.clock == "cpu" else time.perf_counter
    report = {"torch": torch.__version__, "flashattn": flashattn.__file__, "clock": a.clock}
    wanted = set(a.rows.split(",")) if a.rows else None
    for name, shape in (("micro", (1, 1, 1, 8)), ("small", (1, 16, 4, 64))):
        fns = {row: v for row, v in rows(shape).items() if wanted is None or row in wanted}
        times = {row: [] for row in fns}
        for _ in range(a.repeat):
            for row, (grad, fn) in fns.items():
                with torch.enable_grad() if grad else torch.no_grad():
                    for _ in range(20):
                        fn()
                    start = clock()
                    for _ in range(a.calls):
                        fn()
                    times[row].append((clock() - start) / a.calls * 1e6)
        for row, t in times.items():
            report[f"{name}/{row}"] = round(min(t), 2)
            report[f"median/{name}/{row}"] = round(statistics.median(t), 2)
        with torch.enable_grad():
            rows(shape)["train_fwd_bwd"][1]()
        route = getattr(flashattn._torch_ops, "last_route", None)
        report[f"{name}/train_route"] = dict(route) if route else None
    print(json.dumps(report))


if __name__ == "__main__":
    main()
