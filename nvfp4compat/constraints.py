"""Install lines for a vLLM release with another FlashInfer release (``nvfp4compat constraints``).

vLLM pins ``flashinfer-python==X`` exactly; using another FlashInfer (e.g. 0.6.15 with vLLM
0.26.0, to get the slot-mapping writer) means installing it over the pin with ``--no-deps``, or
a uv override file. This module says how, whether the combination is known to work
(``vllm.yaml`` ``combinations``), and what the version check needs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from nvfp4compat.spec import Matrix
from nvfp4compat.versions import parse_version

__all__ = ["ConstraintsReport", "constraints"]


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


def constraints(m: Matrix, vllm: str, flashinfer: str) -> ConstraintsReport:
    """Install lines for ``vllm`` with ``flashinfer``.

    Raises
    ------
    ValueError
        When either release is unknown to the matrix (the message lists the known ones).
    """
    vr = m.vllm_release(vllm)
    if vr is None:
        raise ValueError(f"vLLM {vllm} is not in matrix/vllm.yaml; known releases: {', '.join(r.version for r in m.vllm.releases)}")
    fr = m.flashinfer_release(flashinfer)
    if fr is None:
        raise ValueError(f"FlashInfer {flashinfer} is not in matrix/flashinfer.yaml; known releases: {', '.join(r.version for r in m.flashinfer)}")
    pinned = vr.pins.flashinfer_python
    cubin = vr.pins.flashinfer_cubin
    notes: list[str] = []
    same = parse_version(pinned) == parse_version(flashinfer)
    combo = next((c for c in m.vllm.combinations if parse_version(c.vllm) == vr.parsed and parse_version(c.flashinfer) == fr.parsed), None)
    if same:
        status, why = "pinned", f"FlashInfer {flashinfer} is vLLM {vllm}'s own pin: a plain install gives it"
    elif combo is not None:
        status, why = f"known combination ({combo.status})", f"{combo.why} [{combo.evidence}]"
    else:
        status, why = "unverified combination", "not listed in vllm.yaml combinations: resolve a plan for it and test it before relying on it"
    pip_lines = [f"pip install vllm=={vllm}"]
    uv = [f"flashinfer-python=={flashinfer}"]
    if not same:
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
        notes.append("pip reports the vLLM pin as a dependency conflict; that is expected with --no-deps")
    if fr.cpu_import.default_deps == "fails":
        notes.append(
            f"on a CPU-only machine (tests), FlashInfer {flashinfer} fails to import when nvidia-cutlass-dsl is installed; "
            f"install it --no-deps with: {' '.join(fr.cpu_import.requirements)}"
        )
    return ConstraintsReport(vllm=vr.version, flashinfer=fr.version, pinned_flashinfer=pinned, pinned_cubin=cubin, status=status, why=why,
                             pip_lines=pip_lines, uv_overrides=uv, notes=notes)
