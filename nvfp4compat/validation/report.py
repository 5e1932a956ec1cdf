"""The report of a validation run: ``summary.md`` for a reader, ``results.json`` for a tool.

Both are built from the checks' results (``checks.evaluate``) and the jobs that ran, nothing else, so
they are tested with synthetic results on the CPU (``tests/test_validate_report.py``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from nvfp4compat.validation.checks import CAPACITY_MIN_RATIO, RECALL_MAX_POINTS, Job

__all__ = ["ENVIRONMENT_KEYS", "headline", "results_doc", "summary_md", "verdict"]

# what the preflight job records that the report's environment table shows, in this order
ENVIRONMENT_KEYS = (
    "gpu", "capability", "gpu_memory_gib", "python", "torch", "cuda", "triton", "vllm",
    "flashinfer", "nvfp4compat",
)
TITLES = {
    "plan": "The plan, and the plugin applying it",
    "negative": "Negative control: the same engine without the plugin",
    "plugin": "With the plugin: generation in eager and CUDA-graph modes",
    "capacity": "Capacity: KV cache tokens, NVFP4 against bf16",
    "fidelity": "Fidelity: teacher-forced next-token log-probabilities against bf16",
    "throughput": "Throughput: decode tokens/s, NVFP4 against bf16",
    "tp": "Tensor parallelism: the plugin in every worker",
    "writer": "Writer bytes: the Triton writer against FlashInfer's",
    "recall": "Recall: needle retrieval with the trained recall model",
}


def verdict(r: Mapping[str, Any]) -> str:
    """PASS; INCOMPLETE where a job the check needs did not run (a spent ``--budget-s``, ``--jobs``) and none that
    ran failed (``checks._unmeasured``); else FAIL."""
    if r.get("passed"):
        return "PASS"
    return "INCOMPLETE" if r.get("incomplete") else "FAIL"


def verdict_lines(results: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The console's closing lines: per check its verdict and headline figure, and under an INCOMPLETE one each
    job not measured and why (``nvfp4compat validate`` and the offline bundle's runner print the same)."""
    lines = []
    for name, r in results.items():
        lines.append(f"{verdict(r)}  {name}: {headline(name, r)}")
        if verdict(r) == "INCOMPLETE":
            lines += [f"    not measured: {job}: {why}" for job, why in r["incomplete"].items()]
    return lines


def _num(x: Any, fmt: str = ",") -> str:
    return "-" if x is None else format(x, fmt)


def headline(name: str, r: Mapping[str, Any]) -> str:
    """The one figure a reader looks for in check ``name``'s result ``r``."""
    if name == "plan":
        bound = r.get("plugin_bound") or {}
        ops = ", ".join(f"{op}={impl}" for op, impl in bound.items() if impl)
        if not r.get("supported"):
            return f"plan: not supported here ({r.get('reason') or 'no plan recorded'})"
        return f"plugin bound {ops or 'nothing'}; plan: " + ", ".join(
            f"{op}={impl}" for op, impl in (r.get("planned") or {}).items()
        )
    if name == "negative":
        if str(r.get("expected", "")).startswith("starts"):
            started = "started" if r.get("engine_started") else "did not start: " + str(r.get("error"))[-160:]
            return f"stock vLLM serves NVFP4 natively here; the engine without the plugin {started}"
        if r.get("engine_started"):
            return "the engine started without the plugin: the control does not hold"
        return "refused: " + (r.get("matching_lines") or [r.get("error") or "no error recorded"])[0][-160:]
    if name in ("capacity", "tp") and "ratio" in r:
        ratio = r.get("ratio")
        return (
            f"{_num(r.get('nvfp4_tokens'))} NVFP4 tokens / {_num(r.get('bf16_tokens'))} bf16 = "
            + (f"{ratio:.2f}x" if ratio else "-")
            + f" (needs >= {CAPACITY_MIN_RATIO})"
        )
    if name == "fidelity":
        parts = []
        for label, key in (("NVFP4", "nvfp4_vs_bf16"), ("fp8", "fp8_vs_bf16")):
            f = r.get(key) or {}
            if f.get("ok"):
                kl = f" KL {f['kl']:.4f}," if f.get("kl") is not None else ""
                parts.append(
                    f"{label}:{kl} mean abs logprob diff {f['mean_abs_diff']:.4f}, top-1 agreement {100 * f['top1_agreement']:.1f}%"
                )
            else:
                parts.append(f"{label}: {f.get('reason', 'not measured')}")
        rot = (r.get("rotation") or {}).get("rotated_below_plain")
        if rot is not None:
            parts.append("rotated KL " + ("below" if rot else "NOT below") + " plain NVFP4's")
        return "; ".join(parts)
    if name == "throughput":
        n, b = (r.get("nvfp4") or {}).get("decode_tok_s"), (r.get("bf16") or {}).get("decode_tok_s")
        ratio = r.get("ratio_nvfp4_over_bf16")
        return f"NVFP4 {_num(n)} tok/s, bf16 {_num(b)} tok/s" + (f" ({ratio:.2f}x)" if ratio else "")
    if name == "plugin":
        modes = r.get("modes") or {}
        return ", ".join(f"{m} {'ok' if e.get('generated') else 'failed'}" for m, e in modes.items())
    if name == "writer":
        w = r.get("writer_bytes") or {}
        return "identical bytes" if w.get("identical") else (w.get("error") or "bytes differ")
    if name == "recall":
        worst, per_needle = r.get("worst_points_below_bf16"), r.get("points_per_needle")
        res = f"; one needle = {per_needle:g} points" if per_needle else ""
        failed = r.get("jobs_failed") or []
        # a job that failed or was cut by --budget-s leaves the verdict open whatever the gap
        missing = f"; no result from {', '.join(failed)}" if failed else ""
        return (
            f"worst NVFP4 gap {_num(worst, '.1f')} points below bf16 (target <= {RECALL_MAX_POINTS}{res})"
            + missing
        )
    return ""


