"""Tests of the benchmark tooling: bench/bench.py helpers, bench/io_repro.py's ncu parsing and IO
model, bench/plot.py and scripts/gen_performance.py, fed with the JSON/CSV fixtures in
tests/python/data/. They need neither a GPU nor torch (bench.py is checked to import without
torch); plot tests skip without matplotlib, the Triton kernel check without torch and Triton."""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
GEN = os.path.join(ROOT, "scripts", "gen_performance.py")


def load_module(name, relpath):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, relpath))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = load_module("fa_bench", "bench/bench.py")
io_repro = load_module("fa_io_repro", "bench/io_repro.py")
gen = load_module("fa_gen_performance", "scripts/gen_performance.py")
plot = gen.plot  # bench/plot.py as gen_performance.py loads it


def fixture(name):
    with open(os.path.join(DATA, name)) as f:
        return json.load(f)


def results_dir(tmp_path, names):
    d = tmp_path / "results"
    d.mkdir()
    for n in names:
        shutil.copy(os.path.join(DATA, n), d / n)
    return d


ALL_RESULTS = ["bench_v1_quick.json", "bench_v2_full.json", "bench_v2_decode.json", "bench_v3_sparse.json", "io.json",
               "memory.json", "cpu_vs_torch.json", "flashattn_bench_cpu.json", "not_results.json"]
SPARSE_PNG = "bench_v3_sparse-bf16-d128-n8192-full-block128-density.png"


@pytest.fixture
def page(tmp_path):
    d = results_dir(tmp_path, ALL_RESULTS)
    return gen.generate(str(d), str(tmp_path / "docs" / "PERFORMANCE.md"), str(tmp_path / "docs" / "plots"))


def section(text, title):
    """The text of one '## title' section."""
    m = re.search(r"^## " + re.escape(title) + r".*?$(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"no section {title!r}"
    return m.group(1)


# ---- bench.py ----------------------------------------------------------------------------------

def test_bench_modules_import_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "sys.path[:0] = [%r, %r]\n"
            "import bench, io_repro, memory, plot, gen_performance\n"
            "print('ok')" % (os.path.join(ROOT, "bench"), os.path.join(ROOT, "scripts")))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_suite_rows_and_filters():
    assert len(bench.suite_rows("quick")) == 5
    full = bench.suite_rows("full")
    assert len(full) == 2 * 3 * 6 * 2
    assert {r["n"] for r in full} == {512, 1024, 2048, 4096, 8192, 16384}
    some = bench.suite_rows("full", dtypes=["bf16"], head_dims=[128], seqlens=[2048, 16384])
    assert [(r["dtype"], r["d"], r["n"]) for r in some] == [("bf16", 128, 2048)] * 2 + [("bf16", 128, 16384)] * 2
    with pytest.raises(ValueError):
        bench.suite_rows("decode")
    dsv3 = bench.suite_rows("dsv3")
    assert len(dsv3) == 5 * 2
    assert {(r["d"], r["dv"], r["heads"]) for r in dsv3} == {(192, 128, 16)}
    assert {r["n"] for r in dsv3} == {1024, 2048, 4096, 8192, 16384}
    assert len(bench.suite_rows("dsv3", head_dims=[192], seqlens=[8192])) == 2


def test_flops_and_rates():
    assert bench.flops(2, 3, 5, 7, 11, False) == 4 * 2 * 3 * 5 * 7 * 11
    assert bench.flops(2, 3, 5, 5, 11, True) == 4 * 2 * 3 * 5 * 5 * 11 / 2
    assert bench.flops(2, 3, 5, 7, 11, True) == 4 * 2 * 3 * 5 * 7 * 11  # Nq != Nk: not halved
    # head_dim_v != head_dim: Q K^T at d, P V at dv; dv = d is the formula above.
    assert bench.flops(2, 3, 5, 7, 192, False, 128) == 2 * 2 * 3 * 5 * 7 * (192 + 128)
    assert bench.flops(2, 3, 5, 5, 192, True, 128) == 2 * 2 * 3 * 5 * 5 * (192 + 128) / 2
    assert bench.flops(2, 3, 5, 7, 11, False, 11) == bench.flops(2, 3, 5, 7, 11, False)
    r = bench.add_rates({"fwd_ms": 2.0, "bwd_ms": 4.0, "fwdbwd_ms": 7.0}, 1e12)
    assert r["fwd_tflops"] == pytest.approx(500.0)
    assert r["bwd_tflops"] == pytest.approx(625.0)
    assert r["fwdbwd_tflops"] == pytest.approx(500.0)
    assert "bwd_tflops" not in bench.add_rates({"fwd_ms": 1.0}, 1e12)


