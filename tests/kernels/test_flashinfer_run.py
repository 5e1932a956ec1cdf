"""The host side of the FlashInfer attention implementation, on a CPU, with a recording stand-in.

FlashInfer's kernels need a GPU; what this checks is the wrapper cache around them (one wrapper per
key, re-planned only when the page metadata changes), the device ``v_scale`` applied after the run,
a strided ``out`` filled by a copy, and the base-2 LSE returned in natural-log units.
"""

from __future__ import annotations

import importlib
import math
import sys
import types

import pytest
import torch

from nvfp4compat.kernels.layout import normalize_cache


class _Wrapper:
    """Records plan/run calls; run returns ``q * 2`` and an LSE of ones (base 2)."""

    made: list[_Wrapper] = []

    def __init__(self, workspace: torch.Tensor, *args: object, **kwargs: object) -> None:
        self.plans = 0
        _Wrapper.made.append(self)

    def plan(self, *args: object, **kwargs: object) -> None:
        self.plans += 1

    def run(self, q, kv, *, k_scale, v_scale, out, return_lse, kv_cache_sf):
        o = q * 2 * (1.0 if v_scale is None else v_scale)
        if out is not None:
            out.copy_(o)
            o = out
        lse = torch.ones(q.shape[0], q.shape[1])
        return (o, lse) if return_lse else o


@pytest.fixture
def fia(monkeypatch: pytest.MonkeyPatch):
    fake = types.ModuleType("flashinfer")
    fake.BatchDecodeWithPagedKVCacheWrapper = _Wrapper  # type: ignore[attr-defined]
    name = "nvfp4compat.kernels.flashinfer.attention"
    pkg = importlib.import_module("nvfp4compat.kernels.flashinfer")
    # a real FlashInfer and its module (nox -s flashinfer) come back after the test
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.delattr(pkg, "attention", raising=False)
    mod = importlib.import_module(name)
    _Wrapper.made.clear()
    yield mod
    mod.clear_cache()
    sys.modules.pop(name, None)
    if getattr(pkg, "attention", None) is mod:
        delattr(pkg, "attention")


def _views():
    data = tuple(torch.zeros(2, 4, 1, 64, dtype=torch.uint8) for _ in range(2))
    sf = tuple(torch.zeros(2, 4, 1, 8, dtype=torch.uint8) for _ in range(2))
    return normalize_cache(data, sf, "NHD")


def _call(fia, meta, q, out=None, v_scale=1.0, return_lse=False):
    return fia._run(
        ("decode", "k"), meta, lambda ws: fia.flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws),
        lambda w: w.plan(), q, _views(), 1.0, v_scale, out, return_lse,
    )  # fmt: skip


def test_one_wrapper_per_key_replanned_only_on_new_metadata(fia) -> None:
    q = torch.randn(3, 2, 128)
    _call(fia, "m1", q)
    _call(fia, "m1", q)
    assert len(_Wrapper.made) == 1 and _Wrapper.made[0].plans == 1
    _call(fia, "m2", q)
    assert len(_Wrapper.made) == 1 and _Wrapper.made[0].plans == 2


def test_device_v_scale_strided_out_and_natural_log_lse(fia) -> None:
    q = torch.randn(3, 2, 128)
    out = torch.empty(3, 4, 128)[:, ::2]  # strided: FlashInfer writes a temporary, copied into it
    got, lse = _call(fia, "m", q, out=out, v_scale=torch.tensor([0.5]), return_lse=True)
    assert got is out
    torch.testing.assert_close(out, q * 2 * 0.5)
    torch.testing.assert_close(lse, torch.full((3, 2), math.log(2)))
    plain = _call(fia, "m", q, v_scale=3.0)
    torch.testing.assert_close(plain, q * 2 * 3.0)
