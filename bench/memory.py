"""Peak GPU memory of one forward + backward vs sequence length: flashattn's O(N) extra memory
against materialised (standard) attention's O(N^2), up to the longest sequence that fits.

    python3 bench/memory.py --out bench/results/h200-$(date +%F)-memory.json

For each implementation and seqlen (doubling from --min-seqlen to --max-seqlen): build q, k, v and
the output gradient, run one forward + backward as warm-up (persistent workspaces, cuDNN plans),
then reset the peak counters and run one more forward + backward. Recorded per point:
  base_bytes        torch.cuda.memory_allocated() just before the measured call (inputs, dO and
                    any workspace an implementation keeps between calls)
  torch_peak_bytes  torch.cuda.max_memory_allocated() during the measured call
  pool_peak_bytes   high-water mark of the device's default cudaMallocAsync pool during the call
                    (driver API, CU_MEMPOOL_ATTR_USED_MEM_HIGH): flashattn takes its split-KV and
                    backward workspaces from there, outside torch's allocator
  peak_bytes        torch_peak + pool_peak: an upper bound of the call's peak (the two peaks
                    may not coincide)
  extra_bytes       peak - base: what the call itself needs (output, saved tensors, gradients,
                    workspaces, and the N x N scores for the math backend)
  inputs_bytes      q, k, v and dO as computed from the shape
Memory the caching allocator holds but has not handed out is not counted. An implementation
stops at its first out-of-memory seqlen (status "oom"); --max-seqlen bounds the O(N) ones,
whose limit lies far beyond (millions of tokens on a 141 GB GPU) and would take minutes per point.

Default shape: batch 1, 16 heads, head dim 128, bf16, not causal; implementations flashattn,
SDPA flash, SDPA cuDNN and SDPA math (the standard attention that stores the N x N scores).
Writes JSON (suite "memory") and, when matplotlib is present, docs/plots/<stem>-memory.png via
bench/plot.py. Device time on an H200: ~1.5 min with the defaults (the longest point of each O(N)
implementation, 128k, takes a few seconds; math runs out of memory between 16k and 64k).
"""
import argparse
import gc
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
IMPLS = ("flashattn", "sdpa_flash", "sdpa_cudnn", "sdpa_math", "sdpa_efficient")
DEFAULT_IMPLS = ("flashattn", "sdpa_flash", "sdpa_cudnn", "sdpa_math")


def seqlens(lo, hi):
    out = []
    n = lo
    while n <= hi:
        out.append(n)
        n *= 2
    return out


class AsyncPool:
    """High-water mark of the device's default cudaMallocAsync pool, through the driver API."""
    USED_MEM_HIGH = 8  # CU_MEMPOOL_ATTR_USED_MEM_HIGH

    def __init__(self, device=0):
        import ctypes
        self.ctypes = ctypes
        self.lib = ctypes.CDLL("libcuda.so.1")
        dev = ctypes.c_int()
        self.pool = ctypes.c_void_p()
        if self.lib.cuDeviceGet(ctypes.byref(dev), device) != 0 or \
                self.lib.cuDeviceGetDefaultMemPool(ctypes.byref(self.pool), dev) != 0:
            raise OSError("cuDeviceGetDefaultMemPool failed")
        self.high()

    def reset(self):
        zero = self.ctypes.c_uint64(0)
        if self.lib.cuMemPoolSetAttribute(self.pool, self.USED_MEM_HIGH, self.ctypes.byref(zero)) != 0:
            raise OSError("cuMemPoolSetAttribute(USED_MEM_HIGH) failed")

    def high(self):
        value = self.ctypes.c_uint64()
        if self.lib.cuMemPoolGetAttribute(self.pool, self.USED_MEM_HIGH, self.ctypes.byref(value)) != 0:
            raise OSError("cuMemPoolGetAttribute(USED_MEM_HIGH) failed")
        return value.value


