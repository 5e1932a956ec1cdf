#!/usr/bin/env python3
"""Build an offline bundle of vLLM, FlashInfer and nvfp4compat for a GPU host without internet access.

The host is assumed to have Python 3.12, a CUDA torch and Triton, transformers and the packages in
``HOST_PACKAGES_*``, but no network; the files reach it in transfers of limited size
(``--transfer-mib``). This script assembles, on a machine with internet access, everything else
``nvfp4compat validate``'s checks need:

- vLLM (``--vllm``), pruned to what a dense Qwen3/Llama model on the FLASHINFER attention backend
  loads (``PRUNE_VLLM`` says what goes and why; written against vLLM 0.26.0, and ``REQUIRED_VLLM``
  stops a build whose pruning removed a file the engine needs), as an extracted tree;
- the minimal set of Python packages the host lacks (``DEPS``: each line says which import needs it),
  as cp312 manylinux x86_64 wheels, extracted;
- one or more flashinfer-python releases (``--flashinfer``), each in its own site folder so the
  host runner picks one per run;
- the nvfp4compat wheel, rebuilt from the checkout every time (its code changes).

Everything is packed into ``.bundle/pNN/part-NN.tar.xz`` files of at most ``--max-part-mib`` each.
Each part is a self-contained tar.xz (a concatenation of independently compressed xz streams, which
``tar -xJf`` and Python's ``tarfile`` read as one archive), so the host unpacks every part as it
arrives. A file too large for one part is stored as raw chunks and joined by the runner.
``manifest.json`` (copied into every part folder) gives each part's sha256, size and contents, a
sha256 over every component's file tree, and the pruning record.

Usage::

    python tools/gpu_bundle/build.py build --vllm 0.26.0 --flashinfer 0.6.14 0.6.15 --max-part-mib 44
    python tools/gpu_bundle/build.py verify     # unpack the parts with the host runner, import-check
    python tools/gpu_bundle/build.py plan       # which parts go in which transfer
    python tools/gpu_bundle/build.py check-venv # (re)create the CPU venv that mimics the host
    python tools/gpu_bundle/build.py kit --out .gpu  # what scripts/gpu/suite.sh expects in .gpu/

Only the standard library is needed to build; ``verify`` uses the venv ``check-venv`` makes
(``--check-venv``, default under the bundle folder) and, when present, a Python 3.12 interpreter
for the cp312 binaries.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as _dt
import fnmatch
import hashlib
import io
import json
import lzma
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

# Defaults of --vllm / --flashinfer / --flashinfer-default: the release the prune rules and DEPS
# were written against, its FlashInfer pin, the first release with the slot-mapping writer, and
# one with a faster FA2 NVFP4 read. main() sets these from the arguments (build) or the manifest.
VLLM_VERSION = "0.26.0"
FLASHINFER_VERSIONS: tuple[str, ...] = ("0.6.14", "0.6.15", "0.7.2.post1")
FLASHINFER_DEFAULT = "0.6.14"  # vLLM 0.26.0's pin; the host runner's default


@dataclass(frozen=True)
class Dep:
    """One package the host lacks, with the import that needs it (found in a fresh venv)."""

    dist: str
    version: str
    needed_by: str


# The minimal set, found by importing vllm, vllm.engine.arg_utils, vllm.v1.engine.core,
# vllm.v1.worker.gpu_worker, vllm.v1.worker.gpu_model_runner, vllm.model_executor.models.qwen3,
# vllm.v1.attention.backends.flashinfer and vllm.entrypoints.llm (plus ~30 runtime modules, see
# verify) in a venv holding only the host's packages; each line was added after the import failed
# without it, and `verify --leave-one-out` re-proves that each one is needed. Versions satisfy
# vLLM 0.26.0's Requires-Dist and the host's own packages.
DEPS: tuple[Dep, ...] = (
    Dep(
        "pydantic",
        "2.14.4",
        "vllm.engine.arg_utils, vllm.config (pydantic dataclasses); nvfp4compat.plan",
    ),
    Dep("pydantic-core", "2.50.5", "pydantic 2.14.4 (exact pin)"),
    Dep("annotated-types", "0.8.0", "pydantic"),
    Dep("typing-inspection", "0.4.5", "pydantic, fastapi"),
    Dep("cbor2", "6.3.0", "vllm.utils.hashing (imported by vllm.config.device)"),
    Dep("pyzmq", "27.3.0", "vllm.utils.network_utils; engine-core IPC"),
    Dep("openai-harmony", "0.0.8", "vllm.entrypoints.mcp.tool_server (via vllm.reasoning)"),
    Dep(
        "openai",
        "2.54.0",
        "vllm.entrypoints.mcp.tool; 2.x because it uses httpx, which the host has (3.x needs httpx2+httpcore2)",
    ),
    Dep("sniffio", "1.3.1", "openai"),
    Dep("distro", "1.9.0", "openai"),
    Dep("msgspec", "0.23.0", "vllm.sampling_params"),
    Dep("pybase64", "1.5.1", "vllm.multimodal.media (imported by vllm.engine.arg_utils)"),
    Dep("cachetools", "8.0.2", "vllm.utils.cache (via vllm.multimodal.registry)"),
    Dep(
        "llguidance",
        "1.7.6",
        "vllm.v1.structured_output.backend_guidance (dataclass annotations resolve it at import)",
    ),
    Dep(
        "xgrammar",
        "0.2.7",
        "vllm.v1.structured_output.backend_xgrammar (imported by vllm.v1.engine.core)",
    ),
    Dep(
        "apache-tvm-ffi",
        "0.1.11",
        "flashinfer 0.6.14/0.6.15 (>=0.1.6,<0.2) and 0.7.2.post1 (>=0.1.11,<0.2); xgrammar (>=0.1.10)",
    ),
    Dep("fastapi", "0.136.3", "vllm.entrypoints.serve (via vllm.entrypoints.llm -> pooling)"),
    Dep("starlette", "1.10.0", "fastapi; vllm.entrypoints.serve"),
    Dep("partial-json-parser", "0.2.1.1.post7", "vllm.tool_parsers (via vllm.entrypoints.llm)"),
)

# The host's packages that vLLM's import path touches, for the CPU venv that mimics the host
# (the GPU host's own package list). Versions from its pip list
# where known; numpy 2.5.2 has no Python 3.11 wheel, so 2.4.6 stands in. Others: newest at build.
HOST_PACKAGES_PINNED = (
    "transformers==5.17.0",
    "huggingface_hub==1.33.0",
    "tokenizers==0.23.2",
    "safetensors==0.8.0",
    "numpy==2.4.6",
    "triton==3.6.0",
    "sentencepiece==0.2.2",
    "tiktoken==0.14.0",
    "accelerate==1.15.0",
)
HOST_PACKAGES_UNPINNED = (
    "tqdm",
    "requests",
    "urllib3",
    "idna",
    "certifi",
    "charset-normalizer",
    "packaging",
    "pyyaml",
    "regex",
    "psutil",
    "py-cpuinfo",
    "pillow",
    "aiohttp",
    "aiohappyeyeballs",
    "aiosignal",
    "attrs",
    "frozenlist",
    "multidict",
    "yarl",
    "propcache",
    "anyio",
    "h11",
    "httpx",
    "httpcore",
    "cloudpickle",
    "prometheus-client",
    "uvloop",
    "nvidia-ml-py",
    "einops",
    "protobuf",
    "hf-xet",
    "typer",
    "click",
    "shellingham",
    "rich",
    "markdown-it-py",
    "mdurl",
    "pygments",
    "six",
    "msgpack",
    "ninja",
    "tabulate",
    "annotated-doc",
    "aiofiles",
    "xxhash",
    "zipp",
    "wrapt",
)

# What goes from the vLLM wheel, matched with fnmatch against paths under the site folder.
PRUNE_VLLM: tuple[tuple[str, str], ...] = (
    (
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
        "FlashAttention 2 kernels (304 MB). FA3 stays: on CUDA, vllm.v1.attention.backends.fa_utils imports vllm.vllm_flash_attn unconditionally (via layers.attention.mm_encoder_attention, on every model's path), and that package raises ImportError unless FA2 or FA3 loads; FA3 is the Hopper build and packs to 8 MB",
    ),
    (
        "vllm/_moe_C_stable_libtorch.abi3.so",
        "MoE kernels; CudaPlatform.import_kernels suppresses its ImportError, dense models never call torch.ops._moe_C",
    ),
    (
        "vllm/_flashmla_C.abi3.so",
        "FlashMLA (MLA models only); vllm.v1.attention.ops.flashmla guards the import",
    ),
    (
        "vllm/_flashmla_extension_C.abi3.so",
        "FlashMLA FP8 extension (MLA models only); guarded import",
    ),
    (
        "vllm/_qutlass_C.abi3.so",
        "MXFP4/NVFP4 weight GEMMs for quantized checkpoints; import suppressed",
    ),
    (
        "vllm/_rust_tool_parser.abi3.so",
        "tool-call parsing of the OpenAI server; loaded on demand by vllm.tool_parsers.rust_tool_parser",
    ),
    ("vllm/vllm-rs", "Rust frontend binary, used only with VLLM_RUST_FRONTEND_PATH"),
    (
        "vllm/third_party/deep_gemm/*",
        "DeepGEMM FP8 block GEMM (+ CUTLASS headers); vllm.utils.deep_gemm imports it under try/except and runs without it (FP8 block-quantized weights only)",
    ),
    ("vllm/third_party/fmha_sm100/*", "SM100 sparse attention for MiniMax-M3"),
    ("vllm/third_party/tml_fa4/*", "FA4 relative attention of one model family (inkling)"),
    ("vllm/third_party/flashmla/*", "FlashMLA Python interface (MLA models only)"),
)
# Must survive pruning: what the engine, worker, model runner, Qwen3 and FlashInfer paths load.
REQUIRED_VLLM = (
    "vllm/_C_stable_libtorch.abi3.so",  # torch.ops._C*, including _C_cache_ops; imported by vllm.platforms.cuda
    "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",  # the import gate of vllm.vllm_flash_attn (see PRUNE_VLLM)
    "vllm/cumem_allocator.abi3.so",  # sleep mode / cumem allocator
    "vllm/spinloop.abi3.so",  # shm_broadcast (multiproc executor)
    "vllm/fs_io_C.abi3.so",
    "vllm/third_party/__init__.py",
    "vllm/third_party/pynvml.py",  # vllm.utils.import_utils.import_pynvml, used by vllm.platforms.cuda
    "vllm/third_party/flash_linear_attention/__init__.py",  # conditional import in layernorm.py
    "vllm/version.py",
    "vllm/_version.py",
    "vllm/v1/attention/backends/flashinfer.py",
    "vllm/model_executor/models/qwen3.py",
    "vllm/model_executor/models/llama.py",
    "vllm/v1/worker/gpu_model_runner.py",
    "vllm-0.26.0.dist-info/METADATA",
    "vllm-0.26.0.dist-info/entry_points.txt",
)
# torch.ops namespaces the kept _C_stable_libtorch registers (its STABLE_TORCH_LIBRARY*_init_<ns>
# symbols); the CPU probe of the CUDA import path stands in for exactly these.
KEPT_OP_NAMESPACES = ("_C", "_C_cache_ops", "_C_cuda_utils", "_C_custom_ar")
# CUDA sources under flashinfer/data/csrc that no KV-cache path (page, FA2 prefill/decode, fp4 kv
# quantize/dequantize) builds (FlashInfer's JIT specs of those modules list their sources).
FLASHINFER_CSRC_PRUNE: dict[str, tuple[str, ...]] = {
    "0.7.2.post1": ("cake_", "kda", "gdn", "fused_moe", "blackwell_"),
}
# Sources a KV-cache path JIT-builds; pruning must leave them and what they include.
FLASHINFER_KV_SOURCES = (
    "page.cu",
    "flashinfer_page_binding.cu",
    "batch_prefill.cu",
    "batch_prefill_jit_binding.cu",
    "batch_decode.cu",
    "batch_decode_jit_binding.cu",
)

PIP_PLATFORMS = (
    "manylinux_2_39_x86_64",
    "manylinux_2_35_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_26_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
HOST_GLIBC = (2, 39)  # Ubuntu 24.04 (Python 3.12.3 on the host)

COMPONENTS_ORDER: tuple[str, ...] = ("common", *(f"fi-{v}" for v in FLASHINFER_VERSIONS), "plugin")
VOLATILE = ("plugin",)  # rebuilt every time: kept in its own part so the other parts stay identical

XZ_PRESET = 9
MTIME = 1_700_000_000  # fixed member mtime: identical inputs give byte-identical parts
GROUP_RAW_BYTES = 8 << 20  # small files are compressed in groups of about this much raw data
MIB = 1 << 20
DEVICE_CALL_LIMIT = 64 * MIB  # --transfer-mib: what one transfer to the host carries, checkout included
FORMAT_VERSION = 1


class BuildError(RuntimeError):
    """A build step failed; the message says what was found, what is needed and the way out."""


def log(msg: str) -> None:
    print(f"[bundle] {msg}", flush=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------------------------
# wheels


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def wheel_fits_host(filename: str) -> bool:
    """True when a wheel's tags install on CPython 3.12, manylinux x86-64, glibc <= 2.39."""
    stem = filename[: -len(".whl")]
    parts = stem.split("-")
    if len(parts) < 5:
        return False
    py, abi, plat = parts[-3], parts[-2], parts[-1]
    pys, abis, plats = py.split("."), abi.split("."), plat.split(".")

    def py_ok(p: str, a: str) -> bool:
        if p in ("py3", "py2"):
            return a == "none"
        m = re.fullmatch(r"cp3(\d+)", p)
        if not m:
            return False
        minor = int(m.group(1))
        return (minor == 12 and a in ("cp312", "none", "abi3")) or (minor <= 12 and a == "abi3")

    def plat_ok(p: str) -> bool:
        if p == "any":
            return True
        if p in ("manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64"):
            return True
        m = re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", p)
        return m is not None and (int(m.group(1)), int(m.group(2))) <= HOST_GLIBC

    return any(py_ok(p, a) for p in pys for a in abis) and any(plat_ok(p) for p in plats)


