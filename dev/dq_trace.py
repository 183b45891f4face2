#!/usr/bin/env python3
"""Where the Hopper backward's in-kernel dQ conversion spends its time (GPU machine; dev/ probe).

Needs a package built with -DFLASHATTN_DEV_SM90_BWD_DQ_IN_KERNEL -DFLASHATTN_DEV_DQ_TRACE
(sm90/bwd_kernel.h prints, per conversion, its %globaltimer stamps: begun, first part landed,
done; per CTA, the writer's total wait for a free job slot and the converters' batches and the
time their counts took). Runs one backward shape (bf16, 16 heads, 16k / seqlen sequences, d128
unless --head-dim) a few times, then one traced call alone, and prints:
  conversions   how many, per CTA (min / median / max), duration and load latency
                (begun -> first part landed) median / p90 / max
  writer        per CTA the wait for a free slot (median / max) against the kernel's span
  counts        batches per CTA, the largest batch, the mean time of a batch's atomics
A conversion that lasts longer than the writer's slack (8 slots of steps) stalls the CTA: then
the writer's waits add up to the kernel's loss against a build without the conversion.

    python3 dev/dq_trace.py --shapes 1024,2048:causal
"""
import argparse
import re
import statistics

from trace_children import run_children

CONV = re.compile(r"dq_trace conv cta (\d+) head (\d+) m0 (\d+) k (\d+) t0 (\d+) landed (\d+) end (\d+)")
WRITER = re.compile(r"dq_trace writer cta (\d+) steps (\d+) wait_ns (\d+) end (\d+)")
CTA = re.compile(r"dq_trace conv_cta cta (\d+) jobs (\d+) batches (\d+) max_n (\d+) count_ns (\d+) first (\d+)")


def child(seqlen, causal, head_dim):
    import torch
    from flashattn import flash_attn_func

    batch, heads = max(16384 // seqlen, 1), 16
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    out = flash_attn_func(q, k, v, causal=causal)
    dout = torch.randn_like(out)
    for _ in range(3):  # each flushed alone: the printf buffer holds about one call's lines
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        torch.cuda.synchronize()
    print("=== traced", flush=True)
    torch.cuda._sleep(1_000_000)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    stop.record()
    torch.cuda.synchronize()
    print(f"=== end {start.elapsed_time(stop) * 1e3:.1f} us", flush=True)


def pct(vals, p):
    vals = sorted(vals)
    return vals[min(len(vals) - 1, int(p * len(vals)))]


def summarize(text, label):
    traced = text.split("=== traced", 1)[-1]
    call_us = re.search(r"=== end ([\d.]+) us", traced)
    traced = traced.split("=== end", 1)[0]
    conv = [tuple(int(x) for x in m.groups()) for m in CONV.finditer(traced)]
    writer = [tuple(int(x) for x in m.groups()) for m in WRITER.finditer(traced)]
    ctas = [tuple(int(x) for x in m.groups()) for m in CTA.finditer(traced)]
    if not writer:
        print(f"{label}: no trace lines (built without FLASHATTN_DEV_DQ_TRACE?)")
        return
    t_first = min([r[5] for r in ctas if r[5] > 0] + [r[4] for r in conv])
    span = max(r[3] for r in writer) - t_first
    print(f"{label}: traced call {call_us.group(1) if call_us else '?'} us (printf included), "
          f"kernel span ~{span / 1e3:.1f} us, {len(writer)} CTAs")
    if conv:
        per_cta = {}
        for r in conv:
            per_cta[r[0]] = per_cta.get(r[0], 0) + 1
        counts = [per_cta.get(r[0], 0) for r in writer]
        dur = [(r[6] - r[4]) / 1e3 for r in conv]
        load = [(r[5] - r[4]) / 1e3 for r in conv]
        print(f"  conversions {len(conv)}: per CTA min {min(counts)} median {statistics.median(counts)} "
              f"max {max(counts)}")
        print(f"    duration us median {statistics.median(dur):.2f} p90 {pct(dur, 0.9):.2f} max {max(dur):.2f}; "
              f"load latency median {statistics.median(load):.2f} p90 {pct(load, 0.9):.2f} max {max(load):.2f}")
        # When in the kernel the conversions happen (tenths of the span).
        hist = [0] * 10
        for r in conv:
            hist[min(9, int(10 * (r[4] - t_first) / max(span, 1)))] += 1
        print(f"    by tenth of the span: {hist}")
    waits = [r[2] / 1e3 for r in writer]
    print(f"  writer wait for a slot us: median {statistics.median(waits):.1f} max {max(waits):.1f} "
          f"(sum over CTAs {sum(waits):.0f}); steps per CTA median {statistics.median([r[1] for r in writer])}")
    if ctas:
        mean_count = [r[4] / r[2] / 1e3 for r in ctas if r[2] > 0]
        print(f"  counts: batches per CTA median {statistics.median([r[2] for r in ctas])}, largest batch "
              f"{max(r[3] for r in ctas)}, a batch's atomics us median {statistics.median(mean_count):.2f} "
              f"max {max(mean_count):.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="1024,2048,2048:causal", help="SEQLEN[:causal] list")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        seqlen, _, mode = args.child.partition(":")
        child(int(seqlen), mode == "causal", args.head_dim)
        return
    run_children(__file__, args.shapes.split(","), summarize, lambda shape: f"d{args.head_dim} {shape}",
                 extra_args=("--head-dim", str(args.head_dim)), timeout=180)

if __name__ == "__main__":
    main()
