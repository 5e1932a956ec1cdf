"""Every benchmark's ``--quick`` mode on the CPU (Triton interpreter, tiny shapes, no FlashInfer).

Their timings mean nothing here; what is tested is that each script's code paths run and that its own
correctness checks pass (each exits 1 when an output misses its reference), so a kernel or API change
that breaks a benchmark shows up in CI, not on the next GPU run. ``bench_write_host.py`` is GPU only.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[1]

# script -> a line its report must hold
QUICK = {
    "bench_attention.py": "quick decode B=2 L=200",
    "bench_prefill.py": "NVFP4 cache written by",
    "bench_write.py": "b512w8p4",
    "bench_dequant.py": "b1024w8",
    "bench_rotation.py": "quick mixed",
}


@pytest.mark.parametrize("script", sorted(QUICK))
def test_benchmark_quick_mode_runs_and_passes_its_checks(script, tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), "--quick"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert QUICK[script] in out, out[-4000:]
    assert "Traceback" not in out, out[-4000:]


def test_bench_serving_dry_run_plans_equal_kv_bytes_for_bf16_and_nvfp4():
    """bench_serving's plan without vLLM: per mode a bf16 and an NVFP4 engine with the same KV bytes,
    a bf16 budget that holds N requests of context + new tokens (whole 16-token blocks), 4N served."""
    import json

    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_serving.py"), "--dry-run", "--fit", "3",
         "--context", "1000", "--new-tokens", "30", "--prefill-requests", "5", "--prefill-context", "2048"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    per_token = 16 * 2 * 8 * 128 * 2  # layers x (K, V) x KV heads x head_dim x bf16 bytes
    assert lines[0] == f"bf16 KV bytes per token: {per_token}"
    runs = [json.loads(ln) for ln in lines[1:]]
    assert [(r["mode"], r["kv"]) for r in runs] == [
        ("serve", "auto"), ("serve", "nvfp4"), ("prefill", "auto"), ("prefill", "nvfp4")
    ]
    serve, prefill = runs[:2], runs[2:]
    assert {r["kv_cache_bytes"] for r in serve} == {3 * 65 * 16 * per_token}  # ceil(1030 / 16) = 65 blocks
    assert all(r["requests"] == 12 and r["max_num_seqs"] == 12 and r["new_tokens"] == 30 for r in serve)
    assert all(r["warmup_new_tokens"] == 30 for r in serve)  # the warm-up generates as much as a timed batch
    assert {r["kv_cache_bytes"] for r in prefill} == {5 * 129 * 16 * per_token}  # 2049 tokens: 129 blocks
    assert all(r["requests"] == 5 and r["new_tokens"] == 1 for r in prefill)
    assert serve[0]["backend"] is None and serve[1]["backend"] == "FLASHINFER"


def test_bench_serving_warmup_can_generate_fewer_tokens():
    """--warmup-new-tokens shortens the warm-up batch's generations (a decode-heavy mix in a time limit), capped at
    --new-tokens; the timed batches keep --new-tokens."""
    import json

    def plan(*extra: str) -> list[dict]:
        proc = subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "bench_serving.py"), "--dry-run", "--modes", "serve",
             "--context", "1024", "--new-tokens", "7168", *extra],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return [json.loads(ln) for ln in proc.stdout.splitlines()[1:]]

    assert {(r["new_tokens"], r["warmup_new_tokens"]) for r in plan("--warmup-new-tokens", "64")} == {(7168, 64)}
    assert {r["warmup_new_tokens"] for r in plan("--warmup-new-tokens", "9000")} == {7168}
    assert {r["warmup_new_tokens"] for r in plan()} == {7168}


def test_bench_serving_runs_only_the_kv_dtypes_asked_for():
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_serving.py"), "--dry-run", "--kv", "nvfp4"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    import json

    runs = [json.loads(ln) for ln in proc.stdout.splitlines()[1:]]
    assert [(r["mode"], r["kv"]) for r in runs] == [("serve", "nvfp4"), ("prefill", "nvfp4")]
    bad = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_serving.py"), "--dry-run", "--kv", "fp8"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "--kv: unknown ['fp8']" in bad.stderr


def test_bench_serving_kills_a_timed_out_engine_and_its_children(monkeypatch, tmp_path):
    """A timed-out engine's process group is killed (an engine core left behind holds GPU memory),
    and its log, written as it ran, is kept."""
    import time

    bs = _bench_serving(monkeypatch)
    pid_file = tmp_path / "grandchild.pid"
    child = tmp_path / "child.py"
    child.write_text(
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "print('engine starting', flush=True)\n"
        "time.sleep(120)\n"
    )
    monkeypatch.setattr(bs, "__file__", str(child))
    monkeypatch.setattr(bs.sys, "argv", [sys.executable])
    run = bs.Run("serve", "nvfp4", None, 1, 1, 1, 1, 1, 1)
    res = bs._run_child(run, tmp_path, bs.ModelShape(), 1, 3, tmp_path / "logs")
    assert res["ok"] is False and res["error"].startswith("timed out after 3 s"), res
    assert "engine starting" in (tmp_path / "logs" / "serve-nvfp4.log").read_text()
    grandchild = int(pid_file.read_text())

    def alive(pid: int) -> bool:  # a killed process nobody reaps yet stays a zombie ("Z"): dead
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] != "Z"

    for _ in range(50):  # the kill is asynchronous
        if not alive(grandchild):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the engine's child {grandchild} outlived the timeout")


def test_bench_serving_refuses_an_unknown_mode():
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_serving.py"), "--dry-run", "--modes", "serve,decode"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--modes: unknown ['decode']" in proc.stderr and "Traceback" not in proc.stderr


def _bench_serving(monkeypatch):
    import importlib

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    return importlib.import_module("bench_serving")


def test_bench_serving_splits_a_batch_into_first_token_and_per_token_times(monkeypatch):
    """From vLLM's per-request timestamps: time to first token (queued -> first token) and time per
    output token after the first, median and worst; requests without metrics are left out."""
    from types import SimpleNamespace as NS

    bs = _bench_serving(monkeypatch)

    def out(queued, first, last, n):
        return NS(metrics=NS(queued_ts=queued, first_token_ts=first, last_token_ts=last),
                  outputs=[NS(token_ids=list(range(n)))])

    outs = [out(0.0, 1.0, 3.0, 201), out(0.0, 2.0, 3.0, 101), out(0.0, 5.0, 9.0, 101),
            NS(metrics=None, outputs=[NS(token_ids=[1, 2])])]
    ph = bs.phases(outs)
    assert ph == {"ttft_s_median": 2.0, "ttft_s_max": 5.0, "tpot_ms_median": 10.0, "tpot_ms_max": 40.0}
    assert bs.phases([NS(metrics=None, outputs=[NS(token_ids=[1])])]) == {"phases": "vLLM returned no request metrics"}


def test_bench_serving_puts_each_jit_compile_in_the_batch_it_fell_in(monkeypatch):
    bs = _bench_serving(monkeypatch)
    log = "\n".join([
        "(EngineCore pid=1) WARNING [jit_monitor.py:135] Triton kernel JIT compilation during inference: "
        "_write_kernel. This causes a latency spike; consider extending warmup to cover this shape/config.",
        f"{bs.BATCH_MARK} warmup",
        "x Triton kernel JIT compilation during inference: gluon_decode_kernel. This causes a latency spike",
        f"{bs.BATCH_MARK} timed 0",
        "x Triton kernel JIT compilation during inference: _dequant_kernel. This causes a latency spike",
        "unrelated line",
    ])  # fmt: skip
    assert bs.jit_by_batch(log) == {
        "before": ["_write_kernel"], "warmup": ["gluon_decode_kernel"], "timed 0": ["_dequant_kernel"],
    }
    row = {"mode": "serve", "kv": "nvfp4", "backend": "FLASHINFER", "kv_cache_bytes": 2**30, "ok": True,
           "kv_cache_tokens": 100, "requests": 4, "fits_requests": 3, "context": 10, "new_tokens": 5,
           "best_s": 1.0, "generated_tok_s": 20.0, "ttft_s_median": 0.5, "ttft_s_max": 0.9,
           "tpot_ms_median": 3.0, "tpot_ms_max": 4.0, "jit": bs.jit_by_batch(log)}  # fmt: skip
    text = bs.report([row], bs.ModelShape())
    assert "| 0.5 / 0.9 | 3.0 / 4.0 | _dequant_kernel |" in text, text


def test_bench_timing_spots_an_empty_cuda_graph_capture(monkeypatch):
    """A call that launches off the capturing stream gives torch's "CUDA Graph is empty" warning;
    the benchmarks' timer must spot it (and report eager time only) rather than time an empty replay."""
    import importlib
    import warnings

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    mod = importlib.import_module("bench_attention")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("The CUDA Graph is empty. This usually means that the graph was attempted to be "
                      "captured on wrong device or stream.", UserWarning, stacklevel=1)
    assert mod.empty_graph_capture(caught)
    with warnings.catch_warnings(record=True) as other:
        warnings.simplefilter("always")
        warnings.warn("some other warning", UserWarning, stacklevel=1)
    assert not mod.empty_graph_capture(other)


