"""Benchmarks flashattn against every attention peer present in the same process.

    python3 bench/bench.py --suite quick --out bench/results/h200-$(date +%F)-quick.json

Peers: FlashAttention-4 (fa4: the flash-attn-4 wheel, imported as flash_attn.cute; unavailable when
it does not import, see DEVELOPERS.md for installing it on the GPU machine), PyTorch SDPA with each backend forced (sdpa_cudnn, sdpa_flash = FlashAttention-2,
sdpa_efficient = memory-efficient, sdpa_math = the materialised reference: it stores the Nq x Nk
scores, so it runs only for Nq * Nk <= --math-max-seqlen^2 and when they fit in free memory),
and triton = bench/triton_attention.py, this project's own small Triton forward kernel (forward
only; marked unavailable when Triton cannot be imported). A peer that cannot run a
configuration gets {"error": ...} or {"skipped": ...} in that row instead of figures.

Suites: quick (5 rows for gpu-check), full (bf16/fp16, head dims 64/128/256, seqlen 512..16k with
batch = 16k/seqlen and 2048/head_dim heads, causal or not), decode (one query token, 32 query heads
over 8 KV heads, d128, bf16), sparse (block-sparse forward: a random mask of --block-size square
blocks kept with probability --block-density, one row per density, bf16, d128, 16 heads, seqlen
16k, batch 16k/seqlen; peers flashattn (block_mask=), flex = PyTorch FlexAttention compiled
(torch.compile(flex_attention)) on the same blocks as a BlockMask of full blocks, and fa4 with
block-sparse tensors from that BlockMask; figures are effective TFLOP/s, the FLOPs of the kept
blocks; each peer's row records max_abs_diff_vs_flashattn, its out / dq / dk / dv against ours
on one shared input), dsv3 (DeepSeek-V3 prefill: head_dim 192 for q/k,
head_dim_v 128 for v and out, bf16, 16 heads, batch = 16k/seqlen, seqlen 1k..16k, causal or not;
SDPA takes a v of another width, a peer that refuses it gets {"error": ...}). --block-density alone
selects the sparse suite.
--dtypes/--head-dims/--seqlens keep a subset of a suite's rows.
mla (DeepSeek-V3 MLA decode: one query token, head_dim 576 / head_dim_v 512, one latent KV head,
bf16, batch {1, 8, 32, 64} x cache {4k, 8k, 32k} x query heads {16, 128}): entries
flashattn_latent (v_cache = k_cache[..., :512], dense), flashattn_latent_paged64 (the same in
shuffled pages of 64), flashattn_separate_v (a separate v_cache: 576 + 512 columns read) and
torch_bmm (the absorbed-MLA math in torch eager: bmm, softmax, bmm over the same latent tensors,
a sanity line). SDPA is left out: its GQA path expands the single KV head to every query head
(128 x the cache). Figures: us, TB/s of cache bytes read (the latent cache once: 576 columns;
separate: 576 + 512), TFLOP/s of 2 * b * h * sk * (576 + 512).

FLOPs: forward 2*B*H*Nq*Nk*(d + dv), i.e. 4*B*H*Nq*Nk*d when dv = d (halved for causal when
Nq == Nk); backward 2.5x forward; forward+backward 3.5x forward. Times: CUDA events around one
call (a GPU sleep queued first, so host dispatch is hidden; --timing eager drops it), median of
--repeats after warm-up, fresh random inputs per peer. bwd = torch.autograd.grad of a saved output (no gradient
accumulation); fwd+bwd = forward with autograd recording, then that backward, timed as one.
Decode rows also carry *_graph figures: the same call captured in a CUDA graph and replayed,
which removes the host launch overhead that dominates the smallest decode shapes.
flashattn_fp8 (opt-in: --impls flashattn,flashattn_fp8): the FP8 forward (e4m3 q, k, v from the
row's inputs, converted once outside the timing; descales 1; bf16 out) in the same rows as the
bf16/fp16 flashattn call, forward only, FLOPs as for that dtype; the console line adds its
forward speed-up over flashattn's. E.g. python3 bench/bench.py --suite full --dtypes bf16
--impls flashattn,flashattn_fp8 --no-backward.
flashattn_det (opt-in): flash_attn_func with deterministic=True (the backward's two-kernel form on
Hopper), so a row shows the deterministic mode's cost beside flashattn's.
--kv-dtype fp8 (decode suite): the kvcache entries read an e4m3 cache (the bf16 keys quantized
once per (batch, kv head), descales passed as k_descale/v_descale); their kv_tb_per_s counts the
cache's bytes (1 per element), and each row prints their speed-up over flashattn's bf16 call.

Device time on an H200 (estimates; every timed figure has at least 150 ms of warm-up, WARMUP_MS):
quick ~2.5 min, decode ~1.5 min, full ~6.5 min (sdpa_math is ~1/4 of full; --impls drops peers;
--dtypes bf16 then fp16 splits full in two).

The JSON (format 3) keeps every key of format 1 and adds peers, fwdbwd_* figures, *_graph decode
figures, "implementations", "unavailable" and more environment fields (driver, git commit)
(format 2), then "timing_mode" and "host_overhead_us" (format 3). Format 3 times GPU execution
by default (--timing device): a GPU sleep queued before the start event hides each peer's
host dispatch, which formats 1-2 included and which dominated the short rows for peers with a
slow Python path. host_overhead_us states that dispatch cost separately. With --gpu-state each
peer's result also holds gpu_state: the SM clock, power draw, temperature and software power cap
sampled by nvidia-smi during its forward and backward passes (passes shorter than ~0.1 s are
sampled after them; the H200 reaches its 700 W limit late in the full suite, where the 16k rows
then run at lower clocks).
This module imports torch only inside functions, so its helpers load without torch.
"""
import argparse
import datetime
import json
import os
import platform
import socket
import subprocess
import sys

IMPLS = ("flashattn", "sdpa_cudnn", "sdpa_flash", "fa4", "sdpa_efficient", "sdpa_math", "triton", "kvcache",
         "kvcache_paged16", "varlen_paged16")
KVCACHE_IMPLS = ("kvcache", "kvcache_paged16", "varlen_paged16")
DECODE_IMPLS = ("flashattn", "kvcache", "kvcache_paged16", "varlen_paged16", "sdpa_cudnn", "sdpa_flash",
                "sdpa_efficient", "sdpa_math")
