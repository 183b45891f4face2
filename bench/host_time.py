"""Host time per call: flashattn's flash_attn_func and flash_attn_with_kvcache against PyTorch
SDPA on the same tiny tensors, in one process and one loop.

    python3 bench/host_time.py [--device cuda] [--calls 2000] [--rounds 5] [--json out.json]

What is measured: the wall time of N back-to-back calls divided by N. A synchronisation every
--sync-every calls keeps the device queue from filling; every implementation pays it alike.
On tiny shapes (decode: one
query token, batch 1, 32 query heads over 8 KV heads, d128, a 4k cache) the GPU kernel takes a
few microseconds, so the loop is bound by the host path: argument handling, DLPack export,
stream lookup, launch. The median over --rounds rounds is reported, per implementation:

    sdpa            torch.nn.functional.scaled_dot_product_attention (its default backend choice,
                    enable_gqa=True), q/k/v in SDPA's (batch, heads, seqlen, dim) layout
    flash_attn_func flashattn.flash_attn_func(q, k, v) (eager inference: the direct path)
    kvcache         flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=...)
    kvcache_append  the same with k/v of one new token (append in place) and a paged cache
                    (page size 16)

Runs on the CPU too (--device cpu), where the kernels, not the host path, dominate; the figures
that matter come from a GPU. Each implementation is warmed up first (--warmup calls).
"""
import argparse
import json
import statistics
import time


def build(device: str, dtype_name: str, cache_len: int):
    import torch

    import flashattn

    dtype = getattr(torch, dtype_name)
    b, h, hk, d, page = 1, 32, 8, 128, 16
    g = torch.Generator(device="cpu").manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g).to(device=device, dtype=dtype)  # noqa: E731
    q = r(b, 1, h, d)
    k = r(b, cache_len, hk, d)
    v = r(b, cache_len, hk, d)
    q_t, k_t, v_t = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    k_cache = r(b, cache_len + 64, hk, d)
    v_cache = r(b, cache_len + 64, hk, d)
    seqlens = torch.full((b,), cache_len, dtype=torch.int32, device=device)
    blocks = (cache_len + 64) // page
    k_pages = r(b * blocks, page, hk, d)
    v_pages = r(b * blocks, page, hk, d)
    table = torch.arange(b * blocks, dtype=torch.int32, device=device).view(b, blocks)
    k_new, v_new = r(b, 1, hk, d), r(b, 1, hk, d)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def call_sdpa():
        return sdpa(q_t, k_t, v_t, enable_gqa=True)

    def call_func():
        return flashattn.flash_attn_func(q, k, v)

    def call_kvcache():
        return flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens)

    def call_append():
        # Appending at the same position every call: the cache never fills.
        return flashattn.flash_attn_with_kvcache(q, k_pages, v_pages, k_new, v_new,
                                                 cache_seqlens=seqlens, block_table=table)

    return {"sdpa": call_sdpa, "flash_attn_func": call_func, "kvcache": call_kvcache,
            "kvcache_append": call_append}


def per_call_us(fn, calls: int, sync, sync_every: int) -> float:
    start = time.perf_counter()
    for i in range(calls):
        fn()
        if (i + 1) % sync_every == 0:
            sync()
    sync()
    return (time.perf_counter() - start) / calls * 1e6


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--cache-len", type=int, default=4096)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--sync-every", type=int, default=200)
    p.add_argument("--impls", default="sdpa,flash_attn_func,kvcache,kvcache_append")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)

    import torch

    import flashattn

    if a.device == "cpu" and a.dtype == "bfloat16":
        a.dtype = "float32"
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    fns = build(a.device, a.dtype, a.cache_len)
    names = [n for n in a.impls.split(",") if n]
    results = {}
    for name in names:
        fn = fns[name]
        try:
            for _ in range(a.warmup):
                fn()
            sync()
        except Exception as e:  # noqa: BLE001 - report the peer as unavailable, keep the others
            results[name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        results[name] = {"rounds_us": []}
    # One loop: the implementations alternate round by round, so drift affects all alike.
    for _ in range(a.rounds):
        for name in names:
            if "error" in results[name]:
                continue
            results[name]["rounds_us"].append(per_call_us(fns[name], a.calls, sync, a.sync_every))
    for r in results.values():
        if "rounds_us" in r:
            r["median_us"] = statistics.median(r["rounds_us"])
    report = {
        "device": torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu",
        "torch": torch.__version__, "flashattn": flashattn.__version__,
        "shape": {"batch": 1, "heads": 32, "heads_k": 8, "head_dim": 128, "seqlen_q": 1,
                  "cache_len": a.cache_len, "dtype": a.dtype},
        "calls": a.calls, "rounds": a.rounds, "results": results,
    }
    base = results.get("sdpa", {}).get("median_us")
    for name, r in results.items():
        line = f"{name:16s} " + (f"{r['median_us']:8.2f} us/call" if "median_us" in r else r["error"])
        if base and "median_us" in r:
            line += f"   {r['median_us'] / base:5.2f}x sdpa"
        print(line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