def test_format_row_lists_every_peer_and_ratios():
    row = fixture("bench_v2_full.json")["rows"][0]
    line = bench.format_row(row)
    assert line.startswith("bf16 d128 n1024 full")
    assert bench.format_row(dict(row, d=192, dv=128)).startswith("bf16 d192/128 n1024 full")
    assert "flashattn 111/123/135" in line
    assert "sdpa_efficient n/a" in line
    assert "triton 156/-/-" in line
    assert "vs FA2 fwd 0.80x bwd 0.80x fwdbwd 0.80x" in line
    assert "vs cuDNN fwd 0.50x" in line


def test_format_row_states_the_sink_cost():
    row = {"dtype": "bf16", "d": 128, "n": 2048, "causal": True,
           "flashattn": {"fwd_ms": 2.0, "bwd_ms": 4.0, "fwd_tflops": 100.0, "bwd_tflops": 100.0},
           "flashattn_sink": {"fwd_ms": 2.05, "bwd_ms": 3.96, "fwd_tflops": 97.6, "bwd_tflops": 101.0}}
    line = bench.format_row(row)
    assert "flashattn_sink 98/101/-" in line
    assert "sink cost fwd +2.5% bwd -1.0%" in line
    assert "fwdbwd" not in line.split("sink cost")[1]


def test_sink_peer_is_accepted_only_on_request():
    assert "flashattn_sink" in bench.OPT_IN_IMPLS and "flashattn_sink" not in bench.IMPLS


def test_every_peer_has_a_description():
    # The results JSON names each timed peer through DESCRIPTIONS: a peer without one ended a run
    # (flashattn_det, 2026-12-02) after its rows were timed.
    missing = [n for n in bench.IMPLS + bench.SPARSE_IMPLS + bench.OPT_IN_IMPLS if n not in bench.DESCRIPTIONS]
    assert missing == []


def test_gpu_state_probe_parses_nvidia_smi_and_degrades(monkeypatch):
    # --gpu-state: which fields the driver answers is asked once (the power-cap reason is
    # optional); each pass starts one nvidia-smi query and reads it afterwards; unreadable or
    # failed answers give {}; off, nothing is started.
    class FakeProc:
        def __init__(self, out, rc=0):
            self.out, self.returncode = out, rc

        def communicate(self, timeout=None):
            return self.out, ""

    started = []

    def fake_popen(argv, **kw):
        started.append(argv)
        return FakeProc(fake_popen.out, fake_popen.rc)

    monkeypatch.setattr(bench.subprocess, "Popen", fake_popen)
    monkeypatch.setitem(bench.GPU_STATE, "on", False)
    monkeypatch.setitem(bench.GPU_STATE, "fields", None)
    assert bench.start_gpu_state() is None and started == []

    monkeypatch.setitem(bench.GPU_STATE, "on", True)
    asked = []
    monkeypatch.setattr(bench, "nvidia_smi", lambda f: asked.append(f) or dict.fromkeys(f, "1"))
    fake_popen.out, fake_popen.rc = "1755, 688.31, 61, Active\n", 0
    assert bench.finish_gpu_state(bench.start_gpu_state()) == {"sm_mhz": 1755, "power_w": 688.31, "temp_c": 61,
                                                              "power_capped": True}
    fake_popen.out = "1980, 120.5, 40, Not Active\n"
    assert bench.finish_gpu_state(bench.start_gpu_state())["power_capped"] is False
    assert asked == [bench.GPU_STATE_FIELDS] and len(started) == 2
    assert "clocks_event_reasons.sw_power_cap" in started[0][3]
    fake_popen.out = "[N/A], [N/A], [N/A], [N/A]\n"
    assert bench.finish_gpu_state(bench.start_gpu_state()) == {}
    fake_popen.out, fake_popen.rc = "", 9
    assert bench.finish_gpu_state(bench.start_gpu_state()) == {}

    # A driver without the power-cap field: the three others.
    monkeypatch.setitem(bench.GPU_STATE, "fields", None)
    monkeypatch.setattr(bench, "nvidia_smi", lambda f: dict.fromkeys(f, "1") if len(f) == 3 else {})
    fake_popen.out, fake_popen.rc = "1980, 120.5, 40\n", 0
    assert bench.finish_gpu_state(bench.start_gpu_state()) == {"sm_mhz": 1980, "power_w": 120.5, "temp_c": 40}
    # No nvidia-smi at all: nothing started.
    monkeypatch.setitem(bench.GPU_STATE, "fields", None)
    monkeypatch.setattr(bench, "nvidia_smi", lambda f: {})
    n = len(started)
    assert bench.start_gpu_state() is None and len(started) == n


