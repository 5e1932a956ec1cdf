"""The contract of each NVFP4 KV op: its arguments, one dataclass per op, written once.

An op's arguments class (:class:`WriteArgs`, :class:`DequantArgs`, :class:`DecodeArgs`,
:class:`PrefillArgs`) is its signature (the fields: names, order, defaults, keyword-only ones after
``_: KW_ONLY``) and its docstring the op's semantics. Every implementation of an op (``triton``,
``flashinfer``, ``dequant_fa3``, ``dequant_fa2`` and the float32 torch reference) has that signature
and those semantics; an implementation's own docstring says only how it runs and where it departs
(an option it refuses, a host sync). An implementation is either written against the arguments,
``@implements(WriteArgs)`` over ``def append_slot_mapping(a: WriteArgs) -> None``, which gives it
the signature (the FlashInfer, composite and reference ones), or spells the signature out (the
Triton ones, whose host paths avoid building the arguments object). mypy checks every
implementation's parameters against its op's (the ``TYPE_CHECKING`` block at the end), and
``tests/kernels/test_contract.py`` every registered implementation's parameter names, kinds and
defaults.

The cache (all ops): ``paged_kv_cache`` holds uint8 E2M1 codes ``(k_data, v_data)`` (or one stacked
``[num_pages, 2, ...]`` tensor), NHD ``[num_pages, page_size, num_kv_heads, head_dim/2]`` or HND
``[num_pages, num_kv_heads, page_size, head_dim/2]``, even element in the low nibble;
``kv_cache_sf`` has the same structure with float8_e4m3fn (or uint8) block scales, last dim
``head_dim/16``, linear (entry ``j`` scales elements ``[16j, 16j+16)``). A 3-D tensor means page
size 1. Only the last dim must be contiguous, so vLLM's combined page works through the views of
:func:`nvfp4compat.kernels.layout.split_combined_page`. An element decodes as
``x = e2m1 * sf * gs`` with ``gs`` the side's global scale (``k_scale`` or ``v_scale``): a positive
finite number, or a one-element float32 tensor on the cache's device (read on the device).
``kv_layout`` is ``"NHD"`` or ``"HND"``. Bad arguments raise :class:`ValueError` or
:class:`TypeError` naming the argument, what was found and what is needed.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, ParamSpec, TypeAlias, TypeVar

if TYPE_CHECKING:  # annotations only: the contracts import without torch
    from collections.abc import Sequence

    import torch

__all__ = [
    "Cache",
    "CachePair",
    "Scale",
    "AttentionResult",
    "WriteArgs",
    "DequantArgs",
    "DecodeArgs",
    "PrefillArgs",
    "CONTRACTS",
    "implements",
]

Cache: TypeAlias = "torch.Tensor | Sequence[torch.Tensor]"
# the attention ops take the cache as one tensor or a (K, V) pair
CachePair: TypeAlias = "torch.Tensor | tuple[torch.Tensor, torch.Tensor]"
Scale: TypeAlias = "float | torch.Tensor"
AttentionResult: TypeAlias = "torch.Tensor | tuple[torch.Tensor, torch.Tensor]"


@dataclass(slots=True)
class WriteArgs:
    """``write``: quantize K/V rows to NVFP4 and store them in the paged cache by slot (in place).

    FlashInfer's ``nvfp4_quantize_append_paged_kv_cache_with_slot_mapping``, bit for bit: per
    16-element block ``sf = e4m3_sat(amax / (6 * gs))``, ``q = e2m1_rne_sat(x / (sf * gs))``
    (``docs/kernels.md``, "Writer", for the edge values and the fast-math midpoints).

    Parameters
    ----------
    key, value
        ``[rows, num_kv_heads, head_dim]``, float16 or bfloat16 (one dtype), last dim contiguous;
        ``rows >= len(slot_mapping)`` (extra rows are ignored). head_dim 64, 128, 256 or 512.
    slot_mapping
        ``[nnz]`` contiguous int32 or int64: row ``i`` goes to ``page = slot // page_size``,
        ``offset = slot % page_size``; negative (padding) and out-of-range slots are skipped.
        ``num_pages * page_size < 2**31``.
    paged_kv_cache, kv_cache_sf, k_scale, v_scale, kv_layout
        The cache, its global scales and its layout (module docstring).
    nvfp4_4over6
        Per block, also try the scale ``e4m3(1.5 * sf)`` and keep it when the block's squared
        reconstruction error is strictly lower (FlashInfer 0.7.4's ``nvfp4_4over6``).
    """

    key: torch.Tensor
    value: torch.Tensor
    slot_mapping: torch.Tensor
    paged_kv_cache: Cache
    kv_cache_sf: Cache
    k_scale: Scale
    v_scale: Scale
    kv_layout: str = "NHD"
    _: KW_ONLY
    nvfp4_4over6: bool = False


@dataclass(slots=True)
class DequantArgs:
    """``dequant``: decode a paged NVFP4 cache into contiguous K/V (in place), ``x = (e2m1 * sf) * gs``.

    FlashInfer's ``nvfp4_kv_dequantize_paged`` semantics.

    Parameters
    ----------
    paged_kv_cache, kv_cache_sf, k_scale, v_scale, kv_layout
        The cache, its global scales and its layout (module docstring).
    block_table
        ``[batch, max_pages]`` int32 or int64 page ids, last dim contiguous;
        ``max_pages * page_size >= max_seq_len``.
    seq_lens
        ``[batch]`` int32, contiguous.
    output_k, output_v
        ``[batch, max_seq_len, num_kv_heads, head_dim]`` float16 or bfloat16 (one dtype),
        contiguous. Position ``t`` of request ``b`` is written iff ``t < seq_lens[b]`` and its page
        id ``block_table[b, t // page_size]`` is in ``[0, num_pages)``; every other row is left
        untouched.
    """

    paged_kv_cache: Cache
    kv_cache_sf: Cache
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    k_scale: Scale
    v_scale: Scale
    output_k: torch.Tensor
    output_v: torch.Tensor
    kv_layout: str = "NHD"


@dataclass(slots=True)
class DecodeArgs:
    """``decode``: paged attention of ``q_len_per_req`` query tokens per request over the cache.

    ``out = softmax(s) @ v`` with ``s = (q . k) * sm_scale``, ``k = e2m1 * sf * k_scale`` and
    ``v = e2m1 * sf * v_scale``; query head ``h`` reads KV head ``h // (num_qo_heads //
    num_kv_heads)``. The i-th of a request's ``q_len_per_req`` queries sits at position
    ``seq_len - q_len_per_req + i`` and sees key ``j`` iff ``j <= position``.

    Parameters
    ----------
    query
        fp16/bf16 ``[batch * q_len_per_req, num_qo_heads, head_dim]``, request-major, last dim
        contiguous.
    paged_kv_cache, kv_cache_sf, k_scale, v_scale, kv_layout
        The cache, its global scales and its layout (module docstring).
    block_table
        int32 ``[batch, max_pages]``; entries past a request's last page are never read; an entry
        outside ``[0, num_pages)`` reads nothing (its keys are masked, as if absent).
    seq_lens
        int32 ``[batch]``: KV length including the new tokens (``>= q_len_per_req``), clamped to
        ``[0, max_pages * page_size]`` (what the block-table row covers).
    sm_scale
        Softmax scale, finite and > 0.
    q_len_per_req
        Query tokens per request, 1..8 (speculative decoding).
    sliding_window
        Window ``W``: key ``j`` visible from position ``i`` iff ``i - W < j <= i``.
    logits_soft_cap
        ``s = cap * tanh(s / cap)``.
    sinks
        float32 ``[num_qo_heads]`` sink logits added to the softmax denominator (gpt-oss).
    out
        Output buffer like ``query`` (last dim contiguous).
    return_lse
        Also return the natural-log LSE, float32 ``[num_tokens, num_qo_heads]`` (sinks included).

    Returns
    -------
    ``out`` (``query``'s shape and dtype), and ``lse`` when ``return_lse``.
    """

    query: torch.Tensor
    paged_kv_cache: CachePair
    kv_cache_sf: CachePair
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    k_scale: Scale
    v_scale: Scale
    _: KW_ONLY
    sm_scale: float
    kv_layout: str = "NHD"
    q_len_per_req: int = 1
    sliding_window: int | None = None
    logits_soft_cap: float | None = None
    sinks: torch.Tensor | None = None
    out: torch.Tensor | None = None
    return_lse: bool = False


@dataclass(slots=True)
class PrefillArgs:
    """``prefill``: varlen paged attention over the cache (chunked prefill, mixed batches).

    Request ``b``'s queries are rows ``[qsl[b], qsl[b+1])`` of ``query``, placed at the last
    ``q_len_b`` positions of its ``seq_lens[b]`` keys (bottom-right causal); ``causal=False`` lets
    every query see all ``seq_lens[b]`` keys (a sliding window then bounds keys from below only,
    as FlashInfer's ``window_left = W - 1``). Logits, GQA, soft cap and sinks as in
    :class:`DecodeArgs`.

    Parameters
    ----------
    query
        fp16/bf16 ``[num_tokens, num_qo_heads, head_dim]``, last dim contiguous;
        ``num_tokens == query_start_loc[-1]``.
    query_start_loc
        int32 ``[batch + 1]``, non-decreasing, ``qsl[0] == 0``. Entries are clamped to
        ``[0, num_tokens]``; rows outside ``[qsl[0], qsl[-1])`` (a padded batch) are 0 with LSE
        ``-inf``; entries that decrease make every row 0 / ``-inf``.
    paged_kv_cache, kv_cache_sf, block_table, seq_lens, k_scale, v_scale, sm_scale, kv_layout,
    sliding_window, logits_soft_cap, sinks, out, return_lse
        As in :class:`DecodeArgs`; ``seq_lens[b] >= q_len_b``.

    Returns
    -------
    ``out`` (``query``'s shape and dtype), and the natural-log ``lse`` float32
    ``[num_tokens, num_qo_heads]`` when ``return_lse``.
    """

    query: torch.Tensor
    paged_kv_cache: CachePair
    kv_cache_sf: CachePair
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    k_scale: Scale
    v_scale: Scale
    _: KW_ONLY
    sm_scale: float
    kv_layout: str = "NHD"
    causal: bool = True
    sliding_window: int | None = None
    logits_soft_cap: float | None = None
    sinks: torch.Tensor | None = None
    out: torch.Tensor | None = None
    return_lse: bool = False


# op name (as in ``nvfp4compat.kernels.OPS``) -> its contract
CONTRACTS: dict[str, type] = {
    "write": WriteArgs,
    "dequant": DequantArgs,
    "decode": DecodeArgs,
    "prefill": PrefillArgs,
}

_P = ParamSpec("_P")
_A = TypeVar("_A")
_R = TypeVar("_R")


def implements(args: Callable[_P, _A]) -> Callable[[Callable[[_A], _R]], Callable[_P, _R]]:
    """Give an implementation written against an op's arguments the op's signature.

    ``@implements(WriteArgs)`` over ``def append_slot_mapping(a: WriteArgs) -> None`` makes
    ``append_slot_mapping(key, value, ...)`` a function with :class:`WriteArgs`' parameters (for
    callers, ``inspect.signature`` and mypy) that builds the arguments and runs the body on them.
    ``args`` may be an op's arguments class or a subclass that adds the implementation's own
    keyword-only options. Arguments that do not bind raise :class:`TypeError` under the
    implementation's name, as a plain function's would.
    """
    sig = inspect.signature(args)

    def bind(body: Callable[[_A], _R]) -> Callable[_P, _R]:
        @functools.wraps(body)
        def op(*a: _P.args, **kw: _P.kwargs) -> _R:
            try:
                call = args(*a, **kw)
            except TypeError:
                try:
                    sig.bind(*a, **kw)
                except TypeError as exc:
                    raise TypeError(f"{body.__name__}(): {exc}") from None
                raise
            return body(call)

        ret = inspect.signature(body).return_annotation
        op.__signature__ = sig.replace(return_annotation=ret)  # type: ignore[attr-defined]
        return op

    return bind


def _takes(args: Callable[_P, object]) -> Callable[[Callable[_P, object]], None]:
    """mypy only: ``_takes(WriteArgs)(fn)`` fails type checking unless ``fn`` accepts every call
    the op's arguments accept (its extra options keyword-only, with defaults)."""
    return lambda fn: None


# mypy checks every implementation's parameters against its op's (never called, nothing imported at
# run time)
if TYPE_CHECKING:

    def _conformance() -> None:
        from nvfp4compat.kernels import reference
        from nvfp4compat.kernels.composite import prefill_dequant
        from nvfp4compat.kernels.flashinfer import attention as fi_attention
        from nvfp4compat.kernels.flashinfer import dequant as fi_dequant
        from nvfp4compat.kernels.flashinfer import write as fi_write
        from nvfp4compat.kernels.triton import attention as tr_attention
        from nvfp4compat.kernels.triton import dequant as tr_dequant
        from nvfp4compat.kernels.triton import write as tr_write

        for write in (
            tr_write.append_slot_mapping, fi_write.append_slot_mapping, reference.append_slot_mapping
        ):
            _takes(WriteArgs)(write)
        for dequant in (
            tr_dequant.dequantize_paged, fi_dequant.dequantize_paged, reference.dequantize_paged
        ):
            _takes(DequantArgs)(dequant)
        for decode in (tr_attention.decode, fi_attention.decode):
            _takes(DecodeArgs)(decode)
        for prefill in (
            tr_attention.prefill, fi_attention.prefill, prefill_dequant.prefill_fa3,
            prefill_dequant.prefill_fa2,
        ):  # fmt: skip
            _takes(PrefillArgs)(prefill)
