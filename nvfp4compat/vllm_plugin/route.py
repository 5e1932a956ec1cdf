"""From a resolved :class:`~nvfp4compat.plan.Plan` to what the plugin does inside vLLM.

:func:`route_from_plan` is pure (no vLLM, torch or FlashInfer import): it reads the plan fields
listed in ``docs/architecture.md`` (``supported``, ``reason``, ``bindings``, ``vllm.strategy``,
``vllm.patches``) and returns a frozen :class:`Route` that the backend subclasses in
:mod:`nvfp4compat.vllm_plugin.backend` consult at every decision. The strategy and the patch list
come from the matrix through the plan; nothing here branches on a vLLM version.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Every patch id the matrix may name (matrix/vllm.yaml), in application order.
from nvfp4compat.spec import PATCH_IDS

__all__ = [
    "PATCH_IDS",
    "NO_WRITER_ERROR",
    "Route",
    "RouteError",
    "route_from_plan",
]


NO_WRITER_ERROR = "FlashInfer NVFP4 slot-mapping KV cache update is required"
_READ_OPS = ("decode", "prefill")


class RouteError(ValueError):
    """The plan asks for something this plugin cannot do (a matrix/plugin mismatch)."""


@dataclass(frozen=True)
class Route:
    """What the plugin does for NVFP4 KV-cache layers in this process.

    Attributes
    ----------
    strategy : str
        ``"backport"`` or ``"extend"`` (``"none"``/``"native"`` produce no route), or the plan's
        strategy for a refusal route.
    patches : tuple[str, ...]
        Patch ids applied, in :data:`PATCH_IDS` order.
    accept : frozenset[str]
        ``--kv-cache-dtype`` values the patched FLASHINFER gate accepts on top of vLLM's own answer.
    combination : bool
        head_size 64 and attention sinks are accepted for NVFP4 (the Triton readers serve them).
    own_builder : bool
        NVFP4 layers get nvfp4compat's metadata builder (block table, seq_lens, query_start_loc,
        decode/prefill split; no FlashInfer wrapper planning, model-dtype query, no FP8 output):
        with ``metadata_builder``, or whenever both phases are read by nvfp4compat.
    write : str or None
        Implementation (``"flashinfer"``/``"triton"``) the KV write is routed to; None leaves vLLM's.
    write_4over6 : bool
        The bound writer implements the ``nvfp4_4over6`` scale search.
    read : dict[str, str]
        ``{"decode": impl, "prefill": impl}`` for the phases routed to nvfp4compat's readers; a phase
        absent from it stays on vLLM's own reader.
    kv_rotation : str or None
        ``"hadamard"``: the plan's cache is rotated; the backend wraps the routed writer and readers
        with :func:`nvfp4compat.kernels.rotation.rotated` (it routes all of them then).
    refusal : str or None
        When set, NVFP4 is refused in this process with the plan's reason (e.g. "FlashInfer NVFP4
        slot-mapping KV cache update is required: ..."): the gate reports it as the validation
        reason and the builder/impl constructors raise it (engine start, never mid-request).
    plan : object
        The plan the route was made from.
    """

    strategy: str
    patches: tuple[str, ...]
    accept: frozenset[str] = frozenset()
    combination: bool = False
    own_builder: bool = False
    write: str | None = None
    write_4over6: bool = False
    read: dict[str, str] = field(default_factory=dict)
    kv_rotation: str | None = None
    refusal: str | None = None
    plan: Any = None

    def handles(self, kv_cache_dtype: str | None) -> bool:
        """Whether layers with this ``kv_cache_dtype`` are NVFP4 layers this route acts on."""
        return (
            bool(kv_cache_dtype)
            and str(kv_cache_dtype).startswith("nvfp4")
            and not str(kv_cache_dtype).endswith("_ds_mla")
        )

    @property
    def reads_all(self) -> bool:
        """Both decode and prefill are served by nvfp4compat's readers."""
        return all(op in self.read for op in _READ_OPS)


def _binding_impl(plan: Any, op: str) -> str | None:
    binding = (getattr(plan, "bindings", None) or {}).get(op)
    return None if binding is None else getattr(binding, "impl", None)


def _binding_options(plan: Any, op: str) -> dict[str, Any]:
    binding = (getattr(plan, "bindings", None) or {}).get(op)
    return dict(getattr(binding, "options", None) or {}) if binding is not None else {}