def test_softcap_runs_skip_the_peers_without_softcap():
    pytest.importorskip("torch")
    impls, _ = bench.attention_impls(["sdpa_flash", "sdpa_math"], softcap=30.0)
    shape = (1, 2, 2, 128, 128, "bf16")
    assert impls["sdpa_flash"].skip(*shape) == "no softcap in this peer"
    assert impls["sdpa_math"].skip(*shape) == "no softcap in this peer"
    plain, _ = bench.attention_impls(["sdpa_flash"])
    assert plain["sdpa_flash"].skip(*shape) is None


def test_sparse_rows_shape_and_format():
    rows = bench.sparse_rows([1.0, 0.1])
    assert [(r["dtype"], r["d"], r["n"], r["density"]) for r in rows] == [("bf16", 128, 16384, 1.0),
                                                                          ("bf16", 128, 16384, 0.1)]
    assert len(bench.sparse_rows([0.5], head_dims=[64, 128], seqlens=[4096])) == 2
    with pytest.raises(ValueError, match="outside"):
        bench.sparse_rows([1.5])
    assert bench.sparse_shape(16384, 128) == (1, 16) and bench.sparse_shape(4096, 128) == (4, 16)
    row = dict(rows[1], kept=0.102, flashattn=bench.add_rates({"fwd_ms": 0.5}, 1e12),
               flex=bench.add_rates({"fwd_ms": 0.75, "bwd_ms": 1.0}, 1e12))
    line = bench.format_sparse_row(row)
    assert "density 0.10" in line and "flashattn fwd 0.500 ms 2000" in line and "vs Flex fwd 1.50x" in line
    assert "n/a" in bench.format_sparse_row(dict(rows[0], kept=1.0, flex={"unavailable": "old torch"}))


def test_flex_block_mask_holds_the_kept_blocks():
    torch = pytest.importorskip("torch")
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    table = torch.rand(2, 3, 5, 5, generator=torch.Generator().manual_seed(1)) < 0.4
    bm = bench.flex_block_mask(flex.BlockMask, table, 16)
    assert torch.equal(bm.full_kv_num_blocks, table.sum(-1, dtype=torch.int32))
    assert int(bm.kv_num_blocks.sum()) == 0  # every kept block is full: no mask_mod evaluation
    for b, h, r in zip(*torch.nonzero(torch.ones(2, 3, 5), as_tuple=True)):
        n = int(bm.full_kv_num_blocks[b, h, r])
        assert sorted(bm.full_kv_indices[b, h, r, :n].tolist()) == torch.nonzero(table[b, h, r]).flatten().tolist()


def test_sparse_suite_cli_arguments():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "bench.py"), "--suite", "quick",
                          "--block-density", "0.1"], capture_output=True, text=True)
    assert out.returncode != 0 and "--block-density belongs to the sparse suite" in out.stderr


def test_write_json_creates_the_folder_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "new" / "run.json"
    bench.write_json(str(path), {"rows": [1, 2], "complete": False})
    bench.write_json(str(path), {"rows": [1, 2, 3], "complete": True})
    assert json.loads(path.read_text()) == {"rows": [1, 2, 3], "complete": True}
    assert sorted(p.name for p in path.parent.iterdir()) == ["run.json"]


# ---- io_repro.py -------------------------------------------------------------------------------

def test_parse_ncu_raw_page():
    with open(os.path.join(DATA, "ncu_raw.csv")) as f:
        kernels = io_repro.parse_ncu_csv(f.read())
    assert [k["id"] for k in kernels] == list(range(7))
    k = kernels[1]
    assert k["metrics"]["dram__bytes_read.sum"] == 30e9  # thousands separators removed
    assert k["metrics"]["gpu__time_duration.sum"] == 10e6
    assert kernels[4]["grid"] == "(8, 16, 64)"
    # A column in a unit the script does not convert is kept aside, not fatal...
    assert kernels[4]["unparsed"] == {"launch__registers_per_thread": "128 register/thread"}
    # ...but a metric the summary needs must be there.
    assert io_repro.metric(kernels[4], "dram__bytes_write.sum") == 134217728
    with pytest.raises(ValueError, match="launch__registers_per_thread"):
        io_repro.metric(kernels[4], "launch__registers_per_thread")


