"""Renders PNG plots from benchmark results JSON (bench.py, io_repro.py, memory.py).

    python3 bench/plot.py bench/results/*.json --outdir docs/plots

One figure per (dtype, head dim, mask, pass) of an attention suite: TFLOP/s vs seqlen, one line
per implementation (pass = fwd, bwd or fwdbwd; fwdbwd only where the run measured it); for the
block-sparse suite, time per call vs block density (forward and backward side by side) with each
implementation's ideal line (its time at the densest row scaled by density); a bar chart of
KV-cache bandwidth for a decode suite; peak memory vs seqlen for memory.py; HBM bytes for
io_repro.py. Every figure's title names its run (GPU, date) and its footer the versions and the
results file. Files are named <results file stem>-<what>.png, so a plot never mixes runs.
Files of other kinds (e.g. cpu_vs_torch.py's) are skipped with a note.

matplotlib is imported only when plotting; the readers below (shared with
scripts/gen_performance.py) need nothing beyond the standard library.
"""
import argparse
import io
import json
import os
import sys
import textwrap

# Implementations in display order, with labels for tables and legends.
IMPL_ORDER = ("flashattn", "kvcache", "kvcache_paged16", "varlen_paged16", "sdpa_cudnn", "sdpa_flash", "fa4", "sdpa_efficient", "sdpa_math",
              "triton")
IMPL_LABELS = {
    "flashattn": "flashattn (ours)",
    "sdpa_cudnn": "SDPA cuDNN",
    "sdpa_flash": "SDPA flash (FA2)",
    "fa4": "FlashAttention-4",
    "sdpa_efficient": "SDPA mem-efficient",
    "sdpa_math": "SDPA math (standard)",
    "triton": "Triton (bench/triton_attention.py)",
    "kvcache": "ours, flash_attn_with_kvcache (dense cache)",
    "kvcache_paged16": "ours, flash_attn_with_kvcache (paged, 16-row pages)",
    "varlen_paged16": "ours, flash_attn_varlen_func with block_table (16-row pages)",
}
IMPL_COLORS = {"flashattn": "#d62728", "kvcache": "#e377c2", "kvcache_paged16": "#bcbd22", "varlen_paged16": "#17a589", "sdpa_cudnn": "#2ca02c", "sdpa_flash": "#1f77b4", "fa4": "#8c564b",
               "sdpa_efficient": "#ff7f0e", "sdpa_math": "#7f7f7f", "triton": "#9467bd"}
# Legends only: the tables keep IMPL_LABELS (their headers name these two by their raw keys).
# HBM bandwidth of the GPUs the decode plots name, TB/s, from NVIDIA's data sheets (H200 SXM:
# 4.8; H100 SXM: 3.35): the line drawn on the decode bandwidth plots.
HBM_PEAK_TBS = {"NVIDIA H200": 4.8, "NVIDIA H100 80GB HBM3": 3.35}
LEGEND_LABELS = dict(IMPL_LABELS, flashattn_fp8="flashattn FP8 e4m3 (ours)", flex="FlexAttention (torch.compile)")
IMPL_COLORS.update(flashattn_fp8="#ff9896", flex="#17becf")
FP8_CACHE_LABELS = {"kvcache": "ours, with_kvcache, dense e4m3 cache",
                    "kvcache_paged16": "ours, with_kvcache, paged (16) e4m3 cache"}
PASSES = (("fwd", "forward"), ("bwd", "backward"), ("fwdbwd", "forward + backward"))


# ---- readers (no third-party imports) ----------------------------------------------------------

def load(path):
    with open(path) as f:
        return json.load(f)


