"""Strict pydantic models of the capability matrix (``matrix/*.yaml``).

Every model forbids unknown keys and is frozen. Every factual claim carries ``evidence``
(``file:line [release]``, an upstream PR, or a document) and a ``status``:

- ``verified``: checked by running it (an import, ``hasattr``, ``inspect.signature``, a call);
- ``read``: established by reading the released code;
- ``expected``: inferred, not yet checked.

Cross-file rules (a vLLM release that pins a FlashInfer release the matrix does not know, an
arch named in a preference list that ``arches.yaml`` lacks, ...) are checked in
:class:`Matrix`'s validator. Nothing here imports torch, triton, flashinfer or vllm.
"""

from __future__ import annotations

import datetime
import re
from typing import Annotated, Any, Literal, TypeVar, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from nvfp4compat.versions import Version, VersionError, parse_version, public_version

__all__ = [
    "ARCH_RE",
    "HELPERS",
    "IMPLS",
    "KV_ROTATIONS",
    "OPS",
    "Impl",
    "Op",
    "Strategy",
    "PATCH_IDS",
    "ArchSpec",
    "BoolClaim",
    "ConsumerSpec",
    "CpuImportSpec",
    "ErrorEntry",
    "FlashInferRelease",
    "FourOverSixSpec",
    "HelperSpec",
    "ImplSpec",
    "Matrix",
    "OpSpec",
    "PreferenceEntry",
    "Requirement",
    "RoutedReaders",
    "ScaleCheckSpec",
    "StockPath",
    "UnknownArchTriton",
    "VersionCheckSpec",
    "VllmRelease",
    "arch_name",
]

Status = Literal["verified", "read", "expected"]
# The vocabularies of operations, implementations and vLLM strategies, defined here only (the plan,
# the kernels and the plugin import them).
Op = Literal["write", "dequant", "decode", "prefill"]
Impl = Literal["native", "flashinfer", "triton", "dequant_fa3", "dequant_fa2"]
Strategy = Literal["none", "native", "backport", "extend"]
OPS: tuple[str, ...] = get_args(Op)
IMPLS: tuple[str, ...] = get_args(Impl)
HELPERS: tuple[str, ...] = (
    "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping",
    "nvfp4_quantize_append_paged_kv_cache",
    "nvfp4_kv_dequantize_paged",
    "nvfp4_kv_dequantize",
    "nvfp4_kv_quantize",
    "nvfp4_quantize_paged_kv_cache",
)
EXPORT_MODULES: tuple[str, ...] = (
    "flashinfer",
    "flashinfer.page",
    "flashinfer.quantization",
    "flashinfer.quantization.fp4_quantization",
    "flashinfer.fp4_quantization",
)
CONSUMERS: tuple[str, ...] = ("fa2_decode", "fa2_prefill", "xqa_decode", "trtllm_gen")
PATCH_IDS: tuple[str, ...] = (
    "gate_nvfp4",
    "gate_nvfp4_4over6",
    "gate_combination",
    "metadata_builder",
    "kv_cache_update",
    "forward_reader",
    "register_kv_cache_dtypes",
)
FEATURES: tuple[str, ...] = ("nvfp4_4over6", "head_size_64", "sinks", "kv_rotation")
# Values of NVFP4COMPAT_KV_ROTATION / query(kv_rotation=...) that turn the rotated cache on.
KV_ROTATIONS: tuple[str, ...] = ("hadamard",)
ARCH_RE = re.compile(r"^sm_(?P<major>[1-9][0-9]?)(?P<minor>[0-9])$")


def arch_name(major: int, minor: int) -> str:
    """``(9, 0) -> "sm_90"``."""
    return f"sm_{major}{minor}"


_D = TypeVar("_D", bound=dict[str, Any])


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    @model_validator(mode="after")
    def _evidence_is_not_blank(self) -> _Model:
        # Every claim's evidence must say something: whitespace passes min_length but names nothing.
        for name in type(self).model_fields:
            value = getattr(self, name)
            if "evidence" in name and isinstance(value, str) and not value.strip():
                raise ValueError(f"{name} is blank: name the upstream file:line, PR or repository file behind the claim")
        return self


def _check_version(value: str) -> str:
    try:
        parse_version(value)
    except VersionError as exc:
        raise ValueError(str(exc)) from None
    return value


