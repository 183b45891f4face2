#!/usr/bin/env python3
"""Where a batch-1 decode step's time goes, per split CTA (GPU machine; dev/ probe).

Needs a package built with -DFLASHATTN_DEV_DECODE_TRACE (sm80/fwd_kernel.h: thread 0 of each
split-key CTA prints its entry / exit %globaltimer and clock64 stamps of its phases). Runs the
decode shape (one query token, 32 query heads over 8 KV heads, d128, bf16) at batch 1 for each
(seqlen_k, num_splits), a few warm-up calls, then one traced call alone, and prints per call:
the CTAs' entry spread, and the medians / maxima of the phases in microseconds (clock64 at the
clock each CTA measured between its two globaltimer stamps):
  k1     entry -> the first K tile landed (the first DRAM round trip under load)
  loop   entry -> the key loop done (every K/V tile of the split consumed)
  store  entry -> the split's partials stored and fenced
  end    entry -> counted in (or, for the group's last CTA, the merge done); with the merge
                  within a thread-block cluster (sm90, small dense grids) every CTA merges rows:
                  past the cluster's second barrier, and "store" is the partial written to
                  shared memory
  merged entry -> thread 0 past the warps' merge (within store; its barriers also wait for the
                  other warps' last P V and their parts reaching shared memory)
  issued entry -> the partials' stores issued, before the fence (within store)
and the kernel's span (first entry to last exit, globaltimer).

    python3 dev/decode_trace.py --shapes 4096:0,4096:16,4096:32,16384:0
    python3 dev/decode_trace.py --shapes 4096:0:func,4096:0:kvcache,4096:0:paged16
"""
import argparse
import re
import statistics

from trace_children import run_children

LINE = re.compile(r"decode_trace cta (\d+) split (\d+) last (\d+) ns0 (\d+) ns1 (\d+) clk (-?\d+) (-?\d+) (-?\d+) (-?\d+)"
                  r"(?: sub (-?\d+) (-?\d+))?")


def child(seqlen_k, splits, mode="func"):
    import torch
    import flashattn
    from flashattn import _lowlevel

    q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, seqlen_k, 8, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out = torch.empty_like(q)
    seqlens = torch.full((1,), seqlen_k, dtype=torch.int32, device="cuda")
    if mode == "func":
        def call():
            _lowlevel.forward(q, k, v, out, None, num_splits=splits)
    elif mode in ("kvcache", "paged16"):
        kc, vc, table = k, v, None
        if mode == "paged16":  # 16-row pages in a shuffled order, as bench.py's kvcache_paged16
            pages = seqlen_k // 16
            perm = torch.randperm(pages, device="cuda")
            kc = torch.empty((pages, 16, 8, 128), dtype=k.dtype, device="cuda")
            vc = torch.empty_like(kc)
            kc[perm] = k.reshape(pages, 16, 8, 128)
            vc[perm] = v.reshape(pages, 16, 8, 128)
            table = perm.to(torch.int32).view(1, pages)
        def call():
            flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table, num_splits=splits)
    else:
        raise SystemExit(f"unknown mode {mode} (func, kvcache, paged16)")
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    print("=== traced", flush=True)
    torch.cuda._sleep(1_000_000)  # the traced call starts on an idle GPU, as a decode step does
    call()
    torch.cuda.synchronize()
    print("=== end", flush=True)


def summarize(text, label):
    traced = text.split("=== traced", 1)[-1].split("=== end", 1)[0]
    rows = [tuple(int(x or 0) for x in m.groups()) for m in LINE.finditer(traced)]
    if not rows:
        print(f"{label}: no trace lines (built without FLASHATTN_DEV_DECODE_TRACE?)")
        return
    ns0 = [r[3] for r in rows]
    ns1 = [r[4] for r in rows]
    # Each CTA's clock rate from its own span (globaltimer ns against clock64 cycles).
    ghz = [r[8] / (r[4] - r[3]) for r in rows if r[4] > r[3] and r[8] > 0]
    rate = statistics.median(ghz) if ghz else 1.9
    def us(c):
        return c / rate / 1e3
    phases = {name: [us(r[5 + i]) for r in rows] for i, name in enumerate(("k1", "loop", "store", "end"))}
    if any(r[9] for r in rows):  # the store phase's stamps: parts merged, partials' stores issued
        phases["merged"] = [us(r[9]) for r in rows]
        phases["issued"] = [us(r[10]) for r in rows]
    last = [r for r in rows if r[2]]
    merge = [us(r[8] - r[7]) for r in last]
    print(f"{label}: {len(rows)} CTAs, clock {rate:.2f} GHz, span {(max(ns1) - min(ns0)) / 1e3:.2f} us, "
          f"entries within {(max(ns0) - min(ns0)) / 1e3:.2f} us, exits within {(max(ns1) - min(ns1)) / 1e3:.2f} us")
    for name, vals in phases.items():
        print(f"  {name:6s} median {statistics.median(vals):6.2f} us  max {max(vals):6.2f} us")
    if merge:
        print(f"  merge (last CTA of each group, {len(merge)}): median {statistics.median(merge):.2f} us, max {max(merge):.2f} us")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="4096:0,4096:16,4096:32,16384:0",
                    help="SEQLEN_K:NUM_SPLITS[:MODE] list (0 = heuristic; MODE func (default), kvcache: "
                         "flash_attn_with_kvcache on a dense cache, paged16: on 16-row pages, shuffled)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        parts = args.child.split(":")
        child(int(parts[0]), int(parts[1]), parts[2] if len(parts) > 2 else "func")
        return
    run_children(__file__, args.shapes.split(","), summarize,
                 lambda shape: f"1 x {shape.split(':')[0]} keys, num_splits {shape.split(':')[1]}"
                               + (f", {shape.split(':')[2]}" if shape.count(":") > 1 else ""))

if __name__ == "__main__":
    main()
