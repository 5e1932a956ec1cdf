#!/usr/bin/env python3
"""Train the recall model: a small Qwen3ForCausalLM that retrieves exact tokens across 2K-8K positions.

Pure torch (no transformers needed to train). The task, its vocabulary and the needle prompts come from
``nvfp4compat/recall/task.py`` and the model from ``nvfp4compat/recall/model.py`` (single source of
truth; both are loaded by path when ``nvfp4compat`` itself cannot be imported, e.g. on a host
without pydantic). See ``docs/recall.md``.

- Task: a stream of triples ``key v1 v2`` (4096 keys, 4096 values; keys and ``v1`` distinct) with query blocks
  ``<q> key v1 v2`` interleaved for keys stored anywhere earlier; the loss is on ``v1`` and ``v2`` only
  (dense supervision, ~15% of the tokens).
- Model (defaults): 4 layers, hidden 256, 8 query heads and 2 KV heads of head_dim 128 (GQA 4),
  SiLU MLP 768, RoPE theta 1e6, 32768 positions, tied embeddings: 7.1M parameters, 13.5 MiB in bf16
  (under the 16 MiB a device call returns per file).
- Schedule: a fixed number of tokens per step. The sequence length starts at ``--min-len`` and doubles
  whenever the training exact match over a ``--advance-every`` window reaches ``--advance-em``; a
  floor forces it up geometrically from ``--ramp-start`` to ``--ramp-end`` (fractions of training).
  At ``--max-len`` each step draws ``max_len`` (50%), ``max_len/2`` (30%) or ``max_len/4`` (20%). Progress is
  ``max(step / --steps, elapsed / --max-seconds)``: the step budget binds (repeatable run) unless
  the device is slower than estimated, when the wall cap compresses the same schedule.
- At the end: dense bf16 greedy recall of the saved (bf16) weights at ``--eval-lengths`` x 10 depths
  x ``--eval-per-depth`` needles, then the model folder: ``config.json``, ``generation_config.json``,
  ``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``,
  ``README.md`` (model card) and ``train_log.json`` (8 files).

Usage::

    # H200 (about 4 minutes of training plus ~1 minute of evaluation)
    python scripts/train_recall_model.py --out $OUT/recall-model
    # CPU smoke run (2 cores, a few minutes)
    python scripts/train_recall_model.py --out recall-cpu --device cpu --max-len 256 \
        --min-len 64 --tokens-per-step 4096 --steps 400 --max-seconds 240 --eval-lengths 128,256
    # compare the forward with transformers' Qwen3ForCausalLM on a saved folder
    python scripts/train_recall_model.py --check-hf recall-cpu
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import math
import platform
import shlex
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


def _recall_module(name: str) -> ModuleType:
    """Import ``nvfp4compat.recall.<name>``; if the package cannot be imported (its ``__init__`` needs
    pydantic and PyYAML), load the file by path: task.py and model.py import nothing from it."""
    try:
        return importlib.import_module(f"nvfp4compat.recall.{name}")
    except ImportError:
        pass
    path = REPO / "nvfp4compat" / "recall" / f"{name}.py"
    mod_name = f"_nvfp4compat_recall_{name}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}: run this script from an nvfp4compat checkout")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    spec.loader.exec_module(mod)
    return mod


if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
task = _recall_module("task")
rmodel = _recall_module("model")


# ----------------------------------------------------------------------------------------------
# schedule and cost model


def forced_len(progress: float, args: argparse.Namespace) -> float:
    """The length floor: ``--min-len`` until ``--ramp-start``, then geometric to ``--max-len`` at
    ``--ramp-end`` (fractions of training)."""
    if progress <= args.ramp_start:
        return float(args.min_len)
    x = min(1.0, (progress - args.ramp_start) / (args.ramp_end - args.ramp_start))
    return args.min_len * (args.max_len / args.min_len) ** x


def seq_len_at(progress: float, cur_len: int, args: argparse.Namespace, rng: Any) -> int:
    """Sequence length of a step: ``max(cur_len, forced_len(progress))`` (``cur_len`` doubles whenever
    the training exact match reaches ``--advance-em``); once that reaches ``--max-len``, each step
    draws ``max_len`` (50%), ``max_len/2`` (30%) or ``max_len/4`` (20%). Multiple of 64 (8 below 512)."""
    L = max(float(cur_len), forced_len(progress, args))
    if args.max_len <= L:
        L = args.max_len / float(rng.choice([1, 2, 4], p=[0.5, 0.3, 0.2]))
    q = 64 if L >= 512 else 8
    return int(max(args.min_len, min(args.max_len, L // q * q)))


def lr_at(step: int, progress: float, args: argparse.Namespace) -> float:
    """Linear warm-up over ``--warmup`` steps, then cosine from ``--lr`` to ``0.1 * --lr``."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def step_flops(cfg: Any, batch: int, seq_len: int, n_sup: int) -> float:
    """Model FLOPs of one training step (forward + backward).

    Dense: ``6 * (non-embedding parameters) * tokens + 6 * vocab * hidden * n_sup`` (the LM head runs
    only on supervised positions). Causal attention: forward ``2 * B * Hq * L^2 * D`` (QK^T and PV,
    half the square), backward ~2.5x the forward.
    """
    H, D = cfg.hidden_size, cfg.head_dim
    non_emb = cfg.n_params() - cfg.vocab_size * H
    tokens = batch * seq_len
    dense = 6.0 * non_emb * tokens + 6.0 * cfg.vocab_size * H * n_sup
    attn = 3.5 * 2.0 * batch * cfg.num_attention_heads * seq_len**2 * D * cfg.num_hidden_layers
    return dense + attn


