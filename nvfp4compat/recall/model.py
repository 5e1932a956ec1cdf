"""A Qwen3ForCausalLM in plain torch, with a pluggable attention core.

Parameter names and shapes are exactly Hugging Face Qwen3's, so a ``state_dict`` saved from
:class:`RecallLM` loads into ``transformers.Qwen3ForCausalLM`` and into vLLM's Qwen3 (tied
embeddings: no ``lm_head.weight``; ``attention_bias`` false). The forward matches HF Qwen3: per-head
RMSNorm on q and k before RoPE, neox ``rotate_half`` RoPE with cos/sin computed in float32, RMSNorm in
float32 (``weight * normed.to(input_dtype)``), SiLU-gated MLP, ``scale = head_dim ** -0.5``.

The attention core is a callable ``attn(layer, q, k, v, positions) -> out`` so the same weights run
densely (:func:`sdpa_attention`, the bf16 reference) or through a paged KV cache
(:mod:`nvfp4compat.recall.evaluate`). This module imports nothing from ``nvfp4compat``: the trainer
loads it by path on hosts that lack the package's dependencies.

Why not ``transformers.Qwen3ForCausalLM`` with a registered attention function: the trainer and the
CPU tests run this model where transformers is not installed (it is no dependency of ``recall``), so
the model would stay anyway; ``scripts/train_recall_model.py --check-hf`` checks it equals HF's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "AttnFn",
    "ModelConfig",
    "RecallLM",
    "greedy_generate_dense",
    "load_model",
    "read_weights",
    "sdpa_attention",
]

# attn(layer_idx, q [B, T, Hq, D], k [B, T, Hkv, D], v [B, T, Hkv, D], positions [T]) -> [B, T, Hq, D]
AttnFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# one layer's attention at the forward's positions: attend(q, k, v) -> [B, T, Hq, D]
_Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
_Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, sin) of the forward's positions


@dataclass(frozen=True)
class ModelConfig:
    """The subset of a Qwen3 ``config.json`` this model uses."""

    vocab_size: int
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    head_dim: int = 128
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads {self.num_key_value_heads} (GQA)"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    def n_params(self) -> int:
        H, inter, D = self.hidden_size, self.intermediate_size, self.head_dim
        nq, nkv = self.num_attention_heads, self.num_key_value_heads
        per_layer = H * nq * D * 2 + H * nkv * D * 2 + 3 * H * inter + 2 * H + 2 * D
        return self.vocab_size * H + self.num_hidden_layers * per_layer + H

    def to_hf(self, **extra: Any) -> dict[str, Any]:
        """A ``config.json`` that transformers (>= 4.51) and vLLM load as ``Qwen3ForCausalLM``.

        Both the transformers 5 ``rope_parameters`` and the older top-level ``rope_theta`` are
        written, so every vLLM 0.25-0.33 / transformers 4.5x-5.x reader finds the theta.
        """
        n = self.num_hidden_layers
        cfg: dict[str, Any] = {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": n,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "attention_bias": False,
            "attention_dropout": 0.0,
            "layer_types": ["full_attention"] * n,
            "max_window_layers": n,
            "use_sliding_window": False,
            "sliding_window": None,
            "tie_word_embeddings": True,
            "initializer_range": 0.02,
            "use_cache": True,
            "dtype": "bfloat16",
            "torch_dtype": "bfloat16",
            "bos_token_id": 0,
            "eos_token_id": 0,
            "pad_token_id": 1,
        }
        cfg.update(extra)
        return cfg

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        """Read a Qwen3 ``config.json`` dict; refuses what this model does not implement."""
        arch = cfg.get("architectures", ["?"])
        if arch != ["Qwen3ForCausalLM"]:
            raise ValueError(
                f"config.json architectures is {arch}; this loader reads Qwen3ForCausalLM"
            )
        if not cfg.get("tie_word_embeddings", False) or cfg.get("attention_bias", False):
            raise ValueError(
                "this loader needs tie_word_embeddings=true and attention_bias=false, got "
                f"{cfg.get('tie_word_embeddings')} / {cfg.get('attention_bias')}"
            )
        if cfg.get("use_sliding_window"):
            raise ValueError("sliding-window Qwen3 configs are not implemented here")
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"only default RoPE is implemented, config has {rope}")
        theta = rope.get("rope_theta", cfg.get("rope_theta"))
        if theta is None:
            raise ValueError("config.json has neither rope_parameters.rope_theta nor rope_theta")
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=cfg["num_attention_heads"],
            num_key_value_heads=cfg["num_key_value_heads"],
            head_dim=cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"]),
            rope_theta=float(theta),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            max_position_embeddings=cfg.get("max_position_embeddings", 32768),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RMSNorm(nn.Module):
    """HF Qwen3RMSNorm: ``weight * (x.float() * rsqrt(mean(x**2) + eps)).to(x.dtype)``."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[T, head_dim]`` for ``positions [T]`` (int), computed in float32 as HF does."""
    inv_freq = 1.0 / (
        theta
        ** (
            torch.arange(0, head_dim, 2, dtype=torch.int64).to(
                device=positions.device, dtype=torch.float
            )
            / head_dim
        )
    )
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [B, T, H, D]``, ``cos/sin [T, D]`` -> ``x * cos + rotate_half(x) * sin``."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def sdpa_attention(
    layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """Dense causal attention (the reference): ``F.scaled_dot_product_attention`` with GQA.

    ``q [B, T, Hq, D]``, ``k/v [B, T, Hkv, D]`` -> ``[B, T, Hq, D]``; scale ``D ** -0.5``. The query
    and key positions coincide (a full forward, no cache). q and k are cast to v's dtype (under
    autocast the RMSNorm'd q/k come out float32; SDPA then runs in the autocast dtype).
    """
    dt = v.dtype
    out = F.scaled_dot_product_attention(
        q.to(dt).transpose(1, 2),
        k.to(dt).transpose(1, 2),
        v.transpose(1, 2),
        is_causal=True,
        enable_gqa=True,
    )
    return out.transpose(1, 2)


