"""The vLLM general plugin: ``--kv-cache-dtype nvfp4`` on GPUs and releases where vLLM lacks it.

vLLM calls :func:`register` (entry point ``vllm.general_plugins: nvfp4compat``) once in every
process -- API server, engine core, each worker -- before the model and attention selection exist.
It detects the system, asks the resolver for a plan, sets the plan's environment (before FlashInfer is
first imported), applies the plan's vLLM patches and logs one INFO line saying what it bound and why.
It never raises: where NVFP4 cannot be served it leaves vLLM untouched and says why, except that
when no KV writer can be bound on an otherwise servable GPU it makes NVFP4 fail at engine start with
"FlashInfer NVFP4 slot-mapping KV cache update is required" (found, needed, way out).

The patches (``docs/patches.md``) are a subclass of vLLM's FlashInfer backend registered over
``AttentionBackendEnum.FLASHINFER``; every change is recorded in the ledger :data:`_PATCHES`, and
:func:`unpatch` restores every original.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from nvfp4compat.vllm_plugin import state
from nvfp4compat.vllm_plugin.ledger import Ledger
from nvfp4compat.vllm_plugin.patches import PATCH_TARGETS, apply_route, clear_memoised
from nvfp4compat.vllm_plugin.route import NO_WRITER_ERROR, Route, RouteError, route_from_plan

__all__ = [
    "register",
    "apply",
    "unpatch",
    "applied",
    "active_route",
    "last_plan",
    "summary_line",
    "PATCH_TARGETS",
    "NO_WRITER_ERROR",
]

# vLLM configures the "vllm" logger; a child logger lands in vLLM's log with vLLM's format.
logger = logging.getLogger("vllm.nvfp4compat")

_PATCHES = Ledger()
_REGISTERED = False
_LAST_PLAN: Any = None


def last_plan() -> Any:
    """The plan :func:`register` resolved last in this process (None before, or when it failed)."""
    return _LAST_PLAN


def active_route() -> Route | None:
    """The route applied in this process (None when vLLM is untouched)."""
    return state.route()


def applied() -> dict[str, list[str]]:
    """``{target: [patch ids]}`` of every target the plugin changed in this process."""
    return _PATCHES.targets()


def _fact(plan: Any, *names: str) -> Any:
    facts = getattr(plan, "facts", None)
    for name in names:
        value = getattr(facts, name, None)
        if value is not None:
            return value
    return None


def _arch(plan: Any) -> str:
    arch = _fact(plan, "arch")
    if arch is None:
        return "no GPU"
    text = str(arch)
    return text if text.startswith("sm_") else f"sm_{text}"


def summary_line(plan: Any, route: Route | None) -> str:
    """The one INFO line: facts, strategy, patches, each binding (with its reason where it is not
    the matrix's preference), and the environment set.

    ``op=vllm(impl)`` marks an op the plan leaves to vLLM's own code (e.g. vLLM 0.33's FlashInfer
    writer under ``extend``).
    """
    vllm_v = _fact(plan, "vllm") or "?"
    fi_v = _fact(plan, "flashinfer") or "not installed"
    head = f"nvfp4compat: vLLM {vllm_v} on {_arch(plan)} with FlashInfer {fi_v}"
    planned_from = getattr(plan, "planned_from", None) or {}
    if planned_from:
        basis = ", ".join(f"{k} {v}" for k, v in planned_from.items())
        head += f" (UNVERIFIED: planned from the nearest release in the matrix: {basis})"
    vllm_plan = getattr(plan, "vllm", None)
    strategy = getattr(vllm_plan, "strategy", None) or "none"
    if route is not None and route.refusal is not None:
        return f"{head}: --kv-cache-dtype nvfp4 will fail at engine start: {plan.reason}"
    if route is None:
        reason = (
            getattr(plan, "reason", None)
            or getattr(vllm_plan, "reason", None)
            or "the plan binds no vLLM patch"
        )
        return f"{head}: {strategy} ({reason}); vLLM left untouched"
    parts = []
    bindings = getattr(plan, "bindings", None) or {}
    for op in ("write", "decode", "prefill"):
        binding = bindings.get(op)
        impl = getattr(binding, "impl", None)
        routed = (op == "write" and route.write is not None) or op in route.read
        text = f"{op}={impl}" if routed else f"{op}=vllm({impl})"
        # The matrix's own preference needs no comment here (``nvfp4compat doctor`` prints it);
        # a fallback, an override or a probe says why.
        why = getattr(binding, "reason", None)
        if why and getattr(binding, "source", "matrix") != "matrix":
            text += f" ({why})"
        parts.append(text)
    env = getattr(plan, "env", None) or {}
    tail = f"; env {', '.join(f'{k}={v}' for k, v in env.items())}" if env else ""
    return f"{head}: {strategy} [{', '.join(route.patches)}]; {', '.join(parts)}{tail}"


def _set_plan_env(plan: Any) -> None:
    """Set ``plan.env`` in ``os.environ``; warn when FlashInfer was imported before (too late)."""
    env = dict(getattr(plan, "env", None) or {})
    if not env:
        return
    already = "flashinfer" in sys.modules
    for key, value in env.items():
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


def apply(plan: Any, *, refuse_here: bool = False) -> Route | None:
    """Apply ``plan`` to vLLM in this process (replacing what an earlier call applied).

    Parameters
    ----------
    plan : nvfp4compat.plan.Plan
        A resolved plan.
    refuse_here : bool
        For an unsupported plan on a GPU and vLLM release the matrix serves with another install:
        make NVFP4 fail at engine start with the plan's reason (see :func:`route_from_plan`).

    Returns
    -------
    Route or None
        The route applied, or None when vLLM is left untouched.

    Raises
    ------
    RouteError
        When the plan asks for something the plugin cannot do; nothing is left applied.
    RuntimeError
        When vLLM refuses the override (e.g. another plugin holds FLASHINFER); nothing is left
        applied.
    """
    global _REGISTERED
    unpatch()
    route = route_from_plan(plan, refuse_here=refuse_here)
    if getattr(plan, "supported", False):
        _set_plan_env(plan)
    if route is not None:
        state.set_route(route)
        try:
            apply_route(_PATCHES, route)
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


def _resolve_here() -> tuple[Any, bool]:
    """Detect this process's system and resolve its plan; also say whether to refuse here.

    Returns ``(plan, refuse_here)``. ``refuse_here`` is True for an unsupported plan that would
    serve this GPU and vLLM release if Triton were available (the same facts re-resolved with
    Triton present and enabled): the refusal is then about this install (no KV writer, Triton
    disabled or missing), so NVFP4 must fail at engine start with the plan's reason. Where even that
    plan has no vLLM strategy (SM75, SM110 family, an unknown vLLM) vLLM is left untouched.
    """
    from nvfp4compat import detect, load_matrix, resolve

    matrix = load_matrix()
    facts = detect()
    plan = resolve(matrix, facts)
    refuse_here = False
    if not plan.supported and plan.vllm is not None:
        with_triton = facts.model_copy(
            update={"triton": facts.triton or "any", "triton_disabled": False}
        )
        alternative = resolve(matrix, with_triton)
        refuse_here = alternative.vllm is not None and alternative.vllm.strategy in (
            "backport",
            "extend",
        )
    return plan, refuse_here


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
        plan, refuse_here = _resolve_here()
    except Exception as exc:
        logger.warning(
            "nvfp4compat: could not resolve a plan (%s: %s); vLLM left untouched",
            type(exc).__name__,
            exc,
        )
        return
    _LAST_PLAN = plan
    try:
        route = apply(plan, refuse_here=refuse_here)
    except (RouteError, RuntimeError) as exc:
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
    logger.info("%s [pid %d]", summary_line(plan, route), os.getpid())
    release_warnings = getattr(plan, "release_warnings", None) or []
    for warning in release_warnings:  # a release not in the matrix: always said, supported or not
        logger.warning("nvfp4compat: %s", warning)
    if getattr(plan, "supported", False):
        for warning in getattr(plan, "warnings", None) or []:
            if warning not in release_warnings:
                logger.warning("nvfp4compat: %s", warning)
