"""The GPU tier's kit and its runner's CPU-runnable parts.

``tools/gpu_bundle/build.py kit`` rebuilds ``.gpu/`` (``fi-<version>.tar.xz`` + the cp312 wheels that
``scripts/gpu/suite.sh`` installs). These tests check its packing logic (archive members, csrc pruning, fixed
mtimes, byte-identical rebuilds, the ``kit.json`` skip, the size limit) on a small synthetic wheel shaped like
flashinfer-python's, from an offline wheel cache: packaging logic, not FlashInfer's behaviour, so no real
release is needed here (the real 0.7.2.post1 wheel is 59 MiB and takes about 100 s of xz -9 on one core). The real
release is exercised by running the kit itself (``python3 tools/gpu_bundle/build.py kit --out .gpu``) and
importing ``flashinfer`` from the result under Python 3.12, as ``suite.sh``'s ``use_fi`` does on the GPU host.

Also here: ``scripts/gpu/table.py`` on run S's committed bench JSON against the bench's own log, and the
failed-id extraction of ``suite.sh``'s ``shard`` stage on run S's logs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from _scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "tools" / "gpu_bundle" / "build.py"
SUITE = ROOT / "scripts" / "gpu" / "suite.sh"
TABLE = ROOT / "scripts" / "gpu" / "table.py"
RUN_S = ROOT / "docs" / "validation-runs" / "2026-12-05-h100-s"


@pytest.fixture(scope="module")
def build():
    return load_script(BUILD, "gpu_bundle_build")


PRUNED = (  # entries under flashinfer/data/csrc that FLASHINFER_CSRC_PRUNE["0.7.2.post1"] removes
    "cake_fmha/kernel.cu",
    "cake_top.cu",
    "kda_decode.cu",
    "gdn_prefill.cu",
    "fused_moe/moe.cu",
    "blackwell_fmha.cu",
)


Date = tuple[int, int, int, int, int, int]


def _wheel(path: Path, version: str, date: Date = (2025, 1, 2, 3, 4, 6), extra: bytes = b"") -> Path:
    """A wheel laid out like flashinfer-python's: the package, its csrc (KV sources, prunable entries, one
    prunable header a kept source includes), a byte-compiled file the install skips, and the dist-info."""
    files = {
        "flashinfer/__init__.py": f"__version__ = {version!r}\n".encode(),
        "flashinfer/page.py": b"def append(): pass\n" + extra,
        "flashinfer/__pycache__/page.cpython-312.pyc": b"\0pyc",
        "flashinfer/data/include/flashinfer/page.cuh": b"// page\n" * 50,
        "flashinfer/data/csrc/page.cu": b'#include "kda_common.cuh"\n// page kernels\n',
        "flashinfer/data/csrc/kda_common.cuh": b"// needed by page.cu although it matches a prune prefix\n",
        **{f"flashinfer/data/csrc/{p}": f"// {p}\n".encode() * 20 for p in PRUNED},
        f"flashinfer_python-{version}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: flashinfer-python\nVersion: {version}\n"
            "Requires-Dist: apache-tvm-ffi<0.2,>=0.1.11\nRequires-Dist: torch\nRequires-Dist: numpy\n"
            "Requires-Dist: nvidia-cudnn-frontend>=1.31.0\nRequires-Dist: rich>=13; extra == \"b12x\"\n"
        ).encode(),
        f"flashinfer_python-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nTag: py3-none-any\n",
    }
    for src in ("page.cu", "flashinfer_page_binding.cu", "batch_prefill.cu", "batch_prefill_jit_binding.cu",
                "batch_decode.cu", "batch_decode_jit_binding.cu"):
        files.setdefault(f"flashinfer/data/csrc/{src}", f"// {src}\n".encode())
    whl = path / f"flashinfer_python-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(zipfile.ZipInfo(name, date), data)
    return whl


def _cache(tmp: Path, build, versions=("0.7.2.post1",), **kw) -> Path:
    cache = tmp / "wheels"
    cache.mkdir(parents=True, exist_ok=True)
    for v in versions:
        _wheel(cache, v, **kw)
    for dep in build.kit_deps():
        mod = build._norm(dep.dist)
        with zipfile.ZipFile(cache / f"{mod}-{dep.version}-py3-none-any.whl", "w") as zf:
            zf.writestr(f"{mod}/__init__.py", f"VERSION = {dep.version!r}\n")
    return cache


def _kit(build, out: Path, cache: Path, *more: str) -> int:
    return build.main(["kit", "--out", str(out), "--offline", "--wheel-cache", str(cache), *more])


def test_kit_deps_are_pinned_by_deps(build):
    pinned = {build._norm(d.dist): d.version for d in build.DEPS}
    got = {build._norm(d.dist): d.version for d in build.kit_deps()}
    assert set(got) == {build._norm(n) for n in build.KIT_DEPS} and "apache_tvm_ffi" in got
    assert all(pinned[k] == v for k, v in got.items())


def test_kit_writes_a_pruned_archive_and_the_wheels(build, tmp_path, capsys):
    cache = _cache(tmp_path, build)
    out = tmp_path / "gpu"
    out.mkdir()
    (out / "pydantic-2.0.0-py3-none-any.whl").write_bytes(b"an older pin")  # pip --target takes one version
    assert _kit(build, out, cache) == 0
    log = capsys.readouterr().out
    arc = out / "fi-0.7.2.post1.tar.xz"
    with tarfile.open(arc) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names)
    assert {n.split("/")[0] for n in names} == {"flashinfer", "flashinfer_python-0.7.2.post1.dist-info"}
    assert all(m.mtime == build.MTIME and m.uid == m.gid == 0 and not m.uname for m in members)
    assert all(m.mode == (0o755 if m.isdir() else 0o644) for m in members)
    csrc = {n[len("flashinfer/data/csrc/"):] for n in names if n.startswith("flashinfer/data/csrc/")}
    assert {"page.cu", "batch_decode.cu", "batch_prefill.cu", "kda_common.cuh"} <= csrc
    assert not csrc & {p.split("/")[0] for p in PRUNED}, csrc
    assert not any(n.endswith(".pyc") or "__pycache__" in n for n in names)
    assert "kept because a kept source includes them: ['kda_common.cuh']" in log
    assert "nvidia-cudnn-frontend" in log and "rich" not in log.split("requires, outside")[1].split("\n")[0]
    # `tar -xJf fi-V.tar.xz -C D` (suite.sh's use_fi) gives D/flashinfer with the fixed date
    dest = tmp_path / "x"
    dest.mkdir()
    if shutil.which("tar") and shutil.which("xz"):
        subprocess.run(["tar", "-xJf", str(arc), "-C", str(dest)], check=True)
    else:
        with tarfile.open(arc) as tar:
            tar.extractall(dest, filter="data")
    assert (dest / "flashinfer" / "__init__.py").read_text() == "__version__ = '0.7.2.post1'\n"
    assert int((dest / "flashinfer" / "data" / "csrc" / "page.cu").stat().st_mtime) == build.MTIME
    wheels = sorted(p.name for p in out.glob("*.whl"))
    assert wheels == sorted(f"{build._norm(d.dist)}-{d.version}-py3-none-any.whl" for d in build.kit_deps())
    manifest = json.loads((out / "kit.json").read_text())
    (fi,) = manifest["flashinfer"]
    assert fi["wheel_sha256"] == build.sha256_file(cache / fi["wheel"]) and fi["sha256"] == build.sha256_file(arc)
    assert fi["pruned_entries"] == len({p.split("/")[0] for p in PRUNED})
    assert {w["file"] for w in manifest["wheels"]} == set(wheels)


def test_kit_archive_is_byte_identical_whatever_the_wheels_dates(build, tmp_path):
    """The archive is the same bytes from a wheel whose zip entries carry other dates, extracted at another time."""
    a = _cache(tmp_path / "a", build)
    b = _cache(tmp_path / "b", build, date=(2021, 6, 7, 8, 9, 10))
    assert build.sha256_file(next(a.glob("flashinfer*"))) != build.sha256_file(next(b.glob("flashinfer*")))
    assert _kit(build, tmp_path / "out-a", a) == 0
    assert _kit(build, tmp_path / "out-b", b) == 0
    name = "fi-0.7.2.post1.tar.xz"
    assert (tmp_path / "out-a" / name).read_bytes() == (tmp_path / "out-b" / name).read_bytes()


def test_kit_skips_an_archive_built_from_the_same_wheel(build, tmp_path, monkeypatch, capsys):
    cache = _cache(tmp_path, build)
    out = tmp_path / "gpu"
    assert _kit(build, out, cache) == 0
    arc = out / "fi-0.7.2.post1.tar.xz"
    before = arc.stat().st_mtime_ns, arc.read_bytes()
    capsys.readouterr()

    def no_pack(root, dest):
        raise AssertionError("packed again")

    monkeypatch.setattr(build, "pack_tree_xz", no_pack)
    assert _kit(build, out, cache) == 0
    assert "fi-0.7.2.post1.tar.xz: up to date" in capsys.readouterr().out
    assert (arc.stat().st_mtime_ns, arc.read_bytes()) == before
    monkeypatch.undo()
    _wheel(cache, "0.7.2.post1", extra=b"# another build of the release\n")  # another wheel: rebuilt
    assert _kit(build, out, cache) == 0
    assert arc.read_bytes() != before[1]
    arc.write_bytes(b"truncated by a transfer")  # the recorded sha256 no longer matches: rebuilt
    assert _kit(build, out, cache) == 0
    with tarfile.open(arc) as tar:
        assert "flashinfer/__init__.py" in tar.getnames()


def test_kit_leaves_a_release_without_a_prune_rule_whole_and_says_so(build, tmp_path, capsys):
    cache = _cache(tmp_path, build, versions=("0.6.15", "0.7.2.post1"))
    out = tmp_path / "gpu"
    assert "0.6.15" not in build.FLASHINFER_CSRC_PRUNE
    assert _kit(build, out, cache, "--flashinfer", "0.6.15", "0.7.2.post1") == 0
    assert "flashinfer 0.6.15: no FLASHINFER_CSRC_PRUNE rule, csrc left unpruned" in capsys.readouterr().out
    with tarfile.open(out / "fi-0.6.15.tar.xz") as tar:
        names = tar.getnames()
    assert all(f"flashinfer/data/csrc/{p}" in names for p in PRUNED)
    assert [r["version"] for r in json.loads((out / "kit.json").read_text())["flashinfer"]] == ["0.6.15", "0.7.2.post1"]


def test_kit_over_the_size_limit_is_an_error_naming_the_way_out(build, tmp_path, capsys):
    cache = _cache(tmp_path, build)
    out = tmp_path / "gpu"
    (out / "s23").mkdir(parents=True)
    (out / "s23" / "go.sh").write_bytes(b"#" * 300_000)  # carried with the folder, so counted
    assert _kit(build, out, cache, "--max-mib", "0.2") == 1
    cap = capsys.readouterr()
    assert "other files under" in cap.out and "s23/go.sh" in cap.out
    err = cap.err
    assert "more than --max-mib 0.2" in err and "fi-0.7.2.post1.tar.xz" in err and "--flashinfer" in err
    assert "0.3 MiB of other files" in err and "64 MiB" in err


def test_kit_offline_without_the_wheel_says_how_to_fill_the_cache(build, tmp_path, capsys):
    assert _kit(build, tmp_path / "gpu", tmp_path / "empty") == 1
    err = capsys.readouterr().err
    assert "flashinfer-python==0.7.2.post1" in err and "without --offline" in err


# --------------------------------------------------------------------------------------------
# scripts/gpu/table.py and suite.sh


def _log_rows(log: str) -> dict[tuple[str, str], tuple[float, float]]:
    """(shape[:24], row) -> (ms graph, x FlashInfer bf16) from bench_attention's markdown log."""
    rows, shape = {}, ""
    for line in log.splitlines():
        if line.startswith("## ") and "(" in line:
            shape = line[3:].split(" (")[0][:24]
        elif line.startswith(("| triton", "| FlashInfer")) and shape:
            cells = [c.strip() for c in line.strip("|").split("|")]
            impl, config, ms, x_bf16 = cells[0], cells[1], float(cells[2]), float(cells[4])
            if impl.startswith("FlashInfer"):
                row = "FlashInfer " + impl.split(" ", 2)[2]
            elif config.startswith("default"):
                row = "DEFAULT"
            else:
                ring = re.search(r"ring=(\d)", config)
                assert ring, config
                row = "ring=" + ring.group(1)
            rows[(shape, row)] = (ms, x_bf16)
    return rows


