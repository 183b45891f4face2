"""Reproduces the FlashAttention paper's IO measurement with Nsight Compute's DRAM counters.

    python3 bench/io_repro.py --out bench/results/h200-$(date +%F)-io.json            # GPT-2 setting
    python3 bench/io_repro.py --setting all --out bench/results/h200-$(date +%F)-io.json  # + sweep

What it measures. The paper (Dao et al. 2022, Figure 2 left) reports, for GPT-2 medium attention
(seqlen 1024, head dim 64, 16 heads, batch 64) forward + backward on an A100: standard attention
40.3 GB of HBM reads + writes in 41.7 ms, FlashAttention 4.4 GB in 7.3 ms. This script measures
the same setting (fp16) on this GPU for standard attention (SDPA's math backend, which
materialises the scores), flashattn, and SDPA's flash (FlashAttention-2) and cuDNN backends,
each for one forward ("fwd") and for one forward + backward ("fwdbwd"): GFLOP (DESIGN.md
formula), HBM bytes read and written (dram__bytes_read.sum + dram__bytes_write.sum, summed over
every kernel of the measured call), kernel time (gpu__time_duration.sum, summed) and, outside
the profiler, the call's median time with CUDA events.

How one call is isolated. The script runs itself under ncu as a "--worker profile" process. For
each configuration the worker builds inputs and runs the call twice (warm-up: cuDNN plans, JIT
compiles, lazy module loads), synchronises, then calls cudaProfilerStart, launches a marker
kernel (torch.cuda._sleep) and the measured call, synchronises and calls cudaProfilerStop.
ncu runs with --profile-from-start off, so it profiles only kernels between start and stop; that
window is process-wide, so it also holds the backward kernels that autograd launches from its
own thread (an NVTX push/pop range, which is per thread, would miss them; the worker still opens
one named flashattn_io for the report's timeline). The marker splits the kernels by
configuration, and the script checks that it found exactly one marker per configuration. ncu runs with
--clock-control none (the GPU's own clocks) and --cache-control all (caches flushed before each
kernel: every kernel starts from HBM, as the paper's accounting assumes; --cache-control none
lets L2 carry data between the kernels of one call). cudaMemset/cudaMemcpy are not kernels and
are not counted (the backward's dQ accumulator clear is a memset).

The IO model (--setting sweep or all). The paper's analysis: with SRAM of M elements per SM,
FlashAttention's forward reads K and V once per block of B_r query rows, so it moves
Theta(N d + N^2 d / B_r) elements, and with B_r = Theta(M / d) that is Theta(N^2 d^2 / M)
(Theorem 2); standard attention moves Theta(N d + N^2). flashattn's forward keeps
B_r = block_m query rows per CTA (from src/cuda/common/tile_size.h; the script infers it from
the kernel's grid: grid.x = ceil(N / block_m)), so the model for the bytes its CTAs read is
    B * H * elem_bytes * (N d  [Q]  +  2 ceil(N / block_m) N d  [K and V, once per query block]).
On this GPU those re-reads are served by the L2 cache (tens of MB) rather than HBM, so the sweep
records two measured figures next to the model: DRAM bytes (HBM) and L2 -> SM read bytes
(lts__t_sectors_srcunit_tex_op_read.sum x 32; dropped with a note if this GPU's ncu lacks it;
cp.async loads are counted, TMA loads of sm90 kernels may not be). M = shared memory per SM
(torch's shared_memory_per_multiprocessor) is recorded, and the paper's block choice
B_c = ceil(M / 4d), B_r = min(B_c, d) (M in elements) gives "paper_model_bytes" for comparison.
The sweep: seqlen 512..16384 with batch x seqlen = 65536, 16 heads, head dims 64 and 128, fp16,
forward only by default (--sweep-passes), sdpa_math up to --math-max-seqlen.

Varying the block size. flashattn's block_m is fixed per head dim. The dev override in
tile_size.h (FLASHATTN_DEV_FWD_BM / _BN / _WARPS, used by dev/build.sh and dev/tile_sweep.sh)
applies to every forward kernel when defined, so a Python build with those flags gives other
block sizes (trim head dims and dtypes to keep the build short), e.g. block_m 64:
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install --no-build-isolation --no-deps -q \\
      -Cbuild-dir=build-gpu/python-bm64 -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \\
      -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS="64;128" -Ccmake.define.FLASHATTN_CUDA_DTYPES=fp16 \\
      "-Ccmake.define.CMAKE_CUDA_FLAGS=-DFLASHATTN_DEV_FWD_BM=64 -DFLASHATTN_DEV_FWD_BN=64 -DFLASHATTN_DEV_FWD_WARPS=4" .
    python3 bench/io_repro.py --setting sweep --impls flashattn --tag bm64 \\
      --out bench/results/h200-$(date +%F)-io-bm64.json
then reinstall the normal package (scripts/gpu-check.sh does). block_m must be a multiple of
16 x warps; the inferred block_m in the JSON confirms what ran. The plain build gives the default.

Device time on an H200 (estimates): --setting gpt2 ~2 min, --setting all ~6 min (two Python
processes with torch start-up, ncu replay of ~1000 kernels).

Output: JSON (suite "io") with the environment, the ncu version and command, the paper's figures
(for the table in docs/PERFORMANCE.md) and one row per configuration with per-kernel details.
"""
import argparse
import csv
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
RANGE = "flashattn_io"
MARKER_CYCLES = 1000
BASE_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum")
L2_METRIC = "lts__t_sectors_srcunit_tex_op_read.sum"
L2_SECTOR_BYTES = 32
IMPLS = ("sdpa_math", "flashattn", "sdpa_flash", "sdpa_cudnn")
PAPER = {
    "source": "Dao et al., FlashAttention (NeurIPS 2022), Figure 2 left",
    "gpu": "A100",
    "setting": "GPT-2 medium attention: seqlen 1024, head dim 64, 16 heads, batch 64",
    "pass": "fwd+bwd",
    "standard": {"gflops": 66.6, "hbm_gb": 40.3, "runtime_ms": 41.7},
    "flashattention": {"gflops": 75.2, "hbm_gb": 4.4, "runtime_ms": 7.3},
}
GPT2 = dict(batch=64, heads=16, n=1024, d=64)
SWEEP_TOKENS = 65536
ELEM_BYTES = {"fp16": 2, "bf16": 2}


