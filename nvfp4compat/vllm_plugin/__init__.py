"""The vLLM general plugin: ``--kv-cache-dtype nvfp4`` on GPUs and releases where vLLM lacks it.

vLLM calls :func:`register` (entry point ``vllm.general_plugins: nvfp4compat``) once in every
process -- API server, engine core, each worker -- before the model and attention selection exist.
It detects the system, asks the resolver for a plan (once), sets the plan's environment (before
FlashInfer is first imported), applies the plan's route (``plan.vllm.route``, decided by the resolver
and printed by ``nvfp4compat query``) and logs one INFO line saying what it bound and why. It decides
nothing itself and never raises: a plan without a route leaves vLLM untouched, and a refusal route
(e.g. no KV writer on an otherwise servable GPU: "FlashInfer NVFP4 slot-mapping KV cache update is
required", found, needed, way out) makes NVFP4 fail at engine start with the plan's reason.

The patches (``docs/patches.md``) are a subclass of vLLM's FlashInfer backend registered over
``AttentionBackendEnum.FLASHINFER``; every change is recorded in the ledger :data:`_PATCHES`, and
:func:`unpatch` restores every original.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING

from nvfp4compat.resolver import WRITER_REQUIRED
from nvfp4compat.vllm_plugin import state
from nvfp4compat.vllm_plugin.ledger import Ledger
from nvfp4compat.vllm_plugin.patches import PATCH_TARGETS, apply_route, clear_memoised

if TYPE_CHECKING:
    from nvfp4compat.plan import Plan, VllmRoute

__all__ = [
    "register",
    "apply",
    "unpatch",
    "applied",
    "active_route",
    "last_plan",
    "route_of",
    "summary_line",
    "PATCH_TARGETS",
    "WRITER_REQUIRED",
]

# vLLM configures the "vllm" logger; a child logger lands in vLLM's log with vLLM's format.
logger = logging.getLogger("vllm.nvfp4compat")

_PATCHES = Ledger()
_REGISTERED = False
_LAST_PLAN: Plan | None = None


def last_plan() -> Plan | None:
    """The plan :func:`register` resolved last in this process (None before, or when it failed)."""
    return _LAST_PLAN


def active_route() -> VllmRoute | None:
    """The route applied in this process (None when vLLM is untouched)."""
    return state.route()


def applied() -> dict[str, list[str]]:
    """``{target: [patch ids]}`` of every target the plugin changed in this process."""
    return _PATCHES.targets()


def route_of(plan: Plan) -> VllmRoute | None:
    """The route :func:`apply` applies for ``plan``: ``plan.vllm.route`` (None: vLLM untouched)."""
    return plan.vllm.route if plan.vllm is not None else None


def summary_line(plan: Plan) -> str:
    """The one INFO line: facts, then the route as ``nvfp4compat query`` prints it
    (:meth:`~nvfp4compat.plan.VllmRoute.describe`), each binding that is not the matrix's preference
    with its reason, and the environment set."""
    f = plan.facts
    arch = f.arch or "no GPU"
    head = f"nvfp4compat: vLLM {f.vllm or '?'} on {arch} with FlashInfer {f.flashinfer or 'not installed'}"
    if plan.planned_from:
        basis = ", ".join(f"{k} {v}" for k, v in plan.planned_from.items())
        head += f" (UNVERIFIED: planned from the nearest release in the matrix: {basis})"
    route = route_of(plan)
    by_dtype = plan.vllm.dtype_routes if plan.vllm is not None else {}
    registered = "".join(
        f"; --kv-cache-dtype {name} registered: {dr.base_dtype} with kv_rotation={dr.kv_rotation} "
        f"(write={dr.write or 'vllm'}, decode={dr.read.get('decode', 'vllm')}, prefill={dr.read.get('prefill', 'vllm')})"
        for name, dr in by_dtype.items()
    )
    if route is None:
        vp = plan.vllm
        strategy = vp.strategy if vp is not None else "none"
        reason = plan.reason or (vp.reason if vp is not None else None) or "the plan binds no vLLM patch"
        if registered:
            return f"{head}: {strategy} ({reason}); nvfp4 left to vLLM{registered}"
        return f"{head}: {strategy} ({reason}); vLLM left untouched"
    if route.refusal is not None:
        return f"{head}: {route.describe()}"
    # The matrix's own preference needs no comment here (``nvfp4compat doctor`` prints it);
    # a fallback, an override or a probe says why.
    why = [
        f"{op}: {b.reason}" for op in ("write", "decode", "prefill")
        if (b := plan.bindings[op]).source != "matrix"
    ]  # fmt: skip
    tail = f"; {'; '.join(why)}" if why else ""
    tail += registered
    if plan.env:
        tail += f"; env {', '.join(f'{k}={v}' for k, v in plan.env.items())}"
    return f"{head}: {route.describe()}{tail}"


def _set_plan_env(plan: Plan) -> None:
    """Set ``plan.env`` in ``os.environ``; warn when FlashInfer was imported before (too late)."""
    already = "flashinfer" in sys.modules
    for key, value in plan.env.items():
        if os.environ.get(key) == str(value):
            continue
        os.environ[key] = str(value)
        if already:
            logger.warning(
                "nvfp4compat: set %s=%s after FlashInfer was already imported in this process; it "
                "takes effect in processes that import FlashInfer later. If `import flashinfer` "
                "failed here, export %s=%s before starting vLLM",
                key, value, key, value,
            )  # fmt: skip


def apply(plan: Plan) -> VllmRoute | None:
    """Apply ``plan``'s route to vLLM in this process (replacing what an earlier call applied).

    Parameters
    ----------
    plan : nvfp4compat.plan.Plan
        A resolved plan; its ``vllm.route`` is applied as it is.

    Returns
    -------
    VllmRoute or None
        The route applied, or None when vLLM is left untouched.

    Raises
    ------
    RuntimeError
        When vLLM refuses the override (e.g. another plugin holds FLASHINFER); nothing is left
        applied.
    """
    global _REGISTERED
    unpatch()
    route = route_of(plan)
    by_dtype = dict(plan.vllm.dtype_routes) if plan.vllm is not None else {}
    if plan.supported:
        _set_plan_env(plan)
    if route is not None or by_dtype:
        state.set_route(route, by_dtype)
        try:
            apply_route(_PATCHES, route, by_dtype)
        except BaseException:
            unpatch()
            raise
        clear_memoised()
    _REGISTERED = True  # an explicit apply() is not replaced by vLLM's later call of register()
    return route


def unpatch() -> list[str]:
    """Restore every original the plugin changed; return the targets in the order restored.

    Also clears vLLM's memoised selection functions and lets :func:`register` run again.
    """
    global _REGISTERED
    restored = _PATCHES.restore_all()
    state.set_route(None)
    clear_memoised()
    _REGISTERED = False
    return restored


def _resolve_here() -> Plan:
    """Detect this process's system and resolve its plan (once: the plan holds the whole decision)."""
    from nvfp4compat import detect, load_matrix, resolve

    return resolve(load_matrix(), detect())


