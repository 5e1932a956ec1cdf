"""The ``nvfp4compat`` command line: subcommands, exit codes, one-line errors, README table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nvfp4compat.cli import EXTERNAL_COMMANDS, main
from nvfp4compat.loader import load_matrix
from nvfp4compat.table import matrix_markdown

REPO = Path(__file__).resolve().parent.parent


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(autouse=True)
def _no_impl_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NVFP4COMPAT_IMPL", raising=False)
    monkeypatch.delenv("NVFP4COMPAT_ARCH", raising=False)
    monkeypatch.delenv("NVFP4COMPAT_DISABLE_TRITON", raising=False)


def test_query_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "query", "--arch", "sm_90", "--flashinfer", "0.6.14", "--vllm", "0.26.0")
    assert rc == 0 and "plan: SUPPORTED" in out and "write    -> triton" in out and "strategy backport" in out
    rc, out, _ = run(capsys, "query", "--arch", "sm_90", "--flashinfer", "0.6.15", "--vllm", "0.26.0", "--json")
    data = json.loads(out)
    assert rc == 0 and data["bindings"]["write"]["impl"] == "flashinfer" and data["supported"] is True


def test_query_unsupported_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "query", "--arch", "sm_90", "--flashinfer", "0.6.14", "--vllm", "0.26.0", "--no-triton")
    assert rc == 1 and "NOT SUPPORTED" in out and "FlashInfer NVFP4 slot-mapping KV cache update is required" in out


def test_query_impl_and_env(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    rc, out, _ = run(capsys, "query", "--arch", "sm_90", "--flashinfer", "0.6.15", "--impl", "write=triton", "--json")
    assert rc == 0 and json.loads(out)["bindings"]["write"]["source"] == "argument"
    monkeypatch.setenv("NVFP4COMPAT_IMPL", "triton")
    rc, out, _ = run(capsys, "query", "--arch", "sm_90", "--flashinfer", "0.6.15", "--json")
    assert json.loads(out)["bindings"]["write"]["source"] == "environment"


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["query", "--arch", "sm_9O"], "invalid arch 'sm_9O'"),
        (["query", "--arch", "sm_90", "--flashinfer", "latest"], "invalid version 'latest'"),
        (["query", "--arch", "sm_90", "--frobnicate"], "unrecognized arguments: --frobnicate"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "required: COMMAND"),
        (["query", "--arch", "sm_90", "--impl", "write=cuda"], "unknown implementation 'cuda'"),
        (["query", "--arch", "sm_90", "--flashinfer", "0.6.14", "--impl", "write=flashinfer"], "cannot run here"),
        (["constraints", "--vllm", "0.26.0", "--flashinfer", "0.6.9"], "FlashInfer 0.6.9 is not in matrix/flashinfer.yaml"),
        (["matrix", "--format", "html"], "invalid choice: 'html'"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    rc, out, err = run(capsys, *argv)
    assert rc == 2, (out, err)
    assert out == ""
    assert err.count("\n") == 1 and needle in err, err


def test_doctor_without_gpu_still_resolves(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "doctor", "--no-trace")
    assert "facts:" in out and "bindings:" in out
    if "arch: unknown" in out:
        assert "no GPU arch known" in out and rc == 1


def test_doctor_with_env_arch(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVFP4COMPAT_ARCH", "sm_90")
    rc, out, _ = run(capsys, "doctor", "--json")
    data = json.loads(out)
    if data["facts"]["arch_source"] == "environment":
        assert data["facts"]["arch"] == "sm_90"
        assert data["bindings"]["decode"]["impl"] in ("triton", "flashinfer", None)
        assert data["facts"]["source"] == "detect"


@pytest.mark.parametrize(
    "text, entry",
    [
        ("Selected backend AttentionBackendEnum.FLASHINFER is not valid for this configuration. Reason: ['kv_cache_dtype not supported']", "kv_cache_dtype_not_supported"),
        ("FlashInfer NVFP4 slot-mapping KV cache update is required: found FlashInfer 0.6.14", "slot_mapping_writer_required"),
        ("torch.AcceleratorError: CUDA error: no kernel image is available for execution on the device", "no_kernel_image"),
        ("RuntimeError: flashinfer-cubin version (0.6.13) does not match flashinfer version (0.6.15). Please install the same version of both packages.", "flashinfer_version_mismatch"),
        ("AssertionError: XQA NVFP4 KV is only supported on SM120 GPUs", "xqa_nvfp4_sm12x_only"),
        ("ValueError: --kv-cache-dtype nvfp4 requires the SM100 trtllm-gen FlashInfer path.", "trtllm_gen_path_required"),
    ],
)
def test_doctor_explain_known_messages(capsys: pytest.CaptureFixture[str], text: str, entry: str) -> None:
    rc, out, _ = run(capsys, "doctor", "--explain", text)
    assert rc == 0 and f"[{entry}]" in out and "cause:" in out and "fix:" in out


def test_explain_fills_placeholders_from_matrix(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "doctor", "--explain", "FlashInfer NVFP4 slot-mapping KV cache update is required")
    assert "0.6.15..0.7.4" in out and "flashinfer-python==0.6.15" in out and "{" not in out
    rc, out, _ = run(capsys, "doctor", "--explain", "something nobody has seen")
    assert rc == 1 and "no known NVFP4 error matches" in out


def test_matrix_markdown_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "matrix", "--format", "markdown")
    assert rc == 0 and out == matrix_markdown(load_matrix())
    assert "| 0.26.0 (0.6.14) |" in out and "backport: W Triton, R Triton" in out
    rc, out, _ = run(capsys, "matrix", "--format", "json")
    data = json.loads(out)
    assert data["computed"]["vllm_by_arch"]["0.33.0"]["sm_100"] == "native"
    assert len(data["flashinfer"]) == len(load_matrix().flashinfer)


def test_readme_table_is_current() -> None:
    readme = REPO / "README.md"
    text = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    if "<!-- matrix:begin -->" not in text:
        pytest.skip("README.md has no compatibility table yet: paste `nvfp4compat matrix --format markdown` between <!-- matrix:begin --> and <!-- matrix:end -->")
    assert "<!-- matrix:end -->" in text, "README.md has <!-- matrix:begin --> but no <!-- matrix:end -->"
    current = text.split("<!-- matrix:begin -->", 1)[1].split("<!-- matrix:end -->", 1)[0]
    assert current.strip() == matrix_markdown(load_matrix()).strip(), (
        "README compatibility table is stale: regenerate with `nvfp4compat matrix --format markdown`"
    )


def test_constraints(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "constraints", "--vllm", "0.26.0", "--flashinfer", "0.6.15")
    assert rc == 0 and "pip install --no-deps flashinfer-python==0.6.15" in out and "known combination (expected)" in out
    rc, out, _ = run(capsys, "constraints", "--vllm", "0.25.1", "--flashinfer", "0.6.15", "--json")
    data = json.loads(out)
    assert "pip install --no-deps flashinfer-cubin==0.6.15" in data["pip_lines"]
    assert any("FLASHINFER_DISABLE_VERSION_CHECK" in n for n in data["notes"])
    rc, out, _ = run(capsys, "constraints", "--vllm", "0.33.0", "--flashinfer", "0.6.14")
    assert "does not work" in out
    rc, out, _ = run(capsys, "constraints", "--vllm", "0.33.0", "--flashinfer", "0.7.2.post1")
    assert "pinned" in out and "--no-deps" not in out


def test_external_demo_command_is_registered_lazily(capsys: pytest.CaptureFixture[str]) -> None:
    assert "demo" in EXTERNAL_COMMANDS
    try:
        import nvfp4compat.demo  # noqa: F401
    except ModuleNotFoundError:
        rc, out, err = run(capsys, "demo")
        assert rc == 2 and err.count("\n") == 1 and "no nvfp4compat.demo module" in err
    else:
        rc, out, _ = run(capsys, "demo", "--help")
        assert rc == 0 and "nvfp4compat demo" in out


def test_version_flag_and_python_m(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        main(["--version"])
    assert ei.value.code == 0 and "nvfp4compat 0.1.0" in capsys.readouterr().out
    r = subprocess.run([sys.executable, "-m", "nvfp4compat", "query", "--arch", "sm_86", "--vllm", "0.31.0", "--no-trace"],
                       cwd=REPO, capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert r.returncode == 0 and "strategy backport" in r.stdout, r.stderr


def test_query_vllm_0_34_0_names_its_real_pin(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "query", "--arch", "sm_90", "--vllm", "0.34.0", "--json")
    plan = json.loads(out)
    assert rc == 0 and plan["supported"] and not plan["planned_from"] and err == ""
    assert not [u for u in plan["unverified"] if "vllm" in u]
    assert plan["facts"]["flashinfer"] == "0.7.4"
    assert any("pins flashinfer-python==0.7.3, which is not on the package index" in n for n in plan["facts"]["notes"])


def test_query_unknown_release_is_loud_and_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "query", "--arch", "sm_90", "--vllm", "0.33.5", "--flashinfer", "0.7.4", "--no-trace")
    assert rc == 3
    assert "plan: UNVERIFIED (planned from the nearest release in the matrix: vllm 0.33.0)" in out
    assert err.startswith("WARNING: vLLM 0.33.5 is not in matrix/vllm.yaml: planned from the nearest known release 0.33.0")
    rc, out, err = run(capsys, "query", "--arch", "sm_90", "--flashinfer", "0.7.0rc9", "--json")
    assert rc == 3 and json.loads(out)["planned_from"] == {"flashinfer": "0.6.18.post1"}
    assert "WARNING: FlashInfer 0.7.0rc9 is not in matrix/flashinfer.yaml" in err


def test_query_unknown_vllm_takes_no_pin_from_the_nearest_release(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "query", "--arch", "sm_90", "--vllm", "0.33.5", "--json")
    plan = json.loads(out)
    assert plan["facts"]["flashinfer"] is None and plan["facts"]["torch"] is None
    assert any("its flashinfer-python pin is unknown" in n for n in plan["facts"]["notes"])
    assert not any("0.7.2.post1" in n for n in plan["facts"]["notes"])


def test_query_unreleased_version_is_not_supported(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "query", "--arch", "sm_90", "--vllm", "0.35.0", "--flashinfer", "0.7.4", "--no-trace")
    assert rc == 1 and "plan: NOT SUPPORTED" in out
    assert "vLLM 0.35.0 is unknown/unreleased as of 2026-12-02 (the newest release on the index then was 0.34.0)" in out
    assert "WARNING: vLLM 0.35.0 is not in matrix/vllm.yaml" in err
    rc, out, _ = run(capsys, "query", "--arch", "sm_90", "--flashinfer", "0.7.5", "--no-trace")
    assert rc == 1 and "FlashInfer 0.7.5 is unknown/unreleased as of 2026-12-02" in out


def test_doctor_warns_about_an_unknown_installed_release(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import nvfp4compat.facts as facts_mod

    real = facts_mod.detect

    def fake_detect(**kwargs: object) -> facts_mod.SystemFacts:
        return real(**kwargs).model_copy(update={"vllm": "0.33.5", "arch": "sm_90"})

    monkeypatch.setattr(facts_mod, "detect", fake_detect)
    rc, out, err = run(capsys, "doctor", "--no-trace")
    assert "WARNING: vLLM 0.33.5 is not in matrix/vllm.yaml: planned from the nearest known release 0.33.0" in err
    assert "unknown/unreleased" not in out  # an installed release exists; only a query can name one that does not


def test_constraints_vllm_0_34_0_without_flashinfer(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "constraints", "--vllm", "0.34.0", "--json")
    rep = json.loads(out)
    assert rc == 0 and rep["flashinfer"] == "0.7.4" and rep["pinned_flashinfer"] == "0.7.3"
    assert rep["status"] == "known combination (verified)"
    assert rep["pip_lines"][0] == "pip install --no-deps vllm==0.34.0"
    assert rep["pip_lines"][-1] == "pip install flashinfer-python==0.7.4"
    assert rep["uv_overrides"] == ["flashinfer-python==0.7.4"]
    rc, out, _ = run(capsys, "constraints", "--vllm", "0.33.0")
    assert rc == 0 and "pip install vllm==0.33.0" in out and "FlashInfer 0.7.2.post1: pinned" in out
    rc, _, err = run(capsys, "constraints", "--vllm", "0.35.0")
    assert rc == 2 and "vLLM 0.35.0 is not in matrix/vllm.yaml, so its pins are unknown" in err


def test_query_local_build_keeps_its_release_pins(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "query", "--arch", "sm_90", "--vllm", "0.33.0+cu130", "--json")
    plan = json.loads(out)
    assert plan["facts"]["flashinfer"] == "0.7.2.post1" and plan["planned_from"] == {} and err == ""
