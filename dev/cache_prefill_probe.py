"""The sm90 cache kernel against the sm80 cache kernels (dev probe for the GPU machine, not a
bench/results run): prefill chunks through flash_attn_with_kvcache on a paged cache (bf16, d128,
32 query heads over 8 KV heads, causal, pages shuffled), with detail::Switch::kSm90Cache off and
on in one process, and the same attention on dense keys through flash_attn_func (the sm90 forward
on packed K/V: what the cache kernel should approach) and, where the chunk is the whole sequence,
SDPA's cuDNN backend. Each cache run is first checked against the dense one (max |diff|). Then
four mixed varlen batches (prefill chunks among decoding sequences) under the sm90_cache and
decode_share switches.
Timed like bench.py's device mode (CUDA events, median). Prints one JSON row per shape and writes
$OUT/cache-prefill-probe.json when OUT is set.

    PYTHONPATH=<package> python3 dev/cache_prefill_probe.py [--pages 16,64] [--repeats 20]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import bench  # noqa: E402
import flashattn  # noqa: E402
from kernel_split import kernel_times  # noqa: E402
from paged_probe import to_pages, write_results  # noqa: E402

HEADS, HEADS_K, D = 32, 8, 128


def causal_pairs(sq, sk):
    """(query, key) pairs a bottom-right causal mask keeps, sq <= sk."""
    return sq * sk - sq * (sq - 1) // 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", default="16,64")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--mixed-only", action="store_true", help="only the mixed varlen batches")
    args = ap.parse_args()
    pages = [int(p) for p in args.pages.split(",")]
    # (batch, chunk = seqlen_q, keys before the chunk): a fresh prompt and chunks on a long context.
    shapes = [] if args.mixed_only else [(8, 1024, 0), (2, 4096, 0), (4, 2048, 6144), (1, 4096, 28672)]
    rows = []
    for b, sq, prefix in shapes:
        sk = prefix + sq
        q = torch.randn(b, sq, HEADS, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, sk, HEADS_K, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        seqlens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        tflop = 4.0 * b * HEADS * causal_pairs(sq, sk) * D / 1e12
        row = {"batch": b, "seqlen_q": sq, "seqlen_k": sk}
        dense = flashattn.flash_attn_func(q, k, v, causal=True)

        def rate(name, fn):
            ms = bench.median_ms(fn, args.repeats)
            row[name] = {"ms": round(ms, 4), "tflops": round(tflop / ms * 1e3, 1)}

        rate("packed_sm90", lambda: flashattn.flash_attn_func(q, k, v, causal=True))
        if prefix == 0:
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            kt, vt = (x.repeat_interleave(HEADS // HEADS_K, dim=1) for x in (kt, vt))
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                rate("sdpa_cudnn", lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True))
        for page in pages:
            perm = torch.randperm(b * sk // page, device="cuda")
            kc, vc = to_pages(k, page, perm), to_pages(v, page, perm)
            table = perm.to(torch.int32).view(b, -1)
            for sm90 in (False, True):
                was = flashattn._C._set_switch("sm90_cache", sm90)
                try:
                    calls = flashattn._C._sm90_forward_calls()

                    def fn():
                        return flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table,
                                                                 causal=True)
                    out = fn()
                    torch.cuda.synchronize()
                    name = f"page{page}_{'sm90' if sm90 else 'sm80'}"
                    row[name + "_ran_sm90"] = flashattn._C._sm90_forward_calls() > calls
                    row[name + "_max_diff"] = float((out.float() - dense.float()).abs().max())
                    rate(name, fn)
                finally:
                    flashattn._C._set_switch("sm90_cache", was)
            del kc, vc
        print(json.dumps(row), flush=True)
        rows.append(row)
    # Varlen batches through flash_attn_varlen_func(block_table=...) (vLLM's chunked prefill):
    # four 1k chunks among 16 decoding sequences, one 2k chunk among 64 and among 200, a 100-row
    # chunk among 32 decodes and 32 speculative steps of 4 tokens. Each under the four settings
    # of two switches: sm90_cache (the chunks on the sm90 cache kernel or the sm80 cache
    # kernels) and decode_share (the decodes in the chunks' launch, the default, or in a launch
    # of their own on the decode tiles, GQA folded: cuda_backend.cu run_kvcache decode_share,
    # s41, not yet run); s41's first run (H100) had 64 decodes cost 1.55 ms on 128-row tiles
    # beside the 2k chunk's 0.2 ms.
    for chunks, decodes in ((4, 16), (1, 64), (1, 200), (100, 64)):
        if chunks == 100:  # one 100-row chunk, 32 one-token decodes, 32 four-token steps
            sq = [100] + [1] * (decodes // 2) + [4] * (decodes // 2)
            label = "1 x 100 chunk + 32 decode + 32 x 4-token"
        else:
            sq = [1024 if chunks == 4 else 2048] * chunks + [1] * decodes
            label = f"{chunks} x {sq[0]} chunk + {decodes} decode"
        sk = [4096] * len(sq)
        page = 16
        blocks = [n // page for n in sk]
        perm = torch.randperm(sum(blocks), device="cuda")
        table = perm.to(torch.int32).view(len(sq), -1)
        kc = torch.randn(sum(blocks), page, HEADS_K, D, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        cu_q = torch.tensor([0] + sq, device="cuda").cumsum(0).to(torch.int32)
        cu_k = torch.tensor([0] + sk, device="cuda").cumsum(0).to(torch.int32)
        q = torch.randn(int(cu_q[-1]), HEADS, D, device="cuda", dtype=torch.bfloat16)
        tflop = 4.0 * HEADS * D * sum(causal_pairs(a, b) for a, b in zip(sq, sk)) / 1e12
        row = {"varlen": label, "seqlen_k": 4096}

        def rate(name, fn):
            ms = bench.median_ms(fn, args.repeats)
            row[name] = {"ms": round(ms, 4), "tflops": round(tflop / ms * 1e3, 1)}

        outs = {}
        # (The 100-row chunk is below the cache kernel's 128 rows: sm80 settings only.)
        for sm90 in (False, True) if max(sq) >= 128 else (False,):
            for one in (True, False):
                was = flashattn._C._set_switch("sm90_cache", sm90)
                was_share = flashattn._C._set_switch("decode_share", not one)
                try:
                    calls = flashattn._C._sm90_forward_calls()

                    def fn():
                        return flashattn.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, max(sq), max(sk), causal=True,
                                                                block_table=table)
                    name = ("sm90" if sm90 else "sm80") + ("_one" if one else "_split")
                    outs[name] = fn()
                    torch.cuda.synchronize()
                    row[name + "_ran_sm90"] = flashattn._C._sm90_forward_calls() > calls
                    rate(name, fn)
                    # Each launch's own time (torch.profiler): the decode launch, the tile list,
                    # the chunks' kernel (its empty CTAs included).
                    row[name + "_kernels_us"] = [[round(us, 2), round(cnt, 2), nm[:90]]
                                                 for us, cnt, nm in kernel_times(fn, 5)]
                finally:
                    flashattn._C._set_switch("sm90_cache", was)
                    flashattn._C._set_switch("decode_share", was_share)
        base = outs["sm80_one"].float()
        row["max_diff"] = {k: float((v.float() - base).abs().max()) for k, v in outs.items() if k != "sm80_one"}
        print(json.dumps(row), flush=True)
        rows.append(row)
    write_results("cache-prefill-probe.json", rows)


if __name__ == "__main__":
    main()
