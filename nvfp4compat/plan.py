"""The resolved plan: which implementation each operation is bound to, and why.

A :class:`Plan` is produced by :func:`nvfp4compat.resolver.resolve` and consumed by
``nvfp4compat.kernels.get_kernel(op, impl)`` (``Plan.bindings``) and the vLLM plugin
(``Plan.vllm``). It renders as text (:meth:`Plan.render_text`) and JSON (:meth:`Plan.to_json`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nvfp4compat.facts import SystemFacts
from nvfp4compat.spec import Impl, Strategy

__all__ = ["Binding", "Plan", "TraceEntry", "VllmPlan", "VllmRoute", "check_rotation_bindings"]

Source = Literal["argument", "environment", "matrix", "probe", "fallback"]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Binding(_Frozen):
    """The implementation bound to one op.

    Attributes
    ----------
    op : str
        ``write``, ``dequant``, ``decode`` or ``prefill``.
    impl : {"native", "flashinfer", "triton"} or None
        None when nothing can run this op (``reason`` says why).
    source : {"argument", "environment", "matrix", "probe", "fallback"}
        What decided it: an explicit argument, ``NVFP4COMPAT_IMPL``, the matrix preference,
        a probe of an installed release the matrix does not know, or a fallback after the
        preferred implementation was rejected.
    reason : str
        Why this implementation (or why none).
    options : dict
        Per-implementation options, e.g. ``{"nvfp4_4over6": true}`` for ``write``;
        ``{"kv_rotation": "hadamard"}`` on every bound op of a rotated cache.
    """

    op: str
    impl: Impl | None
    source: Source
    reason: str
    options: dict[str, Any] = Field(default_factory=dict)


def check_rotation_bindings(bindings: Mapping[str, Any]) -> str | None:
    """The KV rotation every bound op of ``bindings`` agrees on (None: unrotated).

    A cache written rotated is never read unrotated, nor the reverse: every bound op (``write``,
    ``dequant``, ``decode``, ``prefill``) must carry the same ``options["kv_rotation"]``.

    Raises
    ------
    ValueError
        When two bound ops disagree (the message names both).
    """
    seen: dict[str, str | None] = {}
    for op, b in bindings.items():
        if getattr(b, "impl", None) is None:
            continue
        seen[op] = (getattr(b, "options", None) or {}).get("kv_rotation")
    kinds = set(seen.values())
    if len(kinds) > 1:
        detail = ", ".join(f"{op}={kind or 'unrotated'}" for op, kind in seen.items())
        raise ValueError(
            f"the bindings disagree on the KV rotation ({detail}): a cache written rotated is never "
            "read unrotated. Way out: resolve the plan again (resolve() sets the rotation on every op)"
        )
    return next(iter(kinds)) if kinds else None


class VllmRoute(_Frozen):
    """What the vLLM plugin does for NVFP4 KV-cache layers in a process: the whole decision.

    Computed once by the resolver (``resolver._vllm_route``); the plugin applies it as it is and
    the backend subclasses consult it at every decision. ``nvfp4compat query`` prints it
    (:meth:`describe`), so what the query says is what the plugin does.

    Attributes
    ----------
    strategy : {"backport", "extend"} or the plan's strategy for a refusal
        Copied from :attr:`VllmPlan.strategy`.
    patches : list[str]
        Patch ids applied, in ``PATCH_IDS`` order (empty for a refusal).
    accept : list[str]
        ``--kv-cache-dtype`` values the patched FLASHINFER gate accepts on top of vLLM's own answer.
    combination : bool
        head_size 64 and attention sinks are accepted for NVFP4 (the Triton readers serve them).
    own_builder : bool
        NVFP4 layers get nvfp4compat's metadata builder (block table, seq_lens, query_start_loc,
        decode/prefill split): with ``metadata_builder``, or whenever both phases are read by
        nvfp4compat.
    write : str or None
        The implementation the KV write is routed to; None leaves vLLM's own writer.
    write_4over6 : bool
        The bound writer implements the ``nvfp4_4over6`` scale search.
    read : dict[str, str]
        ``{"decode": impl, "prefill": impl}`` for the phases routed to nvfp4compat's readers; a
        phase absent from it stays on vLLM's own reader.
    kv_rotation : str or None
        ``"hadamard"``: the routed writer and both readers are wrapped with the rotation.
    kv_cache_dtype : str or None
        Set on a route of :attr:`VllmPlan.dtype_routes`: the ``--kv-cache-dtype`` name of its own this route
        serves (e.g. ``nvfp4_hadamard``), registered with vLLM by the ``register_kv_cache_dtypes`` patch.
    base_dtype : str or None
        With ``kv_cache_dtype``: the NVFP4 format under it (``nvfp4`` or ``nvfp4_4over6``).
    full_decode_graphs : bool
        The metadata builder lets vLLM capture uniform decode batches in FULL CUDA graphs
        (``UNIFORM_SINGLE_TOKEN_DECODE``) over the routed decode reader; False: ``NEVER``, attention
        runs eagerly between piecewise graphs.
    refusal : str or None
        When set, NVFP4 is refused in the process with this text: the gate reports it as the
        validation reason and the builder/impl constructors raise it (engine start, never
        mid-request).
    """

    strategy: Strategy
    patches: list[str]
    accept: list[str] = Field(default_factory=list)
    combination: bool = False
    own_builder: bool = False
    write: Impl | None = None
    write_4over6: bool = False
    read: dict[str, Impl] = Field(default_factory=dict)
    kv_rotation: str | None = None
    kv_cache_dtype: str | None = None
    base_dtype: str | None = None
    full_decode_graphs: bool = False
    refusal: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> VllmRoute:
        if self.refusal is not None:
            return self
        if self.kv_rotation is not None and (self.write is None or not self.reads_all):
            raise ValueError(
                f"the route rotates the KV cache ({self.kv_rotation}) but leaves the writer or a reader to "
                f"vLLM (write={self.write}, read={self.read}); vLLM's own code would read a rotated cache "
                "unrotated. Way out: unset NVFP4COMPAT_KV_ROTATION"
            )
        if (self.kv_cache_dtype is None) != (self.base_dtype is None):
            raise ValueError(f"a dtype route names both its kv_cache_dtype and base_dtype, got {self.kv_cache_dtype!r} / {self.base_dtype!r}")
        if self.kv_cache_dtype is not None and self.kv_cache_dtype not in self.accept:
            raise ValueError(f"the route for --kv-cache-dtype {self.kv_cache_dtype} must accept it at the gate; accept={self.accept}")
        if self.full_decode_graphs and "decode" not in self.read:
            raise ValueError(f"FULL decode graphs are answered for nvfp4compat's decode reader only; read={self.read}")
        if self.combination and not self.reads_all:
            raise ValueError(f"gate_combination (head_size 64, sinks) needs both readers routed; read={self.read}")
        if self.strategy == "backport" and not self.reads_all:
            raise ValueError(
                f"a backport route reads with nvfp4compat's readers only (its builder plans no FlashInfer "
                f"wrapper); read={self.read}"
            )
        return self

    def handles(self, kv_cache_dtype: str | None) -> bool:
        """Whether layers with this ``kv_cache_dtype`` are NVFP4 layers this route acts on (a dtype route:
        only layers of its own name)."""
        text = str(kv_cache_dtype or "")
        if self.kv_cache_dtype is not None:
            return text == self.kv_cache_dtype
        return text.startswith("nvfp4") and not text.endswith("_ds_mla")

    def is_4over6(self, kv_cache_dtype: str | None) -> bool:
        """Whether layers of ``kv_cache_dtype`` are written with the ``nvfp4_4over6`` scale search."""
        return (self.base_dtype or str(kv_cache_dtype or "")) == "nvfp4_4over6"

    @property
    def reads_all(self) -> bool:
        """Both decode and prefill are served by nvfp4compat's readers."""
        return "decode" in self.read and "prefill" in self.read

    def describe(self) -> str:
        """One line: what the plugin does (``nvfp4compat query`` and the plugin's log print it).

        ``op=vllm`` marks an op left to vLLM's own code (e.g. vLLM 0.33's FlashInfer writer under
        ``extend``).
        """
        if self.refusal is not None:
            return f"refuse --kv-cache-dtype nvfp4 at engine start: {self.refusal}"
        ops = [f"write={self.write or 'vllm'}"]
        ops += [f"{op}={self.read.get(op, 'vllm')}" for op in ("decode", "prefill")]
        extra = ["builder=" + ("nvfp4compat" if self.own_builder else "vllm")]
        if self.accept:
            extra.append("gate accepts " + "/".join(self.accept))
        if self.combination:
            extra.append("head_size 64 and sinks accepted")
        if self.write_4over6:
            extra.append("4over6 scale search")
        if self.kv_rotation is not None:
            extra.append(f"kv_rotation={self.kv_rotation}")
        if self.kv_cache_dtype is not None:
            extra.append(f"for --kv-cache-dtype {self.kv_cache_dtype} ({self.base_dtype}, registered with vLLM)")
        if self.full_decode_graphs:
            extra.append("FULL decode graphs")
        return f"{self.strategy} [{', '.join(self.patches)}]; {', '.join(ops)}; {', '.join(extra)}"


