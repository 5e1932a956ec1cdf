"""Run the jobs of the selected checks, one process each, and write the report as they finish.

Each job is ``job.py`` in its own process group (killed as a group when it ends or times out, so
vLLM's engine-core children give the GPU back before the next engine starts). Jobs shared by several
checks run once. ``results.json`` and ``summary.md`` are rewritten after every job, so a run that is
stopped still leaves what it measured.

The environment of a job is the caller's (``os.environ``) plus what the job needs
(``VLLM_PLUGINS``, ``NVFP4COMPAT_IMPL``, ...) plus ``extra_env``; a caller that keeps several
package sets (another FlashInfer release, a vendored vLLM) passes ``job_env`` to place them.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from nvfp4compat.validation.checks import (
    LOGPROB_TOPK,
    Job,
    evaluate,
    kv_reservation,
    plan_jobs,
    scan_log,
    unavailable,
)
from nvfp4compat.validation.report import results_doc, summary_md

__all__ = ["JOB_SCRIPT", "Settings", "base_job_env", "run_checks", "run_job"]

JOB_SCRIPT = Path(__file__).resolve().parent / "job.py"
# the English prose check 4 scores a real model on (the kernel-level accuracy check's text)
PROSE = Path(__file__).resolve().parents[1] / "accuracy" / "data" / "prose.txt"
PLUGIN = "nvfp4compat"  # the plugin's name in vllm.general_plugins


@dataclass
class Settings:
    """What one run measures and with which engine settings (every engine uses the same)."""

    model: str
    checks: Sequence[str]
    out: Path
    work: Path
    flashinfer: str = "none"  # the FlashInfer release label job names carry
    gpu_memory_utilization: float = 0.30
    max_model_len: int = 8192 + 512
    max_cudagraph_capture_size: int = 64
    logprob_prompts: int = 8
    logprob_prompt_len: int = 2048
    tokenizer: str | None = None  # vLLM's tokenizer= (None: the model's own; a GGUF file's)
    throughput_requests: int = 32
    throughput_context: int = 8192
    throughput_new_tokens: int = 256
    recall_model: str | None = None
    recall_lengths: Sequence[int] = (2048, 4096, 8192)
    recall_beyond: Sequence[int] = ()
    recall_per_depth: int = 10
    tp: int = 2
    kv_cache_gib: float | None = None
    job_timeout_s: float = 1200.0
    budget_s: float | None = None  # start no job after this many seconds (None: no limit)
    jobs: Sequence[str] = ()  # shell patterns of the job names to run (empty: all); the preflight always runs
    extra_env: dict[str, str] = field(default_factory=dict)
    argv: Sequence[str] = ()

    def spec(self) -> dict[str, Any]:
        """The job spec keys ``job.py`` reads (a job adds its own kind, cache dtype, mode, ...)."""
        lengths = [*self.recall_lengths, *self.recall_beyond]
        return {
            "model": self.model,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "max_model_len": self.max_model_len,
            "max_cudagraph_capture_size": self.max_cudagraph_capture_size,
            "logprob_prompts": self.logprob_prompts,
            "logprob_prompt_len": self.logprob_prompt_len,
            "logprob_top_k": LOGPROB_TOPK,
            "prose_path": str(PROSE),
            "tokenizer": self.tokenizer,
            "throughput_requests": self.throughput_requests,
            "throughput_context": self.throughput_context,
            "throughput_new_tokens": self.throughput_new_tokens,
            "seed": 0,
            "recall_model": self.recall_model,
            "recall_lengths": lengths,
            "recall_per_depth": self.recall_per_depth,
            "recall_max_model_len": max(self.max_model_len, max(lengths, default=0) + 64),
            "kv_cache_gib": self.kv_cache_gib,
            "jobs": list(self.jobs),
        }


def job_patterns(text: str) -> list[str]:
    """``--jobs``: a comma list of shell patterns of job names (empty: every job)."""
    return [p.strip() for p in text.split(",") if p.strip()]


def selected(job: Job, patterns: Sequence[str]) -> bool:
    """Whether ``job`` runs under ``--jobs patterns`` (shell patterns of job names; the preflight, which
    every check's plan rests on, always runs)."""
    return not patterns or job.kind == "preflight" or any(fnmatch.fnmatchcase(job.name, p) for p in patterns)


def unmatched(jobs: Sequence[Job], patterns: Sequence[str]) -> list[str]:
    """The ``--jobs`` patterns that name none of ``jobs``."""
    return [p for p in patterns if not any(fnmatch.fnmatchcase(j.name, p) for j in jobs)]


def base_job_env(job: Job, environ: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """The job's environment: ``environ``, the plugin on or off, the job's switches, ``extra``.

    A job without the plugin sets ``VLLM_PLUGINS=""`` (vLLM then loads no general plugin); a job
    with it keeps the caller's ``VLLM_PLUGINS`` and adds the plugin's name when that list is set.
    """
    env = dict(environ)
    if job.plugin:
        if env.get("VLLM_PLUGINS") is not None:
            names = [n for n in env["VLLM_PLUGINS"].split(",") if n.strip()]
            env["VLLM_PLUGINS"] = ",".join(dict.fromkeys([*names, PLUGIN]))
    else:
        env["VLLM_PLUGINS"] = ""
    if job.impl:
        env["NVFP4COMPAT_IMPL"] = job.impl
    if job.rotation:
        env["NVFP4COMPAT_KV_ROTATION"] = job.rotation  # the rotated cache, as a user turns it on
    elif job.kind == "engine":
        env.pop("NVFP4COMPAT_KV_ROTATION", None)  # a plain job stays plain whatever the caller set
    if job.mode == "full-decode-optin":
        env["NVFP4COMPAT_CUDAGRAPH_DECODE"] = "1"  # FULL decode graphs forced on (the plan's switch)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    env.update(extra)
    return env


def run_job(
    job: Job,
    spec: dict[str, Any],
    env: dict[str, str],
    workdir: Path,
    timeout: float,
    log_sink: TextIO,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Run ``job.py`` for one job in its own process group; return its result."""
    spec_path = workdir / f"{job.name}.spec.json"
    result_path = workdir / f"{job.name}.result.json"
    log_path = workdir / f"{job.name}.log"
    result_path.unlink(missing_ok=True)
    recall = {
        "model": spec["recall_model"],
        "tokenizer": None,
        "max_model_len": spec["recall_max_model_len"],
    }
    spec_path.write_text(
        json.dumps(
            {
                **spec,
                **(recall if job.model == "recall" else {}),
                "kind": job.kind,
                "kv_cache_dtype": job.kv,
                "mode": job.mode,
                "tasks": job.tasks,
                "flashinfer": job.fi,
                "plugin": job.plugin,
                "tensor_parallel_size": job.tp,
                "kv_cache_memory_bytes": kv_reservation(job, spec),
                "result": str(result_path),
            }
        )
    )
    t0 = time.time()
    with log_path.open("w") as logf:
        proc = subprocess.Popen(
            [sys.executable, str(JOB_SCRIPT), str(spec_path)],
            stdout=logf,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(workdir),
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            rc = -1
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    wall = time.time() - t0
    text = log_path.read_text(errors="replace")
    log_sink.write(
        f"\n===== job {job.name} (rc {rc}, {wall:.1f} s{', TIMED OUT' if timed_out else ''}) =====\n"
    )
    log_sink.write(text)
    log_sink.flush()
    if result_path.exists():
        result: dict[str, Any] = json.loads(result_path.read_text())
    else:
        late = f", timed out after {timeout:.0f} s" if timed_out else ""
        result = {"error": f"no result file (rc {rc}{late}); log tail: " + text[-1500:]}
    result["rc"] = rc
    result["wall_s"] = round(wall, 1)
    result["timed_out"] = timed_out
    result["log_lines"] = scan_log(text)
    if result.get("error") or timed_out:
        say(f"  {job.name}: {wall:.0f} s, ERROR {str(result.get('error'))[:300]}")
    else:
        tasks = result.get("tasks", {})
        failed = [n for n, t in tasks.items() if not t.get("ok")]
        status = f"failed tasks {failed}" if failed else "ok"
        if job.kind == "engine" and not job.plugin and failed == ["start"]:
            # the negative control: not starting is the expected outcome, the check judges why
            status = f"did not start without the plugin: {str(tasks['start'].get('error'))[-160:]}"
        say(f"  {job.name}: {wall:.0f} s, {status}")
    for line in result["log_lines"]["plugin"][:1]:
        say(f"    plugin: {line[-240:]}")
    return result


MIN_JOB_S = 30.0  # seconds of --budget-s that must be left to start a job


def run_checks(
    settings: Settings,
    say: Callable[[str], None],
    job_env: Callable[[Job], dict[str, str]] | None = None,
) -> dict[str, Any]:
    """Plan, run and judge ``settings.checks``; write the report; return the checks' results.

    ``say`` receives the progress lines. ``job_env`` (default: ``base_job_env`` over
    ``os.environ`` and ``settings.extra_env``) gives each job its environment.
    """
    t_run = time.time()
    checks = list(settings.checks)
    jobs = plan_jobs(checks, settings.flashinfer, settings.tp)
    spec = settings.spec()
    env_of = job_env or (lambda j: base_job_env(j, os.environ, settings.extra_env))
    settings.out.mkdir(parents=True, exist_ok=True)
    settings.work.mkdir(parents=True, exist_ok=True)
    say(f"{len(checks)} checks, {len(jobs)} jobs (each in its own process); report in {settings.out}")

    def write(final: bool) -> dict[str, Any]:
        results = evaluate(checks, jobs, settings.tp, settings.recall_beyond)
        done = [j for j in jobs if j.result is not None]
        wall = time.time() - t_run
        doc = results_doc(results, done, settings.argv, wall, complete=final, settings=spec)
        (settings.out / "results.json").write_text(json.dumps(doc, indent=1, default=str))
        md = summary_md(results, done, settings.argv, wall, total_jobs=None if final else len(jobs))
        (settings.out / "summary.md").write_text(md)
        return results

    with (settings.out / "jobs.log").open("w") as sink:
        for i, j in enumerate(jobs, 1):
            left = None if settings.budget_s is None else settings.budget_s - (time.time() - t_run)
            why = unavailable(j, jobs)
            if not selected(j, settings.jobs):
                j.result = {
                    "error": f"not run: --jobs {','.join(settings.jobs)} does not select it",
                    "skipped": True,
                    "tasks": {},
                    "log_lines": scan_log(""),
                }
                say(f"  [{i}/{len(jobs)}] {j.name}: not selected (--jobs)")
            elif why is not None:
                j.result = {"error": why, "skipped": True, "tasks": {}, "log_lines": scan_log("")}
                say(f"  [{i}/{len(jobs)}] {j.name}: {why}")
            elif left is not None and left < MIN_JOB_S:
                j.result = {
                    "error": f"skipped: the run's budget of {settings.budget_s:.0f} s is spent",
                    "skipped": True,
                    "tasks": {},
                    "log_lines": scan_log(""),
                }
                say(f"  [{i}/{len(jobs)}] {j.name}: skipped, budget spent")
            else:
                say(f"[{i}/{len(jobs)}] {j.name}: {', '.join(j.tasks)} (for {', '.join(j.checks)})")
                timeout = settings.job_timeout_s if left is None else min(settings.job_timeout_s, left)
                j.result = run_job(j, spec, env_of(j), settings.work, timeout, sink, say)
                if j.result.get("timed_out") and timeout < settings.job_timeout_s:
                    # stopped by what was left of --budget-s, not by its own limit: not measured, not failed
                    j.result["cut_by_budget"] = (
                        f"stopped after {timeout:.0f} s, when the run's budget of {settings.budget_s:.0f} s was spent"
                    )
            write(final=False)
    return write(final=True)