def kind(doc):
    """"attention", "decode", "mla", "spec_decode", "io", "memory", "cpu_vs_torch", or None for an
    unknown file."""
    if not isinstance(doc, dict):
        return None
    suite = doc.get("suite")
    rows = doc.get("rows")
    if suite in ("io", "memory"):
        return suite
    if isinstance(rows, list) and rows and all(isinstance(r, dict) for r in rows):
        if all(r.get("kind") == "decode" for r in rows):
            return "decode"
        if all(r.get("kind") == "mla" for r in rows):
            return "mla"
        if all(r.get("kind") == "spec_decode" for r in rows):  # dev/spec_decode_probe.py
            return "spec_decode"
        if all("n" in r and "d" in r and "dtype" in r for r in rows):
            return "attention"
    if "cpu_model" in doc and isinstance(doc.get("results"), list):
        return "cpu_vs_torch"
    return None


def plot_kind(doc):
    """kind(), with the block-sparse suite apart: its rows are attention rows (same tables) that
    differ only in density, so they get a time-vs-density figure instead of TFLOP/s vs seqlen."""
    k = kind(doc)
    if k == "attention" and all(r.get("kind") == "sparse" for r in doc["rows"]):
        return "sparse"
    return k


def cudnn_version(v):
    """torch.backends.cudnn.version() as text: 91900 -> 9.19.0, 8907 -> 8.9.7."""
    if not isinstance(v, int):
        return None if v is None else str(v)
    if v >= 10000:
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}"
    return f"{v // 1000}.{v // 100 % 10}.{v % 100}"


def run_info(doc):
    """{"device", "date", "versions"} of one results file (GPU runs and cpu_vs_torch runs)."""
    if kind(doc) == "cpu_vs_torch":
        return {"device": f"{doc.get('cpu_model', '?')} ({doc.get('cpu_count', '?')} CPUs)",
                "date": str(doc.get("date_utc", "?"))[:10],
                "versions": f"torch {doc.get('torch_version', '?')}, {doc.get('torch_cpu_capability', '?')}"}
    env = doc.get("environment", {})
    parts = []
    for key, label in (("torch", "torch"), ("cuda_runtime", "CUDA"), ("cudnn", "cuDNN"), ("driver", "driver"),
                       ("flashattn", "flashattn"), ("triton", "Triton")):
        value = cudnn_version(env.get(key)) if key == "cudnn" else env.get(key)
        if value:
            parts.append(f"{label} {value}")
    git = env.get("git") or {}
    if git.get("commit"):
        parts.append(f"commit {git['commit'][:10]}{' (dirty)' if git.get('dirty') else ''}")
    return {"device": env.get("gpu", "?"), "date": str(env.get("date_utc", "?"))[:10], "versions": ", ".join(parts)}


def run_title(doc, path):
    info = run_info(doc)
    return f"{info['device']}, {info['date']}", f"{info['versions']}; {os.path.basename(path)}"


def impls_in(rows):
    """Implementations present in any row, in display order (unknown names last, sorted)."""
    names = {k for r in rows for k, v in r.items() if isinstance(v, dict)}
    return [n for n in IMPL_ORDER if n in names] + sorted(names - set(IMPL_ORDER))


def figure(r, key):
    """A peer's figure from a row entry, or None when it was not measured."""
    value = r.get(key) if isinstance(r, dict) else None
    return value if isinstance(value, (int, float)) else None


def attention_groups(rows):
    """{(dtype, d, causal): [rows sorted by n]}, in a stable order."""
    groups = {}
    for r in rows:
        groups.setdefault((r["dtype"], r["d"], bool(r["causal"])), []).append(r)
    return {k: sorted(groups[k], key=lambda r: r["n"]) for k in sorted(groups, key=lambda k: (k[0], k[1], k[2]))}


def attention_plots(rows):
    """[(dtype, d, causal, pass key, group rows)] that have at least one figure, in display order."""
    out = []
    for (dtype, d, causal), group in attention_groups(rows).items():
        for key, _ in PASSES:
            if any(figure(r.get(n), f"{key}_tflops") is not None for r in group for n in impls_in(group)):
                out.append((dtype, d, causal, key, group))
    return out


