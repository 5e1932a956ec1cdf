"""System facts (:class:`SystemFacts`) and their detection (:func:`detect`).

:class:`SystemFacts` is everything the pure resolver needs to know about a machine: GPU arch,
CUDA/torch/Triton/FlashInfer/vLLM versions, which FlashInfer NVFP4 helpers the installed
package really has, and the relevant environment variables. It is built either by
:func:`detect` (this machine) or by hand (:func:`nvfp4compat.query`).

:func:`detect` never crashes on a broken install: FlashInfer is probed by
:func:`nvfp4compat.flashinfer_probe.probe_installed` without importing it (``importlib.util.find_spec``
+ an AST read of its installed sources, or ``hasattr`` on the module when something already imported
it), and every failure is recorded in the facts.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from nvfp4compat.flashinfer_probe import dist_version, probe_installed
from nvfp4compat.spec import ARCH_RE
from nvfp4compat.versions import VersionError, parse_version

__all__ = [
    "ENV_ARCH", "ENV_CUDAGRAPH_DECODE", "ENV_DISABLE_TRITON", "ENV_IMPL", "ENV_KV_ROTATION", "SystemFacts", "detect",
    "normalize_arch",
]  # fmt: skip

ENV_IMPL = "NVFP4COMPAT_IMPL"
ENV_DISABLE_TRITON = "NVFP4COMPAT_DISABLE_TRITON"
ENV_ARCH = "NVFP4COMPAT_ARCH"
ENV_KV_ROTATION = "NVFP4COMPAT_KV_ROTATION"
ENV_CUDAGRAPH_DECODE = "NVFP4COMPAT_CUDAGRAPH_DECODE"

def normalize_arch(text: str) -> str:
    """Accept ``sm_90``, ``sm90``, ``SM90``, ``9.0`` or ``90``; return ``sm_90``.

    Raises
    ------
    ValueError
        For anything else, with the accepted forms in the message.
    """
    t = text.strip().lower()
    m = re.fullmatch(r"(?:sm_?)?([1-9][0-9]?)([0-9])", t) or re.fullmatch(r"([1-9][0-9]?)\.([0-9])", t)
    if m is None:
        raise ValueError(
            f"invalid arch {text!r}: expected sm_<major><minor> such as sm_80, sm_86, sm_89, sm_90, sm_100 or sm_120 "
            "(also accepted: sm90, 9.0)"
        )
    return f"sm_{int(m.group(1))}{m.group(2)}"


class SystemFacts(BaseModel):
    """What the resolver knows about the system.

    Attributes
    ----------
    arch : str or None
        ``"sm_90"`` form; None when no GPU was found and ``NVFP4COMPAT_ARCH`` is unset.
    arch_source : {"torch", "environment", "argument"} or None
        Where ``arch`` came from.
    cuda, torch, triton, flashinfer, flashinfer_cubin, flashinfer_jit_cache, vllm : str or None
        Installed versions (``cuda`` is ``torch.version.cuda``); None when absent. ``triton`` may
        be ``"any"`` in hand-written facts ("installed, version not given").
    flashinfer_helpers : dict[str, bool] or None
        Helper name -> present, probed on the installed package; None when not probed (hand
        facts: the matrix entry of that release is used).
    flashinfer_helper_params : dict[str, list[str]] or None
        Helper name -> parameter names, from the same probe.
    flashinfer_probe : str or None
        ``"module"`` (hasattr on an imported module), ``"static"`` (AST of the installed files),
        ``"failed: ..."``; None when not probed.
    flashinfer_import_error : str or None
        An error seen while probing FlashInfer (recorded, never raised).
    flashinfer_fa3_ragged : bool or None
        The installed FlashInfer exports ``BatchPrefillWithRaggedKVCacheWrapper`` and its
        ``prefill.py`` dispatches ``backend="fa3"`` (read from the installed sources); None when not
        probed (hand facts: flashinfer.yaml's ``fa3_ragged`` of that release is used).
    flashinfer_fa2_ragged : bool or None
        The installed FlashInfer exports ``BatchPrefillWithRaggedKVCacheWrapper`` and its
        ``prefill.py`` dispatches ``backend == "fa2"``; None when not probed (hand facts:
        flashinfer.yaml's ``fa2_ragged`` of that release is used).
    trtllm_gen_usable : bool or None
        Whether FlashInfer's trtllm-gen kernels can run here; None when unknown.
    triton_disabled : bool
        ``NVFP4COMPAT_DISABLE_TRITON`` was set (negative control).
    impl_env : str or None
        The value of ``NVFP4COMPAT_IMPL`` captured with the facts (the resolver applies it).
    kv_rotation_env : str or None
        The value of ``NVFP4COMPAT_KV_ROTATION`` captured with the facts (the resolver parses it:
        ``hadamard`` turns the rotated cache on, ``none`` or empty leaves it off).
    cudagraph_decode_env : str or None
        The value of ``NVFP4COMPAT_CUDAGRAPH_DECODE`` captured with the facts (the resolver parses it:
        ``1`` lets FULL decode graphs capture the plugin's readers, ``0`` keeps them out; unset: what
        the matrix verified for the vLLM release and arch).
    source : {"detect", "query"}
        Whether the facts were detected or written by hand.
    notes : list[str]
        Human-readable remarks gathered while detecting.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    arch: str | None = None
    arch_source: Literal["torch", "environment", "argument"] | None = None
    gpu_name: str | None = None
    cuda: str | None = None
    torch: str | None = None
    triton: str | None = None
    flashinfer: str | None = None
    flashinfer_helpers: dict[str, bool] | None = None
    flashinfer_helper_params: dict[str, list[str]] | None = None
    flashinfer_probe: str | None = None
    flashinfer_import_error: str | None = None
    flashinfer_fa3_ragged: bool | None = None
    flashinfer_fa2_ragged: bool | None = None
    flashinfer_cubin: str | None = None
    flashinfer_jit_cache: str | None = None
    vllm: str | None = None
    trtllm_gen_usable: bool | None = None
    triton_disabled: bool = False
    impl_env: str | None = None
    kv_rotation_env: str | None = None
    cudagraph_decode_env: str | None = None
    source: Literal["detect", "query"] = "query"
    notes: list[str] = Field(default_factory=list)

    @field_validator("arch")
    @classmethod
    def _arch(cls, v: str | None) -> str | None:
        return None if v is None else normalize_arch(v)

    @field_validator("torch", "triton", "flashinfer", "flashinfer_cubin", "flashinfer_jit_cache", "vllm")
    @classmethod
    def _version(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None or (v == "any" and info.field_name == "triton"):
            return v
        try:
            parse_version(v)
        except VersionError as exc:
            raise ValueError(str(exc)) from None
        return v

    @property
    def arch_major(self) -> int | None:
        m = ARCH_RE.match(self.arch) if self.arch else None
        return int(m["major"]) if m else None

    @property
    def arch_minor(self) -> int | None:
        m = ARCH_RE.match(self.arch) if self.arch else None
        return int(m["minor"]) if m else None

    @property
    def arch_cc(self) -> int | None:
        if self.arch_major is None or self.arch_minor is None:
            return None
        return self.arch_major * 10 + self.arch_minor



# ----------------------------------------------------------------------------- probing


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def _truthy(value: str | None, name: str = ENV_DISABLE_TRITON) -> bool:
    """An on/off environment variable; anything else is a ValueError naming the accepted values."""
    v = "" if value is None else value.strip().lower()
    if v in _TRUE or v in _FALSE:
        return v in _TRUE
    raise ValueError(f"{name}={value!r} is not on/off: accepted values are {', '.join(_TRUE)} (on) and "
                     f"{', '.join(x or repr(x) for x in _FALSE)} (off); fix or unset {name}")


def _detect_gpu() -> dict[str, object]:
    out: dict[str, object] = {}
    if importlib.util.find_spec("torch") is None:
        return out
    try:
        import torch  # noqa: PLC0415 - optional dependency
    except Exception as exc:  # noqa: BLE001
        out["notes"] = [f"import torch failed: {type(exc).__name__}: {exc}"]
        return out
    out["torch"] = str(torch.__version__)
    out["cuda"] = getattr(torch.version, "cuda", None)
    try:
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            out["arch"] = f"sm_{major}{minor}"
            out["gpu_name"] = torch.cuda.get_device_name(0)
    except Exception as exc:  # noqa: BLE001 - a broken driver must not crash detect()
        out["notes"] = [f"torch.cuda query failed: {type(exc).__name__}: {exc}"]
    return out


def _trtllm_gen_arch(arch: str) -> bool:
    """arches.yaml: the arch's ``trtllm_gen_fmha`` flag (False for an arch the matrix does not list)."""
    from nvfp4compat.loader import load_matrix

    spec = load_matrix().arches.get(arch)
    return spec is not None and spec.trtllm_gen_fmha.value


def detect(*, import_modules: bool = False, environ: dict[str, str] | None = None) -> SystemFacts:
    """Gather :class:`SystemFacts` for this machine.

    Parameters
    ----------
    import_modules : bool, default False
        Also ``import flashinfer`` (guarded: a failure is recorded in
        ``flashinfer_import_error``, never raised) to probe helpers with ``hasattr``. By default
        an already-imported module is probed with ``hasattr`` and otherwise the installed
        sources are read (``find_spec`` + AST), which has no import side effects.
    environ : dict, optional
        Environment to read (defaults to ``os.environ``).

    Notes
    -----
    GPU arch comes from ``torch.cuda.get_device_capability(0)``; without a GPU it is
    ``NVFP4COMPAT_ARCH`` if set, else None (the plan then says so).
    """
    env = dict(os.environ if environ is None else environ)
    notes: list[str] = []
    gpu = _detect_gpu()
    notes.extend(gpu.pop("notes", []))  # type: ignore[arg-type]
    arch = gpu.get("arch")
    arch_source: str | None = "torch" if arch else None
    env_arch = env.get(ENV_ARCH)
    if env_arch:
        try:
            env_norm = normalize_arch(env_arch)
        except ValueError as exc:
            notes.append(f"{ENV_ARCH} ignored: {exc}")
        else:
            if arch is None:
                arch, arch_source = env_norm, "environment"
                notes.append(f"no CUDA GPU detected; planning for {ENV_ARCH}={env_norm}")
            elif arch != env_norm:
                notes.append(f"{ENV_ARCH}={env_norm} ignored: a {arch} GPU is present")
    elif arch is None:
        notes.append(f"no CUDA GPU detected (torch missing or torch.cuda.is_available() is False); set {ENV_ARCH}=sm_90 to plan for a given arch")
    triton = dist_version("triton", "pytorch-triton")
    fi = probe_installed(import_modules=import_modules)
    cubin = dist_version("flashinfer-cubin")
    jit = dist_version("flashinfer-jit-cache")
    vllm = dist_version("vllm")
    torch_v = gpu.get("torch")
    trtllm: bool | None = None
    if arch is not None and (not _trtllm_gen_arch(str(arch)) or fi.get("flashinfer") is None):
        trtllm = False
    elif arch is not None and cubin is not None and fi.get("flashinfer") is not None:
        try:
            trtllm = parse_version(cubin) == parse_version(str(fi["flashinfer"]))
        except VersionError:
            trtllm = None
        if trtllm is False:
            notes.append(f"flashinfer-cubin {cubin} does not match flashinfer {fi['flashinfer']}: trtllm-gen cubins unusable")
    elif arch is not None:
        notes.append("trtllm-gen usability unknown: flashinfer-cubin is not installed (vLLM would try NVIDIA's artifactory)")

    def _v(x: object) -> str | None:
        if not isinstance(x, str):
            return None
        try:
            parse_version(x)
        except VersionError:
            notes.append(f"ignored unparsable version {x!r}")
            return None
        return x

    return SystemFacts(
        arch=arch if isinstance(arch, str) else None,
        arch_source=arch_source,  # type: ignore[arg-type]
        gpu_name=gpu.get("gpu_name") if isinstance(gpu.get("gpu_name"), str) else None,  # type: ignore[arg-type]
        cuda=gpu.get("cuda") if isinstance(gpu.get("cuda"), str) else None,  # type: ignore[arg-type]
        torch=_v(torch_v),
        triton=_v(triton),
        flashinfer=_v(fi.get("flashinfer")),
        flashinfer_helpers=fi.get("flashinfer_helpers"),  # type: ignore[arg-type]
        flashinfer_helper_params=fi.get("flashinfer_helper_params"),  # type: ignore[arg-type]
        flashinfer_probe=fi.get("flashinfer_probe"),  # type: ignore[arg-type]
        flashinfer_import_error=fi.get("flashinfer_import_error"),  # type: ignore[arg-type]
        flashinfer_fa3_ragged=fi.get("flashinfer_fa3_ragged"),  # type: ignore[arg-type]
        flashinfer_fa2_ragged=fi.get("flashinfer_fa2_ragged"),  # type: ignore[arg-type]
        flashinfer_cubin=_v(cubin),
        flashinfer_jit_cache=_v(jit),
        vllm=_v(vllm),
        trtllm_gen_usable=trtllm,
        triton_disabled=_truthy(env.get(ENV_DISABLE_TRITON)),
        impl_env=env.get(ENV_IMPL) or None,
        kv_rotation_env=env.get(ENV_KV_ROTATION) or None,
        cudagraph_decode_env=env.get(ENV_CUDAGRAPH_DECODE) or None,
        source="detect",
        notes=notes,
    )