def _known_keys(v: _D, valid: tuple[str, ...], what: str, where: str = "") -> _D:
    """``v`` when every key of it is in ``valid``; else the error that names the unknown ones."""
    unknown = sorted(set(v) - set(valid))
    if unknown:
        raise ValueError(f"{where}unknown {what}(s) {unknown}; valid values are {list(valid)}")
    return v


def _exact_keys(v: _D, valid: tuple[str, ...], what: str) -> _D:
    """``v`` when its keys are exactly ``valid``; else the error that names both."""
    if set(v) != set(valid):
        raise ValueError(f"{what} must be exactly {list(valid)}, got {sorted(v)}")
    return v


def _check_arch(value: str) -> str:
    if ARCH_RE.match(value) is None:
        raise ValueError(f"invalid arch {value!r}: expected sm_<major><minor> such as sm_90")
    return value


VersionStr = Annotated[str, Field(min_length=1), AfterValidator(_check_version)]
ArchStr = Annotated[str, AfterValidator(_check_arch)]


class BoolClaim(_Model):
    """One yes/no fact with its evidence and status."""

    value: bool
    evidence: str = Field(min_length=1)
    status: Status
    note: str | None = None


# --------------------------------------------------------------------------- arches.yaml


class ArchSpec(_Model):
    """One GPU architecture (``matrix/arches.yaml``)."""

    major: int = Field(ge=1, le=99)
    minor: int = Field(ge=0, le=9)
    family: str = Field(min_length=1)
    vllm_family: int
    gpus: list[str]
    native_e2m1: BoolClaim
    hw_e4m3: BoolClaim
    trtllm_gen_fmha: BoolClaim
    xqa_nvfp4: BoolClaim
    fa2_nvfp4_read: BoolClaim
    native_trtllm_path: BoolClaim
    triton_kernels: BoolClaim

    @property
    def cc(self) -> int:
        return self.major * 10 + self.minor

    @property
    def name(self) -> str:
        return arch_name(self.major, self.minor)


# ----------------------------------------------------------------------- flashinfer.yaml