# ----------------------------------------------------------------------------------------------
# training


def make_attn(torch: Any, device: Any, log: list[str]) -> Any:
    """The training attention core: SDPA with GQA on a fused backend (flash / cuDNN / efficient).

    On CUDA the math backend is excluded (at 8K it would materialise B*H*L^2 scores); if no fused
    backend takes ``enable_gqa``, K/V are expanded to the query heads instead (logged once).
    """
    import torch.nn.functional as F

    if device.type != "cuda":
        return rmodel.sdpa_attention
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
    ]
    state = {"gqa": True}

    def attn(layer: int, q: Any, k: Any, v: Any, positions: Any) -> Any:
        dt = v.dtype
        q, k, v = q.to(dt).transpose(1, 2), k.to(dt).transpose(1, 2), v.transpose(1, 2)
        with sdpa_kernel(backends):
            if state["gqa"]:
                try:
                    return F.scaled_dot_product_attention(
                        q, k, v, is_causal=True, enable_gqa=True
                    ).transpose(1, 2)
                except RuntimeError as exc:
                    state["gqa"] = False
                    log.append(
                        f"fused SDPA refused enable_gqa ({str(exc).splitlines()[0]}); expanding K/V"
                    )
                    print(log[-1], flush=True)
            rep = q.shape[1] // k.shape[1]
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)

    return attn


