"""scripts/sanitize.py (the compute-sanitizer driver of docs/validation.md section 9) on the CPU.

Under ``--device cpu`` the same cases run in the Triton interpreter: every case must behave as it
states (a refusal, or finite outputs and the expected error-flag bits). A subset keeps this cheap;
the GPU runs take all of them under the sanitizer.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "sanitize.py"), "--device", "cpu", *args],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def test_sanitize_cases_of_the_newest_decode_paths_behave_as_stated():
    proc = _run("--ops", "decode", "--dtype", "bf16", "--match", "byte scales,fused merge,rotated")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    m = re.search(r"sanitize: (\d+)/(\d+) cases as expected", out)
    assert m and m.group(1) == m.group(2) and int(m.group(2)) >= 20, out[-2000:]
    names = [ln for ln in out.splitlines() if ln.startswith("ok ")]
    assert all(any(w in ln for w in ("byte scales", "fused merge", "rotated")) for ln in names), names
    assert any("bad pages" in ln for ln in names) and any("seq_lens 1e7" in ln for ln in names)


def test_sanitize_refuses_a_filter_that_selects_nothing():
    proc = _run("--ops", "write", "--match", "no-such-case")
    assert proc.returncode == 2
    assert "selects no case" in proc.stderr


def test_sanitize_runs_the_hostile_cases_through_the_plan_and_the_chunk_table():
    """``--knob``: the hostile decode cases (bad pages, lengths past the row, a decreasing ``query_start_loc``) through
    the merge kernel's plan and the decode's chunk table, which their batches of 3 do not reach by default."""
    proc = _run("--ops", "decode,prefill", "--dtype", "bf16", "--match", "bad pages,seq_lens 1e7,decreasing",
                "--knob", "MERGE_PLAN_MIN_BATCH=1", "--knob", "DECODE_TABLE_MIN_BATCH=1")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "knob  MERGE_PLAN_MIN_BATCH = 1 (default 33)" in out and "knob  DECODE_TABLE_MIN_BATCH = 1 (default 0)" in out
    m = re.search(r"sanitize: (\d+)/(\d+) cases as expected", out)
    assert m and m.group(1) == m.group(2) and int(m.group(2)) >= 3, out[-2000:]


@pytest.mark.parametrize("spec, msg", [("NO_SUCH_KNOB=1", "has no integer constant NO_SUCH_KNOB"),
                                       ("MERGE_PLAN_MIN_BATCH=x", "need NAME=V"),
                                       ("FUSED_MERGE=1", "(it is a bool)")])
def test_sanitize_refuses_a_bad_knob(spec, msg):
    proc = _run("--ops", "write", "--knob", spec)
    assert proc.returncode == 2
    assert msg in proc.stderr
