"""One job of ``nvfp4compat validate``: a vLLM engine, the writer byte comparison, or the preflight.

The runner (``runner.py``) starts each job as ``python job.py SPEC.json`` in its own process and
process group (vLLM does not give GPU memory back inside a process). It is started by file path, not
as ``-m nvfp4compat.validation.job``, because the negative control runs where the plugin must not be
loaded, and a caller may run it where the package is not importable at all; this module therefore
imports nothing of nvfp4compat at the top. It writes ``spec["result"]`` (JSON) whatever happens;
its stdout/stderr (vLLM's log included) is the job log.

Spec keys: ``kind`` ("engine" | "writer" | "preflight"), ``tasks`` (engine: "start", "generate",
"logprobs", "throughput", "recall"), ``model``, ``kv_cache_dtype`` ("auto" = bf16, "fp8", "nvfp4"),
``mode`` ("eager", "piecewise", "full", "full-decode-optin", "default" = vLLM's own cudagraph
mode), ``gpu_memory_utilization``, ``max_model_len``, ``max_cudagraph_capture_size``,
``logprob_prompts``, ``logprob_prompt_len``, ``logprob_top_k``, ``prose_path``, ``tokenizer``,
``throughput_requests``, ``throughput_context``,
``throughput_new_tokens``, ``recall_lengths``, ``recall_per_depth``, ``seed``,
``tensor_parallel_size``, ``kv_cache_memory_bytes``, ``result``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

GENERATE_LENGTHS = (16, 100, 333, 1000)
GENERATE_NEW_TOKENS = 32
GENERATE_TOPK = 2
THROUGHPUT_REPEATS = 2
TEXT_PROMPT = "The quick brown fox jumps over the lazy dog. Key 17 maps to value"
LOGPROB_TOPK = 20  # prompt_logprobs when the spec names none (checks.LOGPROB_TOPK sets it)


def log(msg: str) -> None:
    print(f"[nvfp4compat validate job] {msg}", flush=True)


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:4000]


def is_tiny(model: str) -> bool:
    """The repository's tiny random-weight model (its folder carries ``tiny_model.json``)."""
    return (Path(model) / "tiny_model.json").is_file()


def is_gguf(model: str) -> bool:
    return model.endswith(".gguf") and Path(model).is_file()


