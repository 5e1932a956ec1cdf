"""The end-to-end checks: which engine jobs each check needs, and each check's verdict.

Pure Python over the jobs' JSON results (``job.py`` writes them), so every verdict is tested on the
CPU (``tests/test_validate_checks.py``). The checks, with the numbers ``docs/validation.md`` gives
them:

==========  ====  ==============================================================================
plan        -     the plan this environment resolves to (``nvfp4compat doctor``), and the plugin's
                  log line in a real engine binding the same implementation to every op
negative    1     the same engine without the plugin (``VLLM_PLUGINS=""``), NVFP4 cache: must not
                  start, with vLLM's own "kv_cache_dtype not supported"
plugin      2     with the plugin: greedy generation in eager, PIECEWISE, FULL and the opt-in FULL
                  decode graphs; graph outputs against eager, judged against a bf16 control
capacity    3     KV cache tokens vLLM reports, NVFP4 against bf16 (same settings): >= 3.3x
fidelity    4     teacher-forced next-token logprobs: NVFP4 (plain, 4over6, Hadamard-rotated, both) and
                  fp8 against bf16: KL over bf16's top-K, |logprob diff|, top-1 (numbers only)
throughput  6     decode tokens/s at 32 concurrent requests: NVFP4 against bf16 (numbers only)
tp          7     ``plugin`` and ``capacity`` with tensor parallelism: the plugin binds in every worker
writer      -     the Triton writer's bytes against FlashInfer's slot-mapping writer
recall      8     exact-match needle recall with the trained recall model: NVFP4 within 1 point of bf16
==========  ====  ==============================================================================
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "CHECKS", "CHECK_NUMBERS", "DEFAULT_CHECKS", "FIDELITY_VARIANTS", "LOGPROB_TOPK", "MEASURES_MEMORY",
    "NEAR_TIE", "ROTATION", "Job", "divergence", "evaluate", "fidelity", "kl_top_k", "kv_reservation",
    "parse_checks", "plan_jobs", "scan_log", "unavailable",
]

# name -> the number docs/validation.md gives the check ("" for checks it does not number)
CHECK_NUMBERS: dict[str, str] = {
    "plan": "",
    "negative": "1",
    "plugin": "2",
    "capacity": "3",
    "fidelity": "4",
    "throughput": "6",
    "tp": "7",
    "writer": "",
    "recall": "8",
}
CHECKS = tuple(CHECK_NUMBERS)
# what `nvfp4compat validate` runs unless --checks says otherwise (--recall adds recall)
DEFAULT_CHECKS = ("plan", "negative", "capacity", "fidelity", "throughput")
CAPACITY_MIN_RATIO = 3.3  # the NVFP4/bf16 token ratio check 3 asks for (3.56 is the byte ratio)
RECALL_MAX_POINTS = 1.0  # recall: NVFP4 at most this many points below bf16 at every trained length
OPS = ("write", "decode", "prefill")  # the ops the plugin's log line names
# prompt_logprobs=K of the fidelity engines: the KL of check 4 is taken over bf16's top-K tokens
# (vLLM's default max_logprobs is 20: a larger K would need the engine's max_logprobs raised)
LOGPROB_TOPK = 20
# the rotation the rotated jobs ask the plugin for (NVFP4COMPAT_KV_ROTATION, as a user sets it)
ROTATION = "hadamard"
# check 4's NVFP4 variants, as (kv_cache_dtype, rotation): 4over6 is vLLM's dtype name
# ``nvfp4_4over6`` (vLLM >= 0.28 lists it; the plugin's gate accepts it where the plan binds the
# Triton writer), the rotation is NVFP4COMPAT_KV_ROTATION=hadamard; ``nvfp4_hadamard`` is the rotated
# cache's own dtype name, which the plugin registers on vLLM >= 0.33 (matrix: rotated_kv_cache_dtypes)
ROTATED_DTYPE = "nvfp4_hadamard"
FIDELITY_VARIANTS = (("nvfp4", ROTATION), ("nvfp4_4over6", ""), ("nvfp4_4over6", ROTATION), (ROTATED_DTYPE, ""))


def parse_checks(text: str) -> list[str]:
    """``"plan,3,fidelity"`` -> ``["plan", "capacity", "fidelity"]`` (names or docs numbers).

    Raises ValueError naming the unknown entry and the known ones.
    """
    by_number = {n: c for c, n in CHECK_NUMBERS.items() if n}
    out: list[str] = []
    for tok in (t.strip() for t in text.split(",")):
        if not tok:
            continue
        name = by_number.get(tok) or (tok if tok in CHECK_NUMBERS else None)
        if name is None:
            known = ", ".join(f"{c} ({n})" if n else c for c, n in CHECK_NUMBERS.items())
            raise ValueError(f"unknown check {tok!r}; known checks: {known}")
        if name not in out:
            out.append(name)
    if not out:
        raise ValueError(f"no check selected in {text!r}; known checks: {', '.join(CHECKS)}")
    return out


class Job:
    """One engine (or kernel) subprocess; tasks from several checks are merged into one job."""

    def __init__(
        self,
        kind: str,
        fi: str,
        plugin: bool,
        kv: str = "auto",
        mode: str = "eager",
        tp: int = 1,
        model: str = "tiny",
        impl: str = "",
        rotation: str = "",
    ) -> None:
        self.kind = kind  # "engine", "writer", "preflight"
        self.fi = fi
        self.plugin = plugin
        self.kv = kv
        self.mode = mode
        self.tp = tp
        self.model = model  # "tiny" (random weights, --model) or "recall" (--recall-model)
        self.impl = impl  # NVFP4COMPAT_IMPL for this engine ("" = the plan's own choice)
        self.rotation = rotation  # NVFP4COMPAT_KV_ROTATION for this engine ("" = unset: none)
        self.tasks: list[str] = []
        self.checks: list[str] = []
        self.result: dict[str, Any] | None = None

    @property
    def key(self) -> tuple[str, str, bool, str, str, int, str, str, str]:
        return (
            self.kind, self.fi, self.plugin, self.kv, self.mode, self.tp, self.model, self.impl,
            self.rotation,
        )  # fmt: skip

    @property
    def variant(self) -> bool:
        """A rotated or 4over6 NVFP4 engine: a measurement next to the plain formats."""
        return bool(self.rotation) or self.kv not in ("nvfp4", "auto", "fp8")

    @property
    def name(self) -> str:
        if self.kind != "engine":
            return f"{self.kind}-fi{self.fi}" + ("-plugin" if self.plugin else "")
        return (
            f"{self.kv}-{self.mode}-fi{self.fi}"
            + ("-plugin" if self.plugin else "-noplugin")
            + (f"-tp{self.tp}" if self.tp > 1 else "")
            + ("-recall" if self.model == "recall" else "")
            + (f"-impl-{self.impl.replace('=', '-').replace(',', '-')}" if self.impl else "")
            + (f"-rot-{self.rotation}" if self.rotation else "")
        )




def plan_jobs(checks: Sequence[str], fi: str, tp: int = 2) -> list[Job]:
    """The jobs ``checks`` need, each once, cheap and decisive ones first.

    ``fi`` labels the environment's FlashInfer release (job names carry it); ``tp`` is the
    tensor-parallel size of the ``tp`` check.
    """
    jobs: dict[tuple[str, str, bool, str, str, int, str, str, str], Job] = {}

    def add(
        check: str,
        kind: str,
        fi: str,
        plugin: bool,
        kv: str = "auto",
        mode: str = "eager",
        tasks: Sequence[str] = (),
        tp: int = 1,
        model: str = "tiny",
        impl: str = "",
        rotation: str = "",
    ) -> None:
        new = Job(kind, fi, plugin, kv, mode, tp, model, impl, rotation)
        job = jobs.setdefault(new.key, new)
        for t in tasks:
            if t not in job.tasks:
                job.tasks.append(t)
        if check not in job.checks:
            job.checks.append(check)

    add("preflight", "preflight", fi, True, tasks=["preflight"])
    for c in checks:
        if c == "plan":
            add(c, "engine", fi, True, "nvfp4", "eager", ["start"])
        elif c == "negative":
            add(c, "engine", fi, False, "nvfp4", "eager", ["start"])
        elif c == "plugin":
            for mode in ("eager", "piecewise", "full", "full-decode-optin"):
                add(c, "engine", fi, True, "nvfp4", mode, ["start", "generate"])
            # control: the same modes with a bf16 cache, so that a divergence from eager under
            # CUDA graphs can be told apart from the bf16 noise every compiled mode has
            for mode in ("eager", "piecewise"):
                add(c, "engine", fi, True, "auto", mode, ["start", "generate"])
        elif c == "capacity":
            add(c, "engine", fi, True, "nvfp4", "eager", ["start"])
            add(c, "engine", fi, True, "auto", "eager", ["start"])
        elif c == "fidelity":
            for kv in ("auto", "fp8", "nvfp4"):
                add(c, "engine", fi, True, kv, "eager", ["start", "logprobs"])
            for kv, rot in FIDELITY_VARIANTS:
                add(c, "engine", fi, True, kv, "eager", ["start", "logprobs"], rotation=rot)
        elif c == "throughput":
            for kv in ("nvfp4", "auto"):
                add(c, "engine", fi, True, kv, "default", ["start", "throughput"])
            # the same NVFP4 engine with FULL decode graphs over the Triton readers forced on
            # (NVFP4COMPAT_CUDAGRAPH_DECODE=1; the plan's default only where the matrix verified them,
            # vLLM 0.26.0 on SM90): on 2026-11-29 attention eager between piecewise graphs decoded at
            # 0.48x of bf16 with its FULL_AND_PIECEWISE graphs
            add(c, "engine", fi, True, "nvfp4", "full-decode-optin", ["start", "throughput"])
        elif c == "writer":
            add(c, "writer", fi, True, tasks=["writer"])
        elif c == "recall":
            # every writer/reader binding the plan can choose on SM90, and the bf16/fp8 references
            for kv in ("nvfp4", "auto", "fp8"):
                add(c, "engine", fi, True, kv, "eager", ["start", "recall"], model="recall")
            # the rotated NVFP4 cache (NVFP4COMPAT_KV_ROTATION=hadamard): the same 1-point target.
            # Rotation alone, not with 4over6: vLLM 0.26 (the H200's) has no nvfp4_4over6 dtype
            add(
                c, "engine", fi, True, "nvfp4", "eager", ["start", "recall"], model="recall",
                rotation=ROTATION,
            )  # fmt: skip
            # the answer's second token is a decode step: with NVFP4COMPAT_CUDAGRAPH_DECODE=1 the
            # steps that form pure decode batches replay FULL graphs over the Triton readers, so this
            # job's recall also tests FULL capture
            add(
                c, "engine", fi, True, "nvfp4", "full-decode-optin", ["start", "recall"],
                model="recall",
            )  # fmt: skip
            # no FlashInfer-reader job: inside vLLM 0.26 the plan binds only the Triton readers (the
            # FA2 NVFP4 read needs vLLM >= 0.32's wrapper planning; the plugin refuses
            # NVFP4COMPAT_IMPL=decode=flashinfer there, seen on the H200 on 2026-11-29). FlashInfer's
            # FA2 read is measured without vLLM in tests/test_gpu_recall.py.
        elif c == "tp":
            for mode in ("eager", "piecewise", "full"):
                add(c, "engine", fi, True, "nvfp4", mode, ["start", "generate"], tp=tp)
            add(c, "engine", fi, True, "auto", "eager", ["start"], tp=tp)
    # cheap, decisive jobs first: the writer comparison takes seconds; an NVFP4 engine needs no
    # FlashInfer JIT build (the Triton readers), a bf16/fp8 one builds FA2 modules (minutes, cold)
    order = {"preflight": 0, "writer": 1, "engine": 2}
    modes = {"eager": 0, "piecewise": 1, "full": 2, "default": 3, "full-decode-optin": 4}
    kvs = {"nvfp4": 0, "auto": 1, "fp8": 2}
    return sorted(
        jobs.values(),
        # eager engines first within a release: they decide the capacity ratios (checks 3, 7) and are
        # the reference every graph mode is compared with. The forced FULL-decode engines come last:
        # the checks' verdicts need the others (check 6: NVFP4 and bf16 at vLLM's default settings),
        # the forced ones are comparisons that a --budget-s may skip (on 2026-12-03 the bf16 engine,
        # sorted after them, was the one cut). Rotated/4over6 variants come after the plain formats
        # of their mode: they add figures, only check 4's rotation result and check 8 rest on them
        key=lambda j: (
            order[j.kind], j.tp, j.plugin, j.fi, j.mode != "eager", j.mode == "full-decode-optin",
            # recall's fp8 engine goes with the variants, after the rotated NVFP4 one: check 8's
            # verdict needs NVFP4, bf16 and the rotated cache, fp8 is its reference row (on
            # 2026-12-03 a budget cut the rotated job after fp8's cold FA2 build)
            j.variant or (j.model == "recall" and j.kv == "fp8"), kvs.get(j.kv, 3), j.rotation,
            modes[j.mode],
        ),  # fmt: skip
    )


MEASURES_MEMORY = frozenset({"capacity", "throughput", "tp"})


def kv_reservation(job: Job, spec: dict[str, Any]) -> int | None:
    """``kv_cache_memory_bytes`` for a job under ``--kv-cache-gib``, else None (vLLM profiles).

    A fixed reservation lets runs share one GPU (each engine's memory profiling would otherwise
    count the other runs' allocations); jobs whose checks measure capacity or speed always profile.
    """
    gib = spec.get("kv_cache_gib")
    if not gib or job.kind != "engine" or MEASURES_MEMORY.intersection(job.checks):
        return None
    return int(float(gib) * (1 << 30))

_PID_RE = re.compile(r"\[pid (\d+)\]\s*$")  # the end of the plugin's plan line
# vLLM's per-process log prefix, e.g. "(Worker_TP1 pid=4242)": group 1 the process, group 2 the pid
_PROC_RE = re.compile(r"\(((?:Worker|EngineCore|VllmWorker)[^ )]*)\s+pid=(\d+)\)")


def _from_plugin(line: str, limit: int = 2400) -> str:
    """``line`` from its first "nvfp4compat" on, at most ``limit`` characters."""
    s = line.strip()
    return s[s.lower().find("nvfp4compat") :][:limit]


def scan_log(text: str) -> dict[str, Any]:
    """Pick the lines the checks need out of a job's log."""
    lines = text.splitlines()
    pick = lambda *keys: [ln.strip()[-400:] for ln in lines if any(k in ln for k in keys)]  # noqa: E731
    kv_tokens = []
    for ln in lines:
        if "GPU KV cache size:" in ln:
            num = ln.split("GPU KV cache size:")[1].split("tokens")[0].strip().replace(",", "")
            if num.isdigit():
                kv_tokens.append(int(num))
    return {
        # from "nvfp4compat" on: vLLM's prefix dropped, the plan line's bindings kept (it runs past 1,000
        # characters when it explains fallbacks; its tail alone lost "write=triton" on 2026-12-03)
        "plugin": [_from_plugin(ln) for ln in lines if "nvfp4compat" in ln.lower()][:20],
        # pids of the plan lines ("... [pid N]") and of vLLM's worker processes ("(Worker_TP1 pid=N)")
        "plugin_pids": sorted(
            {int(m.group(1)) for m in (_PID_RE.search(ln) for ln in lines if "nvfp4compat: vLLM" in ln) if m}
        ),
        "worker_pids": sorted(
            {int(m.group(2)) for ln in lines for m in _PROC_RE.finditer(ln) if "Worker" in m.group(1)}
        ),
        "kv_cache_tokens": kv_tokens,
        "not_supported": pick("kv_cache_dtype not supported"),
        "cudagraph": pick(
            "cudagraph_mode", "CUDAGraphMode", "cudagraph mode", "Capturing CUDA graph"
        )[:20],
        "backend": pick(
            "Using AttentionBackendEnum", "attention backend", "Using FlashInfer", "FLASHINFER"
        )[:10],
        "errors": [
            ln.strip()[-600:]
            for ln in lines
            if ("Error" in ln or "ERROR" in ln) and "Traceback" not in ln
        ][-15:],
        "jit": pick("Loading JIT", "Compiling", "jit")[:10],
    }


# --------------------------------------------------------------------------------------------
# evaluation


def _first(jobs: Iterable[Job], **match: Any) -> Job | None:
    match.setdefault("tp", 1)
    match.setdefault("model", "tiny")
    match.setdefault("impl", "")
    match.setdefault("rotation", "")
    for j in jobs:
        if all(getattr(j, k) == v for k, v in match.items()):
            return j
    return None


def _started(j: Job | None) -> bool:
    return bool(j and j.result and j.result.get("tasks", {}).get("start", {}).get("ok"))


def _task(j: Job | None, name: str) -> dict[str, Any]:
    if not j or not j.result:
        return {}
    return j.result.get("tasks", {}).get(name, {})


KL_FLOOR = 1e-10  # probability given to a token the other engine left no mass for (keeps log finite)


def kl_top_k(
    base_top: Sequence[tuple[int, float]],
    other_top: Sequence[tuple[int, float]],
    other_extra: Sequence[tuple[int, float]] = (),
) -> float:
    """KL(base || other) in nats at one position, over base's top-K tokens plus one "rest" bucket.

    ``base_top``/``other_top``: each engine's ``(token, logprob)`` pairs, best first, as vLLM's
    ``prompt_logprobs=K`` returns them (K or fewer); ``other_extra``: further entries of the other
    engine (the prompt token vLLM adds outside the top-K). This is an APPROXIMATION of the full-vocab
    KL: the support is base's top-K tokens and one bucket holding the rest of the vocabulary (by the
    data-processing inequality that coarse KL is a lower bound of the true KL when every probability
    is known). A base top-K token that the other engine did not return gets the other's mass left
    outside what it returned, spread evenly over such tokens and capped at the other's smallest
    returned probability (a token outside its top-K cannot be likelier than its K-th): an estimate,
    not a bound. The rest bucket gets what is left of each distribution.
    """
    if not base_top:
        raise ValueError("kl_top_k: the base engine returned no logprob at this position")
    q_known = {int(t): math.exp(lp) for t, lp in (*other_top, *other_extra)}
    q_returned = sum(q_known.values())
    cap = min((math.exp(lp) for _, lp in other_top), default=1.0)
    missing = [int(t) for t, _ in base_top if int(t) not in q_known]
    spread = max(0.0, 1.0 - q_returned) / len(missing) if missing else 0.0
    kl = p_sum = q_sum = 0.0
    for t, lp in base_top:
        p = math.exp(lp)
        q = q_known.get(int(t), min(cap, spread))
        q = max(q, KL_FLOOR)
        kl += p * (lp - math.log(q))
        p_sum += p
        q_sum += q
    p_rest = 1.0 - p_sum
    if p_rest > 0.0:
        kl += p_rest * math.log(p_rest / max(1.0 - q_sum, KL_FLOOR))
    return kl


def fidelity(base: Job | None, other: Job | None) -> dict[str, Any]:
    """Teacher-forced next-token fidelity of ``other`` against ``base`` (the bf16 engine).

    mean/p99/max |logprob diff| of the target tokens, top-1 agreement and, where the jobs returned
    their top-K lists (``top_ids``/``top_logprobs``), the mean per-position KL(base || other) over
    base's top-K (:func:`kl_top_k`, an approximation), with each prompt's mean (``prompt_kl``: the
    window-to-window spread is its min-max).
    """
    a, b = _task(base, "logprobs"), _task(other, "logprobs")
    if not (a.get("ok") and b.get("ok")):
        def why(t: dict[str, Any], j: Job | None) -> str:
            if t:
                return str(t.get("error") or "ok")[-300:]
            if j is not None and j.result and j.result.get("skipped"):
                return str(j.result.get("error"))[-300:]
            start = _task(j, "start")
            if start and not start.get("ok"):
                return "engine did not start: " + str(start.get("error"))[-300:]
            return "not run"

        return {"ok": False, "reason": f"logprobs missing: base {why(a, base)}, other {why(b, other)}"}
    if len(a["prompts"]) != len(b["prompts"]):
        return {
            "ok": False,
            "reason": f"the engines scored different prompt sets ({len(a['prompts'])} and "
            f"{len(b['prompts'])} prompts): run both with the same --model and --logprob-* options",
        }
    diffs: list[float] = []
    agree = total = 0
    prompt_kl: list[float] = []
    kl_sum, kl_n = 0.0, 0
    have_kl = all("top_ids" in p for p in (*a["prompts"], *b["prompts"]))
    for pa, pb in zip(a["prompts"], b["prompts"], strict=True):
        for x, y in zip(pa["target_logprob"], pb["target_logprob"], strict=True):
            diffs.append(abs(x - y))
        for x, y in zip(pa["top1"], pb["top1"], strict=True):
            agree += int(x == y)
            total += 1
        if not have_kl:
            continue
        s, n = 0.0, 0
        rows = zip(
            pa["top_ids"], pa["top_logprobs"], pb["top_ids"], pb["top_logprobs"],
            pb["target"], pb["target_logprob"], strict=True,
        )  # fmt: skip
        for ai, al, bi, bl, tgt, tlp in rows:
            if not ai:
                continue  # vLLM gave the base nothing here: the position does not count
            s += kl_top_k(list(zip(ai, al, strict=True)), list(zip(bi, bl, strict=True)), [(tgt, tlp)])
            n += 1
        if n:
            prompt_kl.append(s / n)
            kl_sum += s
            kl_n += n
    diffs.sort()
    n = len(diffs)
    if not n:
        return {"ok": False, "reason": "the logprobs results hold no scored position"}
    out: dict[str, Any] = {
        "ok": True,
        "positions": n,
        "mean_abs_diff": sum(diffs) / n,
        "p99_abs_diff": diffs[min(n - 1, int(0.99 * n))],
        "max_abs_diff": diffs[-1],
        "top1_agreement": agree / total,
        "kl": kl_sum / kl_n if kl_n else None,
        "prompt_kl": prompt_kl,
        "kl_spread": [min(prompt_kl), max(prompt_kl)] if prompt_kl else None,
        "kl_top_k": a.get("top_k"),
        "prompt_source": a.get("source"),
    }
    return out


def unavailable(job: Job, jobs: Iterable[Job]) -> str | None:
    """Why ``job`` cannot run in this environment, from the plan the preflight recorded; else None.

    An NVFP4 variant whose ``kv_cache_dtype`` the plan does not accept (``nvfp4_4over6`` where
    the vLLM release has no such dtype, vLLM < 0.28) is skipped with that reason instead of
    starting an engine that must fail. Without a recorded plan nothing is skipped.
    """
    if job.kind != "engine" or not job.plugin or job.kv in ("auto", "fp8", "nvfp4"):
        return None
    plan = _task(_first(jobs, kind="preflight"), "preflight").get("plan") or {}
    vllm = (plan.get("json") or {}).get("vllm") or {}
    dtypes = vllm.get("kv_cache_dtypes") if isinstance(vllm, dict) else None
    if not dtypes or job.kv in dtypes:
        return None
    return (
        f"skipped: the plan accepts kv_cache_dtype {list(dtypes)} here (vLLM "
        f"{vllm.get('version', '?')}), not {job.kv!r}; {job.kv} needs a vLLM release that lists it "
        "(nvfp4_4over6: vLLM >= 0.28, and the Triton writer) or lets the plugin register it "
        "(nvfp4_hadamard: vLLM >= 0.33)"
    )


def _plan_line_binding(lines: Sequence[str], op: str) -> str | None:
    """What the plugin's log line binds ``op`` to: ``triton``, ``flashinfer``, ``native`` or, for
    an op left to vLLM's own code, ``vllm(<impl>)`` (the plugin's summary reads ``write=triton``)."""
    for ln in lines:
        m = re.search(rf"\b{op}=([A-Za-z0-9_]+(?:\([A-Za-z0-9_]+\))?)", ln)
        if m:
            return m.group(1).lower()
    for ln in lines:  # the doctor's form, "write    -> triton" ("write: flashinfer preferred but ..." is not one)
        m = re.search(rf"\b{op}\s*->\s*(triton|flashinfer|native)\b", ln, re.IGNORECASE)
        if m:
            return m.group(1).lower()
    return None


def _unwrap(binding: str | None) -> str | None:
    """``vllm(native)`` -> ``native``: the implementation, whoever calls it."""
    if binding and binding.startswith("vllm(") and binding.endswith(")"):
        return binding[5:-1]
    return binding


def planned_bindings(jobs: Iterable[Job]) -> dict[str, str | None]:
    """``{op: impl}`` of the plan the preflight job recorded (``doctor --json``); {} without one."""
    plan = _task(_first(jobs, kind="preflight"), "preflight").get("plan") or {}
    bindings = (plan.get("json") or {}).get("bindings") or {}
    out: dict[str, str | None] = {}
    for op, b in bindings.items():
        impl = b.get("impl") if isinstance(b, dict) else None
        out[op] = str(impl).lower() if impl else None
    return out


def planned_strategy(jobs: Iterable[Job]) -> str | None:
    """The plan's vLLM strategy (``none``, ``native``, ``backport``, ``extend``), None without one."""
    plan = _task(_first(jobs, kind="preflight"), "preflight").get("plan") or {}
    vllm = (plan.get("json") or {}).get("vllm") or {}
    return vllm.get("strategy") if isinstance(vllm, dict) else None


def _plan_bindings(lines: Sequence[str]) -> dict[str, str | None]:
    """``{op: binding}`` for write/decode/prefill from the plugin's plan line."""
    return {op: _plan_line_binding(lines, op) for op in ("write", "decode", "prefill")}


def _process_tags(lines: Sequence[str]) -> list[str]:
    """vLLM's per-process log prefixes, e.g. ``(Worker_TP1 pid=4242)``, found in ``lines``."""
    return sorted({m.group(0) for ln in lines for m in _PROC_RE.finditer(ln)})


NEAR_TIE = 0.1  # nats: a greedy divergence where eager's top-2 margin is below this is a near-tie


def divergence(base: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Where two greedy generations of the same prompts part, and whether it looks like noise.

    ``base``/``other`` are ``generate`` task results (``token_ids`` and, from engines run with
    ``logprobs``, ``top_logprobs``: per prompt, per step, the top-2 ``(token, logprob)`` pairs).
    Per prompt: the first differing step, ``base``'s top-1/top-2 margin there (a near-tie when
    small: the two runs then differ by rounding, not by what attention read), and the largest
    absolute difference of the chosen token's logprob over the steps before it.
    """
    first: list[int | None] = []
    margins: list[float] = []
    pre_diff = 0.0
    have_lp = bool(base.get("top_logprobs")) and bool(other.get("top_logprobs"))
    for p, (x, y) in enumerate(zip(other["token_ids"], base["token_ids"], strict=True)):
        i = next((k for k, (a, b) in enumerate(zip(x, y, strict=False)) if a != b), None)
        first.append(i)
        if not have_lp:
            continue
        bt, ot = base["top_logprobs"][p], other["top_logprobs"][p]
        stop = len(x) if i is None else i
        for k in range(min(stop, len(bt), len(ot))):
            pre_diff = max(pre_diff, abs(bt[k][0][1] - ot[k][0][1]))
        if i is not None and i < len(bt) and len(bt[i]) > 1:
            margins.append(round(bt[i][0][1] - bt[i][1][1], 6))
    same = [i is None for i in first]
    out: dict[str, Any] = {
        "prompts_matching": f"{sum(same)}/{len(same)}",
        "first_divergence": first,
        "matches": all(same),
    }
    if have_lp:
        out["base_margin_at_divergence"] = margins
        out["max_logprob_diff_before_divergence"] = round(pre_diff, 6)
    return out


def _dtype_rotation(kv_cache_dtype: str) -> str | None:
    """The rotation a ``--kv-cache-dtype`` name of nvfp4compat's own turns on (``nvfp4_hadamard`` ->
    ``hadamard``, from the matrix's ``rotated_kv_cache_dtypes``); None for every other name."""
    from nvfp4compat import load_matrix

    for d in load_matrix().vllm.rotated_kv_cache_dtypes:
        if d.name == kv_cache_dtype:
            return d.kv_rotation
    return None


def rotation_verdict(plain: dict[str, Any], variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Whether each rotated variant's KL against bf16 is below plain NVFP4's (same prompts).

    ``below_plain``: the mean KL over all positions is lower; ``below_plain_every_prompt``: lower in
    every prompt (paired by window: the prompts are the same text), the comparison that the
    window-to-window spread cannot explain. ``rotated_below_plain`` is None when nothing was measured.
    """
    out: dict[str, Any] = {"plain_nvfp4_kl": plain.get("kl"), "plain_kl_spread": plain.get("kl_spread")}
    rows: dict[str, Any] = {}
    for name, f in variants.items():
        if not f.get("rotation"):
            continue
        if not (f.get("ok") and f.get("kl") is not None and plain.get("kl") is not None):
            rows[name] = {"measured": False, "reason": f.get("reason") or "no KL (no top-K lists)"}
            continue
        pk, vk = plain.get("prompt_kl") or [], f.get("prompt_kl") or []
        rows[name] = {
            "measured": True,
            "kv_cache_dtype": f.get("kv_cache_dtype"),
            "kl": f["kl"],
            "kl_spread": f.get("kl_spread"),
            "below_plain": f["kl"] < plain["kl"],
            "below_plain_every_prompt": bool(pk) and len(pk) == len(vk)
            and all(v < p for v, p in zip(vk, pk, strict=True)),
        }
    measured = [e for e in rows.values() if e["measured"]]
    out["variants"] = rows
    out["rotated_below_plain"] = all(e["below_plain"] for e in measured) if measured else None
    return out


def evaluate(
    checks: Sequence[str],
    jobs: list[Job],
    tp: int = 2,
    recall_beyond: Sequence[int] = (),
) -> dict[str, Any]:
    """Each check's verdict from its jobs' results (``plan_jobs(checks, ...)`` made the jobs).

    The plugin's bindings are judged against the plan the preflight job recorded in the same
    environment (``nvfp4compat doctor --json``), so no release or binding is assumed here.
    ``recall_beyond``: recall lengths past the trained range (measured and reported, outside the
    1-point verdict: they say whether the model extrapolates, not whether the cache is good).
    """
    out: dict[str, Any] = {}
    E = lambda **m: _first(jobs, kind="engine", **m)  # noqa: E731
    planned = planned_bindings(jobs)
    for c in checks:
        r: dict[str, Any] = {"check": CHECK_NUMBERS[c], "name": c}
        if c == "plan":
            j = E(plugin=True, kv="nvfp4", mode="eager")
            lines = (j.result or {}).get("log_lines", {}).get("plugin", []) if j else []
            seen = {op: _unwrap(_plan_line_binding(lines, op)) for op in OPS}
            want = {op: planned.get(op) for op in OPS}
            plan = _task(_first(jobs, kind="preflight"), "preflight").get("plan") or {}
            r.update(
                supported=plan.get("supported"),
                reason=plan.get("reason"),
                planned=want,
                plugin_log=lines[:6],
                plugin_bound=seen,
                engine_started=_started(j),
                error=str(_task(j, "start").get("error") or plan.get("error") or "")[-600:],
            )
            # where vLLM serves NVFP4 itself the plugin applies nothing and says so
            untouched = planned_strategy(jobs) == "native" and any(
                "vLLM left untouched" in ln for ln in lines
            )
            r["plugin_left_vllm_untouched"] = untouched
            # ``op=vllm``: vLLM's own code runs the op (an ``extend`` route leaves vLLM 0.32+'s
            # FlashInfer writer in place): it matches a plan binding that is not a bundled kernel
            same = all(
                seen[op] == want[op] or (seen[op] == "vllm" and want[op] not in (None, "triton", "dequant_fa3", "dequant_fa2"))
                for op in OPS
            )
            r["passed"] = bool(plan.get("supported") and _started(j) and lines and (same or untouched))
        elif c == "negative":
            j = E(plugin=False, kv="nvfp4", mode="eager")
            st = _task(j, "start")
            lines = (j.result or {}).get("log_lines", {}).get("not_supported", []) if j else []
            found = any(
                "kv_cache_dtype not supported" in s for s in lines
            ) or "kv_cache_dtype not supported" in str(st.get("error", ""))
            # where the plan says vLLM serves NVFP4 itself ("native"), stock vLLM must start;
            # everywhere else it must refuse with its own message
            native = planned_strategy(jobs) == "native"
            r.update(
                expected="starts (vLLM serves NVFP4 natively here)" if native else "refused",
                engine_started=bool(st.get("ok")),
                error=str(st.get("error", ""))[-600:],
                matching_lines=lines[:5],
            )
            r["passed"] = bool(j and (st.get("ok") if native else (not st.get("ok") and found)))
        elif c == "plugin":
            modes = ("eager", "piecewise", "full", "full-decode-optin")
            eager = E(plugin=True, kv="nvfp4", mode="eager")
            base_tokens = _task(eager, "generate").get("token_ids")
            r["modes"] = {}
            for mode in modes:
                j = E(plugin=True, kv="nvfp4", mode=mode)
                g = _task(j, "generate")
                entry = {
                    "started": _started(j),
                    "generated": bool(g.get("ok")),
                    "error": (str(_task(j, "start").get("error") or g.get("error") or ""))[-500:],
                    "cudagraph_log": (j.result or {}).get("log_lines", {}).get("cudagraph", [])[:6]
                    if j
                    else [],
                }
                if g.get("ok") and base_tokens is not None:
                    d = divergence(_task(eager, "generate"), g)
                    entry["prompts_matching_eager"] = d.pop("prompts_matching")
                    entry["matches_eager"] = d.pop("matches")
                    entry.update(d)  # first_divergence (None: same), margins, logprob diffs
                r["modes"][mode] = entry
            if c == "plugin":
                # bf16 control: how far the same compiled mode moves a bf16-cache engine from eager
                ce, cp = (
                    _task(E(plugin=True, kv="auto", mode=m), "generate")
                    for m in ("eager", "piecewise")
                )
                ctl = divergence(ce, cp) if ce.get("ok") and cp.get("ok") else None
                r["bf16_control_piecewise_vs_eager"] = ctl
                tol_diff = tol_margin = NEAR_TIE
                if ctl and "max_logprob_diff_before_divergence" in ctl:
                    tol_diff = max(tol_diff, 2 * ctl["max_logprob_diff_before_divergence"])
                    tol_margin = max(
                        [tol_margin, *(2 * m for m in ctl["base_margin_at_divergence"])]
                    )
                rule = (
                    f"consistent = chosen-token logprobs before the first divergence within "
                    f"{tol_diff:.3f} nats of eager and every divergence at an eager top-2 margin "
                    f"<= {tol_margin:.3f} (max of {NEAR_TIE} and twice the bf16 control's)"
                )
                for pw in (
                    r["modes"].get(m, {}) for m in ("piecewise", "full", "full-decode-optin")
                ):
                    if not (pw.get("generated") and "max_logprob_diff_before_divergence" in pw):
                        continue
                    pw["consistent_with_eager"] = bool(
                        pw["max_logprob_diff_before_divergence"] <= tol_diff
                        and all(m <= tol_margin for m in pw["base_margin_at_divergence"])
                    )
                    pw["rule"] = rule
            lines = (eager.result or {}).get("log_lines", {}).get("plugin", []) if eager else []
            r["plugin_log"] = lines[:6]
            r["write_binding"] = _unwrap(_plan_line_binding(lines, "write"))
            # the writer the plan of this environment binds (None when no preflight plan came back)
            r["expected_write_binding"] = planned.get("write")
            r["passed"] = bool(
                r["modes"]["eager"]["generated"]
                and lines
                and r["expected_write_binding"] is not None
                and r["write_binding"] == r["expected_write_binding"]
            )
        elif c == "capacity":
            n, b = (
                E(plugin=True, kv="nvfp4", mode="eager"),
                E(plugin=True, kv="auto", mode="eager"),
            )
            tn, tb = (
                _task(n, "start").get("kv_cache_tokens"),
                _task(b, "start").get("kv_cache_tokens"),
            )
            r.update(
                nvfp4_tokens=tn,
                bf16_tokens=tb,
                nvfp4_log=(n.result or {}).get("log_lines", {}).get("kv_cache_tokens")
                if n
                else None,
                bf16_log=(b.result or {}).get("log_lines", {}).get("kv_cache_tokens")
                if b
                else None,
            )
            r["ratio"] = (tn / tb) if tn and tb else None
            r["passed"] = bool(r["ratio"] and r["ratio"] >= CAPACITY_MIN_RATIO)
        elif c == "fidelity":
            base = E(plugin=True, kv="auto", mode="eager")
            plain = E(plugin=True, kv="nvfp4", mode="eager")
            r["nvfp4_vs_bf16"] = fidelity(base, plain)
            r["fp8_vs_bf16"] = fidelity(base, E(plugin=True, kv="fp8", mode="eager"))
            # the NVFP4 variants (4over6, Hadamard rotation, both), keyed by job name
            r["variants"] = {}
            failed: list[str] = []
            for j in jobs:
                if j.kind != "engine" or j.model != "tiny" or "fidelity" not in j.checks or not j.variant:
                    continue
                f = fidelity(base, j)
                f.update(kv_cache_dtype=j.kv, rotation=j.rotation or _dtype_rotation(j.kv))
                skipped = bool(j.result and j.result.get("skipped"))
                f["skipped"] = skipped
                if j.result is not None and not f["ok"] and not skipped:
                    failed.append(j.name)
                r["variants"][j.name] = f
            r["rotation"] = rotation_verdict(r["nvfp4_vs_bf16"], r["variants"])
            r["variant_jobs_failed"] = failed
            r["passed"] = bool(
                r["nvfp4_vs_bf16"].get("ok") and r["fp8_vs_bf16"].get("ok") and not failed
            )
            r["note"] = (
                "no threshold on the figures: passes when NVFP4, fp8 and every NVFP4 variant this vLLM "
                f"accepts are measured. KL: over bf16's top-{LOGPROB_TOPK} tokens plus one rest "
                "bucket (an approximation of the full-vocabulary KL, see checks.kl_top_k)"
            )
        elif c == "throughput":
            n, b = (
                E(plugin=True, kv="nvfp4", mode="default"),
                E(plugin=True, kv="auto", mode="default"),
            )
            r["nvfp4"], r["bf16"] = _task(n, "throughput"), _task(b, "throughput")
            dn, db = r["nvfp4"].get("decode_tok_s"), r["bf16"].get("decode_tok_s")
            r["ratio_nvfp4_over_bf16"] = dn / db if dn and db else None
            o = E(plugin=True, kv="nvfp4", mode="full-decode-optin")
            if o is not None:
                r["nvfp4_full_decode_optin"] = _task(o, "throughput")
                do = r["nvfp4_full_decode_optin"].get("decode_tok_s")
                r["ratio_nvfp4_full_decode_optin_over_bf16"] = do / db if do and db else None
            r["passed"] = bool(dn and db)
            r["note"] = "no threshold: the numbers are reported; passes when both are measured"
        elif c == "writer":
            w = _first(jobs, kind="writer")
            r["writer_bytes"] = _task(w, "writer")
            r["passed"] = bool(r["writer_bytes"].get("ok") and r["writer_bytes"].get("identical"))
        elif c == "recall":
            ref = _task(E(plugin=True, kv="auto", mode="eager", model="recall"), "recall")
            r["bf16"] = ref.get("recall")
            r["table"] = {}
            gaps_all: list[float] = []
            beyond = {str(L) for L in recall_beyond}
            for j in jobs:
                if j.kind != "engine" or j.model != "recall":
                    continue
                t = _task(j, "recall")
                row: dict[str, Any] = {
                    "kv": j.kv,
                    "rotation": j.rotation or None,
                    "flashinfer": j.fi,
                    "impl": j.impl or "plan",
                    "bindings": _plan_bindings(
                        (j.result or {}).get("log_lines", {}).get("plugin", [])
                    ),
                    "recall": t.get("recall"),
                    "table": t.get("table"),
                    "error": None
                    if t.get("ok")
                    else str(
                        t.get("error")
                        or _task(j, "start").get("error")
                        or (j.result or {}).get("error")  # skipped: budget, --jobs, unavailable
                        or "no result"
                    )[-400:],
                }
                nvfp4 = j.kv.startswith("nvfp4")  # plain, rotated or 4over6: the same 1-point target
                if t.get("ok") and ref.get("ok") and (nvfp4 or j.kv == "fp8"):
                    gaps = {
                        L: round(100 * (ref["recall"][L] - t["recall"][L]), 2)
                        for L in ref["recall"]
                        if L in t["recall"]
                    }
                    row["points_below_bf16"] = {L: g for L, g in gaps.items() if L not in beyond}
                    if beyond & gaps.keys():
                        row["points_below_bf16_beyond_training"] = {
                            L: g for L, g in gaps.items() if L in beyond
                        }
                    if nvfp4:
                        gaps_all.extend(row["points_below_bf16"].values())
                r["table"][j.name] = row
            nv = [e for e in r["table"].values() if e["kv"].startswith("nvfp4")]
            worst = max(gaps_all) if gaps_all else None
            r["worst_points_below_bf16"] = worst
            # the resolution of the verdict: one needle of a length, in points
            n_lengths = len(ref.get("recall") or {})
            per_length = (ref.get("prompts") or 0) // n_lengths if n_lengths else 0
            per_needle = 100 / per_length if per_length else None
            r["needles_per_length"] = per_length or None
            r["points_per_needle"] = round(per_needle, 2) if per_needle else None
            # a reference (fp8) or binding job that failed leaves the table incomplete: not a pass
            r["jobs_failed"] = sorted(n for n, e in r["table"].items() if e["error"] is not None)
            r["passed"] = bool(
                ref.get("ok")
                and not r["jobs_failed"]
                and nv
                and all("points_below_bf16" in e for e in nv)
                and worst is not None
                and worst <= RECALL_MAX_POINTS
            )
            r["note"] = (
                f"target: NVFP4 exact-match recall within {RECALL_MAX_POINTS:g} point of bf16 at every trained length, "
                "every binding, the Hadamard-rotated cache included"
                + (
                    f"; {sorted(recall_beyond)} reported, outside the verdict (past the trained 8192)"
                    if recall_beyond
                    else ""
                )
                + (
                    f"; at {per_length} needles a length one needle is {per_needle:.3g} points, so a single "
                    f"miss fails the {RECALL_MAX_POINTS:g}-point target: {int(100 / RECALL_MAX_POINTS)} needles a "
                    "length (--recall-per-depth 10) resolve it"
                    if per_needle and per_needle > RECALL_MAX_POINTS
                    else ""
                )
            )
        elif c == "tp":
            r["tensor_parallel_size"] = tp
            eager = E(plugin=True, kv="nvfp4", mode="eager", tp=tp)
            base_tokens = _task(eager, "generate").get("token_ids")
            r["modes"] = {}
            for mode in ("eager", "piecewise", "full"):
                j = E(plugin=True, kv="nvfp4", mode=mode, tp=tp)
                g = _task(j, "generate")
                entry = {
                    "started": _started(j),
                    "generated": bool(g.get("ok")),
                    "error": (str(_task(j, "start").get("error") or g.get("error") or ""))[-500:],
                }
                if g.get("ok") and base_tokens is not None:
                    entry["matches_eager"] = g["token_ids"] == base_tokens
                r["modes"][mode] = entry
            logs = (eager.result or {}).get("log_lines", {}) if eager else {}
            lines = logs.get("plugin", [])
            tags = _process_tags(lines)
            r["plugin_log"] = lines[:8]
            r["plugin_processes"] = tags
            # a worker counts when a plan line carries its pid (it logs before vLLM prefixes its
            # lines) or carries its "(Worker... pid=N)" prefix
            worker_pids = set(logs.get("worker_pids", []))
            workers = sorted(
                {f"pid {p}" for p in set(logs.get("plugin_pids", [])) & worker_pids}
                | {t for t in tags if "Worker" in t}
            )
            r["plugin_workers"] = workers
            bf = E(plugin=True, kv="auto", mode="eager", tp=tp)
            tn, tb = (
                _task(eager, "start").get("kv_cache_tokens"),
                _task(bf, "start").get("kv_cache_tokens"),
            )
            r.update(nvfp4_tokens=tn, bf16_tokens=tb, ratio=(tn / tb) if tn and tb else None)
            r["passed"] = bool(
                r["modes"]["eager"]["generated"]
                and len(workers) >= tp
                and r["ratio"]
                and r["ratio"] >= CAPACITY_MIN_RATIO
            )
            r["note"] = (
                "passed = eager generates, the plugin logged from >= tp worker processes, "
                f"capacity ratio >= {CAPACITY_MIN_RATIO}"
            )
        if not r.get("passed"):
            not_run = _unmeasured(c, jobs)
            if not_run:
                r["incomplete"] = not_run
        out[c] = r
    return out


def _unmeasured(check: str, jobs: Sequence[Job]) -> dict[str, str] | None:
    """Why check ``check`` has no verdict yet, by job name: its jobs that were skipped (the ``--budget-s`` spent,
    ``--jobs``, a job this environment cannot run), stopped by what was left of the budget, or not run yet. Only when
    none of its jobs that ran failed (an error, a timeout, or a failed task of a job with the plugin: one without it
    may fail by design, as the negative control does); None when every job ran, or when one that ran failed (then
    the check failed, it is not incomplete)."""
    mine = [j for j in jobs if check in j.checks]
    gaps: dict[str, str] = {}
    for j in mine:
        res = j.result
        if res is None:
            gaps[j.name] = "not run yet"
        elif res.get("skipped"):
            gaps[j.name] = str(res.get("error") or "skipped")
        elif res.get("cut_by_budget"):
            gaps[j.name] = str(res["cut_by_budget"])
        elif res.get("error") or res.get("timed_out") or (
            j.plugin and any(not t.get("ok") for t in (res.get("tasks") or {}).values())
        ):
            return None
    return gaps or None
