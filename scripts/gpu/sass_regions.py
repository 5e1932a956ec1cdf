"""Cut a kernel's SASS into straight runs and loops, and count each one's instructions.

``python -m nvfp4compat.kernels.aot 90 --only LABEL --sass DIR`` writes each variant's SASS as ``cuobjdump`` prints
it; this script reads it as that module does (:func:`nvfp4compat.kernels.aot.sass_listing`). It finds the loops (a
branch back to an earlier address: its target is the loop's head, the branch its end) and cuts the code at every
loop head, after every loop end and after every ``EXIT``. For each piece it prints the address range, the number of instructions, how many loops hold it, and its
most frequent opcodes. What a program runs once (set-up, epilogue) and what it runs per iteration then read apart:
the static counts behind BENCHMARKS.md run AA's breakdown of one short request's decode. A static count is not an
executed one: which pieces run, and how often, depends on the launch (ncu's ``smsp__inst_executed`` counts them).
Runs on a CPU.

Usage: python3 scripts/gpu/sass_regions.py KERNEL.sass [--top N]
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from nvfp4compat.kernels.aot import sass_listing, sass_opcode  # noqa: E402

_BRANCH = re.compile(r"\bBRA\b[^;]*?(0x[0-9a-f]+)")


def regions(instrs: list[tuple[int, str]]) -> list[dict]:
    """The pieces between loop heads, loop ends and exits, in address order: ``start``, ``end`` (exclusive),
    ``count``, ``depth`` (how many loops hold the piece) and ``ops`` (opcode counts)."""
    if not instrs:
        return []
    step = instrs[1][0] - instrs[0][0] if len(instrs) > 1 else 16
    end = instrs[-1][0] + step
    loops = []
    cuts = {instrs[0][0], end}
    for addr, text in instrs:
        m = _BRANCH.search(text)
        if m and int(m.group(1), 16) <= addr:
            loops.append((int(m.group(1), 16), addr + step))
            cuts |= {int(m.group(1), 16), addr + step}
        if sass_opcode(text) == "EXIT":
            cuts.add(addr + step)
    bounds = sorted(c for c in cuts if instrs[0][0] <= c <= end)
    out = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        body = [text for addr, text in instrs if a <= addr < b]
        if not body:
            continue
        depth = sum(1 for head, tail in loops if head <= a and b <= tail)
        out.append({"start": a, "end": b, "count": len(body), "depth": depth,
                    "ops": collections.Counter(sass_opcode(t) for t in body)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sass", type=Path, help="a .sass file (python -m nvfp4compat.kernels.aot --sass DIR)")
    ap.add_argument("--top", type=int, default=6, help="opcodes listed per piece (default 6)")
    args = ap.parse_args(argv)
    instrs = sass_listing(args.sass.read_text(errors="replace"))
    if not instrs:
        print(f"sass_regions: no SASS instruction found in {args.sass}; it needs cuobjdump's listing, as "
              "`python -m nvfp4compat.kernels.aot --sass DIR` writes it", file=sys.stderr)
        return 1
    print(f"{args.sass.name}: {len(instrs)} instructions")
    print(f"{'start':>7} {'end':>7} {'instrs':>6}  loop  opcodes")
    for r in regions(instrs):
        ops = ", ".join(f"{k} {v}" for k, v in r["ops"].most_common(args.top))
        print(f"{r['start']:#7x} {r['end']:#7x} {r['count']:6d}  {'*' * r['depth'] or '-':4s}  {ops}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