def find_cached_wheel(cache: Path, dist: str, version: str) -> Path | None:
    for path in sorted(cache.glob("*.whl")):
        fields = path.name.split("-")
        if _norm(fields[0]) == _norm(dist) and fields[1] == version and wheel_fits_host(path.name):
            return path
    return None


def ensure_wheel(cache: Path, dist: str, version: str, offline: bool) -> Path:
    """Return the cached cp312 manylinux x86-64 wheel of ``dist==version``, downloading it if needed."""
    found = find_cached_wheel(cache, dist, version)
    if found:
        return found
    if offline:
        raise BuildError(
            f"{dist}=={version}: no cp312 manylinux x86_64 wheel in {cache} and --offline was given; "
            "run once without --offline (PyPI reachable) to fill the cache"
        )
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        *(a for p in PIP_PLATFORMS for a in ("--platform", p)),
        "-d",
        str(cache),
        f"{dist}=={version}",
    ]
    log(f"downloading {dist}=={version}")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(
            f"pip download {dist}=={version} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    found = find_cached_wheel(cache, dist, version)
    if not found:
        raise BuildError(
            f"pip download {dist}=={version} succeeded but no host-compatible wheel is in {cache}"
        )
    return found


def install_wheel(whl: Path, dest: Path) -> tuple[list[str], list[str]]:
    """Extract a wheel into ``dest`` as pip would for a --target install.

    ``<name>.data/purelib`` and ``platlib`` land at the root; ``scripts``/``headers``/``data`` are
    skipped (nothing here runs them). Byte-compiled files are skipped too: the host compiles its own.

    Returns
    -------
    (installed, skipped): lists of paths relative to ``dest`` and of archive names.
    """
    installed: list[str] = []
    skipped: list[str] = []
    with zipfile.ZipFile(whl) as zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            name = info.filename
            parts = name.split("/")
            if parts[0].endswith(".data"):
                if len(parts) > 2 and parts[1] in ("purelib", "platlib"):
                    rel = "/".join(parts[2:])
                else:
                    skipped.append(name)
                    continue
            else:
                rel = name
            if "__pycache__/" in rel or rel.endswith(".pyc"):
                skipped.append(name)
                continue
            target = dest / rel
            if target.exists():
                raise BuildError(
                    f"{whl.name}: {rel} is already staged by another wheel in {dest}; two packages ship the same file"
                )
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, target.open("wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            mode = (info.external_attr >> 16) & 0o777
            os.chmod(target, 0o755 if mode & 0o111 else 0o644)
            installed.append(rel)
    return installed, skipped


def build_plugin_wheel(repo: Path, out_dir: Path) -> Path:
    """Build the nvfp4compat wheel from the checkout (``pip wheel --no-deps``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("nvfp4compat-*.whl"):
        old.unlink()
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--disable-pip-version-check",
        "--no-deps",
        "-q",
        "-w",
        str(out_dir),
        str(repo),
    ]
    log("building the nvfp4compat wheel from " + str(repo))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(out_dir.glob("nvfp4compat-*.whl"))
    if proc.returncode != 0 or not wheels:
        raise BuildError(
            f"pip wheel {repo} failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n"
            "the nvfp4compat wheel is built with hatchling in an isolated build env (PyPI needed)"
        )
    return wheels[-1]


# --------------------------------------------------------------------------------------------
# staging


def _walk_files(root: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for fn in filenames:
            if fn.endswith(".pyc"):
                continue
            out.append(os.path.relpath(os.path.join(dirpath, fn), root).replace(os.sep, "/"))
    return sorted(out)


def prune(root: Path, rules: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """Delete files under ``root`` matching each rule; return one record per rule with counts."""
    files = _walk_files(root)
    records = []
    for pattern, reason in rules:
        hit = [f for f in files if fnmatch.fnmatchcase(f, pattern)]
        size = sum((root / f).stat().st_size for f in hit if (root / f).exists())
        for f in hit:
            p = root / f
            if p.exists():
                p.unlink()
        records.append({"pattern": pattern, "files": len(hit), "bytes": size, "reason": reason})
    # drop directories left empty
    for dirpath, _dirnames, _filenames in sorted(os.walk(root), key=lambda t: -len(t[0])):
        if dirpath != str(root) and not os.listdir(dirpath):
            os.rmdir(dirpath)
    return records


def prune_flashinfer_csrc(root: Path, version: str) -> dict[str, Any]:
    prefixes = FLASHINFER_CSRC_PRUNE.get(version, ())
    csrc = root / "flashinfer" / "data" / "csrc"
    if not prefixes:
        return {"removed": [], "bytes": 0}
    if not csrc.is_dir():
        raise BuildError(
            f"flashinfer {version}: {csrc} is missing; the wheel layout changed, review FLASHINFER_CSRC_PRUNE"
        )
    candidates = {e.name for e in csrc.iterdir() if e.name.startswith(prefixes)}
    # Keep a candidate that a kept source (outside csrc/experimental, whose generated kernels
    # already reference pruned headers) includes, until nothing kept points at a removed entry.
    include_re = re.compile(r'#include\s*"(?:\./)?([^"/]+)')
    kept_for: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for path in csrc.rglob("*"):
            rel = path.relative_to(csrc)
            if not path.is_file() or rel.parts[0] in candidates or "experimental" in rel.parts:
                continue
            if path.suffix not in (".cu", ".cuh", ".h", ".hpp", ".jinja", ".cpp", ".inc"):
                continue
            for m in include_re.finditer(path.read_text(errors="replace")):
                if m.group(1) in candidates:
                    candidates.discard(m.group(1))
                    kept_for[m.group(1)] = str(rel)
                    changed = True
    removed, size = [], 0
    for name in sorted(candidates):
        entry = csrc / name
        if entry.is_dir():
            size += sum(p.stat().st_size for p in entry.rglob("*") if p.is_file())
            shutil.rmtree(entry)
        else:
            size += entry.stat().st_size
            entry.unlink()
        removed.append(name)
    for src in FLASHINFER_KV_SOURCES:
        if not (csrc / src).exists():
            raise BuildError(
                f"flashinfer {version}: KV-cache source csrc/{src} is gone after pruning"
            )
    return {
        "removed": removed,
        "bytes": size,
        "prefixes": list(prefixes),
        "kept_because_included": kept_for,
    }


@dataclass
class Staged:
    """What was staged: per-component roots and the record that goes into the manifest."""

    root: Path
    wheels: list[dict[str, str]] = field(default_factory=list)
    vllm: dict[str, Any] = field(default_factory=dict)
    flashinfer_pruned: dict[str, Any] = field(default_factory=dict)
    plugin: dict[str, str] = field(default_factory=dict)


def stage(
    out: Path, cache: Path, offline: bool, flashinfer_versions: Sequence[str], with_plugin: bool
) -> Staged:
    st = Staged(root=out / "stage")
    if st.root.exists():
        shutil.rmtree(st.root)
    common = st.root / "common"
    common.mkdir(parents=True)

    vllm_whl = ensure_wheel(cache, "vllm", VLLM_VERSION, offline)
    log(f"staging {vllm_whl.name}")
    install_wheel(vllm_whl, common)
    pruned = prune(common, PRUNE_VLLM)
    missing = [r for r in REQUIRED_VLLM if not (common / r).exists()]
    if missing:
        raise BuildError(
            f"vLLM {VLLM_VERSION} after pruning lacks required files {missing}; review PRUNE_VLLM"
        )
    kept_so = sorted(f for f in _walk_files(common / "vllm") if f.endswith(".so"))
    st.vllm = {
        "wheel": vllm_whl.name,
        "wheel_sha256": sha256_file(vllm_whl),
        "wheel_bytes": vllm_whl.stat().st_size,
        "pruned": pruned,
        "pruned_bytes": sum(int(r["bytes"]) for r in pruned),
        "kept_so": [
            {"path": "vllm/" + f, "bytes": (common / "vllm" / f).stat().st_size} for f in kept_so
        ],
        "required": list(REQUIRED_VLLM),
    }
    st.wheels.append(
        {
            "dist": "vllm",
            "version": VLLM_VERSION,
            "file": vllm_whl.name,
            "sha256": st.vllm["wheel_sha256"],
            "component": "common",
            "needed_by": "the engine",
        }
    )

    for dep in DEPS:
        whl = ensure_wheel(cache, dep.dist, dep.version, offline)
        install_wheel(whl, common)
        st.wheels.append(
            {
                "dist": dep.dist,
                "version": dep.version,
                "file": whl.name,
                "sha256": sha256_file(whl),
                "component": "common",
                "needed_by": dep.needed_by,
            }
        )

    for ver in flashinfer_versions:
        whl = ensure_wheel(cache, "flashinfer-python", ver, offline)
        root = st.root / f"fi-{ver}"
        root.mkdir()
        install_wheel(whl, root)
        st.flashinfer_pruned[ver] = prune_flashinfer_csrc(root, ver)
        st.wheels.append(
            {
                "dist": "flashinfer-python",
                "version": ver,
                "file": whl.name,
                "sha256": sha256_file(whl),
                "component": f"fi-{ver}",
                "needed_by": "FLASHINFER attention backend",
            }
        )

    if with_plugin:
        whl = build_plugin_wheel(REPO, out / "plugin-wheel")
        root = st.root / "plugin"
        root.mkdir()
        install_wheel(whl, root)
        eps = list((root).glob("nvfp4compat-*.dist-info/entry_points.txt"))
        if not eps or "vllm.general_plugins" not in eps[0].read_text():
            raise BuildError(
                f"{whl.name} declares no vllm.general_plugins entry point; check pyproject.toml"
            )
        st.plugin = {"wheel": whl.name, "sha256": sha256_file(whl), "built_from": str(REPO)}
        st.wheels.append(
            {
                "dist": "nvfp4compat",
                "version": whl.name.split("-")[1],
                "file": whl.name,
                "sha256": st.plugin["sha256"],
                "component": "plugin",
                "needed_by": "the plugin under test",
            }
        )
    return st


# --------------------------------------------------------------------------------------------
# packing


@dataclass
class Member:
    arcname: str  # "<component>/<path>"
    source: Path
    offset: int
    size: int
    mode: int
    sha256: str


@dataclass
class Unit:
    """Tar members compressed as one xz stream; parts are concatenations of units."""

    members: list[Member]
    component: str
    blob: Path | None = None
    xz_bytes: int = 0

    @property
    def raw_bytes(self) -> int:
        return sum(m.size for m in self.members)

    def key(self) -> str:
        h = hashlib.sha256(f"unit-v{FORMAT_VERSION}|xz{XZ_PRESET}|mtime{MTIME}\n".encode())
        for m in self.members:
            h.update(f"{m.arcname}\0{m.mode:o}\0{m.size}\0{m.sha256}\n".encode())
        return h.hexdigest()


def _tar_info(arcname: str, size: int, mode: int, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    """A member's header as every archive here writes it: dated ``MTIME``, uid / gid 0 without names."""
    info = tarfile.TarInfo(arcname)
    info.size = size
    info.mode = mode
    info.mtime = MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = kind
    return info


def _tar_header(arcname: str, size: int, mode: int) -> bytes:
    return _tar_info(arcname, size, mode).tobuf(format=tarfile.GNU_FORMAT, encoding="utf-8", errors="strict")


def _unit_tar_bytes(unit: Unit) -> bytes:
    buf = io.BytesIO()
    for m in unit.members:
        buf.write(_tar_header(m.arcname, m.size, m.mode))
        with m.source.open("rb") as f:
            f.seek(m.offset)
            data = f.read(m.size)
        if len(data) != m.size:
            raise BuildError(f"{m.source}: short read at {m.offset}+{m.size}")
        buf.write(data)
        pad = (-m.size) % 512
        if pad:
            buf.write(b"\0" * pad)
    return buf.getvalue()


def _compress_unit(unit: Unit, cache_dir: Path) -> Unit:
    path = cache_dir / f"{unit.key()}.xz"
    if not path.exists():
        data = lzma.compress(
            _unit_tar_bytes(unit), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=XZ_PRESET
        )
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    unit.blob = path
    unit.xz_bytes = path.stat().st_size
    return unit


def eof_blob() -> bytes:
    return lzma.compress(
        b"\0" * 1024, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=XZ_PRESET
    )


def make_units(
    stage_root: Path, components: Sequence[str]
) -> tuple[list[Unit], dict[str, dict[str, Any]]]:
    """Group every staged file into units; return the units and per-component tree records."""
    units: list[Unit] = []
    comp_info: dict[str, dict[str, Any]] = {}
    for comp in components:
        root = stage_root / comp
        files = _walk_files(root)
        tree = hashlib.sha256()
        group: list[Member] = []
        group_raw = 0
        raw_total = 0
        for rel in files:
            path = root / rel
            size = path.stat().st_size
            digest = sha256_file(path)
            tree.update(f"{rel}\0{digest}\n".encode())
            mode = 0o755 if os.access(path, os.X_OK) else 0o644
            member = Member(f"{comp}/{rel}", path, 0, size, mode, digest)
            raw_total += size
            if size >= GROUP_RAW_BYTES:
                units.append(Unit([member], comp))
                continue
            group.append(member)
            group_raw += size
            if group_raw >= GROUP_RAW_BYTES:
                units.append(Unit(group, comp))
                group, group_raw = [], 0
        if group:
            units.append(Unit(group, comp))
        top = sorted({f.split("/")[0] for f in files})
        comp_info[comp] = {
            "files": len(files),
            "raw_bytes": raw_total,
            "tree_sha256": tree.hexdigest(),
            "top_level": top,
        }
    return units, comp_info


def _split_unit(unit: Unit, chunks: int) -> list[Unit]:
    (m,) = unit.members
    step = math.ceil(m.size / chunks)
    out = []
    for i in range(chunks):
        off = i * step
        size = min(step, m.size - off)
        with m.source.open("rb") as f:
            f.seek(off)
            digest = sha256_bytes(f.read(size))
        name = f"{m.arcname}.chunk{i:03d}of{chunks:03d}"
        out.append(Unit([Member(name, m.source, off, size, 0o644, digest)], unit.component))
    return out


def compress_all(units: list[Unit], cache_dir: Path, jobs: int) -> None:
    todo = [u for u in units if not (cache_dir / f"{u.key()}.xz").exists()]
    if todo:
        log(
            f"compressing {len(todo)} of {len(units)} units ({sum(u.raw_bytes for u in todo) / MIB:.0f} MiB raw, xz preset {XZ_PRESET}, {jobs} threads)"
        )
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        list(
            pool.map(
                lambda u: _compress_unit(u, cache_dir), sorted(units, key=lambda u: -u.raw_bytes)
            )
        )


def plan_parts(
    units: list[Unit], budget: int, cache_dir: Path, jobs: int
) -> tuple[list[list[Unit]], list[dict[str, Any]]]:
    """Split units too big for one part into raw chunks, then first-fit-decreasing into parts."""
    chunked: list[dict[str, Any]] = []
    final: list[Unit] = []
    for unit in units:
        if unit.xz_bytes <= budget:
            final.append(unit)
            continue
        if len(unit.members) != 1:
            raise BuildError(
                f"a group unit of {len(unit.members)} files compresses to {unit.xz_bytes} bytes > part budget {budget}; lower GROUP_RAW_BYTES"
            )
        n = math.ceil(unit.xz_bytes / (budget * 0.9))
        while True:
            pieces = _split_unit(unit, n)
            compress_all(pieces, cache_dir, jobs)
            if all(p.xz_bytes <= budget for p in pieces):
                break
            n += 1
        m = unit.members[0]
        chunked.append(
            {
                "path": m.arcname,
                "bytes": m.size,
                "sha256": m.sha256,
                "chunks": [p.members[0].arcname for p in pieces],
            }
        )
        final.extend(pieces)

    def ffd(items: list[Unit]) -> list[list[Unit]]:
        bins: list[list[Unit]] = []
        fill: list[int] = []
        for u in sorted(items, key=lambda u: (-u.xz_bytes, u.members[0].arcname)):
            for i, used in enumerate(fill):
                if used + u.xz_bytes <= budget:
                    bins[i].append(u)
                    fill[i] += u.xz_bytes
                    break
            else:
                bins.append([u])
                fill.append(u.xz_bytes)
        return bins

    stable = ffd([u for u in final if u.component not in VOLATILE])
    volatile = ffd([u for u in final if u.component in VOLATILE])
    order = {c: i for i, c in enumerate(COMPONENTS_ORDER)}
    parts = [
        sorted(b, key=lambda u: (order.get(u.component, 99), u.members[0].arcname))
        for b in stable + volatile
    ]
    return parts, chunked


def write_parts(out: Path, parts: list[list[Unit]], eof: bytes) -> list[dict[str, Any]]:
    for old in out.glob("p[0-9][0-9]"):
        shutil.rmtree(old)
    records = []
    for i, units in enumerate(parts, start=1):
        name = f"part-{i:02d}"
        folder = out / f"p{i:02d}"
        folder.mkdir()
        path = folder / f"{name}.tar.xz"
        h = hashlib.sha256()
        with path.open("wb") as f:
            for u in units:
                assert u.blob is not None
                data = u.blob.read_bytes()
                f.write(data)
                h.update(data)
            f.write(eof)
            h.update(eof)
        comps: dict[str, dict[str, int]] = {}
        big = []
        for u in units:
            c = comps.setdefault(u.component, {"files": 0, "raw_bytes": 0})
            c["files"] += len(u.members)
            c["raw_bytes"] += u.raw_bytes
            big += [m.arcname for m in u.members if m.size >= GROUP_RAW_BYTES]
        records.append(
            {
                "name": name,
                "folder": folder.name,
                "file": path.name,
                "bytes": path.stat().st_size,
                "sha256": h.hexdigest(),
                "members": sum(len(u.members) for u in units),
                "raw_bytes": sum(u.raw_bytes for u in units),
                "components": comps,
                "large_members": big,
                "first": units[0].members[0].arcname,
                "last": units[-1].members[-1].arcname,
            }
        )
    return records


# --------------------------------------------------------------------------------------------
# transfers to the host


def working_tree_bytes(repo: Path) -> int:
    """Bytes of what every transfer sends anyway: tracked + untracked-not-ignored files."""
    proc = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
    )
    if proc.returncode != 0:
        raise BuildError(f"git ls-files failed in {repo}: {proc.stderr.decode()[-500:]}")
    total = 0
    for rel in proc.stdout.decode().split("\0"):
        p = repo / rel
        if rel and p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    shared = repo / "shared"
    if shared.is_dir():
        total += sum(p.stat().st_size for p in shared.rglob("*") if p.is_file())
    return total


def auto_part_mib(tree_bytes: int) -> int:
    """The largest part (whole MiB) that fits one transfer beside the working tree, with 2 MiB spare."""
    room = DEVICE_CALL_LIMIT - tree_bytes - 2 * MIB
    if room < 8 * MIB:
        raise BuildError(
            f"the working tree is {tree_bytes / MIB:.1f} MiB: a {DEVICE_CALL_LIMIT // MIB} MiB transfer has room for only "
            f"{room / MIB:.1f} MiB of bundle beside it; move large untracked files out of the checkout or "
            "into an ignored folder"
        )
    return int(room // MIB)


def call_plan(
    manifest: dict[str, Any], tree_bytes: int, bundle_rel: str = ".bundle"
) -> list[dict[str, Any]]:
    """Group part folders into transfers that fit ``DEVICE_CALL_LIMIT`` together with the working tree."""
    room = DEVICE_CALL_LIMIT - tree_bytes - MIB
    calls: list[dict[str, Any]] = []
    cur: list[dict[str, Any]] = []
    used = 0
    for part in manifest["parts"]:
        size = int(part["bytes"]) + 64 * 1024  # + manifest copy
        if size > room:
            raise BuildError(
                f"{part['name']} is {size / MIB:.1f} MiB but a transfer has room for {room / MIB:.1f} MiB beside the "
                f"{tree_bytes / MIB:.1f} MiB working tree; rebuild with --max-part-mib {max(1, int(room / MIB) - 1)}"
            )
        if cur and used + size > room:
            calls.append({"parts": cur, "bytes": used})
            cur, used = [], 0
        cur.append(part)
        used += size
    if cur:
        calls.append({"parts": cur, "bytes": used})
    return calls


def render_plan(manifest: dict[str, Any], tree_bytes: int) -> str:
    calls = call_plan(manifest, tree_bytes)
    limit = DEVICE_CALL_LIMIT / MIB
    lines = [
        f"working tree: {tree_bytes / MIB:.2f} MiB; transfers of at most {limit:.0f} MiB with it carry the parts:",
    ]
    runner = "python3 tools/gpu_bundle/run_on_device.py"
    for i, call in enumerate(calls, start=1):
        carry = [f".bundle/{p['folder']}" for p in call["parts"]]
        lines.append(f"transfer {i}: {json.dumps(carry)} ({int(call['bytes']) / MIB:.1f} MiB of parts)")
    lines.append(
        f"on the host, after each transfer: `{runner} unpack --partial-ok` (parts already unpacked are "
        f"skipped); once all are in: `{runner} run --checks plan,negative,capacity,fidelity,throughput --out OUT`"
    )
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# commands


def cmd_build(args: argparse.Namespace) -> int:
    out: Path = args.out
    cache: Path = args.wheel_cache
    out.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    unit_cache = args.unit_cache
    unit_cache.mkdir(parents=True, exist_ok=True)
    tree_bytes = working_tree_bytes(REPO)
    if args.max_part_mib is None:
        args.max_part_mib = auto_part_mib(tree_bytes)
        log(f"parts of at most {args.max_part_mib} MiB ({DEVICE_CALL_LIMIT // MIB} MiB a transfer less the working tree and 2 MiB)")
    budget = int(args.max_part_mib * MIB) - 4096
    st = stage(out, cache, args.offline, args.flashinfer, not args.no_plugin)
    components = [c for c in COMPONENTS_ORDER if (st.root / c).is_dir()]
    units, comp_info = make_units(st.root, components)
    compress_all(units, unit_cache, args.jobs)
    eof = eof_blob()
    parts, chunked = plan_parts(units, budget - len(eof), unit_cache, args.jobs)
    records = write_parts(out, parts, eof)
    for rec in records:
        if int(rec["bytes"]) > args.max_part_mib * MIB:
            raise BuildError(f"{rec['name']} is {rec['bytes']} bytes > {args.max_part_mib} MiB")
    part_of = {
        m: r["name"]
        for r, us in zip(records, parts, strict=True)
        for u in us
        for m in (x.arcname for x in u.members)
    }
    for c in chunked:
        c["chunks"] = [{"arcname": a, "part": part_of[a]} for a in c["chunks"]]
    manifest: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "bundle": "nvfp4compat offline bundle",
        "built_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "build_id": sha256_bytes("".join(str(r["sha256"]) for r in records).encode())[:16],
        "max_part_bytes": int(args.max_part_mib * MIB),
        "xz_preset": XZ_PRESET,
        "site_layout": {
            "common": f"vLLM {VLLM_VERSION} (pruned) + the packages the host lacks",
            **{f"fi-{v}": f"flashinfer-python {v}" for v in args.flashinfer},
            "plugin": "nvfp4compat (wheel built from the checkout)",
        },
        "flashinfer_default": FLASHINFER_DEFAULT,
        "vllm_version": VLLM_VERSION,
        "components": comp_info,
        "parts": records,
        "chunked": chunked,
        "vllm": st.vllm,
        "flashinfer_pruned": st.flashinfer_pruned,
        "plugin": st.plugin,
        "wheels": st.wheels,
    }
    text = json.dumps(manifest, indent=1, sort_keys=False)
    (out / "manifest.json").write_text(text)
    for rec in records:
        (out / str(rec["folder"]) / "manifest.json").write_text(text)
    shutil.rmtree(st.root)
    total = sum(int(r["bytes"]) for r in records)
    log(f"{len(records)} parts, {total / MIB:.1f} MiB in all, build {manifest['build_id']}:")
    for r in records:
        comps = ", ".join(f"{c} {v['files']} files" for c, v in r["components"].items())
        log(
            f"  {r['folder']}/{r['file']}: {int(r['bytes']) / MIB:.2f} MiB  sha256 {str(r['sha256'])[:16]}  [{comps}]"
        )
    log(
        "kept vLLM extensions: "
        + ", ".join(f"{k['path']} ({int(k['bytes']) / MIB:.1f} MiB)" for k in st.vllm["kept_so"])
    )
    print(render_plan(manifest, tree_bytes))
    return 0


def load_manifest(out: Path) -> dict[str, Any]:
    path = out / "manifest.json"
    if not path.exists():
        raise BuildError(f"{path} is missing: run `python tools/gpu_bundle/build.py build` first")
    return json.loads(path.read_text())


def cmd_plan(args: argparse.Namespace) -> int:
    manifest = load_manifest(args.out)
    print(render_plan(manifest, working_tree_bytes(REPO)))
    return 0


def _run(
    cmd: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, env=env, cwd=cwd)


PROBE_MODULES = (
    "vllm",
    "vllm.engine.arg_utils",
    "vllm.v1.engine.core",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.model_executor.models.qwen3",
    "vllm.v1.attention.backends.flashinfer",
    "vllm.entrypoints.llm",
)
RUNTIME_MODULES = (
    "vllm.v1.engine.core_client",
    "vllm.v1.engine.llm_engine",
    "vllm.v1.executor.multiproc_executor",
    "vllm.v1.executor.uniproc_executor",
    "vllm.compilation.backends",
    "vllm.compilation.cuda_graph",
    "vllm.compilation.piecewise_backend",
    "vllm.v1.worker.worker_base",
    "vllm.v1.sample.sampler",
    "vllm.v1.core.sched.scheduler",
    "vllm.model_executor.model_loader.default_loader",
    "vllm.v1.engine.detokenizer",
    "vllm.v1.engine.output_processor",
    "vllm.v1.metrics.loggers",
    "vllm.usage.usage_lib",
    "vllm.tokenizers.hf",
    "vllm.v1.attention.selector",
    "vllm.distributed.parallel_state",
    "vllm.v1.structured_output.backend_xgrammar",
    "vllm.v1.attention.backends.registry",
    "vllm.plugins",
    "vllm.v1.engine.input_processor",
    "vllm.renderers",
    "vllm.distributed.device_communicators.pynccl",
    "vllm.compilation.decorators",
    "vllm.model_executor.models.llama",
    "vllm.v1.worker.gpu_input_batch",
)


def _probe(
    python: Path,
    pythonpath: Sequence[Path],
    modules: Sequence[str],
    blocked: Sequence[str] = (),
    cuda: bool = False,
    stand_in: Sequence[str] = (),
    engine_config: Path | None = None,
) -> dict[str, Any]:
    """Run ``cpu_probe.py`` in ``python`` with ``pythonpath``; return its result dict."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    env["HF_HUB_OFFLINE"] = "1"
    env["VLLM_PLUGINS"] = ""
    env.pop("VIRTUAL_ENV", None)
    cmd = [str(python), str(HERE / "cpu_probe.py"), ",".join(modules)]
    if blocked:
        cmd += ["--block", ",".join(blocked)]
    if cuda:
        cmd += [
            "--cuda",
            "--stand-in",
            ",".join(stand_in),
            "--namespaces",
            ",".join(KEPT_OP_NAMESPACES),
        ]
    if engine_config:
        cmd += ["--engine-config", str(engine_config)]
    proc = _run(cmd, env=env, cwd=Path(tempfile.gettempdir()))
    for line in proc.stdout.splitlines():
        if line.startswith("PROBE "):
            return json.loads(line[6:])
    raise BuildError(
        f"cpu_probe.py crashed (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    )


def so_module(path: str) -> str:
    """``vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so`` -> ``vllm.vllm_flash_attn._vllm_fa3_C``."""
    return path.split(".")[0].replace("/", ".")


def _top_modules(site: Path, dist_info_glob: str) -> list[str]:
    """Top-level import names a dist installs (from its RECORD or top_level.txt)."""
    infos = list(site.glob(dist_info_glob))
    if not infos:
        return []
    top = infos[0] / "top_level.txt"
    if top.exists():
        return [t for t in top.read_text().split() if t]
    names = set()
    record = infos[0] / "RECORD"
    for line in record.read_text().splitlines():
        path = line.split(",")[0]
        first = path.split("/")[0]
        if first.endswith(".dist-info") or first.endswith(".data"):
            continue
        name = first[:-3] if first.endswith(".py") else first.split(".")[0]
        if name and not name.endswith(".libs"):
            names.add(name)
    return sorted(names)


def cmd_verify(args: argparse.Namespace) -> int:
    out: Path = args.out
    manifest = load_manifest(out)
    ok = True

    def check(cond: bool, what: str) -> None:
        nonlocal ok
        print(("PASS " if cond else "FAIL ") + what, flush=True)
        ok = ok and cond

    limit = int(manifest["max_part_bytes"])
    for part in manifest["parts"]:
        path = out / part["folder"] / part["file"]
        check(
            path.exists() and path.stat().st_size == part["bytes"],
            f"{part['name']}: {path} exists, {part['bytes']} bytes",
        )
        check(
            int(part["bytes"]) <= limit and int(part["bytes"]) <= 60 * MIB,
            f"{part['name']}: {int(part['bytes']) / MIB:.2f} MiB <= {limit / MIB:.0f} MiB",
        )
        check(sha256_file(path) == part["sha256"], f"{part['name']}: sha256 matches the manifest")
        check(
            (out / part["folder"] / "manifest.json").read_text()
            == (out / "manifest.json").read_text(),
            f"{part['name']}: manifest copy beside it",
        )
    so = [k["path"] for k in manifest["vllm"]["kept_so"]]
    check("vllm/_C_stable_libtorch.abi3.so" in so, f"vLLM's compiled ops kept: {so}")

    runner = HERE / "run_on_device.py"
    with tempfile.TemporaryDirectory(prefix="bundle-verify-") as tmp_s:
        tmp = Path(tmp_s)
        site = tmp / "site"
        # 1) unpack in two steps, as separate transfers would: all parts but the last, then the last.
        parts = manifest["parts"]
        staged = tmp / "bundle"
        staged.mkdir()
        for part in parts[:-1]:
            shutil.copytree(out / part["folder"], staged / part["folder"])
        r1 = _run(
            [
                sys.executable,
                str(runner),
                "unpack",
                "--bundle-dir",
                str(staged),
                "--site",
                str(site),
            ]
        )
        print(r1.stdout[-1500:], r1.stderr[-1500:])
        check(
            len(parts) == 1 or (r1.returncode == 3 and "missing" in r1.stdout),
            "runner: partial unpack reports the missing part (rc 3)",
        )
        shutil.rmtree(staged)
        staged.mkdir()
        shutil.copytree(out / parts[-1]["folder"], staged / parts[-1]["folder"])
        r2 = _run(
            [
                sys.executable,
                str(runner),
                "unpack",
                "--bundle-dir",
                str(staged),
                "--site",
                str(site),
            ]
        )
        print(r2.stdout[-2500:], r2.stderr[-1500:])
        check(
            r2.returncode == 0 and "complete" in r2.stdout,
            "runner: second call completes the bundle (chunks joined, tree hashes match)",
        )
        r3 = _run(
            [sys.executable, str(runner), "unpack", "--bundle-dir", str(out), "--site", str(site)]
        )
        check(
            r3.returncode == 0 and "already unpacked" in r3.stdout,
            "runner: re-running unpack with every part skips them (sha unchanged)",
        )
        r4 = _run(
            [
                sys.executable,
                str(runner),
                "run",
                "--checks",
                "1,9",
                "--dry-run",
                "--site",
                str(site),
                "--bundle-dir",
                str(out),
            ]
        )
        check(
            r4.returncode == 2 and "unknown check" in (r4.stdout + r4.stderr),
            "runner: an unknown check is refused with the list of known ones",
        )
        r5 = _run(
            [
                sys.executable,
                str(runner),
                "run",
                "--checks",
                "1,2,3,4,5,6,writer,preflight",
                "--dry-run",
                "--site",
                str(site),
                "--bundle-dir",
                str(out),
                "--out",
                str(tmp / "out"),
            ]
        )
        print(r5.stdout[-4000:], r5.stderr[-2000:])
        check(
            r5.returncode == 0 and "job" in r5.stdout,
            "runner: --dry-run plans every check's engine jobs",
        )
        for c in manifest["chunked"]:
            p = site / c["path"]
            check(
                p.exists() and sha256_file(p) == c["sha256"], f"chunked file rejoined: {c['path']}"
            )
        # 2) pure-python import of vllm.version from the unpacked tree
        common = site / "common"
        py312 = args.py312
        for py in [p for p in (py312,) if p and Path(p).exists()]:
            env = dict(os.environ, PYTHONPATH=str(common))
            # vllm/__init__.py imports torch (absent here): load vllm.version under a bare package object.
            code = (
                "import importlib.util, importlib.metadata as md, json, sys, types\n"
                "spec = importlib.util.find_spec('vllm'); pkg = types.ModuleType('vllm'); pkg.__path__ = list(spec.submodule_search_locations)\n"
                "sys.modules['vllm'] = pkg\nimport vllm.version as v\n"
                "print(json.dumps([v.__version__, v.__file__, md.version('vllm')]))"
            )
            pr = _run([py, "-c", code], env=env, cwd=tmp)
            check(
                pr.returncode == 0
                and pr.stdout.count('"0.26.0"') == 2
                and str(common) in pr.stdout,
                f"{py}: vllm.version (pure Python) from the unpacked tree: {pr.stdout.strip() or pr.stderr[-300:]}",
            )
            binaries = [
                "pydantic_core._pydantic_core",
                "zmq",
                "msgspec._core",
                "pybase64._pybase64",
                "llguidance._lib",
                "openai_harmony",
                "tvm_ffi",
                "cbor2",
                "pydantic",
                "fastapi",
                "openai",
                "starlette",
                "cachetools",
                "partial_json_parser",
            ]
            pr = _run(
                [
                    py,
                    "-c",
                    "import importlib,sys\nfor m in sys.argv[1].split(','):\n    mod=importlib.import_module(m); print('IMPORTED', m, getattr(mod,'__file__',''))",
                    ",".join(binaries),
                ],
                env=env,
                cwd=tmp,
            )
            check(
                pr.returncode == 0
                and pr.stdout.count("IMPORTED") == len(binaries)
                and str(common) in pr.stdout,
                f"{py}: the cp312 packages import from the bundle ({len(binaries)} modules)"
                + ("" if pr.returncode == 0 else ": " + pr.stderr[-600:]),
            )
            # xgrammar's package imports torch; its compiled binding loads through tvm_ffi alone.
            pr = _run(
                [
                    py,
                    "-c",
                    "import sys, tvm_ffi; print('LOADED', tvm_ffi.load_module(sys.argv[1]))",
                    str(common / "xgrammar" / "libxgrammar_bindings.so"),
                ],
                env=env,
                cwd=tmp,
            )
            check(
                pr.returncode == 0 and "LOADED" in pr.stdout,
                f"{py}: xgrammar's binding loads through the bundle's tvm_ffi"
                + ("" if pr.returncode == 0 else ": " + pr.stderr[-400:]),
            )
        if not (py312 and Path(py312).exists()):
            print("SKIP no Python 3.12 interpreter (--py312): cp312 binaries not import-checked")
        # 3) the 8 + runtime modules, with the pruned tree, in the venv that mimics the host
        venv_py = args.check_venv / "bin" / "python"
        if not venv_py.exists():
            print(f"SKIP {venv_py} missing: run `build.py check-venv` for the import checks")
        else:
            overlay = tmp / "overlay"
            overlay.mkdir()
            for name in ("vllm", f"vllm-{VLLM_VERSION}.dist-info"):
                os.symlink(common / name, overlay / name)
            fis = sorted(p.name for p in site.glob("fi-*"))
            check(bool(fis), f"FlashInfer sites unpacked: {fis}")
            for fi in fis:
                res = _probe(venv_py, [overlay, site / fi], PROBE_MODULES + RUNTIME_MODULES)
                bad = {k: v for k, v in res.items() if not k.startswith("_") and v != "ok"}
                check(
                    not bad,
                    f"{fi}: {len(PROBE_MODULES) + len(RUNTIME_MODULES)} vLLM modules import from the pruned tree (cp311 twins of the shipped deps): {bad or 'all ok'}",
                )
                check(
                    res["_vllm_file"].startswith(str(overlay))
                    and res["_vllm_version"] == VLLM_VERSION,
                    f"{fi}: vllm resolves to the bundle ({res['_vllm_file']}, {res['_vllm_version']})",
                )
                check(
                    str(site / fi) in res["_flashinfer"] and fi[3:] in res["_flashinfer"],
                    f"{fi}: flashinfer resolves to the bundle ({res['_flashinfer']})",
                )
            # The CUDA platform's import path (CUDA-gated imports of pruned pieces), the engine config
            # of the tiny model for every KV dtype and cudagraph mode, and vLLM's tokenizer path.
            stand_in = [so_module(k) for k in so]
            model = tmp / "tiny-qwen3"
            mk = _run(
                [
                    str(venv_py),
                    str(REPO / "scripts" / "make_tiny_model.py"),
                    "--out",
                    str(model),
                    "--check",
                ],
                cwd=tmp,
            )
            check(
                mk.returncode == 0,
                "make_tiny_model.py --check (transformers loads it offline, finite logits): "
                + (mk.stdout.strip().splitlines() or [""])[-1][:300]
                + mk.stderr[-500:] * (mk.returncode != 0),
            )
            fi0 = site / f"fi-{FLASHINFER_DEFAULT}"
            res = _probe(
                venv_py,
                [overlay, fi0],
                PROBE_MODULES
                + RUNTIME_MODULES
                + (
                    "vllm.model_executor.model_loader",
                    "vllm.distributed.device_communicators.custom_all_reduce",
                ),
                cuda=True,
                stand_in=stand_in,
                engine_config=model if mk.returncode == 0 else None,
            )
            bad = {k: v for k, v in res.items() if not k.startswith("_") and v != "ok"}
            check(
                not bad,
                f"CUDA platform (SM90) import path, stand-ins only for the kept {stand_in}: "
                + (json.dumps(bad)[:1500] if bad else "all ok"),
            )
            for key, val in res.get("_engine_config", {}).items():
                check(str(val).startswith("ok"), f"engine config / tokenizer {key}: {val}")
            plugin = site / "plugin"
            if plugin.is_dir():
                env = dict(
                    os.environ,
                    PYTHONPATH=os.pathsep.join(
                        [str(plugin), str(overlay), str(site / f"fi-{FLASHINFER_DEFAULT}")]
                    ),
                )
                code = (
                    "import importlib.metadata as md\n"
                    "eps=[e for e in md.entry_points(group='vllm.general_plugins') if e.name=='nvfp4compat']\n"
                    "print('EP', [e.value for e in eps]); import nvfp4compat, nvfp4compat.vllm_plugin as p; print('PLUGIN', nvfp4compat.__file__, hasattr(p, 'register'))"
                )
                pr = _run([str(venv_py), "-c", code], env=env, cwd=tmp)
                check(
                    "EP ['nvfp4compat.vllm_plugin:register']" in pr.stdout,
                    f"plugin: entry point discoverable from the unpacked wheel: {pr.stdout.strip()[:300]}",
                )
                if "PLUGIN" not in pr.stdout:
                    print(
                        "WARN plugin module does not import yet (written concurrently): "
                        + pr.stderr.strip()[-400:]
                    )
            if args.leave_one_out:
                site_pkgs = next((args.check_venv / "lib").glob("python3.*/site-packages"))
                for dep in DEPS:
                    tops = _top_modules(
                        site_pkgs, f"{_norm(dep.dist)}-*.dist-info"
                    ) or _top_modules(site_pkgs, f"{dep.dist.replace('-', '_')}-*.dist-info")
                    if not tops:
                        print(f"SKIP leave-one-out {dep.dist}: not installed in {args.check_venv}")
                        continue
                    res = _probe(
                        venv_py,
                        [overlay, site / f"fi-{FLASHINFER_DEFAULT}"],
                        PROBE_MODULES,
                        blocked=tops,
                    )
                    failed = {k: v for k, v in res.items() if not k.startswith("_") and v != "ok"}
                    first = next(iter(failed.items()), None)
                    check(
                        bool(failed),
                        f"leave-one-out {dep.dist} (blocks {tops}): "
                        + (
                            f"{first[0]} fails: {first[1][:120]}"
                            if first
                            else "NOTHING FAILS: not needed"
                        ),
                    )
    print("verify: " + ("all checks passed" if ok else "FAILURES above"))
    return 0 if ok else 1


def cmd_check_venv(args: argparse.Namespace) -> int:
    """Create the Python 3.11 venv that mimics the host (plus the bundle's deps as cp311 twins) and
    a Python 3.12 venv with the few host packages the cp312 binaries' wrappers import."""
    venv: Path = args.check_venv
    if venv.exists() and not args.recreate:
        log(f"{venv} exists (use --recreate to rebuild it)")
    else:
        if venv.exists():
            shutil.rmtree(venv)
        py = shutil.which("python3.11") or sys.executable
        pip = [
            str(venv / "bin/python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
        ]
        steps = [
            [py, "-m", "venv", str(venv)],
            [*pip, "torch==2.13.0"],
            [*pip, "--no-deps", *HOST_PACKAGES_PINNED, *HOST_PACKAGES_UNPINNED],
            [
                *pip,
                "--no-deps",
                *(f"{d.dist}=={d.version}" for d in DEPS),
                f"flashinfer-python=={FLASHINFER_DEFAULT}",
            ],
        ]
        for cmd in steps:
            log(" ".join(cmd[:8]) + (" ..." if len(cmd) > 8 else ""))
            proc = _run(cmd)
            if proc.returncode != 0:
                raise BuildError(
                    f"{' '.join(cmd[:8])} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
                )
        log(
            f"{venv} ready: torch 2.13.0+cpu, {len(HOST_PACKAGES_PINNED) + len(HOST_PACKAGES_UNPINNED)} host packages, {len(DEPS)} bundle deps (cp311 twins)"
        )
    py312 = next(iter(_pyenv_py312()), None) or shutil.which("python3.12")
    if not py312:
        log("no Python 3.12 here: verify will not import the cp312 binaries")
    elif PY312_VENV.exists() and not args.recreate:
        log(f"{PY312_VENV} exists")
    else:
        for cmd in (
            [str(py312), "-m", "venv", "--clear", str(PY312_VENV)],
            [
                str(PY312_VENV / "bin/python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "--no-deps",
                *PY312_HOST_PACKAGES,
            ],
        ):
            proc = _run(cmd)
            if proc.returncode != 0:
                raise BuildError(f"{' '.join(cmd[:6])} failed:\n{proc.stderr[-2000:]}")
        log(f"{PY312_VENV} ready (Python 3.12 for the cp312 binaries)")
    return 0


PY312_VENV = REPO / ".bundle" / "venvs" / "bundle-check-py312"  # main() puts it beside --check-venv
# host packages the cp312 binaries' Python wrappers import (pydantic_core -> typing_extensions, ...)
PY312_HOST_PACKAGES = (
    "typing_extensions",
    "numpy",
    "anyio",
    "httpx",
    "httpcore",
    "h11",
    "idna",
    "certifi",
    "tqdm",
    "annotated-doc",
)


def _pyenv_py312() -> list[Path]:
    """CPython 3.12 interpreters pyenv installed ($PYENV_ROOT, else ~/.pyenv)."""
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    return sorted((root / "versions").glob("3.12*/bin/python3.12"))


def _find_py312() -> str | None:
    if (PY312_VENV / "bin/python").exists():
        return str(PY312_VENV / "bin/python")
    for cand in _pyenv_py312() + [
        Path(p) for p in (shutil.which("python3.12"),) if p
    ]:
        if (
            _run([str(cand), "-c", "import sys; assert sys.version_info[:2] == (3, 12)"]).returncode
            == 0
        ):
            return str(cand)
    return None


# --------------------------------------------------------------------------------------------
# kit: what scripts/gpu/suite.sh expects in .gpu/


# The packages the GPU tier imports that the host image lacks: nvfp4compat's own requirements (pydantic and
# what pydantic 2.14 imports) and FlashInfer's one import-time dependency the host lacks. Versions: DEPS's.
# FlashInfer's other Requires-Dist the host lacks (cuda-python, cuda-tile, nccl4py, nccl-extensions,
# nvidia-cudnn-frontend, nvidia-cutlass-dsl) are imported lazily, by modules the KV-cache paths never load:
# `import flashinfer` needs only apache-tvm-ffi, packaging, requests, nvidia-ml-py, tqdm and numpy
# (matrix/flashinfer.yaml, cpu_import.requirements, verified per release), and runs H-S ran without them.
KIT_DEPS = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "apache-tvm-ffi")
KIT_FLASHINFER = ("0.7.2.post1",)  # suite.sh's golden / codec stages also name 0.6.15 and 0.7.4
KIT_MAX_MIB = 40.0  # a device call carries 64 MiB, the ~28 MB checkout included
KIT_MANIFEST = "kit.json"
KIT_FORMAT = 1  # bump when the tarball's recipe changes: every fi-*.tar.xz is then rebuilt


def kit_deps() -> list[Dep]:
    """KIT_DEPS with the versions DEPS pins."""
    by_name = {_norm(d.dist): d for d in DEPS}
    missing = [n for n in KIT_DEPS if _norm(n) not in by_name]
    if missing:
        raise BuildError(f"KIT_DEPS names {missing}, which DEPS does not pin; add them to DEPS with a version")
    return [by_name[_norm(n)] for n in KIT_DEPS]


def wheel_requires(whl: Path) -> list[str]:
    """The distribution names a wheel's METADATA requires outside any extra."""
    with zipfile.ZipFile(whl) as zf:
        meta = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA")), None)
        text = zf.read(meta).decode("utf-8", "replace") if meta else ""
    names = []
    for line in text.splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line[len("Requires-Dist:") :])
            if m and m.group(1) not in names:
                names.append(m.group(1))
    return names


def pack_tree_xz(root: Path, dest: Path) -> None:
    """Write every file and folder under ``root`` to ``dest`` (tar.xz) with paths relative to ``root``.

    Deterministic: members sorted, each dated ``MTIME`` (ninja then finds a restored JIT module current), uid /
    gid 0 without names, mode 0755 / 0644, GNU format, xz preset ``XZ_PRESET`` in one stream. Written next to
    ``dest`` and renamed, so a stopped run leaves no half-written archive under its name.
    """
    entries: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            entries.append((path.relative_to(root).as_posix(), path))
    entries.sort()
    tmp = dest.with_name(dest.name + ".tmp")
    with (
        lzma.open(tmp, "wb", format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=XZ_PRESET) as xz,
        tarfile.open(fileobj=xz, mode="w", format=tarfile.GNU_FORMAT) as tar,
    ):
        for arcname, path in entries:
            if path.is_symlink():
                raise BuildError(f"{path}: a symbolic link in a wheel's tree; the kit packs files only")
            if path.is_dir():
                tar.addfile(_tar_info(arcname, 0, 0o755, tarfile.DIRTYPE))
                continue
            info = _tar_info(arcname, path.stat().st_size, 0o755 if os.access(path, os.X_OK) else 0o644)
            with path.open("rb") as f:
                tar.addfile(info, f)
    tmp.replace(dest)


def _kit_flashinfer(
    out: Path, cache: Path, version: str, offline: bool, recorded: dict[str, Any] | None
) -> dict[str, Any]:
    """Build ``out/fi-<version>.tar.xz`` unless ``recorded`` says it is built from the same wheel and recipe."""
    whl = ensure_wheel(cache, "flashinfer-python", version, offline)
    wheel_sha = sha256_file(whl)
    dest = out / f"fi-{version}.tar.xz"
    prefixes = list(FLASHINFER_CSRC_PRUNE.get(version, ()))
    recipe = {"format": KIT_FORMAT, "mtime": MTIME, "xz_preset": XZ_PRESET, "prune_prefixes": prefixes}
    if (
        recorded
        and recorded.get("wheel_sha256") == wheel_sha
        and recorded.get("recipe") == recipe
        and dest.is_file()
        and sha256_file(dest) == recorded.get("sha256")
    ):
        log(f"{dest.name}: up to date (built from {whl.name}, sha256 {wheel_sha[:16]}), skipped")
        return recorded
    with tempfile.TemporaryDirectory(prefix=f"kit-fi-{version}-") as tmp:
        root = Path(tmp) / "tree"
        root.mkdir()
        log(f"installing {whl.name} ({whl.stat().st_size / MIB:.1f} MiB) into a temporary folder")
        installed, _skipped = install_wheel(whl, root)
        if not (root / "flashinfer" / "__init__.py").is_file():
            raise BuildError(
                f"{whl.name}: no flashinfer/__init__.py at the top of the installed tree; the wheel's layout "
                "changed, and suite.sh's use_fi puts the archive's top level on PYTHONPATH"
            )
        raw = sum((root / f).stat().st_size for f in installed)
        pruned = prune_flashinfer_csrc(root, version)
        if prefixes:
            log(
                f"flashinfer {version}: csrc pruned ({', '.join(prefixes)}*): {len(pruned['removed'])} entries, "
                f"{int(pruned['bytes']) / MIB:.1f} MiB of {raw / MIB:.1f} MiB; kept because a kept source includes "
                f"them: {sorted(pruned['kept_because_included']) or 'none'}"
            )
        else:
            log(
                f"flashinfer {version}: no FLASHINFER_CSRC_PRUNE rule, csrc left unpruned ({raw / MIB:.1f} MiB "
                "raw); write one (the prefixes no KV-cache path builds) if the archive is too big"
            )
        log(f"packing {dest.name} (xz -{XZ_PRESET}, every member dated {MTIME})")
        pack_tree_xz(root, dest)
    return {
        "version": version,
        "file": dest.name,
        "bytes": dest.stat().st_size,
        "sha256": sha256_file(dest),
        "wheel": whl.name,
        "wheel_sha256": wheel_sha,
        "raw_bytes": raw,
        "pruned_bytes": int(pruned["bytes"]),
        "pruned_entries": len(pruned["removed"]),
        "recipe": recipe,
        "top_level": sorted({f.split("/")[0] for f in installed}),
    }


def cmd_kit(args: argparse.Namespace) -> int:
    """Rebuild the folder scripts/gpu/suite.sh expects (``.gpu/``): ``fi-<version>.tar.xz`` per FlashInfer
    release and the cp312 wheels of ``KIT_DEPS``; ``kit.json`` records what each archive was built from."""
    out: Path = args.kit_out
    cache: Path = args.wheel_cache
    out.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    manifest_path = out / KIT_MANIFEST
    try:
        old = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    except ValueError:
        log(f"{manifest_path} is not JSON: every archive is rebuilt")
        old = {}
    old_fi = {str(r.get("version")): r for r in old.get("flashinfer", []) if isinstance(r, dict)}
    deps = kit_deps()
    kit_names = {_norm(d.dist) for d in deps}
    host = {_norm(re.split(r"[=<>!]", p)[0]) for p in HOST_PACKAGES_PINNED + HOST_PACKAGES_UNPINNED}
    host |= {"torch", "typing_extensions"}  # torch and what torch needs
    records: list[dict[str, Any]] = []
    for version in dict.fromkeys(args.flashinfer):
        rec = _kit_flashinfer(out, cache, version, args.offline, old_fi.get(version))
        lacking = [
            n for n in wheel_requires(cache / rec["wheel"]) if _norm(n) not in host | kit_names
        ]
        if lacking:
            log(
                f"flashinfer {version} requires, outside the host's packages and the kit: {', '.join(lacking)} "
                "(imported lazily, off the KV-cache paths; see KIT_DEPS)"
            )
        records.append(rec)
    # the releases of earlier runs still in OUT stay recorded: suite.sh picks one per stage
    for version, rec in old_fi.items():
        if version not in args.flashinfer and (out / str(rec.get("file"))).is_file():
            records.append(rec)
    wheels: list[dict[str, Any]] = []
    for dep in deps:
        whl = ensure_wheel(cache, dep.dist, dep.version, args.offline)
        for stale in sorted(out.glob("*.whl")):
            fields = stale.name.split("-")
            if _norm(fields[0]) == _norm(dep.dist) and stale.name != whl.name:
                log(f"removing {stale.name} (the kit pins {dep.dist} {dep.version}; pip --target takes one)")
                stale.unlink()
        target = out / whl.name
        digest = sha256_file(whl)
        if not (target.is_file() and sha256_file(target) == digest):
            shutil.copyfile(whl, target)
        wheels.append({"dist": dep.dist, "version": dep.version, "file": whl.name, "sha256": digest,
                       "bytes": target.stat().st_size, "needed_by": dep.needed_by})
    manifest: dict[str, Any] = {
        "format": KIT_FORMAT,
        "kit": "scripts/gpu/suite.sh's .gpu/ (tools/gpu_bundle/build.py kit)",
        "flashinfer": sorted(records, key=lambda r: str(r["version"])),
        "wheels": wheels,
    }
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    kit_files = [str(r["file"]) for r in manifest["flashinfer"]] + [w["file"] for w in wheels] + [KIT_MANIFEST]
    log(f"kit in {out}:")
    total = 0
    for name in kit_files:
        size = (out / name).stat().st_size
        total += size
        log(f"  {name:<72} {size / MIB:8.2f} MiB")
    others = sorted(
        p for p in out.rglob("*") if p.is_file() and p.relative_to(out).as_posix() not in kit_files
    )
    other_bytes = sum(p.stat().st_size for p in others)
    if others:
        log(
            f"  other files under {out} (carried with it): {len(others)}, {other_bytes / MIB:.2f} MiB: "
            + ", ".join(p.relative_to(out).as_posix() for p in others[:8])
            + (" ..." if len(others) > 8 else "")
        )
    carried = total + other_bytes
    log(f"  total {carried / MIB:.2f} MiB ({total / MIB:.2f} MiB of kit) of --max-mib {args.max_mib:g}")
    if carried > args.max_mib * MIB:
        biggest = max(manifest["flashinfer"], key=lambda r: int(r["bytes"]), default=None)
        raise BuildError(
            f"{out} holds {carried / MIB:.1f} MiB ({total / MIB:.1f} MiB of kit: "
            + ", ".join(f"{r['file']} {int(r['bytes']) / MIB:.1f} MiB" for r in manifest["flashinfer"])
            + f"; {other_bytes / MIB:.1f} MiB of other files), more than --max-mib {args.max_mib:g}: a device call "
            f"carries {DEVICE_CALL_LIMIT // MIB} MiB, the checkout included. The files are written; to carry them, "
            "build fewer FlashInfer releases at once (--flashinfer V; each stage of suite.sh needs one), remove "
            + (f"{biggest['file']} or " if biggest else "")
            + "the other files from the folder, or write a FLASHINFER_CSRC_PRUNE rule for an unpruned release"
        )
    return 0


def main(argv: Iterable[str] | None = None) -> int:
    global VLLM_VERSION, FLASHINFER_VERSIONS, FLASHINFER_DEFAULT, COMPONENTS_ORDER
    global DEVICE_CALL_LIMIT, PY312_VENV
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=REPO / ".bundle",
        help="bundle folder (default: <repo>/.bundle, git-ignored)",
    )
    ap.add_argument(
        "--transfer-mib",
        type=float,
        default=DEVICE_CALL_LIMIT / MIB,
        help="what one transfer to the host carries, the checkout included (default 64)",
    )
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nvfp4compat-bundle"
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="download, stage, prune, pack; print the transfers")
    b.add_argument("--vllm", default=VLLM_VERSION, help=f"vLLM release (default {VLLM_VERSION})")
    b.add_argument(
        "--flashinfer", nargs="+", default=list(FLASHINFER_VERSIONS),
        help=f"flashinfer-python releases, one site folder each (default {' '.join(FLASHINFER_VERSIONS)})",
    )
    b.add_argument(
        "--flashinfer-default", default=None,
        help=f"the release the host runner uses unless told otherwise (default: {FLASHINFER_DEFAULT} if listed, else the first)",
    )
    b.add_argument(
        "--wheel-cache", type=Path, default=cache_home / "wheels",
        help="downloaded wheels (default: $XDG_CACHE_HOME or ~/.cache, then nvfp4compat-bundle/wheels)",
    )
    b.add_argument(
        "--unit-cache", type=Path, default=None,
        help="compressed units, reused by later builds (default: WHEEL_CACHE/.bundle-units)",
    )
    b.add_argument(
        "--max-part-mib",
        type=float,
        default=None,
        help="largest part (default: what fits one transfer beside the working tree)",
    )
    b.add_argument("--offline", action="store_true", help="use only cached wheels")
    b.add_argument("--no-plugin", action="store_true", help="leave the nvfp4compat wheel out")
    b.add_argument("--jobs", type=int, default=max(1, os.cpu_count() or 1))
    sub.add_parser("plan", help="print the transfers for the bundle on disk")
    v = sub.add_parser("verify", help="check the parts, unpack them with the host runner, import-check")
    v.add_argument("--check-venv", type=Path, default=None, help="default: OUT/venvs/bundle-check")
    v.add_argument("--py312", default=None, help="a CPython 3.12 to import the cp312 binaries with")
    v.add_argument(
        "--leave-one-out",
        action="store_true",
        help="also prove each dep is needed (about 10 s each)",
    )
    k = sub.add_parser(
        "kit", help="rebuild .gpu/ for scripts/gpu/suite.sh: fi-<version>.tar.xz + the cp312 wheels it installs"
    )
    k.add_argument(
        "--out", dest="kit_out", metavar="DIR", type=Path, default=REPO / ".gpu",
        help="the kit's folder (default: <repo>/.gpu, git-ignored; carry it to the GPU machine)",
    )
    k.add_argument(
        "--flashinfer", nargs="+", default=list(KIT_FLASHINFER),
        help=f"flashinfer-python releases, one fi-<version>.tar.xz each (default {' '.join(KIT_FLASHINFER)}; "
        "suite.sh's golden and codec stages use 0.6.15 and 0.7.4)",
    )
    k.add_argument(
        "--wheel-cache", type=Path, default=cache_home / "wheels",
        help="downloaded wheels (default: the same cache as build)",
    )
    k.add_argument("--offline", action="store_true", help="use only cached wheels")
    k.add_argument(
        "--max-mib", type=float, default=KIT_MAX_MIB,
        help=f"fail when the folder holds more (default {KIT_MAX_MIB:g}: a device call carries "
        f"{DEVICE_CALL_LIMIT // MIB} MiB, the checkout included)",
    )
    c = sub.add_parser("check-venv", help="create the CPU venv that mimics the host's packages")
    c.add_argument("--check-venv", type=Path, default=None, help="default: OUT/venvs/bundle-check")
    c.add_argument("--recreate", action="store_true")
    args = ap.parse_args(list(argv) if argv is not None else None)
    DEVICE_CALL_LIMIT = int(args.transfer_mib * MIB)
    if args.cmd == "build":
        VLLM_VERSION, FLASHINFER_VERSIONS = args.vllm, tuple(args.flashinfer)
        if args.flashinfer_default is not None and args.flashinfer_default not in args.flashinfer:
            print(f"build.py: error: --flashinfer-default {args.flashinfer_default} is not among --flashinfer "
                  f"{' '.join(args.flashinfer)}", file=sys.stderr)
            return 2
        FLASHINFER_DEFAULT = args.flashinfer_default or (
            FLASHINFER_DEFAULT if FLASHINFER_DEFAULT in args.flashinfer else args.flashinfer[0]
        )
        COMPONENTS_ORDER = ("common", *(f"fi-{v}" for v in FLASHINFER_VERSIONS), "plugin")
        args.unit_cache = args.unit_cache or args.wheel_cache / ".bundle-units"
    elif (args.out / "manifest.json").exists():  # verify, plan, check-venv: the bundle's own releases
        manifest = json.loads((args.out / "manifest.json").read_text())
        VLLM_VERSION = manifest.get("vllm_version", VLLM_VERSION)
        FLASHINFER_DEFAULT = manifest.get("flashinfer_default", FLASHINFER_DEFAULT)
    if args.cmd in ("verify", "check-venv"):
        args.check_venv = args.check_venv or args.out / "venvs" / "bundle-check"
        PY312_VENV = args.check_venv.parent / (args.check_venv.name + "-py312")
        if args.cmd == "verify":
            args.py312 = args.py312 or _find_py312()
    try:
        return {
            "build": cmd_build,
            "plan": cmd_plan,
            "verify": cmd_verify,
            "check-venv": cmd_check_venv,
            "kit": cmd_kit,
        }[args.cmd](args)
    except BuildError as exc:
        print(f"build.py: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
