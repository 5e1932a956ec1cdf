"""The pure resolver: expected plans, precedence, probes, unknown releases/arches, version checks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import nvfp4compat
from nvfp4compat import Plan, ResolutionError, SystemFacts, detect, load_matrix, query, resolve
from nvfp4compat.resolver import WRITER_REQUIRED, parse_impl_spec

REPO = Path(__file__).resolve().parent.parent
SLOT = "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping"
M = load_matrix()


def q(arch: str | None, flashinfer: str | None = None, vllm: str | None = None, **kw: object) -> Plan:
    kw.setdefault("impl_env", None)
    return query(arch, flashinfer, vllm, **kw)  # type: ignore[arg-type]


# ----------------------------------------------------------------------- issue 2 results


def test_sm90_fi0614_vllm0260_binds_triton_writer() -> None:
    p = q("sm_90", "0.6.14", "0.26.0")
    assert p.supported
    assert p.impl("write") == "triton" and p.bindings["write"].source == "fallback"
    assert any(t.op == "write" and t.impl == "flashinfer" and not t.accepted and "lacks" in t.reason for t in p.trace)
    assert any("write: flashinfer preferred but rejected" in w for w in p.warnings)
    assert p.vllm is not None and p.vllm.strategy == "backport"


def test_sm90_fi0615_binds_flashinfer_writer() -> None:
    p = q("sm_90", "0.6.15", "0.26.0")
    assert p.supported and p.impl("write") == "flashinfer" and p.bindings["write"].source == "matrix"
    assert p.impl("dequant") == "triton"  # measured 6.8x faster than FlashInfer's on an H200
    assert p.bindings["write"].options == {"nvfp4_4over6": False}


def test_sm100_trtllm_usable_vllm0330_is_native_without_patch() -> None:
    p = q("sm_100", None, "0.33.0", trtllm_gen_usable=True)
    assert p.supported
    assert [p.impl(o) for o in ("write", "decode", "prefill")] == ["native"] * 3
    assert p.vllm is not None and p.vllm.strategy == "native" and p.vllm.patches == []
    assert p.vllm.route is None  # nvfp4 and nvfp4_4over6 stay on vLLM's own path
    # the rotated cache's own names (0.33+ registers them) take nvfp4compat's rotated route
    assert p.vllm.kv_cache_dtypes == ["nvfp4", "nvfp4_4over6", "nvfp4_hadamard", "nvfp4_4over6_hadamard"]
    assert all(r.kv_rotation == "hadamard" and "native" not in (r.write, *r.read.values()) for r in p.vllm.dtype_routes.values())


def test_sm86_vllm0310_needs_the_backport_patch_set() -> None:
    p = q("sm_86", None, "0.31.0")
    assert p.supported and p.vllm is not None and p.vllm.strategy == "backport"
    for pid in ("gate_nvfp4", "metadata_builder", "kv_cache_update", "forward_reader"):
        assert pid in p.vllm.patches
    # vLLM 0.31.0 pins a FlashInfer with the FA2 ragged run: prefill is the dequantize-then-attend composite
    assert p.impl("decode") == "triton" and p.impl("prefill") == "dequant_fa2"
    assert "gate_combination" in p.vllm.patches


def test_sm75_is_refused_with_a_reason() -> None:
    p = q("sm_75", None, "0.26.0")
    assert not p.supported
    assert p.reason and "sm_75 (turing) is not supported" in p.reason
    assert p.vllm is not None and p.vllm.strategy == "none" and "7.5" in p.vllm.reason


def test_no_writer_at_all_says_what_to_install() -> None:
    p = q("sm_90", "0.6.14", "0.26.0", triton=False)
    assert not p.supported and p.reason is not None
    assert p.reason.startswith(WRITER_REQUIRED)
    assert "found FlashInfer 0.6.14 without " + SLOT in p.reason
    assert "0.6.15..0.7.4" in p.reason  # generated from the matrix
    assert "Triton fallback" in p.reason and "NVFP4COMPAT_DISABLE_TRITON" in p.reason
    p2 = q("sm_90", "0.6.14", None, triton=True, triton_disabled=True)
    assert not p2.supported and p2.reason.startswith(WRITER_REQUIRED) and "disabled by NVFP4COMPAT_DISABLE_TRITON" in p2.reason


def test_extend_on_hopper_with_vllm_032_and_033() -> None:
    for v in ("0.32.0", "0.33.0"):
        p = q("sm_90", None, v)
        assert p.vllm is not None and p.vllm.strategy == "extend"
        assert p.vllm.patches == ["gate_combination", "forward_reader"], v
        assert p.impl("write") == "flashinfer"
    p = q("sm_90", None, "0.33.0", overrides="decode=flashinfer,prefill=flashinfer")
    assert p.vllm.strategy == "extend" and p.vllm.patches == []
    assert "already matches the plan" in p.vllm.reason


def test_4over6_feature_binds_triton_writer_and_gates() -> None:
    p = q("sm_90", None, "0.33.0", features=["nvfp4_4over6"])
    assert p.impl("write") == "triton" and p.bindings["write"].options == {"nvfp4_4over6": True}
    assert "kv_cache_update" in p.vllm.patches and "gate_nvfp4_4over6" in p.vllm.patches
    assert p.vllm.kv_cache_dtypes[:2] == ["nvfp4", "nvfp4_4over6"]  # then the rotated names 0.33+ registers
    old = q("sm_90", None, "0.26.0", features=["nvfp4_4over6"])  # 0.26.0 does not list the dtype
    assert not old.supported and "does not list nvfp4_4over6" in old.reason
    standalone = q("sm_90", "0.7.4", None, features=["nvfp4_4over6"])  # FlashInfer 0.7.4's writer has it
    assert standalone.impl("write") == "flashinfer" and standalone.features["nvfp4_4over6"]


def test_flashinfer_reader_inside_old_vllm_is_refused_with_reason() -> None:
    with pytest.raises(ResolutionError, match=r"needs vLLM >= 0\.32\.0"):
        q("sm_90", "0.6.15", "0.26.0", overrides={"decode": "flashinfer"})
    p = q("sm_90", "0.6.15", None, overrides={"decode": "flashinfer"})
    assert p.impl("decode") == "flashinfer" and p.bindings["decode"].source == "argument"


def test_sm87_dequant_falls_back_to_triton() -> None:
    p = q("sm_87", "0.7.4", None)
    assert p.impl("dequant") == "triton"
    assert any(t.op == "dequant" and t.impl == "flashinfer" and "SM87 is not in" in t.reason for t in p.trace)


def test_sm110_and_sm107_with_old_flashinfer() -> None:
    p = q("sm_110", None, "0.33.0")
    assert not p.supported and p.vllm.strategy == "none"
    p107 = q("sm_107", None, "0.26.0", trtllm_gen_usable=True)  # FI 0.6.14: trtllm-gen rejects SM107
    assert p107.impl("decode") != "native" and p107.vllm.strategy == "backport"
    p107b = q("sm_107", None, "0.29.0", trtllm_gen_usable=True)
    assert p107b.vllm.strategy == "native"


def test_sm100_without_trtllm_falls_back_to_backport() -> None:
    p = q("sm_100", None, "0.33.0", trtllm_gen_usable=False)
    assert p.supported and p.impl("decode") in ("flashinfer", "triton")
    assert p.vllm.strategy == "backport" and "gate_nvfp4" in p.vllm.patches


# -------------------------------------------------------------------------- precedence


def test_precedence_argument_beats_env_beats_matrix() -> None:
    base = q("sm_90", "0.6.15", None)
    assert base.impl("write") == "flashinfer"
    env = q("sm_90", "0.6.15", None, impl_env="triton")
    assert all(b.impl == "triton" and b.source == "environment" for b in env.bindings.values())
    mixed = q("sm_90", "0.6.15", None, impl_env="triton", overrides={"write": "flashinfer"})
    assert mixed.bindings["write"].source == "argument" and mixed.impl("write") == "flashinfer"
    assert mixed.bindings["decode"].source == "environment"
    per_op = q("sm_90", "0.6.15", None, impl_env="write=triton,decode=flashinfer")
    assert per_op.impl("write") == "triton" and per_op.impl("decode") == "flashinfer" and per_op.bindings["prefill"].source == "matrix"


def test_query_reads_nvfp4compat_impl_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVFP4COMPAT_IMPL", "write=triton")
    p = query("sm_90", "0.6.15")
    assert p.impl("write") == "triton" and p.bindings["write"].source == "environment"
    assert p.facts.impl_env == "write=triton"


def test_explicit_request_that_cannot_run_raises_with_found_needed_way_out() -> None:
    with pytest.raises(ResolutionError) as ei:
        q("sm_90", "0.6.14", None, overrides="write=flashinfer")
    msg = str(ei.value)
    assert "lacks " + SLOT in msg and "Found: arch sm_90, flashinfer 0.6.14" in msg and "Way out:" in msg
    with pytest.raises(ResolutionError, match="NVFP4COMPAT_IMPL=triton asks for triton"):
        q("sm_90", "0.6.15", None, triton=False, impl_env="triton")
    with pytest.raises(ResolutionError, match="no native implementation"):
        q("sm_100", None, "0.33.0", trtllm_gen_usable=True, overrides={"dequant": "native"})
    with pytest.raises(ResolutionError, match="all-or-none"):
        q("sm_100", None, "0.33.0", trtllm_gen_usable=True, overrides={"write": "native", "decode": "triton"})


def test_native_group_is_excluded_when_one_op_is_overridden() -> None:
    p = q("sm_100", None, "0.33.0", trtllm_gen_usable=True, overrides={"write": "triton"})
    assert p.impl("decode") != "native" and p.impl("prefill") != "native"
    assert any(t.impl == "native" and t.rule == "group" for t in p.trace)


@pytest.mark.parametrize("bad", ["cuda", "write=cuda", "writ=triton", "write"])
def test_bad_impl_spec(bad: str) -> None:
    with pytest.raises(ResolutionError):
        parse_impl_spec(bad)


def test_unknown_feature_is_an_error() -> None:
    with pytest.raises(ResolutionError, match="unknown feature"):
        q("sm_90", "0.6.15", features=["fp8"])


# ------------------------------------------------------------- probes, unknown releases


def test_probe_wins_over_matrix_and_warning_names_both() -> None:
    helpers = {h: False for h in M.flashinfer_release("0.6.15").helpers}
    p = q("sm_90", "0.6.15", None, helpers=helpers)
    assert p.impl("write") == "triton"
    w = [x for x in p.warnings if "disagree" in x and SLOT in x]
    assert w and "flashinfer.yaml says" in w[0] and "lacks it" in w[0] and "the probe wins" in w[0]
    helpers14 = {h: M.flashinfer_release("0.6.14").helpers[h].present for h in helpers} | {SLOT: True}
    p2 = q("sm_90", "0.6.14", None, helpers=helpers14)
    assert p2.impl("write") == "flashinfer" and p2.bindings["write"].source == "probe"


@pytest.mark.parametrize("version", ["0.7.5.dev20261101", "0.8.0", "0.6.15+cu129", "0.7.0rc1", "0.5.3"])
def test_unknown_flashinfer_release_is_unverified_never_a_crash(version: str) -> None:
    p = q("sm_90", version, None)
    assert any(version in u for u in p.unverified)
    assert p.supported or p.reason


def test_unknown_release_resolved_from_probe() -> None:
    helpers = {h: True for h in M.flashinfer_release("0.7.4").helpers}
    p = q("sm_90", "0.7.5.dev20261101", None, helpers=helpers)
    assert p.impl("write") == "flashinfer" and p.bindings["write"].source == "probe"
    assert any("nearest known release 0.7.4" in u for u in p.unverified)


def test_unknown_vllm_release_uses_nearest_or_refuses() -> None:
    p = q("sm_90", "0.7.2.post1", "0.33.1")
    assert p.vllm.strategy == "extend" and any("vllm 0.33.1" in u for u in p.unverified)
    old = q("sm_90", "0.6.15", "0.24.0")
    assert not old.supported and "older than every release" in old.vllm.reason


def test_arch_forms_and_errors() -> None:
    assert q("9.0", "0.6.15").facts.arch == "sm_90"
    assert q("sm90", "0.6.15").facts.arch == "sm_90"
    with pytest.raises(ValueError, match="invalid arch 'sm_9O'"):
        q("sm_9O", "0.6.15")
    p = q("sm_130", "0.7.4", None)
    assert p.supported and all(b.impl == "triton" for b in p.bindings.values())
    assert any("sm_130" in u for u in p.unverified)
    p2 = q("sm_130", "0.7.4", None, triton=False)
    assert not p2.supported and "Triton is not installed" in p2.reason
    p3 = q("sm_130", "0.7.4", "0.33.0")
    assert not p3.supported and "13.0" in p3.vllm.reason


def test_no_arch_resolves_what_it_can() -> None:
    p = resolve(M, SystemFacts(triton="3.9.0", flashinfer="0.6.15"))
    assert not p.supported and p.reason.startswith("no GPU arch known")
    assert any("no CUDA GPU detected" in w for w in p.warnings)


# ----------------------------------------------------------------------- version check


def test_mismatched_cubin_on_raise_release_sets_env_when_no_cubin_kernel() -> None:
    p = q("sm_90", "0.6.15", "0.25.1")  # vLLM 0.25.1 pins flashinfer-cubin==0.6.13
    assert p.facts.flashinfer_cubin == "0.6.13"
    assert p.env == {"FLASHINFER_DISABLE_VERSION_CHECK": "1"}
    assert any(t.rule == "version_check" and t.accepted for t in p.trace)


def test_mismatched_cubin_with_native_path_warns_instead() -> None:
    p = q("sm_100", "0.6.15", "0.25.1", trtllm_gen_usable=True)
    assert p.vllm.strategy == "native" and p.env == {}
    assert any("not bypassing" in w and "flashinfer-cubin==0.6.15" in w for w in p.warnings)


def test_mismatch_on_warning_release_changes_no_env() -> None:
    p = q("sm_90", "0.7.4", None, flashinfer_cubin="0.7.2.post1")
    assert p.env == {} and any("only warns" in t.reason for t in p.trace if t.rule == "version_check")
    assert any("ignores the mismatched package" in w for w in p.warnings)


def test_mismatched_jit_cache_with_flashinfer_modules_is_not_bypassed() -> None:
    p = q("sm_90", "0.6.15", None, flashinfer_jit_cache="0.6.14+cu129")
    assert p.env == {} and any("JIT modules" in w for w in p.warnings)
    ok = q("sm_90", "0.6.15", None, flashinfer_jit_cache="0.6.15+cu129")
    assert ok.env == {}
    tri = q("sm_90", "0.6.15", None, flashinfer_jit_cache="0.6.14+cu129", overrides="triton")
    assert tri.env == {"FLASHINFER_DISABLE_VERSION_CHECK": "1"}


# ------------------------------------------------------------------------- the big grid


@pytest.mark.parametrize("vllm", [r.version for r in M.vllm.releases] + [None])
def test_every_combination_yields_a_plan(vllm: str | None) -> None:
    """Every vLLM x FlashInfer x arch combination: supported, or unsupported with a reason."""
    for fi in M.flashinfer:
        for arch in M.arches:
            for trtllm in (True, None):
                p = q(arch, fi.version, vllm, trtllm_gen_usable=trtllm)
                assert p.supported or (p.reason and p.reason.strip()), (arch, fi.version, vllm)
                assert set(p.bindings) == {"write", "dequant", "decode", "prefill"}
                if p.supported and vllm is not None:
                    assert p.vllm is not None and p.vllm.strategy != "none"
                    assert p.vllm.patches == [x for x in ("gate_nvfp4", "gate_nvfp4_4over6", "gate_combination", "metadata_builder", "kv_cache_update", "forward_reader") if x in p.vllm.patches]


# --------------------------------------------------------------------------- rendering


def test_plan_renders_text_and_json() -> None:
    p = q("sm_90", "0.6.14", "0.26.0")
    text = p.render_text()
    assert "plan: SUPPORTED" in text and "write    -> triton" in text and "trace:" in text
    data = json.loads(p.to_json())
    assert data["bindings"]["write"]["impl"] == "triton" and data["vllm"]["strategy"] == "backport"
    assert Plan.model_validate(data) == p


def test_public_api() -> None:
    assert nvfp4compat.__version__ == "0.1.0"
    for name in ("query", "detect", "resolve", "load_matrix", "Plan", "SystemFacts"):
        assert hasattr(nvfp4compat, name)
    from nvfp4compat.api import query as api_query

    assert nvfp4compat.query is api_query


def test_the_resolver_imports_nothing_from_the_package_root() -> None:
    import ast

    tree = ast.parse((REPO / "nvfp4compat" / "resolver.py").read_text(encoding="utf-8"))
    from_modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "nvfp4compat" not in from_modules  # no import back up (e.g. __version__)
    assert "os" not in imported  # it reads no environment: query() in nvfp4compat.api does


def test_resolve_is_a_function_of_what_it_is_given() -> None:
    """The same matrix and facts give the same plan, whatever was resolved in between."""
    facts = SystemFacts(arch="sm_90", flashinfer="0.6.14", vllm="0.26.0", triton="any")
    first = resolve(M, facts)
    resolve(M, facts.model_copy(update={"triton": None}))
    assert resolve(M, facts) == first


# ------------------------------------------------------------------- facts from the matrix


def test_helper_names_and_first_releases_come_from_the_matrix() -> None:
    from nvfp4compat.flashinfer_probe import (
        first_release,
        first_release_with_4over6,
        helper_for,
        home_module,
    )

    impls = M.implementations
    assert helper_for("write") == impls.flashinfer_helper("write")
    assert helper_for("dequant") == impls.flashinfer_helper("dequant")
    assert impls.flashinfer_helper("decode") is None  # the FA2 readers call no helper
    with pytest.raises(ValueError, match="no flashinfer_helper requirement"):
        helper_for("decode")
    writer = helper_for("write")
    assert first_release(writer) == M.releases_with_helper(writer)[0] == "0.6.15"
    assert first_release_with_4over6() == next(r.version for r in M.flashinfer if r.nvfp4_4over6.writer_param)
    assert home_module(M, writer) == "flashinfer.page"
    assert home_module(M, helper_for("dequant")) == "flashinfer.quantization.fp4_quantization"


@pytest.mark.parametrize(("arch", "plausible"), [("sm_91", True), ("sm_82", True), ("sm_111", False), ("sm_72", False)])
def test_unknown_arch_triton_rule_is_the_matrix_rule(arch: str, plausible: bool) -> None:
    rule = M.implementations.unknown_arch_triton
    assert rule.plausible(SystemFacts(arch=arch).arch_major) is plausible
    p = query(arch, "0.6.14", impl_env=None, kv_rotation=None)
    assert (p.impl("write") == "triton") is plausible
    if plausible:
        assert any(rule.reason in t.reason for t in p.trace if t.impl == "triton")


def test_detect_takes_the_trtllm_gen_arches_from_the_matrix() -> None:
    from nvfp4compat.facts import _trtllm_gen_arch

    assert [a for a in M.arches if _trtllm_gen_arch(a)] == [a for a, s in M.arches.items() if s.trtllm_gen_fmha.value]
    assert _trtllm_gen_arch("sm_100") and not _trtllm_gen_arch("sm_90") and not _trtllm_gen_arch("sm_91")


# ----------------------------------------------------------------------------- detect


def test_detect_on_this_machine_never_crashes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NVFP4COMPAT_ARCH", raising=False)
    f = detect(environ={})
    assert f.source == "detect"
    if f.arch is None:
        assert any("no CUDA GPU detected" in n for n in f.notes)
    f2 = detect(environ={"NVFP4COMPAT_ARCH": "sm_90", "NVFP4COMPAT_DISABLE_TRITON": "1", "NVFP4COMPAT_IMPL": "write=triton"})
    if f.arch is None:
        assert f2.arch == "sm_90" and f2.arch_source == "environment"
    assert f2.triton_disabled and f2.impl_env == "write=triton"
    f3 = detect(environ={"NVFP4COMPAT_ARCH": "banana"})
    assert any("NVFP4COMPAT_ARCH ignored" in n for n in f3.notes)
    if f2.triton is not None:
        with pytest.raises(ResolutionError, match="disabled by NVFP4COMPAT_DISABLE_TRITON"):
            resolve(M, f2)


# ------------------------------------------------------------------------------ purity


def test_resolver_stack_imports_no_heavy_module() -> None:
    code = r"""
