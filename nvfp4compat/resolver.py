"""The pure resolver: ``(matrix, facts, overrides) -> Plan``.

:func:`resolve` imports nothing heavy (no torch, triton, flashinfer or vllm) and reads no
environment: ``NVFP4COMPAT_IMPL`` arrives inside :class:`~nvfp4compat.facts.SystemFacts`
(``facts.impl_env``, captured by :func:`~nvfp4compat.facts.detect` or
:func:`nvfp4compat.api.query`). Every rule is a function of one frozen :class:`Known` value (the
matrix, the facts, and what they select in it); what the rules say is collected in an append-only
log that becomes the plan's trace, warnings and notes.

Precedence, in this one place (:func:`_candidates`):

1. an explicit argument (``overrides``: ``"triton"`` or ``{"write": "triton"}`` or
   ``"write=triton,decode=flashinfer"``);
2. the environment (``NVFP4COMPAT_IMPL``, same syntax);
3. the matrix preference order for the arch family (``implementations.yaml``);
4. the probe: an installed release the matrix does not know is judged by what the probe found.

An explicitly requested implementation that cannot run raises :class:`ResolutionError`
(what was found, what is needed, the way out). An automatic choice falls back to the next
preference and says so in the trace and the warnings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from nvfp4compat._version import __version__
from nvfp4compat.facts import (
    ENV_CUDAGRAPH_DECODE,
    ENV_DISABLE_TRITON,
    ENV_IMPL,
    ENV_KV_ROTATION,
    SystemFacts,
)
from nvfp4compat.plan import Binding, Plan, TraceEntry, VllmPlan, VllmRoute
from nvfp4compat.spec import (
    FEATURES,
    HELPERS,
    IMPLS,
    KV_ROTATIONS,
    OPS,
    PATCH_IDS,
    ArchSpec,
    FlashInferRelease,
    IndexCheck,
    Matrix,
    Requirement,
    VllmRelease,
)
from nvfp4compat.versions import parse_version, public_version

__all__ = [
    "WRITER_REQUIRED", "Known", "ResolutionError", "parse_cudagraph_decode", "parse_impl_spec", "parse_kv_rotation",
    "release_span", "resolve",
]  # fmt: skip

WRITER_REQUIRED = "FlashInfer NVFP4 slot-mapping KV cache update is required"


class ResolutionError(ValueError):
    """An explicit request (argument or ``NVFP4COMPAT_IMPL``) that cannot be honoured."""


def parse_impl_spec(spec: str | Mapping[str, str] | None, *, source: str = "argument") -> dict[str, str]:
    """Parse an implementation override into ``{op: impl}``.

    Parameters
    ----------
    spec : str, mapping or None
        ``"triton"`` (every op), ``"write=triton,decode=flashinfer"`` (per op), or a mapping.
    source : str
        Named in error messages (``"argument"`` or ``"NVFP4COMPAT_IMPL"``).

    Raises
    ------
    ResolutionError
        On an unknown op or implementation, naming the valid ones.
    """
    if spec is None:
        return {}
    items: list[tuple[str, str]]
    if isinstance(spec, Mapping):
        items = [(str(k).strip(), str(v).strip()) for k, v in spec.items()]
    else:
        text = spec.strip()
        if not text:
            return {}
        if "=" not in text and "," not in text:
            impl = text.lower()
            if impl not in IMPLS:
                raise ResolutionError(f"{source}: unknown implementation {text!r}; valid values are {list(IMPLS)} or 'op=impl,...' with ops {list(OPS)}")
            return dict.fromkeys(OPS, impl)
        items = []
        for part in text.split(","):
            if not part.strip():
                continue
            if "=" not in part:
                raise ResolutionError(f"{source}: {part.strip()!r} is not 'op=impl'; write e.g. 'write=triton,decode=flashinfer' (ops {list(OPS)}, impls {list(IMPLS)})")
            op, _, impl = part.partition("=")
            items.append((op.strip().lower(), impl.strip().lower()))
    out: dict[str, str] = {}
    for op, impl in items:
        if op not in OPS:
            raise ResolutionError(f"{source}: unknown op {op!r}; valid ops are {list(OPS)}")
        if impl not in IMPLS:
            raise ResolutionError(f"{source}: unknown implementation {impl!r} for {op}; valid values are {list(IMPLS)}")
        if op in out:
            raise ResolutionError(f"{source}: {op} is given twice ({op}={out[op]} and {op}={impl}); name each op once")
        out[op] = impl
    return out


def parse_kv_rotation(value: str | None, *, source: str = ENV_KV_ROTATION) -> str | None:
    """Parse a KV-rotation request: ``"hadamard"`` turns it on; None, ``""`` or ``"none"`` leave it off.

    Raises
    ------
    ResolutionError
        On any other value, naming the accepted ones.
    """
    text = (value or "").strip().lower()
    if text in ("", "none"):
        return None
    if text in KV_ROTATIONS:
        return text
    raise ResolutionError(f"{source}={value!r} is not a KV rotation; accepted values are {list(KV_ROTATIONS)} or 'none' (unset: no rotation)")


def parse_cudagraph_decode(value: str | None, *, source: str = ENV_CUDAGRAPH_DECODE) -> bool | None:
    """Parse the FULL-decode-graph switch: ``"1"`` on, ``"0"`` off, None or ``""``: the matrix decides.

    Raises
    ------
    ResolutionError
        On any other value (``"yes"``, ``"nope"``): a switch that silently read as off would hide
        what the plugin does.
    """
    text = (value or "").strip()
    if text == "":
        return None
    if text in ("0", "1"):
        return text == "1"
    raise ResolutionError(
        f"{source}={value!r} is not a switch; set it to 1 (FULL decode graphs capture nvfp4compat's decode "
        "reader) or 0 (attention runs eagerly between piecewise graphs), or unset it (the matrix decides)"
    )


def _full_decode_graphs(k: Known, read: Mapping[str, str], write: str | None) -> bool:
    """Whether the route lets vLLM capture uniform decode batches in FULL CUDA graphs: where the
    plugin reads decode with its own kernel, as ``NVFP4COMPAT_CUDAGRAPH_DECODE`` says, else where
    the matrix verified it for this vLLM release and arch, with the writer the route binds
    (``write``: the routed writer, None for vLLM's own), since the graph captures the KV write too."""
    forced = parse_cudagraph_decode(k.facts.cudagraph_decode_env)
    if "decode" not in read:
        if forced:
            k.note(None, None, "full_decode_graphs", False, f"{ENV_CUDAGRAPH_DECODE}=1 ignored: vLLM's own reader serves decode")
        return False
    if forced is not None:
        k.note(None, None, "full_decode_graphs", forced, f"{ENV_CUDAGRAPH_DECODE}={int(forced)}")
        return forced
    spec = k.vllm.plugin.full_decode_graphs if k.vllm is not None else None
    ok = spec is not None and spec.status == "verified" and k.facts.arch in spec.arches
    writer_ok = spec is None or spec.writers is None or (write is not None and write in spec.writers)
    if spec is None:
        why = f"no FULL-decode-graph evidence for vLLM {k.facts.vllm}: attention runs eagerly between piecewise graphs"
    elif ok and not writer_ok:
        bound = f"the bound writer is {write}" if write is not None else "vLLM's own writer writes the cache"
        verified = "/".join(spec.writers or [])
        why = (f"FULL decode graphs were verified on {', '.join(spec.arches)} with the {verified} writer only and "
               f"{bound}: attention runs eagerly between piecewise graphs (NVFP4COMPAT_IMPL=write={verified} keeps "
               "the verified pairing)")
        ok = False
    elif ok:
        why = f"verified on {', '.join(spec.arches)}: {spec.evidence}"
    else:
        why = f"FULL decode graphs are {spec.status} on {', '.join(spec.arches)} only, not {k.facts.arch}: attention runs eagerly between piecewise graphs"
    k.note(None, None, "full_decode_graphs", ok, why + f" ({ENV_CUDAGRAPH_DECODE}=1/0 overrides)")
    return ok


def _tie_rotation(k: Known, bindings: dict[str, Binding], rotation: str) -> dict[str, Binding]:
    """Put ``kv_rotation`` in the options of every bound op: writer and readers are rotated together."""
    bound = [op for op in OPS if bindings[op].impl is not None]
    for op in bound:
        b = bindings[op]
        bindings[op] = b.model_copy(update={"options": {**b.options, "kv_rotation": rotation}})
    k.note(None, None, "kv_rotation", True, f"{rotation}: the cache stores K@H and V@H; {', '.join(bound) or 'no op'} wrapped with the rotation (readers attend with Q@H and multiply the output by H, dequant un-rotates); native excluded (vLLM's own path cannot be wrapped)")
    return bindings


@dataclass
class _Log:
    """What the resolver says while it decides: append-only, the only mutable state of a resolve."""

    trace: list[TraceEntry] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)
    planned_from: dict[str, str] = field(default_factory=dict)
    release_warnings: list[str] = field(default_factory=list)
    unreleased: list[str] = field(default_factory=list)

    def note(self, op: str | None, impl: str | None, rule: str, accepted: bool, reason: str) -> None:
        self.trace.append(TraceEntry(op=op, impl=impl, rule=rule, accepted=accepted, reason=reason))


