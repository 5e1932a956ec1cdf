"""``nvfp4compat`` command line.

Subcommands::

    nvfp4compat query --arch sm_90 --flashinfer 0.6.14 --vllm 0.26.0 [--json]
    nvfp4compat doctor [--json] [--explain "<error text>"]
    nvfp4compat errors
    nvfp4compat matrix [--format markdown|json]
    nvfp4compat verify [--expect-flashinfer X] [--expect-vllm Y] [--emit [--wheel vllm-X.whl]]
    nvfp4compat constraints --vllm X [--flashinfer Y] [--json]
    nvfp4compat demo ...        (nvfp4compat.demo:main, loaded lazily)
    nvfp4compat validate --model <path or name> ...   (nvfp4compat.validation.command:main, lazily)

Exit codes: 0 ok (``query``/``doctor``: a supported plan), 1 not supported here (an unsupported
plan, drift in ``verify``, a failed demo, output that cannot be written), 2 bad input (usage), 3
unverified (``query``/``doctor``: a plan that would serve, on an arch the matrix does not know or
made from the nearest known release because a release asked about is not in the matrix; a
``WARNING:`` line on stderr names the release it was planned from). Every failure is one line on
stderr, never a traceback (``NVFP4COMPAT_DEBUG=1`` re-raises an unexpected error to show one).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from nvfp4compat.plan import Plan

__all__ = [
    "EXIT_OK", "EXIT_UNSUPPORTED", "EXIT_UNVERIFIED", "EXIT_UNVERIFIED_RELEASE", "EXIT_USAGE",
    "EXTERNAL_COMMANDS", "main",
]

EXIT_OK, EXIT_UNSUPPORTED, EXIT_USAGE, EXIT_UNVERIFIED = 0, 1, 2, 3
# ``query``: the plan is supported but was made from the nearest known release (the same code as an
# unknown arch: both are unverified).
EXIT_UNVERIFIED_RELEASE = EXIT_UNVERIFIED

# Subcommands implemented in other modules, imported only when invoked:
# name -> (module, function, help). The function receives the remaining argv and returns an exit code.
EXTERNAL_COMMANDS: dict[str, tuple[str, str, str]] = {
    "demo": ("nvfp4compat.demo", "main", "run the end-to-end NVFP4 KV-cache demo"),
    "validate": (
        "nvfp4compat.validation.command", "main",
        "run the end-to-end checks in vLLM on this GPU and write a report (needs CUDA and vLLM)",
    ),
}


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line and exit 2 (instead of a usage dump)."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{self.prog}: {message} (see {self.prog.split()[0]} --help)")


def _arch(text: str) -> str:
    from nvfp4compat.facts import normalize_arch

    try:
        return normalize_arch(text)
    except ValueError as exc:
        from nvfp4compat.loader import load_matrix

        known = ", ".join(load_matrix().arches)
        raise argparse.ArgumentTypeError(f"{exc}; known arches: {known}") from None


def _version(text: str) -> str:
    from nvfp4compat.versions import VersionError, parse_version

    try:
        parse_version(text)
    except VersionError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _build() -> _Parser:
    p = _Parser(
        prog="nvfp4compat",
        description="NVFP4 KV-cache compatibility for vLLM and FlashInfer: plans, diagnosis, matrix.",
        epilog="exit codes: 0 ok, 1 not supported here, 2 bad input, 3 unverified (an arch the matrix does not know)",
    )
    from nvfp4compat import __version__

    p.add_argument("--version", action="version", version=f"nvfp4compat {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    q = sub.add_parser("query", help="resolve a plan for given facts (no detection)")
    q.add_argument("--arch", type=_arch, required=True, help="GPU arch, e.g. sm_90")
    q.add_argument("--flashinfer", type=_version, help="flashinfer-python release (default: vLLM's pin)")
    q.add_argument("--vllm", type=_version, help="vLLM release")
    q.add_argument("--no-triton", action="store_true", help="plan as if Triton were not installed")
    q.add_argument("--flashinfer-cubin", type=_version, help="installed flashinfer-cubin (default: vLLM's pin, if any)")
    q.add_argument("--flashinfer-jit-cache", type=_version, help="installed flashinfer-jit-cache")
    tg = q.add_mutually_exclusive_group()
    tg.add_argument("--trtllm-gen", dest="trtllm", action="store_const", const=True, default=None, help="trtllm-gen is usable")
    tg.add_argument("--no-trtllm-gen", dest="trtllm", action="store_const", const=False, help="trtllm-gen is not usable")
    q.add_argument("--impl", help="explicit implementation: triton, or write=triton,decode=flashinfer")
    q.add_argument("--feature", action="append", default=[], help="required feature (nvfp4_4over6, head_size_64, sinks); repeatable")
    q.add_argument("--json", action="store_true", help="print the plan as JSON")
    q.add_argument("--no-trace", action="store_true", help="omit the trace from the text output")

    sub.add_parser("errors", help="list the known error messages that doctor --explain recognises")

    d = sub.add_parser("doctor", help="detect this machine and print its plan, or explain an error message")
    d.add_argument("--explain", metavar="TEXT", help="explain a known error message instead")
    d.add_argument("--import", dest="import_modules", action="store_true", help="import flashinfer to probe helpers (default: read its installed sources)")
    d.add_argument("--json", action="store_true")
    d.add_argument("--no-trace", action="store_true")

    mx = sub.add_parser("matrix", help="render the capability matrix")
    mx.add_argument("--format", choices=("markdown", "json"), default="markdown")

    v = sub.add_parser("verify", help="check the matrix against the installed FlashInfer / vLLM")
    v.add_argument("--expect-flashinfer", type=_version, help="fail unless this flashinfer-python release is installed")
    v.add_argument("--expect-vllm", type=_version, help="fail unless this vLLM release is installed")
    v.add_argument("--quiet", action="store_true", help="print only drift and the summary")
    v.add_argument("--emit", action="store_true", help="print the matrix entries of the installed FlashInfer / vLLM instead")
    v.add_argument("--wheel", type=Path, help="with --emit: a downloaded vLLM wheel to read instead of the installed vLLM")

    c = sub.add_parser("constraints", help="install lines for a vLLM release with another FlashInfer release")
    c.add_argument("--vllm", type=_version, required=True)
    c.add_argument("--flashinfer", type=_version, help="default: vLLM's pin, or the release the matrix installs instead of an unpublished pin")
    c.add_argument("--json", action="store_true")

    for name, (_, _, help_text) in EXTERNAL_COMMANDS.items():
        e = sub.add_parser(name, help=help_text, add_help=False)
        e.add_argument("args", nargs=argparse.REMAINDER)
    return p


def _out(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _cmd_query(a: argparse.Namespace) -> int:
    from nvfp4compat.api import query

    plan = query(
        a.arch, a.flashinfer, a.vllm, triton=not a.no_triton, flashinfer_cubin=a.flashinfer_cubin,
        flashinfer_jit_cache=a.flashinfer_jit_cache, trtllm_gen_usable=a.trtllm, overrides=a.impl, features=a.feature,
    )
    _out(plan.to_json() if a.json else plan.render_text(trace=not a.no_trace))
    _warn_planned_from(plan)
    return _plan_code(plan)


def _warn_planned_from(plan: Plan) -> None:
    """One ``WARNING:`` line on stderr per release planned from the nearest known one."""
    for w in plan.release_warnings:
        sys.stderr.write(f"WARNING: {w}\n")


def _plan_code(plan: Plan) -> int:
    """0 supported, 1 not supported, 3 unverified: a plan that would serve, on an arch the matrix
    does not know or made from the nearest known release."""
    from nvfp4compat.loader import load_matrix

    if not plan.supported:
        return EXIT_UNSUPPORTED
    if plan.planned_from:
        return EXIT_UNVERIFIED_RELEASE
    if plan.facts.arch is not None and plan.facts.arch not in load_matrix().arches:
        return EXIT_UNVERIFIED
    return EXIT_OK


def _cmd_errors(a: argparse.Namespace) -> int:
    from nvfp4compat.explain import render_errors
    from nvfp4compat.loader import load_matrix

    _out(render_errors(load_matrix()))
    return EXIT_OK


def _cmd_doctor(a: argparse.Namespace) -> int:
    from nvfp4compat.loader import load_matrix

    m = load_matrix()
    if a.explain is not None:
        from nvfp4compat.explain import explain, render_explanations

        found = explain(m, a.explain)
        _out(render_explanations(a.explain, found))
        return 0 if found else 1
    from nvfp4compat.facts import detect
    from nvfp4compat.resolver import resolve

    facts = detect(import_modules=a.import_modules)
    plan = resolve(m, facts)
    if a.json:
        _out(plan.to_json())
    else:
        _out(plan.render_text(trace=not a.no_trace))
    _warn_planned_from(plan)
    return _plan_code(plan)


def _cmd_matrix(a: argparse.Namespace) -> int:
    from nvfp4compat.loader import load_matrix
    from nvfp4compat.table import matrix_json, matrix_markdown

    m = load_matrix()
    _out(matrix_markdown(m) if a.format == "markdown" else matrix_json(m))
    return 0


def _cmd_verify(a: argparse.Namespace) -> int:
    from nvfp4compat.loader import load_matrix
    from nvfp4compat.verify import run

    if a.emit or a.wheel:
        from nvfp4compat.emit import emit_text

        try:
            _out(emit_text(load_matrix(), a.wheel))
        except RuntimeError as exc:
            raise _UsageError(f"nvfp4compat verify --emit: {exc}") from None
        return 0
    checks, msgs, code = run(load_matrix(), expect_flashinfer=a.expect_flashinfer, expect_vllm=a.expect_vllm)
    for msg in msgs:
        _out(msg)
    for c in checks:
        if not (a.quiet and c.ok):
            _out(c.render())
    drift = sum(not c.ok for c in checks)
    _out(f"{len(checks)} claims checked, {drift} drifted" + (": the matrix does not match the installed packages" if drift else ""))
    return code


def _cmd_constraints(a: argparse.Namespace) -> int:
    from nvfp4compat.constraints import constraints
    from nvfp4compat.loader import load_matrix

    try:
        rep = constraints(load_matrix(), a.vllm, a.flashinfer)
    except ValueError as exc:
        raise _UsageError(f"nvfp4compat constraints: {exc}") from None
    _out(rep.to_json() if a.json else rep.render_text())
    return 0


def _cmd_external(name: str, argv: Sequence[str]) -> int:
    module_name, func_name, _ = EXTERNAL_COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise _UsageError(f"nvfp4compat {name}: this install has no {module_name} module (the '{name}' command is not available)") from None
        raise
    func: Callable[[Sequence[str]], int | None] = getattr(module, func_name)
    try:
        rc = func(list(argv))
    except SystemExit as exc:  # the subcommand's own argparse (--help, bad input)
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return int(rc or 0)


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "query": _cmd_query,
    "doctor": _cmd_doctor,
    "errors": _cmd_errors,
    "matrix": _cmd_matrix,
    "verify": _cmd_verify,
    "constraints": _cmd_constraints,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``nvfp4compat`` console script; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    from nvfp4compat.loader import MatrixError
    from nvfp4compat.resolver import ResolutionError
    from nvfp4compat.versions import VersionError

    try:
        if args and args[0] in EXTERNAL_COMMANDS:
            rc = _cmd_external(args[0], args[1:])
        else:
            ns = _build().parse_args(args)
            rc = _COMMANDS[ns.command](ns)
        sys.stdout.flush()  # a full disk or a closed pipe shows here, not at interpreter exit
        return rc
    except _UsageError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except (ResolutionError, VersionError) as exc:
        return _fail(f"nvfp4compat: error: {exc}", EXIT_USAGE)
    except MatrixError as exc:
        return _fail(f"nvfp4compat: the capability matrix is invalid: {exc}", EXIT_USAGE)
    except ValueError as exc:
        return _fail(f"nvfp4compat: error: {str(exc).splitlines()[0]}", EXIT_USAGE)
    except BrokenPipeError:  # e.g. `nvfp4compat matrix | head`
        return _fail("nvfp4compat: the output was closed before everything was written (broken pipe)", EXIT_UNSUPPORTED)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EIO, errno.EPIPE, errno.EDQUOT, errno.EFBIG):
            raise
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        return _fail(f"nvfp4compat: cannot write the output: {why}", EXIT_UNSUPPORTED)
    except KeyboardInterrupt:
        return _fail("nvfp4compat: interrupted", 130)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, never a traceback
        if os.environ.get("NVFP4COMPAT_DEBUG"):
            raise
        first = (str(exc).splitlines() or [""])[0]
        return _fail(f"nvfp4compat: internal error: {type(exc).__name__}: {first} "
                     "(rerun with NVFP4COMPAT_DEBUG=1 for the traceback, and please report it)", EXIT_UNSUPPORTED)


def _fail(line: str, code: int) -> int:
    """Write one line to stderr and silence stdout (a broken or full stdout must not fail again at exit)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
    with contextlib.suppress(OSError):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    return code


def _entry() -> None:  # pragma: no cover - console script shim
    sys.exit(main())