SPARSE_IMPLS = ("flashattn", "flex", "fa4")
# Named only on request (not in the default --impls): dev measurements beside flashattn's own row.
OPT_IN_IMPLS = ("flashattn_sink", "flashattn_fp8", "flashattn_det")
DESCRIPTIONS = {
    "flashattn": "this library: flashattn.flash_attn_func (layout B, N, H, d)",
    "sdpa_cudnn": "torch SDPA, cuDNN backend (SDPBackend.CUDNN_ATTENTION)",
    "sdpa_flash": "torch SDPA, flash backend = FlashAttention-2 (SDPBackend.FLASH_ATTENTION)",
    "sdpa_efficient": "torch SDPA, memory-efficient backend (SDPBackend.EFFICIENT_ATTENTION)",
    "sdpa_math": "torch SDPA, math backend: materialises the N x N scores (standard attention)",
    "triton": "bench/triton_attention.py: this project's Triton forward kernel (not upstream's); forward only",
    "fa4": "FlashAttention-4 (flash-attn-4 wheel, CuTe DSL JIT): flash_attn.cute.flash_attn_func (layout B, N, H, d); "
           "in the sparse suite with block_sparse_tensors / block_sparse_tensors_bwd from flex's BlockMask",
    "kvcache": "this library: flashattn.flash_attn_with_kvcache on a dense cache holding exactly the keys, with "
               "cache_seqlens (decode suite only)",
    "kvcache_paged16": "this library: flashattn.flash_attn_with_kvcache on a paged cache of 16-row pages in "
                       "shuffled order, with block_table and cache_seqlens (decode suite only)",
    "varlen_paged16": "this library: flashattn.flash_attn_varlen_func with block_table on kvcache_paged16's pages "
                      "(q packed, cu_seqlens; vLLM's call; decode suite only)",
    "flashattn_sink": "this library: flashattn.flash_attn_func with learnable_sink (zeros, float32, one per head; "
                      "the sink's cost beside the flashattn row, issue 19)",
    "flashattn_fp8": "this library: flashattn.flash_attn_func on float8_e4m3fn q, k, v (the row's inputs converted "
                     "once, outside the timing; descales 1, out bf16; the Hopper FP8 forward, issue 21), forward "
                     "only, FLOPs counted as for the row's dtype",
    "flashattn_det": "this library: flashattn.flash_attn_func with deterministic=True (the Hopper backward's "
                     "two-kernel form: dQ accumulated in registers, no reductions across CTAs)",
    "flex": "torch FlexAttention, torch.compile(flex_attention) with a BlockMask of the same blocks, all full "
            "(sparse suite only)",
}
FLOPS_NOTE = "fwd 2*B*H*Nq*Nk*(d + dv) = 4*B*H*Nq*Nk*d at dv = d (causal /2), bwd 2.5x fwd, fwdbwd 3.5x fwd; TFLOP/s"
TIMING_NOTE = ("CUDA events around one call, median of repeats after 5 warm-up calls; timing 'device': a GPU "
               "sleep queued before the start event hides host dispatch, 'eager': it does not; bwd: "
               "autograd.grad of a saved output; fwdbwd: forward + backward as one timed call; *_graph: CUDA "
               "graph replay; host_overhead_us: host time per forward call at B1 H1 N128 d64")


# ---- helpers that need no torch ----------------------------------------------------------------

def flops(b, h, sq, sk, d, causal, dv=None):
    """Forward FLOPs: S = Q K^T (2 * d per score) and O = P V (2 * dv per score); dv defaults to d."""
    f = 2.0 * b * h * sq * sk * (d + (d if dv is None else dv))
    return f / 2 if causal and sq == sk else f


def suite_rows(suite, dtypes=None, head_dims=None, seqlens=None):
    """The (dtype, d, n, causal) rows of an attention suite, optionally filtered. A row may also
    carry dv (head_dim_v, default d) and heads (default 2048 / d)."""
    if suite == "quick":
        rows = [dict(dtype="bf16", d=d, n=n, causal=causal) for d, n, causal in (
            (128, 2048, False), (128, 16384, False), (128, 16384, True), (64, 16384, False), (256, 16384, False))]
    elif suite == "issue3":  # bf16 at every head dim and fp16 at d128: issue 3's table in one lease
        rows = [dict(dtype=dtype, d=d, n=n, causal=causal)
                for dtype, dims in (("bf16", (64, 128, 256)), ("fp16", (128,))) for d in dims
                for n in (512, 1024, 2048, 4096, 8192, 16384) for causal in (False, True)]
    elif suite == "full":
        rows = [dict(dtype=dtype, d=d, n=n, causal=causal) for dtype in ("bf16", "fp16") for d in (64, 128, 256)
                for n in (512, 1024, 2048, 4096, 8192, 16384) for causal in (False, True)]
    elif suite == "dsv3":  # DeepSeek-V3 prefill (issue 19): q/k 192, v/out 128, 16 heads
        rows = [dict(dtype="bf16", d=192, dv=128, heads=16, n=n, causal=causal)
                for n in (1024, 2048, 4096, 8192, 16384) for causal in (False, True)]
    else:
        raise ValueError(f"suite_rows: no attention rows for suite {suite!r}")
    return [r for r in rows if (not dtypes or r["dtype"] in dtypes) and (not head_dims or r["d"] in head_dims)
            and (not seqlens or r["n"] in seqlens)]


def sparse_rows(densities, dtypes=None, head_dims=None, seqlens=None):
    """The (dtype, d, n, causal, density) rows of the sparse suite: bf16, d128, seqlen 16k (the
    issue's setting) unless filters choose others, one row per density."""
    for x in densities:
        if not 0.0 <= x <= 1.0:
            raise ValueError(f"block density {x} is outside [0, 1]")
    return [dict(dtype=dtype, d=d, n=n, causal=False, density=x) for dtype in (dtypes or ["bf16"])
            for d in (head_dims or [128]) for n in (seqlens or [16384]) for x in densities]


