"""The route active in this process, read by the backend subclasses at every decision.

Kept apart from :mod:`nvfp4compat.vllm_plugin` so that :mod:`nvfp4compat.vllm_plugin.backend`
(imported by vLLM through the registry override) and the plugin entry point share it without an
import cycle. Nothing here imports vLLM.
"""

from __future__ import annotations

from nvfp4compat.plan import VllmRoute

__all__ = ["route", "set_route"]

_ROUTE: VllmRoute | None = None


def route() -> VllmRoute | None:
    """The route applied in this process, or None when the plugin leaves vLLM untouched."""
    return _ROUTE


def set_route(new: VllmRoute | None) -> None:
    """Install ``new`` as this process's route (None clears it)."""
    global _ROUTE
    _ROUTE = new