class VllmPlan(_Frozen):
    """How the vLLM plugin applies the plan to the installed vLLM release.

    ``route`` is what the plugin does in the process: None leaves vLLM untouched (strategy
    ``none`` or ``native``, or an ``extend`` whose stock path already is the plan).
    """

    version: str
    strategy: Strategy
    patches: list[str]
    kv_cache_dtypes: list[str]
    reason: str
    route: VllmRoute | None = None
    # --kv-cache-dtype names of nvfp4compat's own (matrix: rotated_kv_cache_dtypes), registered with vLLM
    # where the release has the registry: the route an engine of that dtype takes (a rotated cache)
    dtype_routes: dict[str, VllmRoute] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _route_matches(self) -> VllmPlan:
        for name, dr in self.dtype_routes.items():
            if dr.kv_cache_dtype != name or dr.refusal is not None or name not in self.kv_cache_dtypes:
                raise ValueError(
                    f"vllm.dtype_routes[{name!r}] must serve that name (kv_cache_dtype={dr.kv_cache_dtype!r}), "
                    f"refuse nothing, and be listed in kv_cache_dtypes {self.kv_cache_dtypes}"
                )
        r = self.route
        if r is None or r.refusal is not None:
            return self
        if r.strategy != self.strategy or r.patches != self.patches:
            raise ValueError(
                f"vllm.route ({r.strategy}, {r.patches}) disagrees with the plan's strategy "
                f"{self.strategy} and patches {self.patches}; resolve the plan again"
            )
        return self


