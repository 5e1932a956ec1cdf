"""Host-side input checks shared by every implementation of the NVFP4 KV ops, and the device
queries they and the launchers need (``interpreting``, ``default_fast_math``, ``sm_count``).

Every check reads tensor metadata only (dtype, shape, strides, device): nothing here reads a value from
the device, so the checks are safe inside CUDA-graph capture. Errors name the argument, what was found,
what is needed and the way out. The cache arguments themselves are validated by
:func:`nvfp4compat.kernels.layout.normalize_cache`.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from nvfp4compat.kernels.layout import FP32_MAX, FP32_MIN_NORMAL, CacheViews, check_scale

__all__ = [
    "INPUT_DTYPES",
    "MAX_INDEX",
    "interpreting",
    "default_fast_math",
    "resolve_scale",
    "check_write_inputs",
    "check_dequant_inputs",
    "sm_count",
    "tensor_meta",
    "scale_meta",
    "METADATA_ENV",
    "metadata_checks_on",
    "check_metadata_values",
]

INPUT_DTYPES = (torch.float16, torch.bfloat16)
# The kernels index slots, rows and pages with 32-bit integers (byte offsets are 64-bit).
MAX_INDEX = 2**31 - 1
# Debug mode: read the device metadata on the host before each launch (a sync) and name bad entries.
METADATA_ENV = "NVFP4COMPAT_CHECK_METADATA"


@functools.lru_cache(maxsize=16)
def sm_count(device: torch.device) -> int:
    """Multiprocessor count of a CUDA device (cached per device); 4 elsewhere (the interpreter)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return 4


def tensor_meta(t: torch.Tensor) -> tuple:
    """A tensor's metadata as a hashable key part (dtype, shape, strides, device index): what the
    launch caches of the kernels' host paths key on. The device itself, not ``get_device()``: that is
    -1 for both a CPU and a meta tensor, and 0 for both cuda:0 and xpu:0."""
    return (t.dtype, t.shape, t.stride(), t.device)


def scale_meta(x: Any) -> object:
    """Key part of a global scale for those caches: ``float`` for a Python float that is a positive
    normal fp32 number, the metadata of a tensor, or None (an int, a NumPy number, a value outside
    fp32's normal range, anything else: such calls take the validating path, which converts or
    rejects them)."""
    if type(x) is float:
        return float if FP32_MIN_NORMAL <= x <= FP32_MAX else None
    if type(x) is torch.Tensor:
        return (x.dtype, x.numel(), x.device)
    return None


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def default_fast_math(device: torch.device) -> bool:
    """Whether the writer uses FlashInfer's approximate division/reciprocal by default.

    On for CUDA launches (so the bytes match FlashInfer's ``-use_fast_math`` build), off on the CPU and
    under the interpreter, which cannot run inline PTX and computes exact IEEE fp32 instead.
    """
    return device.type == "cuda" and not interpreting()


def resolve_scale(
    scale: float | torch.Tensor, name: str, device: torch.device
) -> float | torch.Tensor:
    """Validate a global scale and return it in the form the kernels take.

    Parameters
    ----------
    scale : float or torch.Tensor
        A positive finite Python number, or a one-element float32 tensor. A CPU tensor passed for a
        CUDA cache is read on the host (it lives there: no device sync) and checked like a number.
        A tensor on ``device`` is returned as is and read by the kernel on the device.
    name : str
        The argument name for error messages (``"k_scale"``).
    device : torch.device
        The cache's device.

    Returns
    -------
    float or torch.Tensor
        A validated Python float, or the float32 one-element device tensor.
    """
    if isinstance(scale, torch.Tensor) and scale.device.type == "cpu" and device.type != "cpu":
        if scale.numel() != 1 or scale.dtype != torch.float32:
            raise ValueError(
                f"{name}: a tensor scale must be one float32 element, got {scale.dtype} with "
                f"{scale.numel()} elements"
            )
        scale = float(scale.reshape(()).item())
    check_scale(scale, name, device)
    if isinstance(scale, torch.Tensor):
        return scale
    return float(scale)


