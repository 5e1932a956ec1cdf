"""Test-suite set-up shared by every tier.

On a machine without a CUDA GPU the Triton kernels run under the interpreter: ``TRITON_INTERPRET=1``
must be set before triton is first imported, so it is decided here, ahead of every test module.
Tests marked ``gpu`` are skipped there.
"""

from __future__ import annotations

import os


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


HAS_CUDA = _has_cuda()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    import pytest

    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (tier 'gpu'); this machine has none")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_teardown(item, nextitem):
    """Under pytest-xdist on a GPU, each worker hands its cached GPU memory back after every GPU test. Run S ran the
    GPU suite in 12 processes on one 80 GB card: 22 tests ran out of memory while the other workers held 3-8 GiB
    each, and all 22 passed when run again on two workers."""
    if HAS_CUDA and os.environ.get("PYTEST_XDIST_WORKER") and "gpu" in item.keywords:
        import torch

        torch.cuda.empty_cache()
