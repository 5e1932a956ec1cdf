"""The impl's forward over metadata built by the plugin's builder, against a float32 reference.

A real vLLM ``Attention`` layer, the builder the registered backend returns (constructed with a
real ``VllmConfig``), vLLM's ``CommonAttentionMetadata`` for a mixed batch (decodes first, as vLLM
orders them), the KV written through the impl, and the reader the plan binds (the Triton kernels
under ``TRITON_INTERPRET=1``). The reference is ``paged_attention_reference`` on the dequantized
cache (float32).
"""

from __future__ import annotations

import pytest
from vllm_cpu_support import HAVE_VLLM, NO_VLLM_REASON  # noqa: E402

if not HAVE_VLLM:
    pytest.skip(NO_VLLM_REASON, allow_module_level=True)

import torch  # noqa: E402
from vllm_cpu_support import allocate_kv_cache, load_plugin_through_entry_point, make_layer  # noqa: E402

from nvfp4compat import vllm_plugin  # noqa: E402
from nvfp4compat.kernels.reference_attention import (  # noqa: E402
    paged_attention_reference,
    relative_l2,
)

# vLLM <= 0.33 defaults to 16 tokens per block, 0.34 to 64 (CacheConfig.DEFAULT_BLOCK_SIZE).
BLOCK_SIZES = (16, 64)


@pytest.fixture
def plugin_for_read(cpu_vllm, clean_plugin, monkeypatch):
    cpu_vllm.set_arch("sm_90")
    # FlashInfer's writer and FA2 readers are CUDA code; here the Triton kernels run interpreted.
    monkeypatch.setenv("NVFP4COMPAT_IMPL", "triton")
    load_plugin_through_entry_point()
    route = vllm_plugin.active_route()
    if route is None or not route.own_builder or not route.reads_all:
        pytest.skip(f"the plan for vLLM {cpu_vllm.version} does not route both reads: {route}")
    return route


def _common_metadata(seq_lens, query_lens, block_table, slot_mapping):
    from vllm.v1.attention.backend import CommonAttentionMetadata

    qsl = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    extra = {}
    if "seq_lens_cpu_upper_bound" in getattr(CommonAttentionMetadata, "__dataclass_fields__", {}):
        extra["seq_lens_cpu_upper_bound"] = torch.tensor(seq_lens, dtype=torch.int32)  # vLLM 0.33+
    return CommonAttentionMetadata(
        **extra,
        query_start_loc=qsl,
        query_start_loc_cpu=qsl.clone(),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        num_reqs=len(seq_lens),
        num_actual_tokens=int(qsl[-1]),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_table_tensor=block_table,
        slot_mapping=slot_mapping,
    )