def _check_rows(name: str, t: torch.Tensor, views: CacheViews, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(
            f"{name}: expected a tensor [rows, num_kv_heads, head_dim], got {type(t).__name__}"
        )
    if t.dtype not in INPUT_DTYPES:
        raise TypeError(f"{name}: expected torch.float16 or torch.bfloat16, got {t.dtype}")
    if t.dim() != 3:
        raise ValueError(
            f"{name}: expected a 3-D tensor [rows, num_kv_heads, head_dim], got shape {tuple(t.shape)}"
        )
    if t.shape[1] != views.num_kv_heads or t.shape[2] != views.head_dim:
        raise ValueError(
            f"{name}: shape {tuple(t.shape)} does not match the cache's (num_kv_heads, head_dim) = "
            f"({views.num_kv_heads}, {views.head_dim})"
        )
    if t.shape[2] > 1 and t.stride(2) != 1:
        raise ValueError(
            f"{name}: the last dim must be contiguous (stride 1), got strides {t.stride()}; "
            f"call .contiguous() or pass a view whose last dim is dense"
        )
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, the cache is on {device}")


def _check_index_vector(name: str, t: object, dtypes: tuple[torch.dtype, ...], dim: str) -> None:
    """``t`` must be a contiguous 1-D tensor ``[dim]`` of one of ``dtypes`` (``slot_mapping``,
    ``seq_lens``)."""
    if not isinstance(t, torch.Tensor) or t.dtype not in dtypes:
        raise TypeError(
            f"{name}: expected a {' or '.join(map(str, dtypes))} tensor, got "
            f"{getattr(t, 'dtype', type(t).__name__)}"
        )
    if t.dim() != 1 or (t.shape[0] > 1 and t.stride(0) != 1):
        raise ValueError(
            f"{name}: expected a contiguous 1-D tensor [{dim}], got shape {tuple(t.shape)} strides "
            f"{t.stride()}; call .contiguous()"
        )


def check_write_inputs(
    key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor, views: CacheViews
) -> None:
    """Validate the writer's row inputs against normalized cache views.

    Checks that ``key``/``value`` are fp16/bf16 ``[rows, num_kv_heads, head_dim]`` of one dtype with a
    contiguous last dim, ``rows >= len(slot_mapping)``, ``slot_mapping`` is a 1-D int32/int64 tensor,
    everything is on the cache's device, and the cache's slot count fits the kernels' 32-bit slot
    arithmetic. Slot *values* are not read (that would sync): negative or out-of-range slots are
    skipped by the kernels, as FlashInfer does. Like FlashInfer, ``slot_mapping`` must be contiguous.
    """
    device = views.device
    _check_rows("key", key, views, device)
    _check_rows("value", value, views, device)
    if key.dtype != value.dtype:
        raise TypeError(
            f"key and value must have the same dtype, got {key.dtype} and {value.dtype}"
        )
    _check_index_vector("slot_mapping", slot_mapping, (torch.int32, torch.int64), "nnz")
    if slot_mapping.device != device:
        raise ValueError(f"slot_mapping is on {slot_mapping.device}, the cache is on {device}")
    nnz = slot_mapping.shape[0]
    if key.shape[0] < nnz or value.shape[0] < nnz:
        raise ValueError(
            f"key and value need at least len(slot_mapping) = {nnz} rows, got {key.shape[0]} and "
            f"{value.shape[0]}; rows past len(slot_mapping) are ignored, missing rows are an error"
        )
    if views.num_pages * views.page_size > MAX_INDEX:
        raise ValueError(
            f"the cache has {views.num_pages} pages x {views.page_size} = "
            f"{views.num_pages * views.page_size} slots; at most {MAX_INDEX} are supported"
        )
    if nnz * views.num_kv_heads > MAX_INDEX:
        raise ValueError(
            f"{nnz} rows x {views.num_kv_heads} heads exceeds {MAX_INDEX} (row, head) pairs"
        )


def check_dequant_inputs(
    views: CacheViews,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    output_k: torch.Tensor,
    output_v: torch.Tensor,
) -> None:
    """Validate the paged dequantizer's arguments (FlashInfer ``nvfp4_kv_dequantize_paged`` rules).

    ``block_table`` ``[batch, max_pages]`` int32/int64 with a contiguous last dim; ``seq_lens``
    ``[batch]`` int32 contiguous; ``output_k``/``output_v`` contiguous fp16/bf16 (one dtype)
    ``[batch, max_seq_len, num_kv_heads, head_dim]``; ``max_pages * page_size >= max_seq_len`` so that
    every written position has a block-table entry.
    """
    device = views.device
    if not isinstance(block_table, torch.Tensor) or block_table.dtype not in (
        torch.int32,
        torch.int64,
    ):
        raise TypeError(
            f"block_table: expected an int32 or int64 tensor, got "
            f"{getattr(block_table, 'dtype', type(block_table).__name__)}"
        )
    if block_table.dim() != 2:
        raise ValueError(
            f"block_table: expected [batch, max_pages], got shape {tuple(block_table.shape)}"
        )
    if block_table.shape[1] > 1 and block_table.stride(1) != 1:
        raise ValueError(
            f"block_table: the last dim must be contiguous, got strides {block_table.stride()}"
        )
    _check_index_vector("seq_lens", seq_lens, (torch.int32,), "batch")
    for name, out in (("output_k", output_k), ("output_v", output_v)):
        if not isinstance(out, torch.Tensor) or out.dtype not in INPUT_DTYPES:
            raise TypeError(
                f"{name}: expected a torch.float16 or torch.bfloat16 tensor, got "
                f"{getattr(out, 'dtype', type(out).__name__)}"
            )
        if out.dim() != 4:
            raise ValueError(
                f"{name}: expected [batch, max_seq_len, num_kv_heads, head_dim], got shape {tuple(out.shape)}"
            )
        if not out.is_contiguous():
            raise ValueError(
                f"{name}: must be contiguous, got strides {out.stride()} for shape {tuple(out.shape)}"
            )
        if out.device != device:
            raise ValueError(f"{name} is on {out.device}, the cache is on {device}")
    if output_k.dtype != output_v.dtype:
        raise TypeError(
            f"output_k and output_v must have the same dtype, got {output_k.dtype} and {output_v.dtype}"
        )
    if output_k.shape != output_v.shape:
        raise ValueError(
            f"output_k {tuple(output_k.shape)} and output_v {tuple(output_v.shape)} differ in shape"
        )
    batch, max_seq_len, heads, head_dim = output_k.shape
    if heads != views.num_kv_heads or head_dim != views.head_dim:
        raise ValueError(
            f"outputs have (num_kv_heads, head_dim) = ({heads}, {head_dim}), the cache has "
            f"({views.num_kv_heads}, {views.head_dim})"
        )
    if block_table.shape[0] != batch or seq_lens.shape[0] != batch:
        raise ValueError(
            f"batch mismatch: outputs have {batch} requests, block_table {block_table.shape[0]}, "
            f"seq_lens {seq_lens.shape[0]}"
        )
    if block_table.shape[1] * views.page_size < max_seq_len:
        raise ValueError(
            f"block_table has {block_table.shape[1]} pages per request x page_size {views.page_size} = "
            f"{block_table.shape[1] * views.page_size} positions, fewer than max_seq_len {max_seq_len}"
        )
    for name, t in (("block_table", block_table), ("seq_lens", seq_lens)):
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, the cache is on {device}")
    if max_seq_len * heads > MAX_INDEX:
        raise ValueError(f"max_seq_len x heads = {max_seq_len * heads} exceeds {MAX_INDEX}")


def check_query_start_loc(
    op: str, query_start_loc: object, batch: int, device: torch.device | None
) -> torch.Tensor:
    """The attention ops' ``query_start_loc``: an int32 tensor ``[batch + 1]`` (on ``device``, the
    cache's, unless None), returned contiguous. Its values are the kernels' to clamp (or
    :func:`check_metadata_values`' to check, in debug mode): reading them here would sync."""
    qsl = query_start_loc
    if not isinstance(qsl, torch.Tensor) or qsl.dtype != torch.int32 or qsl.dim() != 1 or qsl.shape[0] != batch + 1:
        raise ValueError(
            f"{op}: query_start_loc must be an int32 tensor [batch + 1 = {batch + 1}], got "
            f"{getattr(qsl, 'dtype', type(qsl).__name__)} {tuple(getattr(qsl, 'shape', ()))}"
        )
    if device is not None and qsl.device != device:
        raise ValueError(f"{op}: query_start_loc is on {qsl.device}, the cache is on {device}")
    return qsl.contiguous()


def metadata_checks_on() -> bool:
    """Whether ``NVFP4COMPAT_CHECK_METADATA`` asks for the host-side metadata checks (debug mode:
    ``1``, ``true``, ``on`` or ``yes``). Read on every call, so a test or a session can switch it."""
    return os.environ.get(METADATA_ENV, "0").strip().lower() in ("1", "true", "on", "yes")


def _first_bad(bad: torch.Tensor) -> tuple[int, ...] | None:
    idx = bad.nonzero()
    return None if idx.shape[0] == 0 else tuple(int(i) for i in idx[0].tolist())


def check_metadata_values(
    op: str,
    *,
    num_pages: int,
    page_size: int,
    block_table: torch.Tensor | None = None,
    seq_lens: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    query_start_loc: torch.Tensor | None = None,
    num_tokens: int | None = None,
    min_seq_len: int = 0,
    slot_mapping: torch.Tensor | None = None,
) -> None:
    """Debug mode (``NVFP4COMPAT_CHECK_METADATA=1``): check the metadata *values* on the host.

    The kernels never read or write outside their tensors whatever these values are (they clamp and
    mask: the semantics are in :mod:`nvfp4compat.kernels.reference_attention`'s docstring), but a
    caller's bug then shows as quietly wrong attention. This
    reads the tensors (a host sync: never inside CUDA-graph capture) and raises
    :class:`~nvfp4compat.kernels.errors.KernelInputError` naming the first bad entry: a
    ``seq_lens`` entry below ``min_seq_len`` or beyond what its block-table row covers (or beyond
    ``max_seq_len``), a block-table entry a request reads that is outside ``[0, num_pages)``, a
    ``query_start_loc`` that does not start at 0, decreases or passes ``num_tokens``, a slot past the
    cache (negative slots are padding and allowed).
    """
    from nvfp4compat.kernels.errors import KernelInputError

    def fail(arg: str, where: tuple[int, ...], value: int, need: str) -> None:
        at = "[" + ", ".join(str(i) for i in where) + "]"
        raise KernelInputError(
            f"{op}: {arg}{at} = {value} {need}; the kernels would clamp or skip it and compute "
            f"something else than meant. Fix the caller's metadata (checked because {METADATA_ENV}=1)"
        )

    if slot_mapping is not None:
        slots = slot_mapping.detach().to("cpu", torch.int64)
        num_slots = num_pages * page_size
        at = _first_bad(slots >= num_slots)
        if at is not None:
            fail("slot_mapping", at, int(slots[at]), f"is past the cache's {num_slots} slots")
    if query_start_loc is not None and num_tokens is not None:
        qsl = query_start_loc.detach().to("cpu", torch.int64)
        if qsl.numel() and int(qsl[0]) != 0:
            fail("query_start_loc", (0,), int(qsl[0]), "must be 0")
        at = _first_bad(qsl[1:] < qsl[:-1])
        if at is not None:
            i = at[0] + 1
            fail("query_start_loc", (i,), int(qsl[i]), f"is below the entry before it ({int(qsl[i - 1])})")
        at = _first_bad(qsl > num_tokens)
        if at is not None:
            fail("query_start_loc", at, int(qsl[at]), f"is past the {num_tokens} query rows")
    if seq_lens is None or block_table is None:
        return
    sl = seq_lens.detach().to("cpu", torch.int64)
    bt = block_table.detach().to("cpu", torch.int64)
    cover = bt.shape[1] * page_size
    limit = cover if max_seq_len is None else min(cover, max_seq_len)
    at = _first_bad((sl < min_seq_len) | (sl > limit))
    if at is not None:
        fail("seq_lens", at, int(sl[at]), f"is outside [{min_seq_len}, {limit}] (what the block-table row covers)")
    pages_used = (sl.clamp(0, limit) + page_size - 1) // page_size
    used = torch.arange(bt.shape[1])[None, :] < pages_used[:, None]
    at = _first_bad(used & ((bt < 0) | (bt >= num_pages)))
    if at is not None:
        fail("block_table", at, int(bt[at]), f"is outside [0, {num_pages}) (the cache's pages)")
