"""FlashInfer's cubin version check: the plan's environment is set before FlashInfer is imported.

The case: vLLM 0.25.1 pins ``flashinfer-cubin==0.6.13``; a user who installs flashinfer-python 0.6.15
(the first release with the slot-mapping writer) next to it gets ``RuntimeError: flashinfer-cubin
version (0.6.13) does not match flashinfer version (0.6.15)`` on ``import flashinfer``. Where no
cubin-backed kernel is used the matrix marks the mismatch harmless and the plan sets
``FLASHINFER_DISABLE_VERSION_CHECK``; the plugin must set it before FlashInfer's first import.
Venv: ``FLASHINFER=0.6.15 scripts/vllm_cpu_env.sh 0.25.1``. Each case runs in a fresh interpreter.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest
from vllm_cpu_support import HAVE_VLLM, NO_VLLM_REASON  # noqa: E402

if not HAVE_VLLM:
    pytest.skip(NO_VLLM_REASON, allow_module_level=True)

PROBE = r"""
import json, sys
import vllm.plugins
vllm.plugins.load_general_plugins()
from nvfp4compat import vllm_plugin
plan = vllm_plugin.last_plan()
out = {"env": dict(plan.env) if plan is not None else None,
       "imported_before": "flashinfer" in sys.modules}
try:
    import flashinfer
    out["import"] = "ok"
except Exception as exc:
    out["import"] = f"{type(exc).__name__}: {exc}"
print("RESULT " + json.dumps(out))
"""


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _run(plugins: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "FLASHINFER_DISABLE_VERSION_CHECK"}
    env.update(VLLM_PLUGINS=plugins, NVFP4COMPAT_ARCH="sm_90")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.fixture(scope="module")
def mismatched_cubin():
    fi, cubin = _version("flashinfer-python"), _version("flashinfer-cubin")
    if cubin is None or cubin == fi:
        pytest.skip(
            f"needs flashinfer-cubin != flashinfer-python (found {cubin} / {fi}); "
            "make the venv with FLASHINFER=0.6.15 scripts/vllm_cpu_env.sh 0.25.1"
        )
    return fi, cubin


def test_without_plugin_flashinfer_refuses_to_import(mismatched_cubin):
    fi, cubin = mismatched_cubin
    result = _run("")
    assert result["env"] is None  # the plugin did not run
    assert result["import"].startswith("RuntimeError") and "does not match" in result["import"], (
        result
    )


def test_plugin_sets_the_plan_env_before_flashinfer_is_imported(mismatched_cubin):
    result = _run("nvfp4compat")
    assert result["env"] is not None, "register() resolved no plan"
    assert result["env"].get("FLASHINFER_DISABLE_VERSION_CHECK"), result
    assert result["imported_before"] is False
    assert result["import"] == "ok", result