@dataclass(frozen=True)
class Known:
    """What the resolver knows, fixed before any decision: the matrix, the facts, the requested
    features and rotation, and what the facts select in the matrix (arch entry, FlashInfer and vLLM
    release, helper presence and its source). Every rule is a function of this value; ``log``
    collects what they say."""

    matrix: Matrix
    facts: SystemFacts
    features: tuple[str, ...]
    rotation: str | None
    arch: ArchSpec | None
    fi: FlashInferRelease | None
    fi_exact: bool
    helpers: Mapping[str, bool] | None
    helper_params: Mapping[str, tuple[str, ...]]
    helper_source: str | None
    probe_disagrees: frozenset[str]
    vllm: VllmRelease | None
    vllm_exact: bool
    log: _Log = field(compare=False)

    def note(self, op: str | None, impl: str | None, rule: str, accepted: bool, reason: str) -> None:
        self.log.note(op, impl, rule, accepted, reason)


# ------------------------------------------------------------------------------ what we know


def _know(matrix: Matrix, facts: SystemFacts, features: tuple[str, ...], rotation: str | None, log: _Log) -> Known:
    """Select in the matrix what the facts name (arch, releases, helpers); say what is unverified."""
    m, f = matrix, facts
    arch: ArchSpec | None = None
    fi: FlashInferRelease | None = None
    fi_exact = False
    helpers: dict[str, bool] | None = None
    helper_params: dict[str, tuple[str, ...]] = {}
    helper_source: str | None = None
    disagrees: set[str] = set()
    vllm: VllmRelease | None = None
    vllm_exact = False
    if f.arch is None:
        log.note(None, None, "arch", False, "no GPU arch known (no CUDA device and NVFP4COMPAT_ARCH unset): arch-dependent requirements cannot be met")
    elif f.arch in m.arches:
        arch = m.arches[f.arch]
        log.note(None, None, "arch", True, f"{f.arch} is in the matrix (family {arch.family})")
    else:
        log.unverified.append(f"arch {f.arch}: not in the matrix (known: {', '.join(m.arches)}); only arch-neutral Triton kernels are considered")
        log.note(None, None, "arch", False, f"{f.arch} is not in the matrix: conservative choice (Triton if plausible)")

    if f.flashinfer is not None:
        exact = m.flashinfer_release(f.flashinfer)
        local = parse_version(f.flashinfer).local is not None
        if exact is not None and not local:
            fi, fi_exact = exact, True
        else:
            fi = exact or m.nearest_flashinfer(f.flashinfer)
            basis = f"nearest known release {fi.version}" if fi else "no known release (older than all)"
            why = "a local build" if local else "not in the matrix"
            log.unverified.append(f"flashinfer {f.flashinfer}: {why}; release facts taken from {basis}" + (" and the probe" if f.flashinfer_helpers is not None else ""))
            if fi is not None and not local:
                log.planned_from["flashinfer"] = fi.version
                log.release_warnings.append(_unknown_release_warning(
                    "FlashInfer", f.flashinfer, fi.version, m.flashinfer_index_checked, "flashinfer.yaml"))
                checked = _unreleased(f.flashinfer, m.flashinfer_index_checked)
                if checked is not None and f.source == "query":
                    log.unreleased.append(_unreleased_reason("FlashInfer", f.flashinfer, checked, "--flashinfer"))
        if f.flashinfer_helpers is not None:
            helpers = {h: bool(f.flashinfer_helpers.get(h, False)) for h in HELPERS}
            helper_params = {h: tuple(p) for h, p in (f.flashinfer_helper_params or {}).items()}
            helper_source = "probe"
            if fi is not None and fi_exact:
                for h in HELPERS:
                    said = fi.helpers[h].present
                    if said != helpers[h]:
                        disagrees.add(h)
                        spec = fi.helpers[h]
                        log.warnings.append(
                            f"matrix and probe disagree on FlashInfer {f.flashinfer}: flashinfer.yaml says {h} is "
                            f"{'present (' + (spec.defined_at or '') + ')' if said else 'absent'}, the installed package "
                            f"{'has' if helpers[h] else 'lacks'} it ({f.flashinfer_probe or 'probe'}); the probe wins"
                        )
        elif fi is not None:
            helpers = {h: fi.helpers[h].present for h in HELPERS}
            helper_params = {
                h: tuple(p.split("=", 1)[0] for p in (fi.helpers[h].params or [])) for h in HELPERS if fi.helpers[h].present
            }
            helper_source = "matrix" if fi_exact else "nearest"
        if f.flashinfer_import_error:
            log.warnings.append(f"FlashInfer probe saw an error: {f.flashinfer_import_error} (helpers were read from the installed sources)")

    if f.vllm is not None:
        exact_v = m.vllm_release(f.vllm)
        if exact_v is not None and parse_version(f.vllm).local is None:
            vllm, vllm_exact = exact_v, True
        else:
            vllm = exact_v or m.nearest_vllm(f.vllm)
            if vllm is not None:
                log.unverified.append(f"vllm {f.vllm}: not in the matrix; treated like {vllm.version}")
                if exact_v is None:
                    log.planned_from["vllm"] = vllm.version
                    log.release_warnings.append(_unknown_release_warning(
                        "vLLM", f.vllm, vllm.version, m.vllm.index_checked, "vllm.yaml"))
            checked = _unreleased(f.vllm, m.vllm.index_checked) if exact_v is None else None
            if checked is not None and f.source == "query":
                log.unreleased.append(_unreleased_reason("vLLM", f.vllm, checked, "--vllm"))
    return Known(
        matrix=m, facts=f, features=features, rotation=rotation, arch=arch, fi=fi, fi_exact=fi_exact,
        helpers=helpers, helper_params=helper_params, helper_source=helper_source,
        probe_disagrees=frozenset(disagrees), vllm=vllm, vllm_exact=vllm_exact, log=log,
    )


