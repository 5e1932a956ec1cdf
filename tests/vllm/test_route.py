"""From resolved plans to the plugin's route: pure, no vLLM needed (runs in any venv)."""

from __future__ import annotations

import pytest

import nvfp4compat
from nvfp4compat.vllm_plugin import NO_WRITER_ERROR, summary_line
from nvfp4compat.vllm_plugin.patches import PATCH_TARGETS, REFUSE_ID
from nvfp4compat.vllm_plugin.route import RouteError, route_from_plan


def test_backport_without_the_writer_helper_binds_triton():
    plan = nvfp4compat.query(arch="sm_90", flashinfer="0.6.14", vllm="0.26.0")
    route = route_from_plan(plan)
    assert route is not None and route.strategy == "backport"
    assert {"gate_nvfp4", "metadata_builder", "kv_cache_update", "forward_reader"} <= set(
        route.patches
    )
    # on SM90 with FlashInfer's FA3 the prefill reader is the dequantize-then-attend composite (issue 15)
    assert route.write == "triton" and route.read == {"decode": "triton", "prefill": "dequant_fa3"}
    assert (
        route.own_builder and route.reads_all and "nvfp4" in route.accept and route.refusal is None
    )
    line = summary_line(plan, route)
    assert line.startswith("nvfp4compat: vLLM 0.26.0 on sm_90 with FlashInfer 0.6.14: backport [")
    assert "write=triton" in line and "decode=triton" in line and "prefill=dequant_fa3" in line
    forced = route_from_plan(
        nvfp4compat.query(arch="sm_90", flashinfer="0.6.14", vllm="0.26.0", impl_env="prefill=triton")
    )
    assert forced is not None and forced.read == {"decode": "triton", "prefill": "triton"}


def test_backport_with_the_writer_helper_binds_flashinfer():
    route = route_from_plan(
        nvfp4compat.query(arch="sm_86", flashinfer="0.7.0.post1", vllm="0.31.0")
    )
    assert route is not None and route.strategy == "backport" and route.write == "flashinfer"


def test_extend_routes_reads_and_keeps_vllms_writer():
    plan = nvfp4compat.query(arch="sm_90", flashinfer="0.7.2.post1", vllm="0.33.0")
    route = route_from_plan(plan)
    assert route is not None and route.strategy == "extend"
    assert "gate_nvfp4" not in route.patches and "nvfp4" not in route.accept  # vLLM accepts it
    if "kv_cache_update" not in route.patches:
        assert route.write is None  # vLLM 0.33's own FlashInfer writer stays
    if "forward_reader" in route.patches and route.reads_all:
        assert route.own_builder


@pytest.mark.parametrize(
    ("arch", "vllm"),
    [("sm_100", "0.33.0"), ("sm_75", "0.26.0")],
)
def test_native_and_unsupported_leave_vllm_untouched(arch, vllm):
    plan = nvfp4compat.query(
        arch=arch, flashinfer="0.7.2.post1" if vllm == "0.33.0" else "0.6.14", vllm=vllm
    )
    assert route_from_plan(plan) is None
    assert "left untouched" in summary_line(plan, None)


def test_no_writer_is_a_refusal_with_the_plans_reason():
    plan = nvfp4compat.query(arch="sm_90", flashinfer="0.6.14", vllm="0.26.0", triton=False)
    assert not plan.supported and NO_WRITER_ERROR in plan.reason
    assert route_from_plan(plan) is None  # unless the caller says the GPU is servable
    route = route_from_plan(plan, refuse_here=True)
    assert route is not None and route.refusal is not None and route.patches == ()
    assert NO_WRITER_ERROR in route.refusal and "0.6.15" in route.refusal
    assert set(PATCH_TARGETS[REFUSE_ID]) >= {t for t in PATCH_TARGETS["gate_nvfp4"]}


def test_unknown_patch_id_is_an_error():
    plan = nvfp4compat.query(arch="sm_90", flashinfer="0.6.14", vllm="0.26.0")
    broken = plan.model_copy(
        update={"vllm": plan.vllm.model_copy(update={"patches": ["gate_everything"]})}
    )
    with pytest.raises(RouteError, match="unknown vLLM patch ids"):
        route_from_plan(broken)
