"""What a user buys NVFP4 for, measured in vLLM: requests served at a fixed KV budget, and prefill time.

Issue 14 asks for throughput on a model big enough that attention is not launch-bound, with the KV
memory fixed so that a bf16 cache fits ``N`` requests of 8K tokens, serving ``4N`` such requests with
bf16 and with NVFP4 (goal: NVFP4 >= 2.5x bf16's generated tokens/s). Issue 15 asks for the time to
prefill 32 x 8K prompts with an NVFP4 cache against bf16's, with vLLM's default backend for bf16 (goal:
<= 1.1x). Both run here on a Llama-architecture model with random weights (vLLM's
``load_format="dummy"``: no weight files, no tokenizer; prompts are random token ids), by default
16 layers, hidden 4096, 32 query / 8 KV heads of 128, intermediate 14336.

Each engine runs in its own process (vLLM keeps GPU memory until its process ends), one after the
other, in this order: bf16 then NVFP4 for ``serve``, then for ``prefill``. NVFP4 engines need vLLM to
accept ``--kv-cache-dtype nvfp4``: the nvfp4compat plugin installed in the same environment does that
where vLLM does not (it logs its plan line, which the report quotes).

    python benchmarks/bench_serving.py --json serving.json                 # both modes, defaults
    python benchmarks/bench_serving.py --modes serve --fit 8 --new-tokens 256
    python benchmarks/bench_serving.py --modes serve --context 1024 --new-tokens 7168 --warmup-new-tokens 64
    python benchmarks/bench_serving.py --dry-run                           # the plan and the KV arithmetic

The second serve line is a decode-heavy mix of the same 8K tokens a request (run Q on an H100: NVFP4 2.55x
bf16). For each timed batch the report also gives what vLLM's scheduler did, from the engine's stat lines
(every 2 s unless ``VLLM_LOG_STATS_INTERVAL`` says otherwise): requests running, the most waiting, preemptions.

``--dry-run`` needs no GPU and no vLLM (CI runs it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BLOCK = 16  # vLLM's default KV block (tokens) on CUDA; budgets are rounded up to whole blocks
SERVE_GOAL = 2.5  # issue 14: NVFP4 generated tokens/s >= 2.5x bf16's at the same KV bytes
PREFILL_GOAL = 1.1  # issue 15: NVFP4 prefill time <= 1.1x bf16's
BATCH_MARK = "[bench_serving child] batch"
JIT_MARK = "JIT compilation during inference:"  # vLLM's JIT monitor (0.26+), one line per kernel compiled
# vLLM's periodic stat line (v1/metrics/loggers.py): requests running and waiting, preemptions (printed only where
# above 0) and KV cache use, every VLLM_LOG_STATS_INTERVAL seconds (the children's default: STATS_INTERVAL_S)
STAT_LINE = re.compile(
    r"Running: (?P<running>\d+) reqs, Waiting: (?P<waiting>\d+) reqs"
    r"(?:, Deferred: \d+ reqs)?(?:, Preemptions: (?P<preempted>\d+))?, GPU KV cache usage: (?P<kv>[\d.]+)%"
)
STATS_INTERVAL_S = "2"


@dataclass(frozen=True)
class ModelShape:
    layers: int = 16
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 14336
    vocab: int = 32000

    def config(self, max_positions: int) -> dict[str, Any]:
        """A Llama ``config.json`` for vLLM (random weights through ``load_format="dummy"``)."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab,
            "max_position_embeddings": max_positions,
            "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "bos_token_id": 1,
            "eos_token_id": 2,
        }

    def bf16_bytes_per_token(self) -> int:
        """KV bytes one token takes in a bf16 cache: K and V of every layer and KV head."""
        return self.layers * 2 * self.kv_heads * self.head_dim * 2


@dataclass(frozen=True)
class Run:
    mode: str  # "serve" | "prefill"
    kv: str  # vLLM's kv_cache_dtype: "auto" (bf16) | "nvfp4"
    backend: str | None  # attention_backend; None = vLLM's default choice
    kv_cache_bytes: int
    requests: int
    context: int
    new_tokens: int
    max_num_seqs: int
    warmup_new_tokens: int  # tokens generated per request in the warm-up batch (same prompts' shapes)


def kv_budget(shape: ModelShape, requests: int, tokens_per_request: int) -> int:
    """Bytes of a bf16 cache that holds ``requests`` requests of ``tokens_per_request`` tokens each,
    in whole blocks."""
    blocks = requests * math.ceil(tokens_per_request / BLOCK)
    return blocks * BLOCK * shape.bf16_bytes_per_token()


