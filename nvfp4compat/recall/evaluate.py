"""Needle recall of the shipped recall model, in torch, dense or through the project's paged kernels.

KV modes (``KV_MODES``):

- ``bf16``: the reference. Dense causal SDPA on the bf16 weights, no cache (greedy by full forwards).
- ``nvfp4``: every layer writes its K/V with ``get_kernel("write", impl)`` into a paged NVFP4 cache
  (NHD or HND, pages assigned in a seeded random order), the prompt runs through
  ``get_kernel("prefill", impl)`` and each further answer token through ``get_kernel("decode", impl)``,
  as vLLM's attention backend does (write first, then read the cache, the new tokens included).
  ``impl`` is ``triton`` (also on the CPU under ``TRITON_INTERPRET=1``) or ``flashinfer`` (CUDA).
- ``nvfp4-fake``: the same cache semantics without kernels: K/V rows go through the reference codec
  (:func:`nvfp4compat.kernels.reference.quantize_rows`, then ``dequantize_rows``), attention is dense
  SDPA on the decoded rows. Fast on the CPU; what the paged path should reproduce.
- ``fp8-fake``: K/V rounded to float8_e4m3fn after division by the global scale (vLLM's fp8 cache
  with per-tensor scales), dense SDPA on the decoded rows.

Global scales: ``k_scale = v_scale = 1.0`` by default, which is what vLLM's attention layers hold
(``layer._k_scale`` / ``_v_scale``, ``set_default_quant_scales``) for a checkpoint without KV scales,
and what the nvfp4compat plugin passes to the writer and readers (``vllm_plugin/backend.py``). The
NVFP4 block scale is then ``e4m3(amax / 6)``; each run reports how many 16-element blocks got a
subnormal (``amax < 6 * 2**-6``) or zero (``amax < 6 * 2**-10``) block scale, or saturated (``> 2688``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nvfp4compat.recall import task
from nvfp4compat.recall.model import (
    AttnFn,
    RecallLM,
    greedy_generate_dense,
    load_model,
    sdpa_attention,
)

__all__ = [
    "KV_MODES",
    "BlockScaleStats",
    "PagedNvfp4Cache",
    "evaluate_recall",
    "format_results",
    "load_recall_model",
    "recall_gap",
]

KV_MODES = ("bf16", "nvfp4", "nvfp4-fake", "fp8-fake")
E4M3_MIN_NORMAL = 2.0**-6
E4M3_MIN_SUBNORMAL_HALF = 2.0**-10  # amax/(6*gs) below this encodes to a zero block scale


@dataclass
class BlockScaleStats:
    """Counts of NVFP4 16-element blocks by block-scale regime (K and V separately)."""

    blocks: dict[str, int] = field(default_factory=lambda: {"k": 0, "v": 0})
    subnormal: dict[str, int] = field(default_factory=lambda: {"k": 0, "v": 0})
    zero: dict[str, int] = field(default_factory=lambda: {"k": 0, "v": 0})
    saturated: dict[str, int] = field(default_factory=lambda: {"k": 0, "v": 0})

    def add(self, side: str, rows: torch.Tensor, gs: float) -> None:
        """``rows [..., head_dim]``: the K or V rows written with global scale ``gs``."""
        s = rows.float().unflatten(-1, (rows.shape[-1] // 16, 16)).abs().amax(-1) / (6.0 * gs)
        nz = s > 0
        self.blocks[side] += s.numel()
        self.subnormal[side] += int((nz & (s < E4M3_MIN_NORMAL)).sum())
        self.zero[side] += int((nz & (s < E4M3_MIN_SUBNORMAL_HALF)).sum())
        self.saturated[side] += int((s > 448.0).sum())

    def summary(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for side in ("k", "v"):
            n = max(1, self.blocks[side])
            out[side] = {
                "blocks": self.blocks[side],
                "subnormal_frac": self.subnormal[side] / n,
                "zero_frac": self.zero[side] / n,
                "saturated_frac": self.saturated[side] / n,
            }
        return out


class PagedNvfp4Cache:
    """A paged NVFP4 KV cache for every layer of one batch of requests, and the attention hook.

    Per layer: ``k_data``/``v_data`` uint8 NHD ``[num_pages, page_size, num_kv_heads, head_dim/2]``
    (HND ``[num_pages, num_kv_heads, page_size, head_dim/2]``) and ``k_sf``/``v_sf`` float8_e4m3fn with
    last dim ``head_dim/16``. ``block_table [batch, pages_per_req]`` int32 holds a seeded permutation of
    the pages, so requests' pages interleave. The instance is an :data:`AttnFn`: for ``T`` new tokens
    per request at ``positions [T]`` it writes their K/V (slot ``block_table[b, p // page_size] *
    page_size + p % page_size``), then runs ``prefill`` (``T > 1``; queries are the last ``T`` of
    ``positions[-1] + 1`` keys) or ``decode`` (``T == 1``) over the cache.
    """

    def __init__(
        self,
        *,
        num_layers: int,
        batch: int,
        max_len: int,
        num_kv_heads: int,
        head_dim: int,
        device: torch.device,
        impl: str = "triton",
        page_size: int = 16,
        kv_layout: str = "NHD",
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        nvfp4_4over6: bool = False,
        seed: int = 0,
        stats: BlockScaleStats | None = None,
        kv_rotation: str | None = None,
    ) -> None:
        from nvfp4compat.kernels import get_kernel

        if kv_layout not in ("NHD", "HND"):
            raise ValueError(f"kv_layout must be 'NHD' or 'HND', got {kv_layout!r}")
        self.write = get_kernel("write", impl)
        self.prefill = get_kernel("prefill", impl)
        self.decode = get_kernel("decode", impl)
        if kv_rotation is not None:  # a Hadamard-rotated cache (nvfp4compat.kernels.rotation)
            from nvfp4compat.kernels.rotation import rotated

            self.write = rotated("write", self.write, kv_rotation)
            self.prefill = rotated("prefill", self.prefill, kv_rotation)
            self.decode = rotated("decode", self.decode, kv_rotation)
        self.impl, self.page_size, self.kv_layout = impl, page_size, kv_layout
        self.k_scale, self.v_scale, self.nvfp4_4over6 = float(k_scale), float(v_scale), nvfp4_4over6
        self.sm_scale = head_dim**-0.5
        self.stats = stats
        pages_per_req = -(-max_len // page_size)
        num_pages = batch * pages_per_req
        gen = torch.Generator().manual_seed(seed)
        perm = torch.randperm(num_pages, generator=gen).to(torch.int32)
        self.block_table = perm.view(batch, pages_per_req).to(device)
        dims = (page_size, num_kv_heads) if kv_layout == "NHD" else (num_kv_heads, page_size)

        def zeros(last: int) -> torch.Tensor:
            return torch.zeros(num_pages, *dims, last, dtype=torch.uint8, device=device)

        self.data = [(zeros(head_dim // 2), zeros(head_dim // 2)) for _ in range(num_layers)]
        self.sf = [
            (
                zeros(head_dim // 16).view(torch.float8_e4m3fn),
                zeros(head_dim // 16).view(torch.float8_e4m3fn),
            )
            for _ in range(num_layers)
        ]
        self.batch, self.max_len, self.device = batch, max_len, device

    @classmethod
    def for_model(
        cls, model: RecallLM, *, batch: int, max_len: int, device: torch.device, **kw: Any
    ) -> PagedNvfp4Cache:
        """A cache with ``model``'s layers, KV heads and head_dim; ``kw`` as for the constructor."""
        cfg = model.cfg
        return cls(
            num_layers=cfg.num_hidden_layers,
            batch=batch,
            max_len=max_len,
            num_kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
            device=device,
            **kw,
        )

    def slots(self, positions: torch.Tensor) -> torch.Tensor:
        """Slot of each (request, position), request-major: int64 ``[batch * T]``."""
        pos = positions.to(self.device, torch.int64)
        pages = self.block_table[:, pos // self.page_size].to(torch.int64)  # [B, T]
        return (pages * self.page_size + pos % self.page_size).reshape(-1)

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        B, T, Hq, D = q.shape
        if int(positions[-1]) >= self.max_len:
            raise ValueError(
                f"position {int(positions[-1])} is beyond the cache's {self.max_len} tokens"
            )
        key = k.reshape(B * T, k.shape[2], D).contiguous()
        value = v.reshape(B * T, v.shape[2], D).contiguous()
        if self.stats is not None and layer >= 0:
            self.stats.add("k", key, self.k_scale)
            self.stats.add("v", value, self.v_scale)
        self.write(
            key,
            value,
            self.slots(positions),
            self.data[layer],
            self.sf[layer],
            self.k_scale,
            self.v_scale,
            self.kv_layout,
            nvfp4_4over6=self.nvfp4_4over6,
        )
        seq_len = int(positions[-1]) + 1
        seq_lens = torch.full((B,), seq_len, dtype=torch.int32, device=self.device)
        query = q.reshape(B * T, Hq, D).contiguous()
        if T == 1:
            out = self.decode(
                query,
                self.data[layer],
                self.sf[layer],
                self.block_table,
                seq_lens,
                self.k_scale,
                self.v_scale,
                sm_scale=self.sm_scale,
                kv_layout=self.kv_layout,
            )
        else:
            qsl = torch.arange(0, B * T + 1, T, dtype=torch.int32, device=self.device)
            out = self.prefill(
                query,
                self.data[layer],
                self.sf[layer],
                self.block_table,
                seq_lens,
                qsl,
                self.k_scale,
                self.v_scale,
                sm_scale=self.sm_scale,
                kv_layout=self.kv_layout,
            )
        return out.view(B, T, Hq, D)


def _fake_quant_attn(
    mode: str, k_scale: float, v_scale: float, stats: BlockScaleStats | None
) -> AttnFn:
    """Dense SDPA on K/V decoded from an NVFP4 (reference codec) or FP8 E4M3 cache."""
    from nvfp4compat.kernels import reference

    def nvfp4(x: torch.Tensor, gs: float) -> torch.Tensor:
        packed, sf = reference.quantize_rows(x, gs)
        return reference.dequantize_rows(packed, sf, gs).to(x.dtype)

    def fp8(x: torch.Tensor, gs: float) -> torch.Tensor:
        return ((x.float() / gs).clamp(-448, 448).to(torch.float8_e4m3fn).float() * gs).to(x.dtype)

    fq = nvfp4 if mode == "nvfp4-fake" else fp8

    def attn(
        layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        if stats is not None and mode == "nvfp4-fake":
            stats.add("k", k, k_scale)
            stats.add("v", v, v_scale)
        return sdpa_attention(layer, q, fq(k, k_scale), fq(v, v_scale), positions)

    return attn


@torch.no_grad()
def _generate_paged(
    model: RecallLM,
    prompts: Sequence[Sequence[int]],
    n_new: int,
    batch_size: int,
    cache_kw: dict[str, Any],
    device: torch.device,
) -> list[list[int]]:
    """Greedy generation through :class:`PagedNvfp4Cache`: one prefill, then ``n_new - 1`` decodes."""
    out: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        group = [list(p) for p in prompts[start : start + batch_size]]
        L = len(group[0])
        if any(len(p) != L for p in group):
            raise ValueError("a batch of prompts must share one length")
        cache = PagedNvfp4Cache.for_model(
            model, batch=len(group), max_len=L + n_new - 1, device=device, seed=start, **cache_kw
        )
        ids = torch.tensor(group, dtype=torch.long, device=device)
        h = model.hidden(ids, torch.arange(L, device=device), attn=cache)[:, -1]
        tok = model.logits(h).float().argmax(-1)
        gen = [tok]
        for step in range(1, n_new):
            pos = torch.tensor([L + step - 1], device=device)
            h = model.hidden(tok[:, None], pos, attn=cache)[:, -1]
            tok = model.logits(h).float().argmax(-1)
            gen.append(tok)
        out.extend(torch.stack(gen, 1).tolist())
    return out


def load_recall_model(
    folder: str | Path,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.bfloat16,
) -> tuple[RecallLM, task.VocabLayout]:
    """The model (``dtype``, eval mode, on ``device``; default CUDA when available) and its layout."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = load_model(folder, device=device, dtype=dtype)
    layout = task.VocabLayout.from_tokenizer_json(Path(folder) / "tokenizer.json")
    if layout.vocab_size != model.cfg.vocab_size:
        raise ValueError(
            f"{folder}: tokenizer.json has {layout.vocab_size} ids, config.json vocab_size "
            f"{model.cfg.vocab_size}"
        )
    return model, layout


def evaluate_recall(
    model: RecallLM | str | Path,
    lengths: Sequence[int],
    kv_modes: Sequence[str] = ("bf16", "nvfp4"),
    *,
    impl: str = "triton",
    depths: Sequence[float] = task.DEPTHS,
    n_per_depth: int = 1,
    seed: int = 0,
    device: str | torch.device | None = None,
    layout: task.VocabLayout | None = None,
    page_size: int = 16,
    kv_layout: str = "NHD",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    nvfp4_4over6: bool = False,
    max_batch_tokens: int = 65536,
    progress: Callable[[str], None] | None = None,
    kv_rotation: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Exact-match needle recall per KV mode.

    Parameters
    ----------
    model : RecallLM or path
        A loaded model (with ``layout``) or the shipped folder (``config.json``, ``model.safetensors``,
        ``tokenizer.json``), loaded in bf16 on ``device``.
    lengths : sequence of int
        Prompt lengths in tokens (each prompt is exactly that long, the query included).
    kv_modes : sequence of str
        Any of :data:`KV_MODES`.
    impl : {"triton", "flashinfer"}
        Kernels of the ``nvfp4`` mode.
    depths, n_per_depth, seed
        Passed to :func:`nvfp4compat.recall.task.make_needle_prompts`.
    page_size, kv_layout, k_scale, v_scale, nvfp4_4over6
        Cache geometry, global scales and writer option of the ``nvfp4`` modes.
    max_batch_tokens : int
        Prompts per batch = ``max(1, max_batch_tokens // length)``.
    progress : callable, optional
        Called with one line per (mode, length) as it finishes: recall so far and elapsed time.
    kv_rotation : {"hadamard"} or None
        The ``nvfp4`` mode writes and reads a Hadamard-rotated cache (``NVFP4COMPAT_KV_ROTATION``).

    Returns
    -------
    dict
        ``{mode: {"table": {len: {depth: hits}}, "counts": ..., "recall": {len: fraction},
        "overall": fraction, "misses": [...], "seconds": float, "block_scales": {...} (nvfp4 modes),
        "config": {...}}}``.
    """
    unknown = [m for m in kv_modes if m not in KV_MODES]
    if unknown:
        raise ValueError(f"unknown KV mode(s) {unknown}; known: {list(KV_MODES)}")
    if isinstance(model, (str, Path)):
        model, layout = load_recall_model(model, device)
    if layout is None:
        raise ValueError("pass layout= with a loaded model (or pass the model folder)")
    dev = next(model.parameters()).device
    if "nvfp4" in kv_modes and impl == "triton" and dev.type == "cpu":
        from nvfp4compat.kernels.checks import interpreting

        if not interpreting():
            raise RuntimeError(
                "the nvfp4 mode with impl 'triton' on the CPU needs Triton's interpreter: set "
                "TRITON_INTERPRET=1 before triton is imported (or run on a CUDA device)"
            )
    results: dict[str, dict[str, Any]] = {}
    for mode in kv_modes:
        t0 = time.time()
        stats = BlockScaleStats() if mode.startswith("nvfp4") else None
        all_prompts: list[task.NeedlePrompt] = []
        generated: list[list[int]] = []
        for L in lengths:
            prompts = task.make_needle_prompts(layout, L, depths, n_per_depth, seed)
            bs = max(1, max_batch_tokens // L)
            ids = [p.token_ids for p in prompts]
            if mode == "bf16":
                gen = greedy_generate_dense(model, ids, 2, batch_size=bs, device=dev)
            elif mode == "nvfp4":
                kw = {
                    "impl": impl,
                    "page_size": page_size,
                    "kv_layout": kv_layout,
                    "k_scale": k_scale,
                    "v_scale": v_scale,
                    "nvfp4_4over6": nvfp4_4over6,
                    "stats": stats,
                    "kv_rotation": kv_rotation,
                }
                gen = _generate_paged(model, ids, 2, bs, kw, dev)
            else:
                attn = _fake_quant_attn(mode, k_scale, v_scale, stats)
                gen = greedy_generate_dense(model, ids, 2, batch_size=bs, device=dev, attn=attn)
            all_prompts += prompts
            generated += gen
            if progress is not None:
                hits = task.score(prompts, gen)
                progress(f"{mode}: {L} tokens, {len(prompts)} prompts: recall {hits['recall'][L]:.0%} "
                         f"({time.time() - t0:.1f} s so far)")
        res = task.score(all_prompts, generated)
        res["seconds"] = round(time.time() - t0, 2)
        res["config"] = {
            "mode": mode,
            "impl": impl if mode == "nvfp4" else None,
            "page_size": page_size if mode == "nvfp4" else None,
            "kv_layout": kv_layout if mode == "nvfp4" else None,
            "k_scale": k_scale if mode != "bf16" else None,
            "v_scale": v_scale if mode != "bf16" else None,
            "nvfp4_4over6": nvfp4_4over6 if mode == "nvfp4" else None,
            "kv_rotation": kv_rotation if mode == "nvfp4" else None,
            "n_per_depth": n_per_depth,
            "depths": list(depths),
            "seed": seed,
            "device": str(dev),
        }
        if stats is not None:
            res["block_scales"] = stats.summary()
        results[mode] = res
    return results


def recall_gap(
    results: dict[str, dict[str, Any]], mode: str, ref: str = "bf16"
) -> dict[int, float]:
    """``{length: (recall[ref] - recall[mode]) * 100}`` in points (positive: ``mode`` is worse).

    Rounded to 1e-9 points: recall is a ratio of hit counts, so one miss in 100 is exactly 1.0 point
    and must compare equal to a 1-point limit (unrounded, 100 * (1.0 - 0.99) is 1.0000000000000009).
    """
    a, b = results[ref]["recall"], results[mode]["recall"]
    return {L: round(100.0 * (a[L] - b[L]), 9) for L in a}


def format_results(results: dict[str, dict[str, Any]]) -> str:
    """A text table: one row per (mode, length), hits per depth, recall, and the gap to bf16."""
    lines: list[str] = []
    for mode, res in results.items():
        depths = sorted({d for t in res["table"].values() for d in t})
        lines.append(
            f"{mode}"
            + (
                f" (impl {res['config']['impl']}, {res['config']['kv_layout']}, page {res['config']['page_size']}"
                + (", 4over6" if res["config"].get("nvfp4_4over6") else "")
                + (f", {res['config']['kv_rotation']}-rotated" if res["config"].get("kv_rotation") else "")
                + ")"
                if res["config"]["impl"]
                else ""
            )
            + f"  [{res['seconds']:.1f} s]"
        )
        lines.append("  len    " + " ".join(f"{d:>4.1f}" for d in depths) + "   recall  mode-bf16")
        for L in sorted(res["table"]):
            cells = " ".join(
                f"{res['table'][L].get(d, 0):>2}/{res['counts'][L].get(d, 0):<1}" for d in depths
            )
            gap = ""
            if mode != "bf16" and "bf16" in results and L in results["bf16"]["recall"]:
                gap = f"{100 * (res['recall'][L] - results['bf16']['recall'][L]) + 0.0:+6.1f} pt"
            lines.append(f"  {L:<6} {cells}   {100 * res['recall'][L]:5.1f}%  {gap}")
        if "block_scales" in res:
            bs = res["block_scales"]
            lines.append(
                "  block scales: "
                + ", ".join(
                    f"{s.upper()} subnormal {100 * bs[s]['subnormal_frac']:.2f}% zero {100 * bs[s]['zero_frac']:.2f}% "
                    f"saturated {100 * bs[s]['saturated_frac']:.2f}%"
                    for s in ("k", "v")
                )
            )
    return "\n".join(lines)