def _fidelity_rows(r: Mapping[str, Any]) -> list[str]:
    rows = [
        "| cache | positions | KL vs bf16 (per-prompt min-max) | mean abs diff | p99 abs diff "
        "| max abs diff | top-1 agreement |",
        "|---|---|---|---|---|---|---|",
    ]
    entries = [("NVFP4", r.get("nvfp4_vs_bf16") or {}), ("fp8", r.get("fp8_vs_bf16") or {})]
    for name, f in (r.get("variants") or {}).items():
        label = str(f.get("kv_cache_dtype") or name)
        if f.get("rotation"):
            label += f", {f['rotation']} rotation"
        entries.append((label, f))
    for label, f in entries:
        if f.get("ok"):
            kl = "-"
            if f.get("kl") is not None:
                lo, hi = f.get("kl_spread") or (None, None)
                kl = f"{f['kl']:.4f}" + (f" ({lo:.4f}-{hi:.4f})" if lo is not None else "")
            rows.append(
                f"| {label} | {f['positions']:,} | {kl} | {f['mean_abs_diff']:.4f} | {f['p99_abs_diff']:.4f} "
                f"| {f['max_abs_diff']:.4f} | {100 * f['top1_agreement']:.2f}% |"
            )
        else:
            why = str(f.get("reason", "not measured"))[:200].replace("|", "/")
            rows.append(f"| {label} | {why} | | | | | |")
    rot = r.get("rotation") or {}
    if rot.get("variants"):
        verdict_text = {True: "yes", False: "NO", None: "not measured"}[rot.get("rotated_below_plain")]
        rows += ["", f"Rotated KL below plain NVFP4's: **{verdict_text}**", ""]
        rows += ["| rotated job | KL | below plain | below plain in every prompt |", "|---|---|---|---|"]
        for name, e in rot["variants"].items():
            if e.get("measured"):
                rows.append(
                    f"| {name} | {e['kl']:.4f} | {'yes' if e['below_plain'] else 'no'} "
                    f"| {'yes' if e['below_plain_every_prompt'] else 'no'} |"
                )
            else:
                rows.append(f"| {name} | {str(e.get('reason'))[:160].replace('|', '/')} | | |")
    return rows


def _throughput_rows(r: Mapping[str, Any]) -> list[str]:
    rows = [
        "| cache | requests x context | decode tok/s | prefill-only s | prefill+decode s |",
        "|---|---|---|---|---|",
    ]
    for label, key in (("NVFP4", "nvfp4"), ("bf16", "bf16"), ("NVFP4, FULL decode graphs", "nvfp4_full_decode_optin")):
        t = r.get(key)
        if t is None:
            continue
        if t.get("ok"):
            rows.append(
                f"| {label} | {t['requests']} x {t['context']:,} | {_num(t.get('decode_tok_s'))} "
                f"| {t['prefill_only_s']} | {t['prefill_plus_decode_s']} |"
            )
        else:
            rows.append(f"| {label} | {str(t.get('error', 'not measured'))[:160]} | | | |")
    return rows


def _recall_rows(r: Mapping[str, Any]) -> list[str]:
    table = r.get("table") or {}
    lengths = sorted({L for e in table.values() for L in (e.get("recall") or {})}, key=int)
    rows = ["| job | cache | " + " | ".join(lengths) + " | not measured |", "|---|---|" + "---|" * (len(lengths) + 1)]
    for job, e in table.items():
        rec = e.get("recall") or {}
        cells = [f"{100 * rec[L]:.0f}%" if L in rec else "-" for L in lengths]
        cache = str(e.get("kv", "")) + (f", {e['rotation']} rotation" if e.get("rotation") else "")
        why = str(e.get("error") or "")[:160].replace("|", "/").replace("\n", " ")
        rows.append(f"| {job} | {cache} | " + " | ".join(cells) + f" | {why} |")
    return rows


def _environment(jobs: Sequence[Job]) -> dict[str, Any]:
    pre = next((j.result for j in jobs if j.kind == "preflight" and j.result), None) or {}
    pf = pre.get("tasks", {}).get("preflight", {})
    return {k: pf.get(k) for k in ENVIRONMENT_KEYS if pf.get(k) is not None}


