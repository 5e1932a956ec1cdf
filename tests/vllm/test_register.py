"""The entry point: idempotent, never raising, leaving vLLM untouched where it cannot help, and
``unpatch()`` restoring every original."""

from __future__ import annotations

import logging

import pytest
from vllm_cpu_support import HAVE_VLLM, NO_VLLM_REASON  # noqa: E402

if not HAVE_VLLM:
    pytest.skip(NO_VLLM_REASON, allow_module_level=True)

import torch  # noqa: E402
from vllm_cpu_support import load_plugin_through_entry_point, recording, vllm_config  # noqa: E402

from nvfp4compat import vllm_plugin  # noqa: E402
from nvfp4compat.vllm_plugin.patches import OVERRIDE_PATH  # noqa: E402


def _vllm_state(cpu_vllm) -> dict[str, object]:
    """Identity snapshot of everything the plugin could touch in vLLM."""
    fi = cpu_vllm.fi
    state: dict[str, object] = {"overrides": dict(cpu_vllm.registry._ATTN_OVERRIDES)}
    for cls_name in ("FlashInferBackend", "FlashInferMetadataBuilder", "FlashInferImpl"):
        cls = getattr(fi, cls_name)
        state[cls_name] = cls
        for attr, value in vars(cls).items():
            state[f"{cls_name}.{attr}"] = value
    state["fi_module"] = dict(vars(fi))
    return state


def _same(before: dict[str, object], after: dict[str, object]) -> list[str]:
    diff = []
    for key in before.keys() | after.keys():
        a, b = before.get(key), after.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            if a.keys() != b.keys() or any(a[k] is not b[k] for k in a):
                diff.append(key)
        elif a is not b:
            diff.append(key)
    return diff


def test_register_is_idempotent(cpu_vllm, clean_plugin):
    cpu_vllm.set_arch("sm_90")
    with recording() as log:
        load_plugin_through_entry_point()
        first = vllm_plugin.applied()
        route = vllm_plugin.active_route()
        vllm_plugin.register()
        vllm_plugin.register()
    assert vllm_plugin.applied() == first
    assert vllm_plugin.active_route() is route
    infos = [
        r
        for r in log.records
        if r.levelno == logging.INFO and r.getMessage().startswith("nvfp4compat: vLLM")
    ]
    assert len(infos) == 1


def test_unpatch_restores_every_original(cpu_vllm, clean_plugin):
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.selector import get_attn_backend

    cpu_vllm.set_arch("sm_90")
    before = _vllm_state(cpu_vllm)
    with set_current_vllm_config(vllm_config("fp8")):
        stock_choice = get_attn_backend(128, torch.bfloat16, "fp8")  # memoised by vLLM
    load_plugin_through_entry_point()
    entries = vllm_plugin._PATCHES.entries()
    route = vllm_plugin.active_route()
    if route is None or not route.patches:
        pytest.skip(f"the plan for vLLM {cpu_vllm.version} on sm_90 applies no patch")
    originals = {e.target: e.original for e in entries if e.kind != "override"}
    assert originals, "the registry entry must be in the ledger"
    for entry in entries:
        if entry.kind != "override":
            assert entry.current() is not entry.original
    during = _vllm_state(cpu_vllm)
    assert _same(before, during) == ["overrides"], "only the override table may change"
    assert (
        cpu_vllm.registry._ATTN_OVERRIDES[cpu_vllm.registry.AttentionBackendEnum.FLASHINFER]
        == OVERRIDE_PATH
    )
    with set_current_vllm_config(vllm_config("fp8")):
        # the memoised selection was cleared: fp8 now resolves to the subclass (same name)
        patched_choice = get_attn_backend(128, torch.bfloat16, "fp8")
    assert patched_choice.get_name() == stock_choice.get_name()
    if stock_choice.get_name() == "FLASHINFER":
        assert patched_choice is not stock_choice

    restored = vllm_plugin.unpatch()
    assert set(restored) == {e.target for e in entries}
    after = _vllm_state(cpu_vllm)
    assert _same(before, after) == []
    for entry in entries:
        if entry.kind != "override":
            assert entry.current() is originals[entry.target]
    assert vllm_plugin.applied() == {} and vllm_plugin.active_route() is None
    with set_current_vllm_config(vllm_config("fp8")):
        assert get_attn_backend(128, torch.bfloat16, "fp8") is stock_choice


