#!/usr/bin/env python3
"""Make a tiny Qwen3-architecture model, deterministically from a seed, with no model hub.

Writes a Hugging Face model folder that vLLM and transformers load offline:

- ``config.json``: ``Qwen3ForCausalLM``, by default 4 layers, hidden 1024, 8 query heads and 2 KV
  heads of head_dim 128 (GQA 4), intermediate 3072, RoPE theta 1e6, 32768 positions, tied embeddings;
- ``model.safetensors``: bf16 weights drawn from ``numpy.random.default_rng(seed)``: every matrix
  ~ N(0, 0.02**2) (so the logits have a spread of about 0.6 and are not degenerate), every RMSNorm
  weight 1;
- ``tokenizer.json``: a byte-level BPE trained with ``tokenizers`` on a built-in corpus (English
  sentences plus seeded ``key = value`` lines and digit runs), padded with reserved special tokens
  to exactly ``--vocab`` entries, with ``tokenizer_config.json`` and ``special_tokens_map.json``;
- ``generation_config.json`` and ``tiny_model.json`` (what this is, the range of ordinary token ids,
  sha256 of every file).

The weights are random: the model knows nothing. Issue 6 only compares KV-cache dtypes on it; issue 7
trains one (the same config and tokenizer code, other weights).

Usage::

    python scripts/make_tiny_model.py --out tiny-qwen3 [--seed 0] [--layers 4] [--vocab 4096]
    python scripts/make_tiny_model.py --out tiny-qwen3 --check   # + load with transformers offline

Needs numpy, torch, safetensors and tokenizers (``--check`` also transformers); runs on CPU in ~10 s.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")
MIN_RESERVED = 64  # reserved special tokens kept free for later work (e.g. issue 7's markers)
INIT_STD = 0.02

SENTENCES = (
    "The cache keeps every key and value that attention has already computed.",
    "A page holds sixteen tokens, and a block table lists the pages of each request.",
    "Four bits per element with one scale per sixteen elements makes the cache about three and a half times smaller.",
    "The writer quantizes each new key and value as soon as the layer produces them.",
    "The reader dequantizes the pages it needs and computes attention in higher precision.",
    "When the scale is too small the large values saturate; when it is too large the small values vanish.",
    "Greedy decoding picks the most likely next token at every step.",
    "Teacher forcing feeds the true previous token instead of the model's own guess.",
    "A tiny model is enough to prove that the engine starts, writes and reads its cache.",
    "Numbers such as 17, 256, 4096 and 65536 appear often in systems work.",
    "She read the report twice, then wrote down the three numbers that mattered.",
    "The river was wide and slow, and the boats moved along it without a sound.",
    "Every morning the baker opened the shop at six and sold the first loaves warm.",
    "The committee met on Tuesday, argued for an hour, and agreed to meet again.",
    "Light travels faster than sound, which is why thunder follows the flash.",
    "He packed a map, a torch, two apples and a notebook for the long walk.",
    "The quick brown fox jumps over the lazy dog.",
    "Key seventeen maps to value forty two, and key nine maps to value three.",
    "Retrieval means finding the exact value that was stored next to a key long ago.",
    "If the model attends to the right position, it can copy the value it finds there.",
)
WORDS = (
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
    "red",
    "green",
    "blue",
    "amber",
    "river",
    "stone",
    "cloud",
    "maple",
    "cedar",
    "harbor",
    "signal",
    "vector",
    "matrix",
    "kernel",
)


def corpus(seed: int) -> list[str]:
    """The built-in training text: fixed sentences, seeded key/value lines and digit runs."""
    import numpy as np

    rng = np.random.default_rng(seed + 1)
    lines = list(SENTENCES) * 20
    for _ in range(3000):
        k = f"{WORDS[rng.integers(len(WORDS))]}{int(rng.integers(0, 1000))}"
        v = f"{WORDS[rng.integers(len(WORDS))]}{int(rng.integers(0, 1000))}"
        lines.append(f"key {k} = value {v};")
    for _ in range(1000):
        lines.append(" ".join(str(int(x)) for x in rng.integers(0, 100000, size=8)))
    return lines


def build_tokenizer(vocab: int, seed: int) -> tuple[Any, int]:
    """Train the byte-level BPE and pad it with reserved specials to exactly ``vocab`` entries.

    Returns
    -------
    (tokenizer, n_trained): ids ``[len(SPECIAL_TOKENS), n_trained)`` are ordinary tokens.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab - MIN_RESERVED,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    n_trained = tok.get_vocab_size()
    reserved = [f"<|reserved_{i}|>" for i in range(vocab - n_trained)]
    tok.add_special_tokens(reserved)
    if tok.get_vocab_size() != vocab:
        raise RuntimeError(
            f"tokenizer has {tok.get_vocab_size()} entries after padding, wanted {vocab}"
        )
    for i, s in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(s) != i:
            raise RuntimeError(f"special token {s} has id {tok.token_to_id(s)}, expected {i}")
    return tok, n_trained