def sparse_density(r):
    """The fraction of blocks a sparse row kept (the mask's own count; the requested one if absent)."""
    return r.get("kept", r["density"])


def sparse_groups(rows):
    """{(dtype, d, n, causal, block_size): [rows, densest first]}, in a stable order."""
    groups = {}
    for r in rows:
        groups.setdefault((r["dtype"], r["d"], r["n"], bool(r["causal"]), r.get("block_size")), []).append(r)
    return {k: sorted(groups[k], key=sparse_density, reverse=True) for k in sorted(groups, key=str)}


def sparse_passes(rows):
    """The passes of a sparse group that have a time, of forward and backward (fwdbwd is their sum)."""
    return [(key, name) for key, name in PASSES[:2]
            if any(figure(r.get(n), f"{key}_ms") is not None for r in rows for n in impls_in(rows))]


def sparse_png(stem, key):
    dtype, d, n, causal, block = key
    return f"{stem}-{dtype}-d{d}-n{n}-{'causal' if causal else 'full'}-block{block}-density.png"


def png_names(doc, path):
    """The PNG file names plot.py writes for one results file, in display order."""
    stem = os.path.splitext(os.path.basename(path))[0]
    k = plot_kind(doc)
    if k == "sparse":
        return [sparse_png(stem, key) for key, rows in sparse_groups(doc["rows"]).items() if sparse_passes(rows)]
    if k == "attention":
        return [f"{stem}-{dtype}-d{d}-{'causal' if causal else 'full'}-{key}.png"
                for dtype, d, causal, key, _ in attention_plots(doc["rows"])]
    if k == "decode":
        rows = doc["rows"]
        return [f"{stem}-decode{suffix}.png" for key, suffix in (("kv_tb_per_s", ""), ("kv_tb_per_s_graph", "-graph"))
                if any(figure(r.get(n), key) is not None for r in rows for n in impls_in(rows))]
    if k == "memory":
        return [f"{stem}-memory.png"] if any(r.get("status") == "ok" for r in doc["rows"]) else []
    if k == "io":
        rows = [r for r in doc["rows"] if "dram_read_bytes" in r]
        names = []
        if any(r.get("setting") == "gpt2-medium" for r in rows):
            names.append(f"{stem}-io-gpt2.png")
        if any(r.get("setting") == "sweep" and r["impl"] == "flashattn" and r["pass"] == "fwd" for r in rows):
            names.append(f"{stem}-io-sweep.png")
        return names
    return []


# ---- plots -------------------------------------------------------------------------------------

def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _finish(plt, fig, title, footer, path):
    width_in, height_in = fig.get_size_inches()
    # Characters per inch of width that fit at these font sizes (measured on the rendered PNGs,
    # with a margin); past them the text runs off the image's edge.
    if len(title) > width_in * 11 and ": " in title:
        title = title.replace(": ", "\n", 1)
    footer = textwrap.wrap(footer, width=int(width_in * 19)) or [""]
    fig.suptitle(title, fontsize=11)
    fig.text(0.01, 0.005, "\n".join(footer), fontsize=6.5, color="#555555", ha="left", va="bottom")
    fig.tight_layout(rect=(0, (0.03 + 0.11 * len(footer)) / height_in, 1, 1))
    # The PNGs are committed: 100 dpi and a 256-colour palette (line art on white loses nothing
    # visible) keep each at a few tens of KB instead of ~90 KB of RGBA.
    buf = io.BytesIO()
    fig.savefig(buf, dpi=100)
    plt.close(fig)
    from PIL import Image  # matplotlib's own dependency
    buf.seek(0)
    with Image.open(buf) as img:
        img.convert("RGB").quantize(colors=256).save(path, optimize=True)


