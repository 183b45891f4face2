#!/usr/bin/env python3
"""Decode forward time against the number of key splits (GPU machine; dev/ tool).

For each (batch, seqlen_k) of the decode suite's shape (one query token, 32 query heads over 8 KV
heads, d128, bf16) this times flashattn's forward with num_splits = 0 (the launcher's heuristic)
and with fixed values, eager (CUDA events behind a GPU sleep, like bench.py) and replayed from a
CUDA graph, and prints one line per shape with KV bandwidth in TB/s. It answers whether the
heuristic's choice is the fast one, and whether eager and graph figures differ for our kernels
alone. --merges times each split count under each split-KV merge (cluster: the default on a
Hopper GPU up to 16 splits; counter: the last split CTA, FLASHATTN_SPLIT_COMBINE=counter; kernel:
the combine kernel), switched in-process and alternated over --passes passes. --page-size P times
the paged cache instead (flash_attn_with_kvcache with a shuffled block table of P-row pages).
--tokens T times T causal query tokens per step (speculative decoding; flash_attn_with_kvcache on
the dense cache too), and --switches times each split count under each of the listed
_C._set_switch switches in turn ("none": the default; e.g. no_token_fold, no_decode_fold; keys
suffixed "/SWITCH"). Writes JSON with --out.

    python3 dev/decode_splits.py --shapes 64x4096,8x131072 --splits 0,1,2,3,4,6,8,12 --out $OUT/splits.json
    python3 dev/decode_splits.py --shapes 1x4096 --splits 0,8,16 --merges cluster,counter --passes 2
    python3 dev/decode_splits.py --shapes 1x4096 --tokens 4 --page-size 16 --splits 0,8,16,32 --switches none,no_token_fold
"""
import argparse
import contextlib
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import bench  # noqa: E402  (median_ms, graph_median_ms, environment)


@contextlib.contextmanager
def merge_switches(merge):
    """The split-KV merge for the calls inside (flashattn._C._set_switch; default: no change)."""
    import flashattn
    wanted = {"default": {}, "cluster": {"split_combine_counter": False, "split_combine_kernel": False},
              "counter": {"split_combine_counter": True, "split_combine_kernel": False},
              "kernel": {"split_combine_kernel": True}}[merge]
    saved = {name: flashattn._C._set_switch(name, on) for name, on in wanted.items()}
    try:
        yield
    finally:
        for name, was in saved.items():
            flashattn._C._set_switch(name, was)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="64x4096,8x131072", help="BATCHxSEQLEN_K list")
    ap.add_argument("--splits", default="0,1,2,3,4,6,8,12", help="num_splits values (0 = heuristic)")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--merges", default="default", help="comma list of default, cluster, counter, kernel")
    ap.add_argument("--passes", type=int, default=1, help="passes over the merges (alternated)")
    ap.add_argument("--page-size", type=int, default=0, help="0: dense K/V; P: a paged cache of P-row pages")
    ap.add_argument("--tokens", type=int, default=1, help="query tokens per step (causal when > 1)")
    ap.add_argument("--switches", default="none", help="comma list: none (the default) or _C._set_switch names")
    ap.add_argument("--out")
    args = ap.parse_args()

    import torch
    import flashattn
    from flashattn import _lowlevel

    rows = []
    for shape in args.shapes.split(","):
        b, sk = (int(x) for x in shape.split("x"))
        t = args.tokens
        q = torch.randn(b, t, 32, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, sk, 8, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        out = torch.empty_like(q)
        kv_bytes = 2 * k.numel() * k.element_size()
        row = {"batch": b, "seqlen_k": sk, "tokens": t, "page_size": args.page_size, "by_splits": {}}
        if args.page_size:
            ps = args.page_size
            assert sk % ps == 0, "--page-size must divide each seqlen_k"
            pages = b * sk // ps
            perm = torch.randperm(pages, device="cuda")
            block_table = perm.to(torch.int32).reshape(b, sk // ps)
            kc = torch.empty(pages, ps, 8, 128, device="cuda", dtype=torch.bfloat16)
            vc = torch.empty_like(kc)
            kc[perm] = k.reshape(pages, ps, 8, 128)
            vc[perm] = v.reshape(pages, ps, 8, 128)
            seqlens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
            del k, v
        elif t > 1:
            seqlens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        switches = args.switches.split(",")
        for splits in (int(x) for x in args.splits.split(",")):
            if args.page_size:
                def call():
                    flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=block_table,
                                                      causal=t > 1, num_splits=splits)
            elif t > 1:
                def call():
                    flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, causal=True, num_splits=splits)
            else:
                def call():
                    _lowlevel.forward(q, k, v, out, None, num_splits=splits)
            for p in range(args.passes):
                for merge in args.merges.split(","):
                    for switch in switches:
                        was = None if switch == "none" else flashattn._C._set_switch(switch, True)
                        try:
                            with merge_switches(merge):
                                eager = bench.median_ms(call, args.repeats)
                                graph = bench.graph_median_ms(call, args.repeats)
                        finally:
                            if switch != "none":
                                flashattn._C._set_switch(switch, was)
                        key = (str(splits) if merge == "default" else f"{splits}/{merge}") + (
                            "" if switch == "none" else f"/{switch}")
                        row["by_splits"].setdefault(key, []).append(
                            {"fwd_ms": eager, "fwd_ms_graph": graph, "kv_tb_per_s": kv_bytes / eager / 1e9,
                             "kv_tb_per_s_graph": kv_bytes / graph / 1e9})
        rows.append(row)
        print(f"b{b} sk{sk} t{t}{f' page {args.page_size}' if args.page_size else ''}: " + "  ".join(
            f"s{s} " + ",".join(f"{1e3 * r['fwd_ms']:.1f}/{1e3 * r['fwd_ms_graph']:.1f}" for r in rs)
            for s, rs in row["by_splits"].items()) + "  (us eager/graph per pass; s0 = heuristic)", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"environment": bench.environment(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