def test_table_on_run_s_matches_the_bench_log():
    proc = subprocess.run([sys.executable, str(TABLE), str(RUN_S / "call6-bench.json")],
                          capture_output=True, text=True, check=True)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("NVIDIA H100 80GB HBM3") and "CUT OFF" not in lines[0]
    got = {}
    for line in lines[2:]:
        shape, row, rest = line[:24].strip(), line[25:73].strip(), line[74:].split()
        got[(shape, row)] = rest
    want = _log_rows((RUN_S / "call6-bench.log").read_text())
    assert len(want) == 36 and set(got) == set(want)
    for key, (ms, x_bf16) in want.items():
        ms_s, vs_default, x_fi = got[key][:3]
        assert ms_s == f"{ms:.4f}", key
        assert float(x_fi.rstrip("x")) == pytest.approx(x_bf16, abs=0.0055), key  # the log: 2 decimals
    # run S's README: rings of 4 / 5 at +5.6% / +9.6% (16 x 16K) and +9.2% / +14.3% (4 x 32K)
    assert got[("decode 16 x 16K", "ring=4")][1] == "+5.6%" and got[("decode 16 x 16K", "ring=5")][1] == "+9.6%"
    assert got[("decode 4 x 32K 40/8 head", "ring=5")][1] == "+14.3%"
    assert got[("decode 1 x 8K", "DEFAULT")][2] == "0.894x"