def test_parse_ncu_details_page_with_units():
    with open(os.path.join(DATA, "ncu_details.csv")) as f:
        kernels = io_repro.parse_ncu_csv(f.read())
    assert len(kernels) == 2
    m = kernels[1]["metrics"]
    assert m["dram__bytes_read.sum"] == pytest.approx(402.65e6)
    assert m["dram__bytes_write.sum"] == pytest.approx(134217.73e3)
    assert m["gpu__time_duration.sum"] == pytest.approx(0.9e6)  # msecond -> ns
    assert kernels[0]["metrics"]["gpu__time_duration.sum"] == pytest.approx(1020)


def test_parse_ncu_rejects_non_csv():
    with pytest.raises(ValueError):
        io_repro.parse_ncu_csv("==PROF== nothing profiled\n")


def test_split_by_marker_counts_configurations():
    with open(os.path.join(DATA, "ncu_raw.csv")) as f:
        kernels = io_repro.parse_ncu_csv(f.read())
    marker, groups = io_repro.split_by_marker(kernels, 3)
    assert "spin_kernel" in marker
    assert [len(g) for g in groups] == [2, 1, 1]
    with pytest.raises(ValueError, match="3 marker kernels"):
        io_repro.split_by_marker(kernels, 4)
    with pytest.raises(ValueError):
        io_repro.split_by_marker([], 1)


def test_io_model_and_compulsory_bytes():
    cfg = dict(setting="gpt2-medium", impl="flashattn", pass_="fwd", dtype="fp16", causal=False, **io_repro.GPT2)
    tensor = 64 * 16 * 1024 * 64 * 2
    assert io_repro.compulsory_bytes(cfg) == 4 * tensor
    assert io_repro.compulsory_bytes(dict(cfg, pass_="fwdbwd")) == 12 * tensor
    assert io_repro.gflop(cfg) == pytest.approx(4 * 64 * 16 * 1024 * 1024 * 64 / 1e9)
    m = io_repro.model(cfg, 128, 233472)
    assert m["kv_passes"] == 8
    assert m["l2_read_bytes"] == tensor * (1 + 2 * 8)
    # The paper's block choice: B_c = ceil(M / 4d) with M in elements, B_r = min(B_c, d).
    assert m["paper_block"] == {"B_c": 456, "B_r": 64, "M_bytes": 233472}
    assert m["paper_model_bytes"] == tensor * (2 + 2 * 16)
    assert io_repro.model(dict(cfg, pass_="fwdbwd"), 128, 233472) is None


def test_infer_block_m_from_grid():
    cfg = dict(n=1024)
    kernel = {"name": "void flashattn::cuda::fwd_kernel<X>(P)", "grid": "(8, 16, 64)"}
    assert io_repro.infer_block_m(cfg, [kernel]) == 128
    assert io_repro.infer_block_m(cfg, [{"name": "fwd_kernel", "grid": "(16, 16, 64)"}]) == 64
    assert io_repro.infer_block_m(cfg, [{"name": "other", "grid": "(8, 16, 64)"}]) is None


def test_io_plan():
    configs = io_repro.plan("all", ["sdpa_math", "flashattn"], ["fwd", "fwdbwd"], ["fwd"], [1024, 8192], [64], 4096)
    gpt2 = [c for c in configs if c["setting"] == "gpt2-medium"]
    sweep = [c for c in configs if c["setting"] == "sweep"]
    assert len(gpt2) == 4 and all(c["batch"] == 64 and c["n"] == 1024 and c["heads"] == 16 for c in gpt2)
    assert [(c["impl"], c["n"], c["batch"]) for c in sweep] == [("sdpa_math", 1024, 64), ("flashattn", 1024, 64),
                                                                 ("flashattn", 8192, 8)]


# ---- gen_performance.py ------------------------------------------------------------------------

def test_kinds():
    assert plot.kind(fixture("bench_v1_quick.json")) == "attention"
    assert plot.kind(fixture("bench_v2_full.json")) == "attention"
    assert plot.kind(fixture("bench_v2_decode.json")) == "decode"
    assert plot.kind(fixture("io.json")) == "io"
    assert plot.kind(fixture("memory.json")) == "memory"
    assert plot.kind(fixture("cpu_vs_torch.json")) == "cpu_vs_torch"
    assert plot.kind(fixture("flashattn_bench_cpu.json")) is None
    assert gen.is_flashattn_bench(fixture("flashattn_bench_cpu.json"))
    assert plot.kind(fixture("not_results.json")) is None
    assert plot.cudnn_version(91900) == "9.19.0"
    assert plot.cudnn_version(8907) == "8.9.7"