# ---- plan, model and ncu parsing (no torch) ----------------------------------------------------

def plan(setting, impls, passes, sweep_passes, seqlens, head_dims, math_max_seqlen, dtype="fp16"):
    """The configurations to measure, in order."""
    configs = []
    if setting in ("gpt2", "all"):
        for impl in impls:
            for p in passes:
                configs.append(dict(setting="gpt2-medium", impl=impl, pass_=p, dtype=dtype, causal=False, **GPT2))
    if setting in ("sweep", "all"):
        for d in head_dims:
            for n in seqlens:
                for impl in impls:
                    if impl == "sdpa_math" and n > math_max_seqlen:
                        continue
                    for p in sweep_passes:
                        configs.append(dict(setting="sweep", impl=impl, pass_=p, dtype=dtype, causal=False,
                                            batch=max(1, SWEEP_TOKENS // n), heads=16, n=n, d=d))
    return configs


def gflop(cfg):
    f = 4.0 * cfg["batch"] * cfg["heads"] * cfg["n"] * cfg["n"] * cfg["d"]
    return f * (3.5 if cfg["pass_"] == "fwdbwd" else 1.0) / 1e9


def compulsory_bytes(cfg):
    """Each call's inputs read once and outputs written once: forward reads Q, K, V and writes O
    (4 tensors of B*H*N*d); backward reads Q, K, V, O, dO and writes dQ, dK, dV (8 more)."""
    tensor = cfg["batch"] * cfg["heads"] * cfg["n"] * cfg["d"] * ELEM_BYTES[cfg["dtype"]]
    return tensor * (12 if cfg["pass_"] == "fwdbwd" else 4)


def model(cfg, block_m, smem_per_sm):
    """Forward read model with flashattn's block_m, and the paper's block choice for SRAM M."""
    if cfg["pass_"] != "fwd":
        return None
    s = ELEM_BYTES[cfg["dtype"]]
    b, h, n, d = cfg["batch"], cfg["heads"], cfg["n"], cfg["d"]
    out = {}
    if block_m:
        passes = math.ceil(n / block_m)
        out["kv_passes"] = passes
        out["l2_read_bytes"] = b * h * s * (n * d + 2 * passes * n * d)
    if smem_per_sm:
        m_elems = smem_per_sm // s
        b_c = math.ceil(m_elems / (4 * d))
        b_r = min(b_c, d)
        out["paper_block"] = {"B_c": b_c, "B_r": b_r, "M_bytes": smem_per_sm}
        # Q read and O written once, K and V read once per query block (Algorithm 1's IO).
        out["paper_model_bytes"] = b * h * s * (2 * n * d + 2 * math.ceil(n / b_r) * n * d)
    return out


_UNIT_SCALE = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
               "nsecond": 1, "ns": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9,
               "sector": 1, "": 1}


def _number(text, unit=""):
    """A metric value in base units (bytes, ns, counts); raises ValueError for a value or unit
    this script does not know (the caller keeps those aside)."""
    text = (text or "").replace(",", "").strip()
    if text in ("", "n/a", "N/A"):
        return None
    scale = _UNIT_SCALE.get(unit.strip().lower())
    if scale is None:
        raise ValueError(f"unknown ncu unit {unit!r}")
    return float(text) * scale


def _store(kernel, name, text, unit):
    try:
        kernel["metrics"][name] = _number(text, unit)
    except ValueError:  # e.g. launch__* columns in units like "register/thread": not needed here
        kernel.setdefault("unparsed", {})[name] = f"{text} {unit}".strip()


def parse_ncu_csv(text):
    """Kernels of an `ncu --import R --csv --page raw` export, in launch order:
    [{"id", "name", "grid", "block", "metrics": {metric: value in bytes / ns / count}}].
    Also accepts the long "details" page (one row per metric: Metric Name/Unit/Value)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no ncu CSV header (a line starting with \"ID\") in the ncu output")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header = rows[0]
    col = {name: i for i, name in enumerate(header)}
    kernels = {}
    order = []

    def kernel(row):
        kid = row[col["ID"]]
        if kid not in kernels:
            kernels[kid] = {"id": int(kid), "name": row[col["Kernel Name"]],
                            "grid": row[col["Grid Size"]] if "Grid Size" in col else None,
                            "block": row[col["Block Size"]] if "Block Size" in col else None, "metrics": {}}
            order.append(kid)
        return kernels[kid]

    if "Metric Name" in col:  # details page
        for row in rows[1:]:
            if len(row) < len(header) or not row[col["ID"]].strip():
                continue
            _store(kernel(row), row[col["Metric Name"]], row[col["Metric Value"]], row[col["Metric Unit"]])
    else:  # raw page: a units row, then one row per kernel
        has_units = len(rows) > 1 and len(rows[1]) == len(header) and not rows[1][col["ID"]].strip()
        units = rows[1] if has_units else [""] * len(header)
        body = rows[2:] if has_units else rows[1:]
        metric_cols = [name for name in header if "__" in name]
        for row in body:
            if len(row) < len(header) or not row[col["ID"]].strip():
                continue
            k = kernel(row)
            for name in metric_cols:
                _store(k, name, row[col[name]], units[col[name]])
    return [kernels[k] for k in sorted(order, key=int)]


def split_by_marker(kernels, count):
    """Groups kernels after each marker: the first profiled kernel is a marker by construction,
    and every kernel of that name starts a group. Raises unless there are exactly `count`."""
    if not kernels:
        raise ValueError("ncu profiled no kernel between cudaProfilerStart and cudaProfilerStop")
    marker = kernels[0]["name"]
    groups = []
    for k in kernels:
        if k["name"] == marker:
            groups.append([])
        else:
            groups[-1].append(k)
    if len(groups) != count:
        raise ValueError(f"found {len(groups)} marker kernels ({marker!r}) for {count} configurations")
    return marker, groups


def infer_block_m(cfg, kernels):
    """flashattn forward: grid.x = ceil(seqlen_q / block_m), so block_m is the smallest power of
    two >= seqlen_q / grid.x among 16..256 that gives that grid.x; None if not found."""
    for k in kernels:
        if "fwd_kernel" not in k["name"] or not k.get("grid"):
            continue
        try:
            gx = int(k["grid"].strip("()").split(",")[0])
        except ValueError:
            continue
        for bm in (16, 32, 64, 128, 256):
            if math.ceil(cfg["n"] / bm) == gx:
                return bm
    return None


def metric(kernel, name):
    """One kernel's value of a metric this script needs; raises if ncu did not report it."""
    value = kernel["metrics"].get(name)
    if value is None:
        seen = kernel.get("unparsed", {}).get(name)
        raise ValueError(f"ncu reported no usable {name} for kernel {kernel['id']} ({kernel['name'][:80]})"
                         + (f": {seen!r}" if seen else ""))
    return value


def summarize(cfg, kernels, smem_per_sm, l2_metric):
    total = {m: sum(metric(k, m) for k in kernels) for m in BASE_METRICS}
    row = {
        "dram_read_bytes": total["dram__bytes_read.sum"],
        "dram_write_bytes": total["dram__bytes_write.sum"],
        "kernel_time_ms": total["gpu__time_duration.sum"] / 1e6,
        "kernels": [{"name": k["name"][:300], "grid": k["grid"], "block": k["block"],
                     "dram_read_bytes": k["metrics"].get("dram__bytes_read.sum"),
                     "dram_write_bytes": k["metrics"].get("dram__bytes_write.sum"),
                     "time_ns": k["metrics"].get("gpu__time_duration.sum"),
                     **({"l2_read_bytes": (k["metrics"].get(l2_metric) or 0.0) * L2_SECTOR_BYTES} if l2_metric else {})}
                    for k in kernels],
    }
    if l2_metric:
        row["l2_read_bytes"] = sum(metric(k, l2_metric) for k in kernels) * L2_SECTOR_BYTES
    if cfg["impl"] == "flashattn":  # the model is about this library's kernel and its block_m
        block_m = infer_block_m(cfg, kernels)
        if block_m:
            row["block_m"] = block_m
        m = model(cfg, block_m, smem_per_sm)
        if m:
            row["model"] = m
    return row


def public(cfg):
    """A configuration as it appears in the JSON ("pass" instead of the internal "pass_")."""
    out = {k: v for k, v in cfg.items() if k != "pass_"}
    out["pass"] = cfg["pass_"]
    return out


# ---- worker (runs the calls; torch) ------------------------------------------------------------

def worker(plan_path, mode, result_path, repeats):
    import torch
    sys.path.insert(0, HERE)
    import bench

    with open(plan_path) as f:
        configs = json.load(f)
    names = sorted({c["impl"] for c in configs})
    impls, unavailable = bench.attention_impls(names, math_max_seqlen=1 << 30)  # io_repro's plan caps math
    result = {"status": [], "event_ms": []}
    if mode == "time":
        result["environment"] = bench.environment()
        props = torch.cuda.get_device_properties(0)
        result["smem_per_sm_bytes"] = getattr(props, "shared_memory_per_multiprocessor", None)
    for cfg in configs:
        impl = impls.get(cfg["impl"])
        status, event_ms, call = "ok", None, None
        try:
            if impl is None:
                raise RuntimeError(unavailable.get(cfg["impl"], "implementation not available"))
            call = make_call(torch, impl, cfg)
            call()
            call()
            torch.cuda.synchronize()
        except Exception as e:  # keep going: one configuration failing must not stop the others
            status, call = "error: " + bench.short_error(e), None
        if mode == "profile":
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            torch.cuda.nvtx.range_push(RANGE)
            torch.cuda._sleep(MARKER_CYCLES)  # marker kernel: starts this configuration's group
            if call is not None:
                try:
                    call()
                except Exception as e:
                    status = "error: " + bench.short_error(e)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
            torch.cuda.profiler.stop()
        elif call is not None:
            try:
                event_ms = bench.median_ms(call, repeats)
            except Exception as e:
                status = "error: " + bench.short_error(e)
        result["status"].append(status)
        result["event_ms"].append(event_ms)
        print(f"{mode} {public(cfg)}: {status}" + (f" {event_ms:.3f} ms" if event_ms else ""), flush=True)
        del call
        torch.cuda.empty_cache()
    with open(result_path, "w") as f:
        json.dump(result, f)


def make_call(torch, impl, cfg):
    """A closure running one forward (no autograd) or one forward + backward of cfg."""
    b, h, n, d = cfg["batch"], cfg["heads"], cfg["n"], cfg["d"]
    dtype = torch.float16 if cfg["dtype"] == "fp16" else torch.bfloat16
    shape = (b, n, h, d) if impl.layout == "bshd" else (b, h, n, d)
    backward = cfg["pass_"] == "fwdbwd"
    if backward and not impl.backward:
        raise RuntimeError("forward only")
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, requires_grad=backward) for _ in range(3))
    if not backward:
        def fwd():
            with torch.no_grad():
                impl.fn(q, k, v, cfg["causal"])
        return fwd
    dout = torch.randn(shape, device="cuda", dtype=dtype)

    def fwdbwd():
        torch.autograd.grad(impl.fn(q, k, v, cfg["causal"]), (q, k, v), dout)
    return fwdbwd