def _plan_text(jobs: Sequence[Job]) -> str | None:
    pre = next((j.result for j in jobs if j.kind == "preflight" and j.result), None) or {}
    plan = pre.get("tasks", {}).get("preflight", {}).get("plan") or {}
    return plan.get("text") or plan.get("error")


def summary_md(
    results: Mapping[str, Any],
    jobs: Sequence[Job],
    argv: Sequence[str],
    wall: float,
    total_jobs: int | None = None,
) -> str:
    """The markdown report; ``total_jobs`` marks a partial one (jobs still to run)."""
    passed = sum(bool(r.get("passed")) for r in results.values())
    short = sum(verdict(r) == "INCOMPLETE" for r in results.values())
    title = "# nvfp4compat validate"
    if total_jobs is not None:
        title += f" (PARTIAL: {len(jobs)} of {total_jobs} jobs)"
    env = _environment(jobs)
    lines = [
        title,
        "",
        f"- command: `{' '.join(argv)}`",
        f"- finished: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, wall time {wall:.0f} s",
        f"- **{passed} of {len(results)} checks pass**"
        + (f"; {short} incomplete (jobs not run: see each check; a larger --budget-s runs them)" if short else ""),
        "",
        "| check | result | figure |",
        "|---|---|---|",
    ]
    for name, r in results.items():
        label = f"{r['check']}. {name}" if r.get("check") else name
        lines.append(f"| {label} | {verdict(r)} | {headline(name, r).replace('|', '/')} |")
    lines.append("")
    if env:
        lines += ["## Environment", "", "| what | value |", "|---|---|"]
        lines += [f"| {k} | {str(v).replace('|', '/')} |" for k, v in env.items()]
        lines.append("")
    plan = _plan_text(jobs)
    if plan:
        lines += ["## Plan (`nvfp4compat doctor`)", "", "```text", plan, "```", ""]
    for name, r in results.items():
        number = f"{r['check']}. " if r.get("check") else ""
        lines += [f"## {number}{TITLES.get(name, name)}", "", f"**{verdict(r)}**: {headline(name, r)}", ""]
        if verdict(r) == "INCOMPLETE":
            lines += [f"- not measured: `{job}`: {why}" for job, why in r["incomplete"].items()] + [""]
        if name == "fidelity":
            lines += [*_fidelity_rows(r), "", f"{r.get('note', '')}", ""]
        elif name == "throughput":
            lines += [*_throughput_rows(r), "", f"{r.get('note', '')}", ""]
        elif name == "recall":
            lines += [*_recall_rows(r), "", f"{r.get('note', '')}", ""]
        elif name in ("plan", "negative", "tp", "plugin"):
            log = r.get("plugin_log") or r.get("matching_lines") or []
            if log:
                lines += ["```text", *log[:6], "```", ""]
    lines += ["## Jobs", "", "| job | for checks | wall s | result |", "|---|---|---|---|"]
    for j in jobs:
        res = j.result or {}
        err = res.get("error") or next(
            (t.get("error") for t in res.get("tasks", {}).values() if t.get("error")), ""
        )
        status = "ok" if not err else "error: " + str(err)[:160].replace("|", "/").replace("\n", " ")
        lines.append(f"| {j.name} | {','.join(j.checks)} | {res.get('wall_s', '')} | {status} |")
    lines += ["", "Every figure and log line behind this summary: `results.json`, `jobs.log`.", ""]
    return "\n".join(lines)


def results_doc(
    results: Mapping[str, Any],
    jobs: Sequence[Job],
    argv: Sequence[str],
    wall: float,
    complete: bool,
    settings: Mapping[str, Any],
) -> dict[str, Any]:
    """The JSON report: the checks' results, the settings, the environment and every job's result."""
    return {
        "tool": "nvfp4compat validate",
        "argv": list(argv),
        "complete": complete,
        "passed": bool(results) and all(r.get("passed") for r in results.values()),
        "wall_s": round(wall, 1),
        "settings": dict(settings),
        "environment": _environment(jobs),
        "checks": dict(results),
        "jobs": {j.name: _compact(j.name, j.result) for j in jobs if j.result is not None},
    }


BULKY = ("target", "top_ids", "top_logprobs")  # per-position top-K lists of check 4's logprobs


def _compact(name: str, result: Mapping[str, Any]) -> dict[str, Any]:
    """A job's result without check 4's per-position top-K lists (megabytes a job): the judged
    figures are in the checks' results, the lists stay in the job's own ``<name>.result.json``."""
    lp = (result.get("tasks") or {}).get("logprobs")
    if not isinstance(lp, dict) or not isinstance(lp.get("prompts"), list):
        return dict(result)
    prompts = [{k: v for k, v in p.items() if k not in BULKY} for p in lp["prompts"]]
    logprobs = {**lp, "prompts": prompts, "top_k_lists": f"in the work folder's {name}.result.json"}
    return {**result, "tasks": {**result["tasks"], "logprobs": logprobs}}