def test_every_table_names_its_run(page):
    for name, device in (("bench_v1_quick.json", "NVIDIA H200"), ("bench_v2_full.json", "Fixture GPU X1"),
                         ("bench_v2_decode.json", "Fixture GPU X1"), ("io.json", "Fixture GPU X1"),
                         ("memory.json", "Fixture GPU X1")):
        date = "2026-11-29" if "v1" in name else "2030-01-02"
        assert f"### `{name}` — {device}, {date}" in page
    assert "cuDNN 9.19.0" in page
    assert "commit 0123456789 " in page or "commit 0123456789;" in page or "commit 0123456789," in page
    runs = section(page, "Runs")
    for name in ALL_RESULTS[:-1]:
        assert f"`{name}`" in runs
    assert "`not_results.json`" in section(page, "Files not recognised")


def test_attention_tables_and_ratios(page):
    text = section(page, "Training shapes")
    # bench_v2_full.json, forward, N=1024: ours 111.11, cuDNN 222.22, FA2 138.89, math 12.345, triton 155.55
    assert "| bf16 | 128 | 1024 | full | 16×16 | 111 | 222 | 139 | n/a [1] | 12.3 | 156 | 0.50× | 0.80× |" in text
    assert "[1] error: No available kernel. Aborting execution." in text
    assert "skipped: math backend materialises Nq x Nk scores" in text
    # Backward: Triton is forward only ("—"), not an error.
    assert "| bf16 | 128 | 1024 | full | 16×16 | 123 | 247 | 154 | n/a [1] | 13.5 | — | 0.50× | 0.80× |" in text
    assert "**Forward + backward**, TFLOP/s:" in text
    # The real format-1 run has no fwd+bwd figure: nothing is derived from fwd_ms + bwd_ms.
    v1 = text[text.index("`bench_v1_quick.json`"):text.index("`bench_v2_full.json`")]
    assert "**Forward + backward**: not measured in this run." in v1
    assert "| bf16 | 128 | 2048 | full | 8×16 | 260 | 598 | 307 | 0.44× | 0.85× |" in v1


def test_decode_tables(page):
    text = section(page, "Decode")
    assert "**per-call CUDA events**:" in text and "**CUDA graph replay**:" in text
    assert ("| 8 | 65536 | 1,000 µs, 2.15 TB/s | 500 µs, 4.30 TB/s | 500 µs, 4.29 TB/s | 5,000 µs, 0.43 TB/s "
            "| 0.50× | 0.50× |") in text
    graph = text[text.index("**CUDA graph replay**"):]
    assert "| 1 | 4096 | 20.0 µs, 0.84 TB/s | 17.0 µs, 0.99 TB/s | — | n/a [1] | 0.85× | — |" in graph


def test_io_table_next_to_paper(page):
    text = section(page, "IO")
    assert "| paper (A100): standard attention | fwd+bwd | 66.6 | 40.3 | — | 41.7 | — |" in text
    assert "| paper (A100): FlashAttention | fwd+bwd | 75.2 | 4.4 | — | 7.3 | — |" in text
    assert "| this run: flashattn (ours) | fwd | 274.9 | 0.537 | 1.00× | 0.950 | 0.900 |" in text
    assert "| this run: SDPA math (standard) | fwd | 274.9 | 42.1 | 78.4× | 17.0 | 15.0 |" in text
    assert "fwd: standard / flashattn HBM bytes = 78.4×" in text
    assert "paper (fwd+bwd): 9.16×" in text
    assert "cuDNN refused this configuration" in text
    # model: 32*16*2 bytes*(N d + 2*16 N d); paper model, B_r = min(ceil(M/4d), d) = 128: (2 + 2*16) N d
    assert "| flashattn (ours) | fwd | 128 | 2048 | 32 | 1.07 | 1.07 | 9.13 | 16 | 8.86 | 9.13 |" in text


