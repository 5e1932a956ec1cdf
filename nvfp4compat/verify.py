"""Check the matrix against the installed FlashInfer (and vLLM): ``nvfp4compat verify``.

For the installed flashinfer-python release, every claim of its ``flashinfer.yaml`` entry is
re-checked against the real package: helper presence and export modules (``hasattr`` after
import), definition lines, signatures (``inspect.signature``), SM gates
(``helper.is_compute_capability_supported(cc)``), the ``nvfp4_4over6`` option, the writer's
scale check and the cubin/jit-cache version check (by calling FlashInfer's own check function
where it exists, else by reading ``flashinfer/jit/env.py``), and the trtllm-gen / XQA SM lists.
For an installed vLLM release: the pins in its METADATA, the nvfp4 dtypes it lists, the gate
kind (``_nvfp4_kv_on_fa2`` present or not), its writer, and its user-visible error strings,
read statically from the installed sources (vLLM is not imported).

Each check yields a :class:`Check`; any drift makes :func:`run` return 1.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from nvfp4compat.flashinfer_probe import (
    home_module,
    import_guarded,
    probe_fa2_ragged,
    probe_fa3_ragged,
)
from nvfp4compat.spec import EXPORT_MODULES, HELPERS, FlashInferRelease, Matrix, VllmRelease
from nvfp4compat.versions import parse_version

__all__ = ["Check", "run", "verify_flashinfer", "verify_vllm"]

ARCH_UNIVERSE = (75, 80, 86, 87, 89, 90, 100, 103, 107, 110, 120, 121)
_LABELS = {"flashinfer": "FlashInfer", "vllm": "vLLM"}  # in messages
_R = TypeVar("_R")


@dataclass(frozen=True)
class Check:
    """One claim compared with the installed package."""

    subject: str
    claim: str
    expected: str
    actual: str
    ok: bool

    def render(self) -> str:
        if self.ok:
            return f"ok     {self.subject}: {self.claim} = {self.expected}"
        return f"DRIFT  {self.subject}: {self.claim}\n       - matrix:    {self.expected}\n       + installed: {self.actual}"


def _fmt_params(fn: Any) -> list[str]:
    sig = inspect.signature(inspect.unwrap(fn))
    out: list[str] = []
    star = False
    for p in sig.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            out.append("*" + p.name)
            star = True
            continue
        if p.kind is p.KEYWORD_ONLY and not star:
            out.append("*")
            star = True
        if p.kind is p.VAR_KEYWORD:
            out.append("**" + p.name)
            continue
        if p.default is p.empty:
            out.append(p.name)
        else:
            d = p.default
            text = repr(d)
            mod = getattr(type(d), "__module__", "")
            if mod.startswith("torch") and not text.startswith("torch."):
                text = f"torch.{text}"
            out.append(f"{p.name}={text}")
    return out


def _def_line(fn: Any) -> str | None:
    raw = inspect.unwrap(fn)
    try:
        src_file = inspect.getsourcefile(raw)
        lines, start = inspect.getsourcelines(raw)
    except (OSError, TypeError):
        return None
    if src_file is None:
        return None
    for i, line in enumerate(lines):
        if re.match(r"\s*(async\s+)?def\s", line):
            start += i
            break
    path = Path(src_file).resolve()
    parts = path.parts
    if "flashinfer" in parts:
        idx = len(parts) - 1 - list(reversed(parts)).index("flashinfer")
        rel = "/".join(parts[idx:])
    else:
        rel = path.name
    return f"{rel}:{start}"


@contextlib.contextmanager
def _without_env(name: str) -> Iterator[None]:
    old = os.environ.pop(name, None)
    try:
        yield
    finally:
        if old is not None:
            os.environ[name] = old


def verify_flashinfer(m: Matrix, version: str, rel: FlashInferRelease) -> list[Check]:
    """Every claim of ``rel`` against the imported flashinfer package."""
    subj = f"flashinfer {version}"
    checks: list[Check] = []

    def add(claim: str, expected: object, actual: object) -> None:
        checks.append(Check(subj, claim, str(expected), str(actual), expected == actual))

    fi, err = import_guarded("flashinfer")
    add("import flashinfer", "ok", "ok" if err is None else err)
    if fi is None:
        return checks
    add("flashinfer.__version__", rel.version, getattr(fi, "__version__", "?"))
    modules = {name: import_guarded(name)[0] for name in EXPORT_MODULES}
    for h in HELPERS:
        spec = rel.helpers[h]
        actual_exports = [mod for mod in EXPORT_MODULES if modules[mod] is not None and hasattr(modules[mod], h)]
        add(f"{h} present", spec.present, bool(actual_exports))
        add(f"{h} exported at", spec.exports, actual_exports)
        if not spec.present or not actual_exports:
            continue
        home = modules.get(home_module(m, h))
        fn = getattr(home, h, None) or getattr(fi, h)
        add(f"{h} defined at", spec.defined_at, _def_line(fn))
        try:
            params: object = _fmt_params(fn)
        except (TypeError, ValueError) as exc:
            params = f"inspect.signature failed: {exc}"
        add(f"{h} signature", spec.params, params)
        if spec.capability_source == "decorator":
            probe = getattr(fn, "is_compute_capability_supported", None)
            if probe is None:
                add(f"{h} SM gate", spec.compute_capability, "no is_compute_capability_supported attribute")
            else:
                got = [cc for cc in ARCH_UNIVERSE if probe(cc)]
                want = [cc for cc in ARCH_UNIVERSE if cc in (spec.compute_capability or [])]
                add(f"{h} is_compute_capability_supported over {list(ARCH_UNIVERSE)}", want, got)
        elif spec.capability_source == "jit_min_arch":
            core = Path(fi.__file__).parent / "jit" / "core.py"
            text = core.read_text(encoding="utf-8") if core.is_file() else ""
            m_ = re.search(r"FlashInfer requires GPUs with sm(\d+) or higher", text)
            want_min = spec.compute_capability[0] if spec.compute_capability else None
            add(f"{h} JIT minimum SM (jit/core.py check_cuda_arch)", want_min, int(m_.group(1)) if m_ else "message not found")
    # 4over6
    slot_name = m.implementations.flashinfer_helper("write") or ""
    slot = getattr(modules.get(home_module(m, slot_name)), slot_name, None)
    has_param = slot is not None and "nvfp4_4over6" in inspect.signature(inspect.unwrap(slot)).parameters
    add("slot-mapping writer takes nvfp4_4over6", rel.nvfp4_4over6.writer_param, has_param)
    cfg = [mod for mod in ("flashinfer", "flashinfer.quantization") if modules[mod] is not None and hasattr(modules[mod], "NVFP44Over6Config")]
    add("NVFP44Over6Config exported at", rel.nvfp4_4over6.config_exports, cfg)
    # scale check
    helper = getattr(modules.get("flashinfer.page"), "_as_float32_scalar_tensors", None)
    if helper is None:
        add("writer scale check", rel.scale_check.mode, "n/a")
    else:
        src = inspect.getsource(helper)
        add("writer scale check", rel.scale_check.mode, "host_sync" if ".cpu()" in src else "device_trap")
    # version check
    checks.extend(_verify_version_check(fi, rel, subj))
    # consumers
    data = Path(fi.__file__).parent / "data" / "include" / "flashinfer" / "trtllm" / "fmha" / "fmhaRunner.cuh"
    if data.is_file():
        text = data.read_text(encoding="utf-8", errors="replace")
        m_ = re.search(r"FLASHINFER_CHECK\(\s*mSM\s*==[^;]*", text)
        sms = sorted(int(x) for x in re.findall(r"kSM_(\d+)", m_.group(0))) if m_ else []
        add("trtllm-gen FMHA runner SMs (fmhaRunner.cuh)", rel.consumers["trtllm_gen"].sms, sms)
    else:
        add("trtllm-gen FMHA runner SMs (fmhaRunner.cuh)", rel.consumers["trtllm_gen"].sms, "fmhaRunner.cuh not shipped")
    xqa_path = Path(fi.__file__).parent / "xqa.py"
    xqa_msg = rel.consumers["xqa_decode"].message or ""
    add("XQA NVFP4 assert message (xqa.py)", xqa_msg, xqa_msg if xqa_path.is_file() and xqa_msg in xqa_path.read_text(encoding="utf-8") else "message not found")
    for cls_name, consumer in (("BatchDecodeWithPagedKVCacheWrapper", "fa2_decode"), ("BatchPrefillWithPagedKVCacheWrapper", "fa2_prefill")):
        cls = getattr(fi, cls_name, None)
        has_sf = cls is not None and "kv_cache_sf" in inspect.signature(cls.run).parameters
        add(f"{cls_name}.run takes kv_cache_sf ({consumer})", bool(rel.consumers[consumer].sms), has_sf)
    # the FA3 ragged prefill the dequant_fa3 prefill attends with (the same probe detect() runs)
    add("BatchPrefillWithRaggedKVCacheWrapper backend fa3 (fa3_ragged)", rel.fa3_ragged is not None,
        probe_fa3_ragged(Path(fi.__file__).parent))  # fmt: skip
    # the FA2 ragged prefill the dequant_fa2 prefill attends with
    add("BatchPrefillWithRaggedKVCacheWrapper backend fa2 (fa2_ragged)", rel.fa2_ragged is not None,
        probe_fa2_ragged(Path(fi.__file__).parent))  # fmt: skip
    return checks


def _verify_version_check(fi: Any, rel: FlashInferRelease, subj: str) -> list[Check]:
    vc = rel.version_check
    out: list[Check] = []
    env_mod, err = import_guarded("flashinfer.jit.env")
    if env_mod is None:
        return [Check(subj, "import flashinfer.jit.env", "ok", str(err), False)]
    src = Path(env_mod.__file__).read_text(encoding="utf-8")
    warns = "Ignoring incompatible flashinfer-cubin package" in src
    out.append(Check(subj, "cubin version mismatch at import", vc.on_mismatch, "warn" if warns else "raise", vc.on_mismatch == ("warn" if warns else "raise")))
    probe = "0.0.0.post999"
    expected_msg = vc.message.format(installed=probe, flashinfer=fi.__version__)
    check_fn = getattr(env_mod, "_check_cubin_version", None)
    if check_fn is not None:
        with _without_env("FLASHINFER_DISABLE_VERSION_CHECK"):
            try:
                check_fn(probe)
                got = "no error raised"
            except RuntimeError as exc:
                got = str(exc)
        out.append(Check(subj, "_check_cubin_version message (called)", expected_msg, got, got == expected_msg))
    else:
        pieces = [p for p in re.split(r"\{[a-z]+\}", vc.message) if p.strip()]
        consts = _string_constants(src)
        missing = [p for p in pieces if p not in consts]
        out.append(Check(subj, "cubin mismatch message (jit/env.py text)", vc.message, vc.message if not missing else f"missing fragments {missing}", not missing))
    prefix = "startswith(flashinfer_version)" in src
    exact_local = 'startswith(f"{flashinfer_version}+")' in src
    got_rule = "prefix" if prefix and not exact_local else "exact_or_local" if exact_local else "unknown"
    out.append(Check(subj, "jit-cache version match rule", vc.jit_cache_match, got_rule, vc.jit_cache_match == got_rule))
    return out


def _string_constants(src: str) -> str:
    """All string literal text of a module (f-string literal parts included), joined."""
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return src
    parts: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            parts.append(node.value)
    return "\n".join(parts) + "\n" + src


def _vllm_file(rel_path: str) -> Path | None:
    """A file of the installed vllm distribution (located via its metadata, not sys.path)."""
    try:
        dist = importlib.metadata.distribution("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None
    p = Path(str(dist.locate_file(f"vllm/{rel_path}")))
    if p.is_file():
        return p
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None or not spec.submodule_search_locations:
        return None
    q = Path(list(spec.submodule_search_locations)[0]) / rel_path
    return q if q.is_file() else None


def verify_vllm(m: Matrix, version: str, rel: VllmRelease) -> list[Check]:
    """The vLLM release's pins, nvfp4 dtypes, gate, writer and error strings (read statically)."""
    subj = f"vllm {version}"
    checks: list[Check] = []

    def add(claim: str, expected: object, actual: object) -> None:
        checks.append(Check(subj, claim, str(expected), str(actual), expected == actual))

    reqs = importlib.metadata.requires("vllm") or []
    pins: dict[str, str | None] = {"torch": None, "flashinfer-python": None, "flashinfer-cubin": None}
    for r in reqs:
        if ";" in r and "extra" in r.split(";", 1)[1]:
            continue
        m_ = re.match(r"^\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s;,]+)", r)
        if m_ and m_.group(1).lower() in pins:
            pins[m_.group(1).lower()] = m_.group(2)
    add("METADATA pin torch", rel.pins.torch, pins["torch"])
    add("METADATA pin flashinfer-python", rel.pins.flashinfer_python, pins["flashinfer-python"])
    add("METADATA pin flashinfer-cubin", rel.pins.flashinfer_cubin, pins["flashinfer-cubin"])
    fi_path = _vllm_file("v1/attention/backends/flashinfer.py")
    if fi_path is None:
        add("vllm/v1/attention/backends/flashinfer.py", "present", "missing")
        return checks
    src = fi_path.read_text(encoding="utf-8")
    tree = ast.parse(src)
    dtypes: list[str] = []
    for node in ast.walk(tree):
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id == "supported_kv_cache_dtypes" and isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.List):
            dtypes = [e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value.startswith("nvfp4")]
    add("nvfp4 dtypes in FlashInferBackend.supported_kv_cache_dtypes", rel.nvfp4_dtypes, dtypes)
    has_fa2 = any(isinstance(n, ast.FunctionDef) and n.name == "_nvfp4_kv_on_fa2" for n in tree.body)
    add("gate kind (_nvfp4_kv_on_fa2 defined)", rel.gate.kind, "fa2_families" if has_fa2 else "fam100_trtllm")
    slot_call = f"{m.implementations.flashinfer_helper('write')}("
    writer = "flashinfer_slot_mapping" if slot_call in src else "reshape_and_cache_flash"
    add("NVFP4 KV writer", rel.writer.name, writer)
    texts = _string_constants(src)
    be = _vllm_file("v1/attention/backend.py")
    if be is not None:
        texts += _string_constants(be.read_text(encoding="utf-8"))
    for e in rel.errors:
        pieces = [p for p in re.split(r"\{[a-z_.]+\}", e.text) if p.strip()]
        missing = [p for p in pieces if p not in texts]
        add(f"error string {e.text[:60]!r}", "present", "present" if not missing else f"missing {missing}")
    return checks


