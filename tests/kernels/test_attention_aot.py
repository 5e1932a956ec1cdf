"""Ahead-of-time proof: the attention kernels compile for SM80, 86, 89, 90, 100 and 120 on this CPU.

``triton.compile(ASTSource(...), target=GPUTarget("cuda", cc, 32))`` through
:mod:`nvfp4compat.kernels.aot` (the attention module is one of its providers: ``aot_kernels()``).
A compile takes 1-15 s per variant and target on a CI core, so the default tier builds the core
variants (bf16 decode with the split merge on every target; prefill on one target per MMA family)
and the full tier builds every shipped variant (``attention.aot_variants()``: every head_dim x
dtype, every feature flag, batch blocks of the on-device work split, tensor/float scales, all three decoders) for every target.
It takes ~15-25 minutes on one core, so it runs only when asked for:

    NVFP4COMPAT_AOT_FULL=1 pytest -m slow tests/kernels/test_attention_aot.py
    python -m nvfp4compat.kernels.aot                           # every provider's variants
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from nvfp4compat.kernels.aot import DEFAULT_CCS, AotReport

KERNELS = ("attention_decode", "attention_decode_gluon", "attention_decode_reduce", "attention_prefill",
           "attention_qsl_guard", "attention_decode_table")

# (kernel, variant label, targets): what every CI run builds.
CORE = [
    ("attention_decode", "bf16-d128", DEFAULT_CCS),
    ("attention_decode_reduce", "bf16-d128", DEFAULT_CCS),
    # one target per MMA lowering: mma.sync (SM80), wgmma (SM90), tcgen05 (SM100)
    ("attention_prefill", "bf16-d128", (80, 90, 100)),
    # the bf16 table decoder (the default is the bit-placement one: fma.rn.bf16x2 on subnormal
    # patterns, SM80+)
    ("attention_decode", "bf16-d128-table", DEFAULT_CCS),
    ("attention_prefill", "bf16-d128-table", (80, 90)),
    # the opt-in register double-buffered decode loop (DecodeConfig.prefetch)
    ("attention_decode", "bf16-d128-prefetch", (80, 90)),
    # the opt-in swapped logits MMA (DecodeConfig.swap_ab): K as its first operand
    ("attention_decode", "bf16-d128-swap", (80, 90)),
    # prefill's query_start_loc guard
    ("attention_qsl_guard", "bf16-d128-lse", (80, 90)),
    # the fused Hadamard KV rotation (kv_rotation="hadamard"), on mma.sync and wgmma
    ("attention_decode", "bf16-d128-rotate", (80, 90)),
    ("attention_prefill", "bf16-d128-rotate", (80, 90)),
    # the Gluon decode (the head_dim-128 bf16 default on CUDA): mma.sync with operands decoded in registers, on
    # every target, and its 16-row orientation
    ("attention_decode_gluon", "bf16-d128", DEFAULT_CCS),
    ("attention_decode_gluon", "bf16-d128-g16", (80, 90)),
]

_CHILD = r"""
import json, sys
from nvfp4compat.kernels.aot import AotReport, _compile_one, collect_kernels
import triton
want = json.loads(sys.argv[1])
kernels = {k.name: k for k in collect_kernels(["nvfp4compat.kernels.triton.attention"])[0]}
rep = AotReport(ccs=sorted({cc for _, _, ccs in want for cc in ccs}), triton_version=triton.__version__)
for name, label, ccs in want:
    k = kernels[name]
    variants = [v for v in k.variants if label is None or v.label == label]
    if not variants:
        raise SystemExit(f"no variant {label!r} of {name}; known: {[v.label for v in k.variants]}")
    for cc in ccs:
        for v in variants:
            rep.results.append(_compile_one(k, v, cc))