class HelperSpec(_Model):
    """Presence, export locations, signature and SM gate of one FlashInfer NVFP4 helper.

    ``compute_capability`` with ``capability_source: decorator`` is the exact SM set of the
    helper's ``@supported_compute_capability`` check (``helper.is_compute_capability_supported``);
    with ``jit_min_arch`` it is one value, the minimum SM its JIT module builds for.
    ``params`` lists the signature as ``name`` or ``name=<default repr>``.
    """

    present: bool
    defined_at: str | None = None
    exports: list[str] = Field(default_factory=list)
    params: list[str] | None = None
    compute_capability: list[int] | None = None
    capability_source: Literal["decorator", "jit_min_arch"] | None = None
    capability_evidence: str | None = None
    evidence: str = Field(min_length=1)
    status: Status

    @field_validator("exports")
    @classmethod
    def _exports_known(cls, v: list[str]) -> list[str]:
        for m in v:
            if m not in EXPORT_MODULES:
                raise ValueError(f"unknown export module {m!r}; valid values are {list(EXPORT_MODULES)}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> HelperSpec:
        if self.present:
            missing = [f for f in ("defined_at", "params") if getattr(self, f) is None]
            if missing or not self.exports:
                raise ValueError(f"a present helper needs defined_at, exports and params; missing {missing or ['exports']}")
            if (self.compute_capability is None) != (self.capability_source is None) or (self.compute_capability is None) != (self.capability_evidence is None):
                raise ValueError("compute_capability, capability_source and capability_evidence go together")
            if self.capability_source == "jit_min_arch" and self.compute_capability is not None and len(self.compute_capability) != 1:
                raise ValueError("capability_source jit_min_arch takes one value: the minimum SM (e.g. [75])")
        elif self.exports or self.defined_at or self.params or self.compute_capability:
            raise ValueError("an absent helper (present: false) must not list defined_at, exports, params or compute_capability")
        return self


class ConsumerSpec(_Model):
    """Which SMs one FlashInfer attention path reads an NVFP4 paged cache on."""

    sms: list[int]
    message: str | None = None
    evidence: str = Field(min_length=1)
    status: Status


class RaggedPrefillSpec(_Model):
    """FlashInfer's ``BatchPrefillWithRaggedKVCacheWrapper(backend="fa3"/"fa2")`` over a bf16/fp16
    ragged KV (what the ``dequant_fa3`` / ``dequant_fa2`` prefill attends with): the SMs it builds
    for, the head dims claimed for it, and whether its run takes attention sinks."""

    sms: list[int]
    head_dims: list[int]
    sinks: bool
    evidence: str = Field(min_length=1)
    status: Status


class FourOverSixSpec(_Model):
    """The ``nvfp4_4over6`` option: a parameter of the slot-mapping writer, and the config class."""

    writer_param: bool
    config_exports: list[str]
    evidence: str = Field(min_length=1)
    status: Status


class ScaleCheckSpec(_Model):
    """How the slot-mapping writer validates a CUDA global-scale tensor."""

    mode: Literal["host_sync", "device_trap", "n/a"]
    evidence: str = Field(min_length=1)
    status: Status


class VersionCheckSpec(_Model):
    """``flashinfer/jit/env.py``: what a mismatched flashinfer-cubin / flashinfer-jit-cache does at import."""

    on_mismatch: Literal["raise", "warn"]
    cubin_match: Literal["exact"]
    jit_cache_match: Literal["prefix", "exact_or_local"]
    message: str = Field(min_length=1)
    evidence: str = Field(min_length=1)
    status: Status

    @field_validator("message")
    @classmethod
    def _placeholders(cls, v: str) -> str:
        for ph in ("{installed}", "{flashinfer}"):
            if ph not in v:
                raise ValueError(f"message must contain the placeholder {ph}")
        return v


class CpuImportSpec(_Model):
    """Whether ``import flashinfer`` works on a CPU-only torch, and with which dependency set."""

    default_deps: Literal["ok", "fails"]
    default_deps_reason: str = Field(min_length=1)
    default_deps_status: Status
    requirements: list[str]
    requirements_status: Status
    evidence: str = Field(min_length=1)


class FlashInferRelease(_Model):
    """One flashinfer-python release (``matrix/flashinfer.yaml``)."""

    version: VersionStr
    evidence: str = Field(min_length=1)
    helpers: dict[str, HelperSpec]
    nvfp4_4over6: FourOverSixSpec
    consumers: dict[str, ConsumerSpec]
    # None: not recorded for this release (the probe of the installed package decides)
    fa3_ragged: RaggedPrefillSpec | None = None
    fa2_ragged: RaggedPrefillSpec | None = None
    scale_check: ScaleCheckSpec
    version_check: VersionCheckSpec
    cpu_import: CpuImportSpec
    notes: str | None = None

    @field_validator("helpers")
    @classmethod
    def _all_helpers(cls, v: dict[str, HelperSpec]) -> dict[str, HelperSpec]:
        _known_keys(v, HELPERS, "helper")
        missing = [h for h in HELPERS if h not in v]
        if missing:
            raise ValueError(f"every release must state every helper; missing {missing}")
        return v

    @field_validator("consumers")
    @classmethod
    def _all_consumers(cls, v: dict[str, ConsumerSpec]) -> dict[str, ConsumerSpec]:
        if set(v) != set(CONSUMERS):
            raise ValueError(f"consumers must be exactly {list(CONSUMERS)}, got {sorted(v)}")
        return v

    @property
    def parsed(self) -> Version:
        return parse_version(self.version)


# ------------------------------------------------------------------- implementations.yaml


class Requirement(_Model):
    """One requirement of an implementation, evaluated by the resolver against the facts.

    Kinds:

    - ``flashinfer_helper``: FlashInfer is installed, ``helper`` is present (probe or matrix)
      and the arch is in the helper's compute-capability set;
    - ``flashinfer_helper_param``: ``helper`` has the parameter ``param``;
    - ``flashinfer_consumer``: the FlashInfer release's ``consumer`` reads NVFP4 on this arch;
    - ``arch_flag``: the ``arches.yaml`` claim ``flag`` is true for this arch;
    - ``triton``: Triton is installed and not disabled (``NVFP4COMPAT_DISABLE_TRITON``);
    - ``trtllm_gen_usable``: FlashInfer's trtllm-gen kernels (cubins) can be used;
    - ``vllm_native_path``: vLLM is installed and its stock NVFP4 path on this arch is native;
    - ``vllm_dtype``: the vLLM release lists ``dtype`` as a KV-cache dtype (no vLLM: satisfied);
    - ``not_in_vllm``: satisfied only when no vLLM is in the facts; ``reason`` says why;
    - ``flashinfer_fa3_ragged``: the FlashInfer release has the FA3 ragged prefill wrapper for this arch
      (``fa3_ragged`` in flashinfer.yaml, else the probe of the installed package);
    - ``flashinfer_fa2_ragged``: the same for the FA2 ragged prefill wrapper (``fa2_ragged``).
    """

    kind: Literal[
        "flashinfer_helper",
        "flashinfer_helper_param",
        "flashinfer_consumer",
        "arch_flag",
        "triton",
        "trtllm_gen_usable",
        "vllm_native_path",
        "vllm_dtype",
        "not_in_vllm",
        "flashinfer_fa3_ragged",
        "flashinfer_fa2_ragged",
    ]
    helper: str | None = None
    param: str | None = None
    consumer: str | None = None
    flag: str | None = None
    dtype: str | None = None
    reason: str | None = None

    @model_validator(mode="after")
    def _fields_for_kind(self) -> Requirement:
        needs = {
            "flashinfer_helper": ("helper",),
            "flashinfer_helper_param": ("helper", "param"),
            "flashinfer_consumer": ("consumer",),
            "arch_flag": ("flag",),
            "vllm_dtype": ("dtype",),
            "not_in_vllm": ("reason",),
        }.get(self.kind, ())
        given = {f for f in ("helper", "param", "consumer", "flag", "dtype", "reason") if getattr(self, f) is not None}
        missing = [f for f in needs if f not in given]
        extra = sorted(given - set(needs))
        if missing or extra:
            raise ValueError(f"requirement kind {self.kind!r} takes exactly {list(needs)}; missing {missing}, unexpected {extra}")
        if self.helper is not None and self.helper not in HELPERS:
            raise ValueError(f"unknown helper {self.helper!r}; valid values are {list(HELPERS)}")
        if self.consumer is not None and self.consumer not in CONSUMERS:
            raise ValueError(f"unknown consumer {self.consumer!r}; valid values are {list(CONSUMERS)}")
        if self.flag is not None and self.flag not in ArchSpec.model_fields:
            raise ValueError(f"unknown arch flag {self.flag!r}")
        return self


class ImplSpec(_Model):
    """One implementation of one op: what it is and what it needs."""

    summary: str = Field(min_length=1)
    requires: list[Requirement]
    evidence: str = Field(min_length=1)
    status: Status


class OpSpec(_Model):
    summary: str = Field(min_length=1)
    required: bool
    impls: dict[str, ImplSpec]

    @field_validator("impls")
    @classmethod
    def _impl_names(cls, v: dict[str, ImplSpec]) -> dict[str, ImplSpec]:
        return _known_keys(v, IMPLS, "implementation")


class PreferenceOrder(_Model):
    order: list[Impl] = Field(min_length=1)
    reason: str = Field(min_length=1)
    status: Status

    @field_validator("order")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"an impl is listed twice in {v}")
        return v


