"""A user's path: README code blocks run verbatim, matrix evidence a reader can open, and every CLI
failure is one line and an exit code (2 usage, 1 not supported here, 3 unverified), never a traceback."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from nvfp4compat.cli import EXIT_UNVERIFIED, main

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NVFP4COMPAT_IMPL", "NVFP4COMPAT_ARCH", "NVFP4COMPAT_DISABLE_TRITON", "NVFP4COMPAT_DEBUG"):
        monkeypatch.delenv(name, raising=False)


def _blocks(lang: str) -> list[str]:
    """README code blocks whose info string is exactly ``lang`` (``bash gpu`` blocks need a GPU machine)."""
    text = (REPO / "README.md").read_text()
    return [m.group(2) for m in re.finditer(r"^```([^\n]*)\n(.*?)^```", text, re.S | re.M) if m.group(1).strip() == lang]


def _readme_commands() -> list[str]:
    # The first bash block holds the two set-up commands (tests/test_packaging.py, CI run them).
    lines = [ln for block in _blocks("bash")[1:] for ln in block.splitlines() if ln.strip()]
    return [ln.split("  #")[0].strip() for ln in lines]


def test_readme_has_the_blocks_a_user_needs() -> None:
    cmds = " ".join(_readme_commands())
    for needed in ("nvfp4compat query", "nvfp4compat constraints", "nvfp4compat doctor --explain", "nvfp4compat errors"):
        assert needed in cmds, f"README has no runnable `{needed}` block"
    assert len(_blocks("python")) == 1
    gpu = " ".join(_blocks("bash gpu"))
    assert "vllm serve <model> --kv-cache-dtype nvfp4" in gpu and "pip install -e '.[triton]'" in gpu


@pytest.mark.parametrize("command", _readme_commands())
def test_readme_command_runs_verbatim(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = shlex.split(command)
    assert argv[0] == "nvfp4compat", f"a README bash block that needs no GPU runs only nvfp4compat: {command!r}"
    rc = main(argv[1:])
    out, err = capsys.readouterr()
    assert rc == 0 and out and not err, f"{command!r} -> rc {rc}\n{out}\n{err}"


def test_readme_python_snippet_runs_verbatim() -> None:
    (code,) = _blocks("python")
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(compile(code, "README.md", "exec"), {})  # noqa: S102 - the README's own snippet
    assert "SUPPORTED" in out.getvalue()


# ---------------------------------------------------------------------------------------- evidence

_UPSTREAM_ROOTS = ("vllm/", "flashinfer/", "csrc/", "include/", "python/")
_PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)+[\w.-]+\.(?:md|py|yaml|yml|log|csv|txt|sh|toml)|[\w.-]+\.md)\b")


def _evidence(node: object, where: str = ""):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "evidence" and isinstance(v, str):
                yield where, v
            else:
                yield from _evidence(v, f"{where}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _evidence(v, f"{where}[{i}]")


def _repo_paths(text: str) -> list[str]:
    """Paths in an evidence text that name this repository (upstream ``vllm/...``, ``flashinfer/...`` are not)."""
    found = []
    for m in _PATH.finditer(text):
        path = m.group(1)
        if path.startswith(_UPSTREAM_ROOTS) or path.startswith(("http", "github.com")):
            continue
        found.append(path)
    return found


@pytest.mark.parametrize("fname", sorted(p.name for p in (REPO / "matrix").glob("*.yaml")))
def test_evidence_names_only_paths_that_exist(fname: str) -> None:
    data = yaml.safe_load((REPO / "matrix" / fname).read_text())
    missing = []
    for where, text in _evidence(data):
        for path in _repo_paths(text):
            candidates = [REPO / path, REPO / "matrix" / path, REPO / "docs" / path]
            if not any(c.exists() for c in candidates):
                missing.append(f"{fname}{where}: {path}")
    assert not missing, "evidence names paths that are not in the repository:\n" + "\n".join(missing)


def test_evidence_path_check_can_fail() -> None:
    assert _repo_paths("see shared/docs/vllm-nvfp4.md §3 and vllm/v1/attention/backend.py:307 [0.33.0]") == [
        "shared/docs/vllm-nvfp4.md"
    ]
    assert _repo_paths("field-notes.md §1.8") == ["field-notes.md"]


# ---------------------------------------------------------------------------------------- CLI failures


def _one_line(err: str) -> None:
    assert err.count("\n") == 1 and "Traceback" not in err, err


def test_unknown_arch_is_unverified(capsys: pytest.CaptureFixture[str]) -> None:
    for arch in ("sm_999", "sm_91"):
        rc = main(["query", "--arch", arch, "--no-trace"])
        out, _ = capsys.readouterr()
        assert rc == EXIT_UNVERIFIED == 3, (arch, rc)
        assert out.splitlines()[0].endswith(f"plan: UNVERIFIED ({arch} is not in the matrix)"), out
    # vLLM 0.26.0 refuses compute capability 99.9 whatever the plugin does: not supported, never rc 0
    rc = main(["query", "--arch", "sm_999", "--vllm", "0.26.0", "--no-trace"])
    out, _ = capsys.readouterr()
    assert rc == 1 and "NOT SUPPORTED (sm_999 is not in the matrix)" in out
    assert main(["query", "--arch", "sm_90", "--no-trace"]) == 0


def test_duplicate_impl_op_is_usage_error(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVFP4COMPAT_IMPL", "decode=flashinfer,decode=triton")
    rc = main(["query", "--arch", "sm_90"])
    _, err = capsys.readouterr()
    assert rc == 2 and "decode is given twice" in err
    _one_line(err)


def test_disable_triton_must_be_on_or_off(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVFP4COMPAT_DISABLE_TRITON", "nope")
    rc = main(["doctor"])
    _, err = capsys.readouterr()
    assert rc == 2 and "'nope'" in err and "1, true, yes, on" in err
    _one_line(err)
    monkeypatch.setenv("NVFP4COMPAT_DISABLE_TRITON", "off")
    assert main(["doctor", "--json"]) in (0, 1)


def test_sm75_suggests_nothing_that_cannot_help(capsys: pytest.CaptureFixture[str]) -> None:
    main(["query", "--arch", "sm_75", "--vllm", "0.26.0"])
    out, _ = capsys.readouterr()
    assert "pip install" not in out and "not supported" in out


def test_query_labels_and_options(capsys: pytest.CaptureFixture[str]) -> None:
    main(["query", "--arch", "sm_90", "--vllm", "0.26.0"])
    out, _ = capsys.readouterr()
    assert "vLLM 0.26.0 pins torch 2.11.0" in out and "triton: any" not in out
    assert "nvfp4_4over6=false" in out and "{'" not in out


def test_explain_is_linear_in_the_message(capsys: pytest.CaptureFixture[str]) -> None:
    crafted = ("flashinfer-cubin version (" * 40000)[: 1 << 20]
    t0 = time.perf_counter()
    rc = main(["doctor", "--explain", crafted])
    assert time.perf_counter() - t0 < 2.0
    out, _ = capsys.readouterr()
    assert rc == 1 and "nvfp4compat errors" in out


def test_unknown_placeholder_fails_at_load(tmp_path: Path) -> None:
    from nvfp4compat.loader import MatrixError, load_matrix

    for f in (REPO / "matrix").glob("*.yaml"):
        (tmp_path / f.name).write_text(f.read_text())
    errs = tmp_path / "errors.yaml"
    errs.write_text(errs.read_text().replace("({writer_releases})", "({no_such_placeholder})", 1))
    with pytest.raises(MatrixError, match=r"unknown placeholder.*\{no_such_placeholder\}"):
        load_matrix(tmp_path)


def test_errors_lists_every_known_message(capsys: pytest.CaptureFixture[str]) -> None:
    from nvfp4compat.loader import load_matrix

    assert main(["errors"]) == 0
    out, _ = capsys.readouterr()
    for e in load_matrix().errors:
        assert f"[{e.id}]" in out and all(p in out for p in e.match)


class _Full(io.TextIOBase):
    def write(self, s: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class _Closed(io.TextIOBase):
    def write(self, s: str) -> int:
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


@pytest.mark.parametrize(("stream", "needle"), [(_Full, "No space left"), (_Closed, "broken pipe")])
def test_unwritable_output_is_one_line(stream: type, needle: str, monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr(sys, "stdout", stream())
    monkeypatch.setattr(sys, "stderr", err)
    assert main(["matrix"]) == 1
    _one_line(err.getvalue())
    assert needle in err.getvalue()


def test_full_disk_through_the_console(tmp_path: Path) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "nvfp4compat", "matrix"], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 1
    _one_line(proc.stderr)


def _demo(tmp_path: Path, *args: str, block: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    path = [str(REPO)]
    if block is not None:  # a module that fails to import, as an uninstalled one does
        (tmp_path / f"{block}.py").write_text(f'raise ImportError("No module named {block}")\n')
        path.insert(0, str(tmp_path))
    env["PYTHONPATH"] = os.pathsep.join(path)
    return subprocess.run([sys.executable, "-m", "nvfp4compat", "demo", *args], env=env, capture_output=True,
                          text=True, timeout=300)


def test_demo_without_torch_is_one_line(tmp_path: Path) -> None:
    proc = _demo(tmp_path, block="torch")
    assert proc.returncode == 1 and "torch is not installed" in proc.stderr
    _one_line(proc.stderr)


def test_demo_forced_flashinfer_without_flashinfer_is_one_line(tmp_path: Path) -> None:
    proc = _demo(tmp_path, "--impl", "flashinfer", "--device", "cpu", block="flashinfer")
    assert proc.returncode == 1 and "--impl flashinfer cannot load here" in proc.stderr
    _one_line(proc.stderr)


def test_demo_on_cpu_says_so_once(tmp_path: Path) -> None:
    proc = _demo(tmp_path, "--device", "cpu")
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr
    assert "NOT SUPPORTED" not in out
    assert out.count("no GPU here: running the Triton kernels in the interpreter") == 1
    reasons = [ln for ln in out.splitlines() if "reason" in ln]
    assert len(reasons) == len(set(reasons))


def test_help_is_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["demo", "--help"], ["query", "--help"]):
        with contextlib.suppress(SystemExit):
            main(argv)
        out, _ = capsys.readouterr()
        assert out and "``" not in out, argv


def test_plugin_logs_one_line_when_apply_fails(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import nvfp4compat.vllm_plugin as plugin

    def broken(plan, refuse_here=False):
        raise AttributeError("module 'vllm.v1.attention.backends.flashinfer' has no attribute 'FlashInferImpl'")

    monkeypatch.setattr(plugin, "_REGISTERED", False)
    monkeypatch.setattr(plugin, "_resolve_here", lambda: (object(), False))
    monkeypatch.setattr(plugin, "apply", broken)
    with caplog.at_level("DEBUG", logger=plugin.logger.name):
        plugin.register()
    above_debug = [r for r in caplog.records if r.levelname != "DEBUG"]
    assert len(above_debug) == 1 and above_debug[0].levelname == "WARNING"
    assert "FlashInferImpl" in above_debug[0].getMessage() and above_debug[0].exc_info is None
    monkeypatch.setattr(plugin, "_REGISTERED", False)


def test_docs_index_lists_every_document() -> None:
    index = (REPO / "docs" / "README.md").read_text()
    for doc in sorted((REPO / "docs").glob("*.md")):
        if doc.name != "README.md":
            assert f"]({doc.name})" in index, f"docs/README.md does not list {doc.name}"
    for doc in (REPO / "docs").glob("*.md"):
        # "issue N" as a tracker reference ("warps issue 2 x 1577" instructions is not one)
        assert not re.search(r"\b[Ii]ssues? \d+\b(?!\s*x\b)", doc.read_text()), f"{doc.name} names an issue number"