def test_bench_attention_variant_selectors(monkeypatch):
    """``--variants`` selectors: any one of the comma-separated selectors; ``&`` inside one needs every part."""
    import importlib

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    sel = importlib.import_module("bench_attention").selected
    label = "gluon DecodeConfig(block_n=64, lean=True, page_tile=True, imad_shr=False, lazy_rescale=False)"
    assert sel(label, ["page_tile=True"]) and sel(label, ["swapped QK", "lean=True"])
    assert sel(label, ["page_tile=True&imad_shr=False&lazy_rescale=False"])
    assert not sel(label, ["page_tile=True&imad_shr=True"]) and not sel(label, ["swapped QK"])
    assert sel(label, ["imad_shr=True", "page_tile=True & lazy_rescale=False"])
    # a Gluon sweep row by its index: "#11:" picks config 11, not 1, 110 or 111
    rows = [f"gluon #{i}: DecodeConfig(block_n=64, gluon=True)" for i in (1, 11, 110, 111)]
    assert [r for r in rows if sel(r, ["#11:"])] == [rows[1]]
    assert [r for r in rows if sel(r, ["#1:", "#111:"])] == [rows[0], rows[3]]


def test_bench_attention_variants_keeps_the_default_and_the_named_sweep_rows(tmp_path):
    """``--variants``: the default row and only the sweep rows whose label holds a given substring."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_attention.py"), "--quick",
         "--shapes", "quick decode B=2 L=200", "--variants", "swapped QK", "--json", "rows.json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    labels = [ln.split("|")[2].strip() for ln in out.splitlines() if ln.startswith("| triton NVFP4 |")]
    assert labels and labels[0].startswith("default"), out[-4000:]
    assert any("swapped QK" in x for x in labels), labels
    assert not any("byte scales" in x or "prefetch" in x for x in labels[1:]), labels
    # each step's start on stderr (where a run cut off by a time limit was), and the JSON marked complete
    steps = [ln for ln in proc.stderr.splitlines() if ln.startswith("[bench_attention t=")]
    assert steps[0].endswith("quick decode B=2 L=200: building the caches and the float32 references"), steps
    assert sum("triton NVFP4 [" in ln for ln in steps) == len(labels) and steps[-1].endswith("all shapes done")
    import json

    data = json.loads((tmp_path / "rows.json").read_text())
    assert data["complete"] is True and [r["config"] for r in data["rows"]] == labels
    assert not (tmp_path / "rows.json.tmp").exists()


def test_bench_attention_watchdog_prints_the_stack_of_a_step_that_overruns(tmp_path):
    """``--watchdog-s``: a step that runs past its seconds gets every thread's Python stack on stderr (where a GPU
    run hangs), re-armed by each step's start; a step that finishes in time prints none."""
    code = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); import bench_attention as b\n"
        "b._WATCHDOG_S = 0.5\n"
        "b.progress('quick step'); time.sleep(0.1)\n"
        "b.progress('slow step')\n"
        "def stuck_in_a_row():\n    time.sleep(1.3)\n"
        "stuck_in_a_row(); b.faulthandler.cancel_dump_traceback_later()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(REPO / "benchmarks")], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    assert "] quick step" in err and "] slow step" in err
    head, _, tail = err.partition("] slow step")
    assert "stuck_in_a_row" not in head and "Timeout" not in head, err  # the quick step's timer was re-armed
    assert tail.count("stuck_in_a_row") == 2, err  # 0.5 s and 1.0 s into the 1.3 s step