def plot_attention(doc, path, outdir):
    """TFLOP/s vs seqlen; one PNG per (dtype, d, mask, pass). Returns [(png, title)]."""
    plt = _pyplot()
    stem = os.path.splitext(os.path.basename(path))[0]
    run, footer = run_title(doc, path)
    written = []
    pass_names = dict(PASSES)
    for dtype, d, causal, key, rows in attention_plots(doc["rows"]):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for name in impls_in(rows):
            pts = [(r["n"], figure(r.get(name), f"{key}_tflops")) for r in rows]
            pts = [(n, y) for n, y in pts if y is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=LEGEND_LABELS.get(name, name),
                        color=IMPL_COLORS.get(name), linewidth=2.2 if name == "flashattn" else 1.4)
        ax.set_xscale("log", base=2)
        ns = sorted({r["n"] for r in rows})
        ax.set_xticks(ns)
        ax.set_xticklabels([f"{n // 1024}k" if n >= 1024 else str(n) for n in ns])
        tokens = {r["batch"] * r["n"] for r in rows}
        ax.set_xlabel("sequence length" + (f" (batch x seqlen = {tokens.pop()})" if len(tokens) == 1 else ""))
        ax.set_ylabel(f"{pass_names[key]} TFLOP/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        mask = "causal" if causal else "full"
        title = f"{pass_names[key]}, {dtype}, head dim {d}, {mask} mask, {rows[0]['heads']} heads: {run}"
        png = os.path.join(outdir, f"{stem}-{dtype}-d{d}-{mask}-{key}.png")
        _finish(plt, fig, title, footer, png)
        written.append((png, title))
    return written


def _fraction(x):
    return f"{x:.3g}"


def plot_sparse(doc, path, outdir):
    """Time per call vs block density, forward and backward side by side, one PNG per shape.
    Log-log axes: time proportional to density is a line of slope 1, so each implementation's
    dashed ideal (its densest time x density / densest density) shows how far it is from
    skipping work in proportion; the sparsest point is labelled with measured / ideal."""
    plt = _pyplot()
    from matplotlib import ticker
    stem = os.path.splitext(os.path.basename(path))[0]
    run, footer = run_title(doc, path)
    written = []
    for key, rows in sparse_groups(doc["rows"]).items():
        passes = sparse_passes(rows)
        if not passes:
            continue
        dtype, d, n, causal, block = key
        fig, axes = plt.subplots(1, len(passes), figsize=(4.6 * len(passes), 4.3), squeeze=False)
        densities = [sparse_density(r) for r in rows]
        for ax, (pass_key, pass_name) in zip(axes[0], passes):
            for name in impls_in(rows):
                pts = [(sparse_density(r), figure(r.get(name), f"{pass_key}_ms")) for r in rows]
                pts = [(x, y) for x, y in pts if y is not None]
                if not pts:
                    continue
                color = IMPL_COLORS.get(name)
                label = LEGEND_LABELS.get(name, name)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=color, label=label,
                        linewidth=2.2 if name == "flashattn" else 1.4)
                x0, y0 = pts[0]
                ideal = [(x, y0 * x / x0) for x, _ in pts]
                scale = "density" if x0 == 1 else f"density / {_fraction(x0)}"
                ax.plot([p[0] for p in ideal], [p[1] for p in ideal], linestyle="--", color=color, linewidth=1,
                        alpha=0.8, label=f"ideal: {y0:.3g} ms x {scale}")
                # Left of each point: on log-log axes every line leaves a point towards the lower
                # left and the upper right, so the space level with it on the left is free.
                for i, (x, y) in enumerate(pts):
                    text = f"{y:.3g} ms"
                    if i and i == len(pts) - 1:
                        text += f"\n{y / (y0 * x / x0):.2f}x ideal"
                    ax.annotate(text, (x, y), textcoords="offset points", xytext=(-7, 0), fontsize=7,
                                color=color, ha="right", va="center")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xticks(densities)
            ax.set_xticklabels([_fraction(x) for x in densities])
            # Plain numbers at 1-2-5 steps: decades alone leave a one-decade axis with one label.
            ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1, 2, 5)))
            ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda y, _: f"{y:g}"))
            ax.minorticks_off()
            ax.set_xlim(min(densities) / 2.2, max(densities) * 1.3)
            ax.set_xlabel(f"block density (fraction of {block}x{block} blocks kept)")
            ax.set_ylabel(f"{pass_name} time per call, ms (log)")
            ax.set_title(pass_name, fontsize=9)
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=7, loc="upper left")
        r0 = rows[0]
        title = (f"block-sparse {dtype}, d{d}, N {n}, batch {r0['batch']} x {r0['heads']} heads, "
                 f"{'causal' if causal else 'no causal mask'}: {run}")
        png = os.path.join(outdir, sparse_png(stem, key))
        _finish(plt, fig, title, footer, png)
        written.append((png, title))
    return written