def plan_runs(a: argparse.Namespace, shape: ModelShape) -> list[Run]:
    """The engines to run, bf16 first in each mode. Both dtypes of a mode get the same KV bytes."""
    runs: list[Run] = []
    backends = {"auto": a.bf16_backend or None, "nvfp4": a.nvfp4_backend or None}
    if "serve" in a.modes:
        per_req = a.context + a.new_tokens
        budget = kv_budget(shape, a.fit, per_req)
        n = a.multiplier * a.fit
        warm = min(a.warmup_new_tokens or a.new_tokens, a.new_tokens)
        for kv in [k for k in ("auto", "nvfp4") if k in a.kv]:
            runs.append(Run("serve", kv, backends[kv], budget, n, a.context, a.new_tokens, n, warm))
    if "prefill" in a.modes:
        budget = kv_budget(shape, a.prefill_requests, a.prefill_context + 1)
        for kv in [k for k in ("auto", "nvfp4") if k in a.kv]:
            runs.append(Run("prefill", kv, backends[kv], budget, a.prefill_requests, a.prefill_context, 1,
                            a.prefill_requests, 1))
    return runs


# --------------------------------------------------------------------------------------------- child


def _prompts(seed: int, count: int, length: int, vocab: int) -> list[dict[str, list[int]]]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [{"prompt_token_ids": rng.integers(10, vocab, size=length).tolist()} for _ in range(count)]


def child(run: Run, model_dir: str, shape: ModelShape, repeats: int) -> dict[str, Any]:
    """One engine: start, warm up at the timed shapes, time, report (runs in its own process)."""
    from vllm import LLM, SamplingParams

    kw: dict[str, Any] = dict(
        model=model_dir, skip_tokenizer_init=True, load_format="dummy", dtype="bfloat16",
        kv_cache_dtype=run.kv, kv_cache_memory_bytes=run.kv_cache_bytes,
        max_model_len=run.context + run.new_tokens, max_num_seqs=run.max_num_seqs,
        enable_prefix_caching=False, generation_config="vllm", seed=0,
        disable_log_stats=False,  # per-request timestamps (RequestOutput.metrics) for the phase split
    )  # fmt: skip
    if run.backend:
        kw["attention_backend"] = run.backend
    t0 = time.time()
    llm = LLM(**kw)
    start_s = time.time() - t0
    cc = llm.llm_engine.vllm_config.cache_config
    kv_tokens = (cc.num_gpu_blocks or 0) * cc.block_size
    sp = SamplingParams(temperature=0.0, max_tokens=run.new_tokens, ignore_eos=True, detokenize=False)

    def batch(seed: int, label: str, params: Any = sp) -> tuple[float, int, dict[str, Any]]:
        prompts = _prompts(seed, run.requests, run.context, shape.vocab)
        # a marker in the engine's log: JIT compiles that vLLM's monitor reports after it fell in this batch
        print(f"{BATCH_MARK} {label}", file=sys.stderr, flush=True)
        t = time.time()
        outs = llm.generate(prompts, params, use_tqdm=False)
        return time.time() - t, sum(len(o.outputs[0].token_ids) for o in outs), phases(outs)

    # the timed shapes once: Triton JIT, autotuning, graph capture (a shorter generation where
    # --warmup-new-tokens asks for one; a compile it misses shows in the timed batch's report)
    warm_sp = SamplingParams(temperature=0.0, max_tokens=run.warmup_new_tokens, ignore_eos=True, detokenize=False)
    warm_s = round(batch(1, "warmup", warm_sp)[0], 3)
    times = [batch(2 + r, f"timed {r}") for r in range(repeats)]
    best_s, generated, best_phases = min(times, key=lambda t: t[0])
    return {
        "start_s": round(start_s, 1),
        "warmup_s": warm_s,
        "kv_cache_tokens": kv_tokens,
        "fits_requests": kv_tokens // (run.context + run.new_tokens),
        "seconds": [round(t[0], 3) for t in times],
        "best_s": round(best_s, 3),
        "generated_tokens": generated,
        "generated_tok_s": round(generated / best_s, 1),
        "requests_per_s": round(run.requests / best_s, 3),
        **best_phases,
    }