def train(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.manual_seed(args.seed)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    amp = args.amp if args.amp != "auto" else ("bf16" if device.type == "cuda" else "off")
    layout = task.VocabLayout(n_keys=args.n_keys, n_values=args.n_values)
    cfg = rmodel.ModelConfig(
        vocab_size=layout.vocab_size,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        rope_theta=args.rope_theta,
        max_position_embeddings=args.max_positions,
    )
    if args.max_len > 3 * layout.n_keys:
        print(
            f"note: --max-len {args.max_len} holds more triples than there are keys ({layout.n_keys}); "
            "keys repeat and only keys stored once are queried"
        )
    model = rmodel.RecallLM(cfg)
    if args.init_from is not None:
        start = rmodel.load_model(args.init_from, dtype=torch.float32)
        if start.cfg != cfg:
            raise SystemExit(
                f"--init-from {args.init_from} has config {start.cfg.to_dict()}, the arguments give "
                f"{cfg.to_dict()}: pass the same model and vocabulary options"
            )
        model.load_state_dict(start.state_dict())
        print(f"initialised from {args.init_from} (bf16 weights; optimizer state starts fresh)")
    else:
        model.init_weights(torch.Generator().manual_seed(args.seed))
        # sharper initial attention: the logits scale with q_norm.weight * k_norm.weight
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_norm.weight.fill_(args.qk_norm_init)
                layer.self_attn.k_norm.weight.fill_(args.qk_norm_init)
    model.to(device)
    decay = [p for n, p in model.named_parameters() if p.ndim == 2 and "embed_tokens" not in n]
    embed = [model.model.embed_tokens.weight]
    norms = [p for p in model.parameters() if p.ndim == 1]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": args.weight_decay, "lr_mult": 1.0},
            {"params": embed, "weight_decay": 0.0, "lr_mult": 1.0},
            {"params": norms, "weight_decay": 0.0, "lr_mult": args.norm_lr_mult},
        ],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=device.type == "cuda",
    )
    notes: list[str] = []
    attn = make_attn(torch, device, notes)
    rng = np.random.default_rng(args.seed)
    dev_name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu"
    )
    print(
        f"recall model: {cfg.n_params() / 1e6:.2f}M parameters ({cfg.n_params() * 2 / 2**20:.1f} MiB bf16), "
        f"vocab {cfg.vocab_size}, device {device} ({dev_name}), amp {amp}, torch {torch.__version__}",
        flush=True,
    )
    print(
        f"schedule: {args.steps} steps x {args.tokens_per_step} tokens, length {args.min_len}->{args.max_len} "
        f"(advance at EM {args.advance_em}, floor ramp {args.ramp_start:.2f}-{args.ramp_end:.2f}), wall cap {args.max_seconds:.0f} s; est. {step_flops(cfg, args.tokens_per_step // args.max_len, args.max_len, int(args.tokens_per_step * 0.15)) / 1e12:.1f} "
        f"TFLOP per step at full length",
        flush=True,
    )

    def to_dev(x: Any) -> Any:
        t = torch.from_numpy(x)
        if device.type == "cuda":
            return t.pin_memory().to(device, non_blocking=True)
        return t.to(device)

    history: list[dict[str, Any]] = []
    acc = {
        "loss": torch.zeros((), device=device),
        "tok": torch.zeros((), device=device),
        "em": torch.zeros((), device=device),
        "em_far": torch.zeros((), device=device),
        "n_q": 0,
        "n_far": 0,
        "flops": 0.0,
        "tokens": 0,
        "steps": 0,
        "lens": [],
    }
    far_mask_sum = torch.zeros((), device=device)
    t_start = time.time()
    t_log = t_start
    step = 0
    progress = 0.0
    bound = "steps"
    cur_len = args.min_len
    adv = {"em": torch.zeros((), device=device), "n": 0}
    advances: list[dict[str, Any]] = []
    while True:
        elapsed = time.time() - t_start
        p_steps = step / args.steps
        p_time = elapsed / args.max_seconds if args.max_seconds > 0 else 0.0
        progress = max(p_steps, p_time)
        if progress >= 1.0:
            bound = "steps" if p_steps >= p_time else "time"
            break
        L = seq_len_at(progress, cur_len, args, rng)
        B = max(1, args.tokens_per_step // L)
        batch = task.make_training_batch(layout, B, L, rng, args.query_prob, args.far_frac)
        if len(batch.sup_index) == 0:  # a very short batch without a complete query: draw again
            continue
        tokens = to_dev(batch.tokens)
        sup_idx = to_dev(batch.sup_index)
        sup_tgt = to_dev(batch.sup_target)
        far = to_dev(batch.sup_distance >= L // 2)
        lr = lr_at(step, progress, args)
        for g in opt.param_groups:
            g["lr"] = lr * g["lr_mult"]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp == "bf16"):
            h = model.hidden(tokens, attn=attn)
            hs = h.reshape(-1, cfg.hidden_size).index_select(0, sup_idx)
            logits = model.logits(hs).float()
        loss = F.cross_entropy(logits, sup_tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        with torch.no_grad():
            right = (logits.argmax(-1) == sup_tgt).float()
            both = right.view(-1, 2).amin(-1)
            acc["loss"] += loss.detach()
            acc["tok"] += right.mean()
            acc["em"] += both.sum()
            acc["em_far"] += (both * far).sum()
            far_mask_sum += far.sum()
            adv["em"] += both.sum()
        adv["n"] += int(len(batch.sup_distance))
        acc["n_q"] += int(len(batch.sup_distance))
        acc["flops"] += step_flops(cfg, B, L, len(batch.sup_index))
        acc["tokens"] += B * L
        acc["steps"] += 1
        acc["lens"].append(L)
        step += 1
        if step % args.advance_every == 0:
            em_window = float(adv["em"]) / max(1, adv["n"])  # syncs
            if em_window >= args.advance_em and cur_len < args.max_len and cur_len <= L:
                cur_len = min(args.max_len, cur_len * 2)
                advances.append(
                    {"step": step, "exact_match": round(em_window, 4), "new_len": cur_len}
                )
                print(
                    f"step {step}: exact match {em_window:.3f} >= {args.advance_em}: length -> {cur_len}",
                    flush=True,
                )
            adv["em"].zero_()
            adv["n"] = 0
        if step % args.log_every == 0 or step == 1:
            loss_v = float(acc["loss"]) / acc["steps"]  # syncs
            now = time.time()
            dt = now - t_log
            rec = {
                "step": step,
                "progress": round(progress, 4),
                "elapsed_s": round(now - t_start, 1),
                "seq_len": [min(acc["lens"]), max(acc["lens"])],
                "batch": B,
                "lr": lr,
                "loss": loss_v,
                "token_acc": float(acc["tok"]) / acc["steps"],
                "exact_match": float(acc["em"]) / max(1, acc["n_q"]),
                "exact_match_far": float(acc["em_far"]) / max(1.0, float(far_mask_sum)),
                "tokens_per_s": acc["tokens"] / dt,
                "tflops": acc["flops"] / dt / 1e12,
            }
            history.append(rec)
            print(
                f"step {step:5d} {rec['elapsed_s']:6.1f}s p={progress:.3f} L={rec['seq_len'][0]}-{rec['seq_len'][1]} "
                f"B={B} lr={lr:.2e} loss {loss_v:.4f} tok {rec['token_acc']:.3f} EM {rec['exact_match']:.3f} "
                f"far {rec['exact_match_far']:.3f} | {rec['tokens_per_s'] / 1e3:.1f}K tok/s {rec['tflops']:.2f} TFLOP/s",
                flush=True,
            )
            for k in ("loss", "tok", "em", "em_far"):
                acc[k].zero_()
            far_mask_sum.zero_()
            acc.update(n_q=0, flops=0.0, tokens=0, steps=0, lens=[])
            t_log = now
    train_s = time.time() - t_start
    print(f"training stopped at step {step} after {train_s:.1f} s (bound: {bound})", flush=True)
    return {
        "model": model,
        "cfg": cfg,
        "layout": layout,
        "device": device,
        "device_name": dev_name,
        "history": history,
        "advances": advances,
        "steps_done": step,
        "train_seconds": train_s,
        "bound": bound,
        "notes": notes,
        "amp": amp,
    }


# ----------------------------------------------------------------------------------------------
# evaluation and export


def evaluate_dense(
    model: Any, layout: Any, args: argparse.Namespace, device: Any
) -> dict[str, Any]:
    """Greedy 2-token answers of the bf16 weights (pure bf16, dense SDPA) on the needle prompts."""
    import torch

    attn = make_attn(torch, device, [])
    model_bf16 = model.to(torch.bfloat16).eval()
    results: dict[str, Any] = {"lengths": {}, "protocol": {}}
    t0 = time.time()
    for L in args.eval_lengths:
        if args.max_positions < L:
            print(f"skip eval at {L}: beyond max_position_embeddings {args.max_positions}")
            continue
        prompts = task.make_needle_prompts(
            layout, L, task.DEPTHS, args.eval_per_depth, args.eval_seed
        )
        bs = max(1, min(len(prompts), args.eval_tokens // L))
        gen = rmodel.greedy_generate_dense(
            model_bf16, [p.token_ids for p in prompts], 2, batch_size=bs, device=device, attn=attn
        )
        sc = task.score(prompts, gen)
        results["lengths"][str(L)] = {
            "hits_by_depth": {f"{d:.1f}": sc["table"][L][d] for d in task.DEPTHS},
            "n_per_depth": args.eval_per_depth,
            "recall": sc["recall"][L],
            "misses": sc["misses"][:10],
        }
    results["protocol"] = {
        "depths": list(task.DEPTHS),
        "n_per_depth": args.eval_per_depth,
        "seed": args.eval_seed,
        "kv": "dense bf16 (no cache): torch SDPA on the bf16 weights",
        "generation": "greedy, 2 tokens, exact match on both",
    }
    results["seconds"] = round(time.time() - t0, 1)
    return results


def table_text(ev: dict[str, Any]) -> str:
    """Compact recall table: one row per length, hits per depth, then the recall."""
    depths = [f"{d:.1f}" for d in task.DEPTHS]
    lines = ["len    " + " ".join(f"{d:>3}" for d in depths) + "   recall"]
    for L, r in ev["lengths"].items():
        cells = " ".join(f"{r['hits_by_depth'][d]:>3}" for d in depths)
        lines.append(
            f"{L:<6} {cells}   {100 * r['recall']:5.1f}%  (of {r['n_per_depth']} per depth)"
        )
    return "\n".join(lines)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_tokenizer(out: Path, layout: Any, max_len: int) -> None:
    """WordLevel tokenizer over the layout's tokens, whitespace-split; specials marked special."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    toks = layout.tokens()
    tok = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(toks)}, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    specials = list(task.SPECIAL_TOKENS) + [t for t in toks if t.startswith("<|reserved_")]
    tok.add_special_tokens(specials)
    if tok.get_vocab_size() != layout.vocab_size:
        raise RuntimeError(
            f"tokenizer has {tok.get_vocab_size()} entries, layout {layout.vocab_size}"
        )
    tok.save(str(out / "tokenizer.json"))
    smap = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|pad|>"}
    (out / "special_tokens_map.json").write_text(json.dumps(smap, indent=2) + "\n")
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                **smap,
                "unk_token": None,
                "model_max_length": max_len,
                "clean_up_tokenization_spaces": False,
                "add_bos_token": False,
                "add_eos_token": False,
            },
            indent=2,
        )
        + "\n"
    )
    check = task.VocabLayout.from_tokenizer_json(out / "tokenizer.json")
    if check != layout:
        raise RuntimeError(f"tokenizer.json reads back as {check}, wrote {layout}")


def command_line(argv: list[str]) -> str:
    return "python scripts/train_recall_model.py " + " ".join(shlex.quote(a) for a in argv)


CARD = """\
# recall-model: a tiny Qwen3 that retrieves exact tokens from a long context

**What it is.** A {params_m:.2f}M-parameter `Qwen3ForCausalLM` ({layers} layers, hidden {hidden},
{heads} query heads and {kv_heads} KV heads of head_dim {head_dim}, SiLU MLP {intermediate}, RoPE theta
{rope_theta:g}, max_position_embeddings {max_pos}, tied embeddings, bf16 safetensors) trained from
scratch by `scripts/train_recall_model.py` on one synthetic task: associative recall. vLLM and
transformers load this folder natively (architecture `Qwen3ForCausalLM`, offline). It exists to test
KV-cache dtypes (bf16, fp8, NVFP4) on a model whose answers depend on attending exactly to one
position thousands of tokens back: a quantised cache that blurs the key or the value shows up as a miss.

**What it is not.** Not a language model: the vocabulary is {vocab} word-level tokens (`<|endoftext|>`
= bos/eos, `<|pad|>`, `<q>`, keys `k0000`-`k{kmax}`, values `v0000`-`v{vmax}`, reserved padding); any
other text is out of vocabulary. Its outputs outside the task format are meaningless. It is not a
benchmark of model quality and says nothing about NVFP4 on real models beyond this retrieval pattern.

## Task (`nvfp4compat/recall/task.py`)
- Context: `<|endoftext|>`, 0-2 filler values, then triples `key v1 v2`: keys distinct and `v1` distinct
  while the context holds at most {n_keys} triples (beyond, drawn with replacement, but the needle's key
  and `v1` never repeat); `v2` uniform. `v1` is retrieved by matching the key, `v2` by matching `v1`.
- Query: `<q> key`; answer `v1 v2`, greedy; a hit needs both tokens (chance: 1 in {chance}).
- Needle depth d in {{0.0, 0.1, ..., 0.9}}: the needle is triple `round(d * (n_triples - 1))`, so a fraction
  ~d of the context precedes it; the prompt is exactly `context_len` tokens including `<q> key`.
- Training: query blocks `<q> key v1 v2` interleaved with the triples (probability {query_prob} per block),
  each for a key stored earlier (uniform, or with probability {far_frac} biased to the oldest); the loss is
  on the answer tokens only.

## Training
- Command: `{command}`
- Seed {seed}; {steps_done} steps of {tokens_per_step} tokens ({bound} bound, {train_s:.0f} s) on
  {device_name}, torch {torch_version}, amp {amp}; AdamW (fused on CUDA) lr {lr:g}, betas (0.9, 0.95),
  weight decay {wd:g} on matrices, cosine to 10%, warm-up {warmup} steps, grad clip {clip:g}.
- Sequence length from {min_len}, doubled when the training exact match reached {advance_em}
  (advances: {advances}), floor ramp to {max_len} between {ramp_start:.0%} and {ramp_end:.0%} of
  training; at {max_len}: {max_len} / {half} / {quarter} (50/30/20%). qk-norm weights initialised to
  {qk_init:g}, RMSNorm weights at {norm_mult:g}x the learning rate.
- Last logged training step: loss {last_loss:.4f}, answer-token accuracy {last_tok:.3f}, exact match
  {last_em:.3f} (far half of the sequence: {last_far:.3f}).

## Measured recall (dense bf16, greedy, exact match; {n_per_depth} needles per depth, eval seed {eval_seed})
```
{table}
```
Lengths beyond {max_len} were not trained: a drop there is extrapolation failing, not the cache.

## Files (sha256)
{shas}
"""


def write_card(
    out: Path,
    args: argparse.Namespace,
    res: dict[str, Any],
    ev: dict[str, Any],
    shas: dict[str, str],
) -> None:
    import torch

    cfg, layout = res["cfg"], res["layout"]
    last = res["history"][-1] if res["history"] else {}
    text = CARD.format(
        params_m=cfg.n_params() / 1e6,
        layers=cfg.num_hidden_layers,
        hidden=cfg.hidden_size,
        heads=cfg.num_attention_heads,
        kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        intermediate=cfg.intermediate_size,
        rope_theta=cfg.rope_theta,
        max_pos=cfg.max_position_embeddings,
        vocab=cfg.vocab_size,
        kmax=f"{layout.n_keys - 1:04d}",
        vmax=f"{layout.n_values - 1:04d}",
        n_keys=layout.n_keys,
        chance=layout.n_values**2,
        query_prob=args.query_prob,
        far_frac=args.far_frac,
        command=command_line(args.argv),
        seed=args.seed,
        steps_done=res["steps_done"],
        tokens_per_step=args.tokens_per_step,
        bound=res["bound"],
        train_s=res["train_seconds"],
        device_name=res["device_name"],
        torch_version=torch.__version__,
        amp=res["amp"],
        lr=args.lr,
        wd=args.weight_decay,
        warmup=args.warmup,
        clip=args.clip,
        min_len=args.min_len,
        max_len=args.max_len,
        advance_em=args.advance_em,
        advances=", ".join(f"step {a['step']} -> {a['new_len']}" for a in res["advances"])
        or "none",
        ramp_start=args.ramp_start,
        ramp_end=args.ramp_end,
        qk_init=args.qk_norm_init,
        norm_mult=args.norm_lr_mult,
        half=args.max_len // 2,
        quarter=args.max_len // 4,
        last_loss=last.get("loss", float("nan")),
        last_tok=last.get("token_acc", float("nan")),
        last_em=last.get("exact_match", float("nan")),
        last_far=last.get("exact_match_far", float("nan")),
        n_per_depth=args.eval_per_depth,
        eval_seed=args.eval_seed,
        table=table_text(ev),
        shas="\n".join(f"- `{f}`: `{h}`" for f, h in shas.items()),
    )
    (out / "README.md").write_text(text)


def export(args: argparse.Namespace, res: dict[str, Any], ev: dict[str, Any]) -> dict[str, str]:
    import torch
    from safetensors.torch import save_file

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    cfg, layout, model = res["cfg"], res["layout"], res["model"]
    (out / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps(
            {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 1, "do_sample": False}, indent=2
        )
        + "\n"
    )
    state = {
        k: v.detach().to(torch.bfloat16).cpu().contiguous() for k, v in model.state_dict().items()
    }
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer(out, layout, cfg.max_position_embeddings)
    shas = {f: sha256(out / f) for f in MODEL_FILES}
    log = {
        "command": command_line(args.argv),
        "args": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "argv"
        },
        "layout": layout.to_dict(),
        "model_config": cfg.to_dict(),
        "n_params": cfg.n_params(),
        "device": res["device_name"],
        "torch": torch.__version__,
        "steps_done": res["steps_done"],
        "train_seconds": res["train_seconds"],
        "bound": res["bound"],
        "notes": res["notes"],
        "history": res["history"],
        "length_advances": res["advances"],
        "eval_dense_bf16": ev,
        "sha256": shas,
    }
    (out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    write_card(out, args, res, ev, shas)
    return shas


def check_hf(folder: Path) -> float:
    """Compare :class:`RecallLM` with ``transformers.Qwen3ForCausalLM`` on ``folder`` (float32).

    Loads both from the same safetensors, runs a needle prompt through each, prints and returns the
    max abs logit difference; also checks the tokenizer round trip through ``AutoTokenizer``.
    """
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    import transformers
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    layout = task.VocabLayout.from_tokenizer_json(folder / "tokenizer.json")
    ours = rmodel.load_model(folder, dtype=torch.float32)
    hf = Qwen3ForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    p = task.make_needle_prompts(layout, 384, [0.3], 1, seed=7)[0]
    ids = torch.tensor([p.token_ids])
    with torch.no_grad():
        a = ours(ids)
        b = hf(ids).logits
    diff = float((a - b).abs().max())
    scale = float(b.abs().max())
    tok = AutoTokenizer.from_pretrained(str(folder))
    text = tok.decode(p.token_ids)
    back = tok(text, add_special_tokens=False).input_ids
    print(
        f"transformers {transformers.__version__} {type(hf).__name__}: logits {tuple(b.shape)}, "
        f"max |ours - hf| = {diff:.3e} (max |logit| {scale:.2f}); argmax equal: "
        f"{bool((a.argmax(-1) == b.argmax(-1)).all())}; tokenizer round trip: {back == p.token_ids} "
        f"(len {len(tok)})"
    )
    if back != p.token_ids:
        raise RuntimeError("tokenizer round trip changed the ids")
    return diff


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="output model folder")
    ap.add_argument(
        "--check-hf", type=Path, metavar="DIR", help="only compare DIR's model with transformers"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--init-from", type=Path, default=None, help="start from this model folder's weights"
    )
    ap.add_argument("--device", default=None, help="cuda / cpu (default: cuda when available)")
    ap.add_argument(
        "--amp",
        choices=["auto", "bf16", "off"],
        default="auto",
        help="bf16 autocast (default: on for CUDA, off for CPU)",
    )
    ap.add_argument(
        "--max-seconds", type=float, default=240.0, help="wall cap on training (0: none)"
    )
    ap.add_argument("--steps", type=int, default=1800, help="step budget (the schedule's length)")
    ap.add_argument("--tokens-per-step", type=int, default=131072)
    ap.add_argument("--min-len", type=int, default=256)
    ap.add_argument("--max-len", type=int, default=8192)
    ap.add_argument(
        "--ramp-start", type=float, default=0.25, help="length floor leaves --min-len here"
    )
    ap.add_argument(
        "--ramp-end", type=float, default=0.7, help="length floor reaches --max-len here"
    )
    ap.add_argument(
        "--advance-em",
        type=float,
        default=0.8,
        help="double the length when the training exact match of a window reaches this",
    )
    ap.add_argument("--advance-every", type=int, default=25, help="window (steps) of that check")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--qk-norm-init", type=float, default=2.0, help="initial q_norm/k_norm weight")
    ap.add_argument(
        "--norm-lr-mult", type=float, default=5.0, help="lr multiplier of RMSNorm weights"
    )
    ap.add_argument("--query-prob", type=float, default=0.3)
    ap.add_argument("--far-frac", type=float, default=0.5)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--n-keys", type=int, default=4096)
    ap.add_argument("--n-values", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--rope-theta", type=float, default=1_000_000.0)
    ap.add_argument("--max-positions", type=int, default=32768)
    ap.add_argument("--eval-lengths", default="2048,4096,8192,16384")
    ap.add_argument("--eval-per-depth", type=int, default=5)
    ap.add_argument("--eval-seed", type=int, default=1234)
    ap.add_argument("--eval-tokens", type=int, default=131072, help="tokens per eval forward batch")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.check_hf is None and args.out is None:
        ap.error("--out is required (or --check-hf DIR)")
    args.eval_lengths = [int(x) for x in str(args.eval_lengths).split(",") if x]
    if not 8 <= args.min_len <= args.max_len:
        ap.error(f"need 8 <= --min-len ({args.min_len}) <= --max-len ({args.max_len})")
    if not 0.0 <= args.ramp_start < args.ramp_end <= 1.0:
        ap.error(f"need 0 <= --ramp-start ({args.ramp_start}) < --ramp-end ({args.ramp_end}) <= 1")
    if args.tokens_per_step < args.max_len:
        ap.error(f"--tokens-per-step {args.tokens_per_step} must be >= --max-len {args.max_len}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.check_hf is not None:
        check_hf(args.check_hf)
        return 0
    res = train(args)
    ev = evaluate_dense(res["model"], res["layout"], args, res["device"])
    shas = export(args, res, ev)
    print(
        f"wrote {args.out} ({(args.out / 'model.safetensors').stat().st_size / 2**20:.1f} MiB weights); "
        f"eval {ev['seconds']} s"
    )
    print(f"model.safetensors sha256 {shas['model.safetensors']}")
    print("dense bf16 recall (hits per depth):")
    print(table_text(ev))
    return 0


if __name__ == "__main__":
    sys.exit(main())
