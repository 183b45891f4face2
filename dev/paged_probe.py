"""Where the paged KV cache loses to the dense one (dev probe, not a bench/results run): decode
steps (bf16, d128, 32 query heads over 8 KV heads) on a dense cache, on paged caches of several
page sizes with their pages in order (block_table = arange) and shuffled, timed like bench.py's
device mode (GPU time; CUDA events, median). In-order pages read the same addresses as the
dense cache, so dense -> in-order isolates the kernel's paging work, in-order -> shuffled the
memory system's (DRAM/TLB locality)."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import bench  # noqa: E402
import flashattn  # noqa: E402


def to_pages(x, page, perm):
    """x (b, sk, hk, d) as a pool of b * sk / page pages, sequence i's block j at page
    perm[i * (sk / page) + j]."""
    pool = torch.empty((perm.numel(), page) + tuple(x.shape[2:]), dtype=x.dtype, device=x.device)
    pool[perm] = x.reshape(perm.numel(), page, *x.shape[2:])
    return pool


def write_results(name, rows):
    """$OUT/<name> (when OUT is set): the rows with the run's environment."""
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, name), "w") as f:
            json.dump({"environment": bench.environment(), "rows": rows}, f, indent=1)


def main():
    rows = []
    for b, sk in ((1, 4096), (8, 65536), (64, 16384)):
        q = torch.randn(b, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, sk, 8, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        seqlens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        kv_bytes = 2 * k.numel() * 2
        row = {"batch": b, "seqlen_k": sk}

        def timed(name, kc, vc, table):
            def fn():
                return flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table)
            ms = bench.median_ms(fn, 30)
            row[name] = {"us": round(ms * 1e3, 2), "tb_per_s": round(kv_bytes / ms / 1e9, 3)}

        timed("dense", k, v, None)
        for page in (16, 64, 256):
            pages = b * sk // page
            for order in ("inorder", "shuffled"):
                perm = (torch.arange(pages, device="cuda") if order == "inorder"
                        else torch.randperm(pages, device="cuda"))
                kc, vc = to_pages(k, page, perm), to_pages(v, page, perm)
                timed(f"page{page}_{order}", kc, vc, perm.to(torch.int32).view(b, -1))
                del kc, vc
        print(json.dumps(row), flush=True)
        rows.append(row)
    write_results("paged-probe.json", rows)


if __name__ == "__main__":
    main()