def sparse_shape(n, d):
    """(batch, heads) of a sparse row: 16 heads (FlexAttention's published setting), batch 16k / n."""
    return max(1, 16384 // n), 16


def format_sparse_row(row):
    """One console line: density, effective TFLOP/s and time per peer, ours vs Flex."""
    parts = [f"{row['dtype']} d{row['d']} n{row['n']} density {row['density']:.2f} (kept {row['kept']:.3f})"]
    for name in SPARSE_IMPLS:
        r = row.get(name)
        if isinstance(r, dict) and "fwd_tflops" in r:
            parts.append(f"{name} fwd {r['fwd_ms']:.3f} ms {r['fwd_tflops']:.0f}" +
                         (f" bwd {r['bwd_tflops']:.0f}" if "bwd_tflops" in r else ""))
        elif isinstance(r, dict):
            parts.append(f"{name} n/a")
    ours = row.get("flashattn", {})
    for name, label in (("flex", "Flex"), ("fa4", "FA4")):
        peer = row.get(name, {})
        if "fwd_ms" in ours and "fwd_ms" in peer:
            parts.append(f"vs {label} fwd {peer['fwd_ms'] / ours['fwd_ms']:.2f}x" +
                         (f" bwd {peer['bwd_ms'] / ours['bwd_ms']:.2f}x" if "bwd_ms" in ours and "bwd_ms" in peer else ""))
    return "  ".join(parts)


def decode_rows():
    """(batch, seqlen_k) of the decode suite: 32 query heads over 8 KV heads, d128, bf16."""
    return ((1, 4096), (1, 131072), (8, 65536), (8, 131072), (64, 4096), (64, 16384))


def add_rates(result, fl):
    """Adds *_tflops next to each *_ms figure of one peer's result (fl = forward FLOPs)."""
    for key, mult in (("fwd", 1.0), ("bwd", 2.5), ("fwdbwd", 3.5)):
        if f"{key}_ms" in result:
            result[f"{key}_tflops"] = mult * fl / result[f"{key}_ms"] / 1e9
    return result


def format_row(row):
    """One console line: TFLOP/s fwd/bwd/fwd+bwd per peer, then ours vs FA2 and cuDNN."""
    dims = f"d{row['d']}" + (f"/{row['dv']}" if row.get("dv", row["d"]) != row["d"] else "")
    parts = [f"{row['dtype']} {dims} n{row['n']} {'causal' if row['causal'] else 'full  '}"]
    for name in IMPLS + OPT_IN_IMPLS:
        r = row.get(name)
        if not isinstance(r, dict):
            continue
        if "fwd_tflops" in r:
            figs = [r.get(k) for k in ("fwd_tflops", "bwd_tflops", "fwdbwd_tflops")]
            parts.append(f"{name} " + "/".join("-" if x is None else f"{x:.0f}" for x in figs))
        else:
            parts.append(f"{name} n/a")
    ours = row.get("flashattn", {})
    for peer, label in (("sdpa_flash", "FA2"), ("sdpa_cudnn", "cuDNN"), ("fa4", "FA4")):
        other = row.get(peer, {})
        ratios = [f"{key} {ours[key + '_tflops'] / other[key + '_tflops']:.2f}x" for key in ("fwd", "bwd", "fwdbwd")
                  if key + "_tflops" in ours and key + "_tflops" in other]
        if ratios:
            parts.append(f"vs {label} " + " ".join(ratios))
    fp8 = row.get("flashattn_fp8", {})
    if "fwd_ms" in ours and "fwd_ms" in fp8:
        parts.append(f"fp8 fwd {ours['fwd_ms'] / fp8['fwd_ms']:.2f}x bf16")
    sink = row.get("flashattn_sink", {})
    # The sink's cost: time with it over time without, minus 1 (issue 19's bound is +3%).
    costs = [f"{key} {sink[key + '_ms'] / ours[key + '_ms'] - 1.0:+.1%}"
             for key in ("fwd", "bwd", "fwdbwd") if key + "_ms" in ours and key + "_ms" in sink]
    if costs:
        parts.append("sink cost " + " ".join(costs))
    return "  ".join(parts)


def format_decode_row(row):
    parts = [f"decode b{row['batch']} sk{row['seqlen_k']}:"]
    for name in DECODE_IMPLS:
        r = row.get(name, {})
        if "fwd_ms" in r:
            s = f"{name} {r['fwd_ms'] * 1e3:.1f}us {r['kv_tb_per_s']:.2f}TB/s"
            if "fwd_ms_graph" in r:
                s += f" (graph {r['fwd_ms_graph'] * 1e3:.1f}us {r['kv_tb_per_s_graph']:.2f}TB/s)"
            parts.append(s)
    # An e4m3 cache: its decode steps per second over flashattn's bf16 ones (the issue's ~1.9x).
    base = row.get("flashattn", {})
    if row.get("kv_dtype") == "fp8" and "fwd_ms" in base:
        ups = [f"{n} {base['fwd_ms'] / row[n]['fwd_ms']:.2f}x" for n in KVCACHE_IMPLS if "fwd_ms" in row.get(n, {})]
        if ups:
            parts.append("fp8 cache vs bf16 flashattn " + " ".join(ups))
    return "  ".join(parts)


def short_error(e):
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:200]


