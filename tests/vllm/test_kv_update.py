"""The impl's KV-cache update writes the bytes of the reference codec, in the release's page.

The cache is allocated and viewed as the release's model runner does it. The reference is
``nvfp4compat.kernels.reference.append_slot_mapping`` written through the views the release's own
reader takes of the page:

* vLLM 0.32+: ``_nvfp4_kv_views`` (``vllm/v1/attention/backends/flashinfer.py``);
* vLLM 0.25.1: ``nvfp4_kv_cache_split_views`` on the cache permuted by the backend's stride order
  (``FlashInferImpl.forward``), cache ``[blocks, 2, block_size, heads, D/2 + D/16]``;
* vLLM 0.26-0.31, HND: ``kv_cache.split(heads, dim=1)`` + ``nvfp4_split_data_scale`` (the forward's
  split). For NHD these releases' split is not a partition of the page (K and V overlap; only
  SM100's HND ever reached it), so there the reference uses the plugin's page interior, which is
  0.32's: the test below shows both facts.
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
    stride_order,
    view_order,
)

from nvfp4compat import vllm_plugin  # noqa: E402
from nvfp4compat.kernels import reference  # noqa: E402

NUM_BLOCKS = 6
HEADS = 2


def release_reader_views(fi, setup, kv_cache: torch.Tensor, layout: str):
    """The (data, scales, layout) views this release's own FlashInfer reader takes of the page,
    or None where the release has no consistent view (NHD on 0.26-0.31)."""
    from vllm.utils import torch_utils

    if hasattr(fi, "_nvfp4_kv_views"):
        return fi._nvfp4_kv_views(kv_cache, HEADS)
    if hasattr(torch_utils, "nvfp4_kv_cache_split_views"):
        data, scales = torch_utils.nvfp4_kv_cache_split_views(
            kv_cache.permute(*stride_order(setup, layout))
        )
        return data, scales, layout
    if layout == "HND":
        k_side, v_side = kv_cache.split(HEADS, dim=1)  # the HND view order is the identity
        (k_data, k_sf) = torch_utils.nvfp4_split_data_scale(k_side)
        (v_data, v_sf) = torch_utils.nvfp4_split_data_scale(v_side)
        return (k_data, v_data), (k_sf, v_sf), "HND"
    return None


def _covered(t: torch.Tensor, numel: int) -> torch.Tensor:
    """Flat byte offsets a view covers in its storage."""
    return torch.arange(numel).as_strided(t.shape, t.stride(), t.storage_offset()).reshape(-1)


@pytest.fixture
def plugin_for_write(cpu_vllm, clean_plugin, monkeypatch):
    cpu_vllm.set_arch("sm_90")
    # FlashInfer's writer is CUDA code; on this machine the Triton writer runs in the interpreter.
    monkeypatch.setenv("NVFP4COMPAT_IMPL", "write=triton")
    load_plugin_through_entry_point()
    route = vllm_plugin.active_route()
    if route is None or route.write is None:
        pytest.skip(
            f"the plan for vLLM {cpu_vllm.version} on sm_90 leaves the KV write to vLLM: {route}"
        )
    assert route.write == "triton"
    return route


@pytest.mark.parametrize(
    ("cache_dtype", "layout"),
    [("nvfp4", "NHD"), ("nvfp4", "HND"), ("nvfp4_4over6", "HND")],
)
def test_kv_cache_update_matches_reference_codec(cpu_vllm, plugin_for_write, cache_dtype, layout):
    from vllm_cpu_support import validate

    from nvfp4compat.vllm_plugin.backend import Nvfp4CompatFlashInferImpl, page_views

    if cache_dtype not in plugin_for_write.accept and cache_dtype != "nvfp4":
        pytest.skip(
            f"vLLM {cpu_vllm.version}: the plan does not serve {cache_dtype} (no gate_nvfp4_4over6)"
        )
    backend = cpu_vllm.registry.AttentionBackendEnum.FLASHINFER.get_class()
    assert validate(backend, cache_dtype, cpu_vllm.capability[0]) == []
    setup = make_layer(cpu_vllm, cache_dtype, num_heads=4, num_kv_heads=HEADS, head_size=128)
    impl, layer = setup.layer.impl, setup.layer
    assert isinstance(impl, Nvfp4CompatFlashInferImpl)
    raw, kv_cache = allocate_kv_cache(setup, NUM_BLOCKS, layout)
    assert kv_cache.dtype == torch.uint8 and raw.numel() == NUM_BLOCKS * 2 * 16 * HEADS * 72
    layer._k_scale.fill_(0.37)
    layer._v_scale.fill_(1.9)
    gen = torch.Generator().manual_seed(5)
    num_tokens = 37
    key = (
        torch.randn(num_tokens + 3, HEADS, 128, generator=gen).mul(3).to(torch.bfloat16)
    )  # padded rows
    value = torch.randn(num_tokens + 3, HEADS, 128, generator=gen).to(torch.bfloat16)
    slots = torch.randperm(NUM_BLOCKS * 16, generator=gen)[:num_tokens].to(torch.int64)
    slots[[4, 11]] = -1  # padding slots are skipped

    impl.do_kv_cache_update(layer, key, value, kv_cache, slots)

    expected_raw = torch.zeros_like(raw)
    expected = expected_raw.as_strided(kv_cache.shape, kv_cache.stride(), kv_cache.storage_offset())
    views = release_reader_views(cpu_vllm.fi, setup, expected, layout) or page_views(
        expected, HEADS
    )
    data, scales, kv_layout = views
    assert kv_layout == layout
    reference.append_slot_mapping(
        key, value, slots, data, scales, layer._k_scale, layer._v_scale, kv_layout=kv_layout,
        nvfp4_4over6=cache_dtype == "nvfp4_4over6",
    )  # fmt: skip
    assert int((expected_raw != 0).sum()) > num_tokens * 2 * HEADS * 64 // 2
    assert torch.equal(raw, expected_raw), f"{int((raw != expected_raw).sum())} bytes differ"


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_page_views_partition_the_page_like_the_release(cpu_vllm, clean_plugin, layout):
    """The plugin's page interior is an exact partition of each page in both layouts and equals
    the release's own reader views wherever the release has consistent ones."""
    from nvfp4compat.vllm_plugin.backend import page_views

    cpu_vllm.set_arch("sm_90")
    load_plugin_through_entry_point()
    setup = make_layer(cpu_vllm, "nvfp4", num_heads=4, num_kv_heads=HEADS, head_size=128)
    raw, kv_cache = allocate_kv_cache(setup, 3, layout)
    numel = raw.numel()
    data, scales, got = page_views(kv_cache, HEADS)
    assert got == layout
    ours = torch.cat([_covered(t, numel) for t in (*data, *scales)])
    assert torch.equal(ours.sort().values, torch.arange(numel))
    theirs = release_reader_views(cpu_vllm.fi, setup, kv_cache, layout)
    if theirs is not None:
        for a, b in zip((*data, *scales), (*theirs[0], *theirs[1]), strict=True):
            assert a.shape == b.shape and torch.equal(_covered(a, numel), _covered(b, numel))
    else:
        from vllm.utils.torch_utils import nvfp4_split_data_scale

        order = view_order(setup, layout)
        k_side, v_side = kv_cache.split(HEADS, dim=1)
        split = [
            *nvfp4_split_data_scale(k_side.permute(*order)),
            *nvfp4_split_data_scale(v_side.permute(*order)),
        ]
        assert torch.cat([_covered(t, numel) for t in split]).unique().numel() < numel
