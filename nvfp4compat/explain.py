"""Map a known error message to its cause and fix (``nvfp4compat doctor --explain "<text>"``).

The entries live in ``matrix/errors.yaml``; ``{placeholders}`` in their cause/fix are filled
from the rest of the matrix (e.g. which FlashInfer releases ship the slot-mapping writer), so
the advice never drifts from the matrix.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

from nvfp4compat.resolver import release_span
from nvfp4compat.spec import ErrorEntry, Matrix

__all__ = ["Explanation", "check_placeholders", "explain", "render_errors", "render_explanations"]


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
    writers = m.releases_with_helper(m.implementations.flashinfer_helper("write") or "")
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


def check_placeholders(m: Matrix) -> Matrix:
    """Fail at load time when an ``errors.yaml`` cause/fix names a placeholder the matrix cannot fill.

    Called by :func:`nvfp4compat.loader.load_matrix`, so a bad entry is a :class:`MatrixError` naming
    the file, the entry and the field, instead of a ``KeyError`` when ``--explain`` first matches it.
    Returns ``m``.
    """
    from nvfp4compat.loader import MatrixError

    known = _placeholders(m)
    for e in m.errors:
        for field in ("cause", "fix"):
            text = getattr(e, field)
            try:
                names = {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}
            except ValueError as exc:
                raise MatrixError(f"errors.yaml: {e.id}: {field}: {exc} (write a literal brace as {{{{ or }}}})") from None
            bad = sorted(n for n in names if n not in known)
            if bad:
                raise MatrixError(
                    f"errors.yaml: {e.id}: {field}: unknown placeholder(s) {', '.join('{' + n + '}' for n in bad)}; "
                    f"valid placeholders are {', '.join('{' + n + '}' for n in sorted(known))}"
                )
    return m


# Longest line matched; a pasted log is matched line by line, so a regex cost stays linear in its size.
_MAX_LINE = 4096


def _matches(entry: ErrorEntry, text: str) -> bool:
    low = text.lower()
    for pat in entry.match:
        if entry.regex:
            rx = re.compile(pat, re.IGNORECASE)
            if any(rx.search(line[:_MAX_LINE]) for line in text.splitlines()):
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


def render_errors(m: Matrix) -> str:
    """The known error messages (``nvfp4compat errors``): each entry's id, source and what it matches."""
    lines = [f"{len(m.errors)} known error messages (nvfp4compat doctor --explain \"<text>\" gives cause and fix):"]
    for e in m.errors:
        lines.append(f"[{e.id}] from {e.source}")
        for pat in e.match:
            lines.append(f"  {'regex' if e.regex else 'text '}: {pat}")
    return "\n".join(lines)


def render_explanations(text: str, found: list[Explanation]) -> str:
    if not found:
        return (
            f"no known NVFP4 error matches {text[:80]!r}. Run `nvfp4compat doctor` for this machine's plan; "
            "`nvfp4compat errors` lists the known messages."
        )
    lines = []
    for ex in found:
        lines.append(f"[{ex.id}] from {ex.source}")
        lines.append(f"  cause: {ex.cause}")
        lines.append(f"  fix:   {ex.fix}")
        lines.append(f"  evidence: {ex.evidence} ({ex.status})")
    return "\n".join(lines)
