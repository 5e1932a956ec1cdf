"""FlashInfer implementation of ``write``: ``nvfp4_quantize_append_paged_kv_cache_with_slot_mapping``.

The ``write`` contract (:class:`nvfp4compat.kernels.contract.WriteArgs`) through a thin wrapper: the
host-side validation of the Triton implementation (so every implementation rejects the same inputs with the same message),
then FlashInfer's helper (the release that first has it, and the first whose helper takes
``nvfp4_4over6``, are read from ``matrix/flashinfer.yaml`` by :mod:`nvfp4compat.flashinfer_probe`).

Importing this module raises :class:`ImportError` when FlashInfer cannot be imported or lacks the
helper, naming the installed version and the way out (``impl 'triton'``).

Device-scale behaviour is FlashInfer's own, not the Triton kernel's: 0.6.15-0.7.2.post1 copy a CUDA
scale tensor to the host on every call (a sync; a bad value raises ``ValueError``, and during CUDA-graph
capture the check is skipped); 0.7.4 reads it on the device and executes ``trap`` on a non-finite or
non-positive value, which can leave the CUDA context unusable.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from nvfp4compat.flashinfer_probe import (
    first_release_with_4over6,
    helper_for,
    import_flashinfer,
    require_helper,
)
from nvfp4compat.kernels.checks import check_write_inputs, resolve_scale
from nvfp4compat.kernels.contract import WriteArgs, implements
from nvfp4compat.kernels.layout import normalize_cache

__all__ = [
    "HELPER",
    "flashinfer_version",
    "supports_4over6",
    "append_slot_mapping",
]

_flashinfer = import_flashinfer("write")
_helper = require_helper(_flashinfer, "write")
HELPER: str = helper_for("write")  # implementations.yaml: the flashinfer write's flashinfer_helper


def flashinfer_version() -> str:
    return str(getattr(_flashinfer, "__version__", "unknown"))


@functools.cache
def supports_4over6() -> bool:
    """Whether the installed helper takes ``nvfp4_4over6`` (flashinfer.yaml: nvfp4_4over6.writer_param)."""
    try:
        return "nvfp4_4over6" in inspect.signature(_helper).parameters
    except (TypeError, ValueError):
        return False


def _four_over_six_config() -> Any:
    if not supports_4over6():
        raise NotImplementedError(
            f"nvfp4_4over6=True needs FlashInfer >= {first_release_with_4over6()} (its {HELPER} takes "
            "nvfp4_4over6); "
            f"flashinfer {flashinfer_version()} is installed. Use impl 'triton' for the write op "
            "(NVFP4COMPAT_IMPL=write=triton), which implements the same 4over6 scale search"
        )
    from flashinfer.quantization import NVFP44Over6Config

    # The only recipe the paged writer accepts: MSE without fast-math error evaluation.
    return NVFP44Over6Config(err_mode="MSE")


@implements(WriteArgs)
def append_slot_mapping(a: WriteArgs) -> None:
    """The ``write`` op (:class:`~nvfp4compat.kernels.contract.WriteArgs`) through FlashInfer's helper.

    ``nvfp4_4over6=True`` requires a FlashInfer whose helper takes it and raises
    :class:`NotImplementedError` otherwise. Device-scale handling is FlashInfer's (module docstring).
    """
    views = normalize_cache(a.paged_kv_cache, a.kv_cache_sf, a.kv_layout)
    check_write_inputs(a.key, a.value, a.slot_mapping, views)
    ks = resolve_scale(a.k_scale, "k_scale", views.device)
    vs = resolve_scale(a.v_scale, "v_scale", views.device)
    kwargs = {"nvfp4_4over6": _four_over_six_config()} if a.nvfp4_4over6 else {}
    if a.slot_mapping.shape[0] == 0:
        return
    _helper(
        a.key,
        a.value,
        a.slot_mapping,
        (views.k_data, views.v_data),
        (views.k_sf, views.v_sf),
        ks,
        vs,
        a.kv_layout,
        **kwargs,
    )