def git_state():
    """{"commit", "dirty"} of the tree this script runs from. A git-archive snapshot (how runs
    reach the GPU machine) has no .git of its own, so git would answer for whatever repository
    encloses it; its SOURCE_COMMIT file (written when the snapshot is made) names the commit
    instead, and without one the state is unknown (None)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    marker = os.path.join(root, "SOURCE_COMMIT")
    if os.path.exists(marker):
        with open(marker) as f:
            return {"commit": f.read().strip(), "dirty": False, "source": "SOURCE_COMMIT (git archive snapshot)"}
    if not os.path.exists(os.path.join(root, ".git")):
        return None
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(dirty)} if commit else None


def nvidia_smi(fields=("driver_version", "clocks.max.sm", "power.limit")):
    """{field: value} from nvidia-smi for GPU 0; {} when nvidia-smi is missing or fails."""
    try:
        out = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=" + ",".join(fields),
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return {}
    smi = smi_answer(out.stdout, out.returncode, fields)
    if smi is None:
        return nvidia_smi(fields[:1]) if len(fields) > 1 else {}
    return smi


def smi_answer(stdout, returncode, fields):
    """{field: value} from one line of `nvidia-smi --query-gpu=... --format=csv,noheader,nounits`,
    or None when it failed or did not answer every field."""
    values = [v.strip() for v in stdout.strip().split(",")]
    if returncode != 0 or len(values) != len(fields):
        return None
    return dict(zip(fields, values))


# --gpu-state: during each timed pass of a peer (forward, backward), the GPU's SM clock, power
# draw, temperature and whether the software power cap is holding the clock down, from
# nvidia-smi, so that a row timed at the power limit (the full suite's 16k tail on the H200) says
# so in the JSON (row[peer]["gpu_state"]). nvidia-smi is started with the pass's warm-up and read
# after it, so it samples while the pass runs if the pass outlasts its start-up (~0.1 s: the 4k-16k
# rows); a shorter pass is sampled after its calls, when the draw has fallen (a d128 4k pass read
# afterwards: 128-188 W, dev/results/h200-2026-12-02-gpu-state-after-5110f2b.json). Off by default.
GPU_STATE = {"on": False, "fields": None}
GPU_STATE_FIELDS = ("clocks.sm", "power.draw", "temperature.gpu", "clocks_event_reasons.sw_power_cap")


def gpu_state_fields():
    """The fields this driver answers (the power-cap reason is newer than the other three), asked
    once; () without nvidia-smi."""
    if GPU_STATE["fields"] is None:
        GPU_STATE["fields"] = next((f for f in (GPU_STATE_FIELDS, GPU_STATE_FIELDS[:3])
                                    if len(nvidia_smi(f)) == len(f)), ())
    return GPU_STATE["fields"]


def start_gpu_state():
    """A running nvidia-smi query of gpu_state_fields(), or None (no nvidia-smi, or off)."""
    fields = gpu_state_fields() if GPU_STATE["on"] else ()
    if not fields:
        return None
    try:
        return subprocess.Popen(["nvidia-smi", "-i", "0", "--query-gpu=" + ",".join(fields),
                                 "--format=csv,noheader,nounits"], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
    except OSError:
        return None


def finish_gpu_state(proc):
    """{"sm_mhz", "power_w", "temp_c"[, "power_capped"]} from a start_gpu_state query, {} when it
    failed or answered something unreadable ("[N/A]")."""
    if proc is None:
        return {}
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.SubprocessError:
        proc.kill()
        return {}
    smi = smi_answer(out, proc.returncode, GPU_STATE["fields"] or ())
    if not smi:
        return {}
    try:
        state = {"sm_mhz": int(float(smi["clocks.sm"])), "power_w": float(smi["power.draw"]),
                 "temp_c": int(float(smi["temperature.gpu"]))}
    except ValueError:
        return {}
    reason = smi.get("clocks_event_reasons.sw_power_cap", "").lower()
    if reason in ("active", "not active"):
        state["power_capped"] = reason == "active"
    return state


def cuda_driver_api_version():
    """The CUDA version the driver supports (cuDriverGetVersion), e.g. "13.0"; None if unknown."""
    import ctypes
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(v)) != 0:
            return None
    except OSError:
        return None
    return f"{v.value // 1000}.{v.value % 1000 // 10}"


# ---- timing (torch) ----------------------------------------------------------------------------

# "device": a GPU-side sleep is queued before the start event, so the host has enqueued the whole
# call before the GPU reaches it and the events time GPU execution alone (every kernel of the call
# and the gaps between them). "eager": the GPU is idle when the call starts, so the figure also
# holds the host's dispatch time up to the first kernel (format 1 and 2 results were taken so).
TIMING = {"mode": "device"}
LEAD_MS = 1.0  # the sleep: longer than any peer's host dispatch (the slowest measured ~0.2 ms)


def sleep_cycles_per_ms():
    """GPU clock cycles per millisecond of torch.cuda._sleep, measured once."""
    import torch
    if "cycles_per_ms" not in TIMING:
        probe = 2_000_000
        torch.cuda._sleep(probe)  # warm-up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(probe)
        end.record()
        end.synchronize()
        TIMING["cycles_per_ms"] = probe / start.elapsed_time(end)
    return TIMING["cycles_per_ms"]


# Warm-up: at least `warmup` calls and WARMUP_MS of GPU time before the timed calls. With only 5
# calls a decode peer's figures could fall inside a transient: in the decode suite with sdpa_math
# among the peers, the first 25-75 ms of some rows ran every kernel ~14% slow (flash_attn_func and
# flash_attn_with_kvcache alike, on the row's tensors and on fresh copies), then recovered
# (2026-12-04, dev/NOTES.md "Decode after sdpa_math").
WARMUP_MS = 150.0


def median_ms(fn, repeats, warmup=5):
    import time
    import torch
    start, calls = time.perf_counter(), 0
    while calls < warmup or (time.perf_counter() - start) * 1e3 < WARMUP_MS:
        fn()
        calls += 1
        if calls >= warmup:
            torch.cuda.synchronize()  # the wall clock then follows the GPU, not the queue
    torch.cuda.synchronize()
    lead = int(LEAD_MS * sleep_cycles_per_ms()) if TIMING["mode"] == "device" else 0
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if lead:
            torch.cuda._sleep(lead)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def host_overhead_us(impl, calls=200):
    """Host time per forward call (microseconds) at a tiny shape (B1 H1 N128 d64 bf16), where the
    GPU work is a few microseconds: wall time of `calls` back-to-back calls, then a synchronize."""
    import time
    import torch
    shape = (1, 128, 1, 64) if impl.layout == "bshd" else (1, 1, 128, 64)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with torch.no_grad():
        for _ in range(20):
            impl.fn(q, k, v, False)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            impl.fn(q, k, v, False)
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def capture_graph(fn):
    """fn captured in a CUDA graph (fn runs 3 times first, on a side stream, as capture requires)."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def graph_median_ms(fn, repeats):
    """Median time of replaying fn captured in a CUDA graph."""
    return median_ms(capture_graph(fn).replay, repeats)


class Impl:
    """One peer: layout "bshd" (flash_attn's) or "bhsd" (SDPA's), fn(q, k, v, causal) -> out,
    whether it has a backward, and skip(b, h, hk, sq, sk, dtype) -> reason or None."""

    def __init__(self, layout, fn, backward=True, skip=None):
        self.layout, self.fn, self.backward = layout, fn, backward
        self.skip = skip or (lambda *args: None)