def register() -> None:
    """vLLM ``general_plugins`` entry point: detect, resolve, apply, log one line. Never raises.

    Idempotent within a process (a module flag; :func:`unpatch` resets it). Cheap: it imports the
    resolver and vLLM's backend registry, never vLLM's FlashInfer backend module.
    """
    global _REGISTERED, _LAST_PLAN
    if _REGISTERED:
        return
    _REGISTERED = True
    _LAST_PLAN = None
    try:
        plan = _resolve_here()
    except Exception as exc:
        logger.warning(
            "nvfp4compat: could not resolve a plan (%s: %s); vLLM left untouched",
            type(exc).__name__,
            exc,
        )
        return
    _LAST_PLAN = plan
    try:
        try:
            apply(plan)
        except RuntimeError as exc:
            if plan.vllm is None or not plan.vllm.dtype_routes:
                raise
            # a registered name clashes (another plugin, or a vLLM that has it): serve the rest of the plan
            logger.warning("nvfp4compat: %s; the rotated --kv-cache-dtype names are not registered", exc)
            plan = plan.model_copy(update={"vllm": plan.vllm.model_copy(update={
                "dtype_routes": {},
                "kv_cache_dtypes": [d for d in plan.vllm.kv_cache_dtypes if d not in plan.vllm.dtype_routes],
            })})  # fmt: skip
            _LAST_PLAN = plan
            apply(plan)
    except RuntimeError as exc:
        logger.warning("nvfp4compat: %s; vLLM left untouched", exc)
        _REGISTERED = True  # apply() restored everything; do not retry in this process
        return
    except Exception as exc:  # e.g. a vLLM whose layout differs from the one the patches expect
        logger.warning("nvfp4compat: applying the plan failed (%s: %s); vLLM left untouched", type(exc).__name__, exc)
        logger.debug("nvfp4compat: traceback of the failed apply", exc_info=True)
        _REGISTERED = True
        return
    # the pid tells the processes apart (API, EngineCore, every tensor-parallel worker): a worker
    # logs this before vLLM prefixes its lines with "(Worker_TP1 pid=...)"
    logger.info("%s [pid %d]", summary_line(plan), os.getpid())
    for warning in plan.release_warnings:  # a release not in the matrix: always said, supported or not
        logger.warning("nvfp4compat: %s", warning)
    if plan.supported:
        for warning in plan.warnings:
            if warning not in plan.release_warnings:
                logger.warning("nvfp4compat: %s", warning)
