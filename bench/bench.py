"""Benchmarks flashattn against PyTorch SDPA (cuDNN and flash backends) in one process.

    python3 bench/bench.py --suite quick --out bench/results/h200-quick.json

Suites: quick (a few rows for gpu-check), full (the issue's matrix: bf16/fp16, head dims
64/128/256, seqlen 512..16k with batch = 16k/seqlen and 2048/head_dim heads, causal or not,
forward and backward), decode (one query token, 32 query heads over 8 KV heads, d128).
FLOPs: forward 4*B*H*Nq*Nk*d (halved for causal when Nq == Nk); backward 2.5x forward.
Times: CUDA events, median of --repeats after warm-up, on random inputs.
"""
import argparse
import datetime
import json
import platform
import socket
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn


def median_ms(fn, repeats, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def attention_impls():
    """name -> (layout, function(q, k, v, causal) -> out). Layout bshd = flash_attn's, bhsd = SDPA's."""
    impls = {"flashattn": ("bshd", lambda q, k, v, causal: flashattn.flash_attn_func(q, k, v, causal=causal))}
    for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
        def run(q, k, v, causal, backend=backend):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
        impls[name] = ("bhsd", run)
    return impls


def bench_row(impl, layout, b, h, hk, sq, sk, d, causal, dtype, backward, repeats):
    shape_q = (b, sq, h, d) if layout == "bshd" else (b, h, sq, d)
    shape_k = (b, sk, hk, d) if layout == "bshd" else (b, hk, sk, d)
    q = torch.randn(shape_q, device="cuda", dtype=dtype, requires_grad=backward)
    k = torch.randn(shape_k, device="cuda", dtype=dtype, requires_grad=backward)
    v = torch.randn(shape_k, device="cuda", dtype=dtype, requires_grad=backward)
    result = {}
    with torch.no_grad():
        result["fwd_ms"] = median_ms(lambda: impl(q, k, v, causal), repeats)
    if backward:
        out = impl(q, k, v, causal)
        grad = torch.randn_like(out)
        result["bwd_ms"] = median_ms(lambda: torch.autograd.backward(out, grad, retain_graph=True), repeats)
    return result


def flops(b, h, sq, sk, d, causal):
    f = 4.0 * b * h * sq * sk * d
    return f / 2 if causal and sq == sk else f


def suite_rows(suite):
    if suite == "quick":
        for d, n, causal in ((128, 2048, False), (128, 16384, False), (128, 16384, True), (64, 16384, False), (256, 16384, False)):
            yield dict(dtype="bf16", d=d, n=n, causal=causal)
    elif suite == "full":
        for dtype in ("bf16", "fp16"):
            for d in (64, 128, 256):
                for n in (512, 1024, 2048, 4096, 8192, 16384):
                    for causal in (False, True):
                        yield dict(dtype=dtype, d=d, n=n, causal=causal)


def run_attention_suite(suite, repeats, backward):
    impls = attention_impls()
    rows = []
    for cfg in suite_rows(suite):
        d, n = cfg["d"], cfg["n"]
        b, h = 16384 // n, 2048 // d
        dtype = torch.bfloat16 if cfg["dtype"] == "bf16" else torch.float16
        row = dict(cfg, batch=b, heads=h)
        fl = flops(b, h, n, n, d, cfg["causal"])
        for name, (layout, fn) in impls.items():
            try:
                r = bench_row(fn, layout, b, h, h, n, n, d, cfg["causal"], dtype, backward, repeats)
            except (RuntimeError, ValueError) as e:  # a peer without this configuration
                row[name] = {"error": str(e).splitlines()[0][:200]}
                continue
            r["fwd_tflops"] = fl / r["fwd_ms"] / 1e9
            if "bwd_ms" in r:
                r["bwd_tflops"] = 2.5 * fl / r["bwd_ms"] / 1e9
            row[name] = r
        rows.append(row)
        print(format_row(row), flush=True)
    return rows


def run_decode_suite(repeats):
    impls = attention_impls()
    rows = []
    for b, sk in ((1, 4096), (8, 65536), (8, 131072), (64, 4096), (64, 16384)):
        row = dict(kind="decode", batch=b, seqlen_k=sk, heads=32, heads_k=8, d=128, dtype="bf16")
        kv_bytes = 2 * b * sk * 8 * 128 * 2
        for name, (layout, fn) in impls.items():
            try:
                r = bench_row(fn, layout, b, 32, 8, 1, sk, 128, False, torch.bfloat16, False, repeats)
            except (RuntimeError, ValueError) as e:
                row[name] = {"error": str(e).splitlines()[0][:200]}
                continue
            r["kv_tb_per_s"] = kv_bytes / r["fwd_ms"] / 1e9
            row[name] = r
        rows.append(row)
        print("decode b%d sk%d: " % (b, sk) + "  ".join(
            f"{k} {v['fwd_ms'] * 1e3:.1f}us {v['kv_tb_per_s']:.2f}TB/s" for k, v in row.items()
            if isinstance(v, dict) and "fwd_ms" in v), flush=True)
    return rows


def format_row(row):
    parts = [f"{row['dtype']} d{row['d']} n{row['n']} {'causal' if row['causal'] else 'full  '}"]
    for name in ("flashattn", "sdpa_flash", "sdpa_cudnn"):
        r = row.get(name, {})
        if "fwd_tflops" in r:
            parts.append(f"{name} {r['fwd_tflops']:.0f}/{r.get('bwd_tflops', float('nan')):.0f}")
    ours, fa2 = row.get("flashattn", {}), row.get("sdpa_flash", {})
    if "fwd_tflops" in ours and "fwd_tflops" in fa2:
        parts.append(f"vs FA2 fwd {ours['fwd_tflops'] / fa2['fwd_tflops']:.2f}x")
        if "bwd_tflops" in ours and "bwd_tflops" in fa2:
            parts.append(f"bwd {ours['bwd_tflops'] / fa2['bwd_tflops']:.2f}x")
    return "  ".join(parts)


def environment():
    props = torch.cuda.get_device_properties(0)
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "gpu": props.name,
        "sms": props.multi_processor_count,
        "cuda_runtime": torch.version.cuda,
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "flashattn": flashattn.__version__,
        "python": platform.python_version(),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", choices=("quick", "full", "decode"), default="quick")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--out", help="JSON file to write")
    args = ap.parse_args()
    if not torch.cuda.is_available() or not flashattn.cuda_available():
        sys.exit("bench.py needs a CUDA GPU and a flashattn build with the CUDA backend")
    env = environment()
    if args.suite == "decode":
        rows = run_decode_suite(args.repeats)
    else:
        rows = run_attention_suite(args.suite, args.repeats, not args.no_backward)
    result = {"suite": args.suite, "environment": env, "repeats": args.repeats,
              "flops": "fwd 4*B*H*Nq*Nk*d (causal /2), bwd 2.5x fwd; TFLOP/s", "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