def kvcache_fn(page, kv_dtype="bf16", varlen=False):
    """fn(q, k, v, causal) for flash_attn_with_kvcache over the keys k, v (B, N, Hk, d): a dense
    cache (page 0) is k and v themselves; a paged one holds their pages in a shuffled order
    (built once per k and kept, so the timed calls only attend). kv_dtype "fp8": the cache holds
    k and v quantized to e4m3 per (batch, kv head) (absmax / 336), descales passed along.
    varlen: flash_attn_varlen_func with block_table on the same pages (q as (B * Nq, H, d))."""
    import torch
    import flashattn
    made = {}

    def quantize(x):
        descale = (x.abs().amax(dim=(1, 3)).float() / 336.0).clamp_min(1e-6)  # (B, Hk)
        return (x.float() / descale[:, None, :, None]).to(torch.float8_e4m3fn), descale.contiguous()

    def fn(q, k, v, causal):
        key = (k.data_ptr(), v.data_ptr())
        if key not in made:
            made.clear()
            b, n, hk, d = k.shape
            seqlens = torch.full((b,), n, dtype=torch.int32, device=k.device)
            descales = (None, None)
            if kv_dtype == "fp8":
                (k, kd), (v, vd) = quantize(k), quantize(v)
                descales = (kd, vd)
            if page == 0:
                made[key] = (k, v, seqlens, None) + descales
            else:
                pages = b * n // page
                perm = torch.randperm(pages, device=k.device)
                kc = torch.empty((pages, page, hk, d), dtype=k.dtype, device=k.device)
                vc = torch.empty_like(kc)
                kc[perm] = k.reshape(pages, page, hk, d)
                vc[perm] = v.reshape(pages, page, hk, d)
                made[key] = (kc, vc, seqlens, perm.to(torch.int32).view(b, n // page)) + descales
        kc, vc, seqlens, table, kd, vd = made[key]
        if varlen:
            b, sq, h, d = q.shape
            n = int(k.shape[1])
            cu_q = torch.arange(0, (b + 1) * sq, sq, dtype=torch.int32, device=q.device)
            cu_k = torch.arange(0, (b + 1) * n, n, dtype=torch.int32, device=q.device)
            out = flashattn.flash_attn_varlen_func(q.reshape(b * sq, h, d), kc, vc, cu_q, cu_k, sq, n, causal=causal,
                                                   block_table=table, k_descale=kd, v_descale=vd)
            return out.view(b, sq, h, -1)
        return flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table, causal=causal,
                                                 k_descale=kd, v_descale=vd)
    return fn


def attention_impls(names, math_max_seqlen=4096, softcap=0.0, kv_dtype="bf16"):
    """({name: Impl} for the requested peers that load, {name: reason} for those that do not).
    softcap > 0 (dev A/Bs of the modifier kernels): flashattn applies it; the peers have no
    softcap, so they skip every row."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    impls, unavailable = {}, {}
    if "flashattn" in names:
        import flashattn
        impls["flashattn"] = Impl("bshd", lambda q, k, v, causal: flashattn.flash_attn_func(q, k, v, causal=causal,
                                                                                            softcap=softcap))

    if "flashattn_det" in names:  # deterministic=True: the Hopper backward's two-kernel form
        import flashattn
        impls["flashattn_det"] = Impl("bshd", lambda q, k, v, causal: flashattn.flash_attn_func(
            q, k, v, causal=causal, softcap=softcap, deterministic=True))

    if "flashattn_sink" in names:
        import flashattn
        sinks = {}  # one (heads,) float32 tensor per head count, made once

        def run_sink(q, k, v, causal):
            h = q.shape[2]
            if h not in sinks:
                sinks[h] = torch.zeros(h, dtype=torch.float32, device=q.device)
            return flashattn.flash_attn_func(q, k, v, causal=causal, softcap=softcap, learnable_sink=sinks[h])
        impls["flashattn_sink"] = Impl("bshd", run_sink)

    if "flashattn_fp8" in names:
        import flashattn
        converted = {}  # the last inputs' e4m3 copies, so the timed calls only attend

        def run_fp8(q, k, v, causal):
            key = (q.data_ptr(), k.data_ptr(), v.data_ptr(), q.shape, k.shape, v.shape)
            if key not in converted:
                converted.clear()
                converted[key] = tuple(t.detach().to(torch.float8_e4m3fn) for t in (q, k, v))
            q8, k8, v8 = converted[key]
            return flashattn.flash_attn_func(q8, k8, v8, causal=causal, softcap=softcap)
        impls["flashattn_fp8"] = Impl("bshd", run_fp8, backward=False)

    def no_softcap(*args):
        return "no softcap in this peer" if softcap > 0 else None

    def math_skip(b, h, hk, sq, sk, dtype):
        if softcap > 0:
            return no_softcap()
        if sq * sk > math_max_seqlen ** 2:
            return f"math backend materialises Nq x Nk scores; run only for Nq * Nk <= {math_max_seqlen}^2"
        # Scores, probabilities and (backward) their gradients, in float32 to be safe.
        need = 4 * b * h * sq * sk * 4
        free, _ = torch.cuda.mem_get_info()
        if need > 0.8 * free:
            return f"math backend needs ~{need / 2**30:.0f} GiB for N x N matrices, {free / 2**30:.0f} GiB free"
        return None

    for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION),
                          ("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION), ("sdpa_math", SDPBackend.MATH)):
        if name not in names:
            continue

        def run(q, k, v, causal, backend=backend):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
        impls[name] = Impl("bhsd", run, skip=math_skip if name == "sdpa_math" else no_softcap)

    for name, page in (("kvcache", 0), ("kvcache_paged16", 16), ("varlen_paged16", 16)):
        if name in names:
            impls[name] = Impl("bshd", kvcache_fn(page, kv_dtype, varlen=name.startswith("varlen")), backward=False,
                               skip=lambda b, h, hk, sq, sk, dtype, page=page: (
                                   f"seqlen_k not a multiple of the page size {page}" if page and sk % page else None))

    if "fa4" in names:
        try:
            from flash_attn.cute import flash_attn_func as fa4_func
        except Exception as e:  # not installed, or its JIT stack failing to load
            unavailable["fa4"] = "not available: " + short_error(e)
        else:
            def run_fa4(q, k, v, causal):
                out = fa4_func(q, k, v, causal=causal)
                return out[0] if isinstance(out, tuple) else out
            impls["fa4"] = Impl("bshd", run_fa4, skip=no_softcap)

    if "triton" in names:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        try:
            import triton_attention
        except Exception as e:  # ImportError, or Triton failing to initialise
            unavailable["triton"] = "not available: " + short_error(e)
        else:
            impls["triton"] = Impl("bhsd", lambda q, k, v, causal: triton_attention.attention(q, k, v, causal=causal),
                                   backward=False, skip=no_softcap)
    return impls, unavailable


def bench_row(impl, b, h, hk, sq, sk, d, causal, dtype, backward, repeats, graph=False, dv=None):
    """{"fwd_ms", ["bwd_ms", "fwdbwd_ms"], ["fwd_ms_graph"]} for one peer and shape (v and out
    dv wide, default d)."""
    import torch
    dv = d if dv is None else dv
    shape_q = (b, sq, h, d) if impl.layout == "bshd" else (b, h, sq, d)
    shape_k = (b, sk, hk, d) if impl.layout == "bshd" else (b, hk, sk, d)
    shape_v = shape_k[:-1] + (dv,)
    grad_inputs = backward and impl.backward
    q = torch.randn(shape_q, device="cuda", dtype=dtype, requires_grad=grad_inputs)
    k = torch.randn(shape_k, device="cuda", dtype=dtype, requires_grad=grad_inputs)
    v = torch.randn(shape_v, device="cuda", dtype=dtype, requires_grad=grad_inputs)
    result = {}
    states = {}
    with torch.no_grad():
        probe = start_gpu_state()
        result["fwd_ms"] = median_ms(lambda: impl.fn(q, k, v, causal), repeats)
        if probe is not None:
            states["fwd"] = finish_gpu_state(probe)
        if graph:
            try:
                result["fwd_ms_graph"] = graph_median_ms(lambda: impl.fn(q, k, v, causal), repeats)
            except Exception as e:  # a peer that cannot be captured: keep the eager figure
                result["graph_error"] = short_error(e)
    if grad_inputs:
        out = impl.fn(q, k, v, causal)
        grad = torch.randn_like(out)
        probe = start_gpu_state()
        result["bwd_ms"] = median_ms(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True), repeats)
        if probe is not None:
            states["bwd"] = finish_gpu_state(probe)
        del out
        result["fwdbwd_ms"] = median_ms(lambda: torch.autograd.grad(impl.fn(q, k, v, causal), (q, k, v), grad),
                                        repeats)
    elif backward:
        result["bwd_skipped"] = "forward only"
    if states:
        result["gpu_state"] = states
    return result


def measure(impl, name, shape, dtype, backward, repeats, graph=False, dv=None):
    """Runs bench_row for one peer and shape (b, h, hk, sq, sk, d, causal; v dv wide), turning a
    peer's refusal or an out-of-memory error into {"skipped": ...} or {"error": ...}."""
    import torch
    b, h, hk, sq, sk, d, causal = shape
    reason = impl.skip(b, h, hk, sq, sk, dtype)
    if reason:
        return {"skipped": reason}
    try:
        return bench_row(impl, b, h, hk, sq, sk, d, causal, dtype, backward, repeats, graph, dv)
    # A peer without this shape (AssertionError: peers that assert their head dims, e.g. at dv != d).
    except (RuntimeError, ValueError, TypeError, NotImplementedError, AssertionError) as e:
        return {"error": short_error(e)}
    finally:
        if name == "sdpa_math":
            torch.cuda.empty_cache()


def run_attention_suite(rows_cfg, impls, repeats, backward, save=lambda rows: None):
    import torch
    rows = []
    for cfg in rows_cfg:
        d, n, causal = cfg["d"], cfg["n"], cfg["causal"]
        dv = cfg.get("dv", d)
        b, h = 16384 // n, cfg.get("heads", 2048 // d)
        dtype = torch.bfloat16 if cfg["dtype"] == "bf16" else torch.float16
        row = dict(cfg, batch=b, heads=h)
        fl = flops(b, h, n, n, d, causal, dv)
        for name, impl in impls.items():
            r = measure(impl, name, (b, h, h, n, n, d, causal), dtype, backward, repeats, dv=dv)
            row[name] = add_rates(r, fl) if "fwd_ms" in r else r
        rows.append(row)
        save(rows)
        print(format_row(row), flush=True)
    return rows


def run_decode_suite(impls, repeats, save=lambda rows: None, kv_dtype="bf16"):
    import torch
    rows = []
    for b, sk in decode_rows():
        row = dict(kind="decode", batch=b, seqlen_k=sk, heads=32, heads_k=8, d=128, dtype="bf16", kv_dtype=kv_dtype)
        for name, impl in impls.items():
            # Bytes of the K and V the call reads: an e4m3 cache (the kvcache entries under
            # --kv-dtype fp8) holds one byte per element.
            elem_bytes = 1 if kv_dtype == "fp8" and name in KVCACHE_IMPLS else 2
            kv_bytes = 2 * b * sk * 8 * 128 * elem_bytes
            r = measure(impl, name, (b, 32, 8, 1, sk, 128, False), torch.bfloat16, False, repeats, graph=True)
            if "fwd_ms" in r:
                r["kv_tb_per_s"] = kv_bytes / r["fwd_ms"] / 1e9
                if "fwd_ms_graph" in r:
                    r["kv_tb_per_s_graph"] = kv_bytes / r["fwd_ms_graph"] / 1e9
            row[name] = r
        rows.append(row)
        save(rows)
        print(format_decode_row(row), flush=True)
    return rows


MLA_D, MLA_DV = 576, 512


def mla_rows():
    """(batch, seqlen_k, heads) of the mla suite: one latent KV head, one query token."""
    return [(b, sk, h) for h in (16, 128) for b in (1, 8, 32, 64) for sk in (4096, 8192, 32768)]


def mla_entries():
    """{name: (fn(q, k_cache) -> out, cache columns read per key)} of the mla suite. k_cache is the
    latent cache (b, sk, 1, 576); each fn builds what else it needs once per cache and keeps it."""
    import torch
    import flashattn
    made = {}

    def latent(page):
        def run(q, k_cache):
            b, sk = k_cache.shape[0], k_cache.shape[1]
            key = ("latent", page, k_cache.data_ptr())
            if key not in made:
                seqlens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
                if page:
                    blocks = sk // page
                    perm = torch.randperm(b * blocks, device="cuda")
                    pages = torch.empty_like(k_cache).view(b * blocks, page, 1, MLA_D)
                    pages[perm] = k_cache.view(b * blocks, page, 1, MLA_D)
                    made[key] = (pages, seqlens, perm.view(b, blocks).to(torch.int32))
                else:
                    made[key] = (k_cache, seqlens, None)
            cache, seqlens, table = made[key]
            return flashattn.flash_attn_with_kvcache(q, cache, cache[..., :MLA_DV], cache_seqlens=seqlens,
                                                     block_table=table)
        return run

    def separate(q, k_cache):
        key = ("separate", k_cache.data_ptr())
        if key not in made:
            made[key] = (k_cache[..., :MLA_DV].contiguous(),
                         torch.full((k_cache.shape[0],), k_cache.shape[1], dtype=torch.int32, device="cuda"))
        v_cache, seqlens = made[key]
        return flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens)

    def torch_bmm(q, k_cache):
        b, _, h, _ = q.shape
        k = k_cache[:, :, 0]  # (b, sk, 576)
        s = torch.bmm(q[:, 0], k.transpose(1, 2)).float() * (MLA_D ** -0.5)  # (b, h, sk)
        p = torch.softmax(s, dim=-1).to(q.dtype)
        return torch.bmm(p, k[..., :MLA_DV]).view(b, 1, h, MLA_DV)

    return {"flashattn_latent": (latent(0), MLA_D), "flashattn_latent_paged64": (latent(64), MLA_D),
            "flashattn_separate_v": (separate, MLA_D + MLA_DV), "torch_bmm": (torch_bmm, MLA_D)}