class PreferenceEntry(_Model):
    """The preference order of the implementations per op, for one arch family."""

    family: str = Field(min_length=1)
    arches: list[ArchStr]
    write: PreferenceOrder
    dequant: PreferenceOrder
    decode: PreferenceOrder
    prefill: PreferenceOrder

    def order(self, op: str) -> PreferenceOrder:
        return getattr(self, op)


class FeatureSpec(_Model):
    """An optional capability (4over6 writes, head_size 64, attention sinks) per op and impl."""

    summary: str = Field(min_length=1)
    ops: dict[str, dict[str, list[Requirement]]]
    evidence: str = Field(min_length=1)
    status: Status

    @field_validator("ops")
    @classmethod
    def _names(cls, v: dict[str, dict[str, list[Requirement]]]) -> dict[str, dict[str, list[Requirement]]]:
        for op, per_impl in v.items():
            if op not in OPS:
                raise ValueError(f"unknown op {op!r}; valid ops are {list(OPS)}")
            _known_keys(per_impl, IMPLS, "implementation", f"{op}: ")
        return v


class GroupSpec(_Model):
    ops: list[Op]
    rule: Literal["all_or_none"]
    reason: str = Field(min_length=1)


class UnknownArchTriton(_Model):
    """Where the bundled Triton kernels are plausible on an arch ``arches.yaml`` does not list."""

    min_major: int = Field(ge=1)
    excluded_majors: list[int]
    reason: str = Field(min_length=1)
    evidence: str = Field(min_length=1)
    status: Status

    def plausible(self, major: int | None) -> bool:
        """Whether an unknown arch of compute-capability ``major`` may run the Triton kernels."""
        return major is not None and major >= self.min_major and major not in self.excluded_majors