def gguf_vocab_size(path: str) -> int:
    """The number of tokens a GGUF file's vocabulary holds (``tokenizer.ggml.tokens``)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise RuntimeError(
            f"{path} is a GGUF file and the gguf package is not installed here: pip install gguf"
        ) from None
    field = GGUFReader(path).fields.get("tokenizer.ggml.tokens")
    if field is None:
        raise ValueError(f"{path} has no tokenizer.ggml.tokens: cannot draw prompt token ids")
    return len(field.data)


def prose_windows(
    encode: Callable[[str], list[int]], text: str, count: int, length: int
) -> list[list[int]]:
    """Up to ``count`` consecutive non-overlapping windows of ``length`` token ids of ``text``.

    The kernel-level accuracy check (``nvfp4compat.accuracy.windows``) cuts the same windows out
    of the same prose, so the two KL figures score the same tokens. Raises ValueError when the text
    is shorter than one window.
    """
    ids = list(encode(text))
    n = min(count, len(ids) // length)
    if n < 1:
        raise ValueError(
            f"the prose has {len(ids)} tokens with this model's tokenizer, fewer than one "
            f"--logprob-prompt-len window of {length}: pass a smaller --logprob-prompt-len"
        )
    return [ids[i * length : (i + 1) * length] for i in range(n)]


def token_range(model: str) -> tuple[int, int]:
    """Ids of ordinary (non-special) tokens, from the tiny model's card; the whole vocab otherwise
    (from the local ``config.json``, a GGUF file's vocabulary, or the Hugging Face config of a hub
    name)."""
    if is_gguf(model):
        return 0, gguf_vocab_size(model)
    card = Path(model) / "tiny_model.json"
    if card.exists():
        lo, hi = json.loads(card.read_text())["regular_token_range"]
        return int(lo), int(hi)
    local = Path(model) / "config.json"
    if local.exists():
        cfg = json.loads(local.read_text())
        vocab = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
        if not vocab:
            raise ValueError(f"{local} names no vocab_size: cannot draw prompt token ids")
        return 0, int(vocab)
    from transformers import AutoConfig  # a vLLM dependency; reads the hub cache vLLM filled

    hf = AutoConfig.from_pretrained(model)
    return 0, int(getattr(hf, "vocab_size", None) or hf.get_text_config().vocab_size)


def random_prompts(
    seed: int, count: int, length: int, model: str, copy_half: bool = False
) -> list[list[int]]:
    """``count`` prompts of ``length`` token ids drawn from a seeded generator.

    With ``copy_half`` the second half repeats spans of the first half (a retrieval pattern a
    trained model attends to; a random model does not care).
    """
    import numpy as np

    lo, hi = token_range(model)
    rng = np.random.default_rng(seed)
    prompts = []
    for _ in range(count):
        ids = rng.integers(lo, hi, size=length).tolist()
        if copy_half:
            half = length // 2
            pos = half
            while pos < length:
                span = int(rng.integers(8, 64))
                src = int(rng.integers(0, half - span))
                n = min(span, length - pos)
                ids[pos : pos + n] = ids[src : src + n]
                pos += n
        prompts.append(ids)
    return prompts


# --------------------------------------------------------------------------------------------
# engine


def engine_kwargs(spec: dict[str, Any]) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "model": spec["model"],
        # a GGUF file serves as its own tokenizer: vLLM hands transformers its folder and
        # gguf_file=<name>; --tokenizer names another (a Hugging Face folder or name)
        "tokenizer": spec.get("tokenizer") or spec["model"],
        "dtype": "bfloat16",
        "kv_cache_dtype": spec["kv_cache_dtype"],
        "attention_backend": "FLASHINFER",
        "gpu_memory_utilization": spec["gpu_memory_utilization"],
        "max_model_len": spec["max_model_len"],
        "max_num_seqs": 64,
        "enable_prefix_caching": False,
        "seed": spec.get("seed", 0),
        "generation_config": "vllm",
        "tensor_parallel_size": spec.get("tensor_parallel_size", 1),
    }
    if spec.get("kv_cache_memory_bytes"):
        # a fixed KV reservation skips vLLM's memory profiling, so engines that share the GPU (runs
        # made side by side) cannot skew each other's budget; never set for capacity or throughput
        kw["kv_cache_memory_bytes"] = int(spec["kv_cache_memory_bytes"])
    mode = spec["mode"]
    cap = spec.get("max_cudagraph_capture_size", 64)
    if mode == "eager":
        kw["enforce_eager"] = True
    elif mode == "piecewise":
        kw["compilation_config"] = {
            "cudagraph_mode": "PIECEWISE",
            "max_cudagraph_capture_size": cap,
        }
    elif mode == "full":
        kw["compilation_config"] = {"cudagraph_mode": "FULL", "max_cudagraph_capture_size": cap}
    elif mode == "full-decode-optin":
        # FULL graphs for uniform decode batches, piecewise for the rest; the job's environment sets
        # NVFP4COMPAT_CUDAGRAPH_DECODE=1 so the plugin lets its readers be captured (by default only
        # where the matrix verified it)
        kw["compilation_config"] = {
            "cudagraph_mode": "FULL_AND_PIECEWISE",
            "max_cudagraph_capture_size": cap,
        }
    elif mode == "default":
        kw["compilation_config"] = {"max_cudagraph_capture_size": cap}
    else:
        raise ValueError(
            f"unknown mode {mode!r}; known: eager, piecewise, full, full-decode-optin, default"
        )
    if kw["tensor_parallel_size"] > 1 and "compilation_config" in kw:
        # vLLM's allreduce+RMSNorm fusion (on by default for TP on Hopper) builds FlashInfer's
        # all-reduce workspace, auto-selecting the NVLink-multicast "mnnvl" backend; on the H200 host
        # (multicast off by rule) the PIECEWISE TP2 engine then died in its profile run with
        # CUBLAS_STATUS_INTERNAL_ERROR / illegal memory access (2026-11-29). The fusion is a vLLM
        # matmul/comm optimisation unrelated to the KV cache; TP checks run without it.
        kw["compilation_config"]["pass_config"] = {"fuse_allreduce_rms": False}
    return kw


def task_start(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    from vllm import LLM

    kw = engine_kwargs(spec)
    log(f"LLM({kw})")
    t0 = time.time()
    llm = LLM(**kw)
    cfg = llm.llm_engine.vllm_config
    blocks = cfg.cache_config.num_gpu_blocks
    bs = cfg.cache_config.block_size
    return llm, {
        "ok": True,
        "seconds": round(time.time() - t0, 1),
        "num_gpu_blocks": blocks,
        "block_size": bs,
        "kv_cache_tokens": blocks * bs if blocks else None,
        "cache_dtype": str(cfg.cache_config.cache_dtype),
        "cudagraph_mode_requested": str(cfg.compilation_config.cudagraph_mode),
        "compilation_mode": str(cfg.compilation_config.mode),
        "kwargs": {k: v for k, v in kw.items() if k not in ("model", "tokenizer")},
    }


def task_generate(llm: Any, spec: dict[str, Any]) -> dict[str, Any]:
    from vllm import SamplingParams

    prompts = [
        random_prompts(spec.get("seed", 0) + 11 + i, 1, n, spec["model"])[0]
        for i, n in enumerate(GENERATE_LENGTHS)
    ]
    sp = SamplingParams(
        temperature=0.0, max_tokens=GENERATE_NEW_TOKENS, ignore_eos=True, logprobs=GENERATE_TOPK
    )
    t0 = time.time()
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts] + [TEXT_PROMPT], sp, use_tqdm=False
    )
    ids = [list(o.outputs[0].token_ids) for o in outs]
    # per prompt, per generated step: the top-GENERATE_TOPK (token, logprob) pairs, best first, so
    # that a divergence between two runs can be told apart: a near-tie (noise) or a real difference
    top: list[list[list[tuple[int, float]]]] = []
    for o in outs:
        steps = []
        for d in o.outputs[0].logprobs or []:
            ranked = sorted(d.items(), key=lambda kv: kv[1].rank)[:GENERATE_TOPK]
            steps.append([(int(t), round(float(lp.logprob), 6)) for t, lp in ranked])
        top.append(steps)
    return {
        "ok": True,
        "seconds": round(time.time() - t0, 2),
        "prompt_lengths": [*GENERATE_LENGTHS, len(outs[-1].prompt_token_ids)],
        "token_ids": ids,
        "top_logprobs": top,
        "text_prompt": TEXT_PROMPT,
        "text_output": outs[-1].outputs[0].text,
        "distinct_tokens": [len(set(x)) for x in ids],
    }


def logprob_prompts(llm: Any, spec: dict[str, Any]) -> tuple[str, list[list[int]]]:
    """Check 4's prompts: random ids (half copied) for the tiny random model, windows of the
    bundled English prose (``prose_path``, tokenized by the engine's own tokenizer) for a real one."""
    n, length = spec["logprob_prompts"], spec["logprob_prompt_len"]
    if is_tiny(spec["model"]) or not spec.get("prose_path"):
        return "random", random_prompts(1234, n, length, spec["model"], copy_half=True)
    tok = llm.get_tokenizer()
    text = Path(spec["prose_path"]).read_text(encoding="utf-8")
    return "prose", prose_windows(
        lambda t: list(tok.encode(t, add_special_tokens=False)), text, n, length
    )


def ranked(entries: Any, k: int) -> list[tuple[int, float]]:
    """vLLM's ``{token: Logprob}`` of one position -> its top-``k`` ``(token, logprob)``, best
    first (vLLM adds the prompt token outside the top-K; it may return fewer than ``k``)."""
    items = sorted(entries.items(), key=lambda kv: -float(kv[1].logprob))
    return [
        (int(t), float(lp.logprob))
        for t, lp in items
        if getattr(lp, "rank", None) is None or lp.rank <= k
    ][:k]


def task_logprobs(llm: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """Teacher-forced next-token log-probabilities over a fixed prompt set (``prompt_logprobs=K``):
    per position the target token's logprob, the top-1 token and the top-K lists (check 4's KL)."""
    from vllm import SamplingParams

    k = int(spec.get("logprob_top_k") or LOGPROB_TOPK)
    source, prompts = logprob_prompts(llm, spec)
    sp = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=k, ignore_eos=True)
    t0 = time.time()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
    res: list[dict[str, list[Any]]] = []
    for prompt, out in zip(prompts, outs, strict=True):
        plp = out.prompt_logprobs
        target, top1, ids, lps = [], [], [], []
        for pos in range(1, len(prompt)):
            d = plp[pos]
            tok = prompt[pos]
            target.append(round(float(d[tok].logprob), 6))
            top = ranked(d, k)
            top1.append(top[0][0] if top else int(tok))
            ids.append([t for t, _ in top])
            lps.append([round(lp, 5) for _, lp in top])
        res.append(
            {
                "target": list(prompt[1:]),
                "target_logprob": target,
                "top1": top1,
                "top_ids": ids,
                "top_logprobs": lps,
            }
        )
    return {
        "ok": True,
        "seconds": round(time.time() - t0, 2),
        "source": source,
        "top_k": k,
        "prompts": res,
        "positions": sum(len(r["top1"]) for r in res),
        "prompt_len": spec["logprob_prompt_len"],
    }


def task_throughput(llm: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """Decode tokens/s at ``throughput_requests`` concurrent requests of ``throughput_context`` tokens.

    After a warm-up at the same shapes, timed batches with fresh prompts (prefix caching is off),
    each ``THROUGHPUT_REPEATS`` times, best kept: one generating 1 token (prefill only) and one
    generating ``throughput_new_tokens``; decode rate = requests * (new - 1) / (t_new - t_1).
    """
    from vllm import SamplingParams

    n, ctx, new = (
        spec["throughput_requests"],
        spec["throughput_context"],
        spec["throughput_new_tokens"],
    )

    def batch(seed: int, max_tokens: int) -> tuple[float, int]:
        prompts = random_prompts(seed, n, ctx, spec["model"])
        t0 = time.time()
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in prompts],
            SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
            use_tqdm=False,
        )
        return time.time() - t0, sum(len(o.outputs[0].token_ids) for o in outs)

    # Warm-up at the timed shapes: the first batch of n x ctx tokens JIT-compiles (Triton) and
    # autotunes kernels for shapes a short warm-up never reaches (an earlier run without this
    # reported a prefill-only batch slower than prefill + decode).
    warm_s = [round(batch(7, 1)[0], 3), round(batch(6, new)[0], 3)]
    t_prefill = min(batch(8 + 2 * r, 1)[0] for r in range(THROUGHPUT_REPEATS))
    runs = [batch(9 + 2 * r, new) for r in range(THROUGHPUT_REPEATS)]
    t_all, produced = min(runs)
    decode_s = t_all - t_prefill
    return {
        "warmup_s": warm_s,
        "repeats": THROUGHPUT_REPEATS,
        "ok": True,
        "requests": n,
        "context": ctx,
        "new_tokens": new,
        "generated_tokens": produced,
        "prefill_only_s": round(t_prefill, 3),  # best of the repeats
        "prefill_plus_decode_s": round(t_all, 3),
        "decode_tok_s": round(n * (new - 1) / decode_s, 1) if decode_s > 0 else None,
        "overall_tok_s": round(produced / t_all, 1),
    }