import sys
for name in ("torch", "triton", "flashinfer", "vllm", "numpy"):
    sys.modules[name] = None
import nvfp4compat.spec, nvfp4compat.loader, nvfp4compat.versions, nvfp4compat.resolver
import nvfp4compat.plan, nvfp4compat.explain, nvfp4compat.constraints, nvfp4compat.table
import nvfp4compat.api, nvfp4compat.flashinfer_probe, nvfp4compat.facts
from nvfp4compat.flashinfer_probe import helper_for, first_release
assert helper_for("write") and first_release(helper_for("write"))
from nvfp4compat import load_matrix, query
p = query("sm_90", "0.6.14", "0.26.0", impl_env=None)
assert p.supported and p.impl("write") == "triton", p.render_text()
heavy = [n for n in ("torch", "triton", "flashinfer", "vllm") if sys.modules.get(n) is not None]
assert not heavy, heavy
print("pure")
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "pure" in r.stdout, r.stderr



# ------------------------------------------------------------- issue 15: dequantize-then-attend prefill


def test_sm90_with_flashinfer_binds_dequant_fa3_prefill_with_a_trace_line() -> None:
    p = q("sm_90", "0.7.2.post1", None)
    assert p.impl("prefill") == "dequant_fa3" and p.bindings["prefill"].source == "matrix"
    line = [t for t in p.trace if t.op == "prefill" and t.impl == "dequant_fa3"]
    assert line and line[0].accepted and "backend='fa3'" in line[0].reason and "SM90" in line[0].reason
    assert p.impl("decode") == "triton"  # decode rows stay on the Triton decode kernel


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_120"])
def test_no_fa3_arch_binds_dequant_fa2_and_refuses_forcing_fa3(arch: str) -> None:
    p = q(arch, "0.7.4", None)
    assert p.impl("prefill") == "dequant_fa2" and p.bindings["prefill"].source == "matrix"
    line = [t for t in p.trace if t.op == "prefill" and t.impl == "dequant_fa2"]
    cc = arch.removeprefix("sm_")
    assert line and line[0].accepted and "backend='fa2'" in line[0].reason and f"SM{cc}" in line[0].reason
    fa3 = [t for t in p.trace if t.op == "prefill" and t.impl == "dequant_fa3"]
    assert not fa3 or not fa3[0].accepted  # listed for SM90 only; never accepted off SM90
    with pytest.raises(ResolutionError, match=r"dequant_fa3 prefill.*SMs \[90\].*request prefill=triton"):
        q(arch, "0.7.4", None, impl_env="prefill=dequant_fa3")


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_90", "sm_120"])
def test_dequant_fa2_without_flashinfer_keeps_the_fused_prefill(arch: str) -> None:
    p = q(arch, None, None)
    assert p.impl("prefill") == "triton"
    assert any(t.impl == "dequant_fa2" and not t.accepted and "not installed" in t.reason for t in p.trace)
    with pytest.raises(ResolutionError, match="dequant_fa2 prefill.*FlashInfer is not installed"):
        q(arch, None, None, impl_env="prefill=dequant_fa2")