def run_mla_suite(repeats, save=lambda rows: None):
    import torch
    rows = []
    entries = mla_entries()
    for b, sk, h in mla_rows():
        row = dict(kind="mla", batch=b, seqlen_k=sk, heads=h, heads_k=1, d=MLA_D, dv=MLA_DV, dtype="bf16")
        q = torch.randn(b, 1, h, MLA_D, device="cuda", dtype=torch.bfloat16)
        k_cache = torch.randn(b, sk, 1, MLA_D, device="cuda", dtype=torch.bfloat16)
        fl = 2.0 * b * h * sk * (MLA_D + MLA_DV)
        for name, (fn, columns) in entries.items():
            try:
                with torch.no_grad():
                    r = {"fwd_ms": median_ms(lambda: fn(q, k_cache), repeats)}
                    try:
                        r["fwd_ms_graph"] = graph_median_ms(lambda: fn(q, k_cache), repeats)
                    except Exception as e:  # not capturable: keep the eager figure
                        r["graph_error"] = short_error(e)
            except (RuntimeError, ValueError, TypeError, NotImplementedError) as e:
                row[name] = {"error": short_error(e)}
                continue
            cache_bytes = 2.0 * b * sk * columns
            for suffix in ("", "_graph"):
                if "fwd_ms" + suffix in r:
                    r["kv_tb_per_s" + suffix] = cache_bytes / r["fwd_ms" + suffix] / 1e9
                    r["tflops" + suffix] = fl / r["fwd_ms" + suffix] / 1e9
            row[name] = r
        del q, k_cache
        torch.cuda.empty_cache()
        rows.append(row)
        save(rows)
        parts = [f"mla b{b} sk{sk} h{h}:"]
        for name in entries:
            r = row[name]
            if "fwd_ms" in r:
                t = r.get("fwd_ms_graph", r["fwd_ms"])
                parts.append(f"{name} {t * 1e3:.1f}us {r.get('kv_tb_per_s_graph', r['kv_tb_per_s']):.2f}TB/s "
                             f"{r.get('tflops_graph', r['tflops']):.0f}TFLOP/s")
            else:
                parts.append(f"{name} {r.get('error')}")
        print("  ".join(parts), flush=True)
    return rows


