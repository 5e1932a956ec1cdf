"""Float32 torch reference for paged attention over an NVFP4 KV cache, and test-cache builders.

The oracle every attention implementation (``decode``/``prefill``, Triton and FlashInfer) is tested
against. Semantics are those of ``docs/architecture.md``:

* ``query [num_tokens, num_qo_heads, head_dim]``; query head ``h`` reads KV head
  ``h // (num_qo_heads // num_kv_heads)`` (GQA).
* request ``b`` owns query rows ``[qsl[b], qsl[b+1])``, placed at the last ``q_len_b`` positions of its
  ``seq_lens[b]`` keys: row ``i`` of the request sits at position ``seq_len - q_len + i``.
* logits ``s = (q . k) * sm_scale`` with ``k = e2m1 * sf * k_scale`` (the dequantized cache); soft-cap
  ``s = cap * tanh(s / cap)``; causal: key ``j`` visible from position ``p`` iff ``j <= p``; sliding
  window ``W``: iff additionally ``j > p - W`` (with ``causal=False`` only the lower bound applies, as in
  FlashInfer's ``window_left = W - 1``); sinks ``[num_qo_heads]`` add ``exp(sink)`` to the softmax
  denominator and contribute no value.
* ``out = softmax(s) @ v`` with ``v = e2m1 * sf * v_scale``; ``lse = log(sum(exp(s)) + exp(sink))``
  (natural log).
* hostile metadata, as the Triton kernels define it (issue 16): ``query_start_loc`` entries are
  clamped to ``[0, num_tokens]``; if the clamped entries decrease, every row is 0 with LSE ``-inf``;
  rows outside ``[qsl[0], qsl[-1])`` are 0 with LSE ``-inf``; ``seq_lens`` are clamped to
  ``[0, max_pages * page_size]``; keys whose block-table entry is outside ``[0, num_pages)`` are
  invisible (as if masked).

Everything runs in float32 on the tensors' device, one request at a time (small test shapes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from nvfp4compat.kernels import reference as codec
from nvfp4compat.kernels.layout import normalize_cache, nvfp4_full_dim, split_combined_page

__all__ = [
    "CACHE_LAYOUTS",
    "attention_reference",
    "paged_attention_reference",
    "decode_query_start_loc",
    "PagedCase",
    "make_paged_cache",
    "relative_l2",
]

# How a test cache is stored: a (k, v) tuple per layout, a stacked 5-D tensor, or vLLM's combined page.
CACHE_LAYOUTS = ("NHD", "HND", "NHD-stacked", "HND-stacked", "combined-NHD", "combined-HND")


def relative_l2(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected||_2 / ||expected||_2`` in float64 (NaN if ``actual`` has non-finite values)."""
    a = actual.double()
    e = expected.double()
    if not torch.isfinite(a).all():
        return float("nan")
    return float((a - e).norm() / e.norm().clamp_min(1e-300))


def decode_query_start_loc(batch: int, q_len_per_req: int, device: torch.device | str) -> torch.Tensor:
    """``query_start_loc`` (int32 ``[batch+1]``) of a decode batch with ``q_len_per_req`` rows each."""
    return torch.arange(batch + 1, dtype=torch.int32, device=device) * q_len_per_req


