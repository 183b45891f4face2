#!/usr/bin/env python3
"""Where a kernel's spill instructions sit: in its loops or outside them (prologue, epilogue).

    cuobjdump -sass build/x.o | python3 dev/spills_in_loops.py [--kernels bwd_kernel,fwd_kernel]

Reads SASS (cuobjdump -sass) on stdin. A loop is the address range [target, branch] of a
backward branch (BRA to a lower address). For each function it prints its local-memory
instructions (LDL / STL: ptxas's spills, since the kernels keep no arrays in local memory) in
all, those inside any loop, and those inside the hottest loop: the innermost loop that holds
the most MMA instructions (HMMA; on sm90 HGMMA / QGMMA), which in the sm80 kernels is the
per-block step loop; and those in the innermost loop holding any MMA, the per-block loop of the
persistent sm90 kernels (whose tile loop holds the most).
"""
import argparse
import re
import sys

FUNC = re.compile(r"Function : (\S+)")
INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRA = re.compile(r"\bBRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))")


def parse(lines):
    funcs, name, insns = [], None, []
    for line in lines:
        m = FUNC.search(line)
        if m:
            if name:
                funcs.append((name, insns))
            name, insns = m.group(1), []
            continue
        m = INSN.search(line)
        if m and name:
            insns.append((int(m.group(1), 16), m.group(2)))
    if name:
        funcs.append((name, insns))
    return funcs


def report(name, insns):
    loops = []
    for addr, text in insns:
        m = BRA.search(text)
        if m and m.group(1) and int(m.group(1), 16) < addr:
            loops.append((int(m.group(1), 16), addr))
    local = [(a, t.split()[0] if not t.startswith("@") else t.split()[1]) for a, t in insns
             if re.search(r"\b(LDL|STL)(\.\w+)*\b", t)]
    hmma = [a for a, t in insns if re.search(r"\b(HMMA|HGMMA|QGMMA)\.", t)]

    def inside(a, lo_hi):
        return lo_hi[0] <= a <= lo_hi[1]

    in_loops = [x for x in local if any(inside(x[0], l) for l in loops)]
    hot = None
    if loops and hmma:
        # innermost loops first (shortest range), then the one with the most MMAs
        hot = max(loops, key=lambda l: (sum(inside(a, l) for a in hmma), -(l[1] - l[0])))
    in_hot = [x for x in local if hot and inside(x[0], hot)]
    hot_len = sum(inside(a, hot) for a, _ in insns) if hot else 0
    # In a persistent kernel (sm90) the loop with the most MMAs is the tile loop; the key-block
    # loop is the innermost one holding any.
    inner = min((l for l in loops if any(inside(a, l) for a in hmma)), key=lambda l: l[1] - l[0], default=None)
    in_inner = [x for x in local if inner and inside(x[0], inner)]
    return dict(name=name, local=len(local), in_loops=len(in_loops), in_hot=len(in_hot),
                hot_insns=hot_len, hot_hmma=sum(inside(a, hot) for a in hmma) if hot else 0,
                hot_ops=sorted({op for _, op in in_hot}), in_inner=len(in_inner),
                inner_insns=sum(inside(a, inner) for a, _ in insns) if inner else 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", default="", help="comma-separated substrings of the function names to keep")
    args = ap.parse_args()
    keep = [k for k in args.kernels.split(",") if k]
    for name, insns in parse(sys.stdin):
        if keep and not any(k in name for k in keep):
            continue
        r = report(name, insns)
        print(f"{name[:110]}\n  local-memory instructions {r['local']}, in loops {r['in_loops']}, "
              f"in the hottest loop {r['in_hot']} {r['hot_ops']} "
              f"(that loop: {r['hot_insns']} instructions, {r['hot_hmma']} MMA); in the innermost MMA loop "
              f"{r['in_inner']} (that loop: {r['inner_insns']} instructions)")


if __name__ == "__main__":
    main()
