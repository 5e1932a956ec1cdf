"""Ahead-of-time proof: every shipped writer/dequant variant compiles for SM80, 86, 89, 90, 100, 120.

Triton builds PTX and cubins on this CPU-only machine (``triton.compile(ASTSource(...),
target=GPUTarget("cuda", cc, 32))``), one compile per (variant, target), in two child processes. The
attention kernels have their own AOT tests (``test_attention_aot.py``); ``python -m
nvfp4compat.kernels.aot`` builds every provider.
"""

from __future__ import annotations

import pytest

from nvfp4compat.kernels import aot

PROVIDERS = ["nvfp4compat.kernels.triton.write", "nvfp4compat.kernels.triton.dequant"]


def test_writer_and_dequant_build_for_every_target():
    rep = aot.compile_all(aot.DEFAULT_CCS, providers=PROVIDERS, jobs=2)
    print("\n" + str(rep))
    kernels = {r.kernel for r in rep.results}
    assert kernels == {"append_slot_mapping", "dequantize_paged"}
    per_target = {cc: sum(r.cc == cc for r in rep.results) for cc in aot.DEFAULT_CCS}
    assert len(set(per_target.values())) == 1 and min(per_target.values()) >= 10, per_target
    assert rep.ok, str(rep)
    assert all(r.cubin_bytes > 0 for r in rep.results)


def test_covering_set():
    """The variant list covers every tile config, head_dim, dtype, slot dtype and flag value."""
    from nvfp4compat.kernels.triton import dequant as tdq
    from nvfp4compat.kernels.triton import write as tap

    (writer,) = tap.aot_kernels()
    c = [v.constexprs for v in writer.variants]
    assert {x["HEAD_DIM"] for x in c} == {64, 128, 256, 512}
    for flag in ("SCALE_PTR", "FOUR_OVER_SIX", "FAST_MATH", "ROTATE"):
        assert {x[flag] for x in c} == {True, False}, flag
    assert any(x["ROTATE"] and x["FOUR_OVER_SIX"] for x in c), "the fused rotation with 4over6"
    assert {v.signature["key_ptr"] for v in writer.variants} == {"*fp16", "*bf16"}
    assert {v.signature["slot_ptr"] for v in writer.variants} == {"*i32", "*i64"}
    assert {
        (x["ROWS"], v.num_warps)
        for x, v in zip(c, writer.variants, strict=True)
        if x["HEAD_DIM"] == 128
    } >= {(cfg.rows(128), cfg.num_warps) for cfg in tap.CONFIGS}
    (deq,) = tdq.aot_kernels()
    c = [v.constexprs for v in deq.variants]
    assert {x["HEAD_DIM"] for x in c} == {64, 128, 256, 512}
    assert {x["SCALE_PTR"] for x in c} == {True, False}
    assert {x["ROTATE"] for x in c} == {True, False}
    assert {v.signature["out_k_ptr"] for v in deq.variants} == {"*fp16", "*bf16"}
    assert {v.signature["bt_ptr"] for v in deq.variants} == {"*i32", "*i64"}
    assert {
        (x["ROWS"], v.num_warps)
        for x, v in zip(c, deq.variants, strict=True)
        if x["HEAD_DIM"] == 128
    } >= {(cfg.rows(128), cfg.num_warps) for cfg in tdq.CONFIGS}


def test_the_check_can_fail_fp8_cast_on_ampere():
    rep = aot.compile_all(aot.DEFAULT_CCS, providers=["aot_fp8_cast_probe"])
    status = {r.cc: r.ok for r in rep.results}
    assert status == {80: False, 86: False, 89: True, 90: True, 100: True, 120: True}, str(rep)
    assert not rep.ok and "fp8_cast_probe" in str(rep)


def test_registry_rules():
    kernels, missing = aot.collect_kernels(
        ["nvfp4compat.kernels.triton.write", "nvfp4compat.kernels.nonexistent"]
    )
    assert [k.name for k in kernels] == ["append_slot_mapping"]
    assert missing == ["nvfp4compat.kernels.nonexistent"]
    with pytest.raises(TypeError, match="defines no aot_kernels"):
        aot.collect_kernels(["nvfp4compat.kernels.layout"])
    with pytest.raises(ValueError, match="duplicate AOT kernel names"):
        aot.collect_kernels(PROVIDERS + ["nvfp4compat.kernels.triton.write"])
    with pytest.raises(ValueError, match="unknown AOT kernels"):
        aot.compile_all([90], providers=PROVIDERS, kernels=["nope"])


def test_report_round_trip_and_matrix():
    r = aot.AotReport(ccs=[80, 90], triton_version="x")
    r.results += [
        aot.AotResult("k", "v", 80, True, 0.1, 10),
        aot.AotResult("k", "v", 90, False, 0.1, 0, "boom"),
    ]
    back = aot.AotReport.from_json(r.to_json())
    assert back == r and not back.ok
    assert "| k | 1/1 | 0/1 |" in back.matrix() and "FAILED k [v] sm_90: boom" in str(back)