def test_sm90_prefers_fa3_then_fa2_and_env_forces_or_refuses_dequant_fa2() -> None:
    assert q("sm_90", "0.7.4", None).impl("prefill") == "dequant_fa3"
    # the installed FlashInfer lacks the FA3 ragged run (probe): the FA2 composite comes next on SM90
    no_fa3 = resolve(M, SystemFacts(arch="sm_90", flashinfer="0.7.4", triton="any", flashinfer_fa3_ragged=False))
    assert no_fa3.impl("prefill") == "dequant_fa2"
    forced = q("sm_90", "0.7.4", None, impl_env="prefill=dequant_fa2")
    assert forced.impl("prefill") == "dequant_fa2" and forced.bindings["prefill"].source == "environment"
    refused = q("sm_89", "0.7.4", None, impl_env="prefill=triton")
    assert refused.impl("prefill") == "triton" and refused.bindings["prefill"].source == "environment"
    with pytest.raises(ResolutionError, match="no dequant_fa2 implementation"):
        q("sm_89", "0.7.4", None, impl_env="decode=dequant_fa2")


def test_dequant_fa2_rejected_for_sinks_and_probe_decides_presence() -> None:
    assert q("sm_89", "0.7.4", None, features=["sinks"]).impl("prefill") == "triton"
    p = resolve(M, SystemFacts(arch="sm_89", flashinfer="0.7.4", triton="any", flashinfer_fa2_ragged=False))
    assert p.impl("prefill") != "dequant_fa2"
    assert any("disagree" in w and "FA2 ragged" in w and "the probe wins" in w for w in p.warnings)
    unknown = resolve(M, SystemFacts(arch="sm_89", flashinfer="0.7.5.dev1", triton="any", flashinfer_fa2_ragged=True))
    assert unknown.impl("prefill") == "dequant_fa2"
    # an unknown release without a probe: not recorded, not assumed
    guessed = resolve(M, SystemFacts(arch="sm_89", flashinfer="0.7.5.dev1", triton="any"))
    assert guessed.impl("prefill") != "dequant_fa2"