def attention_reference(
    query: torch.Tensor,
    keys: Sequence[torch.Tensor],
    values: Sequence[torch.Tensor],
    query_start_loc: torch.Tensor,
    *,
    sm_scale: float,
    causal: bool = True,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
    key_valid: Sequence[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 attention over per-request dense K/V.

    Parameters
    ----------
    query : torch.Tensor
        ``[num_tokens, num_qo_heads, head_dim]``, any float dtype (computed in float32).
    keys, values : sequence of torch.Tensor
        One float32 ``[seq_len_b, num_kv_heads, head_dim]`` tensor per request (global scales applied).
    query_start_loc : torch.Tensor
        int ``[batch + 1]``; request ``b`` owns rows ``[qsl[b], qsl[b+1])``.
    sm_scale : float
        Softmax scale applied to ``q . k``.
    causal, sliding_window, logits_soft_cap, sinks
        As in the module docstring; ``sinks`` is float32 ``[num_qo_heads]``.
    key_valid : sequence of torch.Tensor, optional
        One bool ``[seq_len_b]`` per request: keys marked False are invisible to every query.

    Returns
    -------
    (out, lse) : tuple of torch.Tensor
        float32 ``[num_tokens, num_qo_heads, head_dim]`` and float32 ``[num_tokens, num_qo_heads]``.
    """
    num_tokens, hq, head_dim = query.shape
    qsl = [min(max(int(x), 0), num_tokens) for x in query_start_loc.tolist()]
    out = torch.zeros(num_tokens, hq, head_dim, dtype=torch.float32, device=query.device)
    lse = torch.full((num_tokens, hq), float("-inf"), dtype=torch.float32, device=query.device)
    if any(b < a for a, b in zip(qsl, qsl[1:], strict=False)):
        return out, lse  # decreasing entries: no request runs
    for b in range(len(qsl) - 1):
        q0, q1 = qsl[b], qsl[b + 1]
        if q1 <= q0:
            continue
        k, v = keys[b].float(), values[b].float()
        if key_valid is not None:  # an invisible key contributes nothing, even a NaN value
            v = torch.where(key_valid[b].to(v.device)[:, None, None], v, 0.0)
        seq_len, hkv, _ = k.shape
        group = hq // hkv
        q = query[q0:q1].float()  # [q_len, hq, d]
        q_len = q1 - q0
        kh = k.repeat_interleave(group, dim=1)  # [L, hq, d]
        vh = v.repeat_interleave(group, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, kh) * sm_scale  # [hq, q_len, L]
        if logits_soft_cap is not None:
            s = logits_soft_cap * torch.tanh(s / logits_soft_cap)
        pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]  # [q_len, 1]
        kpos = torch.arange(seq_len, device=q.device)[None, :]
        visible = torch.ones(q_len, seq_len, dtype=torch.bool, device=q.device)
        if causal:
            visible &= kpos <= pos
        if sliding_window is not None:
            visible &= kpos > pos - sliding_window
        if key_valid is not None:
            visible &= key_valid[b].to(q.device)[None, :]
        s = s.masked_fill(~visible[None], float("-inf"))
        if sinks is not None:
            sink = sinks.float().to(q.device)[:, None, None].expand(hq, q_len, 1)
            s_all = torch.cat([s, sink], dim=-1)
        else:
            s_all = s
        row_lse = torch.logsumexp(s_all, dim=-1)  # [hq, q_len]
        p = torch.exp(s - row_lse[..., None])
        p = torch.nan_to_num(p, nan=0.0)
        o = torch.einsum("hqk,khd->qhd", p, vh)
        out[q0:q1] = o
        lse[q0:q1] = row_lse.transpose(0, 1)
    return out, lse


def paged_attention_reference(
    query: torch.Tensor,
    paged_kv_cache: torch.Tensor | Sequence[torch.Tensor],
    kv_cache_sf: torch.Tensor | Sequence[torch.Tensor],
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    k_scale: float | torch.Tensor,
    v_scale: float | torch.Tensor,
    *,
    sm_scale: float,
    kv_layout: str = "NHD",
    causal: bool = True,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 reference of ``prefill`` (and of ``decode`` with :func:`decode_query_start_loc`).

    The cache is dequantized with the torch codec (:func:`nvfp4compat.kernels.reference.gather_dequantized`,
    ``e2m1 * sf * scale`` in float32) and attended with :func:`attention_reference`. Arguments as in
    ``docs/architecture.md``; returns float32 ``(out [num_tokens, num_qo_heads, head_dim],
    lse [num_tokens, num_qo_heads])``.
    """
    views = normalize_cache(paged_kv_cache, kv_cache_sf, kv_layout)
    max_kv = block_table.shape[1] * views.page_size
    keys, values, valid = [], [], []
    for b in range(block_table.shape[0]):
        n = min(max(int(seq_lens[b]), 0), max_kv)
        row = block_table[b]
        ok = (row >= 0) & (row < views.num_pages)
        k, v = codec.gather_dequantized(
            paged_kv_cache, kv_cache_sf, torch.where(ok, row, 0), n, k_scale, v_scale, kv_layout
        )
        keys.append(k)
        values.append(v)
        valid.append(ok[torch.arange(n, device=row.device) // views.page_size])
    return attention_reference(
        query,
        keys,
        values,
        query_start_loc,
        sm_scale=sm_scale,
        causal=causal,
        sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap,
        sinks=sinks,
        key_valid=valid,
    )


@dataclass
class PagedCase:
    """A random NVFP4 paged cache with its metadata, as the attention ops take it.

    ``paged_kv_cache``/``kv_cache_sf`` are in the structure ``layout`` names (tuple, stacked 5-D or
    vLLM combined-page views); ``kv_layout`` is the ``"NHD"``/``"HND"`` argument to pass with them.
    ``keys``/``values`` are the bf16/fp16 inputs that were quantized, per request
    ``[seq_len_b, num_kv_heads, head_dim]``. ``combined`` holds the raw vLLM page tensor when
    ``layout`` is a combined page.
    """

    paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor]
    kv_cache_sf: torch.Tensor | tuple[torch.Tensor, torch.Tensor]
    kv_layout: str
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    k_scale: float | torch.Tensor
    v_scale: float | torch.Tensor
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    num_pages: int
    page_size: int
    combined: torch.Tensor | None = None

    def slot_mapping(self) -> torch.Tensor:
        """The cache slot (``page * page_size + offset``, int64) of every key, request after request:
        the ``slot_mapping`` that writes ``torch.cat(keys)`` into these pages."""
        slots = []
        for b, k in enumerate(self.keys):
            pos = torch.arange(k.shape[0], device=self.block_table.device)
            slots.append(self.block_table[b].long()[pos // self.page_size] * self.page_size + pos % self.page_size)
        return torch.cat(slots)


def _alloc_cache(
    layout: str, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int, device: torch.device
) -> tuple[Any, Any, str, torch.Tensor | None]:
    """Zeroed cache tensors in the structure ``layout`` names: ``(data, sf, kv_layout, combined)``."""
    d2, d16 = head_dim // 2, head_dim // 16
    if layout.startswith("combined"):
        hnd = layout.endswith("HND")
        full = nvfp4_full_dim(head_dim)
        if hnd:
            page = torch.zeros(num_pages, 2 * num_kv_heads, page_size, full, dtype=torch.uint8, device=device)
        else:
            page = torch.zeros(
                num_pages, page_size, 2 * num_kv_heads, full, dtype=torch.uint8, device=device
            ).transpose(1, 2)
        views, scales, kv_layout = split_combined_page(page, num_kv_heads)
        return views, scales, kv_layout, page
    kv_layout = layout.split("-")[0]
    dims = (page_size, num_kv_heads) if kv_layout == "NHD" else (num_kv_heads, page_size)
    if layout.endswith("stacked"):
        stacked = torch.zeros(num_pages, 2, *dims, d2, dtype=torch.uint8, device=device)
        stacked_sf = torch.zeros(num_pages, 2, *dims, d16, dtype=torch.uint8, device=device)
        return stacked, stacked_sf.view(torch.float8_e4m3fn), kv_layout, None
    data = tuple(torch.zeros(num_pages, *dims, d2, dtype=torch.uint8, device=device) for _ in range(2))
    sf = tuple(
        torch.zeros(num_pages, *dims, d16, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
        for _ in range(2)
    )
    return data, sf, kv_layout, None


def make_paged_cache(
    seq_lens: Sequence[int],
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    *,
    layout: str = "NHD",
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
    scale_as_tensor: bool = False,
    extra_pages: int = 3,
    outlier_channels: int = 4,
    keys: Sequence[torch.Tensor] | None = None,
    values: Sequence[torch.Tensor] | None = None,
) -> PagedCase:
    """Build a random NVFP4 paged cache written with the reference codec.

    Pages are assigned to requests in a random order (plus ``extra_pages`` unused pages), block-table
    entries past a request's pages are filled with random valid page ids (they must never be read).
    K gets ``outlier_channels`` channels scaled by 8 (as real keys have). The global scales are
    ``amax / (6 * 448)`` of K and V (FlashInfer's natural choice).

    Parameters
    ----------
    seq_lens : sequence of int
        KV length of each request.
    num_kv_heads, head_dim, page_size : int
        Cache geometry.
    layout : str
        One of :data:`CACHE_LAYOUTS`.
    dtype : torch.dtype
        dtype of the random K/V rows before quantization (fp16/bf16).
    device : torch.device or str
        Where everything is allocated (the codec runs there).
    generator : torch.Generator, optional
        CPU generator for reproducible data (data is drawn on the CPU, then moved).
    scale_as_tensor : bool
        Return ``k_scale``/``v_scale`` as one-element float32 tensors on ``device``.
    keys, values : sequence of torch.Tensor, optional
        Use these rows (``[seq_len_b, num_kv_heads, head_dim]``) instead of random ones.

    Returns
    -------
    PagedCase
    """
    device = torch.device(device)
    batch = len(seq_lens)
    pages_per_req = [max(1, math.ceil(n / page_size)) for n in seq_lens]
    num_pages = sum(pages_per_req) + extra_pages
    max_pages = max(pages_per_req)
    perm = torch.randperm(num_pages, generator=generator)
    if keys is None or values is None:
        keys, values = [], []
        for n in seq_lens:
            k = torch.randn(n, num_kv_heads, head_dim, generator=generator)
            if outlier_channels:
                k[..., :outlier_channels] *= 8.0
            keys.append(k.to(dtype))
            values.append(torch.randn(n, num_kv_heads, head_dim, generator=generator).to(dtype))
    keys = [k.to(device) for k in keys]
    values = [v.to(device) for v in values]
    k_amax = max(float(k.float().abs().max()) for k in keys if k.numel()) if any(k.numel() for k in keys) else 1.0
    v_amax = max(float(v.float().abs().max()) for v in values if v.numel()) if any(v.numel() for v in values) else 1.0
    k_scale_f = max(k_amax, 1e-6) / (6 * 448)
    v_scale_f = max(v_amax, 1e-6) / (6 * 448)
    block_table = torch.randint(0, num_pages, (batch, max_pages), generator=generator, dtype=torch.int32)
    cursor = 0
    slots = []
    for b, n in enumerate(seq_lens):
        pages = perm[cursor : cursor + pages_per_req[b]]
        cursor += pages_per_req[b]
        block_table[b, : pages_per_req[b]] = pages.to(torch.int32)
        pos = torch.arange(n)
        slots.append(pages[pos // page_size].long() * page_size + pos % page_size)
    data, sf, kv_layout, combined = _alloc_cache(layout, num_pages, page_size, num_kv_heads, head_dim, device)
    if any(n for n in seq_lens):
        codec.append_slot_mapping(
            torch.cat(list(keys)),
            torch.cat(list(values)),
            torch.cat(slots).to(device),
            data,
            sf,
            k_scale_f,
            v_scale_f,
            kv_layout,
        )
    if scale_as_tensor:
        k_scale: float | torch.Tensor = torch.tensor([k_scale_f], dtype=torch.float32, device=device)
        v_scale: float | torch.Tensor = torch.tensor([v_scale_f], dtype=torch.float32, device=device)
    else:
        k_scale, v_scale = k_scale_f, v_scale_f
    return PagedCase(
        paged_kv_cache=data,
        kv_cache_sf=sf,
        kv_layout=kv_layout,
        block_table=block_table.to(device),
        seq_lens=torch.tensor(list(seq_lens), dtype=torch.int32, device=device),
        k_scale=k_scale,
        v_scale=v_scale,
        keys=list(keys),
        values=list(values),
        num_pages=num_pages,
        page_size=page_size,
        combined=combined,
    )