def run(m: Matrix, *, expect_flashinfer: str | None = None, expect_vllm: str | None = None) -> tuple[list[Check], list[str], int]:
    """Verify whatever is installed. Returns ``(checks, messages, exit_code)``."""
    checks: list[Check] = []
    msgs: list[str] = []
    checks += _verify_installed(
        m, "flashinfer-python", "flashinfer", expect_flashinfer, m.flashinfer_release,
        verify_flashinfer, msgs,
    )  # fmt: skip
    checks += _verify_installed(m, "vllm", "vllm", expect_vllm, m.vllm_release, verify_vllm, msgs)
    return checks, msgs, 0 if all(c.ok for c in checks) else 1


def _verify_installed(
    m: Matrix,
    dist: str,
    name: str,
    expect: str | None,
    release: Callable[[str], _R | None],
    verify: Callable[[Matrix, str, _R], list[Check]],
    msgs: list[str],
) -> list[Check]:
    """The checks of one installed package (``dist``, listed in ``matrix/{name}.yaml``): the
    ``expect``-ed release when given, then ``verify`` on its matrix entry; a message when absent."""
    checks: list[Check] = []
    installed = _dist(dist)
    if expect is not None:
        same = installed is not None and parse_version(installed) == parse_version(expect)
        checks.append(Check(name, "installed release", expect, str(installed), same))
    if installed is None:
        msgs.append(f"{dist} is not installed: no {_LABELS[name]} claim to verify")
        return checks
    rel = release(installed)
    if rel is None:
        listed = f"release in matrix/{name}.yaml"
        checks.append(Check(f"{name} {installed}", listed, "listed", "not listed (add an entry)", False))
    else:
        checks.extend(verify(m, installed, rel))
    return checks


def _dist(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
