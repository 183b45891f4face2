"""Renders PNG plots from benchmark results JSON (bench.py, io_repro.py, memory.py).

    python3 bench/plot.py bench/results/*.json --outdir docs/plots

One figure per (dtype, head dim, mask, pass) of an attention suite: TFLOP/s vs seqlen, one line
per implementation (pass = fwd, bwd or fwdbwd; fwdbwd only where the run measured it); a bar
chart of KV-cache bandwidth for a decode suite; peak memory vs seqlen for memory.py; HBM bytes for
io_repro.py. Every figure's title names its run (GPU, date) and its footer the versions and the
results file. Files are named <results file stem>-<what>.png, so a plot never mixes runs.
Files of other kinds (e.g. cpu_vs_torch.py's) are skipped with a note.

matplotlib is imported only when plotting; the readers below (shared with
scripts/gen_performance.py) need nothing beyond the standard library.
"""
import argparse
import json
import os
import sys

# Implementations in display order, with labels for tables and legends.
IMPL_ORDER = ("flashattn", "kvcache", "kvcache_paged16", "sdpa_cudnn", "sdpa_flash", "fa4", "sdpa_efficient", "sdpa_math",
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
}
IMPL_COLORS = {"flashattn": "#d62728", "kvcache": "#e377c2", "kvcache_paged16": "#bcbd22", "sdpa_cudnn": "#2ca02c", "sdpa_flash": "#1f77b4", "fa4": "#8c564b",
               "sdpa_efficient": "#ff7f0e", "sdpa_math": "#7f7f7f", "triton": "#9467bd"}
PASSES = (("fwd", "forward"), ("bwd", "backward"), ("fwdbwd", "forward + backward"))


# ---- readers (no third-party imports) ----------------------------------------------------------

def load(path):
    with open(path) as f:
        return json.load(f)


def kind(doc):
    """"attention", "decode", "mla", "io", "memory", "cpu_vs_torch", or None for an unknown file."""
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
        if all("n" in r and "d" in r and "dtype" in r for r in rows):
            return "attention"
    if "cpu_model" in doc and isinstance(doc.get("results"), list):
        return "cpu_vs_torch"
    return None


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


def png_names(doc, path):
    """The PNG file names plot.py writes for one results file, in display order."""
    stem = os.path.splitext(os.path.basename(path))[0]
    k = kind(doc)
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
    fig.suptitle(title, fontsize=11)
    fig.text(0.01, 0.005, footer, fontsize=6.5, color="#555555", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=IMPL_LABELS.get(name, name),
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


def plot_decode(doc, path, outdir):
    """Grouped bars: effective KV-cache bandwidth per decode shape and implementation; a second
    figure from the CUDA-graph replay figures when the run has them."""
    plt = _pyplot()
    stem = os.path.splitext(os.path.basename(path))[0]
    run, footer = run_title(doc, path)
    rows = doc["rows"]
    names = impls_in(rows)
    written = []
    for key, suffix, how in (("kv_tb_per_s", "", "per-call CUDA events"),
                             ("kv_tb_per_s_graph", "-graph", "CUDA graph replay")):
        if not any(figure(r.get(n), key) is not None for r in rows for n in names):
            continue
        fig, ax = plt.subplots(figsize=(8.5, 4.2))
        width = 0.8 / max(1, len(names))
        for i, name in enumerate(names):
            xs, ys = [], []
            for j, r in enumerate(rows):
                y = figure(r.get(name), key)
                if y is not None:
                    xs.append(j + (i - (len(names) - 1) / 2) * width)
                    ys.append(y)
            ax.bar(xs, ys, width, label=IMPL_LABELS.get(name, name), color=IMPL_COLORS.get(name))
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([f"b{r['batch']}\n{r['seqlen_k'] // 1024}k" for r in rows])
        ax.set_xlabel("batch, KV length")
        ax.set_ylabel("KV cache read, TB/s")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
        r0 = rows[0]
        title = (f"decode, {r0['heads']} q heads / {r0['heads_k']} KV heads, d{r0['d']}, {r0['dtype']}, "
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
            ax.plot([p[0] for p in ok], [p[1] for p in ok], marker="o", color=color, label=IMPL_LABELS.get(name, name))
        for r in rows:
            if r["impl"] == name and r["status"] == "oom":
                ax.scatter([r["n"]], [ok[-1][1] if ok else 1.0], marker="x", s=60, color=color)
                ax.annotate("out of memory", (r["n"], ok[-1][1] if ok else 1.0), fontsize=7, color=color,
                            textcoords="offset points", xytext=(4, 4))
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
        fig, axes = plt.subplots(1, len(dims), figsize=(6.0 * len(dims), 4.2), squeeze=False)
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
                        markersize=4, label=f"{IMPL_LABELS.get(name, name)}: DRAM (measured)")
            ax.set_xscale("log", base=2)
            ticks = sorted({r["n"] for r in rows if r.get("setting") == "sweep" and r["d"] == d})
            ax.set_xticks(ticks)
            ax.set_xticklabels([f"{n // 1024}k" if n >= 1024 else str(n) for n in ticks])
            ax.set_yscale("log")
            ax.set_xlabel(f"sequence length (batch x seqlen = {rs[0]['batch'] * rs[0]['n']}, {rs[0]['heads']} heads)")
            ax.set_ylabel("GB, one forward")
            ax.set_title(f"flashattn forward, d{d}", fontsize=9)
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=7)
        title = f"IO of one forward vs seqlen: {run}"
        png = os.path.join(outdir, f"{stem}-io-sweep.png")
        _finish(plt, fig, title, footer, png)
        written.append((png, title))
    return written


PLOTTERS = {"attention": plot_attention, "decode": plot_decode, "memory": plot_memory, "io": plot_io}


def render(paths, outdir, log=print):
    """Plots every results file it knows; returns [(png, title)]."""
    os.makedirs(outdir, exist_ok=True)
    written = []
    for path in paths:
        doc = load(path)
        k = kind(doc)
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
