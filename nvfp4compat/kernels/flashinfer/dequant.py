"""FlashInfer implementation of ``dequant``: ``nvfp4_kv_dequantize_paged`` (the helper and its first
release are read from the matrix by :mod:`nvfp4compat.flashinfer_probe`).

The ``dequant`` contract (:class:`nvfp4compat.kernels.contract.DequantOp`) through a thin wrapper
with the host-side validation of the Triton implementation. FlashInfer takes the global scales only as float32 device tensors: a
Python number is put into a one-element device tensor here (an allocation and a host-to-device copy,
so pass tensors inside CUDA-graph capture). FlashInfer gates the helper to SM 80, 86, 89, 90, 100, 103,
(107 from 0.6.16), 110, 120, 121 and raises ``BackendSupportedError`` elsewhere.

Importing this module raises :class:`ImportError` when FlashInfer cannot be imported or lacks the helper.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nvfp4compat.flashinfer_probe import helper_for, import_flashinfer, require_helper
from nvfp4compat.kernels.checks import check_dequant_inputs, resolve_scale
from nvfp4compat.kernels.layout import normalize_cache

__all__ = ["HELPER", "dequantize_paged"]

_helper = require_helper(import_flashinfer("dequant"), "dequant")
HELPER: str = helper_for("dequant")  # implementations.yaml: the flashinfer dequant's flashinfer_helper


def _as_tensor(scale: float | torch.Tensor, device: torch.device) -> torch.Tensor:
    if isinstance(scale, torch.Tensor):
        return scale.reshape(1)
    return torch.full((1,), scale, dtype=torch.float32, device=device)


def dequantize_paged(
    paged_kv_cache: torch.Tensor | Sequence[torch.Tensor],
    kv_cache_sf: torch.Tensor | Sequence[torch.Tensor],
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    k_scale: float | torch.Tensor,
    v_scale: float | torch.Tensor,
    output_k: torch.Tensor,
    output_v: torch.Tensor,
    kv_layout: str = "NHD",
) -> None:
    """The ``dequant`` op (:class:`~nvfp4compat.kernels.contract.DequantOp`) through FlashInfer."""
    views = normalize_cache(paged_kv_cache, kv_cache_sf, kv_layout)
    check_dequant_inputs(views, block_table, seq_lens, output_k, output_v)
    device = views.device
    ks = _as_tensor(resolve_scale(k_scale, "k_scale", device), device)
    vs = _as_tensor(resolve_scale(v_scale, "v_scale", device), device)
    _helper(
        (views.k_data, views.v_data),
        (views.k_sf, views.v_sf),
        block_table.contiguous(),  # FlashInfer requires a dense table; a copy only if it is not
        seq_lens,
        ks,
        vs,
        output_k,
        output_v,
        kv_layout,
    )
