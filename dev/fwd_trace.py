#!/usr/bin/env python3
"""Where a short-rows Hopper forward's time goes, tile by tile (GPU machine; dev/ probe).

Needs a package built with -DFLASHATTN_DEV_FWD_TRACE (sm90/fwd_kernel.h: thread 0 of each
consumer warpgroup of the plain key-block loop stamps clock64 per tile; a print kernel launched
after the forward prints them when FLASHATTN_DEV_FWD_TRACE_PRINT is set). Runs flash_attn_func
at each shape a few times, then one traced call, and prints per shape, in SM clock cycles
(clock64 is per SM: only stamps of one SM compare), medians over the tiles of each key-block
count nb:
  q       tile begun (its work was fetched under the previous tile's last P V) -> its Q landed
  s0, p0  -> the first block's S done, its P ready (the first softmax runs under no P V)
  blk     per later block: previous P ready -> this S done (turn, products, S's latency) and
          S done -> P ready (the softmax under the previous P V)
  pv, st  the last P V done (with the next tile's fetch), O stored (the epilogue)
  gap     O stored -> the next tile begun by the same warpgroup
and, per SM, how much of each warpgroup's softmax time another warpgroup of that SM (the other
consumer, or the other CTA's) spends in a softmax too: near 0 they alternate, near 1 they align.

    python3 dev/fwd_trace.py --shapes 4x32x1024x64:causal,8x16x512x128,8x16x1024x128
"""
import argparse
import collections
import os
import re
import statistics

from trace_children import run_children

LINE = re.compile(r"fwd_trace sm (\d+) cta (\d+) wg (\d+) k (\d+) tile (-?\d+) nb (\d+) t0 (\d+) q (-?\d+) s0 (-?\d+) "
                  r"p0 (-?\d+) b ((?:-?\d+ ){14})pv (-?\d+) st (-?\d+)")


def child(shape):
    import torch
    import flashattn
    dims, _, mask = shape.partition(":")
    b, h, n, d = (int(x) for x in dims.split("x"))
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    causal = mask == "causal"
    for _ in range(3):
        flashattn.flash_attn_func(q, k, v, causal=causal)
    torch.cuda.synchronize()
    print("=== traced", flush=True)
    os.environ["FLASHATTN_DEV_FWD_TRACE_PRINT"] = "1"
    torch.cuda._sleep(1_000_000)
    flashattn.flash_attn_func(q, k, v, causal=causal)
    torch.cuda.synchronize()
    del os.environ["FLASHATTN_DEV_FWD_TRACE_PRINT"]
    print("=== end", flush=True)


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def summarize(text, label):
    traced = text.split("=== traced", 1)[-1].split("=== end", 1)[0]
    rows = []
    for m in LINE.finditer(traced):
        g = m.groups()
        blocks = [int(x) for x in g[10].split()]
        rows.append(dict(sm=int(g[0]), cta=int(g[1]), wg=int(g[2]), k=int(g[3]), nb=int(g[5]), t0=int(g[6]),
                         q=int(g[7]), s0=int(g[8]), p0=int(g[9]), S=blocks[0::2], P=blocks[1::2], pv=int(g[11]),
                         st=int(g[12])))
    if not rows:
        print(f"{label}: no trace lines (built without FLASHATTN_DEV_FWD_TRACE?)")
        return
    lanes = collections.defaultdict(list)  # (cta, wg) -> its tiles in order
    for r in rows:
        lanes[(r["cta"], r["wg"])].append(r)
    for tiles in lanes.values():
        tiles.sort(key=lambda r: r["k"])
        for a, b in zip(tiles, tiles[1:]):
            a["gap"] = b["t0"] - (a["t0"] + a["st"])
    print(f"{label}: {len(rows)} tiles on {len({r['sm'] for r in rows})} SMs, {len(lanes)} warpgroups "
          f"(cycles, medians)")
    for nb in sorted({r["nb"] for r in rows}):
        sel = [r for r in rows if r["nb"] == nb and min(r["q"], r["s0"], r["p0"], r["pv"], r["st"]) >= 0]
        if not sel:
            continue
        s_wait, soft = [], []
        for r in sel:
            prev = r["p0"]
            for s, p in zip(r["S"], r["P"]):
                if s < 0 or p < 0:
                    break
                s_wait.append(s - prev)
                soft.append(p - s)
                prev = p
        last_p = [max([r["p0"]] + [p for p in r["P"] if p >= 0]) for r in sel]
        print(f"  nb {nb} ({len(sel)} tiles): q {median([r['q'] for r in sel]):.0f}"
              f"  s0 {median([r['s0'] - r['q'] for r in sel]):.0f}  p0 {median([r['p0'] - r['s0'] for r in sel]):.0f}"
              f"  blk {median(s_wait):.0f} + {median(soft):.0f}"
              f"  pv {median([r['pv'] - lp for r, lp in zip(sel, last_p)]):.0f}"
              f"  st {median([r['st'] - r['pv'] for r in sel]):.0f}"
              f"  gap {median([r['gap'] for r in sel if 'gap' in r]):.0f}  tile {median([r['st'] for r in sel]):.0f}")
    # Softmax intervals per warpgroup in SM clock, then the share of each one's softmax time that
    # another warpgroup of the same SM also spends in a softmax.
    by_sm = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in rows:
        ivs = by_sm[r["sm"]][(r["cta"], r["wg"])]
        if r["s0"] >= 0 and r["p0"] >= 0:
            ivs.append((r["t0"] + r["s0"], r["t0"] + r["p0"]))
        for s, p in zip(r["S"], r["P"]):
            if s >= 0 and p >= 0:
                ivs.append((r["t0"] + s, r["t0"] + p))
    shares = []
    for lanes_of_sm in by_sm.values():
        if len(lanes_of_sm) < 2:
            continue
        for lane, ivs in lanes_of_sm.items():
            others = []  # the union of the other warpgroups' softmax intervals
            for c, d in sorted(iv for other, o in lanes_of_sm.items() if other != lane for iv in o):
                if others and c <= others[-1][1]:
                    others[-1] = (others[-1][0], max(others[-1][1], d))
                else:
                    others.append((c, d))
            total = sum(b - a for a, b in ivs)
            both = 0
            for a, b in ivs:
                for c, d in others:
                    if c >= b:
                        break
                    both += max(0, min(b, d) - max(a, c))
            if total > 0:
                shares.append(both / total)
    if shares:
        print(f"  softmax time shared with another warpgroup of the SM: median {median(shares):.2f}, "
              f"quartiles {statistics.quantiles(shares, n=4)[0]:.2f}-{statistics.quantiles(shares, n=4)[2]:.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="4x32x1024x64:causal,8x16x512x128,8x16x1024x128",
                    help="BxHxNxD[:causal] list (bf16, seqlen_q = seqlen_k = N)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    run_children(__file__, args.shapes.split(","), summarize, lambda shape: shape)


if __name__ == "__main__":
    main()
