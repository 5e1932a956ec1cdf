"""Paged attention over an NVFP4 KV cache through FlashInfer's FA2 wrappers (``kv_cache_sf``).

The ``decode`` and ``prefill`` contracts (:mod:`nvfp4compat.kernels.contract`), served by FlashInfer
0.6.10-0.7.4:

* ``decode`` with one query token per request: ``BatchDecodeWithPagedKVCacheWrapper(
  use_tensor_cores=True)`` (the tensor-core FA2 path; the CUDA-core decode does not build for a uint8
  KV cache), planned with ``kv_data_type=torch.uint8``;
* ``decode`` with ``q_len_per_req > 1`` and ``prefill``: ``BatchPrefillWithPagedKVCacheWrapper(
  backend="fa2")`` (``fa3`` refuses NVFP4), causal with the queries at the end of each sequence.

FlashInfer reads the linear E4M3 block scales from ``kv_cache_sf=(k_sf, v_sf)``, folds ``k_scale``
into the softmax scale and multiplies the output by ``v_scale`` after the kernel. Its LSE is base 2;
it is returned here in natural-log units like every other implementation.

Differences from the Triton implementation, by FlashInfer's design:

* FlashInfer plans on the host: ``seq_lens`` and ``block_table`` are copied to the host on every
  call (a device sync; not CUDA-graph safe). Planned wrappers are cached per (device, shapes,
  features) and re-planned only when the metadata differs from the previous call.
* ``k_scale`` given as a device tensor is read to the host (one more 4-byte copy in a call that
  syncs anyway), because FlashInfer's ``run`` takes it as a host float folded into the softmax scale.
  Folding it into the query instead (``q * k_scale`` rounded to the query dtype) costs one bf16
  rounding of every logit: measured on an H200, LSE errors of 1.2e-2 and 2.8e-2 against the float32
  reference in the all-features tests (the rounding alone reproduces both numbers on the CPU).
* Attention sinks are not applied by the FA2 path (its ``paged_run`` drops ``sinks``): ``sinks``
  raises :class:`NotImplementedError`; use the Triton implementation.
* head_dim 64 through the FA2 *prefill* wrapper (``prefill``, and ``decode`` with
  ``q_len_per_req > 1``) raises :class:`NotImplementedError`: FlashInfer 0.7.2.post1 misread an NVFP4
  cache there on an H200 (relative L2 0.14 and 0.17 against the reference, fp16, HND, page 32, a
  chunked/mixed batch), which is also why vLLM 0.32+ refuses head_size 64 on this path. One-token
  ``decode`` at head_dim 64 (the decode wrapper) measured correct and stays available.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import flashinfer  # noqa: F401  (ImportError here tells get_kernel the implementation is unavailable)
import torch

from nvfp4compat.kernels.checks import check_query_start_loc
from nvfp4compat.kernels.contract import AttentionResult, DecodeArgs, PrefillArgs, implements
from nvfp4compat.kernels.layout import CacheViews, check_scale, normalize_cache

__all__ = ["decode", "prefill", "clear_cache"]

_LN2 = 0.6931471805599453
_WORKSPACE_BYTES = 128 * 1024 * 1024


@dataclass
class _Planned:
    """A FlashInfer wrapper and the page metadata it was last planned with."""

    wrapper: Any
    meta: tuple[Any, ...] | None = None


_lock = threading.Lock()
_workspaces: dict[torch.device, torch.Tensor] = {}
_wrappers: dict[tuple[Any, ...], _Planned] = {}


def clear_cache() -> None:
    """Drop the cached FlashInfer wrappers and workspaces (frees their device memory)."""
    with _lock:
        _wrappers.clear()
        _workspaces.clear()


def _workspace(device: torch.device) -> torch.Tensor:
    ws = _workspaces.get(device)
    if ws is None:
        ws = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        _workspaces[device] = ws
    return ws


def _unsupported(feature: str) -> NotImplementedError:
    return NotImplementedError(
        f"{feature} is not supported by FlashInfer's FA2 NVFP4 path (the 'flashinfer' implementation); "
        "use the bundled Triton kernels: get_kernel(op, 'triton'), or NVFP4COMPAT_IMPL=decode=triton,"
        "prefill=triton for the vLLM plugin"
    )


def _check(name: str, a: DecodeArgs | PrefillArgs, views: CacheViews) -> None:
    query, block_table, seq_lens, sm_scale = a.query, a.block_table, a.seq_lens, a.sm_scale
    sliding_window, logits_soft_cap, out = a.sliding_window, a.logits_soft_cap, a.out
    if a.sinks is not None:
        raise _unsupported("attention sinks")
    device = views.device
    if device.type != "cuda":
        raise ValueError(f"{name}: the flashinfer implementation needs CUDA tensors, the cache is on {device}")
    if not isinstance(query, torch.Tensor) or query.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"{name}: query must be float16 or bfloat16, got {getattr(query, 'dtype', type(query))}")
    if query.dim() != 3 or query.shape[2] != views.head_dim or query.device != device:
        raise ValueError(
            f"{name}: query must be [num_tokens, num_qo_heads, head_dim={views.head_dim}] on {device}, "
            f"got {tuple(query.shape)} on {query.device}"
        )
    if query.shape[1] % views.num_kv_heads:
        raise ValueError(f"{name}: num_qo_heads {query.shape[1]} is not a multiple of num_kv_heads {views.num_kv_heads}")
    for arg, t in (("block_table", block_table), ("seq_lens", seq_lens)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.device != device:
            raise TypeError(f"{name}: {arg} must be an int32 tensor on {device}")
    if block_table.dim() != 2 or seq_lens.shape != (block_table.shape[0],):
        raise ValueError(
            f"{name}: block_table must be [batch, max_pages] and seq_lens [batch], got "
            f"{tuple(block_table.shape)} and {tuple(seq_lens.shape)}"
        )
    check_scale(a.k_scale, "k_scale", device)
    check_scale(a.v_scale, "v_scale", device)
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)) or not math.isfinite(sm_scale):
        raise TypeError(f"{name}: sm_scale must be a finite Python number, got {sm_scale!r}")
    if sliding_window is not None and (isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 1):
        raise ValueError(f"{name}: sliding_window must be a positive int or None, got {sliding_window!r}")
    if logits_soft_cap is not None and not (logits_soft_cap == 0 or (logits_soft_cap > 0 and math.isfinite(logits_soft_cap))):
        raise ValueError(f"{name}: logits_soft_cap must be a positive finite number or None, got {logits_soft_cap!r}")
    if out is not None and (out.shape != query.shape or out.dtype != query.dtype or out.device != device):
        raise ValueError(
            f"{name}: out must be {tuple(query.shape)} {query.dtype} on {device}, got "
            f"{tuple(out.shape)} {out.dtype} on {out.device}"
        )


def _refuse_head_dim_64_prefill(name: str, views: CacheViews) -> None:
    if views.head_dim == 64:
        raise NotImplementedError(
            f"{name}: FlashInfer's FA2 prefill wrapper misreads an NVFP4 KV cache at head_dim 64 (measured "
            "on an H200 with FlashInfer 0.7.2.post1: relative L2 error 0.14-0.17 against the float32 "
            "reference; vLLM 0.32+ refuses head_size 64 on this path for the same reason). Use the bundled "
            "Triton kernels: get_kernel(op, 'triton'), or NVFP4COMPAT_IMPL=decode=triton,prefill=triton for "
            "the vLLM plugin"
        )


def _paged_metadata(
    block_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int
) -> tuple[tuple[Any, ...], torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer's CSR page metadata from a block table: ``(key, indptr, indices, last_page_len)``.

    Syncs: the page counts live in ``seq_lens`` on the device.
    """
    lens = seq_lens.to("cpu", torch.int64)
    pages = (lens + page_size - 1) // page_size
    max_pages = int(pages.max()) if lens.numel() else 0
    if max_pages > block_table.shape[1]:
        raise ValueError(
            f"seq_lens need up to {max_pages} pages but block_table has {block_table.shape[1]} columns"
        )
    table = block_table[:, :max_pages].to("cpu")
    keep = torch.arange(max_pages)[None, :] < pages[:, None]
    indices = table[keep].to(torch.int32)
    indptr = torch.zeros(lens.numel() + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(pages, 0).to(torch.int32)
    last = (lens - (pages - 1).clamp_min(0) * page_size).to(torch.int32)
    key = (tuple(lens.tolist()), hash(indices.numpy().tobytes()))
    device = block_table.device
    return key, indptr.to(device), indices.to(device), last.to(device)


def _host_k_scale(k_scale: float | torch.Tensor) -> float:
    """``k_scale`` as the host float FlashInfer folds into its softmax scale (syncs for a device tensor)."""
    if isinstance(k_scale, torch.Tensor):
        return float(k_scale.reshape(()).item())
    return float(k_scale)


def _run(
    key: tuple[Any, ...],
    meta: Any,
    make: Callable[[torch.Tensor], Any],
    plan: Callable[[Any], None],
    query: torch.Tensor,
    views: CacheViews,
    k_scale: float | torch.Tensor,
    v_scale: float | torch.Tensor,
    user_out: torch.Tensor | None,
    return_lse: bool,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Run the wrapper cached under ``key`` (built by ``make(workspace)``), re-planned with ``plan``
    when its page metadata differs from ``meta``; apply a device ``v_scale``, copy into a strided
    ``out``, return the LSE in natural-log units."""
    with _lock:
        planned = _wrappers.get(key)
        if planned is None:
            planned = _wrappers[key] = _Planned(make(_workspace(query.device)))
        if planned.meta != meta:
            plan(planned.wrapper)
            planned.meta = meta
    fi_out = user_out if user_out is not None and user_out.is_contiguous() else None
    res = planned.wrapper.run(
        query, (views.k_data, views.v_data), k_scale=_host_k_scale(k_scale),
        v_scale=None if isinstance(v_scale, torch.Tensor) else float(v_scale),
        out=fi_out, return_lse=return_lse, kv_cache_sf=(views.k_sf, views.v_sf),
    )
    out, lse = (res[0], res[1]) if return_lse else (res, None)
    if isinstance(v_scale, torch.Tensor):
        out.mul_(v_scale.reshape(()))  # a 0-dim float32 factor keeps out's dtype
    if user_out is not None and user_out is not out:
        user_out.copy_(out)
        out = user_out
    if return_lse:
        assert lse is not None
        return out, lse * _LN2
    return out


@implements(DecodeArgs)
def decode(a: DecodeArgs) -> AttentionResult:
    """The ``decode`` op (:class:`~nvfp4compat.kernels.contract.DecodeArgs`) with FlashInfer's
    tensor-core FA2 decode; ``sinks`` raises :class:`NotImplementedError`. ``q_len_per_req > 1`` runs
    FlashInfer's FA2 prefill wrapper with causal masking (queries at the end of each sequence), and
    so raises :class:`NotImplementedError` at head_dim 64 (see the module docstring).
    """
    views = normalize_cache(a.paged_kv_cache, a.kv_cache_sf, a.kv_layout)
    q_len = a.q_len_per_req
    if isinstance(q_len, int) and q_len > 1:
        _refuse_head_dim_64_prefill("decode (q_len_per_req > 1 runs the FA2 prefill wrapper)", views)
    _check("decode", a, views)
    query, batch = a.query, a.block_table.shape[0]
    if not isinstance(q_len, int) or q_len < 1 or query.shape[0] != batch * q_len:
        raise ValueError(
            f"decode: query has {query.shape[0]} rows, expected batch * q_len_per_req = {batch} * {q_len}"
        )
    if q_len > 1:
        qsl = torch.arange(batch + 1, dtype=torch.int32, device=query.device) * q_len
        return prefill(
            query, a.paged_kv_cache, a.kv_cache_sf, a.block_table, a.seq_lens, qsl, a.k_scale, a.v_scale,
            sm_scale=a.sm_scale, kv_layout=a.kv_layout, causal=True, sliding_window=a.sliding_window,
            logits_soft_cap=a.logits_soft_cap, out=a.out, return_lse=a.return_lse,
        )
    window_left = -1 if a.sliding_window is None else a.sliding_window - 1
    cap = float(a.logits_soft_cap) if a.logits_soft_cap else None
    meta_key, indptr, indices, last = _paged_metadata(a.block_table, a.seq_lens, views.page_size)
    key = ("decode", query.device, a.kv_layout, query.dtype, query.shape[1], views.num_kv_heads,
           views.head_dim, views.page_size, window_left, cap, float(a.sm_scale), batch)
    return _run(
        key, meta_key,
        lambda ws: flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, a.kv_layout, use_tensor_cores=True),
        lambda w: w.plan(
            indptr, indices, last, query.shape[1], views.num_kv_heads, views.head_dim,
            views.page_size, window_left=window_left, logits_soft_cap=cap,
            q_data_type=query.dtype, kv_data_type=torch.uint8, o_data_type=query.dtype,
            sm_scale=float(a.sm_scale),
        ),
        query, views, a.k_scale, a.v_scale, a.out, a.return_lse,
    )  # fmt: skip


@implements(PrefillArgs)
def prefill(a: PrefillArgs) -> AttentionResult:
    """The ``prefill`` op (:class:`~nvfp4compat.kernels.contract.PrefillArgs`) with FlashInfer's FA2
    prefill wrapper; ``sinks`` and head_dim 64 raise :class:`NotImplementedError` (module docstring).
    """
    views = normalize_cache(a.paged_kv_cache, a.kv_cache_sf, a.kv_layout)
    _refuse_head_dim_64_prefill("prefill", views)
    _check("prefill", a, views)
    query, batch, causal = a.query, a.block_table.shape[0], bool(a.causal)
    # (FlashInfer plans on the host: a host query_start_loc serves too)
    qsl = check_query_start_loc("prefill", a.query_start_loc, batch, None)
    window_left = -1 if a.sliding_window is None else a.sliding_window - 1
    cap = float(a.logits_soft_cap) if a.logits_soft_cap else None
    meta_key, indptr, indices, last = _paged_metadata(a.block_table, a.seq_lens, views.page_size)
    qsl_host = tuple(qsl.to("cpu").tolist())
    key = ("prefill", query.device, a.kv_layout, query.dtype, query.shape[1], views.num_kv_heads,
           views.head_dim, views.page_size, window_left, cap, float(a.sm_scale), causal, batch)
    return _run(
        key, (meta_key, qsl_host),
        lambda ws: flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, a.kv_layout, backend="fa2"),
        lambda w: w.plan(
            qsl, indptr, indices, last, query.shape[1], views.num_kv_heads, views.head_dim,
            views.page_size, causal=causal, sm_scale=float(a.sm_scale),
            window_left=window_left, logits_soft_cap=cap, q_data_type=query.dtype,
            kv_data_type=torch.uint8, o_data_type=query.dtype,
        ),
        query, views, a.k_scale, a.v_scale, a.out, a.return_lse,
    )  # fmt: skip
