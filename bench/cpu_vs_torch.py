#!/usr/bin/env python3
"""flashattn CPU backend vs PyTorch's CPU scaled_dot_product_attention, same shapes, same threads.

Builds nothing: give it the path of an already built flashattn-bench. For each thread count it
runs `flashattn-bench --device cpu --threads T --json` and times torch SDPA forward and backward
on the CPU with torch.set_num_threads(T) (float32, layout (B, H, N, d), median of the timed runs
after warm-up), then writes one JSON file and prints a table. Speedup = torch ms / flashattn ms
(> 1 means flashattn is faster).

    python bench/cpu_vs_torch.py build/flashattn-bench --out bench/results/cpu_vs_torch.json
"""
import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_flashattn(bench, threads, args):
    cmd = [
        bench, "--device", "cpu", "--threads", str(threads), "--json",
        "--batch", str(args.batch), "--heads", str(args.heads), "--seqlen-q", str(args.seqlen),
        "--head-dim", str(args.head_dim), "--dtype", "f32",
        "--repeats", str(args.repeats), "--warmup", str(args.warmup),
    ]
    if not args.check:
        cmd.append("--no-check")
    if args.causal:
        cmd.append("--causal")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} exited with {proc.returncode}:\n{proc.stderr}")
    return json.loads(proc.stdout)


def time_torch(threads, args):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    shape = (args.batch, args.heads, args.seqlen, args.head_dim)
    q, k, v = (torch.randn(shape, dtype=torch.float32) for _ in range(3))
    dout = torch.randn(shape, dtype=torch.float32)

    def median_ms(fn):
        for _ in range(args.warmup):
            fn()
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times), min(times)

    with torch.no_grad():
        fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=args.causal))

    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=args.causal)

    def backward():
        qg.grad = kg.grad = vg.grad = None
        out.backward(dout, retain_graph=True)

    bwd = median_ms(backward)
    return fwd, bwd


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("bench", help="path of the flashattn-bench executable")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--threads", default="16,2", help="comma-separated thread counts (default 16,2)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--repeats", type=int, default=10, help="timed runs (>= 10)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--check", action="store_true",
                    help="let flashattn-bench also compare with the float64 reference (slow)")
    args = ap.parse_args()
    if args.repeats < 10:
        ap.error("--repeats must be >= 10")
    if not os.access(args.bench, os.X_OK):
        ap.error(f"{args.bench} is not an executable")

    import torch

    rows = []
    for threads in [int(t) for t in args.threads.split(",") if t]:
        ours = run_flashattn(args.bench, threads, args)
        (t_fwd, t_fwd_min), (t_bwd, t_bwd_min) = time_torch(threads, args)
        rows.append({
            "threads": threads,
            "flashattn_fwd_ms": ours["fwd_ms"],
            "flashattn_bwd_ms": ours["bwd_ms"],
            "torch_fwd_ms": t_fwd,
            "torch_bwd_ms": t_bwd,
            "torch_fwd_ms_min": t_fwd_min,
            "torch_bwd_ms_min": t_bwd_min,
            "fwd_speedup_vs_torch": t_fwd / ours["fwd_ms"],
            "bwd_speedup_vs_torch": t_bwd / ours["bwd_ms"],
            "flashattn": ours,
        })

    result = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_version": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "shape": {"batch": args.batch, "heads": args.heads, "seqlen": args.seqlen,
                  "head_dim": args.head_dim, "dtype": "float32", "causal": args.causal,
                  "layout_torch": "(B, H, N, d)", "layout_flashattn": "(B, N, H, d)"},
        "repeats": args.repeats,
        "warmup": args.warmup,
        "statistic": "median ms",
        "results": rows,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")

    print(f"{result['cpu_model']}, torch {result['torch_version']}, "
          f"B{args.batch} H{args.heads} N{args.seqlen} d{args.head_dim} f32"
          f"{' causal' if args.causal else ''}, median of {args.repeats}")
    print(f"{'threads':>7} | {'fwd ours':>9} {'torch':>9} {'speedup':>7} | "
          f"{'bwd ours':>9} {'torch':>9} {'speedup':>7}")
    for r in rows:
        print(f"{r['threads']:>7} | {r['flashattn_fwd_ms']:>7.1f}ms {r['torch_fwd_ms']:>7.1f}ms "
              f"{r['fwd_speedup_vs_torch']:>6.2f}x | {r['flashattn_bwd_ms']:>7.1f}ms "
              f"{r['torch_bwd_ms']:>7.1f}ms {r['bwd_speedup_vs_torch']:>6.2f}x")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
