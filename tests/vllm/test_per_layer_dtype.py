"""vLLM 0.34 changes around the plugin: the cache dtype resolved per layer, no Model Runner V1.

vLLM 0.34's ``FlashInferMetadataBuilder._resolve_cache_dtype`` (FI:1137 [0.34.0]) takes the layers'
own ``kv_cache_dtype`` when ``cache_config.cache_dtype`` is ``"auto"``: a layer can be NVFP4 while the
config says ``"auto"``. The plugin's builder must decide from the layer, as vLLM does.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from vllm_cpu_support import load_plugin_through_entry_point, make_layer

from nvfp4compat import vllm_plugin

PLUGIN = Path(__file__).resolve().parents[2] / "nvfp4compat" / "vllm_plugin"


@pytest.fixture
def triton_plugin(cpu_vllm, clean_plugin, monkeypatch):
    cpu_vllm.set_arch("sm_90")
    monkeypatch.setenv("NVFP4COMPAT_IMPL", "triton")
    load_plugin_through_entry_point()
    route = vllm_plugin.active_route()
    if route is None or not route.own_builder:
        pytest.skip(f"the plan for vLLM {cpu_vllm.version} has no own NVFP4 builder: {route}")
    return route


def test_builder_decides_from_the_layer_when_the_config_says_auto(cpu_vllm, triton_plugin):
    if not hasattr(cpu_vllm.fi.FlashInferMetadataBuilder, "_resolve_cache_dtype"):
        pytest.skip(f"vLLM {cpu_vllm.version} resolves the cache dtype from cache_config only")
    setup = make_layer(cpu_vllm, "nvfp4", num_heads=4, num_kv_heads=2, head_size=128, block_size=64)
    assert setup.layer.kv_cache_dtype == "nvfp4"
    setup.config.cache_config.cache_dtype = "auto"  # the layer keeps its own NVFP4 dtype
    builder = setup.builder()
    assert builder._nvfp4_route is triton_plugin, "the layer is NVFP4: nvfp4compat's builder serves it"
    assert builder.cache_dtype == "nvfp4" and builder.page_size == 64


def test_layers_of_one_group_with_different_dtypes_are_refused(cpu_vllm):
    from types import SimpleNamespace

    from nvfp4compat.vllm_plugin.backend import _layer_cache_dtype

    mode = SimpleNamespace(is_nvfp4=True)
    ctx = {"a": SimpleNamespace(kv_cache_dtype="nvfp4"), "b": SimpleNamespace(kv_cache_dtype="nvfp4_4over6")}
    config = SimpleNamespace(
        cache_config=SimpleNamespace(cache_dtype="auto"),
        compilation_config=SimpleNamespace(static_forward_context=ctx),
    )
    spec = SimpleNamespace(kv_quant_mode=mode)
    assert _layer_cache_dtype(spec, config, ["a"]) == "nvfp4"
    assert _layer_cache_dtype(spec, config, ["b"]) == "nvfp4_4over6"
    assert _layer_cache_dtype(spec, config) == "nvfp4"  # no layer names: the NVFP4 spec decides
    with pytest.raises(ValueError, match=r"different KV-cache dtypes \['nvfp4', 'nvfp4_4over6'\]"):
        _layer_cache_dtype(spec, config, ["a", "b"])
    config.cache_config.cache_dtype = "nvfp4"
    assert _layer_cache_dtype(spec, config, ["b"]) == "nvfp4"  # an explicit --kv-cache-dtype wins
    assert _layer_cache_dtype(SimpleNamespace(kv_quant_mode=SimpleNamespace(is_nvfp4=False)), config) == "auto"


def test_plugin_needs_no_model_runner_v1():
    """vLLM 0.34 ships no ``vllm/v1/worker/gpu_model_runner.py``: the plugin imports nothing from it."""
    for path in sorted(PLUGIN.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                assert "gpu_model_runner" not in name, f"{path.name} imports {name}"
        assert "gpu_model_runner" not in path.read_text(), path.name