class TraceEntry(_Frozen):
    """One rule the resolver accepted or rejected."""

    op: str | None
    impl: str | None
    rule: str
    accepted: bool
    reason: str


class Plan(_Frozen):
    """The result of :func:`nvfp4compat.resolve`.

    Attributes
    ----------
    facts : SystemFacts
        What the plan was resolved from.
    supported : bool
        Whether an NVFP4 KV cache can be served (every required op bound; with vLLM, a patch
        strategy other than ``none``).
    reason : str or None
        Why not, when not supported.
    bindings : dict[str, Binding]
        One binding per op (``write``, ``dequant``, ``decode``, ``prefill``).
    vllm : VllmPlan or None
        Present when the facts name a vLLM release.
    features : dict[str, bool]
        Optional capabilities the bound implementations provide (``nvfp4_4over6``,
        ``head_size_64``, ``sinks``, ``kv_rotation``), in the vLLM context when vLLM is present.
    kv_rotation : str or None
        ``"hadamard"``: the cache stores ``K @ H`` and ``V @ H`` (``NVFP4COMPAT_KV_ROTATION``); every
        bound op carries it in its options and is wrapped by :mod:`nvfp4compat.kernels.rotation`.
    env : dict[str, str]
        Environment changes to apply before importing FlashInfer (e.g.
        ``FLASHINFER_DISABLE_VERSION_CHECK``).
    warnings, unverified : list[str]
        Remarks, and the releases/arches resolved from probes or nearest knowledge only.
    planned_from : dict[str, str]
        ``{"vllm": "0.34.0"}`` when a release asked about is not in the matrix and the plan was made
        from the nearest known one (the component, and that release): unverified.
    release_warnings : list[str]
        One line per such release, naming the release it was planned from (also in ``warnings``);
        ``nvfp4compat query``/``doctor`` print them as ``WARNING:`` lines, the vLLM plugin logs them.
    trace : list[TraceEntry]
        Every rule accepted or rejected, in order.
    """

    facts: SystemFacts
    supported: bool
    reason: str | None
    bindings: dict[str, Binding]
    vllm: VllmPlan | None
    features: dict[str, bool]
    env: dict[str, str]
    warnings: list[str]
    unverified: list[str]
    planned_from: dict[str, str] = Field(default_factory=dict)
    release_warnings: list[str] = Field(default_factory=list)
    trace: list[TraceEntry]
    nvfp4compat_version: str
    kv_rotation: str | None = None

    @model_validator(mode="after")
    def _rotation_tied(self) -> Plan:
        agreed = check_rotation_bindings(self.bindings)
        if not any(b.impl is not None for b in self.bindings.values()):
            return self  # nothing bound (an unsupported plan): nothing to tie together
        if self.kv_rotation is not None and agreed != self.kv_rotation:
            raise ValueError(
                f"plan.kv_rotation is {self.kv_rotation!r} but the bound ops carry {agreed!r}: "
                "a cache written rotated is never read unrotated"
            )
        if self.kv_rotation is None and agreed is not None:
            raise ValueError(f"the bound ops carry kv_rotation={agreed!r} but plan.kv_rotation is None")
        return self

    def impl(self, op: str) -> str | None:
        """The implementation bound to ``op`` (None when unbound)."""
        return self.bindings[op].impl

    def to_json(self, indent: int | None = 2) -> str:
        """The plan as JSON (``model_dump(mode="json")``)."""
        return json.dumps(self.model_dump(mode="json"), indent=indent, sort_keys=False)

    def render_text(self, *, trace: bool = True) -> str:
        """A human-readable report: verdict, bindings, vLLM patches, env, warnings and trace.

        Each reason is printed once: the verdict's reason omits what the bindings already say, and
        the trace points at the binding instead of repeating an unbound op's reason.
        """
        f = self.facts
        lines: list[str] = []
        arch_unverified = f.arch is not None and any(u.startswith(f"arch {f.arch}:") for u in self.unverified)
        head = "SUPPORTED" if self.supported else "NOT SUPPORTED"
        if arch_unverified:
            head = ("UNVERIFIED" if self.supported else head) + f" ({f.arch} is not in the matrix)"
        elif self.supported and self.planned_from:
            basis = ", ".join(f"{k} {v}" for k, v in self.planned_from.items())
            head = f"UNVERIFIED (planned from the nearest release in the matrix: {basis})"
        lines.append(f"nvfp4compat {self.nvfp4compat_version} plan: {head}")
        shown = {b.reason for b in self.bindings.values() if b.impl is None}
        if self.reason:
            rest = self.reason
            for r in shown:
                rest = rest.replace(r, "")
            rest = "; ".join(p.strip() for p in rest.split("; ") if p.strip())
            if rest:
                lines.append(f"  reason: {rest}")
            if shown:
                lines.append("  (the bindings below say why each op has no implementation)")
        arch = f.arch or "unknown (no GPU)"
        if f.gpu_name:
            arch += f" ({f.gpu_name})"
        notes = list(f.notes)

        def sourced(label: str, value: str | None) -> str | None:
            # "<label> not given: <why>" notes from query() become the label's source.
            for n in notes:
                if value is not None and n.startswith(f"{label} not given: "):
                    notes.remove(n)
                    return f"{value} ({n.split(': ', 1)[1]})"
            return value

        triton = f.triton
        if triton == "any":
            triton = "assumed installed (any release; --no-triton plans without it)"
        elif triton is None:
            triton = "not installed"
        if f.triton_disabled:
            triton += " (disabled by NVFP4COMPAT_DISABLE_TRITON)"
        lines.append("facts:")
        lines.append(f"  arch: {arch}" + (f" [from {f.arch_source}]" if f.arch_source else ""))
        for label, value in (
            ("cuda", f.cuda),
            ("torch", sourced("torch", f.torch)),
            ("triton", triton),
            ("flashinfer", sourced("flashinfer", f.flashinfer) or "not installed"),
            ("flashinfer-cubin", sourced("flashinfer-cubin", f.flashinfer_cubin)),
            ("flashinfer-jit-cache", f.flashinfer_jit_cache),
            ("vllm", f.vllm or "not installed"),
            ("trtllm-gen usable", {True: "yes", False: "no", None: "unknown"}[f.trtllm_gen_usable]),
            ("NVFP4COMPAT_IMPL", f.impl_env),
            ("NVFP4COMPAT_KV_ROTATION", f.kv_rotation_env),
        ):
            if value is not None:
                lines.append(f"  {label}: {value}")
        if f.flashinfer_probe:
            lines.append(f"  flashinfer probe: {f.flashinfer_probe}")
        if f.flashinfer_import_error:
            lines.append(f"  flashinfer import error: {f.flashinfer_import_error}")
        for note in notes:
            lines.append(f"  note: {note}")
        lines.append("bindings:")
        for op, b in self.bindings.items():
            opts = "".join(f" {k}={_option(v)}" for k, v in b.options.items())
            lines.append(f"  {op:8s} -> {b.impl or '(none)':10s} [{b.source}] {b.reason}{opts}")
        if self.features:
            lines.append("features: " + ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in self.features.items()))
        if self.kv_rotation is not None:
            lines.append(
                f"kv_rotation: {self.kv_rotation} (the writer stores K@H and V@H; decode/prefill attend with "
                "Q@H and multiply the output by H; dequant returns the real K/V)"
            )
        if self.vllm is not None:
            v = self.vllm
            lines.append(f"vllm {v.version}: strategy {v.strategy}; patches: {', '.join(v.patches) or '(none)'}; kv_cache_dtypes: {', '.join(v.kv_cache_dtypes) or '(none)'}")
            if v.reason not in (self.reason or ""):
                lines.append(f"  {v.reason}")
            # what the vLLM plugin does with this plan, exactly as it applies it and logs it
            lines.append(f"  plugin: {v.route.describe() if v.route is not None else 'leaves vLLM untouched'}")
            for name, dr in v.dtype_routes.items():
                lines.append(f"  plugin, --kv-cache-dtype {name}: {dr.describe()}")
        if self.env:
            lines.append("env: " + " ".join(f"{k}={val}" for k, val in self.env.items()))
        for w in self.warnings:
            lines.append(f"warning: {w}")
        for u in self.unverified:
            lines.append(f"unverified: {u}")
        if trace:
            lines.append("trace:")
            for t in self.trace:
                mark = "+" if t.accepted else "-"
                where = "/".join(x for x in (t.op, t.impl) if x)
                why = "no implementation (see bindings)" if t.reason in shown else t.reason
                lines.append(f"  {mark} {where + ': ' if where else ''}{t.rule}: {why}")
        return "\n".join(lines)


def _option(value: Any) -> str:
    """An option value as ``name=value`` prints it: booleans as true/false, the rest as str()."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
