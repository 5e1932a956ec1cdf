"""NVFP4 paged-KV cache arguments: normalization, validation and vLLM page views.

Every kernel takes the cache the way FlashInfer does:

* ``paged_kv_cache``: a tuple ``(k_data, v_data)`` of ``uint8`` tensors, or one stacked tensor
  ``[num_pages, 2, ...]`` (split on dim 1). A tensor is NHD ``[num_pages, page_size, num_kv_heads,
  head_dim/2]`` or HND ``[num_pages, num_kv_heads, page_size, head_dim/2]``; a 3-D tensor (4-D stacked)
  means ``page_size == 1``.
* ``kv_cache_sf``: the same structure, ``float8_e4m3fn`` (or ``uint8`` holding the same bytes), last dim
  ``head_dim/16``; entry ``j`` is the linear scale of elements ``[16j, 16j+16)``.

Only the last dim must be contiguous; page, token and head strides are honoured, so strided views such
as vLLM's combined page (:func:`split_combined_page`) are accepted directly.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "SUPPORTED_HEAD_DIMS",
    "CacheViews",
    "normalize_cache",
    "split_combined_page",
    "nvfp4_full_dim",
    "check_scale",
    "FP32_MIN_NORMAL",
    "FP32_MAX",
]

SUPPORTED_HEAD_DIMS = (64, 128, 256, 512)
# A global scale reaches the kernels as an fp32 value: it must be a normal fp32 number.
FP32_MIN_NORMAL = 1.1754943508222875e-38
FP32_MAX = 3.4028234663852886e38
_LAYOUTS = ("NHD", "HND")


def nvfp4_full_dim(head_dim: int) -> int:
    """Bytes per (token, head) of one side (K or V) in vLLM's NVFP4 page: ``D/2 + D/16``."""
    return head_dim // 2 + head_dim // 16


@dataclass(frozen=True)
class CacheViews:
    """Normalized 4-D views of an NVFP4 paged cache.

    ``k_data``/``v_data`` are uint8, ``k_sf``/``v_sf`` float8_e4m3fn, each 4-D in ``layout`` order.
    ``strides(t)`` gives ``(page, token, head)`` strides in elements whatever the layout.
    """

    k_data: torch.Tensor
    v_data: torch.Tensor
    k_sf: torch.Tensor
    v_sf: torch.Tensor
    layout: str
    num_pages: int
    page_size: int
    num_kv_heads: int
    head_dim: int

    def strides(self, t: torch.Tensor) -> tuple[int, int, int]:
        s = t.stride()
        if self.layout == "NHD":
            return s[0], s[1], s[2]
        return s[0], s[2], s[1]

    @property
    def device(self) -> torch.device:
        return self.k_data.device


def _split(arg: torch.Tensor | Sequence[torch.Tensor], what: str) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(arg, torch.Tensor):
        if arg.dim() not in (4, 5) or arg.shape[1] != 2:
            raise ValueError(
                f"{what}: a stacked cache must be [num_pages, 2, ...] (4-D or 5-D), got shape "
                f"{tuple(arg.shape)}; pass a (k, v) tuple or stack K and V on dim 1"
            )
        return arg[:, 0], arg[:, 1]
    if isinstance(arg, (tuple, list)) and len(arg) == 2 and all(isinstance(t, torch.Tensor) for t in arg):
        return arg[0], arg[1]
    raise TypeError(
        f"{what}: expected a (k, v) tuple of tensors or a stacked [num_pages, 2, ...] tensor, got "
        f"{type(arg).__name__}"
    )


def _as4d(t: torch.Tensor, layout: str, what: str) -> torch.Tensor:
    if t.dim() == 3:  # page_size == 1
        t = t.unsqueeze(1) if layout == "NHD" else t.unsqueeze(2)
    if t.dim() != 4:
        raise ValueError(
            f"{what}: expected a 4-D {layout} tensor "
            f"{'[pages, page_size, heads, x]' if layout == 'NHD' else '[pages, heads, page_size, x]'}, "
            f"got shape {tuple(t.shape)}"
        )
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{what}: the last dim must be contiguous (stride 1), got strides {t.stride()}; "
            f"call .contiguous() or pass a view whose last dim is dense"
        )
    return t


