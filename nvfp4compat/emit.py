"""Write matrix entries from a release itself: ``nvfp4compat verify --emit [--wheel vllm-X.whl]``.

FlashInfer (:func:`emit_flashinfer`, from the installed, importable package) is described below;
vLLM (:func:`emit_vllm`, from the installed package or a downloaded wheel, read statically as
``verify`` reads it) probes its pins, nvfp4 dtypes, gate kind, writer, FlashInfer imports and error
lines, and carries the rest from the release before it, saying so in each carried evidence.

The facts come from the probes :mod:`nvfp4compat.verify` checks claims with (import, ``hasattr`` per
export module, ``inspect.signature``, ``is_compute_capability_supported``, FlashInfer's own
``_check_cubin_version``, ``jit/core.py``, ``fmhaRunner.cuh``, ``xqa.py``), so an entry written here
passes ``nvfp4compat verify`` by construction. What no probe can see is carried from the newest
release before it in the matrix, and says so in its evidence: the SM lists of the FA2 and XQA readers
(the probe sees only whether they take NVFP4 scales, and XQA's message) and the CPU import recipe
(``cpu_import``, checked by the nox session ``flashinfer(<version>)``).

The entry is printed as the delta the file stores (:func:`nvfp4compat.loader.expand_flashinfer`):
only the sections that differ from the previous release, ``{version}`` standing for the release.
Adding a FlashInfer release is then: install it the CPU-importable way, run ``nvfp4compat verify
--emit``, review, paste, commit.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import yaml

from nvfp4compat.flashinfer_probe import (
    home_module,
    import_guarded,
    probe_fa2_ragged,
    probe_fa3_ragged,
)
from nvfp4compat.loader import VERSION_PLACEHOLDER, _fill_version
from nvfp4compat.spec import EXPORT_MODULES, HELPERS, FlashInferRelease, Matrix
from nvfp4compat.verify import ARCH_UNIVERSE, _def_line, _fmt_params, _without_env
from nvfp4compat.versions import public_version

__all__ = ["EmitError", "emit_flashinfer", "emit_vllm", "flashinfer_delta", "render_delta", "render_vllm"]

V = VERSION_PLACEHOLDER
_CHECKED = "probed by `nvfp4compat verify --emit` (import, hasattr per module, inspect.signature)"
_FACT_KEYS = ("helpers", "nvfp4_4over6", "consumers", "scale_check", "version_check", "cpu_import", "fa3_ragged",
              "fa2_ragged")  # fmt: skip


class EmitError(RuntimeError):
    """The installed FlashInfer cannot be described (not installed, not importable, no earlier release)."""


def _previous(m: Matrix, version: str) -> FlashInferRelease:
    v = public_version(version)
    older = [r for r in m.flashinfer if r.parsed < v]
    if not older:
        raise EmitError(
            f"FlashInfer {version} is older than every release in matrix/flashinfer.yaml "
            f"({m.flashinfer[0].version}): nothing to carry the unprobed facts from"
        )
    return older[-1]


def _template(text: str, version: str) -> str:
    """``text`` with ``version`` written as ``{version}`` where it stands alone (a tag, a pin)."""
    return re.sub(r"(?<![\w.])" + re.escape(version) + r"(?![\w]|\.\d|\.post|\.dev)", V, text)


def _carried(node: dict[str, Any], previous: FlashInferRelease) -> dict[str, Any]:
    """A section of ``previous`` carried over: its facts and status, its evidence marked as carried."""
    out = dict(node)
    for key in [k for k in out if k.endswith("evidence")]:
        out[key] = f"not probed; as FlashInfer {previous.version}: " + _template(str(out[key]), previous.version)
    return out


def _helper(m: Matrix, name: str, modules: dict[str, Any], fi: Any) -> dict[str, Any]:
    exports = [mod for mod in EXPORT_MODULES if modules[mod] is not None and hasattr(modules[mod], name)]
    home_name = home_module(m, name)
    home_file = home_name.replace(".", "/") + ".py"
    if not exports:
        return {
            "present": False,
            "evidence": f"no {name} in {home_file} and no export [{V}]; {_CHECKED}",
            "status": "verified",
        }
    fn = getattr(modules.get(home_name), name, None) or getattr(fi, name)
    defined_at = _def_line(fn)
    entry: dict[str, Any] = {"present": True, "defined_at": defined_at, "exports": exports, "params": _fmt_params(fn)}
    probe = getattr(fn, "is_compute_capability_supported", None)
    if probe is not None:
        entry["compute_capability"] = [cc for cc in ARCH_UNIVERSE if probe(cc)]
        entry["capability_source"] = "decorator"
        entry["capability_evidence"] = (
            f"{defined_at} [{V}]: {name}.is_compute_capability_supported(cc) over {list(ARCH_UNIVERSE)} "
            "(@supported_compute_capability)"
        )
    elif home_name == "flashinfer.page":  # the page helpers are JIT-built: gated by the JIT's minimum SM
        core = Path(fi.__file__).parent / "jit" / "core.py"
        text = core.read_text(encoding="utf-8") if core.is_file() else ""
        found = re.search(r"FlashInfer requires GPUs with sm(\d+) or higher", text)
        if found is not None:
            line = text[: found.start()].count("\n") + 1
            entry["compute_capability"] = [int(found.group(1))]
            entry["capability_source"] = "jit_min_arch"
            entry["capability_evidence"] = (
                f"flashinfer/jit/core.py:{line} [{V}] check_cuda_arch: 'FlashInfer requires GPUs with "
                f"sm{found.group(1)} or higher' (a JIT module, no @supported_compute_capability)"
            )
    entry["evidence"] = f"{defined_at} [{V}]; exported from {', '.join(exports)}; {_CHECKED}"
    entry["status"] = "verified"
    return entry


def emit_flashinfer(m: Matrix) -> dict[str, Any]:
    """The full entry (with ``{version}`` placeholders) of the installed, importable FlashInfer.

    Raises
    ------
    EmitError
        When flashinfer-python is not installed or does not import, or no older release is in the matrix.
    """
    fi, err = import_guarded("flashinfer")
    if fi is None:
        raise EmitError(
            f"cannot import flashinfer ({err}); install it the CPU-importable way first "
            "(pip install --no-deps flashinfer-python==X plus the cpu_import requirements of the nearest release)"
        )
    version = str(getattr(fi, "__version__", ""))
    previous = _previous(m, version)
    modules = {name: import_guarded(name)[0] for name in EXPORT_MODULES}
    prev = previous.model_dump(mode="json", exclude_none=True)

    helpers = {h: _helper(m, h, modules, fi) for h in HELPERS}

    slot_name = m.implementations.flashinfer_helper("write") or ""
    slot = getattr(modules.get(home_module(m, slot_name)), slot_name, None)
    has_param = slot is not None and "nvfp4_4over6" in inspect.signature(inspect.unwrap(slot)).parameters
    cfg = [mod for mod in ("flashinfer", "flashinfer.quantization") if modules[mod] is not None and hasattr(modules[mod], "NVFP44Over6Config")]
    four = {
        "writer_param": has_param,
        "config_exports": cfg,
        "evidence": f"flashinfer/page.py [{V}]: nvfp4_4over6 "
        + ("is a parameter of the slot-mapping writer" if has_param else "is not a parameter of any slot-mapping writer")
        + (f"; NVFP44Over6Config exported from {', '.join(cfg)}" if cfg else "")
        + f"; {_CHECKED}",
        "status": "verified",
    }

    scale_helper = getattr(modules.get("flashinfer.page"), "_as_float32_scalar_tensors", None)
    if scale_helper is None:
        scale = {"mode": "n/a", "evidence": f"flashinfer/page.py [{V}] defines no _as_float32_scalar_tensors (no slot-mapping writer scale check)", "status": "read"}
    else:
        mode = "host_sync" if ".cpu()" in inspect.getsource(scale_helper) else "device_trap"
        scale = {
            "mode": mode,
            "evidence": f"{_def_line(scale_helper)} [{V}] _as_float32_scalar_tensors "
            + ("copies the scale to the host (.cpu())" if mode == "host_sync" else "checks the scale on the device (no .cpu())"),
            "status": "read",
        }

    version_check = _version_check(fi, previous)

    consumers: dict[str, Any] = {}
    for cls_name, consumer in (("BatchDecodeWithPagedKVCacheWrapper", "fa2_decode"), ("BatchPrefillWithPagedKVCacheWrapper", "fa2_prefill")):
        cls = getattr(fi, cls_name, None)
        if cls is not None and "kv_cache_sf" in inspect.signature(cls.run).parameters:
            consumers[consumer] = _carried(prev["consumers"][consumer], previous)
            consumers[consumer]["evidence"] = f"{cls_name}.run takes kv_cache_sf [{V}]; SMs " + consumers[consumer]["evidence"]
        else:
            consumers[consumer] = {"sms": [], "evidence": f"{cls_name}.run takes no kv_cache_sf [{V}]", "status": "verified"}
    xqa_path = Path(fi.__file__).parent / "xqa.py"
    xqa_text = xqa_path.read_text(encoding="utf-8") if xqa_path.is_file() else ""
    found = re.search(r"XQA NVFP4 KV is only supported on [^\"']+", xqa_text)
    if found is None:
        consumers["xqa_decode"] = {"sms": [], "evidence": f"flashinfer/xqa.py [{V}] has no NVFP4 KV assert", "status": "read"}
    else:
        line = xqa_text[: found.start()].count("\n") + 1
        consumers["xqa_decode"] = _carried(prev["consumers"]["xqa_decode"], previous)
        consumers["xqa_decode"]["message"] = found.group(0)
        consumers["xqa_decode"]["evidence"] = f"flashinfer/xqa.py:{line} [{V}] '{found.group(0)}'; SMs " + consumers["xqa_decode"]["evidence"]
    runner = Path(fi.__file__).parent / "data" / "include" / "flashinfer" / "trtllm" / "fmha" / "fmhaRunner.cuh"
    runner_text = runner.read_text(encoding="utf-8", errors="replace") if runner.is_file() else ""
    check = re.search(r"FLASHINFER_CHECK\(\s*mSM\s*==[^;]*", runner_text)
    sms = sorted(int(x) for x in re.findall(r"kSM_(\d+)", check.group(0))) if check else []
    consumers["trtllm_gen"] = {
        "sms": sms,
        "evidence": (
            f"flashinfer/data/include/flashinfer/trtllm/fmha/fmhaRunner.cuh:{runner_text[: check.start()].count(chr(10)) + 1} [{V}] FLASHINFER_CHECK(mSM == ...)"
            if check
            else f"flashinfer/data/include/flashinfer/trtllm/fmha/fmhaRunner.cuh [{V}] not shipped or without an SM check"
        ),
        "status": "read",
    }

    entry = {
        "version": version,
        "evidence": f"flashinfer_python-{V}-py3-none-any.whl from PyPI, imported on a CPU-only torch; entry written by "
        "`nvfp4compat verify --emit` (nvfp4compat/emit.py)",
        "helpers": helpers,
        "nvfp4_4over6": four,
        "consumers": consumers,
        "scale_check": scale,
        "version_check": version_check,
        "cpu_import": _carried(prev["cpu_import"], previous),
    }
    fa3 = _fa3_ragged(Path(fi.__file__).parent, prev, previous)
    if fa3 is not None:
        entry["fa3_ragged"] = fa3
    if probe_fa2_ragged(Path(fi.__file__).parent) and "fa2_ragged" in prev:
        # present per verify's probe; SMs, head dims and sinks as the release before
        entry["fa2_ragged"] = _carried(prev["fa2_ragged"], previous)
    return entry


def _fa3_ragged(pkg_dir: Path, prev: dict[str, Any], previous: FlashInferRelease) -> dict[str, Any] | None:
    """The FA3 ragged prefill (the dequant_fa3 prefill's attention), with verify's probe: present or
    not; its SMs, head dims and sinks are not probed and come from ``previous``."""
    if not probe_fa3_ragged(pkg_dir) or "fa3_ragged" not in prev:
        return None
    text = (pkg_dir / "prefill.py").read_text(encoding="utf-8")
    found = re.search(r"^class BatchPrefillWithRaggedKVCacheWrapper\b", text, re.M)
    where = f"flashinfer/prefill.py:{text[: found.start()].count(chr(10)) + 1}" if found else "flashinfer/prefill.py"
    out = _carried(prev["fa3_ragged"], previous)
    out["evidence"] = f"{where} [{V}] BatchPrefillWithRaggedKVCacheWrapper dispatches backend fa3; " + out["evidence"]
    return out


def _version_check(fi: Any, previous: FlashInferRelease) -> dict[str, Any]:
    env_mod, err = import_guarded("flashinfer.jit.env")
    if env_mod is None:
        raise EmitError(f"cannot import flashinfer.jit.env ({err})")
    path = Path(env_mod.__file__)
    src = path.read_text(encoding="utf-8")
    on_mismatch = "warn" if "Ignoring incompatible flashinfer-cubin package" in src else "raise"
    prefix = "startswith(flashinfer_version)" in src
    exact_local = 'startswith(f"{flashinfer_version}+")' in src
    rule = "exact_or_local" if exact_local else "prefix" if prefix else None
    if rule is None:
        raise EmitError(f"flashinfer/jit/env.py of FlashInfer {fi.__version__}: the jit-cache version rule is neither known form; read it and extend nvfp4compat/emit.py")
    message = previous.version_check.message
    source = "carried (no _check_cubin_version to call)"
    check_fn = getattr(env_mod, "_check_cubin_version", None)
    if check_fn is not None:
        probe = "0.0.0.post999"
        with _without_env("FLASHINFER_DISABLE_VERSION_CHECK"):
            try:
                check_fn(probe)
            except RuntimeError as exc:
                message = str(exc).replace(probe, "{installed}").replace(str(fi.__version__), "{flashinfer}")
                source = "_check_cubin_version called"
    return {
        "on_mismatch": on_mismatch,
        "cubin_match": "exact",
        "jit_cache_match": rule,
        "message": message,
        "evidence": f"flashinfer/jit/env.py [{V}]: mismatched cubin {'warns' if on_mismatch == 'warn' else 'raises'}; "
        f"jit-cache rule {rule}; message: {source}",
        "status": "read",
    }


def _stored_template(m: Matrix, release: FlashInferRelease) -> dict[str, Any]:
    """A matrix release as the template the file would store (its version written as ``{version}``)."""
    data = release.model_dump(mode="json", exclude_none=True)

    def walk(node: Any) -> Any:
        if isinstance(node, str):
            return _template(node, release.version)
        if isinstance(node, list):
            return [walk(x) for x in node]
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        return node

    return {k: walk(v) if k in _FACT_KEYS else v for k, v in data.items()}


def _drop_none(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _drop_none(v) for k, v in node.items() if v is not None}
    if isinstance(node, list):
        return [_drop_none(x) for x in node]
    return node


def flashinfer_delta(m: Matrix, entry: dict[str, Any]) -> dict[str, Any]:
    """``entry`` (a template from :func:`emit_flashinfer`) as the delta on the release before it."""
    previous = _stored_template(m, _previous(m, entry["version"]))
    entry = _drop_none(entry)
    out: dict[str, Any] = {"version": entry["version"], "evidence": _fill_version(entry["evidence"], entry["version"])}
    for key in _FACT_KEYS:
        if key in ("helpers", "consumers"):
            changed = {name: e for name, e in entry[key].items() if previous[key].get(name) != e}
            if changed:
                out[key] = changed
        elif previous[key] != entry[key]:
            out[key] = entry[key]
    return out


def render_delta(delta: dict[str, Any]) -> str:
    """The delta as the YAML list item to paste into ``matrix/flashinfer.yaml``."""

    class _Dumper(yaml.SafeDumper):
        pass

    def flow(v: list[Any]) -> bool:  # [80, 90] and [a, b=None] on one line, as the file writes them
        return bool(v) and (
            all(isinstance(x, int) for x in v) or all(isinstance(x, str) and re.match(r"^[A-Za-z_]\w*(=|$)", x) for x in v)
        )

    _Dumper.add_representer(list, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=flow(v)))
    _Dumper.add_representer(  # versions stay strings: "0.7" must not read back as a float
        str, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", v, style='"' if re.fullmatch(r"\d+(\.\d+)+\S*", v) else None)
    )
    text = yaml.dump([delta], Dumper=_Dumper, sort_keys=False, width=112, allow_unicode=True, default_flow_style=False)
    return text


# ------------------------------------------------------------------------------------- vLLM

_FI_PY = "v1/attention/backends/flashinfer.py"
_BACKEND_PY = "v1/attention/backend.py"


class _VllmSource:
    """The files and metadata of a vLLM release: the installed one, or a downloaded wheel (no import)."""

    def __init__(self, wheel: Path | None = None) -> None:
        self.wheel = wheel
        if wheel is None:
            import importlib.metadata

            try:
                self.version = importlib.metadata.version("vllm")
            except importlib.metadata.PackageNotFoundError:
                raise EmitError("vLLM is not installed: install it (pip install --no-deps vllm==X) or pass --wheel vllm-X.whl") from None
            installed = importlib.metadata.metadata("vllm")
            self.requires = list(importlib.metadata.requires("vllm") or [])
            self.requires_python = str((installed.get_all("Requires-Python") or [""])[0])
            return
        import zipfile

        try:
            self._zip = zipfile.ZipFile(wheel)
        except (OSError, zipfile.BadZipFile) as exc:
            raise EmitError(f"cannot read {wheel} as a wheel: {exc}") from None
        metas = [n for n in self._zip.namelist() if n.endswith(".dist-info/METADATA") and n.startswith("vllm-")]
        if not metas:
            raise EmitError(f"{wheel} has no vllm-*.dist-info/METADATA: not a vLLM wheel")
        import email

        message = email.message_from_bytes(self._zip.read(metas[0]))
        self.version = str(message.get("Version"))
        self.requires = [str(r) for r in message.get_all("Requires-Dist") or []]
        self.requires_python = str(message.get("Requires-Python") or "")

    def read(self, rel_path: str) -> str | None:
        if self.wheel is None:
            from nvfp4compat.verify import _vllm_file

            path = _vllm_file(rel_path)
            return path.read_text(encoding="utf-8") if path is not None else None
        try:
            return self._zip.read(f"vllm/{rel_path}").decode("utf-8")
        except KeyError:
            return None


def _message_line(text: str, pieces: list[str]) -> int | None:
    """The source line of a message: its longest literal piece, else that piece's first words (a message
    split over several string literals)."""
    ordered = sorted(pieces, key=len, reverse=True)
    for needle in [*ordered, *(" ".join(p.split()[:2]) for p in ordered)]:
        line = _line_of(text, needle)
        if line is not None:
            return line
    return None


def _line_of(text: str, needle: str) -> int | None:
    i = text.find(needle)
    return None if i < 0 else text[:i].count("\n") + 1


def emit_vllm(m: Matrix, wheel: Path | None = None) -> dict[str, Any]:
    """The full ``vllm.yaml`` release entry (``{version}`` placeholders) of an installed or downloaded vLLM.

    Probed statically, as :func:`nvfp4compat.verify.verify_vllm` does (vLLM is not imported): the
    METADATA pins and Python bound, the nvfp4 dtypes of ``FlashInferBackend``, the gate kind, the NVFP4
    writer, the FlashInfer helpers imported at module load, and the line of each known error string.
    The rest (stock paths, strategy, plugin implementations, reader, window) is carried from the newest
    older release and its evidence says so: review it against the release's code. Whether a pin is
    published on the index (``pins.unpublished``) is not in the wheel: check it with ``pip download``.

    Raises
    ------
    EmitError
        When vLLM is neither installed nor given as a wheel, or is older than every release in the matrix.
    """
    import ast

    from nvfp4compat.verify import _string_constants

    src = _VllmSource(wheel)
    version = src.version
    v = public_version(version)
    older = [r for r in m.vllm.releases if r.parsed < v]
    if not older:
        raise EmitError(f"vLLM {version} is older than every release in matrix/vllm.yaml ({m.vllm.releases[0].version})")
    previous = older[-1]
    prev = previous.model_dump(mode="json", exclude_none=True)
    fi_src = src.read(_FI_PY)
    if fi_src is None:
        raise EmitError(f"vLLM {version} has no vllm/{_FI_PY}: the FlashInfer backend moved; read the release and extend nvfp4compat/emit.py")
    be_src = src.read(_BACKEND_PY) or ""

    pins: dict[str, str] = {}
    for r in src.requires:
        if ";" in r and "extra" in r.split(";", 1)[1]:
            continue
        found = re.match(r"^\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s;,]+)", r)
        if found and found.group(1).lower() in ("torch", "flashinfer-python", "flashinfer-cubin"):
            pins[found.group(1).lower().replace("-", "_")] = found.group(2)
    if "torch" not in pins or "flashinfer_python" not in pins:
        raise EmitError(f"vLLM {version}'s METADATA pins no torch==/flashinfer-python== (found {pins}); read its requirements")
    low = re.search(r">=\s*([0-9.]+)", src.requires_python)

    tree = ast.parse(fi_src)
    dtypes: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "supported_kv_cache_dtypes" and isinstance(node.value, ast.List):
            dtypes = [e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value.startswith("nvfp4")]
    kind = "fa2_families" if any(isinstance(n, ast.FunctionDef) and n.name == "_nvfp4_kv_on_fa2" for n in tree.body) else "fam100_trtllm"
    fi_imports = [
        a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "flashinfer" for a in n.names
    ]
    slot = f"{m.implementations.flashinfer_helper('write')}("
    writer = "flashinfer_slot_mapping" if slot in fi_src else "reshape_and_cache_flash"
    writer_line = _line_of(fi_src, slot if writer == "flashinfer_slot_mapping" else "reshape_and_cache_flash(")
    gate_line = _line_of(fi_src, "def supports_kv_cache_dtype")

    def carried(node: Any) -> Any:
        out = dict(node)
        for key in [k for k in out if k == "evidence"]:
            out[key] = f"not probed; as vLLM {previous.version}: {out[key]}"
        return out

    texts = {"FI": _string_constants(fi_src), "BE": _string_constants(be_src)}
    errors = []
    for e in prev["errors"]:
        pieces = [p for p in re.split(r"\{[a-z_.]+\}", e["text"]) if p.strip()]
        where = next((name for name, t in texts.items() if all(p in t for p in pieces)), None)
        if where is None:
            continue  # the release no longer has this message
        text = fi_src if where == "FI" else be_src
        line = _message_line(text, pieces)
        path = f"vllm/{_FI_PY}" if where == "FI" else f"vllm/{_BACKEND_PY}"
        errors.append({**e, "evidence": f"{path}:{line} [{V}]", "status": "read"})

    entry: dict[str, Any] = {
        "version": version,
        "evidence": f"read statically from the vllm-{V} wheel by `nvfp4compat verify --emit` (nvfp4compat/emit.py): METADATA, "
        f"vllm/{_FI_PY}, vllm/{_BACKEND_PY}; what is not probed is carried from {previous.version} and says so",
        "status": "read",
        "pins": pins,
        "requires_python": f">={low.group(1)}" if low else prev["requires_python"],
        "nvfp4_dtypes": dtypes,
        "compute_capability_window": prev["compute_capability_window"],
        "gate": {
            "kind": kind,
            "description": prev["gate"]["description"] if kind == prev["gate"]["kind"] else f"{kind} (describe it from the code)",
            "evidence": f"vllm/{_FI_PY}:{gate_line} [{V}] supports_kv_cache_dtype"
            + ("; _nvfp4_kv_on_fa2 defined" if kind == "fa2_families" else ""),
            "status": "read",
        },
        "writer": {"name": writer, "evidence": f"vllm/{_FI_PY}:{writer_line} [{V}] {writer}", "status": "read"},
        "reader": carried(prev["reader"]),
        "stock": [carried(s) for s in prev["stock"]],
        "errors": errors,
        "requires_flashinfer_helpers": [h for h in HELPERS if h in fi_imports],
        "plugin": carried(prev["plugin"]),
        "strategy": carried(prev["strategy"]),
    }
    registry = _dtype_registry(src, V)
    if registry is not None:
        entry["kv_cache_dtype_registry"] = registry
    return _template_tree(entry, version)


def _dtype_registry(src: _VllmSource, v: str) -> dict[str, Any] | None:
    """``kv_cache_dtype_registry`` of the release: where ``vllm/config/cache.py`` defines
    ``register_kv_cache_dtype`` and the list ``CacheConfig`` validates against; None without it."""
    text = src.read("config/cache.py") or ""
    line = _line_of(text, "def register_kv_cache_dtype(")
    if line is None:
        return None
    known = _line_of(text, "def is_known_kv_cache_dtype(")
    listed = _line_of(text, "KV_CACHE_DTYPES")
    parts = [f"vllm/config/cache.py:{line} register_kv_cache_dtype"]
    if listed is not None:
        parts.append(f":{listed} KV_CACHE_DTYPES")
    if known is not None:
        parts.append(f":{known} is_known_kv_cache_dtype")
    return {
        "api": "vllm.config.cache.register_kv_cache_dtype",
        "evidence": f"{', '.join(parts)} [{v}]",
        "status": "read",
    }


def _template_tree(node: Any, version: str) -> Any:
    if isinstance(node, str):
        return node if node == version else _template(node, version)
    if isinstance(node, list):
        return [_template_tree(x, version) for x in node]
    if isinstance(node, dict):
        return {k: (v if k == "version" else _template_tree(v, version)) for k, v in node.items()}
    return node


def render_vllm(entry: dict[str, Any]) -> str:
    """The entry as the YAML list item to paste under ``releases:`` in ``matrix/vllm.yaml``."""
    return render_delta(_fill_version(entry, entry["version"]))


def emit_text(m: Matrix, wheel: Path | None = None) -> str:
    """What ``nvfp4compat verify --emit`` prints: the installed FlashInfer's delta and vLLM's entry
    (or the entry of the vLLM ``wheel``), each under a comment naming the file it goes into.

    Raises
    ------
    EmitError
        When there is nothing to describe, or a release cannot be read.
    """
    import importlib.metadata

    def installed(dist: str) -> bool:
        try:
            importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return False
        return True

    parts: list[str] = []
    if wheel is None and installed("flashinfer-python"):
        parts.append("# matrix/flashinfer.yaml, under flashinfer: (a delta on the release before it)\n"
                     + render_delta(flashinfer_delta(m, emit_flashinfer(m))))
    if wheel is not None or installed("vllm"):
        parts.append("# matrix/vllm.yaml, under releases: (review what is carried)\n" + render_vllm(emit_vllm(m, wheel)))
    if not parts:
        raise EmitError(
            "neither flashinfer-python nor vllm is installed: install the release to describe (FlashInfer the "
            "CPU-importable way), or pass --wheel vllm-X.whl"
        )
    return "\n".join(parts)
