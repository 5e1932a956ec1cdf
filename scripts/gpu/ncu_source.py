"""Rank the SASS lines of an Nsight Compute source-page export by its per-instruction counters.

``scripts/gpu/suite.sh variants`` with ``NCU_SOURCE=1`` writes, per profiled Gluon config, ``ncu --page source --csv
--print-source sass`` of the decode at 16 x 16K (``ncu-src-g<N>.log``) and prints this script's summary of it: for each
counter column whose name matches ``--columns`` (default: the excess global sectors and shared-memory wavefronts that
ncu's Source Counters section flags, and the warp-stall samples), the ``--top`` instructions with the largest values,
with their address and SASS text and their share of the column's total. Runs on a CPU (standard library only).

Usage: python3 scripts/gpu/ncu_source.py NCU_SOURCE.csv [--top N] [--columns REGEX]
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

DEFAULT_COLUMNS = r"excess|stall sampling \(all"


def _number(cell: str) -> float | None:
    text = cell.strip().replace(",", "")
    try:
        return float(text)
    except ValueError:
        return None


def read_table(text: str) -> tuple[list[str], list[list[str]]]:
    """The export's header (the first CSV row naming both an address and a source column) and the rows after it
    that have as many cells. Lines before the header (ncu's own messages, the program's output) are skipped."""
    rows = list(csv.reader(line for line in text.splitlines() if line.strip()))
    for i, row in enumerate(rows):
        names = [c.strip().lower() for c in row]
        if "source" in names and any("address" in n for n in names):
            return [c.strip() for c in row], [r for r in rows[i + 1:] if len(r) == len(row)]
    raise ValueError("no source-page header found: expected a CSV row with an 'Address' and a 'Source' column "
                     "(ncu --page source --csv --print-source sass); was the profile cut off?")


def rank(header: list[str], rows: list[list[str]], columns: str, top: int) -> list[str]:
    """Report lines: per matching numeric column, its total and the ``top`` rows by value."""
    want = re.compile(columns, re.IGNORECASE)
    lower = [h.lower() for h in header]
    src = lower.index("source")
    addr = next(i for i, h in enumerate(lower) if "address" in h)
    out: list[str] = []
    for j, name in enumerate(header):
        if j in (src, addr) or not want.search(name):
            continue
        vals = [(_number(r[j]), r) for r in rows]
        vals = [(v, r) for v, r in vals if v is not None]
        total = sum(v for v, _ in vals)
        if not vals or total <= 0:
            out.append(f"== {name}: no counts")
            continue
        out.append(f"== {name}: total {total:,.0f} over {len(vals)} instructions")
        for v, r in sorted(vals, key=lambda x: -x[0])[:top]:
            out.append(f"  {v:>12,.0f} {100 * v / total:5.1f}%  {r[addr].strip():>8}  {r[src].strip()}")
    if not out:
        out.append(f"no column matches {columns!r}; columns: {', '.join(header)}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", type=Path)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--columns", default=DEFAULT_COLUMNS, help="regex over the column names (case-insensitive)")
    a = ap.parse_args(argv)
    try:
        header, rows = read_table(a.path.read_text(errors="replace"))
    except (OSError, ValueError) as e:
        print(f"{a.path}: {e}", file=sys.stderr)
        return 1
    print("\n".join(rank(header, rows, a.columns, a.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
