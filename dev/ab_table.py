#!/usr/bin/env python3
"""Prints bench.py JSONs of A/B variants side by side: per row (dtype, d, n, causal; sparse rows
also per density), each variant's flashattn TFLOP/s for one figure, its ratio to the first
variant, and the first variant's ratio to a peer measured in the same files (the first file's peer).

    python3 dev/ab_table.py [--figure fwd_tflops] [--peer sdpa_cudnn] base.json x.json ...
"""
import argparse
import json
import os


def rows(path, figure, peer):
    out = {}
    for r in json.load(open(path))["rows"]:
        key = (r.get("dtype"), r.get("d"), r.get("n"), r.get("causal"), r.get("density"))
        ours = r.get("flashattn", {}).get(figure)
        theirs = r.get(peer, {}).get(figure) if isinstance(r.get(peer), dict) else None
        out[key] = (ours, theirs)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--figure", default="fwd_tflops")
    ap.add_argument("--peer", default="sdpa_cudnn")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    tables = [rows(f, a.figure, a.peer) for f in a.files]
    names = [os.path.basename(f).removesuffix(".json") for f in a.files]
    print(f"{a.figure}; ratios to {names[0]}; last column {names[0]} / {a.peer}")
    print("dtype d    n      causal dens " + " ".join(f"{n[-12:]:>12}" for n in names) + "   base/peer")
    for key in sorted(tables[0], key=lambda k: (str(k[0]), k[1] or 0, k[2] or 0, bool(k[3]), k[4] or 0)):
        base, peer = tables[0][key]
        if base is None:
            continue
        cells = [f"{base:12.1f}"]
        for t in tables[1:]:
            v = t.get(key, (None, None))[0]
            cells.append(f"{v:6.1f} {v / base:5.3f}" if v else f"{'-':>12}")
        ratio = f"{base / peer:9.3f}" if peer else f"{'-':>9}"
        dens = f"{key[4]:<4}" if key[4] is not None else "-   "
        print(f"{key[0]:<5} {key[1]:<4} {key[2]:<6} {str(key[3]):<6} {dens} " + " ".join(cells) + "   " + ratio)


if __name__ == "__main__":
    main()