def _unreleased(version: str, checked: IndexCheck | None) -> IndexCheck | None:
    """``checked`` when ``version`` is newer than the newest release seen on the index at that check, else None.

    Only a query can name such a release: an installed one exists, and was released after the check.
    """
    if checked is not None and public_version(version) > parse_version(checked.newest):
        return checked
    return None


def _unknown_release_warning(name: str, version: str, nearest: str, checked: IndexCheck | None, file: str) -> str:
    when = ""
    newer = _unreleased(version, checked)
    if newer is not None:
        when = f"; it is newer than every release on the index when the matrix was checked ({newer.newest}, {newer.date})"
    return (
        f"{name} {version} is not in matrix/{file}{when}: planned from the nearest known release {nearest}, "
        f"unverified; install {name} {nearest}, or add {version} to matrix/{file} (nvfp4compat verify --emit)"
    )


def _unreleased_reason(name: str, version: str, checked: IndexCheck, flag: str) -> str:
    return (
        f"{name} {version} is unknown/unreleased as of {checked.date} (the newest release on the index then was "
        f"{checked.newest}); nothing is known about it: pass {flag} {checked.newest} or an older release"
    )


def _cc_set_for(k: Known, helper: str) -> tuple[list[int] | None, str | None, str]:
    """The helper's SM gate from the matrix: the release itself, else the newest release that has it."""
    rel = k.fi
    if rel is not None and rel.helpers[helper].present:
        s = rel.helpers[helper]
        return s.compute_capability, s.capability_source, f"[{rel.version}]"
    for r in reversed(k.matrix.flashinfer):
        if r.helpers[helper].present:
            s = r.helpers[helper]
            return s.compute_capability, s.capability_source, f"[{r.version}, nearest release that has it]"
    return None, None, ""


def _arch_plausible_for_triton(k: Known) -> bool:
    """An arch the matrix does not list may run Triton (implementations.yaml: unknown_arch_triton)."""
    return k.matrix.implementations.unknown_arch_triton.plausible(k.facts.arch_major)


def _check(k: Known, req: Requirement) -> tuple[bool, str]:
    """Evaluate one requirement against the facts: ``(ok, reason)``."""
    f, m = k.facts, k.matrix
    cc = f.arch_cc
    fi_label = f"FlashInfer {f.flashinfer}" if f.flashinfer else "FlashInfer"
    if req.kind == "flashinfer_helper":
        h = req.helper or ""
        if f.flashinfer is None:
            return False, f"FlashInfer is not installed (needs {h}, first in {_first_with(m, h)})"
        if k.helpers is None:
            return False, f"{fi_label}: helper presence unknown (release older than the matrix and not probed)"
        if not k.helpers[h]:
            src = {"probe": "probe of the installed package", "matrix": "flashinfer.yaml", "nearest": "nearest matrix release"}.get(k.helper_source or "", "")
            return False, f"{fi_label} lacks {h} ({src}); releases that have it: {release_span(m, m.releases_with_helper(h))}"
        if cc is None:
            return False, f"{h} is present but the arch is unknown"
        ccs, how, where = _cc_set_for(k, h)
        if ccs is None:
            return True, f"{fi_label} has {h} (no SM gate recorded)"
        if how == "jit_min_arch":
            if cc >= ccs[0]:
                return True, f"{fi_label} has {h}; its JIT module builds for SM >= {ccs[0]} {where}"
            return False, f"{fi_label} has {h} but its JIT module needs SM >= {ccs[0]}, found {f.arch} {where}"
        if cc in ccs:
            return True, f"{fi_label} has {h}; SM{cc} is in its @supported_compute_capability {ccs} {where}"
        return False, f"{fi_label} has {h} but SM{cc} is not in its @supported_compute_capability {ccs} {where}"
    if req.kind == "flashinfer_helper_param":
        h, p = req.helper or "", req.param or ""
        if f.flashinfer is None or k.helpers is None or not k.helpers.get(h):
            return False, f"needs {h}({p}=...), {fi_label} does not have {h}"
        params = k.helper_params.get(h)
        if params is None:
            return False, f"{fi_label}: parameters of {h} unknown"
        if p in params:
            return True, f"{fi_label}: {h} takes {p}"
        have = [r.version for r in m.flashinfer if r.helpers[h].present and any(x.split('=', 1)[0] == p for x in (r.helpers[h].params or []))]
        return False, f"{fi_label}: {h} has no {p} parameter (releases with it: {release_span(m, have)})"
    if req.kind == "flashinfer_consumer":
        c = req.consumer or ""
        if f.flashinfer is None:
            return False, f"FlashInfer is not installed (needs its {c} NVFP4 path)"
        if k.fi is None:
            return False, f"{fi_label} is older than every release in the matrix: its {c} path is unknown"
        if cc is None:
            return False, f"arch unknown: cannot check {c}"
        sms = k.fi.consumers[c].sms
        if cc in sms:
            return True, f"{fi_label} {c} reads NVFP4 on SM{cc} (SMs {sms}, [{k.fi.version}])"
        return False, f"{fi_label} {c} reads NVFP4 only on SMs {sms}, found {f.arch} ([{k.fi.version}])"
    if req.kind == "arch_flag":
        flag = req.flag or ""
        if f.arch is None:
            return False, f"arch unknown: cannot check {flag}"
        if k.arch is None:
            if flag == "triton_kernels" and _arch_plausible_for_triton(k):
                rule = k.matrix.implementations.unknown_arch_triton
                return True, f"{f.arch} is not in the matrix; Triton is plausible ({rule.reason}): unverified"
            return False, f"{f.arch} is not in the matrix: {flag} unknown"
        claim = getattr(k.arch, flag)
        word = "yes" if claim.value else "no"
        return claim.value, f"arches.yaml {f.arch}.{flag} = {word} ({claim.status})" + (f": {claim.note}" if claim.note else "")
    if req.kind == "triton":
        if f.triton is None:
            return False, "Triton is not installed (pip install triton, or nvfp4compat[triton])"
        if f.triton_disabled:
            return False, f"Triton {f.triton} is disabled by {ENV_DISABLE_TRITON}=1"
        return True, f"Triton {f.triton} is available"
    if req.kind == "trtllm_gen_usable":
        if f.trtllm_gen_usable is True:
            return True, "trtllm-gen is usable"
        if f.trtllm_gen_usable is False:
            return False, "trtllm-gen is not usable here (flashinfer-cubin missing or mismatched, or not an SM100-family GPU)"
        return True, "trtllm-gen usability unknown: assumed usable (vLLM probes flashinfer-cubin / NVIDIA's artifactory itself)"
    if req.kind == "vllm_native_path":
        if k.vllm is None or f.vllm is None:
            return False, "native means vLLM's own trtllm-gen path, and no vLLM is in the facts"
        if f.arch is None:
            return False, "arch unknown"
        stock = k.vllm.stock_for(f.arch)
        if stock is not None and stock.path == "native":
            return True, f"vLLM {f.vllm} serves nvfp4 natively on {f.arch} ({stock.evidence})"
        return False, f"vLLM {f.vllm}'s stock NVFP4 path on {f.arch} is {'the FA2 path' if stock else 'absent'}, not native"
    if req.kind == "vllm_dtype":
        if f.vllm is None or k.vllm is None:
            return True, "no vLLM: dtype listing not required"
        if req.dtype in k.vllm.nvfp4_dtypes:
            return True, f"vLLM {f.vllm} lists {req.dtype}"
        return False, f"vLLM {f.vllm} does not list {req.dtype} (its nvfp4 dtypes: {k.vllm.nvfp4_dtypes})"
    if req.kind == "flashinfer_fa3_ragged":
        return _check_ragged(k, "fa3")
    if req.kind == "flashinfer_fa2_ragged":
        return _check_ragged(k, "fa2")
    if req.kind == "not_in_vllm":
        if f.vllm is None:
            return True, "no vLLM in the facts"
        return False, req.reason or "not inside vLLM"
    raise AssertionError(f"unhandled requirement kind {req.kind}")  # pragma: no cover - the spec restricts kinds