def normalize_cache(
    paged_kv_cache: torch.Tensor | Sequence[torch.Tensor],
    kv_cache_sf: torch.Tensor | Sequence[torch.Tensor],
    kv_layout: str = "NHD",
) -> CacheViews:
    """Validate an NVFP4 paged cache and return its normalized 4-D views.

    Raises
    ------
    ValueError or TypeError
        Naming the argument, what was found and what is needed: wrong dtype, rank, layout string,
        mismatched shapes between K and V or between data and scales, a non-contiguous last dim, or a
        head_dim outside ``SUPPORTED_HEAD_DIMS``.
    """
    if kv_layout not in _LAYOUTS:
        raise ValueError(f"kv_layout must be one of {_LAYOUTS}, got {kv_layout!r}")
    k, v = _split(paged_kv_cache, "paged_kv_cache")
    ks, vs = _split(kv_cache_sf, "kv_cache_sf")
    for name, t in (("paged_kv_cache[0] (K data)", k), ("paged_kv_cache[1] (V data)", v)):
        if t.dtype != torch.uint8:
            raise TypeError(f"{name}: expected torch.uint8 packed E2M1 data, got {t.dtype}")
    for name, t in (("kv_cache_sf[0] (K scales)", ks), ("kv_cache_sf[1] (V scales)", vs)):
        if t.dtype not in (torch.float8_e4m3fn, torch.uint8):
            raise TypeError(
                f"{name}: expected torch.float8_e4m3fn (or uint8 holding E4M3 bytes) block scales, got {t.dtype}"
            )
    k = _as4d(k, kv_layout, "paged_kv_cache[0] (K data)")
    v = _as4d(v, kv_layout, "paged_kv_cache[1] (V data)")
    ks = _as4d(ks, kv_layout, "kv_cache_sf[0] (K scales)")
    vs = _as4d(vs, kv_layout, "kv_cache_sf[1] (V scales)")
    if ks.dtype == torch.uint8:
        ks = ks.view(torch.float8_e4m3fn)
    if vs.dtype == torch.uint8:
        vs = vs.view(torch.float8_e4m3fn)
    if k.shape != v.shape:
        raise ValueError(f"K and V data shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    if ks.shape != vs.shape:
        raise ValueError(f"K and V scale shapes differ: {tuple(ks.shape)} vs {tuple(vs.shape)}")
    if ks.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"scales {tuple(ks.shape)} do not match data {tuple(k.shape)} in (pages, page_size, heads)"
        )
    head_dim = k.shape[-1] * 2
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"head_dim {head_dim} (data last dim {k.shape[-1]}) is not supported; "
            f"supported head_dim values are {list(SUPPORTED_HEAD_DIMS)}"
        )
    if ks.shape[-1] * 16 != head_dim:
        raise ValueError(
            f"scale last dim must be head_dim/16 = {head_dim // 16}, got {ks.shape[-1]}"
        )
    devices = {t.device for t in (k, v, ks, vs)}
    if len(devices) != 1:
        raise ValueError(f"cache tensors are on different devices: {sorted(map(str, devices))}")
    for what, a, b in (("paged_kv_cache", k, v), ("kv_cache_sf", ks, vs)):
        if a.numel() and a.data_ptr() == b.data_ptr():
            raise ValueError(
                f"{what}: K and V are the same memory (both start at {a.data_ptr():#x}); the writer "
                "would store V over K. Pass two separate tensors, or one stacked [num_pages, 2, ...] tensor"
            )
    if kv_layout == "NHD":
        num_pages, page_size, heads = k.shape[0], k.shape[1], k.shape[2]
    else:
        num_pages, heads, page_size = k.shape[0], k.shape[1], k.shape[2]
    return CacheViews(k, v, ks, vs, kv_layout, num_pages, page_size, heads, head_dim)