class Implementations(_Model):
    ops: dict[str, OpSpec]
    features: dict[str, FeatureSpec]
    groups: dict[str, GroupSpec]
    preferences: list[PreferenceEntry]
    unknown_arch_preference: PreferenceEntry
    unknown_arch_triton: UnknownArchTriton

    def flashinfer_helper(self, op: str) -> str | None:
        """The FlashInfer helper the ``flashinfer`` implementation of ``op`` calls: its
        ``flashinfer_helper`` requirement (None when it has none, e.g. the FA2 readers)."""
        spec = self.ops[op].impls.get("flashinfer")
        found = [r.helper for r in (spec.requires if spec is not None else []) if r.kind == "flashinfer_helper"]
        return found[0] if found else None

    @field_validator("ops")
    @classmethod
    def _all_ops(cls, v: dict) -> dict:
        return _exact_keys(v, OPS, "ops")

    @field_validator("groups")
    @classmethod
    def _group_names(cls, v: dict[str, GroupSpec]) -> dict[str, GroupSpec]:
        return _known_keys(v, IMPLS, "implementation group")

    @field_validator("features")
    @classmethod
    def _known_features(cls, v: dict) -> dict:
        return _known_keys(v, FEATURES, "feature")


# ----------------------------------------------------------------------------- vllm.yaml


class UnpublishedPin(_Model):
    """A pin whose release is not on the package index (``pip install vllm==X`` fails on it)."""

    pin: Literal["torch", "flashinfer_python", "flashinfer_cubin"]
    evidence: str = Field(min_length=1)
    status: Status
    install_instead: VersionStr


class Pins(_Model):
    torch: VersionStr
    flashinfer_python: VersionStr
    flashinfer_cubin: VersionStr | None = None
    unpublished: list[UnpublishedPin] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unpublished_once(self) -> Pins:
        names = [u.pin for u in self.unpublished]
        if len(set(names)) != len(names):
            raise ValueError(f"unpublished: each pin may be listed once, got {names}")
        for name in names:
            if getattr(self, name) is None:
                raise ValueError(f"unpublished: pin {name!r} is listed but not set")
        return self

    def unpublished_pin(self, name: str) -> UnpublishedPin | None:
        """The :class:`UnpublishedPin` for ``name`` (``"flashinfer_python"``, ...), or None."""
        return next((u for u in self.unpublished if u.pin == name), None)


class StockPath(_Model):
    """How stock vLLM (no plugin) serves an NVFP4 KV cache on some arches."""

    arches: list[ArchStr]
    path: Literal["native", "fa2"]
    writer: Literal["native", "flashinfer"]
    reader: Literal["native", "flashinfer"]
    requires_trtllm_gen: bool
    kv_cache_dtypes: list[str]
    refuses: list[Literal["head_size_64", "sinks"]] = Field(default_factory=list)
    evidence: str = Field(min_length=1)
    status: Status


class GateSpec(_Model):
    kind: Literal["fam100_trtllm", "fa2_families"]
    description: str = Field(min_length=1)
    evidence: str = Field(min_length=1)
    status: Status


class CodePath(_Model):
    name: str = Field(min_length=1)
    evidence: str = Field(min_length=1)
    status: Status


class DtypeRegistry(_Model):
    """A vLLM release's API for ``--kv-cache-dtype`` names registered at run time (``vllm.yaml``)."""

    api: str = Field(min_length=1)  # dotted path of the registering function
    evidence: str = Field(min_length=1)
    status: Status


class RotatedDtype(_Model):
    """A ``--kv-cache-dtype`` name of nvfp4compat's own that turns on a rotated cache (``vllm.yaml``)."""

    name: str = Field(pattern=r"^nvfp4[a-z0-9_]*$")  # vLLM treats every nvfp4* name as the NVFP4 page layout
    base: Literal["nvfp4", "nvfp4_4over6"]
    kv_rotation: str


class UserError(_Model):
    text: str = Field(min_length=1)
    when: str = Field(min_length=1)
    evidence: str = Field(min_length=1)
    status: Status


class DecodeGraphs(_Model):
    """FULL CUDA graphs over the plugin's decode reader in this vLLM release, on ``arches``: the
    plugin's builder answers ``UNIFORM_SINGLE_TOKEN_DECODE`` where this is ``verified`` (else
    ``NEVER``: attention runs eagerly between piecewise graphs)."""

    arches: list[ArchStr] = Field(min_length=1)
    evidence: str = Field(min_length=1)
    status: Status
    # the writers the verification ran with (the KV write is captured in the same graph): a plan that
    # routes the write elsewhere, or leaves vLLM's own writer, is not covered. None: any writer
    writers: list[Impl] | None = Field(default=None, min_length=1)