def qwen3_config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": args.vocab,
        "hidden_size": args.hidden,
        "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": args.max_positions,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": args.rope_theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "layer_types": ["full_attention"] * args.layers,
        "max_window_layers": args.layers,
        "use_sliding_window": False,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "initializer_range": INIT_STD,
        "use_cache": True,
        "dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 3,
    }


def make_weights(cfg: dict[str, Any], seed: int) -> dict[str, Any]:
    """Qwen3ForCausalLM state dict (bf16), names as transformers and vLLM expect.

    Shapes: embed ``[V, H]``; per layer q ``[nH*D, H]``, k/v ``[nKV*D, H]``, o ``[H, nH*D]``,
    q_norm/k_norm ``[D]``, gate/up ``[I, H]``, down ``[H, I]``, two RMSNorms ``[H]``; final norm ``[H]``.
    The LM head is the embedding (tied).
    """
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    hid, vocab, inter, hd = (
        cfg["hidden_size"],
        cfg["vocab_size"],
        cfg["intermediate_size"],
        cfg["head_dim"],
    )
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def normal(*shape: int) -> Any:
        return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32) * INIT_STD).to(
            torch.bfloat16
        )

    def ones(n: int) -> Any:
        return torch.ones(n, dtype=torch.bfloat16)

    w: dict[str, Any] = {"model.embed_tokens.weight": normal(vocab, hid)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = ones(hid)
        w[p + "self_attn.q_proj.weight"] = normal(nh * hd, hid)
        w[p + "self_attn.k_proj.weight"] = normal(nkv * hd, hid)
        w[p + "self_attn.v_proj.weight"] = normal(nkv * hd, hid)
        w[p + "self_attn.o_proj.weight"] = normal(hid, nh * hd)
        w[p + "self_attn.q_norm.weight"] = ones(hd)
        w[p + "self_attn.k_norm.weight"] = ones(hd)
        w[p + "post_attention_layernorm.weight"] = ones(hid)
        w[p + "mlp.gate_proj.weight"] = normal(inter, hid)
        w[p + "mlp.up_proj.weight"] = normal(inter, hid)
        w[p + "mlp.down_proj.weight"] = normal(hid, inter)
    w["model.norm.weight"] = ones(hid)
    return w


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_model(args: argparse.Namespace) -> dict[str, Any]:
    from safetensors.torch import save_file

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    cfg = qwen3_config(args)
    tok, n_trained = build_tokenizer(args.vocab, args.seed)
    tok.save(str(out / "tokenizer.json"))
    specials = {
        "bos_token": SPECIAL_TOKENS[0],
        "eos_token": SPECIAL_TOKENS[0],
        "pad_token": SPECIAL_TOKENS[3],
    }
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                **specials,
                "unk_token": None,
                "model_max_length": args.max_positions,
                "clean_up_tokenization_spaces": False,
                "add_bos_token": False,
                "add_eos_token": False,
                "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
            },
            indent=2,
        )
        + "\n"
    )
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps(
            {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 3, "do_sample": False}, indent=2
        )
        + "\n"
    )
    weights = make_weights(cfg, args.seed)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    params = sum(int(t.numel()) for t in weights.values())
    files = [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ]
    card = {
        "what": "tiny Qwen3-architecture model with RANDOM weights (seeded); it knows nothing. For engine/KV-cache tests only.",
        "made_by": "scripts/make_tiny_model.py",
        "seed": args.seed,
        "init": f"every matrix ~ N(0, {INIT_STD}^2) (numpy default_rng(seed), bf16); RMSNorm weights 1; LM head tied to the embedding",
        "parameters": params,
        "regular_token_range": [len(SPECIAL_TOKENS), n_trained],
        "special_tokens": list(SPECIAL_TOKENS),
        "reserved_tokens": args.vocab - n_trained,
        "config": {
            k: cfg[k]
            for k in (
                "num_hidden_layers",
                "hidden_size",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "intermediate_size",
                "vocab_size",
                "max_position_embeddings",
            )
        },
        "sha256": {f: sha256(out / f) for f in files},
    }
    (out / "tiny_model.json").write_text(json.dumps(card, indent=2) + "\n")
    print(
        f"wrote {out}: {params / 1e6:.1f}M parameters, vocab {args.vocab} ({n_trained} trained), {time.time() - t0:.1f} s"
    )
    print(json.dumps(card["sha256"], indent=1))
    return card