def _check_ragged(k: Known, backend: str) -> tuple[bool, str]:
    """FlashInfer's ragged prefill wrapper with ``backend`` ("fa3" or "fa2") on this arch: the probe
    decides presence where it ran (a disagreement with flashinfer.yaml is a warning); the release's
    ``{backend}_ragged`` record gives the SMs (those of the newest release with a record where this
    release has none)."""
    f = k.facts
    name, section = backend.upper(), f"{backend}_ragged"
    fi_label = f"FlashInfer {f.flashinfer}" if f.flashinfer else "FlashInfer"
    if f.flashinfer is None:
        return False, (
            f"FlashInfer is not installed (needs BatchPrefillWithRaggedKVCacheWrapper(backend='{backend}'))"
        )
    rec = getattr(k.fi, section) if k.fi is not None and k.fi_exact else None
    probed: bool | None = getattr(f, f"flashinfer_{section}")
    if probed is not None:
        present, src = probed, "probe of the installed sources"
        if rec is not None and not present:
            k.log.warnings.append(
                f"matrix and probe disagree on FlashInfer {f.flashinfer}: flashinfer.yaml records the {name} ragged "
                f"prefill ({rec.evidence.split(';')[0]}), the installed package lacks it; the probe wins"
            )
    elif rec is not None:
        present, src = True, f"flashinfer.yaml {section} [{k.fi.version if k.fi else ''}]"
    else:
        return False, (
            f"{fi_label}: {name} ragged prefill not recorded in flashinfer.yaml for this release and not probed "
            "(releases recorded: "
            + (release_span(k.matrix, [r.version for r in k.matrix.flashinfer if getattr(r, section)]) or "none")
            + ")"
        )
    if not present:
        return False, f"{fi_label} has no {name} ragged prefill ({src})"
    sms = rec.sms if rec is not None else _ragged_sms(k.matrix, backend)
    cc = f.arch_cc
    if cc is None:
        return False, f"arch unknown: {name} needs SM {sms}"
    if cc not in sms:
        return False, f"{fi_label}'s {name} ragged prefill builds only for SMs {sms}, found {f.arch} ({src})"
    return True, f"{fi_label} has BatchPrefillWithRaggedKVCacheWrapper(backend='{backend}') for SM{cc} ({src})"


def _ragged_sms(m: Matrix, backend: str) -> list[int]:
    """The ragged prefill's SMs (``backend`` "fa3"/"fa2") as the newest flashinfer.yaml release that
    records it says."""
    recorded = [getattr(r, f"{backend}_ragged") for r in m.flashinfer]
    recorded = [r for r in recorded if r is not None]
    return list(recorded[-1].sms) if recorded else []


def release_span(m: Matrix, versions: list[str]) -> str:
    """Collapse releases that are consecutive in flashinfer.yaml into ``A..B`` runs."""
    order = [r.version for r in m.flashinfer]
    idx = sorted(order.index(v) for v in versions if v in order)
    runs: list[list[int]] = []
    for i in idx:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    parts = [order[r[0]] if len(r) == 1 else f"{order[r[0]]}..{order[r[-1]]}" for r in runs]
    return ", ".join(parts) if parts else "none"


def _first_with(m: Matrix, helper: str) -> str:
    rels = m.releases_with_helper(helper)
    return f"flashinfer-python {rels[0]}" if rels else "no known release"


def _evaluate(k: Known, op: str, impl: str) -> tuple[bool, list[str]]:
    """All requirements of ``impl`` for ``op``, the plugin's limits, and requested features."""
    m, f = k.matrix, k.facts
    spec = m.implementations.ops[op].impls.get(impl)
    if spec is None:
        return False, [f"{op} has no {impl} implementation (implementations: {sorted(m.implementations.ops[op].impls)})"]
    reasons: list[str] = []
    ok = True
    for req in spec.requires:
        good, why = _check(k, req)
        reasons.append(why)
        if not good:
            ok = False
            break
    if ok and k.vllm is not None and f.vllm is not None and impl != "native" and op in ("write", "decode", "prefill"):
        allowed = getattr(k.vllm.plugin, op)
        routed = m.vllm.routed_readers
        if impl not in allowed:
            ok = False
            reasons.append(f"inside vLLM {f.vllm} the plugin binds only {allowed} for {op}: {k.vllm.plugin.reason}")
        elif op != "write" and impl not in routed.impls and _strategy_beside_native(k) == "backport":
            ok = False
            reasons.append(
                f"inside vLLM {f.vllm} on {f.arch} the plugin backports, and a backport reads with "
                f"{routed.impls} only: {routed.reason}"
            )
    if ok:
        for feat in k.features:
            fs = m.implementations.features[feat]
            per_op = fs.ops.get(op)
            if per_op is None:
                continue
            if impl not in per_op:
                ok = False
                reasons.append(f"{impl} {op} does not support the requested feature {feat} ({fs.summary})")
                break
            for req in per_op[impl]:
                good, why = _check(k, req)
                if not good:
                    ok = False
                    reasons.append(f"feature {feat}: {why}")
                    break
            if not ok:
                break
    return ok, reasons


def _strategy_beside_native(k: Known) -> str | None:
    """The vLLM strategy for implementations other than native on this arch (vllm.yaml: strategy,
    a native arch falling back to ``native_fallback``); None without vLLM or arch."""
    if k.vllm is None or k.facts.arch is None:
        return None
    declared = k.vllm.strategy.for_arch(k.facts.arch) or "backport"
    return k.vllm.strategy.native_fallback if declared == "native" else declared


def _feature_supported(k: Known, feat: str, bindings: Mapping[str, Binding]) -> bool:
    fs = k.matrix.implementations.features[feat]
    for op, per_impl in fs.ops.items():
        impl = bindings[op].impl
        if impl is None or impl not in per_impl:
            return False
        if not all(_check(k, r)[0] for r in per_impl[impl]):
            return False
    return True


# ------------------------------------------------------------------------------ binding


