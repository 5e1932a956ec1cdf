"""FlashInfer implementation of ``dequant``: ``nvfp4_kv_dequantize_paged`` (the helper and its first
release are read from the matrix by :mod:`nvfp4compat.flashinfer_probe`).

The ``dequant`` contract (:class:`nvfp4compat.kernels.contract.DequantArgs`) through a thin wrapper
with the host-side validation of the Triton implementation. FlashInfer takes the global scales only as float32 device tensors: a
Python number is put into a one-element device tensor here (an allocation and a host-to-device copy,
so pass tensors inside CUDA-graph capture). FlashInfer gates the helper to SM 80, 86, 89, 90, 100, 103,
(107 from 0.6.16), 110, 120, 121 and raises ``BackendSupportedError`` elsewhere.

Importing this module raises :class:`ImportError` when FlashInfer cannot be imported or lacks the helper.
"""

from __future__ import annotations

import torch

from nvfp4compat.flashinfer_probe import helper_for, import_flashinfer, require_helper
from nvfp4compat.kernels.checks import check_dequant_inputs, resolve_scale
from nvfp4compat.kernels.contract import DequantArgs, implements
from nvfp4compat.kernels.layout import normalize_cache

__all__ = ["HELPER", "dequantize_paged"]

_helper = require_helper(import_flashinfer("dequant"), "dequant")
HELPER: str = helper_for("dequant")  # implementations.yaml: the flashinfer dequant's flashinfer_helper


def _as_tensor(scale: float | torch.Tensor, device: torch.device) -> torch.Tensor:
    if isinstance(scale, torch.Tensor):
        return scale.reshape(1)
    return torch.full((1,), scale, dtype=torch.float32, device=device)


@implements(DequantArgs)
def dequantize_paged(a: DequantArgs) -> None:
    """The ``dequant`` op (:class:`~nvfp4compat.kernels.contract.DequantArgs`) through FlashInfer."""
    views = normalize_cache(a.paged_kv_cache, a.kv_cache_sf, a.kv_layout)
    check_dequant_inputs(views, a.block_table, a.seq_lens, a.output_k, a.output_v)
    device = views.device
    ks = _as_tensor(resolve_scale(a.k_scale, "k_scale", device), device)
    vs = _as_tensor(resolve_scale(a.v_scale, "v_scale", device), device)
    _helper(
        (views.k_data, views.v_data),
        (views.k_sf, views.v_sf),
        a.block_table.contiguous(),  # FlashInfer requires a dense table; a copy only if it is not
        a.seq_lens,
        ks,
        vs,
        a.output_k,
        a.output_v,
        a.kv_layout,
    )