def test_unsupported_arch_leaves_vllm_untouched(cpu_vllm, clean_plugin):
    cpu_vllm.set_arch("sm_75")
    before = _vllm_state(cpu_vllm)
    with recording() as log:
        load_plugin_through_entry_point()  # must not raise
    assert vllm_plugin.active_route() is None
    assert vllm_plugin.applied() == {}
    assert _same(before, _vllm_state(cpu_vllm)) == []
    assert (
        cpu_vllm.registry.AttentionBackendEnum.FLASHINFER.get_class()
        is cpu_vllm.fi.FlashInferBackend
    )
    lines = [r.getMessage() for r in log.records if r.getMessage().startswith("nvfp4compat:")]
    assert len(lines) == 1 and "left untouched" in lines[0] and "sm_75" in lines[0], lines


def test_register_never_raises_on_a_broken_resolver(cpu_vllm, clean_plugin, monkeypatch):
    def broken():
        raise RuntimeError("matrix could not be loaded")

    monkeypatch.setattr(vllm_plugin, "_resolve_here", broken)
    cpu_vllm.set_arch("sm_90")
    with recording() as log:
        vllm_plugin.register()
    assert vllm_plugin.applied() == {}
    assert any("matrix could not be loaded" in r.getMessage() for r in log.records)


def test_unknown_vllm_release_is_logged_as_unverified(cpu_vllm, clean_plugin, monkeypatch):
    """A vLLM release not in the matrix: the INFO line and a WARNING name the release planned from."""
    import nvfp4compat

    real = nvfp4compat.detect
    monkeypatch.setattr(
        nvfp4compat, "detect", lambda **kw: real(**kw).model_copy(update={"vllm": "0.33.5"})
    )
    cpu_vllm.set_arch("sm_90")
    with recording() as log:
        load_plugin_through_entry_point()
    messages = [(r.levelno, r.getMessage()) for r in log.records]
    info = [m for level, m in messages if level == logging.INFO and m.startswith("nvfp4compat: vLLM")]
    assert len(info) == 1
    assert "(UNVERIFIED: planned from the nearest release in the matrix: vllm 0.33.0)" in info[0]
    assert any(
        level == logging.WARNING
        and "vLLM 0.33.5 is not in matrix/vllm.yaml: planned from the nearest known release 0.33.0" in m
        for level, m in messages
    ), messages


def test_a_plan_for_a_release_with_the_dtype_registry_on_one_without_it(cpu_vllm, clean_plugin, monkeypatch):
    """The plan says vLLM can register the rotated dtype names (e.g. planned from 0.33 for a release the
    matrix does not know) but the installed vLLM cannot: the plugin says so and serves the rest of the plan."""
    import vllm.config.cache as cache

    import nvfp4compat

    if hasattr(cache, "register_kv_cache_dtype"):
        monkeypatch.delattr(cache, "register_kv_cache_dtype")
    real = nvfp4compat.detect
    monkeypatch.setattr(nvfp4compat, "detect", lambda **kw: real(**kw).model_copy(update={"vllm": "0.34.0"}))
    cpu_vllm.set_arch("sm_90")
    intended = nvfp4compat.resolve(nvfp4compat.load_matrix(), nvfp4compat.detect())
    if intended.vllm is None or not intended.vllm.dtype_routes:
        pytest.skip(f"with FlashInfer {cpu_vllm.flashinfer_version} the plan for vLLM 0.34.0 registers no name: {intended.reason}")
    with recording() as log:
        load_plugin_through_entry_point()
    messages = [(r.levelno, r.getMessage()) for r in log.records]
    assert any(
        level == logging.WARNING and "has no vllm.config.cache.register_kv_cache_dtype" in m and "Way out" in m
        and "not registered" in m
        for level, m in messages
    ), messages
    assert [m for level, m in messages if level == logging.INFO and m.startswith("nvfp4compat: vLLM 0.34.0")]
    plan = vllm_plugin.last_plan()
    assert plan is not None and plan.vllm.dtype_routes == {}
