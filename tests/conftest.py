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
