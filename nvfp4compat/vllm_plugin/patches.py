"""One ``apply_<id>`` per patch id, and the table of what each one changes in vLLM.

The route is a subclass of vLLM's FlashInfer backend, builder and impl
(:mod:`nvfp4compat.vllm_plugin.backend`) registered over ``AttentionBackendEnum.FLASHINFER`` with
vLLM's own ``register_backend``. So each patch id changes two kinds of target:

* ``registry``: the one object changed inside vLLM, the FLASHINFER entry of
  ``vllm.v1.attention.backends.registry._ATTN_OVERRIDES``; its original (absent, or another path) is
  recorded in the ledger and :func:`nvfp4compat.vllm_plugin.unpatch` puts it back;
* ``override``: a method of the FlashInfer class that the registered subclass overrides for this
  patch id; vLLM's class is not modified, so there is nothing to put back beyond the registry entry.

Every target is listed in ``docs/patches.md`` (why, how, releases, upstream PR, when to remove);
``tests/vllm/test_patch_ledger.py`` checks the two agree. Imports of vLLM happen inside the
functions, and only of light modules (the registry), never of the FlashInfer backend module.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping

from nvfp4compat.plan import VllmRoute
from nvfp4compat.spec import PATCH_IDS
from nvfp4compat.vllm_plugin.ledger import Ledger

__all__ = [
    "OVERRIDE_PATH",
    "REGISTRY_TARGET",
    "DTYPE_REGISTRY_TARGET",
    "REFUSE_ID",
    "PLUGIN_PATCH_IDS",
    "PATCH_TARGETS",
    "MEMOISED",
    "APPLY",
    "apply_route",
    "clear_memoised",
]

OVERRIDE_PATH = "nvfp4compat.vllm_plugin.backend.Nvfp4CompatFlashInferBackend"
REGISTRY_TARGET = "vllm.v1.attention.backends.registry._ATTN_OVERRIDES[FLASHINFER]"
# the --kv-cache-dtype names registered through vLLM's own API (0.33+): its KV_CACHE_DTYPES list,
# STR_DTYPE_TO_TORCH_DTYPE and handler table gain the names; unpatch() takes them out again
DTYPE_REGISTRY_TARGET = "vllm.config.cache.register_kv_cache_dtype"
# Not a matrix patch id: the plugin's own refusal (no writer bindable) is applied the same way.
REFUSE_ID = "refuse_nvfp4"
PLUGIN_PATCH_IDS: tuple[str, ...] = (*PATCH_IDS, REFUSE_ID)

_FI = "vllm.v1.attention.backends.flashinfer"
_BACKEND = f"{_FI}.FlashInferBackend"
_BUILDER = f"{_FI}.FlashInferMetadataBuilder"
_IMPL = f"{_FI}.FlashInferImpl"

# patch id -> targets it changes (the registry entry first). docs/patches.md lists exactly these.
PATCH_TARGETS: dict[str, tuple[str, ...]] = {
    "gate_nvfp4": (REGISTRY_TARGET, f"{_BACKEND}.supports_kv_cache_dtype"),
    "gate_nvfp4_4over6": (REGISTRY_TARGET, f"{_BACKEND}.supports_kv_cache_dtype"),
    "gate_combination": (
        REGISTRY_TARGET,
        f"{_BACKEND}.supports_combination",
        f"{_BACKEND}.supports_sink",
    ),
    "metadata_builder": (
        REGISTRY_TARGET,
        f"{_BACKEND}.get_builder_cls",
        f"{_BUILDER}.__init__",
        f"{_BUILDER}.build",
        f"{_BUILDER}.get_cudagraph_support",
        f"{_BUILDER}.use_cascade_attention",
        f"{_BUILDER}._get_workspace_buffer",
    ),
    "kv_cache_update": (
        REGISTRY_TARGET,
        f"{_BACKEND}.get_impl_cls",
        f"{_IMPL}.__init__",
        f"{_IMPL}.do_kv_cache_update",
    ),
    "forward_reader": (
        REGISTRY_TARGET,
        f"{_BACKEND}.get_impl_cls",
        f"{_BACKEND}.get_builder_cls",
        f"{_IMPL}.__init__",
        f"{_IMPL}.forward",
        f"{_IMPL}.fused_output_quant_supported",
        f"{_BUILDER}.__init__",
        f"{_BUILDER}.build",
        f"{_BUILDER}.get_cudagraph_support",
        f"{_BUILDER}.use_cascade_attention",
        f"{_BUILDER}._get_workspace_buffer",
    ),
    "register_kv_cache_dtypes": (
        REGISTRY_TARGET,
        f"{_BACKEND}.supports_kv_cache_dtype",
        DTYPE_REGISTRY_TARGET,
    ),
    REFUSE_ID: (
        REGISTRY_TARGET,
        f"{_BACKEND}.supports_kv_cache_dtype",
        f"{_BACKEND}.supports_combination",
        f"{_BACKEND}.get_builder_cls",
        f"{_BACKEND}.get_impl_cls",
        f"{_BUILDER}.__init__",
        f"{_BUILDER}.get_cudagraph_support",
        f"{_IMPL}.__init__",
    ),
}

# Memoised vLLM functions whose answers depend on the FLASHINFER class: cleared on apply and unpatch
# (only where their module is already imported: an unimported module has nothing cached).
MEMOISED: tuple[tuple[str, str], ...] = (
    ("vllm.v1.attention.selector", "_cached_get_attn_backend"),
    ("vllm.platforms.cuda", "_get_backend_priorities"),
    ("vllm.utils.flashinfer", "supports_trtllm_attention"),
)


def clear_memoised() -> list[str]:
    """Clear the caches of :data:`MEMOISED` functions in imported modules; return their names.

    ``vllm.v1.attention.backends.flashinfer`` binds ``supports_trtllm_attention`` by name (``from
    vllm.utils.flashinfer import ...``); the copy is the same cached object, so clearing it once
    clears both namespaces.
    """
    cleared = []
    for module_name, name in MEMOISED:
        module = sys.modules.get(module_name)
        func = getattr(module, name, None) if module is not None else None
        if isinstance(func, functools._lru_cache_wrapper):
            func.cache_clear()
            cleared.append(f"{module_name}.{name}")
    return cleared


def _register_override(ledger: Ledger, patch_id: str) -> None:
    """Point FLASHINFER at the nvfp4compat subclass with vLLM's ``register_backend``."""
    from vllm.v1.attention.backends import registry

    enum = registry.AttentionBackendEnum.FLASHINFER
    current = registry._ATTN_OVERRIDES.get(enum)
    if REGISTRY_TARGET not in ledger and current not in (None, OVERRIDE_PATH):
        raise RuntimeError(
            f"FLASHINFER is already overridden by {current!r} (another plugin); nvfp4compat will not "
            "replace it. Way out: load one of the two plugins (VLLM_PLUGINS=<name>)"
        )
    ledger.record_item(patch_id, REGISTRY_TARGET, registry._ATTN_OVERRIDES, enum)
    registry.register_backend(enum, OVERRIDE_PATH)
    if registry._ATTN_OVERRIDES.get(enum) != OVERRIDE_PATH:
        raise RuntimeError(
            f"register_backend(FLASHINFER, {OVERRIDE_PATH!r}) did not take effect in this vLLM "
            f"(override table holds {registry._ATTN_OVERRIDES.get(enum)!r})"
        )