def task_recall(llm: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """Issue 7: exact-match needle recall (10 depths x ``recall_per_depth`` per length), greedy.

    The prompts and the scorer are ``nvfp4compat.recall.task``'s, the same ones the torch-only
    evaluation and the trainer use; the vocabulary layout is read from the model's tokenizer.json.
    """
    from vllm import SamplingParams

    from nvfp4compat.recall import task as rt

    layout = rt.VocabLayout.from_tokenizer_json(Path(spec["model"]) / "tokenizer.json")
    prompts = [
        p
        for L in spec["recall_lengths"]
        for p in rt.make_needle_prompts(layout, L, rt.DEPTHS, spec["recall_per_depth"], seed=7)
    ]
    sp = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    t0 = time.time()
    outs = llm.generate([{"prompt_token_ids": p.token_ids} for p in prompts], sp, use_tqdm=False)
    gen = [list(o.outputs[0].token_ids) for o in outs]
    sc = rt.score(prompts, gen)
    return {
        "ok": True,
        "seconds": round(time.time() - t0, 2),
        "prompts": len(prompts),
        "recall": {str(k): v for k, v in sc["recall"].items()},
        "table": {str(k): {f"{d:.1f}": h for d, h in v.items()} for k, v in sc["table"].items()},
        "overall": sc["overall"],
        "misses": sc["misses"][:20],
    }


def run_engine(spec: dict[str, Any], result: dict[str, Any]) -> None:
    tasks = result["tasks"]
    try:
        llm, tasks["start"] = task_start(spec)
    except BaseException as exc:  # noqa: BLE001 - the failure is the result (check 1 expects one)
        tasks["start"] = {
            "ok": False,
            "error": _err(exc),
            "traceback": traceback.format_exc()[-4000:],
        }
        log(f"engine did not start: {_err(exc)}")
        return
    log(f"engine up: {json.dumps(tasks['start'])}")
    for name, fn in (
        ("generate", task_generate),
        ("logprobs", task_logprobs),
        ("throughput", task_throughput),
        ("recall", task_recall),
    ):
        if name not in spec["tasks"]:
            continue
        t0 = time.time()
        try:
            tasks[name] = fn(llm, spec)
        except BaseException as exc:  # noqa: BLE001
            tasks[name] = {
                "ok": False,
                "error": _err(exc),
                "traceback": traceback.format_exc()[-4000:],
            }
        log(
            f"{name}: {'ok' if tasks[name].get('ok') else tasks[name].get('error')} in {time.time() - t0:.1f} s"
        )
    try:  # give the GPU memory back before the next job starts (the runner also kills the group)
        llm.llm_engine.engine_core.shutdown()
    except Exception as exc:  # noqa: BLE001
        log(f"engine shutdown: {_err(exc)}")
    del llm


# --------------------------------------------------------------------------------------------
# writer bytes


def run_writer(spec: dict[str, Any], result: dict[str, Any]) -> None:
    """nvfp4compat's Triton writer against FlashInfer's slot-mapping writer, byte for byte."""
    import importlib.metadata as md

    import flashinfer
    import torch

    from nvfp4compat.kernels import get_kernel

    fi_write = getattr(flashinfer, "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping", None)
    if fi_write is None:
        raise RuntimeError(
            f"flashinfer {md.version('flashinfer-python')} has no nvfp4_quantize_append_paged_kv_cache_with_slot_mapping (0.6.15+ has it)"
        )
    tri_write = get_kernel("write", "triton")
    try:
        from nvfp4compat.kernels import reference as ref

        ref_write = ref.append_slot_mapping
    except Exception:  # noqa: BLE001 - the reference is extra information only
        ref_write = None
    dev = torch.device("cuda")
    gen = torch.Generator(device="cpu").manual_seed(20261129)
    cases = []

    def make(t: int, h: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = torch.randn(t, h, d, generator=gen)
        v = torch.randn(t, h, d, generator=gen)
        k[:, :, [3, 17, 64, 100]] *= 8.0  # outlier channels, as in h200-baselines
        k[5] = 0.0  # an all-zero row: sf 0
        v[7, :, :16] = 1e-40  # below the fp32 normal range: flushed to signed zero
        v[9, 0, :] = torch.linspace(-6.0, 6.0, d)  # exact E2M1 grid points and ties
        return k.to(torch.bfloat16).to(dev), v.to(torch.bfloat16).to(dev)

    for layout in ("NHD", "HND"):
        for scale_mode in ("amax", "one"):
            t, h, d, ps = 4096, 8, 128, 16
            pages = t // ps + 16
            key, value = make(t, h, d)
            slots = torch.randperm(pages * ps, generator=gen)[:t]
            slots[::20] = -1
            slots = slots.to(torch.int64).to(dev)
            if scale_mode == "amax":
                ks = torch.tensor(
                    [key.float().abs().max().item() / (6 * 448)], dtype=torch.float32, device=dev
                )
                vs = torch.tensor(
                    [value.float().abs().max().item() / (6 * 448)], dtype=torch.float32, device=dev
                )
            else:
                ks = torch.ones(1, dtype=torch.float32, device=dev)
                vs = torch.ones(1, dtype=torch.float32, device=dev)
            shape = (pages, ps, h, d // 2) if layout == "NHD" else (pages, h, ps, d // 2)
            sshape = shape[:-1] + (d // 16,)

            def caches(
                shape: tuple[int, ...] = shape, sshape: tuple[int, ...] = sshape
            ) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
                """Fresh (data, scale) tuples, pre-filled with sentinels: padding slots keep them."""
                data = tuple(
                    torch.full(shape, 0xAB, dtype=torch.uint8, device=dev) for _ in range(2)
                )
                sf = tuple(
                    torch.full(sshape, 0x5A, dtype=torch.uint8, device=dev).view(
                        torch.float8_e4m3fn
                    )
                    for _ in range(2)
                )
                return data, sf  # type: ignore[return-value, unused-ignore]

            (td, tsf), (fd, fsf) = caches(), caches()
            tri_write(key, value, slots, td, tsf, ks, vs, kv_layout=layout)
            fi_write(key, value, slots, fd, fsf, ks, vs, kv_layout=layout)
            torch.cuda.synchronize()
            diff = {
                "k_data": int((td[0] != fd[0]).sum()),
                "v_data": int((td[1] != fd[1]).sum()),
                "k_sf": int((tsf[0].view(torch.uint8) != fsf[0].view(torch.uint8)).sum()),
                "v_sf": int((tsf[1].view(torch.uint8) != fsf[1].view(torch.uint8)).sum()),
            }
            case: dict[str, Any] = {
                "layout": layout,
                "scale": scale_mode,
                "tokens": t,
                "kv_heads": h,
                "head_dim": d,
                "page_size": ps,
                "padding_slots": int((slots < 0).sum()),
                "differing_bytes": diff,
                "bytes_compared": int(td[0].numel() * 2 + tsf[0].numel() * 2),
            }
            if ref_write is not None:
                (rd, rsf) = caches()
                try:
                    ref_write(key, value, slots, rd, rsf, ks, vs, kv_layout=layout)
                    case["triton_vs_reference_bytes"] = int(
                        (td[0] != rd[0]).sum()
                        + (td[1] != rd[1]).sum()
                        + (tsf[0].view(torch.uint8) != rsf[0].view(torch.uint8)).sum()
                        + (tsf[1].view(torch.uint8) != rsf[1].view(torch.uint8)).sum()
                    )
                    case["flashinfer_vs_reference_bytes"] = int(
                        (fd[0] != rd[0]).sum()
                        + (fd[1] != rd[1]).sum()
                        + (fsf[0].view(torch.uint8) != rsf[0].view(torch.uint8)).sum()
                        + (fsf[1].view(torch.uint8) != rsf[1].view(torch.uint8)).sum()
                    )
                except Exception as exc:  # noqa: BLE001
                    case["reference_error"] = _err(exc)
            cases.append(case)
            log(f"writer {layout} scale={scale_mode}: {case['differing_bytes']}")
    # time both at the h200-baselines size (65,536 tokens x 8 heads x 128)
    timing: dict[str, Any] = {}
    try:
        t, h, d, ps = 65536, 8, 128, 16
        key, value = make(t, h, d)
        slots = torch.randperm(t, generator=gen).to(torch.int64).to(dev)
        ks = torch.ones(1, dtype=torch.float32, device=dev)
        shape = (t // ps, ps, h, d // 2)
        data = tuple(torch.zeros(shape, dtype=torch.uint8, device=dev) for _ in range(2))
        sf = tuple(
            torch.zeros(shape[:-1] + (d // 16,), dtype=torch.float8_e4m3fn, device=dev)
            for _ in range(2)
        )
        for name, fn in (("triton", tri_write), ("flashinfer", fi_write)):
            for _ in range(3):
                fn(key, value, slots, data, sf, ks, ks, kv_layout="NHD")
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                fn(key, value, slots, data, sf, ks, ks, kv_layout="NHD")
            end.record()
            torch.cuda.synchronize()
            timing[f"{name}_ms"] = round(start.elapsed_time(end) / 20, 4)
        timing["shape"] = "65536 tokens x 8 heads x 128, NHD, random slots"
    except Exception as exc:  # noqa: BLE001
        timing["error"] = _err(exc)
    identical = all(sum(c["differing_bytes"].values()) == 0 for c in cases)
    result["tasks"]["writer"] = {
        "ok": True,
        "identical": identical,
        "cases": cases,
        "timing": timing,
        "flashinfer": md.version("flashinfer-python"),
        "triton_impl": f"{tri_write.__module__}.{tri_write.__name__}",
    }


# --------------------------------------------------------------------------------------------
# preflight

PREFLIGHT_MODULES = (
    "vllm",
    "vllm.engine.arg_utils",
    "vllm.v1.engine.core",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.model_executor.models.qwen3",
    "vllm.v1.attention.backends.flashinfer",
    "vllm.entrypoints.llm",
    "vllm.v1.engine.core_client",
    "vllm.v1.executor.multiproc_executor",
    "vllm.compilation.backends",
    "vllm.v1.sample.sampler",
    "vllm.v1.structured_output.backend_xgrammar",
    "vllm.platforms.cuda",
)


def run_preflight(spec: dict[str, Any], result: dict[str, Any]) -> None:
    import importlib
    import importlib.metadata as md
    import shutil
    import subprocess

    import torch

    info: dict[str, Any] = {
        "ok": True,
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["capability"] = "{}.{}".format(*torch.cuda.get_device_capability(0))
        info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception as exc:  # noqa: BLE001
        info["triton"] = _err(exc)
    nvcc = shutil.which("nvcc")
    info["nvcc"] = (
        (
            subprocess.run([nvcc, "--version"], capture_output=True, text=True)
            .stdout.strip()
            .splitlines()
            or ["?"]
        )[-1]
        if nvcc
        else None
    )
    info["ninja"] = shutil.which("ninja")
    info["pythonpath"] = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    imports = {}
    for m in PREFLIGHT_MODULES:
        t0 = time.time()
        try:
            importlib.import_module(m)
            imports[m] = f"ok {time.time() - t0:.1f}s"
        except Exception as exc:  # noqa: BLE001
            imports[m] = _err(exc)
            info["ok"] = False
    info["imports"] = imports
    for dist, mod in (
        ("vllm", "vllm"),
        ("flashinfer-python", "flashinfer"),
        ("nvfp4compat", "nvfp4compat"),
    ):
        try:
            info[mod] = f"{md.version(dist)} at {importlib.import_module(mod).__file__}"
        except Exception as exc:  # noqa: BLE001
            info[mod] = _err(exc)
    info["general_plugins"] = sorted(
        f"{e.name}={e.value}" for e in md.entry_points(group="vllm.general_plugins")
    )
    try:
        import vllm._C_stable_libtorch  # noqa: F401

        info["vllm_C"] = {
            "loaded": True,
            "reshape_and_cache_flash": hasattr(torch.ops._C_cache_ops, "reshape_and_cache_flash"),
        }
    except Exception as exc:  # noqa: BLE001
        info["vllm_C"] = {"loaded": False, "error": _err(exc)}
        info["ok"] = False
    # Which distribution each loaded top-level module came from, and whether vLLM's requirements hold.
    dists: dict[str, str] = {}
    pkg = md.packages_distributions()
    for top in sorted({name.split(".")[0] for name in list(sys.modules)}):
        for dist in pkg.get(top, []):
            try:
                d = md.distribution(dist)
                dists[dist] = f"{d.version} ({d.locate_file('')})"
            except md.PackageNotFoundError:
                pass
    info["loaded_distributions"] = dists
    violations = []
    try:
        from packaging.markers import default_environment
        from packaging.requirements import Requirement

        envm: dict[str, str] = {k: str(v) for k, v in default_environment().items()}
        for owner in (
            "vllm",
            "flashinfer-python",
            "xgrammar",
            "transformers",
            "pydantic",
            "openai",
            "fastapi",
        ):
            try:
                reqs = md.requires(owner) or []
            except md.PackageNotFoundError:
                continue
            for line in reqs:
                req = Requirement(line)
                if req.marker and not req.marker.evaluate({**envm, "extra": ""}):
                    continue
                try:
                    have = md.version(req.name)
                except md.PackageNotFoundError:
                    continue
                if req.specifier and not req.specifier.contains(have, prereleases=True):
                    violations.append(f"{owner} wants {req}, found {have}")
    except Exception as exc:  # noqa: BLE001
        violations.append(f"requirement check failed: {_err(exc)}")
    info["requirement_mismatches"] = violations
    if is_gguf(str(spec.get("model", ""))):
        info["gguf_model"] = gguf_support(spec["model"])
        if not info["gguf_model"]["ok"]:
            info["ok"] = False
    info["plan"] = current_plan()
    result["tasks"]["preflight"] = info
    log(json.dumps(info, indent=1, default=str))


def gguf_support(model: str) -> dict[str, Any]:
    """Whether this environment can serve the GGUF file ``model``: the ``gguf`` package (vLLM and
    transformers read GGUF with it) and vLLM's GGUF loader, in-tree or the ``vllm-gguf-plugin``."""
    import importlib.metadata as md
    import importlib.util

    out: dict[str, Any] = {"ok": True, "model": model}
    try:
        out["gguf"] = md.version("gguf")
    except md.PackageNotFoundError:
        out["ok"] = False
        out["error"] = (
            f"--model {model} is a GGUF file and the gguf package is not installed in "
            f"{sys.executable}'s environment: pip install gguf (vLLM reads GGUF weights and "
            "tokenizer with it)"
        )
        return out
    try:
        in_tree = importlib.util.find_spec("vllm.model_executor.layers.quantization.gguf") is not None
    except ModuleNotFoundError:
        in_tree = False
    try:
        plugin: str | None = md.version("vllm-gguf-plugin")
    except md.PackageNotFoundError:
        plugin = None
    out["vllm_gguf"] = "in-tree" if in_tree else (f"vllm-gguf-plugin {plugin}" if plugin else None)
    if out["vllm_gguf"] is None:
        out["ok"] = False
        out["error"] = (
            f"--model {model} is a GGUF file and this vLLM has no GGUF loader (no "
            "vllm.model_executor.layers.quantization.gguf, no vllm-gguf-plugin; vLLM 0.26.0's wheel has "
            "neither): pip install vllm-gguf-plugin, or serve the same weights as a Hugging Face folder: "
            f"python -m nvfp4compat.accuracy --gguf {model} --export-hf DIR (transformers de-quantizes them, as "
            "the kernel-level accuracy check does), then --model DIR"
        )
    return out


def current_plan() -> dict[str, Any]:
    """This environment's plan, as ``nvfp4compat doctor`` prints it (JSON and text).

    Run as the command, not imported: its JSON is the interface the checks read (``supported``,
    ``reason``, ``bindings``), whatever the resolver's internals are.
    """
    import subprocess

    out: dict[str, Any] = {}
    base = [sys.executable, "-m", "nvfp4compat", "doctor", "--no-trace"]
    for key, argv in (("json", [*base, "--json"]), ("text", base)):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        out[f"{key}_rc"] = proc.returncode
        if key == "text":
            out["text"] = proc.stdout.strip()
        elif proc.stdout.strip():
            try:
                out["json"] = json.loads(proc.stdout)
            except json.JSONDecodeError as exc:
                out["error"] = f"doctor --json printed no JSON ({exc}): {proc.stdout[:300]!r}"
        if proc.returncode not in (0, 1, 3):
            out["error"] = f"nvfp4compat doctor exited {proc.returncode}: {proc.stderr.strip()[-600:]}"
    plan = out.get("json") or {}
    out["supported"] = plan.get("supported")
    out["reason"] = plan.get("reason")
    return out


def main() -> int:
    # Started by file path: Python put this folder first on sys.path; take it off so that its
    # modules (checks, report, runner) cannot shadow a top-level module of the same name.
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if p and str(Path(p).resolve()) != here] or sys.path
    if len(sys.argv) != 2:
        print(f"usage: {Path(sys.argv[0]).name} SPEC.json (written by nvfp4compat validate)", file=sys.stderr)
        return 2
    spec = json.loads(Path(sys.argv[1]).read_text())
    result: dict[str, Any] = {"kind": spec["kind"], "tasks": {}, "error": None, "pid": os.getpid()}
    t0 = time.time()
    try:
        {"engine": run_engine, "writer": run_writer, "preflight": run_preflight}[spec["kind"]](
            spec, result
        )
    except BaseException as exc:  # noqa: BLE001 - reported in the result
        result["error"] = _err(exc)
        result["traceback"] = traceback.format_exc()[-6000:]
        log(result["traceback"])
    result["seconds"] = round(time.time() - t0, 1)
    Path(spec["result"]).write_text(json.dumps(result, default=str))
    log(f"done in {result['seconds']} s")
    sys.stdout.flush()
    # vLLM's engine-core child and atexit hooks can hang the exit; the runner kills the group anyway.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