def _bind(k: Known, overrides: Mapping[str, str], env_over: Mapping[str, str]) -> tuple[dict[str, Binding], dict[str, bool]]:
    """Bind every op (explicit request, then the matrix preference), and say which features the
    bindings provide."""
    m = k.matrix
    group = m.implementations.groups.get("native")
    group_ops = list(group.ops) if group else []
    explicit: dict[str, tuple[str, str]] = {}
    for op in OPS:
        if op in overrides:
            explicit[op] = (overrides[op], "argument")
        elif op in env_over:
            explicit[op] = (env_over[op], "environment")
    pref = m.preference_for(k.facts.arch or "")
    if k.facts.arch is not None and k.arch is None:
        pref = m.implementations.unknown_arch_preference

    # native is all-or-none across its group (write/decode/prefill)
    native_ok, native_why = True, ""
    for op in group_ops:
        good, why = _evaluate(k, op, "native")
        if not good:
            native_ok, native_why = False, why[-1]
            break
        native_why = why[-1] if why else ""
    explicit_native = [op for op in group_ops if explicit.get(op, ("", ""))[0] == "native"]
    explicit_other = [op for op in group_ops if op in explicit and explicit[op][0] != "native"]
    if explicit_native:
        srcs = {explicit[o][1] for o in explicit_native}
        where = "NVFP4COMPAT_IMPL" if srcs == {"environment"} else "the explicit argument"
        if not native_ok:
            raise ResolutionError(
                f"{where} asks for native on {explicit_native}, but native cannot run here: {native_why}. "
                f"Native is vLLM's own SM100-family trtllm-gen path ({_native_arches(k)}, with a FlashInfer whose "
                "trtllm-gen consumer lists the SM, vLLM installed, trtllm-gen usable). "
                f"Way out: request flashinfer or triton instead (e.g. {ENV_IMPL}=triton)."
            )
        if explicit_other:
            raise ResolutionError(
                f"native is all-or-none for {group_ops} ({group.reason if group else ''}); got native for {explicit_native} "
                f"and {[(o, explicit[o][0]) for o in explicit_other]}. Way out: request native for all of them or for none."
            )
    exclude_native = (not native_ok) or bool(explicit_other)
    if native_ok and explicit_other:
        k.note(None, "native", "group", False, f"native is all-or-none for {group_ops}; excluded because {[(o, explicit[o][0]) for o in explicit_other]} was requested")

    bindings: dict[str, Binding] = {}
    for op in OPS:
        if op in explicit:
            impl, src = explicit[op]
            who = "the explicit argument" if src == "argument" else f"{ENV_IMPL}={k.facts.impl_env}"
            if impl == "native" and op not in group_ops:
                raise ResolutionError(f"{who} asks for native {op}, but {op} has no native implementation (vLLM's native path does not dequantize). Way out: request flashinfer or triton for {op}.")
            good, why = _evaluate(k, op, impl)
            k.note(op, impl, src, good, "; ".join(why))
            if not good:
                raise ResolutionError(
                    f"{who} asks for {impl} {op}, but it cannot run here: {why[-1]}. Found: {_found(k)}. "
                    f"Way out: {_way_out(k, op, impl)}"
                )
            bindings[op] = Binding(op=op, impl=impl, source=src, reason=f"requested by {who}: {why[-1] if why else 'ok'}")  # type: ignore[arg-type]
            continue
        order = pref.order(op)
        chosen: Binding | None = None
        rejected: list[str] = []
        for rank, impl in enumerate(order.order):
            if impl not in m.implementations.ops[op].impls:
                continue
            if impl == "native" and exclude_native:
                reason = native_why if not native_ok else "native excluded: another implementation was requested for its group"
                k.note(op, impl, "matrix", False, reason)
                rejected.append(f"native: {reason}")
                continue
            good, why = _evaluate(k, op, impl)
            k.note(op, impl, "matrix", good, "; ".join(why))
            if not good:
                rejected.append(f"{impl}: {why[-1]}")
                continue
            probe_based = impl == "flashinfer" and k.helper_source == "probe" and (not k.fi_exact or bool(k.probe_disagrees))
            if probe_based:
                src = "probe"
            elif rank == 0:
                src = "matrix"
            else:
                src = "fallback"
            reason = f"{impl} is the matrix preference for {op} on {pref.family} ({order.status}): {order.reason}" if rank == 0 else (
                f"fell back to {impl} ({'; '.join(rejected)})"
            )
            if src == "fallback":
                k.log.warnings.append(f"{op}: {order.order[0]} preferred but rejected ({rejected[0]}); using {impl}")
            chosen = Binding(op=op, impl=impl, source=src, reason=reason)  # type: ignore[arg-type]
            break
        if chosen is None:
            chosen = Binding(op=op, impl=None, source="matrix", reason=_unbound_reason(k, op, rejected))
            k.note(op, None, "bind", False, chosen.reason)
        bindings[op] = chosen

    # features and options
    feats = {feat: _feature_supported(k, feat, bindings) for feat in m.implementations.features}
    w = bindings["write"]
    if w.impl is not None:
        bindings["write"] = w.model_copy(update={"options": {"nvfp4_4over6": _op_feature(k, "nvfp4_4over6", "write", w.impl)}})
    return bindings, feats


def _op_feature(k: Known, feat: str, op: str, impl: str) -> bool:
    fs = k.matrix.implementations.features.get(feat)
    if fs is None or op not in fs.ops or impl not in fs.ops[op]:
        return False
    return all(_check(k, r)[0] for r in fs.ops[op][impl])


def _found(k: Known) -> str:
    f = k.facts
    parts = [f"arch {f.arch or 'unknown'}", f"flashinfer {f.flashinfer or 'not installed'}", f"triton {f.triton or 'not installed'}{' (disabled)' if f.triton_disabled else ''}"]
    if f.vllm:
        parts.append(f"vllm {f.vllm}")
    return ", ".join(parts)


def _native_arches(k: Known) -> str:
    """The arches ``arches.yaml`` qualifies for vLLM's native path."""
    return ", ".join(a for a, spec in k.matrix.arches.items() if spec.native_trtllm_path.value)


def _way_out(k: Known, op: str, impl: str) -> str:
    if impl == "flashinfer":
        helper = k.matrix.implementations.flashinfer_helper(op)
        if helper:
            rels = k.matrix.releases_with_helper(helper)
            return f"install a FlashInfer release with {helper} ({release_span(k.matrix, rels)}), or request {op}=triton"
        return f"use a GPU whose FlashInfer FA2 path reads NVFP4, or request {op}=triton"
    if impl == "triton":
        return f"pip install triton and unset {ENV_DISABLE_TRITON}, or request {op}=flashinfer"
    if impl in ("dequant_fa3", "dequant_fa2"):
        m, backend = k.matrix, impl.removeprefix("dequant_")
        span = release_span(m, [r.version for r in m.flashinfer if getattr(r, f"{backend}_ragged") is not None])
        return (
            f"run on a GPU of SM {_ragged_sms(m, backend)} with a FlashInfer whose BatchPrefillWithRaggedKVCacheWrapper "
            f"has backend='{backend}' ({span}) and Triton, or request {op}=triton"
        )
    return f"request {op}=flashinfer or {op}=triton"


def _unbound_reason(k: Known, op: str, rejected: list[str]) -> str:
    f, a = k.facts, k.arch
    # Suggest only what can help on this arch: nothing where no NVFP4 path runs at all (SM75, SM110),
    # FlashInfer only when the installed one lacks the helper, Triton only when it is absent or disabled.
    dead = f.arch is None or (a is not None and not (a.fa2_nvfp4_read.value or a.triton_kernels.value or a.native_trtllm_path.value)) or (
        a is None and not _arch_plausible_for_triton(k))
    slot_helper = k.matrix.implementations.flashinfer_helper("write")
    if op == "write" and slot_helper is not None:
        rels = k.matrix.releases_with_helper(slot_helper)
        found = f"FlashInfer {f.flashinfer} without {slot_helper}" if f.flashinfer else "no FlashInfer installed"
        has_helper = bool(f.flashinfer and k.helpers and k.helpers.get(slot_helper))
        if has_helper:
            found = f"FlashInfer {f.flashinfer} has {slot_helper} but it cannot run here"
        tri = next((r for r in rejected if r.startswith("triton:")), "triton: not considered")
        ways = []
        if not dead and not has_helper:
            ways.append(f"FlashInfer releases that provide it: {release_span(k.matrix, rels)} (e.g. pip install --no-deps flashinfer-python=={rels[0]})")
        if not dead and (f.triton is None or f.triton_disabled):
            ways.append(f"or enable the Triton fallback (pip install triton, unset {ENV_DISABLE_TRITON})")
        return f"{WRITER_REQUIRED}: found {found} [{tri}]" + "".join(f"; {w}" for w in ways)
    detail = "; ".join(rejected) or "no implementation is listed for this arch"
    return f"no implementation of {op} can run here: {detail}"