def _apply(ledger: Ledger, patch_id: str) -> None:
    _register_override(ledger, patch_id)
    for target in PATCH_TARGETS[patch_id][1:]:
        ledger.note_override(patch_id, target)


def apply_gate_nvfp4(ledger: Ledger) -> None:
    """FLASHINFER accepts ``--kv-cache-dtype nvfp4`` on this GPU (vLLM <= 0.31 requires SM100)."""
    _apply(ledger, "gate_nvfp4")


def apply_gate_nvfp4_4over6(ledger: Ledger) -> None:
    """FLASHINFER accepts ``nvfp4_4over6``: the bound writer is Triton with the 4over6 scale search."""
    _apply(ledger, "gate_nvfp4_4over6")


def apply_gate_combination(ledger: Ledger) -> None:
    """FLASHINFER accepts head_size 64 and attention sinks with NVFP4: the Triton readers serve them."""
    _apply(ledger, "gate_combination")


def apply_metadata_builder(ledger: Ledger) -> None:
    """NVFP4 layers get nvfp4compat's builder: block table, seq_lens, query_start_loc, split."""
    _apply(ledger, "metadata_builder")


def apply_kv_cache_update(ledger: Ledger) -> None:
    """The NVFP4 KV write goes to the bound writer, never to ``reshape_and_cache_flash``."""
    _apply(ledger, "kv_cache_update")


