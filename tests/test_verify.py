"""``nvfp4compat verify``: the matrix against the real installed FlashInfer / vLLM.

Tests marked ``flashinfer`` run in the per-release nox sessions (a real flashinfer-python
installed ``--no-deps`` with the matrix's ``cpu_import.requirements``); they skip where FlashInfer
is not installed. Tests marked ``vllm`` likewise need a real vLLM release.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

import pytest

from nvfp4compat import detect, load_matrix, resolve
from nvfp4compat.cli import main
from nvfp4compat.verify import Check, _fmt_params, run, verify_flashinfer, verify_vllm

SLOT = "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping"


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


HAS_FI = _installed("flashinfer-python") and importlib.util.find_spec("flashinfer") is not None
HAS_VLLM = _installed("vllm")
needs_fi = pytest.mark.skipif(not HAS_FI, reason="flashinfer-python is not installed (run via nox -s flashinfer)")
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed (run via nox -s vllm)")


def _fi_version() -> str:
    return importlib.metadata.version("flashinfer-python")


# ------------------------------------------------------------------ without FlashInfer


def test_check_renders_a_readable_diff() -> None:
    ok = Check("flashinfer 0.6.15", "writer scale check", "host_sync", "host_sync", True)
    bad = Check("flashinfer 0.6.15", "writer scale check", "host_sync", "device_trap", False)
    assert ok.render().startswith("ok ")
    r = bad.render()
    assert r.startswith("DRIFT") and "- matrix:    host_sync" in r and "+ installed: device_trap" in r


def test_params_are_formatted_like_the_matrix() -> None:
    def f(a, b, kv_layout="NHD", *, nvfp4_4over6=None, **kw):  # type: ignore[no-untyped-def]
        return a

    assert _fmt_params(f) == ["a", "b", "kv_layout='NHD'", "*", "nvfp4_4over6=None", "**kw"]


@pytest.mark.skipif(HAS_FI or HAS_VLLM, reason="checks the nothing-installed path")
def test_run_with_nothing_installed() -> None:
    checks, msgs, code = run(load_matrix())
    assert code == 0 and checks == [] and any("flashinfer-python is not installed" in x for x in msgs)
    checks, _, code = run(load_matrix(), expect_flashinfer="0.6.15")
    assert code == 1 and not checks[0].ok and checks[0].claim == "installed release"


# ------------------------------------------------------------------- with FlashInfer


@pytest.mark.flashinfer
@needs_fi
def test_verify_installed_flashinfer_is_clean(capsys: pytest.CaptureFixture[str]) -> None:
    m = load_matrix()
    v = _fi_version()
    assert m.flashinfer_release(v) is not None, f"flashinfer {v} is not in matrix/flashinfer.yaml"
    checks, _, code = run(m, expect_flashinfer=v)
    drift = [c.render() for c in checks if not c.ok]
    assert code == 0, "\n".join(drift)
    assert len(checks) >= 30
    rc = main(["verify", "--quiet", "--expect-flashinfer", v])
    out = capsys.readouterr().out
    assert rc == 0 and "0 drifted" in out


@pytest.mark.flashinfer
@needs_fi
def test_verify_detects_drift() -> None:
    m = load_matrix()
    v = _fi_version()
    rel = m.flashinfer_release(v)
    assert rel is not None
    h = rel.helpers["nvfp4_kv_dequantize"]  # present in every release
    wrong = rel.model_copy(update={
        "helpers": {**rel.helpers, "nvfp4_kv_dequantize": h.model_copy(update={"defined_at": "flashinfer/elsewhere.py:1", "compute_capability": [80]})},
        "scale_check": rel.scale_check.model_copy(update={"mode": "device_trap" if rel.scale_check.mode == "host_sync" else "host_sync"}),
    })
    bad = {c.claim for c in verify_flashinfer(m, v, wrong) if not c.ok}
    assert "nvfp4_kv_dequantize defined at" in bad
    assert any(c.startswith("nvfp4_kv_dequantize is_compute_capability_supported") for c in bad)
    assert "writer scale check" in bad


@pytest.mark.flashinfer
@needs_fi
def test_detect_probes_agree_with_matrix_and_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    m = load_matrix()
    rel = m.flashinfer_release(_fi_version())
    assert rel is not None
    static = detect(environ={"NVFP4COMPAT_ARCH": "sm_90"})
    assert static.flashinfer == rel.version
    assert static.flashinfer_helpers == {h: s.present for h, s in rel.helpers.items()}
    imported = detect(import_modules=True, environ={"NVFP4COMPAT_ARCH": "sm_90"})
    assert imported.flashinfer_probe == "module" and imported.flashinfer_import_error is None
    assert imported.flashinfer_helpers == static.flashinfer_helpers
    if imported.arch == "sm_90" and imported.triton is not None:
        plan = resolve(m, imported)
        assert plan.impl("write") == ("flashinfer" if rel.helpers[SLOT].present else "triton")
        assert not [w for w in plan.warnings if "disagree" in w]


# ------------------------------------------------------------------------- with vLLM


@pytest.mark.vllm
@needs_vllm
def test_verify_installed_vllm_is_clean() -> None:
    m = load_matrix()
    v = importlib.metadata.version("vllm")
    rel = m.vllm_release(v)
    assert rel is not None, f"vllm {v} is not in matrix/vllm.yaml"
    checks = verify_vllm(m, v, rel)
    assert all(c.ok for c in checks), "\n".join(c.render() for c in checks if not c.ok)