def _at_layer(attn: AttnFn, layer: int, positions: torch.Tensor) -> _Attend:
    """``attn`` bound to one layer and the forward's positions."""
    return lambda q, k, v: attn(layer, q, k, v, positions)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        H, D = cfg.hidden_size, cfg.head_dim
        self.nq, self.nkv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, D
        self.q_proj = nn.Linear(H, self.nq * D, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * D, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * D, bias=False)
        self.o_proj = nn.Linear(self.nq * D, H, bias=False)
        self.q_norm = RMSNorm(D, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(D, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: _Rope, attend: _Attend) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.nq, self.d))
        k = self.k_norm(self.k_proj(x).view(B, T, self.nkv, self.d))
        v = self.v_proj(x).view(B, T, self.nkv, self.d)
        o = attend(apply_rope(q, *rope), apply_rope(k, *rope), v)
        return self.o_proj(o.reshape(B, T, self.nq * self.d))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: _Rope, attend: _Attend) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, attend)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3Body(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class RecallLM(nn.Module):
    """Qwen3ForCausalLM with tied embeddings; ``state_dict()`` keys are HF's (``model.*``)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Qwen3Body(cfg)

    def init_weights(self, generator: torch.Generator, std: float = 0.02) -> None:
        """Seeded init: matrices ~ N(0, std^2), output projections scaled by ``1/sqrt(2 * layers)``,
        RMSNorm weights 1."""
        out_std = std / math.sqrt(2 * self.cfg.num_hidden_layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.ndim == 1:
                    p.fill_(1.0)
                    continue
                s = out_std if name.endswith(("o_proj.weight", "down_proj.weight")) else std
                p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float32) * s)

    def hidden(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        attn: AttnFn = sdpa_attention,
    ) -> torch.Tensor:
        """Final-norm hidden states ``[B, T, hidden]`` for ``input_ids [B, T]`` (int64).

        ``positions [T]`` int64 (default ``arange(T)``) feed RoPE and are passed to ``attn``.
        """
        T = input_ids.shape[1]
        if positions is None:
            positions = torch.arange(T, device=input_ids.device)
        x = self.model.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        if torch.is_autocast_enabled(x.device.type):
            dt = torch.get_autocast_dtype(x.device.type)
            cos, sin = cos.to(dt), sin.to(dt)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, (cos, sin), _at_layer(attn, i, positions))
        return self.model.norm(x)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Tied LM head: ``h [..., hidden] @ embed_tokens.weight.T -> [..., vocab]``."""
        return F.linear(h, self.model.embed_tokens.weight)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        attn: AttnFn = sdpa_attention,
    ) -> torch.Tensor:
        return self.logits(self.hidden(input_ids, positions, attn))


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file, on the CPU, through the ``safetensors`` package.

    Raises
    ------
    ImportError
        When ``safetensors`` is not installed (names the ``recall`` extra).
    ValueError
        When the file is not a readable safetensors file (truncated, bad header).
    """
    try:
        from safetensors import SafetensorError
        from safetensors.torch import load_file
    except ImportError as exc:
        raise ImportError(
            f"reading {path} needs the safetensors package ({exc}); "
            "pip install 'nvfp4compat[recall]'"
        ) from exc
    try:
        return load_file(str(path), device="cpu")
    except SafetensorError as exc:
        raise ValueError(
            f"{path} is not a readable safetensors file ({exc}); save the model again "
            "(scripts/train_recall_model.py)"
        ) from exc


def load_model(
    folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16
) -> RecallLM:
    """Load ``config.json`` + ``model.safetensors`` from ``folder`` into a :class:`RecallLM`.

    Raises
    ------
    FileNotFoundError
        When either file is missing (names the folder).
    ValueError
        When the checkpoint's tensor names or shapes differ from the config's Qwen3 layout.
    """
    folder = Path(folder)
    for name in ("config.json", "model.safetensors"):
        if not (folder / name).is_file():
            raise FileNotFoundError(
                f"{folder / name} is missing: a recall model folder holds config.json and "
                "model.safetensors (train one with scripts/train_recall_model.py)"
            )
    cfg = ModelConfig.from_hf(json.loads((folder / "config.json").read_text()))
    model = RecallLM(cfg)
    state = read_weights(folder / "model.safetensors")
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items()}
    if want != got:
        missing = sorted(set(want) - set(got))[:5]
        extra = sorted(set(got) - set(want))[:5]
        shapes = [k for k in set(want) & set(got) if want[k] != got[k]][:5]
        raise ValueError(
            f"{folder / 'model.safetensors'} does not match its config.json: missing {missing}, "
            f"unexpected {extra}, shape mismatches {[(k, got[k], want[k]) for k in shapes]}"
        )
    model.load_state_dict(state)
    return model.to(device=device, dtype=dtype).eval()


@torch.no_grad()
def greedy_generate_dense(
    model: RecallLM,
    prompts: Sequence[Sequence[int]],
    n_new: int,
    batch_size: int = 8,
    device: str | torch.device | None = None,
    autocast_dtype: torch.dtype | None = None,
    attn: AttnFn = sdpa_attention,
) -> list[list[int]]:
    """Greedy generation by full dense forwards (no KV cache): the reference generator.

    Prompts of equal length are batched (``batch_size`` at a time); each of the ``n_new`` steps reruns
    the whole sequence, which costs ``n_new`` prefills: fine for the 2-token answers of the task.
    """
    device = device or next(model.parameters()).device
    out: list[list[int]] = [[] for _ in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    groups: list[list[int]] = []
    for i in order:
        if (
            groups
            and len(prompts[groups[-1][0]]) == len(prompts[i])
            and len(groups[-1]) < batch_size
        ):
            groups[-1].append(i)
        else:
            groups.append([i])
    for g in groups:
        ids = torch.tensor([list(prompts[i]) for i in g], dtype=torch.long, device=device)
        for _ in range(n_new):
            with torch.autocast(
                device_type=torch.device(device).type,
                dtype=autocast_dtype or torch.bfloat16,
                enabled=autocast_dtype is not None,
            ):
                h = model.hidden(ids, attn=attn)[:, -1]
                nxt = model.logits(h).float().argmax(-1)
            ids = torch.cat([ids, nxt[:, None]], dim=1)
            for j, i in enumerate(g):
                out[i].append(int(nxt[j]))
    return out
