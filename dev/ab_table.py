#!/usr/bin/env python3
"""Prints bench.py JSONs of A/B variants side by side: per row (dtype, d, n, causal; sparse rows
also per density), each variant's flashattn figure, its ratio to the first variant, and each
variant's ratio to a peer measured in the same files (the same process).

    python3 dev/ab_table.py [--figure fwd_tflops] [--peer sdpa_cudnn] base.json x.json ...
    python3 dev/ab_table.py 'base=dir/ab-base-*.json' 'qf=dir/ab-qf-*.json' ...

A NAME=GLOB argument is one variant measured in several passes (one file per pass): its cell is
the mean over the passes, the ratio to the first variant the mean of the per-pass ratios when
both have the same number of passes (pass i against pass i, as alternating runs pair them; else
the ratio of the means), and its ratio to the peer the mean over the passes with the lowest and
highest pass in brackets. A row a variant's files lack shows "-".
"""
import argparse
import glob
import json
import os
import statistics


def rows(path, figure, peer):
    out = {}
    for r in json.load(open(path))["rows"]:
        key = (r.get("dtype"), r.get("d"), r.get("n"), r.get("causal"), r.get("density"))
        ours = r.get("flashattn", {}).get(figure)
        theirs = r.get(peer, {}).get(figure) if isinstance(r.get(peer), dict) else None
        out[key] = (ours, theirs)
    return out


def variant(arg):
    """(name, [pass tables' paths]) of one argument: NAME=GLOB, or one file."""
    if "=" in arg:
        name, pattern = arg.split("=", 1)
        paths = sorted(glob.glob(pattern))
        if not paths:
            raise SystemExit(f"ab_table: no file matches {pattern!r} (variant {name})")
        return name, paths
    return os.path.basename(arg).removesuffix(".json"), [arg]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--figure", default="fwd_tflops")
    ap.add_argument("--peer", default="sdpa_cudnn")
    ap.add_argument("variants", nargs="+", help="a bench.py JSON, or NAME=GLOB of one file per pass")
    a = ap.parse_args()
    names, passes = [], []
    for arg in a.variants:
        name, paths = variant(arg)
        names.append(name)
        passes.append([rows(p, a.figure, a.peer) for p in paths])
    print(f"{a.figure}, mean over passes (count per variant: {', '.join(f'{n} {len(p)}' for n, p in zip(names, passes))}); "
          f"x = ratio to {names[0]}; r = ratio to {a.peer} in the same files [lowest-highest pass]")
    print("dtype d    n      causal dens " + " ".join(f"{n[-30:]:>30}" for n in names))
    keys = set().union(*(t.keys() for p in passes for t in p))
    base_passes = passes[0]
    for key in sorted(keys, key=lambda k: (str(k[0]), k[1] or 0, k[2] or 0, bool(k[3]), k[4] or 0)):
        cells = []
        for i, vp in enumerate(passes):
            got = [t[key] for t in vp if key in t and t[key][0]]
            if not got:
                cells.append(f"{'-':>30}")
                continue
            mean = statistics.mean(o for o, _ in got)
            peer = [o / p for o, p in got if p]
            cell = f"{mean:7.1f}"
            base = [t[key][0] for t in base_passes if key in t and t[key][0]]
            if i > 0 and base:
                if len(base) == len(got):
                    x = statistics.mean(o / b for (o, _), b in zip(got, base))
                else:
                    x = mean / statistics.mean(base)
                cell += f" x{x:5.3f}"
            else:
                cell += " " * 7
            cell += f" r{statistics.mean(peer):5.3f}[{min(peer):4.2f}-{max(peer):4.2f}]" if peer else " " * 18
            cells.append(f"{cell:>30}")
        dens = f"{key[4]:<4}" if key[4] is not None else "-   "
        print(f"{key[0]:<5} {key[1]:<4} {key[2]:<6} {str(key[3]):<6} {dens} " + " ".join(cells))


if __name__ == "__main__":
    main()
