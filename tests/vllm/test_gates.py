"""FLASHINFER's NVFP4 gate and vLLM's full backend selector, without and with the plugin.

The plugin is loaded through its real entry point (``vllm.plugins.load_general_plugins()`` with
``VLLM_PLUGINS=nvfp4compat``); the device capability is faked per test (conftest).
"""

from __future__ import annotations

import logging

import pytest
from vllm_cpu_support import HAVE_VLLM, NO_VLLM_REASON  # noqa: E402

if not HAVE_VLLM:
    pytest.skip(NO_VLLM_REASON, allow_module_level=True)

import torch  # noqa: E402
from packaging.version import Version  # noqa: E402
from vllm_cpu_support import (  # noqa: E402
    load_plugin_through_entry_point,
    make_layer,
    recording,
    validate,
    vllm_config,
)

from nvfp4compat import vllm_plugin  # noqa: E402

ARCHES = ["sm_90", "sm_86"]


def _release(cpu_vllm) -> Version:
    return Version(Version(cpu_vllm.version).base_version)


def _native_on_fa2(cpu_vllm) -> bool:
    """vLLM 0.32.0+ serves nvfp4 on SM8x/SM90/SM12x itself (``_nvfp4_kv_on_fa2``)."""
    return _release(cpu_vllm) >= Version("0.32.0")


@pytest.mark.parametrize("arch", ARCHES)
def test_stock_gate_without_plugin(cpu_vllm, clean_plugin, arch):
    cpu_vllm.set_arch(arch)
    backend = cpu_vllm.registry.AttentionBackendEnum.FLASHINFER.get_class()
    assert backend is cpu_vllm.fi.FlashInferBackend
    cap = cpu_vllm.capability[0]
    expected = [] if _native_on_fa2(cpu_vllm) else ["kv_cache_dtype not supported"]
    assert validate(backend, "nvfp4", cap) == expected
    assert validate(backend, "fp8", cap) == []
    assert validate(backend, "auto", cap) == []


@pytest.mark.parametrize("arch", ARCHES)
def test_stock_selector_without_plugin(cpu_vllm, clean_plugin, arch):
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.selector import get_attn_backend

    cpu_vllm.set_arch(arch)
    with set_current_vllm_config(vllm_config("nvfp4")):
        if _native_on_fa2(cpu_vllm):
            assert get_attn_backend(128, torch.bfloat16, "nvfp4") is cpu_vllm.fi.FlashInferBackend
        else:
            with pytest.raises(ValueError, match=r"FLASHINFER: \[kv_cache_dtype not supported\]"):
                get_attn_backend(128, torch.bfloat16, "nvfp4")


@pytest.mark.parametrize("arch", ARCHES)
def test_plugin_gate_through_entry_point(cpu_vllm, clean_plugin, arch):
    cpu_vllm.set_arch(arch)
    with recording() as log:
        load_plugin_through_entry_point()
    lines = [r.getMessage() for r in log.records if r.levelno == logging.INFO]
    assert len([m for m in lines if m.startswith("nvfp4compat: vLLM ")]) == 1, lines
    route = vllm_plugin.active_route()
    backend = cpu_vllm.registry.AttentionBackendEnum.FLASHINFER.get_class()
    cap = cpu_vllm.capability[0]
    assert validate(backend, "nvfp4", cap) == []
    assert validate(backend, "fp8", cap) == []
    assert validate(backend, "auto", cap) == []
    if not _native_on_fa2(cpu_vllm):
        # 0.25.1-0.31.0 on SM80-90: the backport, with the subclass behind the FLASHINFER name.
        assert route is not None and route.strategy == "backport", route
        assert set(route.patches) >= {
            "gate_nvfp4",
            "metadata_builder",
            "kv_cache_update",
            "forward_reader",
        }
        assert backend is not cpu_vllm.fi.FlashInferBackend
        assert issubclass(backend, cpu_vllm.fi.FlashInferBackend)
        assert backend.get_name() == "FLASHINFER"
        assert f" on {arch} " in lines[0] and "backport [" in lines[0], lines[0]


@pytest.mark.parametrize("arch", ARCHES)
def test_plugin_selector_and_page_geometry(cpu_vllm, clean_plugin, arch):
    """The real selector picks FLASHINFER -> the subclass; the spec has the NVFP4 page."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.selector import get_attn_backend

    from nvfp4compat.vllm_plugin.backend import (
        Nvfp4CompatFlashInferBackend,
        Nvfp4CompatFlashInferImpl,
    )

    cpu_vllm.set_arch(arch)
    load_plugin_through_entry_point()
    route = vllm_plugin.active_route()
    with set_current_vllm_config(vllm_config("nvfp4")):
        backend = get_attn_backend(128, torch.bfloat16, "nvfp4")
    assert backend.get_name() == "FLASHINFER"
    if route is not None and route.patches:
        assert backend is Nvfp4CompatFlashInferBackend
    nvfp4 = make_layer(cpu_vllm, "nvfp4", num_heads=16, num_kv_heads=8, head_size=128)
    bf16 = make_layer(
        cpu_vllm,
        "auto",
        num_heads=16,
        num_kv_heads=8,
        head_size=128,
        prefix="model.layers.1.self_attn.attn",
    )
    assert nvfp4.backend is backend
    if route is not None and (route.write or route.read):
        assert isinstance(nvfp4.layer.impl, Nvfp4CompatFlashInferImpl)
    # K and V: 16 tokens x 8 KV heads x (64 data + 8 scale bytes) each; bf16: 256 bytes each.
    assert nvfp4.spec.page_size_bytes == 2 * 16 * 8 * (128 // 2 + 128 // 16) == 18432
    assert bf16.spec.page_size_bytes == 2 * 16 * 8 * 128 * 2 == 65536
    ratio = bf16.spec.page_size_bytes / nvfp4.spec.page_size_bytes
    assert ratio == pytest.approx(3.556, abs=1e-3)
    # Non-NVFP4 layers keep vLLM's own impl behaviour (no nvfp4compat route on them).
    assert getattr(bf16.layer.impl, "_nvfp4_route", None) is None
