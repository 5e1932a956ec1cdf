"""Write tests/data/plan_snapshot.json: the resolved plan of every FlashInfer release x arch and every
vLLM release x arch (with the FlashInfer the matrix installs with it), for tests/test_matrix_snapshot.py.

Regenerate only when a matrix change is meant to change plans:
``python scripts/snapshot_plans.py``; a compaction of the YAML must leave the file unchanged.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nvfp4compat.api import query  # noqa: E402
from nvfp4compat.loader import load_matrix  # noqa: E402

OUT = ROOT / "tests" / "data" / "plan_snapshot.json"


def _facts(plan) -> dict:  # noqa: ANN001
    return {
        "supported": plan.supported,
        "reason": plan.reason,
        "bindings": {op: [b.impl, b.source, b.options] for op, b in plan.bindings.items()},
        "vllm": None if plan.vllm is None else plan.vllm.model_dump(mode="json"),
        "features": plan.features,
        "env": plan.env,
        "warnings": plan.warnings,
        "unverified": plan.unverified,
    }


def snapshot() -> dict[str, dict]:
    m = load_matrix()
    out: dict[str, dict] = {}
    for arch in m.arches:
        for r in m.flashinfer:
            out[f"flashinfer {r.version} {arch}"] = _facts(query(arch, r.version, impl_env=None, kv_rotation=None, cudagraph_decode=None, matrix=m))
        for v in m.vllm.releases:
            out[f"vllm {v.version} {arch}"] = _facts(query(arch, None, v.version, impl_env=None, kv_rotation=None, cudagraph_decode=None, matrix=m))
    return out


if __name__ == "__main__":
    OUT.write_text(json.dumps(snapshot(), indent=None, sort_keys=True, separators=(",", ":")).replace("},\"", "},\n\"") + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")