def test_dequant_fa2_below_the_floor_and_on_sm110_is_not_planned() -> None:
    for arch in ("sm_75", "sm_110"):
        p = q(arch, "0.7.4", None)
        assert p.bindings["prefill"].impl != "dequant_fa2"


def test_dequant_fa2_inside_vllm_routes_the_prefill() -> None:
    p = q("sm_89", "0.6.14", "0.26.0")
    assert p.impl("prefill") == "dequant_fa2" and p.vllm is not None and p.vllm.strategy == "backport"
    assert "gate_combination" in p.vllm.patches and "forward_reader" in p.vllm.patches


def test_dequant_fa3_needs_flashinfer_and_env_can_force_or_refuse_it() -> None:
    none = q("sm_90", None, None)
    assert none.impl("prefill") == "triton"
    assert any(t.impl == "dequant_fa3" and not t.accepted and "not installed" in t.reason for t in none.trace)
    with pytest.raises(ResolutionError, match="dequant_fa3 prefill.*FlashInfer is not installed"):
        q("sm_90", None, None, impl_env="prefill=dequant_fa3")
    forced = q("sm_90", "0.6.15", None, impl_env="prefill=dequant_fa3")
    assert forced.impl("prefill") == "dequant_fa3" and forced.bindings["prefill"].source == "environment"
    refused = q("sm_90", "0.6.15", None, impl_env="prefill=triton")
    assert refused.impl("prefill") == "triton" and refused.bindings["prefill"].source == "environment"
    with pytest.raises(ResolutionError, match="no dequant_fa3 implementation"):
        q("sm_90", "0.6.15", None, impl_env="decode=dequant_fa3")