def apply_forward_reader(ledger: Ledger) -> None:
    """NVFP4 decode/prefill go to the bound readers."""
    _apply(ledger, "forward_reader")


def apply_register_kv_cache_dtypes(ledger: Ledger, names: list[str] | tuple[str, ...] = ()) -> None:
    """The rotated cache's own ``--kv-cache-dtype`` names become valid in vLLM (``register_kv_cache_dtype``,
    0.33+): stored as uint8 NVFP4 pages (``KVQuantMode.NVFP4``), accepted by the gate for their route."""
    _register_override(ledger, "register_kv_cache_dtypes")
    ledger.note_override("register_kv_cache_dtypes", PATCH_TARGETS["register_kv_cache_dtypes"][1])
    for name in names:
        _register_dtype(ledger, name)


def _register_dtype(ledger: Ledger, name: str) -> None:
    """``vllm.config.cache.register_kv_cache_dtype(name)`` with an NVFP4 handler, recorded for unpatch."""
    import torch
    from vllm.config import cache

    if not (hasattr(cache, "register_kv_cache_dtype") and hasattr(cache, "is_known_kv_cache_dtype")):
        import vllm

        raise RuntimeError(
            f"the plan registers --kv-cache-dtype {name!r}, but the installed vLLM {getattr(vllm, '__version__', '?')} "
            "has no vllm.config.cache.register_kv_cache_dtype (0.33.0+ has it; the plan was made for another "
            "release). Way out: NVFP4COMPAT_KV_ROTATION=hadamard with --kv-cache-dtype nvfp4"
        )
    from vllm.utils import torch_utils
    from vllm.v1.kv_cache_interface import KVQuantMode

    if cache.is_known_kv_cache_dtype(name):
        raise RuntimeError(
            f"--kv-cache-dtype {name!r} is already known to this vLLM (another plugin, or vLLM itself); "
            "nvfp4compat will not replace it. Way out: NVFP4COMPAT_KV_ROTATION=hadamard with --kv-cache-dtype nvfp4"
        )

    class _Handler:
        def torch_dtype(self) -> torch.dtype:
            return torch.uint8

        def quant_mode(self) -> KVQuantMode:
            return KVQuantMode.NVFP4

    _Handler.name = name  # type: ignore[attr-defined]
    _Handler.__qualname__ = _Handler.__name__ = f"Nvfp4compatDtype_{name}"

    def undo() -> None:
        if name in cache.KV_CACHE_DTYPES:
            cache.KV_CACHE_DTYPES.remove(name)
        cache._KV_CACHE_DTYPE_HANDLERS.pop(name, None)
        torch_utils.STR_DTYPE_TO_TORCH_DTYPE.pop(name, None)

    cache.register_kv_cache_dtype(name)(_Handler)
    ledger.record_registered("register_kv_cache_dtypes", DTYPE_REGISTRY_TARGET, name, cache.is_known_kv_cache_dtype, undo)


def apply_refuse_nvfp4(ledger: Ledger) -> None:
    """NVFP4 is refused at engine start with the route's message (no writer can be bound)."""
    _apply(ledger, REFUSE_ID)


APPLY: dict[str, Callable[[Ledger], None]] = {
    "gate_nvfp4": apply_gate_nvfp4,
    "gate_nvfp4_4over6": apply_gate_nvfp4_4over6,
    "gate_combination": apply_gate_combination,
    "metadata_builder": apply_metadata_builder,
    "kv_cache_update": apply_kv_cache_update,
    "forward_reader": apply_forward_reader,
    "register_kv_cache_dtypes": apply_register_kv_cache_dtypes,
    REFUSE_ID: apply_refuse_nvfp4,
}


def apply_route(
    ledger: Ledger, route: VllmRoute | None, dtype_routes: Mapping[str, VllmRoute] | None = None
) -> list[str]:
    """Apply every patch of ``route`` and of the registered names' ``dtype_routes``, each id once, in
    order; return the patch ids applied."""
    ids: list[str] = []
    if route is not None:
        ids += [REFUSE_ID] if route.refusal is not None else list(route.patches)
    for dr in (dtype_routes or {}).values():
        ids += [pid for pid in dr.patches if pid not in ids]
    names = [name for name, dr in (dtype_routes or {}).items() if dr.kv_cache_dtype == name]
    for patch_id in ids:
        if patch_id == "register_kv_cache_dtypes":
            apply_register_kv_cache_dtypes(ledger, names)
        else:
            APPLY[patch_id](ledger)
    return ids
