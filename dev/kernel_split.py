"""Per-kernel device time of one backward (or forward) call, ours and the peers, in one process.

Answers "where does a short-row backward go": the main kernel against the passes over all rows
(preprocess, dQ accumulator zeroing, dQ conversion), for each peer. torch.profiler (CUPTI)
records every kernel and memset of `--calls` timed calls; the table gives microseconds per call.

  python3 dev/kernel_split.py --shapes 128:1024,128:512:c --impls flashattn,sdpa_cudnn --out x.json

A shape is d:seqlen[:c] (c = causal); batch = 16k / seqlen, heads = 2048 / d (bench.py's suite);
d/dv:seqlen[:c] gives v and out head_dim_v dv with 16 heads (the dsv3 suite, e.g. 192/128:8192:c).
With --block-density x the peers are the sparse suite's (flashattn, flex) on bench.py's random
block mask of that density (block --block-size, 16 heads, batch 16k / seqlen; no causal).
With --mla the shapes are batch:seqlen_k:heads and the peers bench.py's mla entries (e.g.
--impls flashattn_latent,flashattn_latent_paged64): one decode call each.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))


def kernel_times(step, calls):
    """[(us per call, launches per call, kernel name)] of `calls` calls of step, longest first."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    kernels = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            t = getattr(ev, "device_time_total", None)
            if t is None:
                t = ev.cuda_time_total
            kernels.setdefault(ev.name, [0.0, 0])
            kernels[ev.name][0] += t
            kernels[ev.name][1] += 1
    return sorted(((us / calls, cnt / calls, nm) for nm, (us, cnt) in kernels.items()), reverse=True)


def report(title, rows):
    total = sum(r[0] for r in rows)
    print(f"\n{title}: {total:.1f} us per call")
    for us, cnt, nm in rows:
        print(f"  {us:9.1f} us  x{cnt:.0f}  {nm[:110]}")
    return total


def mla(args):
    """--mla: each entry's kernels for one decode call per shape b:sk:h."""
    import torch
    import bench
    entries = bench.mla_entries()
    results = []
    for spec in args.shapes.split(","):
        b, sk, h = (int(x) for x in spec.split(":"))
        q = torch.randn(b, 1, h, bench.MLA_D, device="cuda", dtype=torch.bfloat16)
        k_cache = torch.randn(b, sk, 1, bench.MLA_D, device="cuda", dtype=torch.bfloat16)
        for name in args.impls.split(","):
            fn = entries[name][0]
            with torch.no_grad():
                rows = kernel_times(lambda: fn(q, k_cache), args.calls)
            total = report(f"{name} b{b} sk{sk} h{h}", rows)
            results.append({"impl": name, "batch": b, "seqlen_k": sk, "heads": h, "total_us": total,
                            "kernels": [{"us": us, "per_call": cnt, "name": nm} for us, cnt, nm in rows]})
        del q, k_cache
        torch.cuda.empty_cache()
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="128:1024")
    ap.add_argument("--impls", default="flashattn,sdpa_cudnn")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--forward", action="store_true", help="profile the forward instead of the backward")
    ap.add_argument("--block-density", type=float, default=None,
                    help="profile the sparse suite's peers (flashattn, flex) on a random block mask")
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--mla", action="store_true", help="shapes b:sk:h, peers bench.py's mla entries")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch
    import bench

    if args.mla:
        results = mla(args)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"environment": bench.environment(), "calls": args.calls, "results": results}, f, indent=1)
        return
    sparse = args.block_density is not None
    if not sparse:
        impls, unavailable = bench.attention_impls(args.impls.split(","))
        for name, why in unavailable.items():
            print(f"{name}: {why}")
    results = []
    for spec in args.shapes.split(","):
        parts = spec.split(":")
        dims = [int(x) for x in parts[0].split("/")]
        d, dv = dims[0], dims[-1]
        n, causal = int(parts[1]), len(parts) > 2 and parts[2] == "c"
        b, h = max(1, 16384 // n), (2048 // d if dv == d else 16)
        if sparse:
            if causal or dv != d:
                raise SystemExit(f"--block-density: shape {spec}: no causal or head_dim_v rows")
            b, h = bench.sparse_shape(n, d)
            blocks = -(-n // args.block_size)
            mask = bench.random_block_mask(b, h, blocks, args.block_density)
            impls, unavailable = bench.sparse_impls(args.impls.split(","), mask, args.block_size)
            for name, why in unavailable.items():
                print(f"{name}: {why}")
        for name, impl in impls.items():
            shape = (b, n, h, d) if impl.layout == "bshd" else (b, h, n, d)
            shape_v = shape[:-1] + (dv,)
            q, k, v = (torch.randn(s, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for s in (shape, shape, shape_v))
            if args.forward:
                def step():
                    with torch.no_grad():
                        impl.fn(q, k, v, causal)
            else:
                out = impl.fn(q, k, v, causal)
                grad = torch.randn_like(out)

                def step():
                    torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
            rows = kernel_times(step, args.calls)
            total = report(f"{name} d{d}{'/' + str(dv) if dv != d else ''} n{n}{' causal' if causal else ''} b{b} h{h}",
                           rows)
            results.append({"impl": name, "d": d, "dv": dv, "n": n, "causal": causal, "batch": b, "heads": h,
                            "direction": "fwd" if args.forward else "bwd", "total_us": total,
                            "block_density": args.block_density,
                            "kernels": [{"us": us, "per_call": cnt, "name": nm} for us, cnt, nm in rows]})
            del q, k, v
            torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"environment": bench.environment(), "calls": args.calls, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