def test_bench_serving_summarizes_the_scheduler_per_batch_from_vllms_stat_lines(monkeypatch):
    """The engines' own logs of run Q (vLLM 0.26.0, a decode-heavy serve on an H100): bf16 ran 1-21 requests at a
    time with up to 23 waiting, NVFP4 all 32; a stat line with vLLM's preemption count adds it up."""
    bs = _bench_serving(monkeypatch)
    logs = REPO / "docs" / "validation-runs" / "2026-12-05-h100-q" / "call4-engine-logs"
    bf16 = bs.sched_by_batch((logs / "serve-auto.log").read_text())
    assert bf16["timed 0"] == {"running_min": 1, "running_max": 21, "waiting_max": 23, "preemptions": 0,
                               "kv_usage_max_pct": 97.8, "lines": 9}  # fmt: skip
    nvfp4 = bs.sched_by_batch((logs / "serve-nvfp4.log").read_text())
    assert nvfp4["timed 0"]["running_min"] == nvfp4["timed 0"]["running_max"] == 32
    assert nvfp4["timed 0"]["waiting_max"] == 0
    assert bs._sched_cell(bf16) == "1-21 / 23 / 0" and bs._sched_cell(nvfp4) == "32 / 0 / 0"
    # the format vLLM prints where the interval had deferred requests and preemptions (v1/metrics/loggers.py)
    line = ("INFO [loggers.py:310] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: "
            "1.0 tokens/s, Running: {} reqs, Waiting: {} reqs, Deferred: 2 reqs, Preemptions: {}, "
            "GPU KV cache usage: {}%, Prefix cache hit rate: 0.0%")  # fmt: skip
    log = "\n".join([line.format(4, 0, 1, 10.0), f"{bs.BATCH_MARK} timed 0", line.format(6, 3, 2, 99.5),
                     line.format(5, 4, 3, 98.0), f"{bs.BATCH_MARK} timed 1", line.format(7, 0, 0, 50.0)])  # fmt: skip
    by = bs.sched_by_batch(log)
    assert by["before"]["preemptions"] == 1
    assert by["timed 0"] == {"running_min": 5, "running_max": 6, "waiting_max": 4, "preemptions": 5,
                             "kv_usage_max_pct": 99.5, "lines": 2}  # fmt: skip
    assert bs._sched_cell(by) == "5-7 / 4 / 5"
    assert bs._sched_cell({"warmup": by["before"]}) == bs._sched_cell(None) == "no stat line"