def phases(outs: list[Any]) -> dict[str, Any]:
    """Where a batch's time went, from vLLM's per-request timestamps (engine-core monotonic clock):
    time to first token (queued -> first token: waiting for KV room, then prefill) and time per
    output token after the first (the decode steps), median and worst over the requests."""
    ttft, tpot = [], []
    for o in outs:
        m = getattr(o, "metrics", None)
        n = len(o.outputs[0].token_ids)
        first, queued, last = (getattr(m, k, None) for k in ("first_token_ts", "queued_ts", "last_token_ts"))
        if not first or queued is None:  # another vLLM's metrics object, or none: no phase split
            continue
        ttft.append(first - queued)
        if n > 1 and last:
            tpot.append((last - first) / (n - 1))
    if not ttft:
        return {"phases": "vLLM returned no request metrics"}

    def med(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2]

    out: dict[str, Any] = {"ttft_s_median": round(med(ttft), 3), "ttft_s_max": round(max(ttft), 3)}
    if tpot:
        out.update(tpot_ms_median=round(1e3 * med(tpot), 2), tpot_ms_max=round(1e3 * max(tpot), 2))
    return out


# --------------------------------------------------------------------------------------------- parent


def _run_child(run: Run, model_dir: Path, shape: ModelShape, repeats: int, timeout: int,
               log_dir: Path | None = None) -> dict[str, Any]:
    """One engine in its own process and session. Its output (vLLM's engine-core process included) goes
    to ``<log_dir>/<mode>-<kv>.log`` as it runs, so a run cut short keeps its log. On a timeout the whole
    process group is killed: an engine core left behind would hold its GPU memory and make the next
    engine fail at start-up."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.json"
        result = Path(tmp) / "result.json"
        spec.write_text(json.dumps({"run": asdict(run), "model_dir": str(model_dir), "shape": asdict(shape),
                                    "repeats": repeats, "result": str(result)}))
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
        log_path = (log_dir or Path(tmp)) / f"{run.mode}-{run.kv}.log"
        t0 = time.time()
        with open(log_path, "w") as log_file:
            env = {**os.environ, "VLLM_LOG_STATS_INTERVAL": os.environ.get("VLLM_LOG_STATS_INTERVAL", STATS_INTERVAL_S)}
            proc = subprocess.Popen([sys.executable, __file__, "--child", str(spec)], stdout=log_file,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env)
            try:
                rc = proc.wait(timeout=timeout)
                timed_out = False
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                rc, timed_out = proc.wait(), True
        log = log_path.read_text(errors="replace")
        plan = [ln.strip()[-300:] for ln in log.splitlines() if "nvfp4compat: vLLM" in ln][:1]
        # what the engine's log says, whether the child finished or not
        seen = {"plugin": plan, "wall_s": round(time.time() - t0, 1), "jit": jit_by_batch(log),
                "sched": sched_by_batch(log)} | ({"log": str(log_path)} if log_dir is not None else {})
        if timed_out or rc != 0 or not result.exists():
            tail = [ln for ln in log.splitlines() if ln.strip()][-8:]
            error = f"timed out after {timeout} s (--timeout)" if timed_out else f"engine process exited {rc}"
            return {"ok": False, "error": error, "log_tail": tail, **seen}
        return {**json.loads(result.read_text()), "ok": True, **seen}


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group (its session: the engine core and any worker it started)."""
    import contextlib
    import signal

    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _lines_by_batch(log: str) -> Iterator[tuple[str, str]]:
    """Each line of an engine's log but the batch markers, with the child's batch it fell in ("before": start-up
    and vLLM's own warm-up; then the label ``BATCH_MARK`` gave)."""
    where = "before"
    for ln in log.splitlines():
        if BATCH_MARK in ln:
            where = ln.split(BATCH_MARK, 1)[1].strip()
        else:
            yield where, ln


def jit_by_batch(log: str) -> dict[str, list[str]]:
    """The kernels vLLM's JIT monitor saw compiled, by the child's batch they fell in (:func:`_lines_by_batch`).
    Compiles in a timed batch are in its time."""
    by: dict[str, list[str]] = {}
    for where, ln in _lines_by_batch(log):
        if JIT_MARK in ln:
            name = ln.split(JIT_MARK, 1)[1].strip().split(".")[0]
            by.setdefault(where, []).append(name)
    return by


