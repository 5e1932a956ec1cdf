"""The rotated NVFP4 cache as an option of the plan (NVFP4COMPAT_KV_ROTATION), on CPU.

The resolver records the rotation on every bound op with a trace line, excludes vLLM's native path
(it cannot be wrapped), ties writer and readers together (a plan whose ops disagree does not
validate), and inside vLLM routes the writer and both readers so that the plugin wraps them.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from nvfp4compat import detect, query
from nvfp4compat.plan import Plan, VllmRoute
from nvfp4compat.resolver import ResolutionError, parse_kv_rotation

OPS = ("write", "dequant", "decode", "prefill")


def _rotations(plan):
    return {op: b.options.get("kv_rotation") for op, b in plan.bindings.items() if b.impl is not None}


@pytest.mark.parametrize(
    "value,expected",
    [(None, None), ("", None), ("none", None), (" NONE ", None), ("hadamard", "hadamard"), ("Hadamard", "hadamard")],
)
def test_parse_kv_rotation(value, expected):
    assert parse_kv_rotation(value) == expected


@pytest.mark.parametrize("value", ["1", "on", "hadamard64", "walsh"])
def test_parse_kv_rotation_is_strict(value):
    with pytest.raises(ResolutionError, match=r"NVFP4COMPAT_KV_ROTATION=.*accepted values are \['hadamard'\]"):
        parse_kv_rotation(value)
    with pytest.raises(ResolutionError, match="accepted values"):
        query("sm_90", "0.6.15", kv_rotation=value, impl_env=None)


def test_unrotated_by_default():
    plan = query("sm_90", "0.6.15", kv_rotation=None, impl_env=None)
    assert plan.kv_rotation is None
    assert set(_rotations(plan).values()) == {None}
    assert "kv_rotation:" not in plan.render_text(trace=False)


@pytest.mark.parametrize(
    "facts",
    [
        dict(arch="sm_90", flashinfer="0.6.15"),
        dict(arch="sm_80", flashinfer="0.7.4"),
        dict(arch="sm_90", vllm="0.26.0"),
        dict(arch="sm_90", vllm="0.33.0"),
        dict(arch="sm_120", vllm="0.33.0"),
    ],
)
def test_rotation_is_on_every_bound_op_with_a_trace_line(facts):
    plan = query(**facts, kv_rotation="hadamard", impl_env=None)
    assert plan.supported, plan.reason
    assert plan.kv_rotation == "hadamard"
    assert set(_rotations(plan)) >= {"write", "decode", "prefill"}
    assert set(_rotations(plan).values()) == {"hadamard"}
    assert plan.features["kv_rotation"] is True
    assert [t for t in plan.trace if t.rule == "kv_rotation" and t.accepted]
    text = plan.render_text()
    assert "kv_rotation: hadamard" in text and "NVFP4COMPAT_KV_ROTATION: hadamard" in text
    assert '"kv_rotation": "hadamard"' in plan.to_json()


def test_an_unsupported_plan_still_records_the_request():
    plan = query(None, kv_rotation="hadamard", impl_env=None)  # no arch: nothing binds
    assert not plan.supported and plan.kv_rotation == "hadamard"
    plan = query("sm_75", vllm="0.33.0", kv_rotation="hadamard", impl_env=None)
    assert not plan.supported


def test_the_feature_request_turns_it_on():
    plan = query("sm_90", "0.6.15", kv_rotation=None, impl_env=None, features=["kv_rotation"])
    assert plan.kv_rotation == "hadamard"


def test_detect_reads_the_environment():
    facts = detect(environ={"NVFP4COMPAT_KV_ROTATION": "hadamard"})
    assert facts.kv_rotation_env == "hadamard"


def test_rotation_excludes_vllms_native_path():
    plain = query("sm_100", vllm="0.33.0", trtllm_gen_usable=True, kv_rotation=None, impl_env=None)
    assert plain.bindings["write"].impl == "native"
    rot = query("sm_100", vllm="0.33.0", trtllm_gen_usable=True, kv_rotation="hadamard", impl_env=None)
    assert rot.supported and rot.kv_rotation == "hadamard"
    # the Triton kernels and the dequant composites fuse the rotation (matrix: kv_rotation's ops)
    assert {rot.bindings[op].impl for op in ("write", "decode")} <= {"triton", "flashinfer"}
    assert rot.bindings["prefill"].impl in ("triton", "dequant_fa2", "dequant_fa3")
    assert any(
        t.impl == "native" and not t.accepted and "kv_rotation" in t.reason for t in rot.trace
    ), "the trace says why native was rejected"
    with pytest.raises(ResolutionError, match="kv_rotation"):
        query("sm_100", vllm="0.33.0", trtllm_gen_usable=True, kv_rotation="hadamard", impl_env="native")


def test_inside_vllm_the_readers_are_routed_and_wrapped():
    # SM120 + vLLM 0.33: the unrotated plan reads with vLLM's FlashInfer reader and keeps its writer
    plain = query("sm_120", vllm="0.33.0", kv_rotation=None, impl_env=None)
    assert plain.bindings["decode"].impl == "flashinfer"
    rot = query("sm_120", vllm="0.33.0", kv_rotation="hadamard", impl_env=None)
    # decode on the Triton reader, prefill on the FA2 composite, which fuses the rotation into its dequantizer
    assert rot.bindings["decode"].impl == "triton" and rot.bindings["prefill"].impl == "dequant_fa2"
    assert {"kv_cache_update", "forward_reader"} <= set(rot.vllm.patches)
    route = rot.vllm.route
    assert route is not None and route.kv_rotation == "hadamard"
    assert route.write in ("flashinfer", "triton") and route.reads_all
    with pytest.raises(ResolutionError, match="kv_rotation"):
        query("sm_120", vllm="0.33.0", kv_rotation="hadamard", impl_env="decode=flashinfer")


def test_route_refuses_a_rotated_plan_that_leaves_a_reader_to_vllm():
    rot = query("sm_90", vllm="0.33.0", kv_rotation="hadamard", impl_env=None)
    data = rot.vllm.route.model_dump()
    data["read"] = {"prefill": data["read"]["prefill"]}
    with pytest.raises(ValidationError, match="read a rotated cache unrotated"):
        VllmRoute.model_validate(data)


def test_a_plan_whose_writer_and_readers_disagree_does_not_validate():
    rot = query("sm_90", "0.6.15", kv_rotation="hadamard", impl_env=None)
    data = rot.model_dump()
    data["bindings"]["decode"]["options"] = {}
    with pytest.raises(ValidationError, match="never read unrotated"):
        Plan.model_validate(data)
    data = rot.model_dump()
    data["kv_rotation"] = None
    with pytest.raises(ValidationError, match="plan.kv_rotation is None"):
        Plan.model_validate(data)


def test_plan_kernel_wraps_what_the_plan_binds():
    pytest.importorskip("torch")
    from nvfp4compat.kernels import get_kernel
    from nvfp4compat.kernels.rotation import RotationError, plan_kernel

    plain = query("sm_90", "0.6.15", kv_rotation=None, impl_env="triton")
    assert plan_kernel(plain, "decode") is get_kernel("decode", "triton")
    rot = query("sm_90", "0.6.15", kv_rotation="hadamard", impl_env="triton")
    for op in OPS:
        fn = plan_kernel(rot, op)
        assert fn.kv_rotation == "hadamard" and fn.__wrapped__ is get_kernel(op, rot.bindings[op].impl)

    class Duck:  # a plan-like object that skipped validation
        bindings = {**rot.bindings, "prefill": plain.bindings["prefill"]}

    with pytest.raises(RotationError, match="prefill=unrotated"):
        plan_kernel(Duck(), "write")


def test_every_matrix_cell_resolves_rotated_into_a_consistent_route():
    """Every (arch, vLLM release) of the matrix: the rotated plan validates, never binds native, and a
    supported one routes the writer and both readers (or leaves vLLM untouched)."""
    from nvfp4compat import load_matrix

    m = load_matrix()
    checked = 0
    for arch in m.arches:
        for rel in m.vllm.releases:
            for trtllm in (True, False):
                plan = query(arch, vllm=rel.version, trtllm_gen_usable=trtllm, kv_rotation="hadamard", impl_env=None)
                assert plan.kv_rotation == "hadamard"
                assert all(b.impl != "native" for b in plan.bindings.values())
                if not plan.supported:
                    continue
                route = plan.vllm.route
                assert route is not None and route.kv_rotation == "hadamard", (arch, rel.version)
                assert route.write is not None and route.reads_all, (arch, rel.version)
                checked += 1
    assert checked > 0


# ------------------------------------------------------------ the rotated cache's own --kv-cache-dtype names


@pytest.mark.parametrize("vllm", ["0.33.0", "0.34.0"])
def test_releases_with_the_dtype_registry_get_a_route_per_rotated_name(vllm):
    """vLLM 0.33+ can register --kv-cache-dtype names: the plan offers nvfp4_hadamard (and
    nvfp4_4over6_hadamard where the release lists nvfp4_4over6) with the route the rotated plan takes,
    plus the registration patch and the name at the gate; plain nvfp4 keeps the unrotated route."""
    plan = query("sm_90", vllm=vllm, kv_rotation=None, impl_env=None)
    rotated = query("sm_90", vllm=vllm, kv_rotation="hadamard", impl_env=None)
    assert plan.supported and plan.kv_rotation is None and plan.vllm is not None
    routes = plan.vllm.dtype_routes
    assert set(routes) == {"nvfp4_hadamard", "nvfp4_4over6_hadamard"}
    assert plan.vllm.kv_cache_dtypes[-2:] == ["nvfp4_hadamard", "nvfp4_4over6_hadamard"]
    main = plan.vllm.route
    assert main is None or (main.kv_rotation is None and main.kv_cache_dtype is None)
    hr = routes["nvfp4_hadamard"]
    assert hr.kv_rotation == "hadamard" and hr.kv_cache_dtype == "nvfp4_hadamard" and hr.base_dtype == "nvfp4"
    assert "register_kv_cache_dtypes" in hr.patches and "nvfp4_hadamard" in hr.accept
    assert rotated.vllm is not None and rotated.vllm.route is not None
    assert (hr.write, hr.read) == (rotated.vllm.route.write, rotated.vllm.route.read)
    assert hr.handles("nvfp4_hadamard") and not hr.handles("nvfp4") and not hr.handles("nvfp4_4over6_hadamard")
    assert not hr.is_4over6("nvfp4_hadamard")
    fr = routes["nvfp4_4over6_hadamard"]
    assert fr.base_dtype == "nvfp4_4over6" and fr.write == "triton" and fr.write_4over6
    assert fr.is_4over6("nvfp4_4over6_hadamard")
    text = plan.render_text(trace=True)
    assert "plugin, --kv-cache-dtype nvfp4_hadamard:" in text and "registered with vLLM" in text
    # already rotated by the environment: every NVFP4 layer is rotated, no extra names
    assert rotated.vllm.dtype_routes == {}


@pytest.mark.parametrize("vllm", ["0.26.0", "0.32.0"])
def test_releases_without_the_registry_turn_rotation_on_by_the_environment_only(vllm):
    plan = query("sm_90", vllm=vllm, kv_rotation=None, impl_env=None)
    assert plan.supported and plan.vllm is not None and plan.vllm.dtype_routes == {}
    assert "nvfp4_hadamard" not in plan.vllm.kv_cache_dtypes
    notes = [t.reason for t in plan.trace if t.rule == "kv_cache_dtypes"]
    assert notes and "NVFP4COMPAT_KV_ROTATION=hadamard" in notes[0] and "0.33.0+" in notes[0]


def test_a_dtype_route_must_serve_and_accept_its_own_name():
    plan = query("sm_90", vllm="0.34.0", kv_rotation=None, impl_env=None)
    hr = plan.vllm.dtype_routes["nvfp4_hadamard"]
    with pytest.raises(ValidationError, match="must accept it at the gate"):
        VllmRoute(**{**hr.model_dump(), "accept": []})
    with pytest.raises(ValidationError, match="names both its kv_cache_dtype and base_dtype"):
        VllmRoute(**{**hr.model_dump(), "base_dtype": None})
    with pytest.raises(ValidationError, match="must serve that name"):
        Plan(**{**plan.model_dump(), "vllm": {**plan.vllm.model_dump(), "dtype_routes": {"nvfp4_other": hr.model_dump()}}})