_PTX_PROBE = """
import sys
from nvfp4compat.kernels import aot
from nvfp4compat.kernels.triton import dequant as tdq

(kernel,) = tdq.aot_kernels()
v = next(v for v in kernel.variants if v.label.startswith("b512w8-d128-bf16"))
sys.stdout.write(aot.build(kernel, v, int(sys.argv[1])).asm["ptx"])
"""


@pytest.mark.parametrize("cc", [80, 90, 120])
def test_e2m1_decode_multiply_keeps_subnormals(cc):
    """``nvfp4.e2m1_decode`` is exact only if its ``* 2^126`` keeps the subnormal ``0.5 * 2^-126`` (code 1):
    the compiled dequantizer must contain no flush-to-zero instruction (``mul.ftz`` would decode 0.5 as 0).
    Compiled in a child process: this test session runs the interpreter (``TRITON_INTERPRET=1``)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", _PTX_PROBE, str(cc)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln.strip() for ln in proc.stdout.splitlines()]
    # 2^126 = 0x7E800000: an immediate of mul.f32 (SM80/90), a register pair of packed mul.f32x2 (SM100+)
    assert any(ln.startswith("mul.f32") for ln in lines) and any(
        "7e800000" in ln.lower() for ln in lines
    ), "the 2^126 multiply is gone: e2m1_decode changed"
    assert not [ln for ln in lines if ".ftz" in ln], "flush-to-zero in the dequantizer"


@pytest.mark.parametrize("argv", [["sm90"], ["9"], ["90", "--jobs", "0"]])
def test_cli_refuses_bad_arguments_without_a_traceback(argv, capsys):
    """``python -m nvfp4compat.kernels.aot``: a target that is no compute capability (or no worker) is a usage
    error (exit 2) that says what is wanted, before anything compiles."""
    with pytest.raises(SystemExit) as exc:
        aot.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "major*10+minor" in err or "--jobs must be at least 1" in err


def test_resources_read_from_the_cubin(tmp_path):
    """``compile_all(only=..., resources=True, sass_dir=...)``: one selected variant, its registers, local and shared
    memory and SASS counts read from the sm_90 cubin with cuobjdump, and its SASS written out."""
    from nvfp4compat.kernels.triton import dequant as tdq

    (kernel,) = tdq.aot_kernels()
    label = kernel.variants[0].label  # ('$': this label, not the longer labels it begins)
    assert sum(v.label.startswith(label) for v in kernel.variants) > 1
    rep = aot.compile_all([90], providers=["nvfp4compat.kernels.triton.dequant"], only=[f"dequantize_paged/{label}$"],
                          resources=True, sass_dir=str(tmp_path))
    assert rep.ok and [r.variant for r in rep.results] == [label], str(rep)
    res = rep.results[0].resources
    assert res is not None and "error" not in res, res
    assert 0 < res["registers"] <= 255 and res["instructions"] > 20 and res["global_loads"] > 0, res
    assert res["local_bytes"] >= 0 and res["dynamic_shared"] >= 0 and res["static_shared"] >= 0, res
    assert f"| dequantize_paged | {label} | 90 | {res['registers']} |" in str(rep)
    (sass,) = tmp_path.glob("*.sass")
    assert "dequantize_paged" in sass.name and "LDG" in sass.read_text()


def test_cli_only_that_selects_nothing_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        aot.main(["90", "--only", "no-such-variant"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--only no-such-variant selects no variant" in err and "attention_decode_gluon" in err


@pytest.mark.parametrize("value,expected", [("1", True), ("true", True), ("0", False), ("", False)])
def test_interpreter_flag_alone_sends_the_compile_to_a_child(monkeypatch, value, expected):
    """Under ``TRITON_INTERPRET`` a Gluon kernel stays a JIT function while the helpers it calls are interpreted, so
    compiling it in this process fails ("Unsupported function referenced") unless Triton's cache holds the binary:
    the variable alone must send the compile to a child process."""
    import triton

    def probe(x):
        return x

    kernel = aot.AotKernel("probe", triton.runtime.jit.JITFunction(probe), [])
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert aot._interpreted([kernel]) is expected


def test_a_failed_compile_reports_its_cause_first(monkeypatch):
    """A CompilationError's text is mostly the kernel's source; the report leads with the error that caused it."""

    def failing(kernel, variant, cc):
        try:
            raise RuntimeError("Unsupported function referenced: <helper>")
        except RuntimeError as cause:
            raise ValueError("at 96:28: " + "source line\n" * 400) from cause

    monkeypatch.setattr(aot, "build", failing)
    res = aot._compile_one(aot.AotKernel("k", None, []), aot.AotVariant("v", {}, {}), 90)
    assert not res.ok and res.error.startswith("RuntimeError: Unsupported function referenced: <helper> | ValueError")