# ------------------------------------------------------------------------------- vLLM


def _vllm_blocker(k: Known) -> str | None:
    """Why no patch set can serve NVFP4 in this vLLM release here, whatever the bindings (None: a
    strategy applies)."""
    f, m, rel = k.facts, k.matrix, k.vllm
    if rel is None:
        return f"vLLM {f.vllm} is older than every release the matrix knows ({m.vllm.releases[0].version}..{m.vllm.releases[-1].version})"
    if f.arch is None:
        return "no GPU arch known: cannot plan vLLM patches"
    cc = f.arch_cc or 0
    lo, hi = rel.compute_capability_window
    if not lo <= cc <= hi:
        return f"vLLM {f.vllm} refuses compute capability {cc // 10}.{cc % 10} (its FLASHINFER backend window is {lo // 10}.{lo % 10}-{hi // 10}.{hi % 10}); no patch set changes that"
    if f.flashinfer is None:
        return f"vLLM {f.vllm}'s FLASHINFER backend (the only non-MLA backend listing nvfp4) imports flashinfer at module load; install flashinfer-python (vLLM pins {rel.pins.flashinfer_python})"
    for h in rel.requires_flashinfer_helpers:
        if k.helpers is not None and not k.helpers.get(h, False):
            rels = m.releases_with_helper(h)
            return (
                f"vLLM {f.vllm} imports {h} from flashinfer at module load (vllm/v1/attention/backends/flashinfer.py), "
                f"FlashInfer {f.flashinfer} lacks it: install one of {release_span(m, rels)} (vLLM pins {rel.pins.flashinfer_python})"
            )
    return None


def _vllm_plan(k: Known, bindings: Mapping[str, Binding], required_ok: bool) -> VllmPlan | None:
    f, m = k.facts, k.matrix
    if f.vllm is None:
        return None

    def none(reason: str) -> VllmPlan:
        k.note(None, None, "vllm", False, reason)
        return VllmPlan(version=f.vllm or "", strategy="none", patches=[], kv_cache_dtypes=[], reason=reason)

    blocker = _vllm_blocker(k)
    rel, arch = k.vllm, f.arch
    if blocker is not None or rel is None or arch is None:
        return none(blocker or "no vLLM release or GPU arch known")
    if not required_ok:
        return none("the plan binds no implementation for a required op (see reason)")
    declared = rel.strategy.for_arch(arch)
    if declared is None:
        declared = "backport"
        k.log.unverified.append(f"vLLM patch strategy for {f.arch}: not in vllm.yaml; using backport")
    if declared == "none":
        return none(f"vLLM {f.vllm} has no NVFP4 path on {f.arch} and the matrix lists no reader nvfp4compat can route there ({rel.strategy.evidence})")
    native = all(bindings[op].impl == "native" for op in ("write", "decode", "prefill"))
    stock = rel.stock_for(arch)
    if native:
        dtypes = list(stock.kv_cache_dtypes) if stock else ["nvfp4"]
        reason = f"vLLM {f.vllm}'s own trtllm-gen path serves nvfp4 on {f.arch}: nothing to patch"
        k.note(None, "native", "vllm", True, reason)
        return VllmPlan(version=f.vllm, strategy="native", patches=[], kv_cache_dtypes=dtypes, reason=reason)
    strategy = declared if declared != "native" else rel.strategy.native_fallback
    w, d, p = bindings["write"].impl, bindings["decode"].impl, bindings["prefill"].impl
    # dequant_fa3/fa2 hand layers they cannot serve (sinks, head_size outside 64/128/256) to the Triton prefill
    triton_readers = d == "triton" and p in ("triton", "dequant_fa3", "dequant_fa2")
    can_4over6 = w == "triton" and "nvfp4_4over6" in rel.nvfp4_dtypes
    patches: set[str] = set()
    if strategy == "extend" and stock is not None and stock.path == "fa2":
        if w != stock.writer:
            patches.add("kv_cache_update")
        if d != stock.reader or p != stock.reader:
            patches.add("forward_reader")
        if can_4over6 and "nvfp4_4over6" not in stock.kv_cache_dtypes:
            patches.add("gate_nvfp4_4over6")
        if triton_readers and stock.refuses:
            patches.add("gate_combination")
        if k.rotation is not None:
            patches.update(("kv_cache_update", "forward_reader"))  # the plugin wraps only what it routes
        why = f"stock vLLM {f.vllm} already serves nvfp4 on {f.arch} (writer {stock.writer}, reader {stock.reader}); patch only what the plan changes"
    else:
        strategy = "backport"
        patches.update(m.vllm.backport_patches)
        if can_4over6:
            patches.add("gate_nvfp4_4over6")
        if triton_readers:
            patches.add("gate_combination")
        if declared == "native":
            why = f"vLLM {f.vllm}'s native path is not used (trtllm-gen unusable or another implementation requested): port the FA2 path with the bound writer/readers"
        else:
            why = f"stock vLLM {f.vllm} accepts nvfp4 only on the SM100 family with trtllm-gen ({rel.gate.kind}); the plugin ports the 0.32 FA2 path with the bound writer/readers"
    ordered = [pid for pid in PATCH_IDS if pid in patches]
    dtypes = ["nvfp4"] + (["nvfp4_4over6"] if "gate_nvfp4_4over6" in patches else [])
    if not ordered:
        why += "; the stock path already matches the plan: no patch"
    k.note(None, None, "vllm", True, f"{strategy}: {why}; patches {ordered or '[]'}")
    return VllmPlan(version=f.vllm, strategy=strategy, patches=ordered, kv_cache_dtypes=dtypes, reason=why)  # type: ignore[arg-type]


def _refusable(k: Known, bindings: Mapping[str, Binding], vplan: VllmPlan | None) -> bool:
    """Whether an unsupported plan is refused at engine start (the plugin's route carries the plan's
    reason) rather than leaving vLLM untouched: the plan names a vLLM release that the matrix serves
    on this arch with a patch strategy, and what is missing here is the install: every unbound
    required op has an implementation that runs once Triton is installed and enabled."""
    f = k.facts
    if vplan is None or k.vllm is None or f.arch is None:
        return False
    if vplan.strategy in ("backport", "extend"):
        return True  # supported here but refused for another reason (e.g. an unreleased version)
    unbound = [op for op in OPS if k.matrix.implementations.ops[op].required and bindings[op].impl is None]
    if not unbound or _vllm_blocker(k) is not None or k.vllm.strategy.for_arch(f.arch) == "none":
        return False
    with_triton = replace(k, facts=f.model_copy(update={"triton": f.triton or "any", "triton_disabled": False}), log=_Log())
    return all(_evaluate(with_triton, op, "triton")[0] for op in unbound)