print("AOT-REPORT " + rep.to_json())
"""


def _compile(want: list[tuple[str, str | None, tuple[int, ...]]], jobs: int = 2) -> AotReport:
    """Compile in ``jobs`` child processes without TRITON_INTERPRET (the kernels must be real
    JITFunctions), the targets dealt round-robin to the children."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    ccs = sorted({cc for _, _, c in want for cc in c})
    groups = [set(ccs[i::jobs]) for i in range(min(jobs, len(ccs)))]
    procs = []
    for group in groups:
        part = [(k, label, tuple(cc for cc in c if cc in group)) for k, label, c in want]
        procs.append(subprocess.Popen(
            [sys.executable, "-c", _CHILD, json.dumps([p for p in part if p[2]])],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))
    report = AotReport(ccs=ccs)
    for proc in procs:
        out, err = proc.communicate()
        lines = [ln for ln in out.splitlines() if ln.startswith("AOT-REPORT ")]
        if not lines:
            raise AssertionError(f"AOT child failed (exit {proc.returncode}):\n{err[-4000:]}")
        part = AotReport.from_json(lines[-1][len("AOT-REPORT ") :])
        report.results.extend(part.results)
        report.triton_version = part.triton_version
    return report


def test_attention_is_an_aot_provider():
    from nvfp4compat.kernels.aot import PROVIDERS
    from nvfp4compat.kernels.triton.attention import DECODERS, aot_variants

    assert "nvfp4compat.kernels.triton.attention" in PROVIDERS
    variants = aot_variants()
    assert set(variants) == set(KERNELS)
    decode = variants["attention_decode"]
    # every head_dim x dtype, both decoders, every feature flag are in the shipped set
    for hd in (64, 128, 256, 512):
        for dt in ("bf16", "fp16"):
            assert any(v.constexprs["HEAD_DIM"] == hd and v.signature["q_ptr"] == f"*{dt}" for v in decode)
    assert {v.constexprs["FAST"] for v in decode} == set(DECODERS.values())
    for vs in (decode, variants["attention_prefill"]):
        assert {v.constexprs["FAST"] for v in vs} == set(DECODERS.values())
    for flag in ("HAS_WINDOW", "HAS_SOFTCAP", "HAS_SINKS", "RETURN_LSE", "VARLEN", "PAGE_POW2", "PREFETCH", "ROTATE"):
        assert {v.constexprs[flag] for v in decode} == {True, False}, flag
    assert {v.constexprs["ROTATE"] for v in variants["attention_prefill"]} == {True, False}
    gluon = variants["attention_decode_gluon"]
    for flag in ("ROWS8", "PAGE_EVEN", "OFF32", "PAGE_POW2", "HAS_WINDOW", "HAS_SINKS", "VARLEN", "KT", "SKEW", "PAGE_TILE",
                 "LAZY", "DEFER_SUM", "PAIR"):
        assert {v.constexprs[flag] for v in gluon} == {True, False}, flag
    assert {v.constexprs["SCALE_AHEAD"] for v in gluon} == {1, 2}
    assert {v.constexprs["PRING"] for v in gluon} == {True, False}
    assert {v.constexprs["L2_FETCH"] for v in gluon} == {0, 128, 256}
    assert {v.constexprs["L2_AHEAD"] for v in gluon} == {0, 3, 6}
    assert {v.constexprs["L2_SCALES"] for v in gluon} == {True, False}
    assert {v.constexprs_for(90)["L2_BULK"] for v in gluon} == {0, 2, 3, 5}
    assert {v.constexprs_for(89)["L2_BULK"] for v in gluon} == {0}
    for k, vs in variants.items():
        assert len({v.label for v in vs}) == len(vs), k


def test_core_variants_compile_for_every_target():
    rep = _compile([(k, label, tuple(ccs)) for k, label, ccs in CORE])
    print(rep)
    assert rep.ok, str(rep)
    built = {(r.kernel, r.cc) for r in rep.results if r.ok}
    for cc in DEFAULT_CCS:
        assert ("attention_decode", cc) in built and ("attention_decode_reduce", cc) in built


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("NVFP4COMPAT_AOT_FULL") != "1",
    reason="the full AOT matrix takes ~20 min; set NVFP4COMPAT_AOT_FULL=1 to build every variant",
)
@pytest.mark.parametrize("cc", DEFAULT_CCS)
def test_every_shipped_variant_compiles(cc):
    rep = _compile([(k, None, (cc,)) for k in KERNELS])
    print(rep)
    assert rep.ok, str(rep)


_PDL_PROBE = r"""
import json, sys
from nvfp4compat.kernels import aot
from nvfp4compat.kernels.triton import attention as att
kernels = {k.name: k for k in att.aot_kernels()}
out = {}
for name, cc, suffix in json.loads(sys.argv[1]):
    v = next(v for v in kernels[name].variants if v.label.endswith(suffix))
    ptx = aot.build(kernels[name], v, cc).asm["ptx"]
    out[f"{name}@{cc}{suffix}"] = [ptx.count("griddepcontrol.launch_dependents"), ptx.count("griddepcontrol.wait")]
print("PDL " + json.dumps(out))
"""