def measure_point(torch, impl, b, h, n, d, dtype, causal, pool):
    """{"status": "ok", *_bytes} or {"status": "oom"/"error", "error"}."""
    shape = (b, n, h, d) if impl.layout == "bshd" else (b, h, n, d)
    gc.collect()
    torch.cuda.empty_cache()
    tensors = None
    try:
        q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
        dout = torch.randn(shape, device="cuda", dtype=dtype)
        tensors = (q, k, v, dout)

        def step():
            torch.autograd.grad(impl.fn(q, k, v, causal), (q, k, v), dout)

        step()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        if pool:
            pool.reset()
        step()
        torch.cuda.synchronize()
        torch_peak = torch.cuda.max_memory_allocated()
        pool_peak = pool.high() if pool else 0
        peak = torch_peak + pool_peak
        return {"status": "ok", "base_bytes": base, "torch_peak_bytes": torch_peak, "pool_peak_bytes": pool_peak,
                "peak_bytes": peak, "extra_bytes": peak - base}
    except torch.cuda.OutOfMemoryError as e:
        return {"status": "oom", "error": str(e).strip().splitlines()[0][:200]}
    except (RuntimeError, ValueError, NotImplementedError) as e:
        return {"status": "error", "error": str(e).strip().splitlines()[0][:200]}
    finally:
        del tensors
        gc.collect()
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--impls", default=",".join(DEFAULT_IMPLS),
                    help="comma-separated, from %s (default %s)" % (",".join(IMPLS), ",".join(DEFAULT_IMPLS)))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--min-seqlen", type=int, default=1024)
    ap.add_argument("--max-seqlen", type=int, default=131072, help="longest seqlen tried (default 131072)")
    ap.add_argument("--plot-dir", default="docs/plots", help="where the PNG goes (default docs/plots); '' = none")
    args = ap.parse_args()
    names = [x for x in args.impls.split(",") if x]
    if set(names) - set(IMPLS):
        ap.error(f"unknown --impls; choose from {','.join(IMPLS)}")

    import torch
    sys.path.insert(0, HERE)
    import bench

    if not torch.cuda.is_available():
        sys.exit("memory.py needs a CUDA GPU")
    impls, unavailable = bench.attention_impls(names, math_max_seqlen=1 << 30)  # memory.py finds the limit
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    b, h, d = args.batch, args.heads, args.head_dim
    torch.cuda.init()
    pool, pool_note = None, None
    if torch.cuda.get_allocator_backend() == "cudaMallocAsync":
        pool_note = "torch itself allocates from the cudaMallocAsync pool here: pool figures not added"
    else:
        try:
            pool = AsyncPool(torch.cuda.current_device())
        except (OSError, AttributeError) as e:
            pool_note = f"cudaMallocAsync pool not measured: {e}"
    if pool_note:
        print(pool_note)
    rows = []
    for name in names:
        if name not in impls:
            rows.append({"impl": name, "n": None, "status": "error", "error": unavailable.get(name, "not available")})
            continue
        for n in seqlens(args.min_seqlen, args.max_seqlen):
            r = measure_point(torch, impls[name], b, h, n, d, dtype, args.causal, pool)
            row = {"impl": name, "n": n, "inputs_bytes": 4 * b * h * n * d * dtype.itemsize, **r}
            rows.append(row)
            if r["status"] == "ok":
                print(f"{name} N={n}: peak {r['peak_bytes'] / 2**30:.2f} GiB, extra {r['extra_bytes'] / 2**30:.3f} GiB",
                      flush=True)
            else:
                print(f"{name} N={n}: {r['status']}: {r['error']}", flush=True)
                break  # longer sequences need more
    total = torch.cuda.get_device_properties(0).total_memory
    result = {
        "suite": "memory",
        "environment": bench.environment(),
        "config": {"batch": b, "heads": h, "d": d, "dtype": args.dtype, "causal": args.causal,
                   "min_seqlen": args.min_seqlen, "max_seqlen": args.max_seqlen, "gpu_memory_bytes": total},
        "method": "second of two forward + backward calls: peak = torch.cuda.max_memory_allocated() + the "
                  "default cudaMallocAsync pool's used-memory high-water mark (upper bound); "
                  "extra = peak - memory_allocated() before the call",
        "note": pool_note,
        "rows": rows,
    }
    bench.write_json(args.out, result)
    print(f"wrote {args.out}")
    if args.plot_dir:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("matplotlib not installed: no plot (python3 bench/plot.py FILE renders it later)")
            return
        import plot
        plot.render([args.out], args.plot_dir)


if __name__ == "__main__":
    main()
