"""The end-to-end runner's pure logic (scripts/gpu_bundle/run_on_device.py), on the CPU.

The runner itself runs on the GPU host; what decides a check's verdict is plain Python and is tested
here: the job plan per check, the divergence analysis between CUDA-graph modes, the recall check's
verdict, and the compile-cache chunks that must fit the device's return limits.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

RUNNER = Path(__file__).resolve().parents[1] / "scripts" / "gpu_bundle" / "run_on_device.py"


@pytest.fixture(scope="module")
def rod():
    spec = importlib.util.spec_from_file_location("run_on_device", RUNNER)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["run_on_device"] = mod
    spec.loader.exec_module(mod)
    return mod


def _gen(tokens, tops):
    return {"ok": True, "token_ids": tokens, "top_logprobs": tops}


def test_divergence_reports_margin_and_drift(rod):
    base = _gen(
        [[1, 2, 3], [4, 5, 6]],
        [
            [[(1, -1.0), (9, -2.0)], [(2, -1.0), (8, -1.05)], [(3, -1.0), (7, -3.0)]],
            [[(4, -1.0), (5, -1.5)], [(5, -1.0), (8, -1.02)], [(6, -1.0), (5, -2.0)]],
        ],
    )
    other = _gen(
        [[1, 2, 3], [4, 8, 6]],
        [
            [[(1, -1.02), (9, -2.0)], [(2, -1.0), (8, -1.05)], [(3, -1.0), (7, -3.0)]],
            [[(4, -1.03), (5, -1.5)], [(8, -1.0), (5, -1.0)], [(6, -1.0), (5, -2.0)]],
        ],
    )
    d = rod.divergence(base, other)
    assert d["prompts_matching"] == "1/2" and not d["matches"]
    assert d["first_divergence"] == [None, 1]
    assert d["base_margin_at_divergence"] == [pytest.approx(0.02)]
    assert d["max_logprob_diff_before_divergence"] == pytest.approx(0.03)


def _engine_result(
    gen=None, recall=None, plugin_line="nvfp4compat: write=triton, decode=triton, prefill=triton"
):
    tasks = {"start": {"ok": True}}
    if gen is not None:
        tasks["generate"] = gen
    if recall is not None:
        tasks["recall"] = {"ok": True, "recall": recall, "table": {}}
    return {"tasks": tasks, "log_lines": {"plugin": [plugin_line], "cudagraph": []}}


def test_plugin_check_judges_graph_modes_against_the_bf16_control(rod):
    jobs = rod.plan_jobs(["plugin"], "0.6.14", "0.6.15")
    names = {j.name for j in jobs}
    assert {"nvfp4-full-decode-optin-fi0.6.14-plugin", "auto-piecewise-fi0.6.14-plugin"} <= names
    eager = _gen([[1, 2]], [[[(1, -1.0), (2, -1.01)], [(2, -1.0), (3, -3.0)]]])
    near_tie = _gen([[2, 2]], [[[(2, -1.0), (1, -1.01)], [(2, -1.0), (3, -3.0)]]])
    # parts from eager where eager's margin is 2.0 nats: not rounding noise
    real = _gen([[1, 3]], [[[(1, -1.0), (2, -1.01)], [(3, -1.0), (2, -3.0)]]])
    for j in jobs:
        if j.kind != "engine":
            j.result = {"tasks": {"preflight": {"ok": True}}, "log_lines": {"plugin": []}}
        elif j.mode == "piecewise" and j.kv == "nvfp4":
            j.result = _engine_result(near_tie)
        elif j.mode == "full-decode-optin":
            j.result = _engine_result(real)
        elif j.mode == "full":
            j.result = {
                "tasks": {"start": {"ok": False, "error": "FULL not supported"}},
                "log_lines": {},
            }
        else:
            j.result = _engine_result(eager)
    r = rod.evaluate(["plugin"], jobs, "0.6.14", "0.6.15")["plugin"]
    assert r["passed"] and r["write_binding"] == "triton"
    assert r["modes"]["piecewise"]["consistent_with_eager"] is True
    assert r["modes"]["full-decode-optin"]["consistent_with_eager"] is False
    assert not r["modes"]["full"]["started"]


def test_recall_check_needs_every_nvfp4_binding_within_one_point(rod):
    jobs = rod.plan_jobs(["recall"], "0.6.14", "0.6.15")
    engines = [j for j in jobs if j.kind == "engine"]
    assert {(j.kv, j.fi, j.impl) for j in engines} == {
        ("nvfp4", "0.6.14", ""),
        ("auto", "0.6.14", ""),
        ("fp8", "0.6.14", ""),
        ("nvfp4", "0.6.15", ""),
        ("nvfp4", rod.FI_FA2_READ, "decode=flashinfer,prefill=flashinfer"),
    }
    assert all(j.model == "recall" for j in engines)

    def verdict(fa2_8k):
        for j in jobs:
            rec = {"2048": 1.0, "4096": 0.99, "8192": 0.98}
            if j.fi == rod.FI_FA2_READ:
                rec["8192"] = fa2_8k
            j.result = _engine_result(recall=rec)
        return rod.evaluate(["recall"], jobs, "0.6.14", "0.6.15")["recall"]

    ok = verdict(0.975)
    assert ok["passed"] and ok["worst_points_below_bf16"] == pytest.approx(0.5)
    bad = verdict(0.96)
    assert not bad["passed"] and bad["worst_points_below_bf16"] == pytest.approx(2.0)


def test_compile_caches_come_back_in_chunks_and_restore(rod, tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".cache" / "flashinfer" / "m").mkdir(parents=True)
    blob = bytes(range(256)) * 8192  # 2 MiB
    (home / ".cache" / "flashinfer" / "m" / "a.so").write_bytes(blob)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(rod, "CACHE_CHUNK", 64 << 10)  # small chunks: several files come back
    monkeypatch.setattr(rod, "CACHE_LIMIT", 64 << 20)
    out = tmp_path / "out"
    out.mkdir()
    msg = rod.save_caches(out)
    chunks = sorted(p.name for p in out.iterdir())
    assert chunks and all(n.startswith("caches.tar.xz.") for n in chunks), msg
    assert all((out / n).stat().st_size <= 64 << 10 for n in chunks)
    bundle = tmp_path / "bundle" / "caches"
    bundle.mkdir(parents=True)
    for n in chunks:
        (bundle / n).write_bytes((out / n).read_bytes())
    (home / ".cache" / "flashinfer" / "m" / "a.so").unlink()
    state: dict = {}
    rod.restore_caches(bundle.parent, state)
    assert (home / ".cache" / "flashinfer" / "m" / "a.so").read_bytes() == blob
    assert state["caches"]
