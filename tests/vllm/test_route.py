"""The plan is the whole decision: what ``nvfp4compat query`` prints is what the plugin applies.

Pure, no vLLM needed (runs in any venv): the plugin's own apply path is fed each plan with vLLM's
registry call replaced by a recording stand-in, for every vLLM release x arch of the matrix.
"""

from __future__ import annotations

import contextlib
import json
import sys

import pytest

import nvfp4compat
from nvfp4compat import vllm_plugin
from nvfp4compat.cli import main
from nvfp4compat.plan import VllmRoute
from nvfp4compat.resolver import WRITER_REQUIRED
from nvfp4compat.vllm_plugin import patches, summary_line
from nvfp4compat.vllm_plugin.patches import PATCH_TARGETS, REFUSE_ID

# (name, query keyword arguments, the same as `nvfp4compat query` flags)
_VARIANTS: list[tuple[str, dict, list[str]]] = [
    ("default", {}, []),
    ("no triton", {"triton": False}, ["--no-triton"]),
    ("trtllm-gen unusable", {"trtllm_gen_usable": False}, ["--no-trtllm-gen"]),
    ("4over6", {"features": ["nvfp4_4over6"]}, ["--feature", "nvfp4_4over6"]),
]


@pytest.fixture
def offline_registry(monkeypatch: pytest.MonkeyPatch) -> dict:
    """vLLM's override table replaced by a dict: the plugin's apply path runs without vLLM."""
    table: dict = {}

    def register_override(ledger, patch_id: str) -> None:  # noqa: ANN001
        ledger.record_item(patch_id, patches.REGISTRY_TARGET, table, "FLASHINFER")
        table["FLASHINFER"] = patches.OVERRIDE_PATH

    def register_dtype(ledger, name: str) -> None:  # noqa: ANN001
        table.setdefault("dtypes", []).append(name)
        ledger.record_registered(
            "register_kv_cache_dtypes", patches.DTYPE_REGISTRY_TARGET, name,
            lambda n: n in table.get("dtypes", []), lambda: _unregister(name),
        )  # fmt: skip

    def _unregister(name: str) -> None:
        table["dtypes"].remove(name)
        if not table["dtypes"]:
            del table["dtypes"]

    monkeypatch.setattr(patches, "_register_override", register_override)
    monkeypatch.setattr(patches, "_register_dtype", register_dtype)
    monkeypatch.setattr(vllm_plugin, "_set_plan_env", lambda plan: None)
    yield table
    vllm_plugin.unpatch()


def _query_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    with contextlib.suppress(SystemExit):
        main(["query", *argv, "--json"])
    return json.loads(capsys.readouterr().out)