def sched_by_batch(log: str) -> dict[str, dict[str, Any]]:
    """What vLLM's scheduler did in each of the child's batches (:func:`_lines_by_batch`), from the engine's stat
    lines (``STAT_LINE``): the fewest and most requests running at a line, the most waiting, the preemptions
    counted, the highest KV cache use (%), and how many lines there were. A batch shorter than the stat interval
    may have none; a line tells the interval that ends at it, so the first line after a marker may still cover the
    batch before."""
    by: dict[str, dict[str, Any]] = {}
    for where, ln in _lines_by_batch(log):
        m = STAT_LINE.search(ln)
        if m is None:
            continue
        running, waiting, kv = int(m["running"]), int(m["waiting"]), float(m["kv"])
        b = by.setdefault(where, {"running_min": running, "running_max": running, "waiting_max": waiting,
                                  "preemptions": 0, "kv_usage_max_pct": kv, "lines": 0})
        b["running_min"] = min(b["running_min"], running)
        b["running_max"] = max(b["running_max"], running)
        b["waiting_max"] = max(b["waiting_max"], waiting)
        b["preemptions"] += int(m["preempted"] or 0)
        b["kv_usage_max_pct"] = max(b["kv_usage_max_pct"], kv)
        b["lines"] += 1
    return by


def _sched_cell(sched: dict[str, dict[str, Any]] | None) -> str:
    """The timed batches' scheduler summary for the report: running (fewest-most) / most waiting / preemptions."""
    timed = [b for where, b in (sched or {}).items() if where.startswith("timed")]
    if not timed:
        return "no stat line"
    lo, hi = min(b["running_min"] for b in timed), max(b["running_max"] for b in timed)
    running = f"{lo}" if lo == hi else f"{lo}-{hi}"
    return f"{running} / {max(b['waiting_max'] for b in timed)} / {sum(b['preemptions'] for b in timed)}"


def _ratio(rows: list[dict[str, Any]], mode: str, key: str) -> float | None:
    by = {r["kv"]: r for r in rows if r["mode"] == mode and r.get("ok")}
    if "auto" in by and "nvfp4" in by and by["auto"].get(key):
        return by["nvfp4"][key] / by["auto"][key]
    return None


