"""Map a known error message to its cause and fix (``nvfp4compat doctor --explain "<text>"``).

The entries live in ``matrix/errors.yaml``; ``{placeholders}`` in their cause/fix are filled
from the rest of the matrix (e.g. which FlashInfer releases ship the slot-mapping writer), so
the advice never drifts from the matrix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nvfp4compat.resolver import release_span
from nvfp4compat.spec import ErrorEntry, Matrix

__all__ = ["Explanation", "explain", "render_explanations"]


@dataclass(frozen=True)
class Explanation:
    """One matched entry with its placeholders filled."""

    id: str
    source: str
    cause: str
    fix: str
    evidence: str
    status: str


def _placeholders(m: Matrix) -> dict[str, str]:
    writers = m.releases_with_helper("nvfp4_quantize_append_paged_kv_cache_with_slot_mapping")
    raise_rel = [r.version for r in m.flashinfer if r.version_check.on_mismatch == "raise"]
    cpu_fail = [r.version for r in m.flashinfer if r.cpu_import.default_deps == "fails"]
    last = m.flashinfer[-1].helpers["nvfp4_kv_dequantize_paged"]
    return {
        "writer_releases": release_span(m, writers),
        "first_writer_release": writers[0] if writers else "(none)",
        "raise_releases": release_span(m, raise_rel),
        "cpu_fail_releases": release_span(m, cpu_fail),
        "dequant_sms": ", ".join(str(s) for s in (last.compute_capability or [])),
    }


def _matches(entry: ErrorEntry, text: str) -> bool:
    low = text.lower()
    for pat in entry.match:
        if entry.regex:
            if re.search(pat, text, re.IGNORECASE):
                return True
        elif pat.lower() in low:
            return True
    return False


def explain(m: Matrix, text: str) -> list[Explanation]:
    """Every ``errors.yaml`` entry whose pattern occurs in ``text`` (case-insensitive), in file order."""
    ph = _placeholders(m)
    out = []
    for e in m.errors:
        if _matches(e, text):
            out.append(Explanation(e.id, e.source, e.cause.format(**ph), e.fix.format(**ph), e.evidence, e.status))
    return out


def render_explanations(text: str, found: list[Explanation]) -> str:
    if not found:
        return (
            f"no known NVFP4 error matches {text[:80]!r}. Run `nvfp4compat doctor` for this machine's plan; "
            "known messages are listed in matrix/errors.yaml."
        )
    lines = []
    for ex in found:
        lines.append(f"[{ex.id}] from {ex.source}")
        lines.append(f"  cause: {ex.cause}")
        lines.append(f"  fix:   {ex.fix}")
        lines.append(f"  evidence: {ex.evidence} ({ex.status})")
    return "\n".join(lines)