def plot_decode(doc, path, outdir):
    """Grouped bars: effective KV-cache bandwidth per decode shape and implementation; a second
    figure from the CUDA-graph replay figures when the run has them. A run with an e4m3 cache
    (kv_dtype fp8) times calls that read different bytes (the kvcache peers read 1-byte
    elements, the others bf16), so its bars are speed against SDPA cuDNN instead (time ratio),
    as in the page's table."""
    plt = _pyplot()
    stem = os.path.splitext(os.path.basename(path))[0]
    run, footer = run_title(doc, path)
    rows = doc["rows"]
    names = impls_in(rows)
    speed = doc.get("kv_dtype") == "fp8" and "sdpa_cudnn" in names
    written = []
    for key, time_key, suffix, how in (("kv_tb_per_s", "fwd_ms", "", "per-call CUDA events"),
                                       ("kv_tb_per_s_graph", "fwd_ms_graph", "-graph", "CUDA graph replay")):
        if not any(figure(r.get(n), key) is not None for r in rows for n in names):
            continue
        fig, ax = plt.subplots(figsize=(8.5, 4.2))
        width = 0.8 / max(1, len(names))
        top = 0
        for i, name in enumerate(names):
            xs, ys = [], []
            for j, r in enumerate(rows):
                if speed:
                    ms, base = figure(r.get(name), time_key), figure(r.get("sdpa_cudnn"), time_key)
                    y = None if ms is None or base is None else base / ms
                else:
                    y = figure(r.get(name), key)
                if y is not None:
                    xs.append(j + (i - (len(names) - 1) / 2) * width)
                    ys.append(y)
                    top = max(top, y)
            label = (FP8_CACHE_LABELS if speed else {}).get(name) or LEGEND_LABELS.get(name, name)
            ax.bar(xs, ys, width, label=label, color=IMPL_COLORS.get(name))
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([f"b{r['batch']}\n{r['seqlen_k'] // 1024}k" for r in rows])
        ax.set_xlabel("batch, KV length")
        if speed:
            ax.axhline(1, color="#555555", linewidth=0.8)
            ax.set_ylabel("speed vs SDPA cuDNN (bf16 cache)\n= its time / this time")
        else:
            ax.set_ylabel("KV cache read, TB/s")
            # The GPU's HBM bandwidth from its data sheet (issue 17 asks for the line), not measured.
            peak = HBM_PEAK_TBS.get(doc.get("environment", {}).get("gpu"))
            if peak:
                ax.axhline(peak, color="#333333", linewidth=0.9, linestyle="--",
                           label=f"HBM peak, data sheet ({peak} TB/s)")
                top = max(top, peak)
        # Headroom above the tallest bar for a two-column legend, which would otherwise hide bars.
        ax.set_ylim(0, top * 1.3)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, ncol=2, loc="upper left")
        r0 = rows[0]
        cache = ", kvcache bars on an e4m3 cache" if speed else ""
        title = (f"decode, {r0['heads']} q heads / {r0['heads_k']} KV heads, d{r0['d']}, {r0['dtype']}{cache}, "
                 f"{how}: {run}")
        png = os.path.join(outdir, f"{stem}-decode{suffix}.png")
        _finish(plt, fig, title, footer, png)
        written.append((png, title))
    return written