def route_from_plan(plan: Any, *, refuse_here: bool = False) -> Route | None:
    """The route for ``plan``; None when vLLM is to be left untouched.

    Parameters
    ----------
    plan : nvfp4compat.plan.Plan
        A resolved plan.
    refuse_here : bool
        The plan is unsupported, but the matrix would serve this GPU and vLLM release with a
        different install (e.g. a FlashInfer with the slot-mapping writer, or Triton): NVFP4 is then
        refused at engine start with the plan's reason (a refusal route) instead of vLLM's generic
        "kv_cache_dtype not supported". The caller decides it (:func:`nvfp4compat.vllm_plugin.register`
        re-resolves with Triton available).

    Returns
    -------
    Route or None
        None for strategy ``"none"``/``"native"``, for a plan without patches (vLLM's own path is
        the plan) or without a vLLM section, unless ``refuse_here``.

    Raises
    ------
    RouteError
        When the plan names a patch id this plugin does not know, or binds a reader the strategy
        cannot route (the message names what was found and what is allowed).
    """
    vllm_plan = getattr(plan, "vllm", None)
    strategy = getattr(vllm_plan, "strategy", None) or "none"
    if not getattr(plan, "supported", False):
        if not refuse_here:
            return None
        facts = getattr(plan, "facts", None)
        where = f"{getattr(facts, 'arch', None) or 'this GPU'} with vLLM {getattr(facts, 'vllm', None) or '?'}"
        return Route(
            strategy=strategy,
            patches=(),
            accept=frozenset({"nvfp4", "nvfp4_4over6"}),
            refusal=f"nvfp4compat refuses --kv-cache-dtype nvfp4 on {where}: {plan.reason}",
            plan=plan,
        )
    if strategy in ("none", "native"):
        return None
    if strategy not in ("backport", "extend"):
        raise RouteError(
            f"plan.vllm.strategy is {strategy!r}; known strategies: none, native, backport, extend"
        )
    named = list(getattr(vllm_plan, "patches", None) or [])
    unknown = [p for p in named if p not in PATCH_IDS]
    if unknown:
        raise RouteError(f"plan names unknown vLLM patch ids {unknown}; known: {list(PATCH_IDS)}")
    patches = tuple(p for p in PATCH_IDS if p in named)
    write = _binding_impl(plan, "write")

    read: dict[str, str] = {}
    if "forward_reader" in patches:
        for op in _READ_OPS:
            impl = _binding_impl(plan, op)
            if impl in ("triton", "dequant_fa3"):  # nvfp4compat's own readers (dequant_fa3: prefill)
                read[op] = impl
            elif strategy == "backport":
                raise RouteError(
                    f"the plan binds {op}={impl} for a vLLM backport; nvfp4compat's backport routes "
                    "reads to the Triton kernels only (FlashInfer's FA2 reader inside vLLM needs "
                    "vLLM >= 0.32). Way out: NVFP4COMPAT_IMPL=decode=triton,prefill=triton"
                )
    elif strategy == "backport":
        raise RouteError(
            f"a backport plan without forward_reader ({list(patches)}) would leave vLLM's "
            "trtllm-gen-only reader in place, which cannot run on this GPU"
        )
    reads_all = all(op in read for op in _READ_OPS)
    if "metadata_builder" in patches and not reads_all:
        raise RouteError(
            "metadata_builder needs both decode and prefill on the Triton reader; the plan binds "
            f"decode={_binding_impl(plan, 'decode')}, prefill={_binding_impl(plan, 'prefill')}"
        )
    if "gate_combination" in patches and not reads_all:
        raise RouteError(
            "gate_combination (head_size 64, sinks) needs both readers on Triton; the plan binds "
            f"decode={_binding_impl(plan, 'decode')}, prefill={_binding_impl(plan, 'prefill')}"
        )

    accept = set()
    if "gate_nvfp4" in patches:
        accept.add("nvfp4")
    write_4over6 = bool(_binding_options(plan, "write").get("nvfp4_4over6"))
    if "gate_nvfp4_4over6" in patches:
        if not (write == "triton" and write_4over6 and "kv_cache_update" in patches):
            raise RouteError(
                "gate_nvfp4_4over6 needs the Triton writer with the 4over6 scale search routed by "
                f"kv_cache_update; the plan binds write={write} options="
                f"{_binding_options(plan, 'write')} patches={list(patches)}"
            )
        accept.add("nvfp4_4over6")
    if "kv_cache_update" in patches and write not in ("flashinfer", "triton"):
        raise RouteError(
            f"kv_cache_update needs write=flashinfer or triton, the plan binds {write}"
        )
    rotation = getattr(plan, "kv_rotation", None)
    if rotation is not None and ("kv_cache_update" not in patches or not reads_all):
        raise RouteError(
            f"the plan rotates the KV cache ({rotation}) but does not route the writer and both "
            f"readers to nvfp4compat (patches {list(patches)}, reads {read}); vLLM's own code would "
            "read a rotated cache unrotated. Way out: unset NVFP4COMPAT_KV_ROTATION"
        )
    if not patches:
        return None  # e.g. extend where vLLM's own path already is the plan

    return Route(
        strategy=strategy,
        patches=patches,
        accept=frozenset(accept),
        combination="gate_combination" in patches,
        # With both phases on nvfp4compat's readers, vLLM's builder would only plan FlashInfer
        # wrappers nobody runs (and 0.32+'s refuses head_size 64 and sinks for NVFP4).
        own_builder="metadata_builder" in patches or reads_all,
        write=write if "kv_cache_update" in patches else None,
        write_4over6=write_4over6,
        read=read,
        kv_rotation=rotation,
        plan=plan,
    )
