"""Write the ``matrix/flashinfer.yaml`` entry of the installed FlashInfer: ``nvfp4compat verify --emit``.

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

from nvfp4compat.loader import VERSION_PLACEHOLDER, _fill_version
from nvfp4compat.spec import EXPORT_MODULES, HELPERS, FlashInferRelease, Matrix
from nvfp4compat.verify import (
    _HOME_MODULE,
    ARCH_UNIVERSE,
    _def_line,
    _fmt_params,
    _import,
    _without_env,
)
from nvfp4compat.versions import parse_version

__all__ = ["EmitError", "emit_flashinfer", "flashinfer_delta", "render_delta"]

V = VERSION_PLACEHOLDER
_CHECKED = "probed by `nvfp4compat verify --emit` (import, hasattr per module, inspect.signature)"
_FACT_KEYS = ("helpers", "nvfp4_4over6", "consumers", "scale_check", "version_check", "cpu_import")


class EmitError(RuntimeError):
    """The installed FlashInfer cannot be described (not installed, not importable, no earlier release)."""


def _previous(m: Matrix, version: str) -> FlashInferRelease:
    v = parse_version(version).public
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


def _helper(name: str, modules: dict[str, Any], fi: Any) -> dict[str, Any]:
    exports = [mod for mod in EXPORT_MODULES if modules[mod] is not None and hasattr(modules[mod], name)]
    home_name = _HOME_MODULE.get(name, "flashinfer.quantization.fp4_quantization")
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
    elif name in _HOME_MODULE:
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
    fi, err = _import("flashinfer")
    if fi is None:
        raise EmitError(
            f"cannot import flashinfer ({err}); install it the CPU-importable way first "
            "(pip install --no-deps flashinfer-python==X plus the cpu_import requirements of the nearest release)"
        )
    version = str(getattr(fi, "__version__", ""))
    previous = _previous(m, version)
    modules = {name: _import(name)[0] for name in EXPORT_MODULES}
    prev = previous.model_dump(mode="json", exclude_none=True)

    helpers = {h: _helper(h, modules, fi) for h in HELPERS}

    slot = getattr(modules.get("flashinfer.page"), "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping", None)
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

    return {
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


def _version_check(fi: Any, previous: FlashInferRelease) -> dict[str, Any]:
    env_mod, err = _import("flashinfer.jit.env")
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
    text = yaml.dump([delta], Dumper=_Dumper, sort_keys=False, width=112, allow_unicode=True, default_flow_style=False)
    return re.sub(r'^- version: (\S+)$', r'- version: "\1"', text, count=1, flags=re.M)
