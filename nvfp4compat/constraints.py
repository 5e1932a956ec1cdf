"""Install lines for a vLLM release with another FlashInfer release (``nvfp4compat constraints``).

vLLM pins ``flashinfer-python==X`` exactly; using another FlashInfer (e.g. 0.6.15 with vLLM
0.26.0, to get the slot-mapping writer) means installing it over the pin with ``--no-deps``, or
a uv override file. This module says how, whether the combination is known to work
(``vllm.yaml`` ``combinations``), and what the version check needs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from nvfp4compat.spec import Matrix, VllmRelease
from nvfp4compat.versions import parse_version

__all__ = ["ConstraintsReport", "constraints", "default_flashinfer"]


@dataclass(frozen=True)
class ConstraintsReport:
    vllm: str
    flashinfer: str
    pinned_flashinfer: str
    pinned_cubin: str | None
    status: str
    why: str
    pip_lines: list[str]
    uv_overrides: list[str]
    notes: list[str] = field(default_factory=list)

    def render_text(self) -> str:
        out = [f"vLLM {self.vllm} (pins flashinfer-python=={self.pinned_flashinfer}" + (f", flashinfer-cubin=={self.pinned_cubin}" if self.pinned_cubin else "") + f") with FlashInfer {self.flashinfer}: {self.status}"]
        out.append(f"  {self.why}")
        out.append("pip:")
        out.extend(f"  {line}" for line in self.pip_lines)
        out.append(f"uv (overrides.txt, then `uv pip install vllm=={self.vllm} --override overrides.txt`):")
        out.extend(f"  {line}" for line in self.uv_overrides)
        out.extend(f"note: {n}" for n in self.notes)
        return "\n".join(out)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def default_flashinfer(m: Matrix, vllm: str) -> tuple[str, str]:
    """The FlashInfer release to install with ``vllm`` when none is asked for, and why.

    vLLM's own pin when it is on the package index; otherwise the release ``pins.unpublished`` names
    (``install_instead``), which the matrix runs it with.

    Raises
    ------
    ValueError
        When ``vllm`` is not in ``matrix/vllm.yaml``.
    """
    vr = _vllm(m, vllm)
    unpublished = vr.pins.unpublished_pin("flashinfer_python")
    if unpublished is None:
        return vr.pins.flashinfer_python, f"vLLM {vr.version}'s pin"
    return unpublished.install_instead, (
        f"installed instead of vLLM {vr.version}'s pin flashinfer-python=={vr.pins.flashinfer_python}, which is not on "
        "the package index"
    )


def _vllm(m: Matrix, vllm: str) -> VllmRelease:
    vr = m.vllm_release(vllm)
    if vr is None:
        raise ValueError(
            f"vLLM {vllm} is not in matrix/vllm.yaml, so its pins are unknown; known releases: "
            f"{', '.join(r.version for r in m.vllm.releases)} (index checked {m.vllm.index_checked.date}: newest "
            f"{m.vllm.index_checked.newest})"
        )
    return vr


def constraints(m: Matrix, vllm: str, flashinfer: str | None = None) -> ConstraintsReport:
    """Install lines for ``vllm`` with ``flashinfer`` (default: :func:`default_flashinfer`).

    When vLLM pins a FlashInfer release that is not on the package index, ``pip install vllm==X``
    cannot work: the pip lines install vLLM ``--no-deps``, then its own requirements without the
    flashinfer-python pin, then the FlashInfer release; uv overrides the pin.

    Raises
    ------
    ValueError
        When either release is unknown to the matrix (the message lists the known ones).
    """
    vr = _vllm(m, vllm)
    notes: list[str] = []
    if flashinfer is None:
        flashinfer, chosen = default_flashinfer(m, vllm)
        notes.append(f"--flashinfer not given: FlashInfer {flashinfer} ({chosen})")
    fr = m.flashinfer_release(flashinfer)
    if fr is None:
        raise ValueError(f"FlashInfer {flashinfer} is not in matrix/flashinfer.yaml; known releases: {', '.join(r.version for r in m.flashinfer)}")
    pinned = vr.pins.flashinfer_python
    cubin = vr.pins.flashinfer_cubin
    unpublished = vr.pins.unpublished_pin("flashinfer_python")
    same = parse_version(pinned) == parse_version(flashinfer)
    combo = next((c for c in m.vllm.combinations if parse_version(c.vllm) == vr.parsed and parse_version(c.flashinfer) == fr.parsed), None)
    if same:
        status, why = "pinned", f"FlashInfer {flashinfer} is vLLM {vllm}'s own pin: a plain install gives it"
    elif combo is not None:
        status, why = f"known combination ({combo.status})", f"{combo.why} [{combo.evidence}]"
    else:
        status, why = "unverified combination", "not listed in vllm.yaml combinations: resolve a plan for it and test it before relying on it"
    uv = [f"flashinfer-python=={flashinfer}"]
    if unpublished is not None:
        # `pip install vllm==X` fails on the missing pin: vLLM without its dependencies, then its own
        # requirements minus the flashinfer-python pin, then the FlashInfer release.
        pip_lines = [
            f"pip install --no-deps vllm=={vr.version}",
            "python -c \"import importlib.metadata as md; print('\\n'.join(r for r in md.requires('vllm') "
            "if not r.startswith('flashinfer-python') and 'extra ==' not in r))\" > vllm-requirements.txt",
            "pip install -r vllm-requirements.txt",
            f"pip install flashinfer-python=={flashinfer}",
        ]
        notes.append(
            f"vLLM {vr.version} pins flashinfer-python=={pinned}, which is not on the package index: a plain "
            f"`pip install vllm=={vr.version}` fails (\"No matching distribution found for flashinfer-python=={pinned}\")"
        )
    else:
        pip_lines = [f"pip install vllm=={vr.version}"]
    if not same:
        if unpublished is None:
            pip_lines.append(f"pip install --no-deps flashinfer-python=={flashinfer}")
        if cubin is not None:
            pip_lines.append(f"pip install --no-deps flashinfer-cubin=={flashinfer}")
            uv.append(f"flashinfer-cubin=={flashinfer}")
            if fr.version_check.on_mismatch == "raise":
                notes.append(
                    f"vLLM {vllm} pins flashinfer-cubin=={cubin}; FlashInfer {flashinfer} raises at import on a mismatched cubin, so "
                    f"install flashinfer-cubin=={flashinfer} too, or set FLASHINFER_DISABLE_VERSION_CHECK=1 when the plan uses no cubin kernel "
                    "(native/trtllm-gen/XQA) — nvfp4compat's plan sets it in that case"
                )
        if vr.requires_flashinfer_helpers:
            missing = [h for h in vr.requires_flashinfer_helpers if not fr.helpers[h].present]
            if missing:
                status = "does not work"
                why = f"vLLM {vllm} imports {', '.join(missing)} from flashinfer at module load; FlashInfer {flashinfer} lacks it"
        notes.append("pip reports the vLLM pin as a dependency conflict; that is expected with --no-deps" if unpublished is None
                     else f"`pip check` reports vLLM's flashinfer-python=={pinned} pin as unmet; that is expected")
    if fr.cpu_import.default_deps == "fails":
        notes.append(
            f"on a CPU-only machine (tests), FlashInfer {flashinfer} fails to import when nvidia-cutlass-dsl is installed; "
            f"install it --no-deps with: {' '.join(fr.cpu_import.requirements)}"
        )
    return ConstraintsReport(vllm=vr.version, flashinfer=fr.version, pinned_flashinfer=pinned, pinned_cubin=cubin, status=status, why=why,
                             pip_lines=pip_lines, uv_overrides=uv, notes=notes)
