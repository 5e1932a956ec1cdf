#!/usr/bin/env bash
# Create a CPU-only virtual environment that imports a real vLLM release, for tests/vllm/.
#
# Usage: scripts/vllm_cpu_env.sh VLLM_VERSION [VENV_DIR]
#   VENV_DIR defaults to <repo>/.venvs/vllm-$VLLM_VERSION (or $NVFP4COMPAT_VENVS/vllm-$VLLM_VERSION).
#   FLASHINFER=X.Y.Z replaces the flashinfer-python that vLLM pins (installed with --no-deps after the
#   pinned list), e.g. FLASHINFER=0.6.15 on vLLM 0.25.1, whose flashinfer-cubin==0.6.13 pin then no
#   longer matches (FlashInfer's version check); VENV_DIR then defaults to vllm-$VER-fi$X.Y.Z.
#
# Recipe (docs/vllm-on-cpu.md in the shared reference docs): CPU torch 2.13.0 first, then vLLM and
# every dependency its attention imports need with --no-deps, from the per-release pinned list
# tests/vllm/requirements/extras-$VLLM_VERSION.txt. vLLM's own torch pin (2.11 / 2.14) and its CUDA
# dependencies (nvidia-cutlass-dsl, torchvision, ...) are deliberately not installed: a plain
# `pip install vllm` would pull CUDA wheels. Then triton (the interpreter runs the bundled kernels),
# the test tools, and this project in editable mode, so its `vllm.general_plugins` entry point is
# discoverable by vllm.plugins.load_general_plugins().
set -euo pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: $0 VLLM_VERSION [VENV_DIR]" >&2
    exit 2
fi
VER="$1"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SUFFIX="${FLASHINFER:+-fi$FLASHINFER}"
VENV="${2:-${NVFP4COMPAT_VENVS:-$ROOT/.venvs}/vllm-$VER$SUFFIX}"
EXTRAS="$ROOT/tests/vllm/requirements/extras-$VER.txt"
PYTHON="${PYTHON:-python3.11}"

if [[ ! -f "$EXTRAS" ]]; then
    echo "no pinned extras for vLLM $VER: $EXTRAS is missing; known: $(ls "$ROOT/tests/vllm/requirements" | tr '\n' ' ')" >&2
    exit 2
fi

"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
"${PIP[@]}" torch==2.13.0
"${PIP[@]}" --no-deps "vllm==$VER" -r "$EXTRAS"
if [[ -n "${FLASHINFER:-}" ]]; then
    "${PIP[@]}" --no-deps "flashinfer-python==$FLASHINFER"
fi
"${PIP[@]}" triton==3.9.0 pytest==9.2.0 hypothesis==6.170.17 hatchling editables
"${PIP[@]}" --no-deps --no-build-isolation -e "$ROOT"
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
eps = [e for e in md.entry_points(group="vllm.general_plugins") if e.name == "nvfp4compat"]
assert eps, "nvfp4compat's vllm.general_plugins entry point is not discoverable"
print("vllm", md.version("vllm"), "flashinfer-python", md.version("flashinfer-python"),
      "torch", md.version("torch"), "entry point", eps[0].value)
EOF
