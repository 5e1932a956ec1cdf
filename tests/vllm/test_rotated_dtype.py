"""vLLM 0.33+: the rotated cache's own ``--kv-cache-dtype`` names (``nvfp4_hadamard``, ...).

The plugin registers them with vLLM's ``register_kv_cache_dtype`` (the plan's ``dtype_routes``): vLLM
then validates the name, stores it as NVFP4 pages, the gate accepts it, and a layer of that dtype takes
the rotated route while plain ``nvfp4`` layers keep the unrotated one; ``unpatch()`` takes the names
out again. Skipped on releases without the registry (there ``NVFP4COMPAT_KV_ROTATION=hadamard``
rotates every NVFP4 layer).
"""

from __future__ import annotations

import pytest
from vllm_cpu_support import HAVE_VLLM, NO_VLLM_REASON

if not HAVE_VLLM:
    pytest.skip(NO_VLLM_REASON, allow_module_level=True)

import torch  # noqa: E402
from vllm_cpu_support import (  # noqa: E402
    allocate_kv_cache,
    load_plugin_through_entry_point,
    make_layer,
    validate,
    vllm_config,
)

from nvfp4compat import vllm_plugin  # noqa: E402
from nvfp4compat.kernels import reference  # noqa: E402
from nvfp4compat.kernels.rotation import rotated  # noqa: E402
from nvfp4compat.vllm_plugin.patches import DTYPE_REGISTRY_TARGET  # noqa: E402

HEADS, NUM_BLOCKS = 2, 6


@pytest.fixture
def registry(cpu_vllm):
    from vllm.config import cache

    if not hasattr(cache, "register_kv_cache_dtype"):
        pytest.skip(f"vLLM {cpu_vllm.version} cannot register --kv-cache-dtype names (0.33.0+ can)")
    return cache


def test_names_are_registered_served_and_taken_back(cpu_vllm, clean_plugin, registry):
    from vllm.utils import torch_utils
    from vllm.v1.kv_cache_interface import KVQuantMode, get_kv_quant_mode

    cpu_vllm.set_arch("sm_90")
    assert not registry.is_known_kv_cache_dtype("nvfp4_hadamard")
    load_plugin_through_entry_point()
    plan = vllm_plugin.last_plan()
    assert plan is not None and plan.vllm is not None
    names = list(plan.vllm.dtype_routes)
    assert "nvfp4_hadamard" in names, plan.render_text(trace=True)
    assert DTYPE_REGISTRY_TARGET in vllm_plugin.applied()
    backend = cpu_vllm.registry.AttentionBackendEnum.FLASHINFER.get_class()
    for name in names:
        assert registry.is_known_kv_cache_dtype(name)
        assert torch_utils.STR_DTYPE_TO_TORCH_DTYPE[name] is torch.uint8
        assert get_kv_quant_mode(name) == KVQuantMode.NVFP4
        assert vllm_config(name).cache_config.cache_dtype == name  # CacheConfig validates it
        assert validate(backend, name, cpu_vllm.capability[0]) == [], name
        assert validate(backend, name, cpu_vllm.capability[0], head_size=64) == [], name  # Triton readers
    vllm_plugin.unpatch()
    for name in names:
        assert not registry.is_known_kv_cache_dtype(name)
        assert name not in torch_utils.STR_DTYPE_TO_TORCH_DTYPE
    with pytest.raises(Exception, match="nvfp4_hadamard"):
        vllm_config("nvfp4_hadamard")


