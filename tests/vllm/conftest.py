"""Fixtures for the tests against real vLLM releases (``pytest tests/vllm``).

Run inside a venv made by ``scripts/vllm_cpu_env.sh <release>``; without vLLM every test here is
skipped. Every test here that uses vLLM (the ``cpu_vllm`` fixture) is marked ``vllm``; the rest (the
patch-ledger table, route logic) run in any venv. The machine shims (faked capability, stubbed
CUDA-only extensions) are in ``vllm_cpu_support.py``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from vllm_cpu_support import HAVE_VLLM, NO_VLLM_REASON, CpuVllm, clear_vllm_caches, setup_cpu_vllm


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.fspath).startswith(here) and "cpu_vllm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(scope="session")
def cpu_vllm() -> CpuVllm:
    if not HAVE_VLLM:
        pytest.skip(NO_VLLM_REASON)
    return setup_cpu_vllm()


@pytest.fixture
def clean_plugin(cpu_vllm: CpuVllm) -> Iterator[None]:
    """No nvfp4compat patch before and after the test; the entry point may load again."""
    import vllm.plugins

    from nvfp4compat import vllm_plugin

    vllm_plugin.unpatch()
    vllm.plugins.plugins_loaded = False
    saved = {
        k: os.environ.get(k)
        for k in ("NVFP4COMPAT_ARCH", "NVFP4COMPAT_DISABLE_TRITON", "NVFP4COMPAT_IMPL")
    }
    yield
    vllm_plugin.unpatch()
    vllm.plugins.plugins_loaded = False
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    clear_vllm_caches()