def check_model(out: Path, card: dict[str, Any]) -> None:
    """Load the folder with transformers offline; the logits must be finite and not degenerate."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.bfloat16)
    model.eval()
    text = "The quick brown fox jumps over the lazy dog. key alpha17 = value bravo3;"
    ids = tok(text, return_tensors="pt").input_ids
    back = tok.decode(ids[0])
    if back != text:
        raise RuntimeError(f"tokenizer round trip changed the text: {back!r}")
    with torch.no_grad():
        logits = model(ids).logits.float()
    if not torch.isfinite(logits).all():
        raise RuntimeError("non-finite logits")
    std = float(logits.std())
    probs = torch.softmax(logits[0, -1], -1)
    entropy = float(-(probs * probs.clamp_min(1e-30).log()).sum())
    top = torch.topk(logits[0, -1], 2).values
    print(
        f"transformers {__import__('transformers').__version__}: {type(model).__name__}, {len(ids[0])} tokens, "
        f"logits {tuple(logits.shape)} finite, std {std:.3f}, last-position entropy {entropy:.3f} nats "
        f"(uniform {float(torch.log(torch.tensor(float(logits.shape[-1])))):.3f}), top-2 gap {float(top[0] - top[1]):.3f}"
    )
    if not (0.1 < std < 20):
        raise RuntimeError(f"logit std {std} is degenerate")
    if type(model).__name__ != "Qwen3ForCausalLM":
        raise RuntimeError(f"loaded as {type(model).__name__}")
    if (
        tok.convert_tokens_to_ids(SPECIAL_TOKENS[0]) != 0
        or len(tok) != card["config"]["vocab_size"]
    ):
        raise RuntimeError(
            f"tokenizer mismatch: len {len(tok)}, eos id {tok.convert_tokens_to_ids(SPECIAL_TOKENS[0])}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=3072)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--max-positions", type=int, default=32768)
    ap.add_argument("--rope-theta", type=float, default=1_000_000.0)
    ap.add_argument(
        "--check",
        action="store_true",
        help="load the result with transformers offline and check the logits",
    )
    args = ap.parse_args(argv)
    if args.heads % args.kv_heads:
        ap.error(f"--heads {args.heads} must be a multiple of --kv-heads {args.kv_heads}")
    card = write_model(args)
    if args.check:
        check_model(args.out, card)
    return 0


if __name__ == "__main__":
    sys.exit(main())