# ---- orchestrator ------------------------------------------------------------------------------

def run(cmd, **kwargs):
    print("+ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, **kwargs)


def ncu_has_metric(ncu, metric):
    """Whether ncu lists the metric's base name for this GPU."""
    base = metric.rsplit(".", 1)[0]
    for cmd in ([ncu, "--query-metrics", "--query-metrics-mode", "all"], [ncu, "--query-metrics"]):
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode == 0:
            return base in out.stdout
    return False


def main():
    sys.path.insert(0, HERE)
    import bench  # write_json; bench.py imports torch only inside its functions

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="JSON file to write (e.g. bench/results/h200-DATE-io.json)")
    ap.add_argument("--setting", choices=("gpt2", "sweep", "all"), default="gpt2",
                    help="gpt2: the paper's GPT-2-medium setting; sweep: seqlen x head dim; all: both")
    ap.add_argument("--impls", default=",".join(IMPLS), help="comma-separated (default %s)" % ",".join(IMPLS))
    ap.add_argument("--passes", default="fwd,fwdbwd", help="passes at the GPT-2 setting (default fwd,fwdbwd)")
    ap.add_argument("--sweep-passes", default="fwd", help="passes in the sweep (default fwd)")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384", help="sweep seqlens")
    ap.add_argument("--head-dims", default="64,128", help="sweep head dims")
    ap.add_argument("--math-max-seqlen", type=int, default=4096, help="longest sweep seqlen for sdpa_math")
    ap.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16", help="default fp16, as the paper")
    ap.add_argument("--repeats", type=int, default=30, help="timed calls for the event timing (median)")
    ap.add_argument("--ncu", default=os.environ.get("NCU", "ncu"), help="Nsight Compute CLI (default ncu, or $NCU)")
    ap.add_argument("--cache-control", choices=("all", "none"), default="all",
                    help="ncu --cache-control: all flushes caches before each kernel (default)")
    ap.add_argument("--no-l2", action="store_true", help=f"do not collect {L2_METRIC}")
    ap.add_argument("--tag", help="label stored in the JSON (e.g. the tile build: bm64)")
    ap.add_argument("--keep-report", help="folder to keep the .ncu-rep report in (default: deleted)")
    ap.add_argument("--worker", choices=("profile", "time"), help=argparse.SUPPRESS)
    ap.add_argument("--plan", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        worker(args.plan, args.worker, args.result, args.repeats)
        return
    if not args.out:
        ap.error("--out is required")
    impls = [x for x in args.impls.split(",") if x]
    unknown = set(impls) - set(IMPLS)
    if unknown:
        ap.error(f"unknown --impls {','.join(sorted(unknown))}; choose from {','.join(IMPLS)}")
    passes = [p for p in args.passes.split(",") if p]
    sweep_passes = [p for p in args.sweep_passes.split(",") if p]
    if set(passes + sweep_passes) - {"fwd", "fwdbwd"}:
        ap.error("passes are fwd and fwdbwd")
    ncu = shutil.which(args.ncu)
    if not ncu:
        sys.exit(f"io_repro.py needs Nsight Compute: {args.ncu!r} not found (set --ncu or $NCU)")
    configs = plan(args.setting, impls, passes, sweep_passes, [int(x) for x in args.seqlens.split(",") if x],
                   [int(x) for x in args.head_dims.split(",") if x], args.math_max_seqlen, args.dtype)

    metrics = list(BASE_METRICS)
    l2_metric = None
    notes = []
    if not args.no_l2:
        if ncu_has_metric(ncu, L2_METRIC):
            l2_metric = L2_METRIC
            metrics.append(L2_METRIC)
        else:
            notes.append(f"{L2_METRIC} not offered by this ncu/GPU: no L2 figures")
    tmp = tempfile.mkdtemp(prefix="io_repro-")
    plan_path = os.path.join(tmp, "plan.json")
    with open(plan_path, "w") as f:
        json.dump(configs, f)
    me = [sys.executable, os.path.abspath(__file__), "--plan", plan_path, "--repeats", str(args.repeats)]

    # 1. Timing and environment, without the profiler.
    timed_path = os.path.join(tmp, "time.json")
    if run(me + ["--worker", "time", "--result", timed_path]).returncode != 0:
        sys.exit("the timing worker failed (output above)")
    with open(timed_path) as f:
        timed = json.load(f)

    # 2. The same calls under ncu, only the cudaProfilerStart/Stop windows profiled.
    report_dir = args.keep_report or tmp
    os.makedirs(report_dir, exist_ok=True)
    report = os.path.join(report_dir, "io_repro")
    ncu_cmd = [ncu, "--target-processes", "all", "--profile-from-start", "off",
               "--clock-control", "none", "--cache-control", args.cache_control,
               "--metrics", ",".join(metrics), "-f", "-o", report]
    profiled_path = os.path.join(tmp, "profile.json")
    if run(ncu_cmd + me + ["--worker", "profile", "--result", profiled_path]).returncode != 0:
        sys.exit("ncu or the profiling worker failed (output above)")
    with open(profiled_path) as f:
        profiled = json.load(f)
    export = run([ncu, "--import", report + ".ncu-rep", "--csv", "--page", "raw", "--print-units", "base"],
                 capture_output=True, text=True)
    if export.returncode != 0:
        sys.exit(f"ncu --import failed:\n{export.stderr}")
    kernels = parse_ncu_csv(export.stdout)
    marker, groups = split_by_marker(kernels, len(configs))

    ncu_version = subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    smem = timed.get("smem_per_sm_bytes")
    rows = []
    for cfg, group, t_status, p_status, event_ms in zip(configs, groups, timed["status"], profiled["status"],
                                                         timed["event_ms"]):
        row = public(cfg)
        row.update(gflop=gflop(cfg), compulsory_bytes=compulsory_bytes(cfg))
        status = p_status if p_status != "ok" else t_status
        if status != "ok":
            row["error"] = status[len("error: "):] if status.startswith("error: ") else status
        else:
            row.update(summarize(cfg, group, smem, l2_metric))
            row["event_ms"] = event_ms
        rows.append(row)
        if "error" in row:
            print(f"{row['setting']} {row['impl']} {row['pass']} N{row['n']} d{row['d']}: {row['error']}")
        else:
            hbm = (row["dram_read_bytes"] + row["dram_write_bytes"]) / 1e9
            print(f"{row['setting']} {row['impl']} {row['pass']} B{row['batch']} N{row['n']} d{row['d']}: "
                  f"HBM {hbm:.3f} GB (compulsory {row['compulsory_bytes'] / 1e9:.3f}), kernels "
                  f"{row['kernel_time_ms']:.3f} ms, events {event_ms:.3f} ms"
                  + (f", L2->SM {row['l2_read_bytes'] / 1e9:.3f} GB" if "l2_read_bytes" in row else ""))
    result = {
        "suite": "io",
        "environment": timed.get("environment", {}),
        "ncu": {"version": ncu_version[-1] if ncu_version else None, "command": ncu_cmd[:-2],
                "metrics": metrics, "cache_control": args.cache_control, "clock_control": "none",
                "marker_kernel": marker, "notes": notes},
        "tag": args.tag,
        "smem_per_sm_bytes": smem,
        "paper": PAPER,
        "flops": "fwd 4*B*H*N^2*d, fwdbwd 3.5x fwd (GFLOP)",
        "compulsory": "fwd: Q, K, V read + O written; fwdbwd: + Q, K, V, O, dO read + dQ, dK, dV written",
        "rows": rows,
    }
    bench.write_json(args.out, result)
    print(f"wrote {args.out}")
    if not args.keep_report:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