def test_dependent_launch_instructions_only_on_sm90_and_up():
    """``MERGE_PDL``'s variants: on SM90+ the decode kernels (Gluon and plain) let their dependent launch and the merge
    kernel waits for them (one ``griddepcontrol`` each); on SM80, where the instruction does not exist, the same
    variants compile without it (``attention._pdl_by_cc``). The late trigger (``MERGE_PDL = 2``, ``-pdl-late``) is one
    instruction too, after the key loop. Compiled in a child (this session interprets)."""
    want = [("attention_decode_reduce", 80, "-pdl"), ("attention_decode_reduce", 90, "-pdl"),
            ("attention_decode", 90, "-pdl"), ("attention_decode_gluon", 90, "-pdl"),
            ("attention_decode_gluon", 80, "-pdl"), ("attention_decode", 90, "-pdl-late"),
            ("attention_decode_gluon", 90, "-pdl-late"), ("attention_decode_gluon", 80, "-pdl-late")]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _PDL_PROBE, json.dumps(want)], env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("PDL "))[4:])
    assert got == {"attention_decode_reduce@80-pdl": [0, 0], "attention_decode_reduce@90-pdl": [0, 1],
                   "attention_decode@90-pdl": [1, 0], "attention_decode_gluon@90-pdl": [1, 0],
                   "attention_decode_gluon@80-pdl": [0, 0], "attention_decode@90-pdl-late": [1, 0],
                   "attention_decode_gluon@90-pdl-late": [1, 0], "attention_decode_gluon@80-pdl-late": [0, 0]}, got


_TMA_PROBE = r"""
import json, sys
from nvfp4compat.kernels import aot
from nvfp4compat.kernels.triton import attention as att
k = next(k for k in att.aot_kernels() if k.name == "attention_decode_gluon")
i = next(i for i, c in enumerate(att.GLUON_DECODE_CONFIGS) if c.tma_loader)
v = next(v for v in k.variants if v.label == f"bf16-d128-sweep{i}")
out = {}
for cc in json.loads(sys.argv[1]):
    ptx = aot.build(k, v, cc).asm["ptx"]
    out[str(cc)] = [ptx.count("cp.async.bulk.tensor"), ptx.count("setmaxnreg"), ptx.count("cp.async.cg.shared")
                    + ptx.count("cp.async.ca.shared")]
print("TMA " + json.dumps(out))
"""