class PluginImpls(_Model):
    """Which of our implementations the plugin can bind inside this vLLM release."""

    write: list[Impl]
    decode: list[Impl]
    prefill: list[Impl]
    reason: str = Field(min_length=1)
    status: Status
    full_decode_graphs: DecodeGraphs | None = None


class StrategySpec(_Model):
    backport: list[str] = Field(default_factory=list)
    extend: list[str] = Field(default_factory=list)
    native: list[str] = Field(default_factory=list)
    none: list[str] = Field(default_factory=list)
    native_fallback: Literal["backport"] = "backport"
    evidence: str = Field(min_length=1)
    status: Status

    @model_validator(mode="after")
    def _disjoint(self) -> StrategySpec:
        seen: dict[str, str] = {}
        for name in ("backport", "extend", "native", "none"):
            for a in getattr(self, name):
                _check_arch(a)
                if a in seen:
                    raise ValueError(f"arch {a} is listed under both {seen[a]!r} and {name!r}")
                seen[a] = name
        return self

    def for_arch(self, arch: str) -> str | None:
        for name in ("backport", "extend", "native", "none"):
            if arch in getattr(self, name):
                return name
        return None


class VllmRelease(_Model):
    """One vLLM release (``matrix/vllm.yaml``)."""

    version: VersionStr
    evidence: str = Field(min_length=1)
    status: Status
    pins: Pins
    requires_python: str
    nvfp4_dtypes: list[str]
    compute_capability_window: list[int]
    gate: GateSpec
    writer: CodePath
    reader: CodePath
    stock: list[StockPath]
    errors: list[UserError]
    requires_flashinfer_helpers: list[str]
    plugin: PluginImpls
    strategy: StrategySpec
    # where the release lets a plugin register --kv-cache-dtype names (the rotated cache's own names)
    kv_cache_dtype_registry: DtypeRegistry | None = None
    notes: str | None = None

    @field_validator("compute_capability_window")
    @classmethod
    def _window(cls, v: list[int]) -> list[int]:
        if len(v) != 2 or v[0] > v[1]:
            raise ValueError(f"compute_capability_window must be [low, high] with low <= high, got {v}")
        return v

    @property
    def parsed(self) -> Version:
        return parse_version(self.version)

    def stock_for(self, arch: str) -> StockPath | None:
        for s in self.stock:
            if arch in s.arches:
                return s
        return None


class PatchSpec(_Model):
    summary: str = Field(min_length=1)
    applies_when: str = Field(min_length=1)
    # the --kv-cache-dtype the patched gate accepts on top of vLLM's own answer (gate patches)
    accepts: str | None = None


class Combination(_Model):
    """A known (or expected) working install of a vLLM release with another FlashInfer release."""

    vllm: VersionStr
    flashinfer: VersionStr
    why: str = Field(min_length=1)
    status: Status
    evidence: str = Field(min_length=1)


class IndexCheck(_Model):
    """The newest release seen on the package index, and when: anything newer is unreleased as of ``date``."""

    newest: VersionStr
    date: datetime.date
    evidence: str = Field(min_length=1)


class RoutedReaders(_Model):
    """The readers the plugin serves with nvfp4compat's own kernels inside vLLM (``vllm.yaml``).

    A phase bound to one of ``impls`` is routed to nvfp4compat (``VllmRoute.read``); a phase bound
    to another reader (``flashinfer``) stays on vLLM's own FA2 reader, which only an ``extend``
    strategy has: a ``backport`` binds its readers from ``impls`` only.
    """

    impls: list[Impl]
    reason: str = Field(min_length=1)
    evidence: str = Field(min_length=1)
    status: Status


class VllmFile(_Model):
    patches: dict[str, PatchSpec]
    backport_patches: list[str]
    routed_readers: RoutedReaders
    # the rotated cache's own --kv-cache-dtype names, registered where a release has the registry
    rotated_kv_cache_dtypes: list[RotatedDtype] = Field(default_factory=list)
    index_checked: IndexCheck
    releases: list[VllmRelease]
    combinations: list[Combination]

    @field_validator("patches")
    @classmethod
    def _patch_ids(cls, v: dict) -> dict:
        return _exact_keys(v, PATCH_IDS, "patches")


# --------------------------------------------------------------------------- errors.yaml


