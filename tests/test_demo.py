"""``nvfp4compat demo`` runs end to end on this machine (CPU: Triton interpreter) in under a minute."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from nvfp4compat.demo import capacity_ratio


def test_capacity_ratio_against_bf16():
    # bf16: 4 * D * Hkv bytes per token per layer; NVFP4: 2 * (D/2 + D/16) * Hkv.
    assert capacity_ratio(128) == pytest.approx(512 / 144)
    assert round(capacity_ratio(128), 2) == 3.56
    assert capacity_ratio(64) == pytest.approx(256 / 72)


def test_demo_runs_and_reports():
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # the demo sets it itself on a CPU-only machine
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "nvfp4compat", "demo", "--device", "cpu"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    elapsed = time.perf_counter() - t0
    out = proc.stdout
    assert proc.returncode == 0, f"demo failed ({proc.returncode}):\n{out[-3000:]}\n{proc.stderr[-3000:]}"
    assert elapsed < 60, f"the CPU demo took {elapsed:.1f} s (limit 60 s)"
    for needle in ("== plan", "== capacity", "3.56x", "== decode", "== prefill", "relative L2", "== OK"):
        assert needle in out, f"{needle!r} missing from the demo output:\n{out}"
    # the kernels' own error is printed and within the contract
    errs = [float(line.split("relative L2 ")[1].split()[0]) for line in out.splitlines()
            if line.startswith("kernel vs float32 reference")]
    assert len(errs) == 2 and all(e <= 1e-2 for e in errs), errs