def test_dequant_fa3_rejected_for_sinks_and_probe_decides_presence() -> None:
    sinks = q("sm_90", "0.7.4", None, features=["sinks"])
    assert sinks.impl("prefill") == "triton"
    facts = SystemFacts(arch="sm_90", flashinfer="0.7.4", triton="any", flashinfer_fa3_ragged=False)
    p = resolve(M, facts)
    assert p.impl("prefill") == "dequant_fa2"  # no FA3 ragged run: the same composite over FA2
    assert any("disagree" in w and "FA3 ragged" in w and "the probe wins" in w for w in p.warnings)
    unknown = resolve(M, SystemFacts(arch="sm_90", flashinfer="0.7.5.dev1", triton="any", flashinfer_fa3_ragged=True))
    assert unknown.impl("prefill") == "dequant_fa3"


def test_dequant_fa3_inside_vllm_keeps_the_combination_gate() -> None:
    p = q("sm_90", "0.7.2.post1", "0.26.0")
    assert p.impl("prefill") == "dequant_fa3" and p.vllm is not None and p.vllm.strategy == "backport"
    assert "gate_combination" in p.vllm.patches and "forward_reader" in p.vllm.patches


def test_fa3_ragged_probe_reads_the_installed_sources(tmp_path: Path) -> None:
    from nvfp4compat.flashinfer_probe import probe_fa3_ragged

    (tmp_path / "__init__.py").write_text(
        "from .prefill import BatchPrefillWithRaggedKVCacheWrapper as BatchPrefillWithRaggedKVCacheWrapper\n"
    )
    (tmp_path / "prefill.py").write_text('def f(backend):\n    if backend == "fa3":\n        return 1\n')
    assert probe_fa3_ragged(tmp_path)
    (tmp_path / "prefill.py").write_text('def f(backend):\n    if backend == "fa2":\n        return 1\n')
    assert not probe_fa3_ragged(tmp_path)
    (tmp_path / "__init__.py").write_text("")
    assert not probe_fa3_ragged(tmp_path)
    assert not probe_fa3_ragged(tmp_path / "missing")


def test_fa2_ragged_probe_reads_the_installed_sources(tmp_path: Path) -> None:
    from nvfp4compat.flashinfer_probe import probe_fa2_ragged

    (tmp_path / "__init__.py").write_text(
        "from .prefill import BatchPrefillWithRaggedKVCacheWrapper as BatchPrefillWithRaggedKVCacheWrapper\n"
    )
    (tmp_path / "prefill.py").write_text('def f(backend):\n    if backend == "fa2":\n        return 1\n')
    assert probe_fa2_ragged(tmp_path)
    (tmp_path / "prefill.py").write_text('def f(backend):\n    if backend == "fa3":\n        return 1\n')
    assert not probe_fa2_ragged(tmp_path)
    (tmp_path / "__init__.py").write_text("")
    assert not probe_fa2_ragged(tmp_path)
