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
    assert {r["kv_cache_bytes"] for r in prefill} == {5 * 129 * 16 * per_token}  # 2049 tokens: 129 blocks
    assert all(r["requests"] == 5 and r["new_tokens"] == 1 for r in prefill)
    assert serve[0]["backend"] is None and serve[1]["backend"] == "FLASHINFER"


def test_bench_serving_refuses_an_unknown_mode():
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_serving.py"), "--dry-run", "--modes", "serve,decode"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--modes: unknown ['decode']" in proc.stderr and "Traceback" not in proc.stderr


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


def test_bench_attention_variants_keeps_the_default_and_the_named_sweep_rows(tmp_path):
    """``--variants``: the default row and only the sweep rows whose label holds a given substring."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_attention.py"), "--quick",
         "--shapes", "quick decode B=2 L=200", "--variants", "swapped QK"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    labels = [ln.split("|")[2].strip() for ln in out.splitlines() if ln.startswith("| triton NVFP4 |")]
    assert labels and labels[0].startswith("default"), out[-4000:]
    assert any("swapped QK" in x for x in labels), labels
    assert not any("byte scales" in x or "prefetch" in x for x in labels[1:]), labels