def _vllm_route(k: Known, bindings: Mapping[str, Binding], vplan: VllmPlan, refusal: str | None) -> VllmRoute | None:
    """What the plugin does in vLLM for this plan (:class:`~nvfp4compat.plan.VllmRoute`), or None to
    leave vLLM untouched. ``refusal``: the text NVFP4 is refused with at engine start."""
    if refusal is not None:
        every = [dt for p in k.matrix.vllm.patches.values() if (dt := p.accepts) is not None]
        route = VllmRoute(strategy=vplan.strategy, patches=[], accept=every, refusal=refusal)
        k.note(None, None, "vllm_route", True, route.describe())
        return route
    if vplan.strategy not in ("backport", "extend") or not vplan.patches:
        return None
    patches = vplan.patches
    routed = k.matrix.vllm.routed_readers.impls
    read: dict[str, str] = {}
    if "forward_reader" in patches:
        for op in ("decode", "prefill"):
            impl = bindings[op].impl
            if impl in routed:
                read[op] = impl
    w = bindings["write"]
    gates = k.matrix.vllm.patches
    accept = [dt for pid in patches if (dt := gates[pid].accepts) is not None]
    route = VllmRoute(
        strategy=vplan.strategy,
        patches=patches,
        accept=accept,
        combination="gate_combination" in patches,
        # With both phases on nvfp4compat's readers, vLLM's builder would only plan FlashInfer
        # wrappers nobody runs (and 0.32+'s refuses head_size 64 and sinks for NVFP4).
        own_builder="metadata_builder" in patches or len(read) == 2,
        write=w.impl if "kv_cache_update" in patches else None,
        write_4over6=bool(w.options.get("nvfp4_4over6")),
        read=read,  # type: ignore[arg-type]
        kv_rotation=k.rotation,
        full_decode_graphs=_full_decode_graphs(k, read, w.impl if "kv_cache_update" in patches else None),
    )
    k.note(None, None, "vllm_route", True, route.describe())
    return route


def _dtype_routes(
    k: Known, overrides: str | Mapping[str, str] | None, feats: tuple[str, ...], vplan: VllmPlan
) -> dict[str, VllmRoute]:
    """The routes of the rotated cache's own ``--kv-cache-dtype`` names (``vllm.yaml``
    ``rotated_kv_cache_dtypes``) where the release can register them (``kv_cache_dtype_registry``).

    Each is the route of the same system resolved with the rotation on (and ``nvfp4_4over6`` for a
    4over6 base), plus the ``register_kv_cache_dtypes`` patch and the name at the gate: the plugin
    registers the names, and an engine started with one of them takes that route. Resolved here, so
    ``query`` shows it and the plugin decides nothing."""
    rel, f = k.vllm, k.facts
    if rel is None or vplan.strategy not in ("backport", "extend", "native"):
        return {}
    if rel.kv_cache_dtype_registry is None:
        if k.matrix.vllm.rotated_kv_cache_dtypes:
            k.note(None, None, "kv_cache_dtypes", False, f"vLLM {f.vllm} cannot register --kv-cache-dtype names (no kv_cache_dtype_registry; 0.33.0+ can): the rotated cache is turned on with {ENV_KV_ROTATION}=hadamard")
        return {}
    out: dict[str, VllmRoute] = {}
    for d in k.matrix.vllm.rotated_kv_cache_dtypes:
        extra = ("nvfp4_4over6",) if d.base == "nvfp4_4over6" else ()
        facts = f.model_copy(update={"kv_rotation_env": d.kv_rotation})
        try:
            rot = resolve(k.matrix, facts, overrides, features=tuple(dict.fromkeys((*feats, *extra))))
        except ResolutionError as exc:
            k.note(None, None, "kv_cache_dtypes", False, f"{d.name}: not offered: {exc}")
            continue
        route = rot.vllm.route if rot.vllm is not None else None
        if not rot.supported or route is None or route.refusal is not None or d.base not in rot.vllm.kv_cache_dtypes:  # type: ignore[union-attr]
            why = rot.reason or (f"the rotated plan serves {rot.vllm.kv_cache_dtypes}, not {d.base}" if rot.vllm is not None and route is not None else "the rotated plan routes nothing in vLLM")
            k.note(None, None, "kv_cache_dtypes", False, f"{d.name}: not offered: {why}")
            continue
        patches = [pid for pid in PATCH_IDS if pid in (*route.patches, "register_kv_cache_dtypes")]
        out[d.name] = route.model_copy(update={
            "patches": patches, "accept": [*route.accept, d.name], "kv_cache_dtype": d.name, "base_dtype": d.base,
        })
        k.note(None, None, "kv_cache_dtypes", True, f"{d.name}: {d.base} with kv_rotation={d.kv_rotation}, registered with vLLM {f.vllm} ({rel.kv_cache_dtype_registry.api}); route {out[d.name].describe()}")
    return out


# ----------------------------------------------------------------------- version check


def _version_env(k: Known, bindings: Mapping[str, Binding], vplan: VllmPlan | None) -> dict[str, str]:
    f = k.facts
    env: dict[str, str] = {}
    if f.flashinfer is None or k.fi is None:
        return env
    vc = k.fi.version_check
    fv = f.flashinfer
    cubin_bad = f.flashinfer_cubin is not None and f.flashinfer_cubin != fv
    jit = f.flashinfer_jit_cache
    if jit is None:
        jit_bad = False
    elif vc.jit_cache_match == "prefix":
        jit_bad = not jit.startswith(fv)
    else:
        jit_bad = jit != fv and not jit.startswith(fv + "+")
    if not (cubin_bad or jit_bad):
        if f.flashinfer_cubin or jit:
            k.note(None, None, "version_check", True, "flashinfer-cubin / flashinfer-jit-cache match flashinfer-python")
        return env
    uses_native = any(b.impl == "native" for b in bindings.values())
    uses_xqa = (
        bindings["decode"].impl == "flashinfer"
        and f.arch_cc in k.fi.consumers["xqa_decode"].sms
        and vplan is not None
        and vplan.strategy in ("extend",)
    )
    cubin_kernels = uses_native or uses_xqa
    uses_fi_modules = any(b.impl in ("flashinfer", "dequant_fa3", "dequant_fa2") for b in bindings.values())
    what = []
    if cubin_bad:
        what.append(f"flashinfer-cubin {f.flashinfer_cubin}")
    if jit_bad:
        what.append(f"flashinfer-jit-cache {jit}")
    mism = " and ".join(what) + f" vs flashinfer-python {fv}"
    fix = f"pip install --no-deps flashinfer-cubin=={fv}" + (" (and the matching flashinfer-jit-cache, or uninstall it)" if jit_bad else "")
    if vc.on_mismatch == "raise":
        blockers = []
        if cubin_bad and cubin_kernels:
            blockers.append("the plan uses cubin-backed kernels (" + ("vLLM's native trtllm-gen path" if uses_native else "XQA decode") + ")")
        if jit_bad and uses_fi_modules:
            blockers.append("the plan uses FlashInfer JIT modules, which would be loaded from the mismatched flashinfer-jit-cache")
        if blockers:
            msg = f"{mism}: FlashInfer {fv} raises at import ({vc.evidence.split(' [')[0]}); not bypassing because {' and '.join(blockers)}. Fix: {fix}"
            k.log.warnings.append(msg)
            k.note(None, None, "version_check", False, msg)
        else:
            env["FLASHINFER_DISABLE_VERSION_CHECK"] = "1"
            k.note(None, None, "version_check", True, f"{mism}: FlashInfer {fv} raises at import; the plan uses no cubin-backed kernel (native/trtllm-gen/XQA), so FLASHINFER_DISABLE_VERSION_CHECK=1 is set")
            k.log.warnings.append(f"{mism}: setting FLASHINFER_DISABLE_VERSION_CHECK=1 (FlashInfer {fv} would raise at import; the plan uses no cubin-backed kernel). Cleaner fix: {fix}")
    else:
        extra = " The plan's native/XQA path needs those cubins: they will be downloaded on demand (fails offline)." if cubin_kernels else ""
        k.log.warnings.append(f"{mism}: FlashInfer {fv} ignores the mismatched package with a warning ('Ignoring incompatible ...').{extra} Fix: {fix}")
        k.note(None, None, "version_check", True, f"{mism}: FlashInfer {fv} only warns; no env change")
    return env