class ErrorEntry(_Model):
    """A known error message, its cause and its fix (``nvfp4compat doctor --explain``)."""

    id: str = Field(min_length=1)
    match: list[str] = Field(min_length=1)
    regex: bool = False
    source: str = Field(min_length=1)
    cause: str = Field(min_length=1)
    fix: str = Field(min_length=1)
    evidence: str = Field(min_length=1)
    status: Status

    @model_validator(mode="after")
    def _regex_compiles(self) -> ErrorEntry:
        if self.regex:
            for pat in self.match:
                try:
                    re.compile(pat)
                except re.error as exc:
                    raise ValueError(f"match pattern {pat!r} is not a valid regex: {exc}") from None
        return self


# ----------------------------------------------------------------------------- the whole


class Matrix(_Model):
    """The whole capability matrix, validated across files."""

    arches: dict[str, ArchSpec]
    flashinfer: list[FlashInferRelease]
    flashinfer_index_checked: IndexCheck | None = None
    vllm: VllmFile
    implementations: Implementations
    errors: list[ErrorEntry]

    @model_validator(mode="after")
    def _cross_file(self) -> Matrix:
        problems: list[str] = []
        for name, spec in self.arches.items():
            if ARCH_RE.match(name) is None or spec.name != name:
                problems.append(f"arches.yaml: {name}: key must equal sm_<major><minor> of the entry ({spec.name})")
        known_arches = set(self.arches)
        fi_versions = [r.version for r in self.flashinfer]
        if len(set(fi_versions)) != len(fi_versions):
            problems.append(f"flashinfer.yaml: releases: duplicate version in {fi_versions}")
        parsed = [parse_version(v) for v in fi_versions]
        if parsed != sorted(parsed):
            problems.append("flashinfer.yaml: releases: must be sorted by version, oldest first")
        fi_set = {parse_version(v) for v in fi_versions}
        fic = self.flashinfer_index_checked
        if fic is not None and parsed and parse_version(fic.newest) < max(parsed):
            problems.append(
                f"flashinfer.yaml: index_checked.newest: {fic.newest} is older than the newest release in the file "
                f"({fi_versions[-1]}); re-check the index and update newest and date"
            )
        vl = [r.version for r in self.vllm.releases]
        if len(set(vl)) != len(vl):
            problems.append(f"vllm.yaml: releases: duplicate version in {vl}")
        if [parse_version(v) for v in vl] != sorted(parse_version(v) for v in vl):
            problems.append("vllm.yaml: releases: must be sorted by version, oldest first")
        for bp in self.vllm.backport_patches:
            if bp not in PATCH_IDS:
                problems.append(f"vllm.yaml: backport_patches: unknown patch {bp!r}; valid values are {list(PATCH_IDS)}")
        names = [d.name for d in self.vllm.rotated_kv_cache_dtypes]
        if len(set(names)) != len(names):
            problems.append(f"vllm.yaml: rotated_kv_cache_dtypes: duplicate name in {names}")
        for rd in self.vllm.rotated_kv_cache_dtypes:
            if rd.kv_rotation not in KV_ROTATIONS:
                problems.append(f"vllm.yaml: rotated_kv_cache_dtypes[{rd.name}]: kv_rotation {rd.kv_rotation!r} is not one of {list(KV_ROTATIONS)}")
            if any(rd.name in r.nvfp4_dtypes for r in self.vllm.releases):
                problems.append(f"vllm.yaml: rotated_kv_cache_dtypes[{rd.name}]: a vLLM release lists that name itself; pick another")
        for r in self.vllm.releases:
            where = f"vllm.yaml: releases[{r.version}]"
            for u in r.pins.unpublished:
                if u.pin.startswith("flashinfer") and parse_version(getattr(r.pins, u.pin)) in fi_set:
                    problems.append(
                        f"{where}: pins.unpublished: {u.pin} {getattr(r.pins, u.pin)} is listed as unpublished but "
                        "flashinfer.yaml has that release; drop it from unpublished"
                    )
                if u.pin.startswith("flashinfer") and parse_version(u.install_instead) not in fi_set:
                    problems.append(
                        f"{where}: pins.unpublished: install_instead {u.install_instead} is not a release in flashinfer.yaml; "
                        f"known releases are {fi_versions}"
                    )
            if r.pins.unpublished_pin("flashinfer_python") is None and parse_version(r.pins.flashinfer_python) not in fi_set:
                problems.append(
                    f"{where}: pins.flashinfer_python: vLLM {r.version} pins flashinfer-python=={r.pins.flashinfer_python}, "
                    f"which flashinfer.yaml does not know; known releases are {fi_versions}"
                )
            if (
                r.pins.flashinfer_cubin is not None
                and r.pins.unpublished_pin("flashinfer_cubin") is None
                and parse_version(r.pins.flashinfer_cubin) not in fi_set
            ):
                problems.append(f"{where}: pins.flashinfer_cubin: {r.pins.flashinfer_cubin} is not a release in flashinfer.yaml")
            for h in r.requires_flashinfer_helpers:
                if h not in HELPERS:
                    problems.append(f"{where}: requires_flashinfer_helpers: unknown helper {h!r}; valid values are {list(HELPERS)}")
            arches_used = [a for s in r.stock for a in s.arches]
            arches_used += r.strategy.backport + r.strategy.extend + r.strategy.native + r.strategy.none
            for a in arches_used:
                if a not in known_arches:
                    problems.append(f"{where}: arch {a} is not in arches.yaml ({sorted(known_arches)})")
            for s in r.stock:
                for d in s.kv_cache_dtypes:
                    if d not in r.nvfp4_dtypes:
                        problems.append(f"{where}: stock: dtype {d!r} is not in nvfp4_dtypes {r.nvfp4_dtypes}")
            unassigned = sorted(known_arches - set(r.strategy.backport + r.strategy.extend + r.strategy.native + r.strategy.none))
            if unassigned:
                problems.append(f"{where}: strategy: arches {unassigned} have no strategy; list each arch of arches.yaml once")
        newest = parse_version(self.vllm.index_checked.newest)
        if vl and newest < max(parse_version(v) for v in vl):
            problems.append(
                f"vllm.yaml: index_checked.newest: {newest} is older than the newest release in the file ({vl[-1]}); "
                "re-check the index and update newest and date"
            )
        for c in self.vllm.combinations:
            if parse_version(c.flashinfer) not in fi_set:
                problems.append(f"vllm.yaml: combinations: flashinfer {c.flashinfer} is not a release in flashinfer.yaml")
            if parse_version(c.vllm) not in {parse_version(v) for v in vl}:
                problems.append(f"vllm.yaml: combinations: vllm {c.vllm} is not a release in vllm.yaml")
        impl = self.implementations
        covered: dict[str, str] = {}
        for p in impl.preferences:
            for a in p.arches:
                if a not in known_arches:
                    problems.append(f"implementations.yaml: preferences[{p.family}]: arch {a} is not in arches.yaml")
                if a in covered:
                    problems.append(f"implementations.yaml: preferences: arch {a} is in both {covered[a]!r} and {p.family!r}")
                covered[a] = p.family
            for op in OPS:
                for i in p.order(op).order:
                    if i not in impl.ops[op].impls:
                        problems.append(f"implementations.yaml: preferences[{p.family}].{op}: impl {i!r} is not an implementation of {op} ({sorted(impl.ops[op].impls)})")
        missing_pref = sorted(known_arches - set(covered))
        if missing_pref:
            problems.append(f"implementations.yaml: preferences: arches {missing_pref} have no preference entry")
        ids = [e.id for e in self.errors]
        if len(set(ids)) != len(ids):
            problems.append(f"errors.yaml: duplicate id in {ids}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    # -- lookups ---------------------------------------------------------------------------

    def flashinfer_release(self, version: str) -> FlashInferRelease | None:
        """The entry whose version equals ``version`` (public part), or None."""
        v = public_version(version)
        for r in self.flashinfer:
            if r.parsed == v:
                return r
        return None

    def vllm_release(self, version: str) -> VllmRelease | None:
        v = public_version(version)
        for r in self.vllm.releases:
            if r.parsed == v:
                return r
        return None

    def nearest_flashinfer(self, version: str) -> FlashInferRelease | None:
        """The newest known release not newer than ``version`` (None if older than all)."""
        v = public_version(version)
        best = None
        for r in self.flashinfer:
            if r.parsed <= v:
                best = r
        return best

    def nearest_vllm(self, version: str) -> VllmRelease | None:
        v = public_version(version)
        best = None
        for r in self.vllm.releases:
            if r.parsed <= v:
                best = r
        return best

    def releases_with_helper(self, helper: str) -> list[str]:
        return [r.version for r in self.flashinfer if r.helpers[helper].present]

    def preference_for(self, arch: str) -> PreferenceEntry:
        for p in self.implementations.preferences:
            if arch in p.arches:
                return p
        return self.implementations.unknown_arch_preference