def random_block_mask(b, h, blocks, density, seed=18):
    """bool (b, h, blocks, blocks) on the GPU, each block kept with probability density."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.rand((b, h, blocks, blocks), generator=g, device="cuda") < density


def sparse_impls(names, block_mask, block_size):
    """({name: Impl}, {name: reason}) of the sparse suite's peers for one block mask (b, h, nq, nk
    bool over block_size x block_size blocks). flex is unavailable where torch has no
    FlexAttention; its BlockMask holds the kept blocks as full blocks (no mask_mod)."""
    import torch
    impls, unavailable = {}, {}
    if "flashattn" in names:
        import flashattn
        # Forward and backward (the backward of a block mask runs the sm80 kernels).
        impls["flashattn"] = Impl("bshd", lambda q, k, v, causal: flashattn.flash_attn_func(
            q, k, v, block_mask=block_mask, block_size=(block_size, block_size)))
    if "flex" in names:
        try:
            from torch.nn.attention.flex_attention import BlockMask, flex_attention
        except Exception as e:  # torch < 2.5
            unavailable["flex"] = "not available: " + short_error(e)
        else:
            if "flex" not in _FLEX:
                _FLEX["flex"] = torch.compile(flex_attention)
            bm = flex_block_mask(BlockMask, block_mask, block_size)
            impls["flex"] = Impl("bhsd", lambda q, k, v, causal: _FLEX["flex"](q, k, v, block_mask=bm))
    if "fa4" in names:
        try:
            from torch.nn.attention.flex_attention import BlockMask
            from flash_attn.cute import flash_attn_func as fa4_func
            from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
        except Exception as e:  # not installed, its JIT stack failing to load, or torch < 2.5
            unavailable["fa4"] = "not available: " + short_error(e)
        else:
            impls["fa4"] = fa4_sparse_impl(fa4_func, BlockSparseTensorsTorch,
                                           flex_block_mask(BlockMask, block_mask, block_size), block_size)
    return impls, unavailable


def fa4_sparse_impl(fa4_func, tensors_cls, bm, block_size):
    """FA4's block-sparse call on the blocks of flex's BlockMask bm (every kept block full): the
    forward walks each query block's key blocks (kv_*), its backward each key block's query
    blocks (q_*, which BlockMask.from_kv_blocks derives). Errors of FA4's JIT stack that are not
    RuntimeErrors become them, so measure() records them as this row's error."""
    size = (block_size, block_size)
    fwd = tensors_cls(bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices, block_size=size)
    bwd = tensors_cls(bm.q_num_blocks, bm.q_indices, bm.full_q_num_blocks, bm.full_q_indices, block_size=size)

    def run(q, k, v, causal):
        try:
            out = fa4_func(q, k, v, block_sparse_tensors=fwd, block_sparse_tensors_bwd=bwd)
        except (RuntimeError, ValueError, TypeError, NotImplementedError, AssertionError):
            raise
        except Exception as e:
            raise RuntimeError(f"{type(e).__name__}: {e}") from e
        return out[0] if isinstance(out, tuple) else out
    return Impl("bshd", run)


def sparse_agreement(impls, b, h, n, d, dtype, backward):
    """{peer: {"out": max |peer - flashattn|, and "dq", "dk", "dv" with backward}} on one shared
    input: a peer that read the block mask differently would be timed on another problem, so
    each row records how far every peer's results are from ours (bf16 rounding: ~1e-2)."""
    import torch
    if "flashattn" not in impls:
        return {}
    g = torch.Generator(device="cuda").manual_seed(7)
    q, k, v, do = (torch.randn((b, n, h, d), generator=g, device="cuda", dtype=dtype) for _ in range(4))
    got = {}
    for name, impl in impls.items():
        bhsd = impl.layout == "bhsd"
        grads = backward and impl.backward
        xs = [(x.transpose(1, 2) if bhsd else x).detach().requires_grad_(grads) for x in (q, k, v)]
        try:
            out = impl.fn(*xs, False)
            out = out.transpose(1, 2) if bhsd else out
            res = {"out": out.detach()}
            if grads:
                for label, gr in zip(("dq", "dk", "dv"), torch.autograd.grad(out, xs, do)):
                    res[label] = gr.transpose(1, 2) if bhsd else gr
        except (RuntimeError, ValueError, TypeError, NotImplementedError, AssertionError):
            continue  # measure() records the peer's error
        got[name] = res
    ours = got.get("flashattn", {})
    return {name: {key: (res[key].float() - ours[key].float()).abs().max().item() for key in res if key in ours}
            for name, res in got.items() if name != "flashattn"}


_FLEX = {}  # the compiled flex_attention, made once per process