# -------------------------------------------------------------------------------- main


def resolve(
    matrix: Matrix,
    facts: SystemFacts,
    overrides: str | Mapping[str, str] | None = None,
    *,
    features: Iterable[str] = (),
) -> Plan:
    """Resolve the plan for ``facts``.

    Parameters
    ----------
    matrix : Matrix
        From :func:`nvfp4compat.load_matrix`.
    facts : SystemFacts
        From :func:`nvfp4compat.detect` or written by hand.
    overrides : str or mapping, optional
        Explicit implementation choice: ``"triton"``, ``{"write": "triton"}`` or
        ``"write=triton,decode=flashinfer"``. Beats ``facts.impl_env`` (``NVFP4COMPAT_IMPL``).
    features : iterable of str
        Features the caller needs (``nvfp4_4over6``, ``head_size_64``, ``sinks``, ``kv_rotation``):
        only implementations providing them are bound. ``kv_rotation`` (also requested by
        ``facts.kv_rotation_env``, i.e. ``NVFP4COMPAT_KV_ROTATION=hadamard``) rotates the cache:
        every bound op carries ``options["kv_rotation"]`` and ``plan.kv_rotation`` is set.

    Returns
    -------
    Plan
        Never raises for an unsupported system: the plan says ``supported=False`` and why.

    Raises
    ------
    ResolutionError
        When an explicit request (argument or ``NVFP4COMPAT_IMPL``) cannot run, or names an
        unknown op, implementation or feature.
    """
    feats = tuple(dict.fromkeys(features))
    for feat in feats:
        if feat not in FEATURES:
            raise ResolutionError(f"unknown feature {feat!r}; valid features are {list(FEATURES)}")
    rotation = parse_kv_rotation(facts.kv_rotation_env)
    if rotation is None and "kv_rotation" in feats:
        rotation = KV_ROTATIONS[0]
    if rotation is not None and "kv_rotation" not in feats:
        feats += ("kv_rotation",)
    log = _Log()
    arg = parse_impl_spec(overrides, source="argument")
    env_over = parse_impl_spec(facts.impl_env, source=ENV_IMPL)
    if env_over:
        log.note(None, None, "precedence", True, f"{ENV_IMPL}={facts.impl_env} applies to {sorted(set(env_over) - set(arg))}" + (f"; the explicit argument overrides {sorted(set(env_over) & set(arg))}" if set(env_over) & set(arg) else ""))
    k = _know(matrix, facts, feats, rotation, log)
    bindings, feats_out = _bind(k, arg, env_over)
    if rotation is not None:
        bindings = _tie_rotation(k, bindings, rotation)
    required = [op for op in OPS if matrix.implementations.ops[op].required]
    unbound = [op for op in required if bindings[op].impl is None]
    vplan = _vllm_plan(k, bindings, not unbound)
    env = _version_env(k, bindings, vplan)

    if facts.arch is None:
        k.log.warnings.append("no CUDA GPU detected: the plan cannot bind arch-dependent implementations; set NVFP4COMPAT_ARCH=sm_90 (for example) to plan for a given arch")
    if facts.trtllm_gen_usable is None and any(b.impl == "native" for b in bindings.values()):
        k.log.unverified.append("trtllm-gen usability: unknown, assumed usable for vLLM's native path")
        k.log.warnings.append("trtllm-gen usability is unknown (flashinfer-cubin not installed): vLLM probes NVIDIA's artifactory; if it then reports 'kv_cache_dtype not supported', set NVFP4COMPAT_IMPL=triton (or flashinfer)")
    if k.fi is not None and bindings["write"].impl == "flashinfer" and k.fi.scale_check.mode == "device_trap":
        k.log.warnings.append(f"FlashInfer {facts.flashinfer}'s writer checks a CUDA scale on the device and executes trap unless it is finite and > 0: a bad k_scale/v_scale leaves the CUDA context unusable")
    if k.fi is not None and bindings["write"].impl == "flashinfer" and k.fi.scale_check.mode == "host_sync":
        k.note("write", "flashinfer", "scale_check", True, f"FlashInfer {facts.flashinfer} validates a CUDA scale tensor on the host (one sync per call outside CUDA-graph capture)")

    reasons: list[str] = []
    if facts.arch is None and unbound:
        reasons.append("no GPU arch known (no CUDA device; set NVFP4COMPAT_ARCH)")
    a = k.arch
    if a is not None and unbound and not (a.fa2_nvfp4_read.value or a.triton_kernels.value or a.native_trtllm_path.value):
        reasons.append(
            f"{facts.arch} ({a.family}) is not supported: no NVFP4 reader runs on it "
            f"(arches.yaml: fa2_nvfp4_read, triton_kernels and native_trtllm_path are all false)"
        )
    for op in unbound:
        reasons.append(bindings[op].reason)
    if vplan is not None and vplan.strategy == "none" and not unbound:
        reasons.append(vplan.reason)
    reasons.extend(k.log.unreleased)
    supported = not reasons
    dq = bindings["dequant"]
    if dq.impl is None and supported:
        k.log.warnings.append(f"dequant: {dq.reason}")
    if vplan is not None:
        refusal = None
        if not supported and _refusable(k, bindings, vplan):
            refusal = f"nvfp4compat refuses --kv-cache-dtype nvfp4 on {facts.arch} with vLLM {facts.vllm}: {'; '.join(reasons)}"
        vplan = VllmPlan(**{**vplan.model_dump(exclude={"route"}), "route": _vllm_route(k, bindings, vplan, refusal)})
        if supported and rotation is None:
            dtype_routes = _dtype_routes(k, overrides, feats, vplan)
            if dtype_routes:
                vplan = VllmPlan(**{
                    **vplan.model_dump(exclude={"route", "dtype_routes"}), "route": vplan.route,
                    "kv_cache_dtypes": [*vplan.kv_cache_dtypes, *dtype_routes], "dtype_routes": dtype_routes,
                })
    return Plan(
        facts=facts,
        supported=supported,
        reason="; ".join(reasons) if reasons else None,
        bindings=bindings,
        vllm=vplan,
        features=feats_out,
        env=env,
        warnings=list(dict.fromkeys(k.log.release_warnings + k.log.warnings)),
        unverified=list(dict.fromkeys(k.log.unverified)),
        planned_from=dict(k.log.planned_from),
        release_warnings=list(dict.fromkeys(k.log.release_warnings)),
        trace=k.log.trace,
        nvfp4compat_version=__version__,
        kv_rotation=rotation,
    )