def test_tma_loader_only_on_sm90_and_up():
    """``DecodeConfig.tma_loader``'s sweep variant: on SM90 the ring is filled by TMA boxes from a loader warp (8 boxes a
    tile, ``cp.async.bulk.tensor``; the warp groups' ``setmaxnreg``) and no ``cp.async`` of the words; on SM80, where
    TMA does not exist, the same variant compiles its ``cp.async`` ring instead (``TMA`` by target, as the launcher
    sets it). Compiled in a child (this session interprets)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _TMA_PROBE, json.dumps([80, 90])], env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("TMA "))[4:])
    assert got["90"][0] > 0 and got["90"][1] > 0 and got["90"][2] == 0, got
    assert got["80"] == [0, 0, got["80"][2]] and got["80"][2] > 0, got


def test_ptx_ring_lives_outside_tritons_shared_allocation():
    """``DecodeConfig.ptx_ring`` (config ``ring=3, ptx_ring=True``) declares its cp.async ring in inline PTX: the cubin's
    static shared memory holds the whole ring (3 stages x 64 keys x 128 bytes) and Triton's own allocation does not,
    where the same ring in Triton's allocation (``ptx_ring=False``) lies in the dynamic shared memory. Both copy
    the words by ``LDGSTS`` (cp.async). Every build with the PTX ring fits the 48 KiB a launch gets without an opt-in
    (static and dynamic together: Triton opts in by its own allocation only, and on an H100 a 16-row launch of 58,368
    bytes failed with "invalid argument"), so 16 rows build without it. Read from the sm_90 cubins with
    ``compile_all(resources=True)``."""
    from nvfp4compat.kernels import aot
    from nvfp4compat.kernels.triton import attention as att

    base = next(c for c in att.GLUON_DECODE_CONFIGS if c.ring == 3 and c.ptx_ring)
    i_ptx = att.GLUON_DECODE_CONFIGS.index(base)
    i_tri = att.GLUON_DECODE_CONFIGS.index(dataclasses.replace(base, ptx_ring=False))
    labels = [f"attention_decode_gluon/bf16-d128-sweep{i}$" for i in (i_ptx, i_tri)]
    pring = ["bf16-d128-pring-g16", "bf16-d128-pring-g8-sinks-softcap-lse", "fp16-d128-pring-q2-g4-sinks-softcap-lse"]
    rep = aot.compile_all([90], kernels=["attention_decode_gluon"],
                          only=labels + [f"attention_decode_gluon/{v}$" for v in pring], resources=True)
    assert rep.ok and len(rep.results) == 5, str(rep)
    res = {r.variant: r.resources for r in rep.results}
    assert all(r is not None and "error" not in r for r in res.values()), res
    ptx, tri = res[f"bf16-d128-sweep{i_ptx}"], res[f"bf16-d128-sweep{i_tri}"]
    ring_bytes = 3 * base.block_n * 128
    assert ptx["static_shared"] >= ring_bytes > tri["static_shared"], res
    assert tri["dynamic_shared"] >= ring_bytes, res
    assert ptx["async_copies"] > 0 and tri["async_copies"] > 0, res
    assert ptx["local_bytes"] == 0 and ptx["registers"] <= base.maxnreg, res
    # 8 and 4 rows keep the PTX ring (with sinks, soft-cap and LSE); 16 rows build it in Triton's allocation
    for v in pring[1:] + [f"bf16-d128-sweep{i_ptx}"]:
        assert res[v]["static_shared"] >= ring_bytes, (v, res[v])
    assert res["bf16-d128-pring-g16"]["static_shared"] < ring_bytes, res["bf16-d128-pring-g16"]
    for v, r in res.items():
        assert r["static_shared"] + r["dynamic_shared"] <= 48 * 1024, (v, r)


def test_l2_prefetch_variants_carry_their_hints(tmp_path):
    """``DecodeConfig.l2_fetch``, ``l2_ahead`` and ``l2_bulk`` in the sm_90 SASS of their sweep variants (triton's ``cuobjdump``):
    ``l2_fetch`` turns the K and V word loads into ``LDG.E.LTC<n>B`` (``l2_scales``: the block-scale loads too; with the
    inline-PTX ring, its ``LDGSTS`` copies) (the L2 prefetch size; config 11, run O's default,
    has none), with
    the same number of loads; ``l2_ahead`` adds ``CCTL.E.PF2`` (``prefetch.global.L2``: three a tile, for K and V rows and
    block scales, in the loop and for the tiles the prologue asks for) and keeps the loads plain. Neither spills, and
    both stay under the default's register cap (4 programs per SM)."""
    import re

    from nvfp4compat.kernels import aot
    from nvfp4compat.kernels.triton import attention as att

    base = att._GLUON_KT_PAGE_TILE  # run O's default; with l2_fetch 128 the default since run V
    idx = {name: att.GLUON_DECODE_CONFIGS.index(dataclasses.replace(base, **kw)) for name, kw in (
        ("f128", {"l2_fetch": 128}), ("f256", {"l2_fetch": 256}), ("a3", {"l2_ahead": 3}), ("a6", {"l2_ahead": 6}),
        ("s128", {"l2_fetch": 128, "l2_scales": True}), ("pring", {"ring": 3, "ptx_ring": True, "l2_fetch": 128}))}
    idx["pring0"] = att.GLUON_DECODE_CONFIGS.index(dataclasses.replace(base, ring=3, ptx_ring=True))
    for n in (2, 3, 5):
        idx[f"b{n}"] = att.GLUON_DECODE_CONFIGS.index(dataclasses.replace(att.GLUON_REDUCE_MERGE_CONFIG, l2_bulk=n))
    idx["default"] = att.GLUON_DECODE_CONFIGS.index(base)
    assert att.GLUON_DECODE_CONFIGS[idx["f128"]] == att.GLUON_REDUCE_MERGE_CONFIG  # run V's default (no smem_merge)
    rep = aot.compile_all([90], kernels=["attention_decode_gluon"],
                          only=[f"attention_decode_gluon/bf16-d128-sweep{i}$" for i in idx.values()],
                          resources=True, sass_dir=str(tmp_path))
    assert rep.ok and len(rep.results) == len(idx), str(rep)
    res = {r.variant: r.resources for r in rep.results}

    def count(name: str, pattern: str) -> int:
        text = (tmp_path / f"attention_decode_gluon-bf16-d128-sweep{idx[name]}-sm90.sass").read_text()
        return len(re.findall(pattern, text))

    for name in idx:
        r = res[f"bf16-d128-sweep{idx[name]}"]
        assert r is not None and "error" not in r and r["local_bytes"] == 0 and r["registers"] <= 128, (name, r)
    wide = r"LDG\.E(?:\.LTC\d+B)?\.(?:128|64)\b"
    assert count("default", r"LTC\d+B") == 0 and count("default", r"CCTL\.E\.PF2") == 0
    assert count("f128", r"LDG\.E\.LTC128B\.(?:128|64)") > 0 and count("f128", r"LTC256B") == 0
    assert count("f256", r"LDG\.E\.LTC256B\.(?:128|64)") > 0
    assert count("f128", wide) == count("f256", wide) == count("default", wide)
    assert count("a3", r"CCTL\.E\.PF2") == 6 and count("a6", r"CCTL\.E\.PF2") == 3 * (1 + 4)
    assert count("a3", r"LTC\d+B") == 0
    # l2_scales: the block-scale loads of the loop (16-bit K pairs, 8-bit V bytes) take the hint too
    assert count("f128", r"LDG\.E\.LTC\d+B\.U(?:16|8)\b") == 0
    assert count("s128", r"LDG\.E\.LTC128B\.U16\b") > 0 and count("s128", r"LDG\.E\.LTC128B\.U8\b") > 0
    # the inline-PTX ring with l2_fetch: its cp.async copies (LDGSTS) carry the hint, the same copies as without it
    copies = r"LDGSTS\.E(?:\.[A-Z0-9]+)*"
    assert count("pring", r"LDGSTS\.E(?:\.[A-Z0-9]+)*\.LTC128B") > 0 and count("pring0", r"LTC128B") == 0
    assert count("pring", copies) == count("pring0", copies) > 0
    # l2_bulk: one bulk prefetch (UBLKPF.L2, uniform operands: ptxas loops over the lanes' four) in the loop and one for
    # each tile 2 .. n - 1 the prologue asks for; the loads keep the default's hint, and no CCTL prefetch
    assert count("f128", r"UBLKPF") == 0
    for n in (2, 3, 5):
        assert count(f"b{n}", r"UBLKPF\.L2\b") == n - 1, n
        assert count(f"b{n}", r"CCTL") == 0 and count(f"b{n}", wide) == count("f128", wide), n


_FUSED_PROBE = r"""
import json, re, sys
from nvfp4compat.kernels import aot
from nvfp4compat.kernels.triton import attention as att
k = next(k for k in att.aot_kernels() if k.name == "attention_decode_gluon")
out = {}
for label, cc in json.loads(sys.argv[1]):
    v = next(v for v in k.variants if v.label == label)
    ptx = aot.build(k, v, cc).asm["ptx"]
    out[f"{label}@{cc}"] = [len(re.findall(r"atom\.global\.gpu\.acq_rel\.add", ptx)),
                            len(re.findall(r"ld\.global\.cg", ptx))]
print("FUSED " + json.dumps(out))
"""


def test_gluon_fused_merge_counts_in_with_one_atomic():
    """``FUSED_MERGE`` in the Gluon decode: its variants count each chunk in with one acquire-release atomic add at GPU
    scope and load the partials past L1 (``ld.global.cg``); the default variant has neither, on SM80 and SM90. Compiled
    in a child (this session interprets)."""
    want = [("bf16-d128", 90), ("bf16-d128-fused-merge", 90), ("bf16-d128-fused-merge", 80),
            ("fp16-d128-fused-merge-g16-varlen", 90)]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _FUSED_PROBE, json.dumps(want)], env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("FUSED "))[6:])
    assert got["bf16-d128@90"] == [0, 0], got
    for key in ("bf16-d128-fused-merge@90", "bf16-d128-fused-merge@80", "fp16-d128-fused-merge-g16-varlen@90"):
        assert got[key][0] == 1 and got[key][1] > 0, (key, got)
