"""The routes active in this process, read by the backend subclasses at every decision.

Kept apart from :mod:`nvfp4compat.vllm_plugin` so that :mod:`nvfp4compat.vllm_plugin.backend`
(imported by vLLM through the registry override) and the plugin entry point share them without an
import cycle. Nothing here imports vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping

from nvfp4compat.plan import VllmRoute

__all__ = ["route", "set_route", "dtype_routes", "route_for"]

_ROUTE: VllmRoute | None = None
_DTYPE_ROUTES: dict[str, VllmRoute] = {}


def route() -> VllmRoute | None:
    """The route applied in this process, or None when the plugin leaves vLLM untouched."""
    return _ROUTE


def dtype_routes() -> dict[str, VllmRoute]:
    """The routes of the ``--kv-cache-dtype`` names the plugin registered with vLLM in this process."""
    return dict(_DTYPE_ROUTES)


def set_route(new: VllmRoute | None, by_dtype: Mapping[str, VllmRoute] | None = None) -> None:
    """Install ``new`` as this process's route and ``by_dtype`` as its registered names' routes (None
    clears them)."""
    global _ROUTE
    _ROUTE = new
    _DTYPE_ROUTES.clear()
    _DTYPE_ROUTES.update(by_dtype or {})


def route_for(kv_cache_dtype: str | None) -> VllmRoute | None:
    """The route acting on layers of ``kv_cache_dtype``: a registered name's own route, else the process
    route when it handles that dtype; None when vLLM's own code serves it."""
    own = _DTYPE_ROUTES.get(str(kv_cache_dtype or ""))
    if own is not None:
        return own
    if _ROUTE is None or not _ROUTE.handles(kv_cache_dtype):
        return None
    return _ROUTE