def test_block_size_table_keeps_runs_of_one_block_m_apart(tmp_path):
    # Three sweeps of the same shape: two at block_m 128 (two layouts, one tagged, one known by its
    # commit) and one at 64. Each must get its own columns; rows of one run must never fill
    # another run's cells.
    base = fixture("io.json")
    sweep = next(r for r in base["rows"] if r.get("setting") == "sweep" and r["impl"] == "flashattn")
    d = tmp_path / "results"
    d.mkdir()
    for name, tag, commit, block_m, l2 in (("io-a.json", None, "a88bf1da0d", 128, 15e9),
                                           ("io-b.json", "swizzled", "ef37f75d43", 128, 9e9),
                                           ("io-c.json", "bm64", "70a8cf6fd9", 64, 30e9)):
        doc = json.loads(json.dumps(base))
        doc["environment"]["git"] = {"commit": commit}
        if tag:
            doc["tag"] = tag
        row = json.loads(json.dumps(sweep))
        row.update(block_m=block_m, l2_read_bytes=l2)
        doc["rows"] = [row]
        (d / name).write_text(json.dumps(doc))
    text = gen.generate(str(d), str(tmp_path / "PERFORMANCE.md"), str(tmp_path / "plots"))
    block = text[text.index("### Measured bytes vs block size"):]
    header = next(line for line in block.splitlines() if line.startswith("| dtype"))
    assert "L2→SM GB (bm 128, swizzled)" in header and "L2→SM GB (bm 128, a88bf1d)" in header
    assert "L2→SM GB (bm 64, bm64)" in header
    row = next(line for line in block.splitlines() if line.startswith(f"| {sweep['dtype']} | fwd |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # columns sorted by block_m (descending) then file: io-a, io-b, io-c; L2 GB is each run's 2nd cell
    assert [cells[4 + 4 * i + 1] for i in range(3)] == ["15.0", "9.00", "30.0"]


def test_memory_and_cpu_tables(page):
    text = section(page, "Peak memory")
    assert "| 4096 | 0.129 (0.0664) | out of memory |" in text
    assert "| 1024 | 0.0322 (0.0166) | 0.266 (0.250) |" in text
    cpu = section(page, "CPU backend")
    assert "| 16 | 32.1 | 44.0 | 1.37× | 81.4 | 213 | 2.61× |" in cpu
    assert "| `flashattn_bench_cpu.json` | Fixture CPU, 2030-01-02 | 2 |" in cpu
    assert "0.180 | 526 | 0.163 | 6.2e-07 |" in cpu


def test_not_measured_notes_for_an_empty_folder(tmp_path):
    d = tmp_path / "results"
    d.mkdir()
    text = gen.generate(str(d), str(tmp_path / "P.md"), str(tmp_path / "plots"))
    for title in ("Training shapes", "Decode", "IO", "Peak memory", "CPU backend"):
        assert "Not measured" in section(text, title)
    assert "No results files yet." in text
    tables = [line for line in text.splitlines() if line.startswith("| ")]
    assert tables == []


def test_notes_block_is_preserved(tmp_path):
    d = results_dir(tmp_path, ["bench_v1_quick.json"])
    out = tmp_path / "P.md"
    first = gen.generate(str(d), str(out), str(tmp_path / "plots"))
    assert gen.DEFAULT_NOTES in first
    notes = "The lead's analysis.\n\n| a | table | kept |\n|---|---|---|\n| 1 | 2 | 3 |"
    out.write_text(first.replace(gen.DEFAULT_NOTES, notes))
    second = gen.generate(str(d), str(out), str(tmp_path / "plots"))
    assert f"{gen.NOTES_BEGIN}\n{notes}\n{gen.NOTES_END}" in second
    assert gen.DEFAULT_NOTES not in second


def test_sparse_runs_keep_their_tables_and_get_a_density_plot(page):
    doc = fixture("bench_v3_sparse.json")
    assert plot.kind(doc) == "attention"  # tables: the training-shapes section, as before
    assert plot.plot_kind(doc) == "sparse"
    assert plot.plot_kind(fixture("bench_v2_full.json")) == "attention"
    assert "### `bench_v3_sparse.json` — Fixture GPU X1, 2030-01-02" in section(page, "Training shapes")
    assert plot.png_names(doc, os.path.join(DATA, "bench_v3_sparse.json")) == [SPARSE_PNG]
    groups = plot.sparse_groups(doc["rows"])
    assert [plot.sparse_density(r) for r in groups[("bf16", 128, 8192, False, 128)]] == [1.0, 0.5, 0.1279296875]
    assert plot.sparse_passes(doc["rows"]) == [("fwd", "forward"), ("bwd", "backward")]


def write_run(folder, name, doc, date, **changes):
    doc = json.loads(json.dumps(doc))
    doc["environment"]["date_utc"] = date
    doc.update(changes)
    (folder / name).write_text(json.dumps(doc))


def test_plots_come_from_the_newest_run_of_each_kind(tmp_path):
    d = tmp_path / "results"
    d.mkdir()
    full = fixture("bench_v2_full.json")
    write_run(d, "full-a.json", full, "2030-01-03T00:00:00+00:00")
    write_run(d, "full-b.json", full, "2030-01-01T00:00:00+00:00")  # later name, older run
    fwd_only = json.loads(json.dumps(full))
    for r in fwd_only["rows"]:
        for entry in r.values():
            if isinstance(entry, dict):
                for key in ("bwd_tflops", "fwdbwd_tflops"):
                    entry.pop(key, None)
    write_run(d, "fwd.json", fwd_only, "2030-01-02T00:00:00+00:00")  # older than full-a, its own kind
    write_run(d, "quick.json", fixture("bench_v1_quick.json"), "2030-01-09T00:00:00+00:00")
    write_run(d, "sparse-a.json", fixture("bench_v3_sparse.json"), "2030-01-05T00:00:00+00:00")
    write_run(d, "sparse-b.json", fixture("bench_v3_sparse.json"), "2030-01-04T00:00:00+00:00")
    write_run(d, "decode.json", fixture("bench_v2_decode.json"), "2030-01-01T00:00:00+00:00")
    write_run(d, "decode-fp8.json", fixture("bench_v2_decode.json"), "2030-01-02T00:00:00+00:00", kv_dtype="fp8")
    write_run(d, "io.json", fixture("io.json"), "2030-01-01T00:00:00+00:00")
    write_run(d, "io-bm64.json", fixture("io.json"), "2030-01-02T00:00:00+00:00", tag="bm64")
    choice = {heading: (os.path.basename(path), older) for heading, (path, _), older in
              gen.plot_choice(gen.classify(str(d)))}
    assert choice == {
        "Training shapes, forward + backward (full suite)": ("full-a.json", ["full-b.json"]),
        "Training shapes, forward only (full suite)": ("fwd.json", []),
        "Block-sparse: time vs density (sparse suite)": ("sparse-a.json", ["sparse-b.json"]),
        "Decode, bf16 KV cache": ("decode.json", []),
        "Decode, FP8 KV cache": ("decode-fp8.json", []),
        "IO (io_repro.py)": ("io.json", []),
    }


def test_plots_section_links_the_chosen_runs_only(tmp_path):
    names = ["bench_v1_quick.json", "bench_v2_full.json", "bench_v3_sparse.json"]
    d = results_dir(tmp_path, names)
    plots = tmp_path / "docs" / "plots"
    plots.mkdir(parents=True)
    for n in names:  # empty stand-ins: the page links what is on disk, matplotlib not needed
        for png in plot.png_names(fixture(n), n):
            (plots / png).write_bytes(b"")
    text = gen.generate(str(d), str(tmp_path / "docs" / "PERFORMANCE.md"), str(plots))
    plots_text = section(text, "Plots")
    assert "### Block-sparse: time vs density (sparse suite)" in plots_text
    assert f"![{SPARSE_PNG[:-4]}](plots/{SPARSE_PNG})" in plots_text
    assert "(plots/bench_v2_full-bf16-d128-full-fwdbwd.png)" in plots_text
    assert "bench_v1_quick" not in plots_text  # the quick suite: tables only
    assert "### `bench_v1_quick.json`" in section(text, "Training shapes")
    for link in re.findall(r"\]\((plots/[^)]+)\)", plots_text):
        assert (tmp_path / "docs" / link).exists()
    (plots / "an-old-run-bf16-d64-full-fwd.png").write_bytes(b"")
    stale = gen.stale_plots(str(plots), [str(d / "bench_v2_full.json"), str(d / "bench_v3_sparse.json")])
    assert stale == sorted(["an-old-run-bf16-d64-full-fwd.png"] +
                           plot.png_names(fixture("bench_v1_quick.json"), "bench_v1_quick.json"))


def test_cli_writes_and_checks(tmp_path):
    d = results_dir(tmp_path, ["bench_v2_full.json", "bench_v2_decode.json"])
    out = tmp_path / "docs" / "PERFORMANCE.md"
    args = [sys.executable, GEN, "--results", str(d), "--out", str(out), "--plot-dir", str(tmp_path / "plots")]
    assert subprocess.run(args, capture_output=True).returncode == 0
    first = out.read_text()
    assert subprocess.run(args, capture_output=True).returncode == 0
    assert out.read_text() == first  # idempotent
    assert subprocess.run(args + ["--check"], capture_output=True).returncode == 0
    shutil.copy(os.path.join(DATA, "memory.json"), d / "memory.json")
    assert subprocess.run(args + ["--check"], capture_output=True).returncode == 1
    assert out.read_text() == first  # --check writes nothing


def test_help_of_every_script():
    for script in ("bench/bench.py", "bench/io_repro.py", "bench/memory.py", "bench/plot.py",
                   "scripts/gen_performance.py"):
        out = subprocess.run([sys.executable, os.path.join(ROOT, script), "--help"], capture_output=True, text=True,
                             env=dict(os.environ, PYTHONPATH=""))
        assert out.returncode == 0, (script, out.stderr)
        assert "usage:" in out.stdout


# ---- plot.py -----------------------------------------------------------------------------------

def test_plots_are_written_and_name_their_run(tmp_path):
    pytest.importorskip("matplotlib")
    paths = [os.path.join(DATA, n) for n in ("bench_v1_quick.json", "bench_v2_full.json", "bench_v2_decode.json",
                                             "bench_v3_sparse.json", "io.json", "memory.json", "cpu_vs_torch.json")]
    written = plot.render(paths, str(tmp_path), log=lambda *a: None)
    names = sorted(os.path.basename(p) for p, _ in written)
    expected = sorted(n for p in paths for n in plot.png_names(plot.load(p), p))
    assert names == expected
    assert "bench_v2_full-bf16-d128-full-fwdbwd.png" in names
    assert "bench_v1_quick-bf16-d128-full-fwdbwd.png" not in names  # not measured in that run
    assert {"bench_v2_decode-decode.png", "bench_v2_decode-decode-graph.png", "io-io-gpt2.png", "io-io-sweep.png",
            "memory-memory.png", SPARSE_PNG} <= set(names)
    sparse_title = next(t for p, t in written if p.endswith(SPARSE_PNG))
    assert "bf16, d128, N 8192, batch 1 x 16 heads" in sparse_title
    for png, title in written:
        with open(png, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert ("NVIDIA H200, 2026-11-29" in title) or ("Fixture GPU X1, 2030-01-02" in title)


def test_generated_page_links_existing_plots(tmp_path):
    pytest.importorskip("matplotlib")
    d = results_dir(tmp_path, ["bench_v2_full.json", "memory.json"])
    plots = tmp_path / "docs" / "plots"
    plot.render([str(d / "bench_v2_full.json"), str(d / "memory.json")], str(plots), log=lambda *a: None)
    text = gen.generate(str(d), str(tmp_path / "docs" / "PERFORMANCE.md"), str(plots))
    section_text = section(text, "Plots")
    assert "(plots/bench_v2_full-bf16-d128-full-fwd.png)" in section_text
    assert "(plots/memory-memory.png)" in section_text
    for link in re.findall(r"\]\((plots/[^)]+)\)", section_text):
        assert (tmp_path / "docs" / link).exists()


def test_fp8_cache_decode_plots_and_cli_prunes_stale_plots(tmp_path):
    pytest.importorskip("matplotlib")
    d = tmp_path / "results"
    d.mkdir()
    write_run(d, "decode-fp8.json", fixture("bench_v2_decode.json"), "2030-01-02T00:00:00+00:00", kv_dtype="fp8")
    shutil.copy(os.path.join(DATA, "bench_v3_sparse.json"), d / "bench_v3_sparse.json")
    shutil.copy(os.path.join(DATA, "bench_v1_quick.json"), d / "bench_v1_quick.json")
    plots = tmp_path / "docs" / "plots"
    plots.mkdir(parents=True)
    (plots / "an-old-run-memory.png").write_bytes(b"")
    out = tmp_path / "docs" / "PERFORMANCE.md"
    args = [sys.executable, GEN, "--results", str(d), "--out", str(out), "--plot-dir", str(plots)]
    run = subprocess.run(args + ["--plots"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert sorted(os.listdir(plots)) == sorted(["decode-fp8-decode.png", "decode-fp8-decode-graph.png", SPARSE_PNG])
    for name in os.listdir(plots):
        with open(plots / name, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    links = re.findall(r"\]\((plots/[^)]+)\)", section(out.read_text(), "Plots"))
    assert sorted(os.path.basename(link) for link in links) == sorted(os.listdir(plots))
    assert subprocess.run(args + ["--check"], capture_output=True).returncode == 0


# ---- bench/triton_attention.py -----------------------------------------------------------------

def test_triton_kernel_in_the_interpreter():
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "triton_attention.py")], capture_output=True,
                         text=True, env=dict(os.environ, TRITON_INTERPRET="1"), timeout=600)
    # Triton 3.6's interpreter turns a computed loop bound into an int with int() of a
    # one-element array, which numpy 2.4+ rejects; later Triton squeezes it first. The compiled
    # kernel is unaffected (bench.py runs it on the GPU).
    import triton
    old_interpreter = tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 7)
    if (out.returncode != 0 and old_interpreter
            and "only 0-dimensional arrays can be converted to Python scalars" in out.stderr):
        pytest.skip(f"Triton {triton.__version__}'s interpreter cannot take a computed loop bound "
                    "with this numpy (fixed in later Triton)")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().endswith("ok")
