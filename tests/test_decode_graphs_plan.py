"""FULL decode graphs as a decision of the plan (matrix fact + NVFP4COMPAT_CUDAGRAPH_DECODE), on CPU.

The matrix says, per vLLM release, on which arches FULL CUDA graphs over the plugin's decode reader
were verified in an engine; the resolver puts the answer on the vLLM route, the switch overrides it,
and the plugin applies it (tests/vllm/test_forward.py checks the builder's answer).
"""

from __future__ import annotations

import pytest

from nvfp4compat import load_matrix, query
from nvfp4compat.resolver import ResolutionError, parse_cudagraph_decode


def _route(arch, vllm, switch=None, impl="triton"):
    plan = query(arch, vllm=vllm, impl_env=impl, kv_rotation=None, cudagraph_decode=switch)
    assert plan.supported, plan.reason
    assert plan.vllm is not None and plan.vllm.route is not None, plan.render_text(trace=False)
    return plan


@pytest.mark.parametrize("value,expected", [(None, None), ("", None), (" 1 ", True), ("0", False)])
def test_parse_cudagraph_decode(value, expected):
    assert parse_cudagraph_decode(value) is expected


@pytest.mark.parametrize("value", ["yes", "true", "on", "nope", "2"])
def test_parse_cudagraph_decode_is_strict(value):
    with pytest.raises(ResolutionError, match=r"NVFP4COMPAT_CUDAGRAPH_DECODE=.* is not a switch; set it to 1"):
        parse_cudagraph_decode(value)
    with pytest.raises(ResolutionError, match="is not a switch"):
        query("sm_90", vllm="0.26.0", impl_env="triton", kv_rotation=None, cudagraph_decode=value)


def test_verified_release_and_arch_get_full_decode_graphs():
    plan = _route("sm_90", "0.26.0")
    assert plan.vllm.route.full_decode_graphs
    assert "FULL decode graphs" in plan.vllm.route.describe()
    assert any("full_decode_graphs" in line and "verified on sm_90" in line for line in plan.render_text().splitlines())


@pytest.mark.parametrize("arch,vllm", [("sm_86", "0.26.0"), ("sm_120", "0.26.0"), ("sm_90", "0.31.0")])
def test_unverified_release_or_arch_stays_eager(arch, vllm):
    plan = _route(arch, vllm)
    assert not plan.vllm.route.full_decode_graphs
    assert "FULL decode graphs" not in plan.vllm.route.describe()


@pytest.mark.parametrize("arch,vllm", [("sm_90", "0.26.0"), ("sm_86", "0.31.0")])
def test_the_switch_overrides_the_matrix(arch, vllm):
    assert _route(arch, vllm, "1").vllm.route.full_decode_graphs
    assert not _route(arch, vllm, "0").vllm.route.full_decode_graphs


def test_every_matrix_entry_names_arches_the_strategy_serves():
    """A verified entry is only meaningful where the plugin routes its own decode reader."""
    for rel in load_matrix().vllm.releases:
        spec = rel.plugin.full_decode_graphs
        if spec is None:
            continue
        assert spec.evidence.strip()
        for arch in spec.arches:
            assert rel.strategy.for_arch(arch) in ("backport", "extend"), (rel.version, arch)
            assert "triton" in rel.plugin.decode, rel.version


def test_full_decode_graphs_need_the_writer_they_were_verified_with():
    """The graph captures the KV write too: vLLM 0.26.0's FULL decode graphs were verified with the
    Triton writer (FlashInfer 0.6.14 has no slot-mapping writer), so a plan that binds FlashInfer's
    writer (0.6.15+) stays piecewise, says why and how to get the verified pairing; the switch still
    overrides."""
    spec = next(r for r in load_matrix().vllm.releases if r.version == "0.26.0").plugin.full_decode_graphs
    assert spec is not None and spec.writers == ["triton"]
    pinned = query("sm_90", vllm="0.26.0", flashinfer="0.6.14", kv_rotation=None)
    assert pinned.vllm.route.write == "triton" and pinned.vllm.route.full_decode_graphs
    newer = query("sm_90", vllm="0.26.0", flashinfer="0.6.15", kv_rotation=None)
    assert newer.vllm.route.write == "flashinfer" and not newer.vllm.route.full_decode_graphs
    line = next(ln for ln in newer.render_text().splitlines() if "full_decode_graphs" in ln)
    assert "verified on sm_90 with the triton writer only" in line and "NVFP4COMPAT_IMPL=write=triton" in line
    paired = query("sm_90", vllm="0.26.0", flashinfer="0.6.15", impl_env="write=triton", kv_rotation=None)
    assert paired.vllm.route.write == "triton" and paired.vllm.route.full_decode_graphs
    forced = query("sm_90", vllm="0.26.0", flashinfer="0.6.15", kv_rotation=None, cudagraph_decode="1")
    assert forced.vllm.route.full_decode_graphs
