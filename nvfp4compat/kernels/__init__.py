"""NVFP4 KV-cache kernels: one signature per operation, several implementations.

``get_kernel(op, impl)`` returns the callable for an operation (``write``, ``dequant``, ``decode``,
``prefill``) implemented by ``triton`` (bundled kernels), ``flashinfer`` (FlashInfer's helpers and
FA2 wrappers) or, for ``prefill`` only, ``dequant_fa3`` / ``dequant_fa2`` (the Triton dequantizer into a
bf16/fp16 scratch, then FlashInfer's ragged FA3 on SM90 / FA2 on SM80+; ``kernels/composite/prefill_dequant.py``). ``native`` (vLLM's own SM100-family TRT-LLM path) binds nothing here: the vLLM plugin
leaves vLLM's code in place. Each op's contract (signature and semantics) is the dataclass of its
arguments in ``nvfp4compat.kernels.contract``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from nvfp4compat.spec import IMPLS, OPS

__all__ = ["OPS", "IMPLS", "KERNELS", "get_kernel"]

# (op, impl) -> "module:function". Imported lazily: nothing here imports torch, triton or flashinfer.
KERNELS: dict[tuple[str, str], str] = {
    ("write", "triton"): "nvfp4compat.kernels.triton.write:append_slot_mapping",
    ("dequant", "triton"): "nvfp4compat.kernels.triton.dequant:dequantize_paged",
    ("decode", "triton"): "nvfp4compat.kernels.triton.attention:decode",
    ("prefill", "triton"): "nvfp4compat.kernels.triton.attention:prefill",
    ("write", "flashinfer"): "nvfp4compat.kernels.flashinfer.write:append_slot_mapping",
    ("dequant", "flashinfer"): "nvfp4compat.kernels.flashinfer.dequant:dequantize_paged",
    ("decode", "flashinfer"): "nvfp4compat.kernels.flashinfer.attention:decode",
    ("prefill", "flashinfer"): "nvfp4compat.kernels.flashinfer.attention:prefill",
    ("prefill", "dequant_fa3"): "nvfp4compat.kernels.composite.prefill_dequant:prefill_fa3",
    ("prefill", "dequant_fa2"): "nvfp4compat.kernels.composite.prefill_dequant:prefill_fa2",
}


def get_kernel(op: str, impl: str) -> Callable[..., Any]:
    """Return the implementation ``impl`` of operation ``op``.

    Raises
    ------
    ValueError
        For an unknown op or impl (the message lists the known ones), or for ``native``, which
        nvfp4compat does not implement (vLLM's own SM100 trtllm-gen path runs instead).
    ImportError
        When the implementation's module cannot be imported (e.g. triton or flashinfer missing); the
        message names the package to install.
    """
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; known ops: {list(OPS)}")
    if impl not in IMPLS:
        raise ValueError(f"unknown implementation {impl!r}; known: {list(IMPLS)}")
    if impl == "native":
        raise ValueError(
            f"op {op!r} has no nvfp4compat kernel for impl 'native': the native path is vLLM's own "
            "SM100-family trtllm-gen code, which the plugin leaves in place; use 'triton' or 'flashinfer'"
        )
    target = KERNELS.get((op, impl))
    if target is None:
        have = sorted(i for (o, i) in KERNELS if o == op)
        raise ValueError(f"op {op!r} has no {impl!r} implementation; implementations of {op!r}: {have}")
    module_name, func = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        need = "flashinfer-python" if impl == "flashinfer" else "triton (pip install 'nvfp4compat[triton]')"
        raise ImportError(
            f"cannot load the {impl} implementation of {op!r} ({target}): {exc}; it needs {need}"
        ) from exc
    return getattr(module, func)