def test_table_says_a_cut_off_run_and_a_missing_file(tmp_path):
    data = json.loads((RUN_S / "call6-bench.json").read_text())
    data["complete"] = False
    data["rows"] = data["rows"][:7] + [dict(data["rows"][7], ms_graph=None, note="watchdog: stopped")]
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(data))
    proc = subprocess.run([sys.executable, str(TABLE), str(path), str(tmp_path / "none.json")],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "none.json" in proc.stderr
    assert "(CUT OFF: the shapes done so far)" in proc.stdout and "watchdog: stopped" in proc.stdout


needs_bash = pytest.mark.skipif(not (shutil.which("bash") and shutil.which("awk")), reason="needs bash and awk")


@needs_bash
def test_suite_parses_and_documents_every_stage():
    subprocess.run(["bash", "-n", str(SUITE)], check=True)
    text = SUITE.read_text()
    arms = set(re.findall(r"^    ([a-z][a-z-]*)\)", text, re.M))
    documented = set(re.findall(r"^#   ([a-z][a-z-]*) ", text, re.M))
    assert {"variants", "config", "shard", "caches"} <= arms
    assert arms == documented


def _result_ids(tmp: Path, ids: list[str], log: Path, mode: str) -> list[str]:
    func = re.search(r"^result_ids\(\) \{.*?^\}\n", SUITE.read_text(), re.M | re.S)
    assert func, "suite.sh defines result_ids"
    (tmp / "ids.txt").write_text("\n".join(ids) + "\n")
    proc = subprocess.run(["bash", "-c", func.group(0) + f'result_ids "$1" "$2" {mode}', "-",
                           str(tmp / "ids.txt"), str(log)], capture_output=True, text=True, check=True)
    return proc.stdout.split()


@needs_bash
def test_shard_finds_run_s_failures_and_the_ids_a_time_limit_left(tmp_path):
    """Run S's first shard: 20 of its 401 ids failed under 12 workers (out of memory); they are among the 22 that
    call 4 reran on 2 workers and that all passed there."""
    log = RUN_S / "call1-suite-1.log"
    ids = sorted(set(re.findall(r"^\[gw\d+\] \[ *\d+%\] [A-Z]+ (\S+)", log.read_text(), re.M)))
    assert len(ids) == 401  # 378 passed, 20 failed, 3 skipped
    rerun = (RUN_S / "scripts" / "rerun.txt").read_text().split()
    failed = _result_ids(tmp_path, ids, log, "failed")
    assert len(failed) == 20 and set(failed) <= set(rerun)
    assert _result_ids(tmp_path, ids, log, "notrun") == []
    cut = tmp_path / "cut.log"  # stopped by the time limit half-way: no summary, half the ids without a result
    lines = log.read_text().splitlines()
    half = next(i for i, line in enumerate(lines) if "[ 50%]" in line)
    cut.write_text("\n".join(lines[:half]) + "\n")
    notrun = _result_ids(tmp_path, ids, cut, "notrun")
    assert 0 < len(notrun) < len(ids)
    assert set(_result_ids(tmp_path, ids, cut, "failed")) <= set(failed)
    assert _result_ids(tmp_path, rerun, RUN_S / "call4-suite-rerun.log", "unpassed") == []


@needs_bash
@pytest.mark.parametrize("cap,want", [("9.0", "9.0a"), ("8.6", "8.6"), ("12.0", "12.0"), ("", ""), ("[N/A]", "")])
def test_suite_builds_flashinfer_for_the_gpus_arch_only(tmp_path, cap, want):
    """suite.sh's ``fi_arch``: FLASHINFER_CUDA_ARCH_LIST from nvidia-smi's compute capability (9.0a on Hopper, whose
    FlashInfer modules need the arch-specific target), nothing where nvidia-smi answers no capability."""
    func = re.search(r"^fi_arch\(\) \{.*?^\}\n", SUITE.read_text(), re.M | re.S)
    assert func, "suite.sh defines fi_arch"
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\necho '{cap}'\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(["bash", "-c", func.group(0) + "fi_arch"], capture_output=True, text=True, check=True, env=env)
    assert proc.stdout.strip() == want


# scripts/gpu/ncu_source.py (suite.sh variants with NCU_SOURCE=1)

NCU_SOURCE = ROOT / "scripts" / "gpu" / "ncu_source.py"


def test_ncu_source_ranks_the_flagged_lines(tmp_path):
    """The program's own output and ncu's messages before the header are skipped; each matching column lists its
    largest lines with their share; numbers with thousands separators parse; unmatched columns are left out."""
    path = tmp_path / "ncu-src-g11.log"
    path.write_text(
        "decode 16 x 16K: 0.1291 ms\n==PROF== Disconnected from process 1\n"
        '"Address","Source","Warp Stall Sampling (All Samples)","L2 Theoretical Sectors Global Excess",'
        '"L1 Wavefronts Shared Excess","Instructions Executed"\n'
        '"0x10","LDG.E.64 R2, desc[UR4][R4.64]","12","1,500","0","900"\n'
        '"0x20","LDS.128 R8, [R3]","300","0","4,000","900"\n'
        '"0x30","HMMA.16816.F32.BF16 R12, R8, R2, R12","88","0","0","900"\n'
        '"0x40","LDG.E.U8 R6, desc[UR4][R10.64]","40","500","0","900"\n'
    )
    proc = subprocess.run([sys.executable, str(NCU_SOURCE), str(path), "--top", "2"], capture_output=True, text=True,
                          check=True)
    out = proc.stdout.splitlines()
    assert out[0] == "== Warp Stall Sampling (All Samples): total 440 over 4 instructions"
    assert "68.2%" in out[1] and "LDS.128" in out[1] and "0x20" in out[1]
    assert "HMMA" in out[2]
    i = out.index("== L2 Theoretical Sectors Global Excess: total 2,000 over 4 instructions")
    assert "75.0%" in out[i + 1] and "LDG.E.64" in out[i + 1] and "25.0%" in out[i + 2] and "LDG.E.U8" in out[i + 2]
    assert "== L1 Wavefronts Shared Excess: total 4,000 over 4 instructions" in out
    assert not any("Instructions Executed" in line for line in out)


def test_ncu_source_says_a_cut_off_profile(tmp_path):
    path = tmp_path / "cut.log"
    path.write_text("==PROF== Connected to process 1\n==ERROR== timeout\n")
    proc = subprocess.run([sys.executable, str(NCU_SOURCE), str(path)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "no source-page header found" in proc.stderr and "--page source --csv" in proc.stderr


def test_ncu_source_reads_a_real_export():
    """An excerpt of a real export (run V, H100, ncu's ``--page source --csv --print-source sass`` of the Gluon decode
    at 16 x 16K: its preamble, the ``"Kernel Name"`` line, the full header with ncu's own column names such as
    ``... Excessive``, and six SASS lines): the three ranked columns are found under the names this ncu writes."""
    proc = subprocess.run([sys.executable, str(NCU_SOURCE), str(ROOT / "tests" / "data" / "ncu-source-h100-excerpt.csv"),
                           "--top", "1"], capture_output=True, text=True, check=True)
    out = proc.stdout.splitlines()
    i = out.index("== Warp Stall Sampling (All Samples): total 6,036 over 6 instructions")
    assert "98.2%" in out[i + 1] and "IMAD.SHL.U32" in out[i + 1]
    i = out.index("== L2 Theoretical Sectors Global Excessive: total 1,572,864 over 6 instructions")
    assert "50.0%" in out[i + 1] and "LDG.E.U16" in out[i + 1]
    i = out.index("== L1 Wavefronts Shared Excessive: total 14,336 over 6 instructions")
    assert "100.0%" in out[i + 1] and "STS" in out[i + 1]


@needs_bash
def test_suite_passes_shape_descriptions_to_the_bench():
    """suite.sh's ``bench_shapes``: ``--shapes`` (the issue's six by default) unless only SPECS is given; each non-blank
    ';'-separated description of SPECS as one ``--shape``; an item ``general`` the GENERAL_SPECS set (alone or beside
    other descriptions), which bench_attention.py reads."""
    text = SUITE.read_text()
    func = re.search(r"^bench_shapes\(\) \{.*?^\}\n", text, re.M | re.S)
    assert func, "suite.sh defines bench_shapes"
    consts = "".join(re.findall(r"^(?:DECODE_SHAPES|GENERAL_SPECS)\+?=.*\n", text, re.M))

    def args(**env: str) -> list[str]:
        base = {k: v for k, v in os.environ.items() if k not in ("SHAPES", "SPECS")}
        proc = subprocess.run(["bash", "-c", consts + func.group(0) + "bench_shapes"], capture_output=True, text=True,
                              check=True, env={**base, **env})
        return proc.stdout.splitlines()

    six = args()
    assert six[0] == "--shapes" and len(six) == 2 and six[1].count(",") == 5
    assert args(SHAPES="decode 1 x 8K") == ["--shapes", "decode 1 x 8K"]
    assert args(SPECS=" decode 1 x 2K; ;decode 2 x 4K") == ["--shape", " decode 1 x 2K", "--shape", "decode 2 x 4K"]
    assert args(SPECS="decode 1 x 2K", SHAPES="decode 1 x 8K") == ["--shapes", "decode 1 x 8K", "--shape", "decode 1 x 2K"]
    general = args(SPECS="general")
    specs = general[1::2]
    assert general[::2] == ["--shape"] * len(specs) and len(specs) == 12
    assert args(SPECS="decode 1 x 2K; general ;decode 32 x 4K hd 64") == (
        ["--shape", "decode 1 x 2K"] + general + ["--shape", "decode 32 x 4K hd 64"])
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_attention
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    shapes = [bench_attention.parse_shape(s) for s in specs]
    assert any(len(s.seq_lens) == 1 and s.seq_lens[0] <= 1024 for s in shapes)  # one short request
    assert any(len(set(s.seq_lens)) > 1 for s in shapes) and any(s.page_size == 32 for s in shapes)


# scripts/gpu/sass_regions.py (the static counts of BENCHMARKS.md run AA)

SASS_REGIONS = ROOT / "scripts" / "gpu" / "sass_regions.py"


def _sass(lines: list[str]) -> str:
    """cuobjdump's listing: a header, then each instruction with its address and its encoding comments."""
    out = ["\tcode for sm_90a", "\t\tFunction : k"]
    for i, text in enumerate(lines):
        out.append(f"        /*{16 * i:04x}*/                   {text} ;      /* 0x0000000000007b1d */")
        out.append("                                                        /* 0x000fe20000000a00 */")
    return "\n".join(out) + "\n"


def test_sass_regions_cuts_at_loops_and_exits(tmp_path):
    """A straight set-up, an early exit, a loop holding a nested loop, an epilogue: the pieces, their counts, their
    loop depth and their opcodes (a predicate dropped); a forward branch cuts nothing."""
    import importlib.util

    from nvfp4compat.kernels.aot import sass_listing

    spec = importlib.util.spec_from_file_location("sass_regions", SASS_REGIONS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = _sass([
        "IMAD R1, R2, R3, RZ", "ISETP.GE.AND P0, PT, R1, RZ, PT", "@P0 EXIT",  # 0x00-0x20: set-up, exit
        "LDG.E R4, desc[UR4][R2.64]", "@!P1 BRA 0x80",  # 0x30-0x40: a forward branch
        "HMMA.16816.F32 R8, R4, R6, R8", "FADD R9, R9, R9", "@P2 BRA 0x50",  # 0x50-0x70: inner loop
        "IADD3 R1, R1, 0x1, RZ", "@!P3 BRA 0x50",  # 0x80-0x90: end of the outer loop (head 0x50)
        "STG.E desc[UR4][R2.64], R8", "EXIT", "BRA 0xc0",  # epilogue, exit, the trailing self-branch
    ])
    pieces = [(r["start"], r["end"], r["count"], r["depth"]) for r in mod.regions(sass_listing(text))]
    assert pieces == [(0x0, 0x30, 3, 0), (0x30, 0x50, 2, 0), (0x50, 0x80, 3, 2), (0x80, 0xa0, 2, 1),
                      (0xa0, 0xc0, 2, 0), (0xc0, 0xd0, 1, 1)]
    assert mod.regions(sass_listing(text))[2]["ops"] == {"HMMA": 1, "FADD": 1, "BRA": 1}
    path = tmp_path / "k.sass"
    path.write_text(text)
    proc = subprocess.run([sys.executable, str(SASS_REGIONS), str(path)], capture_output=True, text=True, check=True)
    assert proc.stdout.splitlines()[0] == "k.sass: 13 instructions"
    assert "   0x50    0x80      3  **    HMMA 1, FADD 1, BRA 1" in proc.stdout
    empty = tmp_path / "empty.sass"
    empty.write_text("nothing here\n")
    proc = subprocess.run([sys.executable, str(SASS_REGIONS), str(empty)], capture_output=True, text=True)
    assert proc.returncode == 1 and "no SASS instruction found" in proc.stderr and "--sass DIR" in proc.stderr