def report(rows: list[dict[str, Any]], shape: ModelShape) -> str:
    lines = [
        f"Model: Llama, random weights, {shape.layers} layers, hidden {shape.hidden}, "
        f"{shape.heads}/{shape.kv_heads} heads of {shape.head_dim}, intermediate {shape.intermediate}",
        "",
        "| mode | KV | backend | KV bytes | KV tokens | requests (fit) | context + new | best s | generated tok/s "
        "| TTFT s (median / max) | ms per output token (median / max) | JIT compiles in the timed batches "
        "| running / waiting (most) / preemptions, timed batches |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = "bf16" if r["kv"] == "auto" else r["kv"]
        if not r.get("ok"):
            lines.append(f"| {r['mode']} | {name} | {r['backend'] or 'default'} | {r['kv_cache_bytes']} | FAILED: "
                         f"{r.get('error')} | | | | | | | | |")
            continue
        ttft = f"{r['ttft_s_median']} / {r['ttft_s_max']}" if "ttft_s_median" in r else "-"
        tpot = f"{r['tpot_ms_median']} / {r['tpot_ms_max']}" if "tpot_ms_median" in r else "-"
        jit = sorted(k for where, ks in (r.get("jit") or {}).items() if where.startswith("timed") for k in ks)
        lines.append(
            f"| {r['mode']} | {name} | {r['backend'] or 'default'} | {r['kv_cache_bytes'] / 2**30:.2f} GiB | "
            f"{r['kv_cache_tokens']} | {r['requests']} ({r['fits_requests']}) | {r['context']} + {r['new_tokens']} | "
            f"{r['best_s']} | {r['generated_tok_s']} | {ttft} | {tpot} | {', '.join(jit) or 'none'} | "
            f"{_sched_cell(r.get('sched'))} |"
        )
    serve = _ratio(rows, "serve", "generated_tok_s")
    if serve is not None:
        verdict = "meets" if serve >= SERVE_GOAL else "misses"
        lines += ["", f"serve: NVFP4 / bf16 generated tokens/s = {serve:.2f} ({verdict} the goal >= {SERVE_GOAL})"]
    pre = _ratio(rows, "prefill", "best_s")
    if pre is not None:
        verdict = "meets" if pre <= PREFILL_GOAL else "misses"
        lines += ["", f"prefill: NVFP4 / bf16 time = {pre:.2f} ({verdict} the goal <= {PREFILL_GOAL})"]
    for r in rows:
        if r.get("plugin"):
            lines += ["", f"plugin ({r['mode']}, {r['kv']}): {r['plugin'][0]}"]
            break
    return "\n".join(lines)


def _positive(text: str) -> int:
    v = int(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return v


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="serve,prefill", help="comma-separated: serve, prefill")
    ap.add_argument("--kv", default="auto,nvfp4",
                    help="comma-separated KV dtypes to run: auto (bf16), nvfp4 (e.g. rerun one engine)")
    ap.add_argument("--fit", type=_positive, default=8, help="serve: bf16 requests the KV budget holds (N)")
    ap.add_argument("--multiplier", type=_positive, default=4, help="serve: requests served = multiplier x N")
    ap.add_argument("--context", type=_positive, default=8192, help="serve: prompt tokens per request")
    ap.add_argument("--new-tokens", type=_positive, default=256, help="serve: generated tokens per request")
    ap.add_argument("--warmup-new-tokens", type=_positive, default=None,
                    help="serve: tokens generated per request in the warm-up batch (default: --new-tokens; fewer "
                         "keep a decode-heavy run within a time limit, e.g. --context 1024 --new-tokens 7168)")
    ap.add_argument("--prefill-requests", type=_positive, default=32)
    ap.add_argument("--prefill-context", type=_positive, default=8192)
    ap.add_argument("--repeats", type=_positive, default=2, help="timed batches per engine (best kept)")
    ap.add_argument("--bf16-backend", default="", help="attention_backend of the bf16 engines ('' = vLLM's default)")
    ap.add_argument("--nvfp4-backend", default="FLASHINFER",
                    help="attention_backend of the NVFP4 engines (the plugin serves vLLM's FlashInfer backend)")
    for f in ModelShape.__dataclass_fields__:
        ap.add_argument(f"--{f.replace('_', '-')}", type=_positive, default=getattr(ModelShape(), f))
    ap.add_argument("--timeout", type=_positive, default=1800, help="seconds per engine process")
    ap.add_argument("--json", default=None)
    ap.add_argument("--log-dir", default=None, help="keep each engine's full log here (<mode>-<kv>.log)")
    ap.add_argument("--dry-run", action="store_true", help="print the runs and KV budgets, start nothing")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    bad = [m for m in a.modes if m not in ("serve", "prefill")]
    if bad or not a.modes:
        ap.error(f"--modes: unknown {bad or 'empty'}; use serve, prefill or both")
    a.kv = [k.strip() for k in a.kv.split(",") if k.strip()]
    bad = [k for k in a.kv if k not in ("auto", "nvfp4")]
    if bad or not a.kv:
        ap.error(f"--kv: unknown {bad or 'empty'}; use auto (bf16), nvfp4 or both")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.child:
        spec = json.loads(Path(a.child).read_text())
        res = child(Run(**spec["run"]), spec["model_dir"], ModelShape(**spec["shape"]), spec["repeats"])
        Path(spec["result"]).write_text(json.dumps(res))
        os._exit(0)  # vLLM's engine threads can hold a normal exit
    shape = ModelShape(**{f: getattr(a, f) for f in ModelShape.__dataclass_fields__})
    runs = plan_runs(a, shape)
    if a.dry_run:
        print(f"bf16 KV bytes per token: {shape.bf16_bytes_per_token()}")
        for r in runs:
            print(json.dumps(asdict(r)))
        return 0
    rows: list[dict[str, Any]] = []
    max_len = max(r.context + r.new_tokens for r in runs)
    with tempfile.TemporaryDirectory() as model_dir:
        (Path(model_dir) / "config.json").write_text(json.dumps(shape.config(max_len), indent=1))
        for r in runs:
            print(f"[bench_serving] {r.mode} {r.kv}: {r.requests} x {r.context} + {r.new_tokens}, "
                  f"KV {r.kv_cache_bytes / 2**30:.2f} GiB", flush=True)
            res = _run_child(r, Path(model_dir), shape, a.repeats, a.timeout,
                             Path(a.log_dir) if a.log_dir else None)
            rows.append({**asdict(r), **res})
            print(f"[bench_serving]   {json.dumps(res)[:400]}", flush=True)
    text = report(rows, shape)
    print(text)
    if a.json:
        Path(a.json).write_text(json.dumps({"shape": asdict(shape), "rows": rows}, indent=1))
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