def test_a_layer_of_the_rotated_name_writes_the_rotated_cache(cpu_vllm, clean_plugin, registry, monkeypatch):
    from nvfp4compat.vllm_plugin.backend import Nvfp4CompatFlashInferImpl, page_views

    cpu_vllm.set_arch("sm_90")
    # FlashInfer's writer is CUDA code; on this machine the Triton writer runs in the interpreter
    monkeypatch.setenv("NVFP4COMPAT_IMPL", "write=triton")
    load_plugin_through_entry_point()
    setup = make_layer(cpu_vllm, "nvfp4_hadamard", num_heads=4, num_kv_heads=HEADS, head_size=128)
    impl, layer = setup.layer.impl, setup.layer
    assert isinstance(impl, Nvfp4CompatFlashInferImpl)
    route = impl._nvfp4_route
    assert route is not None and route.kv_cache_dtype == "nvfp4_hadamard" and route.kv_rotation == "hadamard"
    assert getattr(impl._nvfp4_write, "kv_rotation", None) == "hadamard"
    assert {getattr(f, "kv_rotation", None) for f in impl._nvfp4_read.values()} == {"hadamard"}
    plain = make_layer(cpu_vllm, "nvfp4", num_heads=4, num_kv_heads=HEADS, head_size=128,
                       prefix="model.layers.1.self_attn.attn").layer.impl  # fmt: skip
    assert plain._nvfp4_route is None or plain._nvfp4_route.kv_rotation is None

    raw, kv_cache = allocate_kv_cache(setup, NUM_BLOCKS, "HND")
    layer._k_scale.fill_(0.37)
    layer._v_scale.fill_(1.9)
    gen = torch.Generator().manual_seed(11)
    n = 29
    key = torch.randn(n, HEADS, 128, generator=gen).mul(3).to(torch.bfloat16)
    key[..., :4] *= 8  # outlier channels: the rotation changes the bytes a lot
    value = torch.randn(n, HEADS, 128, generator=gen).to(torch.bfloat16)
    slots = torch.randperm(NUM_BLOCKS * 16, generator=gen)[:n].to(torch.int64)
    impl.do_kv_cache_update(layer, key, value, kv_cache, slots)

    def reference_bytes(write):
        out = torch.zeros_like(raw)
        view = out.as_strided(kv_cache.shape, kv_cache.stride(), kv_cache.storage_offset())
        data, scales, kv_layout = page_views(view, HEADS)
        write(key, value, slots, data, scales, layer._k_scale, layer._v_scale, kv_layout=kv_layout)
        return out

    want = reference_bytes(rotated("write", reference.append_slot_mapping, "hadamard"))
    unrotated = reference_bytes(reference.append_slot_mapping)
    written = want != 0
    # the fused butterflies and the reference's matmul sum in another order: a float32 rounding apart
    assert float((raw == want)[written].float().mean()) > 0.995
    assert float((raw == unrotated)[written].float().mean()) < 0.5


def test_a_name_vllm_already_knows_is_not_taken_over(cpu_vllm, clean_plugin, registry):
    """Another plugin (or a future vLLM) registered nvfp4_hadamard first: the plugin says so, leaves that
    handler in place and still serves plain nvfp4."""
    from vllm_cpu_support import recording

    class Other:
        name = "nvfp4_hadamard"

        def torch_dtype(self):
            return torch.uint8

        def quant_mode(self):
            from vllm.v1.kv_cache_interface import KVQuantMode

            return KVQuantMode.NVFP4

    from vllm.utils import torch_utils

    registry.register_kv_cache_dtype("nvfp4_hadamard")(Other)
    try:
        cpu_vllm.set_arch("sm_90")
        with recording() as log:
            load_plugin_through_entry_point()
        warned = [r.getMessage() for r in log.records if "already known to this vLLM" in r.getMessage()]
        assert warned and "not registered" in warned[0] and "Way out" in warned[0]
        plan = vllm_plugin.last_plan()
        assert plan.vllm.dtype_routes == {} and "nvfp4_hadamard" not in plan.vllm.kv_cache_dtypes
        assert vllm_plugin.active_route() is not None  # plain nvfp4 is still served
        assert type(registry.get_kv_cache_dtype_handler("nvfp4_hadamard")) is Other
        vllm_plugin.unpatch()
        assert type(registry.get_kv_cache_dtype_handler("nvfp4_hadamard")) is Other  # not ours to remove
    finally:
        registry.KV_CACHE_DTYPES.remove("nvfp4_hadamard")
        registry._KV_CACHE_DTYPE_HANDLERS.pop("nvfp4_hadamard", None)
        torch_utils.STR_DTYPE_TO_TORCH_DTYPE.pop("nvfp4_hadamard", None)