def _query_text(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with contextlib.suppress(SystemExit):
        main(["query", *argv, "--no-trace"])
    return capsys.readouterr().out


def test_every_release_x_arch_applies_what_query_printed(
    offline_registry: dict, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NVFP4COMPAT_IMPL", raising=False)
    monkeypatch.delenv("NVFP4COMPAT_KV_ROTATION", raising=False)
    vllm_before = "vllm" in sys.modules
    m = nvfp4compat.load_matrix()
    kinds: set[str] = set()
    for arch in m.arches:
        for rel in m.vllm.releases:
            for name, kwargs, flags in _VARIANTS:
                argv = ["--arch", arch, "--vllm", rel.version, *flags]
                printed_plan = _query_json(capsys, argv)["vllm"]
                printed = printed_plan["route"]
                text = _query_text(capsys, argv)
                plan = nvfp4compat.query(arch, vllm=rel.version, impl_env=None, kv_rotation=None, **kwargs)
                where = f"{arch} vLLM {rel.version} ({name})"
                route = vllm_plugin.apply(plan)
                assert route is vllm_plugin.active_route()
                by_dtype = plan.vllm.dtype_routes
                assert {n: r.model_dump(mode="json") for n, r in by_dtype.items()} == printed_plan["dtype_routes"], where
                for n, r in by_dtype.items():
                    assert f"plugin, --kv-cache-dtype {n}: {r.describe()}" in text, where
                    assert f"--kv-cache-dtype {n} registered" in summary_line(plan), where
                assert offline_registry.get("dtypes", []) == list(by_dtype), where
                dtype_targets = {t for r in by_dtype.values() for pid in r.patches for t in PATCH_TARGETS[pid]}
                if by_dtype:
                    kinds.add("registered names")
                if route is None:
                    assert printed is None, where
                    assert set(vllm_plugin.applied()) == dtype_targets, where
                    if not by_dtype:
                        assert offline_registry == {}, where
                        assert "plugin: leaves vLLM untouched" in text, where
                    kinds.add("untouched")
                    continue
                assert route.model_dump(mode="json") == printed, where
                assert f"plugin: {route.describe()}" in text, where
                assert route.describe() in summary_line(plan), where
                ids = [REFUSE_ID] if route.refusal is not None else route.patches
                expected = {t for pid in ids for t in PATCH_TARGETS[pid]} | dtype_targets
                assert set(vllm_plugin.applied()) == expected, where
                assert offline_registry["FLASHINFER"] == patches.OVERRIDE_PATH, where
                kinds.add("refusal" if route.refusal else route.strategy)
    vllm_plugin.unpatch()
    assert offline_registry == {}  # restored
    assert kinds == {"untouched", "refusal", "backport", "extend", "registered names"}
    assert vllm_before or "vllm" not in sys.modules  # the apply path ran without importing vLLM


def test_backport_without_the_writer_helper_binds_triton() -> None:
    plan = nvfp4compat.query(arch="sm_90", flashinfer="0.6.14", vllm="0.26.0", impl_env=None)
    route = plan.vllm.route
    assert route is not None and route.strategy == "backport"
    assert {"gate_nvfp4", "metadata_builder", "kv_cache_update", "forward_reader"} <= set(route.patches)
    # on SM90 with FlashInfer's FA3 the prefill reader is the dequantize-then-attend composite
    assert route.write == "triton" and route.read == {"decode": "triton", "prefill": "dequant_fa3"}
    assert route.own_builder and route.reads_all and "nvfp4" in route.accept and route.refusal is None
    line = summary_line(plan)
    assert line.startswith("nvfp4compat: vLLM 0.26.0 on sm_90 with FlashInfer 0.6.14: backport [")
    assert "write=triton" in line and "decode=triton" in line and "prefill=dequant_fa3" in line
    forced = nvfp4compat.query(arch="sm_90", flashinfer="0.6.14", vllm="0.26.0", impl_env="prefill=triton")
    assert forced.vllm.route is not None and forced.vllm.route.read == {"decode": "triton", "prefill": "triton"}


def test_extend_routes_reads_and_keeps_vllms_writer() -> None:
    route = nvfp4compat.query(arch="sm_90", flashinfer="0.7.2.post1", vllm="0.33.0", impl_env=None).vllm.route
    assert route is not None and route.strategy == "extend"
    assert "gate_nvfp4" not in route.patches and "nvfp4" not in route.accept  # vLLM accepts it
    assert "kv_cache_update" not in route.patches and route.write is None  # vLLM 0.33's own writer stays
    assert route.read == {"decode": "triton", "prefill": "dequant_fa3"} and route.own_builder
    assert "write=vllm, decode=triton, prefill=dequant_fa3" in route.describe()


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_120"])
def test_no_fa3_arch_routes_prefill_to_dequant_fa2(arch: str) -> None:
    plan = nvfp4compat.query(arch=arch, flashinfer="0.6.14", vllm="0.26.0", impl_env=None)
    route = plan.vllm.route
    assert route is not None and route.strategy == "backport" and route.own_builder
    # off SM90 the prefill reader is the dequantize-then-attend composite over FlashInfer's FA2
    assert route.read == {"decode": "triton", "prefill": "dequant_fa2"}
    assert "prefill=dequant_fa2" in summary_line(plan)
    forced = nvfp4compat.query(arch=arch, flashinfer="0.6.14", vllm="0.26.0", impl_env="prefill=triton")
    assert forced.vllm.route is not None and forced.vllm.route.read == {"decode": "triton", "prefill": "triton"}


def test_sm120_extend_routes_only_the_prefill_to_dequant_fa2() -> None:
    """vLLM >= 0.32 serves NVFP4 on SM12x itself: its FA2 decode stays, the prefill is routed."""
    route = nvfp4compat.query(arch="sm_120", flashinfer="0.7.2.post1", vllm="0.33.0", impl_env=None).vllm.route
    assert route is not None and route.strategy == "extend" and route.write is None
    assert route.read == {"prefill": "dequant_fa2"} and "forward_reader" in route.patches


def test_a_backport_never_reads_with_vllms_flashinfer_reader() -> None:
    """SM100 with trtllm-gen unusable on vLLM >= 0.32 backports: its readers are nvfp4compat's (the
    rule is vllm.yaml's routed_readers), and an explicit FlashInfer reader is refused by the resolver."""
    plan = nvfp4compat.query(arch="sm_100", vllm="0.33.0", trtllm_gen_usable=False, impl_env=None)
    assert plan.supported and plan.vllm.strategy == "backport"
    assert plan.bindings["decode"].impl == "triton" and plan.vllm.route.reads_all
    with pytest.raises(nvfp4compat.ResolutionError, match="a backport reads with"):
        nvfp4compat.query(arch="sm_100", vllm="0.33.0", trtllm_gen_usable=False, impl_env="decode=flashinfer")


@pytest.mark.parametrize(("arch", "vllm"), [("sm_100", "0.31.0"), ("sm_75", "0.26.0")])
def test_native_and_unsupported_leave_vllm_untouched(arch: str, vllm: str) -> None:
    plan = nvfp4compat.query(arch=arch, vllm=vllm, impl_env=None)
    assert plan.vllm.route is None
    assert "left untouched" in summary_line(plan)


def test_native_keeps_nvfp4_on_vllm_and_registers_the_rotated_names() -> None:
    """SM100 with vLLM 0.33+: nvfp4 stays on vLLM's own path; the rotated names take nvfp4compat's route."""
    plan = nvfp4compat.query(arch="sm_100", vllm="0.33.0", trtllm_gen_usable=True, impl_env=None)
    assert plan.vllm.route is None and set(plan.vllm.dtype_routes) == {"nvfp4_hadamard", "nvfp4_4over6_hadamard"}
    line = summary_line(plan)
    assert "nvfp4 left to vLLM" in line and "--kv-cache-dtype nvfp4_hadamard registered: nvfp4 with kv_rotation=hadamard" in line


def test_no_writer_is_a_refusal_with_the_plans_reason() -> None:
    plan = nvfp4compat.query(arch="sm_90", flashinfer="0.6.14", vllm="0.26.0", triton=False, impl_env=None)
    route = plan.vllm.route
    assert not plan.supported and WRITER_REQUIRED in plan.reason
    assert route is not None and route.refusal is not None and route.patches == []
    assert WRITER_REQUIRED in route.refusal and "0.6.15" in route.refusal
    assert set(PATCH_TARGETS[REFUSE_ID]) >= set(PATCH_TARGETS["gate_nvfp4"])
    assert "refuse --kv-cache-dtype nvfp4 at engine start" in summary_line(plan)


def test_a_route_that_disagrees_with_its_plan_does_not_validate() -> None:
    plan = nvfp4compat.query(arch="sm_90", flashinfer="0.6.14", vllm="0.26.0", impl_env=None)
    data = plan.vllm.model_dump()
    data["patches"] = ["gate_nvfp4"]
    with pytest.raises(ValueError, match="disagrees with the plan's strategy"):
        type(plan.vllm).model_validate(data)
    bad = plan.vllm.route.model_dump()
    bad["read"], bad["combination"] = {"decode": "triton"}, False
    with pytest.raises(ValueError, match="a backport route reads with nvfp4compat's readers only"):
        VllmRoute.model_validate(bad)
