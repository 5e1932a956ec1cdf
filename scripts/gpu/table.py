"""Print a bench_attention JSON (complete or cut off) as a ratio table, one line per row:

    shape | row | ms (CUDA graph) | vs the shape's default config in % | x FlashInfer bf16 | x FlashInfer fp8

The row is DEFAULT for the default Triton config, BASELINE for ``--baseline``'s, the knob for a ``--knob`` row,
the DecodeConfig fields that differ from the default's for a sweep row (e.g. ``ring=4``), and the FlashInfer
variant for FlashInfer's rows. A row without a graph time prints its note. Runs on a CPU (standard library only):
``scripts/gpu/suite.sh variants`` prints it after the benchmark; ported from run S's ``table.py``
(docs/validation-runs/2026-12-05-h100-s/scripts/).

Usage: python3 scripts/gpu/table.py BENCH.json [BENCH.json ...]
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

FIELD = re.compile(r"(\w+)=([^,()\s]+)")
FLASHINFER = re.compile(r"^FlashInfer \S+ ")


def fields(config: str) -> dict[str, str]:
    """The ``name=value`` pairs inside a config's ``DecodeConfig(...)`` (empty when it has none)."""
    m = re.search(r"\w+Config\((.*?)\)", config)
    return dict(FIELD.findall(m.group(1))) if m else {}


def is_default(row: dict[str, Any]) -> bool:
    return str(row["impl"]).startswith("triton") and "baseline" not in str(row["impl"]) and str(
        row["config"]
    ).startswith("default")


def label(row: dict[str, Any], default: dict[str, str]) -> str:
    impl, config = str(row["impl"]), str(row["config"])
    if impl.startswith("FlashInfer"):
        return "FlashInfer " + FLASHINFER.sub("", impl)
    if "baseline" in impl:
        return "BASELINE " + config.split("(")[0]
    if is_default(row):
        return "DEFAULT"
    if config.startswith("knob"):
        return config
    own = fields(config)
    diff = [f"{k}={v}" for k, v in own.items() if default.get(k) != v]
    if own and default:
        return " ".join(diff) or "= DEFAULT"
    return config


def table(data: dict[str, Any]) -> list[str]:
    rows = [r for r in data.get("rows", []) if isinstance(r, dict) and "shape" in r]
    base: dict[str, float] = {}
    base_fields: dict[str, dict[str, str]] = {}
    fi: dict[str, dict[str, float]] = {"bf16": {}, "fp8": {}}
    for r in rows:
        s, ms = str(r["shape"]), r.get("ms_graph")
        if is_default(r) and s not in base_fields:
            base_fields[s] = fields(str(r["config"]))
            if ms:
                base[s] = float(ms)
        impl = str(r["impl"])
        if impl.startswith("FlashInfer") and ms:
            for kind in fi:
                if f" {kind} " in f" {FLASHINFER.sub('', impl)} ":
                    fi[kind].setdefault(s, float(ms))
    out = [
        str(data.get("env", "")) + ("" if data.get("complete", True) else " (CUT OFF: the shapes done so far)"),
        f"{'shape':24} {'row':48} {'ms':>8} {'vs dflt':>8} {'x FI bf16':>9} {'x FI fp8':>8}",
    ]
    for r in rows:
        s, ms = str(r["shape"]), r.get("ms_graph")
        tag = label(r, base_fields.get(s, {}))
        if ms is None:
            out.append(f"{s[:24]:24} {tag[:48]:48} {'--':>8} {str(r.get('note', ''))[:80]}")
            continue
        ms = float(ms)
        vs_d = f"{100 * (ms / base[s] - 1):+7.1f}%" if base.get(s) else f"{'-':>8}"
        vs = [f"{ms / fi[k][s]:.3f}x" if fi[k].get(s) else "-" for k in ("bf16", "fp8")]
        out.append(f"{s[:24]:24} {tag[:48]:48} {ms:8.4f} {vs_d} {vs[0]:>9} {vs[1]:>8}")
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    rc = 0
    for path in argv:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            print(f"table.py: {path}: {e}", file=sys.stderr)
            rc = 1
            continue
        if not isinstance(data, dict):
            print(f"table.py: {path}: not a bench_attention JSON (no 'rows')", file=sys.stderr)
            rc = 1
            continue
        print("\n".join(table(data)))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