def plot_memory(doc, path, outdir):
    """Memory one forward + backward needs beyond what was allocated before it (the run's
    extra_bytes) vs seqlen, one line per implementation."""
    plt = _pyplot()
    stem = os.path.splitext(os.path.basename(path))[0]
    run, footer = run_title(doc, path)
    cfg = doc.get("config", {})
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    rows = doc["rows"]
    for name in [n for n in IMPL_ORDER if any(r["impl"] == n for r in rows)] + \
            sorted({r["impl"] for r in rows} - set(IMPL_ORDER)):
        ok = sorted((r["n"], r["extra_bytes"] / 2**30) for r in rows if r["impl"] == name and r["status"] == "ok")
        color = IMPL_COLORS.get(name)
        if ok:
            # Ours drawn wider underneath: where a peer needs the same bytes both stay visible.
            ours = name == "flashattn"
            ax.plot([p[0] for p in ok], [p[1] for p in ok], marker="o", color=color,
                    label=LEGEND_LABELS.get(name, name), linewidth=4 if ours else 1.5, markersize=9 if ours else 6, zorder=1 if ours else 2)
        for r in rows:
            if r["impl"] == name and r["status"] == "oom":
                ax.scatter([r["n"]], [ok[-1][1] if ok else 1.0], marker="x", s=60, color=color)
                ax.annotate("out of memory", (r["n"], ok[-1][1] if ok else 1.0), fontsize=7, color=color,
                            textcoords="offset points", xytext=(5, -12))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = sorted({r["n"] for r in rows if r.get("n")})
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{n // 1024}k" if n >= 1024 else str(n) for n in ticks])
    ax.set_xlabel("sequence length")
    ax.set_ylabel("GiB needed by forward + backward\n(peak minus what was allocated before)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    shape = f"batch {cfg.get('batch')}, {cfg.get('heads')} heads, d{cfg.get('d')}, {cfg.get('dtype')}"
    title = f"peak memory vs seqlen ({shape}): {run}"
    png = os.path.join(outdir, f"{stem}-memory.png")
    _finish(plt, fig, title, footer, png)
    return [(png, title)]


def plot_io(doc, path, outdir):
    """Left: HBM GB at the GPT-2-medium setting next to the paper's; right: the seqlen sweep
    (measured DRAM and L2->SM bytes of one forward vs the model and the compulsory bytes)."""
    plt = _pyplot()
    stem = os.path.splitext(os.path.basename(path))[0]
    run, footer = run_title(doc, path)
    rows = [r for r in doc["rows"] if "dram_read_bytes" in r]
    gpt2 = [r for r in rows if r.get("setting") == "gpt2-medium"]
    sweep = [r for r in rows if r.get("setting") == "sweep" and r["impl"] == "flashattn" and r["pass"] == "fwd"]
    others = [r for r in rows if r.get("setting") == "sweep" and r["impl"] != "flashattn" and r["pass"] == "fwd"]
    written = []
    if gpt2:
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
        labels, values, colors = [], [], []
        paper = doc.get("paper", {})
        for key in ("standard", "flashattention"):
            if key in paper:
                labels.append(f"paper, {paper.get('gpu', '')}\n{'standard' if key == 'standard' else 'FlashAttn'}\n"
                              f"{paper.get('pass', '')}")
                values.append(paper[key]["hbm_gb"])
                colors.append("#bbbbbb")
        for r in gpt2:
            labels.append(f"{r['impl']}\n{r['pass']}")
            values.append((r["dram_read_bytes"] + r["dram_write_bytes"]) / 1e9)
            colors.append(IMPL_COLORS.get(r["impl"], "#333333"))
        ax.bar(range(len(values)), values, color=colors)
        for i, v in enumerate(values):
            ax.annotate(f"{v:.3g}", (i, v), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(values)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("HBM read + write, GB")
        ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
        r0 = gpt2[0]
        title = f"HBM traffic, B{r0['batch']} H{r0['heads']} N{r0['n']} d{r0['d']} {r0['dtype']}: {run}"
        png = os.path.join(outdir, f"{stem}-io-gpt2.png")
        _finish(plt, fig, title, footer, png)
        written.append((png, title))
    if sweep:
        dims = sorted({r["d"] for r in sweep})
        fig, axes = plt.subplots(1, len(dims), figsize=(4.6 * len(dims) + 2.4, 4.2), squeeze=False)
        for ax, d in zip(axes[0], dims):
            rs = sorted((r for r in sweep if r["d"] == d), key=lambda r: r["n"])
            ns = [r["n"] for r in rs]
            series = (("DRAM read + write (measured)",
                       [r["dram_read_bytes"] + r["dram_write_bytes"] for r in rs], "-o"),
                      ("L2 -> SM reads (measured)", [r.get("l2_read_bytes") for r in rs], "-s"),
                      ("model: Q + K,V x (N / block_m) reads",
                       [r.get("model", {}).get("l2_read_bytes") for r in rs], "--"),
                      ("compulsory (Q, K, V, O once)", [r["compulsory_bytes"] for r in rs], ":"))
            for label, ys, style in series:
                pts = [(n, y / 1e9) for n, y in zip(ns, ys) if y is not None]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
            for name in [n for n in IMPL_ORDER if any(r["impl"] == n and r["d"] == d for r in others)]:
                pts = sorted((r["n"], (r["dram_read_bytes"] + r["dram_write_bytes"]) / 1e9)
                             for r in others if r["impl"] == name and r["d"] == d)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "-^", color=IMPL_COLORS.get(name), linewidth=1,
                        markersize=4, label=f"{LEGEND_LABELS.get(name, name)}: DRAM (measured)")
            ax.set_xscale("log", base=2)
            ticks = sorted({r["n"] for r in rows if r.get("setting") == "sweep" and r["d"] == d})
            ax.set_xticks(ticks)
            ax.set_xticklabels([f"{n // 1024}k" if n >= 1024 else str(n) for n in ticks])
            ax.set_yscale("log")
            ax.set_xlabel(f"sequence length (batch x seqlen = {rs[0]['batch'] * rs[0]['n']}, {rs[0]['heads']} heads)")
            ax.set_ylabel("GB, one forward")
            ax.set_title(f"flashattn forward, d{d}", fontsize=9)
            ax.grid(alpha=0.3, which="both")
        # One legend beside the panels: inside, its seven entries hid the lines.
        handles = {}
        for ax in axes[0]:
            for h, label in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(label, h)
        axes[0][-1].legend(handles.values(), handles.keys(), fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
        title = f"IO of one forward vs seqlen: {run}"
        png = os.path.join(outdir, f"{stem}-io-sweep.png")
        _finish(plt, fig, title, footer, png)
        written.append((png, title))
    return written


# Keyed by plot_kind().
PLOTTERS = {"attention": plot_attention, "sparse": plot_sparse, "decode": plot_decode, "memory": plot_memory,
            "io": plot_io}


def render(paths, outdir, log=print):
    """Plots every results file it knows; returns [(png, title)]."""
    os.makedirs(outdir, exist_ok=True)
    written = []
    for path in paths:
        doc = load(path)
        k = plot_kind(doc)
        if k not in PLOTTERS:
            log(f"{path}: {'no plot for kind ' + k if k else 'not a results file this script knows'}; skipped")
            continue
        for png, title in PLOTTERS[k](doc, path, outdir):
            log(f"wrote {png}")
            written.append((png, title))
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="results JSON files (bench.py, io_repro.py, memory.py)")
    ap.add_argument("--outdir", default="docs/plots", help="folder for the PNGs (default docs/plots)")
    args = ap.parse_args()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        sys.exit("plot.py needs matplotlib: python3 -m pip install matplotlib")
    render(args.results, args.outdir)


if __name__ == "__main__":
    main()