def test_bench_attention_reads_shape_descriptions(monkeypatch):
    """``--shape``: a decode shape from its description, with the issue's goal for its kind; bad ones say why."""
    import importlib

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    bench = importlib.import_module("bench_attention")
    one = bench.parse_shape("decode 1 x 2K")
    assert (one.seq_lens, one.q_lens, one.num_qo_heads, one.num_kv_heads, one.page_size, one.head_dim) == (
        (2048,), (1,), 32, 8, 16, 128)
    assert one.target.startswith("<= 1.0x") and one.name == "decode 1 x 2K"
    rag = bench.parse_shape("decode  ragged 64 x 0.1K-8K 32/4 heads page 32")
    assert rag.name == "decode ragged 64 x 0.1K-8K 32/4 heads page 32" and rag.target.startswith("<= 0.45x")
    assert len(rag.seq_lens) == 64 and min(rag.seq_lens) == 102 and max(rag.seq_lens) == 8192
    assert len(set(rag.seq_lens)) > 32 and (rag.num_qo_heads, rag.num_kv_heads, rag.page_size) == (32, 4, 32)
    assert bench.parse_shape("decode ragged 64 x 0.1K-8K").seq_lens == rag.seq_lens  # fixed, no seed
    uni = bench.parse_shape("decode 256 x 300 hd 64")
    assert uni.seq_lens == (300,) * 256 and uni.head_dim == 64 and uni.target.startswith("<= 0.40x")
    for bad, says in [("prefill 1 x 2K", "not a shape description"), ("decode 1 x 2Q", "not a number of tokens"),
                      ("decode ragged 4 x 8K", "LO-HI"), ("decode ragged 4 x 8K-1K", "shorter length first"),
                      ("decode 0 x 1K", "at least 1 request"), ("decode 1 x 1K 30/8 heads", "multiple of the KV"),
                      ("decode 1 x 1K page", "cannot read 'page'"), ("decode 1 x 0", "at least 1")]:
        with pytest.raises(ValueError, match=says):
            bench.parse_shape(bad)