def flex_block_mask(block_mask_cls, block_mask, block_size):
    """Flex's BlockMask (block_mask_cls: torch's class) holding the kept blocks of a dense
    (b, h, nq, nk) bool table as full blocks: no partial blocks, so no mask_mod runs."""
    import torch
    counts = block_mask.sum(-1, dtype=torch.int32)
    # Kept blocks first (stable order), as Flex's kv_indices lists them.
    indices = torch.argsort(block_mask.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return block_mask_cls.from_kv_blocks(torch.zeros_like(counts), indices, counts, indices,
                                         BLOCK_SIZE=(block_size, block_size))


def run_sparse_suite(rows_cfg, names, repeats, backward, block_size, save=lambda rows: None):
    import torch
    rows = []
    for cfg in rows_cfg:
        d, n = cfg["d"], cfg["n"]
        b, h = sparse_shape(n, d)
        dtype = torch.bfloat16 if cfg["dtype"] == "bf16" else torch.float16
        blocks = -(-n // block_size)
        mask = random_block_mask(b, h, blocks, cfg["density"])
        kept = mask.float().mean().item()
        row = dict(cfg, kind="sparse", batch=b, heads=h, block_size=block_size, kept=kept)
        fl = flops(b, h, n, n, d, False) * kept
        impls, unavailable = sparse_impls(names, mask, block_size)
        row.update({name: {"unavailable": reason} for name, reason in unavailable.items()})
        agree = sparse_agreement(impls, b, h, n, d, dtype, backward)
        for name, impl in impls.items():
            r = measure(impl, name, (b, h, h, n, n, d, False), dtype, backward, repeats)
            row[name] = add_rates(r, fl) if "fwd_ms" in r and fl > 0 else r
            if name in agree:
                row[name]["max_abs_diff_vs_flashattn"] = agree[name]
        rows.append(row)
        save(rows)
        print(format_sparse_row(row), flush=True)
    return rows


def environment():
    import torch
    props = torch.cuda.get_device_properties(0)
    try:
        import flashattn
        version = flashattn.__version__
    except ImportError:
        version = None
    try:
        import triton
        triton_version = triton.__version__
    except Exception:
        triton_version = None
    smi = nvidia_smi()
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "gpu": props.name,
        "sms": props.multi_processor_count,
        "cuda_runtime": torch.version.cuda,
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "flashattn": version,
        "python": platform.python_version(),
        "driver": smi.get("driver_version"),
        "cuda_driver_api": cuda_driver_api_version(),
        "gpu_clock_max_mhz": smi.get("clocks.max.sm"),
        "gpu_power_limit_w": smi.get("power.limit"),
        "compute_capability": f"{props.major}.{props.minor}",
        "gpu_memory_bytes": props.total_memory,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "smem_per_sm_bytes": getattr(props, "shared_memory_per_multiprocessor", None),
        "triton": triton_version,
        "git": git_state(),
        "argv": sys.argv[1:],
    }


def write_json(path, doc):
    """Writes a results document (creating its folder) through a temporary file, so a reader
    never sees half a file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)


def int_list(text):
    return [int(x) for x in text.split(",") if x]


def str_list(text):
    return [x for x in text.split(",") if x]


def float_list(text):
    return [float(x) for x in text.split(",") if x]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", choices=("quick", "issue3", "full", "dsv3", "decode", "sparse", "mla"),
                    help="default quick, or sparse when --block-density is given")
    ap.add_argument("--block-density", type=float_list,
                    help="sparse suite: comma-separated fractions of kept blocks, e.g. 0.1 or 1,0.5,0.1 "
                         "(default 1,0.5,0.25,0.1)")
    ap.add_argument("--block-size", type=int, default=128, help="sparse suite: square block size (default 128)")
    ap.add_argument("--repeats", type=int, default=30, help="timed calls per figure (median), default 30")
    ap.add_argument("--kv-dtype", choices=("bf16", "fp8"), default="bf16",
                    help="decode suite: the kvcache entries' cache dtype (fp8 = e4m3 with per-(batch, kv head) "
                         "descales; kv_tb_per_s then counts 1 byte per element)")
    ap.add_argument("--no-backward", action="store_true", help="forward only")
    ap.add_argument("--out", help="JSON file to write")
    ap.add_argument("--impls", type=str_list, default=list(IMPLS),
                    help="comma-separated peers (default all: %s; the sparse suite: %s; on request: %s)" % (
                        ",".join(IMPLS), ",".join(SPARSE_IMPLS), ",".join(OPT_IN_IMPLS)))
    ap.add_argument("--math-max-seqlen", type=int, default=4096,
                    help="sdpa_math (which stores the Nq x Nk scores) runs only where Nq * Nk <= this^2 (default 4096)")
    ap.add_argument("--dtypes", type=str_list, help="keep only these dtypes of the suite (bf16,fp16)")
    ap.add_argument("--head-dims", type=int_list, help="keep only these head dims of the suite, e.g. 64,128")
    ap.add_argument("--seqlens", type=int_list, help="keep only these seqlens of the suite, e.g. 2048,16384")
    ap.add_argument("--softcap", type=float, default=0.0,
                    help="softcap for flashattn's calls (dev A/Bs of the modifier kernels: the peers skip every "
                         "row; not a bench/results run)")
    ap.add_argument("--gpu-state", action="store_true",
                    help="record the SM clock, power draw, temperature and power-cap state (nvidia-smi) during "
                         "each timed pass, per peer and row (gpu_state in the JSON)")
    ap.add_argument("--timing", choices=("device", "eager"), default="device",
                    help="device (default): GPU execution time, host dispatch hidden behind a GPU sleep; "
                         "eager: the GPU idles while the host dispatches, as formats 1-2 measured")
    args = ap.parse_args()
    if args.suite is None:
        args.suite = "sparse" if args.block_density is not None else "quick"
    if args.suite == "sparse" and args.block_density is None:
        args.block_density = [1.0, 0.5, 0.25, 0.1]
    if args.block_density is not None and args.suite != "sparse":
        ap.error("--block-density belongs to the sparse suite")
    if args.block_size < 1:
        ap.error("--block-size must be >= 1")
    TIMING["mode"] = args.timing
    GPU_STATE["on"] = args.gpu_state
    unknown = sorted(set(args.impls) - set(IMPLS) - set(SPARSE_IMPLS) - set(OPT_IN_IMPLS))
    if unknown:
        ap.error(f"unknown --impls {','.join(unknown)}; choose from {','.join(IMPLS)}")
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    if args.softcap < 0:
        ap.error("--softcap must be >= 0")

    import torch
    try:
        import flashattn
        ours_ok = flashattn.cuda_available()
    except ImportError:
        ours_ok = False
    if not torch.cuda.is_available() or ("flashattn" in args.impls and not ours_ok):
        sys.exit("bench.py needs a CUDA GPU and a flashattn build with the CUDA backend")
    env = environment()
    # The KV-cache entries time decode steps only; the other suites leave them out.
    names = [n for n in args.impls if (n in DECODE_IMPLS if args.suite == "decode" else n not in KVCACHE_IMPLS)]
    if args.suite == "sparse":
        # Peers per row (each row has its own block mask); flex is in by default.
        names = [n for n in SPARSE_IMPLS if n in args.impls or args.impls == list(IMPLS)]
    # The mla suite builds its own entries (mla_entries).
    impls, unavailable = attention_impls([] if args.suite in ("sparse", "mla") else names, args.math_max_seqlen,
                                         args.softcap, args.kv_dtype)
    for name, reason in unavailable.items():
        print(f"{name}: {reason}", flush=True)
    host_us = {}
    for name, impl in impls.items():
        try:
            host_us[name] = round(host_overhead_us(impl), 1)
        except Exception as e:  # a peer without bf16 d64: leave it out
            host_us[name] = short_error(e)
    print("host dispatch per forward call (us): " + ", ".join(f"{n} {v}" for n, v in host_us.items()), flush=True)
    result = {"suite": args.suite, "environment": env, "repeats": args.repeats, "flops": FLOPS_NOTE,
              "rows": [], "format": 3, "timing": TIMING_NOTE,
              "timing_mode": args.timing, "host_overhead_us": host_us,
              "implementations": {n: DESCRIPTIONS[n] for n in impls}, "unavailable": unavailable,
              "math_max_seqlen": args.math_max_seqlen, "complete": False}
    if args.softcap > 0:
        result["softcap"] = args.softcap

    def save(rows, complete=False):
        """Writes the rows so far (a run cut short keeps them, marked "complete": false)."""
        if args.out:
            result.update(rows=rows, complete=complete)
            write_json(args.out, result)

    if args.suite == "mla":
        result["implementations"] = {"flashattn_latent": "flash_attn_with_kvcache, v_cache = k_cache[..., :512]",
                                     "flashattn_latent_paged64": "the same, shuffled pages of 64",
                                     "flashattn_separate_v": "flash_attn_with_kvcache, v_cache a separate tensor",
                                     "torch_bmm": "torch eager bmm-softmax-bmm over the latent cache"}
        rows = run_mla_suite(args.repeats, save)
    elif args.suite == "decode":
        result["kv_dtype"] = args.kv_dtype
        rows = run_decode_suite(impls, args.repeats, save, args.kv_dtype)
    elif args.suite == "sparse":
        result.update(block_size=args.block_size, implementations={n: DESCRIPTIONS[n] for n in names})
        rows_cfg = sparse_rows(args.block_density, args.dtypes, args.head_dims, args.seqlens)
        rows = run_sparse_suite(rows_cfg, names, args.repeats, not args.no_backward, args.block_size, save)
    else:
        rows_cfg = suite_rows(args.suite, args.dtypes, args.head_dims, args.seqlens)
        if not rows_cfg:
            ap.error("the filters leave no row of the suite")
        rows = run_attention_suite(rows_cfg, impls, args.repeats, not args.no_backward, save)
    save(rows, complete=True)
    if args.out:
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