def split_combined_page(
    kv_cache: torch.Tensor, num_kv_heads: int
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor], str]:
    """Views of vLLM's combined NVFP4 page ``[K data | K scales | V data | V scales]``.

    The semantics of vLLM 0.32+'s ``_nvfp4_kv_views`` (``vllm/v1/attention/backends/flashinfer.py``).

    Parameters
    ----------
    kv_cache : torch.Tensor
        uint8 ``[num_blocks, 2*num_kv_heads, block_size, full_dim]`` with ``full_dim = D/2 + D/16``,
        dense either as HND (strides ``(.., block_size*full_dim, full_dim, 1)``) or NHD (strides
        ``(.., full_dim, 2*num_kv_heads*full_dim, 1)``).
    num_kv_heads : int
        KV heads of the layer.

    Returns
    -------
    ((k_data, v_data), (k_sf, v_sf), layout)
        uint8 data views ``[blocks, *dims, D/2]`` and float8_e4m3fn scale views ``[blocks, *dims, D/16]``,
        with ``dims`` = ``(heads, block_size)`` for ``"HND"`` and ``(block_size, heads)`` for ``"NHD"``.
    """
    if kv_cache.dtype != torch.uint8 or kv_cache.dim() != 4:
        raise ValueError(
            f"vLLM NVFP4 KV cache must be a 4-D uint8 tensor [blocks, 2*heads, block_size, full_dim], "
            f"got {kv_cache.dtype} {tuple(kv_cache.shape)}"
        )
    num_blocks, num_slots, block_size, full_dim = kv_cache.shape
    if num_slots != 2 * num_kv_heads:
        raise ValueError(f"expected 2*num_kv_heads = {2 * num_kv_heads} head slots, got {num_slots}")
    data_dim = full_dim * 8 // 9
    scale_dim = full_dim - data_dim
    if data_dim + scale_dim != full_dim or data_dim != 8 * scale_dim:
        raise ValueError(f"full_dim {full_dim} is not D/2 + D/16 for any head_dim")
    hnd = kv_cache.stride()[1:] == (block_size * full_dim, full_dim, 1)
    if not hnd and kv_cache.stride()[1:] != (full_dim, num_slots * full_dim, 1):
        raise ValueError(f"NVFP4 KV pages must be dense (HND or NHD), got strides {kv_cache.stride()}")
    dims = (num_kv_heads, block_size) if hnd else (block_size, num_kv_heads)
    side_size = num_kv_heads * block_size * full_dim
    data_per_side = num_kv_heads * block_size * data_dim
    page = kv_cache.stride(0)
    base = kv_cache.storage_offset()
    data, scales = [], []
    for side in range(2):
        off = base + side * side_size
        data.append(
            kv_cache.as_strided(
                (num_blocks, *dims, data_dim), (page, dims[1] * data_dim, data_dim, 1), off
            )
        )
        scales.append(
            kv_cache.as_strided(
                (num_blocks, *dims, scale_dim),
                (page, dims[1] * scale_dim, scale_dim, 1),
                off + data_per_side,
            ).view(torch.float8_e4m3fn)
        )
    return (data[0], data[1]), (scales[0], scales[1]), "HND" if hnd else "NHD"


def check_scale(scale: float | torch.Tensor, name: str, device: torch.device) -> None:
    """Validate a global scale without a host sync.

    A Python or NumPy number must be a normal fp32 number > 0 (``FP32_MIN_NORMAL`` to ``FP32_MAX``,
    checked here: the kernels take it as fp32). A tensor must be one float32 element on ``device``;
    its value is read by the kernel on the device and NOT checked here (no host sync): a non-finite or
    non-positive device scale makes the writer store NaN block scales and set its error flag.
    """
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1 or scale.dtype != torch.float32:
            raise ValueError(
                f"{name}: a tensor scale must be one float32 element, got {scale.dtype} with "
                f"{scale.numel()} elements"
            )
        if scale.device != device:
            raise ValueError(f"{name}: scale is on {scale.device}, the cache is on {device}")
        return
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(
            f"{name}: expected a positive float or a one-element float32 tensor, got {type(scale).__name__}"
        )
    s = float(scale)
    if not (s > 0.0 and s != float("inf")):
        raise ValueError(f"{name}: the global scale must be finite and > 0, got {s!r}")
    if not FP32_MIN_NORMAL <= s <= FP32_MAX:
        raise ValueError(
            f"{name}: the global scale {s!r} is not a normal fp32 number (the kernels compute in fp32); "
            f"it must lie in [{FP32_MIN_NORMAL:.6g}, {FP32_MAX:.6g}]. Rescale the K/V data or pass "
            "amax / (6 * 448)"
        )