def _run_case(
    cpu_vllm,
    *,
    layout,
    head_size,
    num_heads,
    num_kv_heads,
    seq_lens,
    query_lens,
    decode_threshold=None,
    block_size=16,
    **layer_kwargs,
):
    from vllm.config import set_current_vllm_config

    from nvfp4compat.vllm_plugin.backend import Nvfp4KVMetadata, page_views

    setup = make_layer(
        cpu_vllm, "nvfp4", num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=head_size,
        block_size=block_size, **layer_kwargs,
    )  # fmt: skip
    BLOCK = setup.spec.block_size  # noqa: N806 - the page size the cache was built with
    assert block_size == BLOCK
    layer, impl = setup.layer, setup.layer.impl
    builder = setup.builder()
    if decode_threshold is not None:
        # What _init_reorder_batch_threshold derives from num_speculative_tokens (no draft model here).
        builder.reorder_batch_threshold = decode_threshold
    pages = [-(-n // BLOCK) for n in seq_lens]
    num_blocks = sum(pages) + 1
    raw, kv_cache = allocate_kv_cache(setup, num_blocks, layout)
    gen = torch.Generator().manual_seed(11)
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    block_table = torch.zeros(len(seq_lens), max(pages), dtype=torch.int32)
    used = 0
    for b, p in enumerate(pages):
        block_table[b, :p] = perm[used : used + p]
        used += p
    layer._k_scale.fill_(0.5)
    layer._v_scale.fill_(2.0)
    # The context (and this step's tokens) enters the cache through the impl's own write.
    new_slots = []
    for b, n in enumerate(seq_lens):
        pos = torch.arange(n)
        slots = block_table[b].long()[pos // BLOCK] * BLOCK + pos % BLOCK
        k = torch.randn(n, num_kv_heads, head_size, generator=gen).to(torch.bfloat16)
        v = torch.randn(n, num_kv_heads, head_size, generator=gen).to(torch.bfloat16)
        impl.do_kv_cache_update(layer, k, v, kv_cache, slots)
        new_slots.append(slots[n - query_lens[b] :])
    cm = _common_metadata(seq_lens, query_lens, block_table, torch.cat(new_slots))
    with set_current_vllm_config(setup.config):
        md = builder.build(0, cm)
    assert isinstance(md, Nvfp4KVMetadata)
    num_tokens = cm.num_actual_tokens
    query = torch.randn(num_tokens, num_heads, head_size, generator=gen).to(torch.bfloat16)
    output = torch.full((num_tokens + 2, num_heads, head_size), float("nan"), dtype=torch.bfloat16)
    result = impl.forward(layer, query, None, None, kv_cache, md, output)
    assert result is output
    data, scales, kv_layout = page_views(kv_cache, num_kv_heads)
    expected, _ = paged_attention_reference(
        query, data, scales, block_table, cm.seq_lens, cm.query_start_loc, layer._k_scale,
        layer._v_scale, sm_scale=impl.scale, kv_layout=kv_layout, sinks=impl.sinks,
        sliding_window=layer_kwargs.get("per_layer_sliding_window"),
        logits_soft_cap=layer_kwargs.get("logits_soft_cap"),
    )  # fmt: skip
    err = relative_l2(output[:num_tokens].float(), expected)
    assert err <= 1e-2, f"relative L2 {err:.3e}"
    return md, err


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_forward_mixed_batch_matches_float32_reference(cpu_vllm, plugin_for_read, layout, block_size):
    # Two decodes then two prefill chunks (one continuing a cached context), GQA 4:2; at 16 tokens
    # per block the sequences span several pages, at 64 (vLLM 0.34's default) one page each but 71.
    md, err = _run_case(
        cpu_vllm, layout=layout, head_size=128, num_heads=4, num_kv_heads=2,
        seq_lens=[37, 9, 21, 5] if block_size == 16 else [71, 9, 130, 5],
        query_lens=[1, 1, 6, 5], block_size=block_size,
    )  # fmt: skip
    split = (md.num_decodes, md.num_decode_tokens, md.num_prefills, md.num_prefill_tokens)
    assert split == (2, 2, 2, 11) and md.decode_q_len == 1
    assert md.prefill_query_start_loc.tolist() == [0, 6, 11]


def test_forward_speculative_decode_window_and_softcap(cpu_vllm, plugin_for_read):
    """Uniform 3-token decodes (1 + 2 speculative tokens) go to the decode kernel with
    q_len_per_req=3; a sliding window and a logits soft-cap reach both readers."""
    md, _ = _run_case(
        cpu_vllm, layout="NHD", head_size=128, num_heads=8, num_kv_heads=2,
        seq_lens=[40, 19, 33], query_lens=[3, 3, 9], decode_threshold=3,
        per_layer_sliding_window=12, logits_soft_cap=0.4,
    )  # fmt: skip
    assert (md.num_decodes, md.num_decode_tokens, md.decode_q_len) == (2, 6, 3)
    assert (md.num_prefills, md.num_prefill_tokens) == (1, 9)


def test_forward_head64_with_sinks(cpu_vllm, plugin_for_read):
    """head_size 64 and attention sinks: refused by vLLM 0.32+'s FA2 path, served by Triton."""
    if not plugin_for_read.combination:
        pytest.skip(f"the plan for vLLM {cpu_vllm.version} has no gate_combination")
    sinks = torch.linspace(-1.0, 2.0, 4, dtype=torch.float32)
    _run_case(
        cpu_vllm, layout="HND", head_size=64, num_heads=4, num_kv_heads=1,
        seq_lens=[30, 7], query_lens=[1, 7], sinks=sinks,
    )  # fmt: skip


def test_cudagraph_support_follows_the_route(cpu_vllm, plugin_for_read, monkeypatch):
    """The builder answers what the plan's route says: UNIFORM_SINGLE_TOKEN_DECODE (FULL decode graphs
    over the Triton reader) where the matrix verified them for this vLLM release on SM90, NEVER
    elsewhere; NVFP4COMPAT_CUDAGRAPH_DECODE=0/1 overrides it when the plan is made."""
    from vllm.v1.attention.backend import AttentionCGSupport

    from nvfp4compat import load_matrix
    from nvfp4compat.facts import ENV_CUDAGRAPH_DECODE

    rel = load_matrix().vllm_release(cpu_vllm.version)
    assert rel is not None, cpu_vllm.version
    spec = rel.plugin.full_decode_graphs
    writer_ok = spec is None or spec.writers is None or plugin_for_read.write in spec.writers
    assert plugin_for_read.full_decode_graphs is bool(
        spec and spec.status == "verified" and "sm_90" in spec.arches and writer_ok
    )
    setup = make_layer(cpu_vllm, "nvfp4", num_heads=8, num_kv_heads=2, head_size=128)
    builder_cls = type(setup.builder())
    answer = {True: AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE, False: AttentionCGSupport.NEVER}
    assert builder_cls.get_cudagraph_support(setup.config, setup.spec) == answer[plugin_for_read.full_decode_graphs]
    for value in ("0", "1"):
        monkeypatch.setenv(ENV_CUDAGRAPH_DECODE, value)
        vllm_plugin.unpatch()
        load_plugin_through_entry_point()
        route = vllm_plugin.active_route()
        assert route is not None and route.full_decode_graphs is (value == "1")
        assert builder_cls.get_cudagraph_support(setup.config, setup.spec) == answer[value == "1"]


@pytest.fixture(params=[("dequant_fa3", "sm_90"), ("dequant_fa2", "sm_86")], ids=["dequant_fa3", "dequant_fa2"])
def plugin_dequant(request, cpu_vllm, clean_plugin, monkeypatch):
    """Prefill bound to a dequantize-then-attend composite (SM90 pretended for dequant_fa3, SM86 for
    dequant_fa2); the fixture's value is the impl."""
    impl, arch = request.param
    cpu_vllm.set_arch(arch)
    monkeypatch.setenv("NVFP4COMPAT_IMPL", f"write=triton,decode=triton,prefill={impl}")
    try:
        load_plugin_through_entry_point()
    except Exception as exc:  # noqa: BLE001 - e.g. no FlashInfer with the ragged wrapper in this venv
        pytest.skip(f"prefill={impl} cannot be planned here: {exc}")
    route = vllm_plugin.active_route()
    if route is None or route.read.get("prefill") != impl:
        pytest.skip(f"the plan for vLLM {cpu_vllm.version} does not route prefill to {impl}: {route}")
    return impl


def _spy_composite(monkeypatch, impl):
    from nvfp4compat.kernels.composite import prefill_dequant as comp

    name = {"dequant_fa3": "prefill_fa3", "dequant_fa2": "prefill_fa2"}[impl]
    calls = []
    real = getattr(comp, name)

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(comp, name, spy)
    return comp, calls


def test_forward_dequant_gets_host_lengths(cpu_vllm, plugin_dequant, monkeypatch):
    """The plugin hands the prefill rows' host lengths to dequant_fa3/fa2 (the reference stands in for
    FlashInfer through the composite's test hook; the device check is told the backend can run)."""
    comp, calls = _spy_composite(monkeypatch, plugin_dequant)
    monkeypatch.setattr(comp, "backend_problem", lambda device, backend: None)
    with comp.attend_backend(comp.reference_attend):
        _run_case(
            cpu_vllm, layout="NHD", head_size=128, num_heads=4, num_kv_heads=2,
            seq_lens=[37, 9, 21, 5], query_lens=[1, 1, 6, 5],
        )  # fmt: skip
    from vllm.v1.attention.backend import CommonAttentionMetadata

    assert len(calls) == 1
    if "seq_lens_cpu_upper_bound" in CommonAttentionMetadata.__dataclass_fields__:  # vLLM 0.33+
        assert calls[0]["seq_lens_cpu"].tolist() == [21, 5]
        assert calls[0]["query_start_loc_cpu"].tolist() == [0, 6, 11]


def test_forward_dequant_off_gpu_keeps_the_fused_prefill(cpu_vllm, plugin_dequant, monkeypatch):
    """A pretended GPU arch on a CPU: the first prefill finds FlashInfer's backend cannot run on the
    tensors' device and the layer keeps the fused Triton prefill (warned once); the output still
    matches the reference."""
    comp, calls = _spy_composite(monkeypatch, plugin_dequant)
    _run_case(
        cpu_vllm, layout="HND", head_size=128, num_heads=4, num_kv_heads=2,
        seq_lens=[37, 21], query_lens=[1, 6],
    )  # fmt: skip
    assert calls == []


def test_attached_metadata_carries_host_lengths(cpu_vllm, monkeypatch):
    """A route that leaves the builder to vLLM (SM12x on vLLM >= 0.32: vLLM's FA2 decode, dequant_fa2
    prefill) attaches vLLM's host lengths to its metadata, so the host-planned prefill reads no device
    tensor per layer. vLLM's own build is replaced by a stub (it plans FlashInfer wrappers: GPU only)."""
    import dataclasses

    import torch

    from nvfp4compat.vllm_plugin import backend as be

    @dataclasses.dataclass
    class Md:
        num_actual_tokens: int

    monkeypatch.setattr(be._fi.FlashInferMetadataBuilder, "build", lambda self, *a, **k: Md(12))
    builder = be.Nvfp4CompatMetadataBuilder.__new__(be.Nvfp4CompatMetadataBuilder)
    builder._nvfp4_route, builder._nvfp4_attach = None, True
    seq_lens = torch.tensor([37, 21, 5], dtype=torch.int32)
    qsl = torch.tensor([0, 1, 7, 12], dtype=torch.int32)
    cm = type("Cm", (), {})()
    cm.__dict__.update(
        num_reqs=3, block_table_tensor=torch.zeros(3, 4, dtype=torch.int32), seq_lens=seq_lens,
        query_start_loc=qsl, seq_lens_cpu=seq_lens.clone(), query_start_loc_cpu=qsl.clone(),
    )  # fmt: skip
    md = builder.build(0, cm)
    assert md.seq_lens is seq_lens and md.query_start_loc is qsl
    assert md.seq_lens_cpu.tolist() == [37, 21, 5] and md.query_start_loc_cpu.tolist() == [0, 1, 7, 12]
    impl = be.Nvfp4CompatFlashInferImpl.__new__(be.Nvfp4CompatFlashInferImpl)
    impl._nvfp4_host_lens = True
    lens = impl._nvfp4_lens_kwargs(md, 1, 2, 1)  # one decode row, two prefill rows
    assert lens["seq_lens_cpu"].tolist() == [21, 5] and lens["query_start_loc_cpu"].tolist() == [0, 6, 11]
