"""Render the capability matrix as Markdown (the README compatibility table) or JSON.

``nvfp4compat matrix --format markdown`` prints :func:`matrix_markdown`; README.md carries that
text between ``<!-- matrix:begin -->`` and ``<!-- matrix:end -->`` and a test fails when the two
differ. Cells are computed by resolving a plan per (vLLM release, arch) with the pinned
FlashInfer release, Triton installed and trtllm-gen usable, so the table is the resolver's own
answer, not a hand-written copy.
"""

from __future__ import annotations

import json
from typing import Any

from nvfp4compat.api import query
from nvfp4compat.resolver import release_span
from nvfp4compat.spec import Matrix

__all__ = ["matrix_json", "matrix_markdown", "vllm_cell"]


def vllm_cell(m: Matrix, vllm: str, arch: str) -> str:
    """One cell of the vLLM x arch table: strategy and bound writer/readers."""
    plan = query(arch, None, vllm, triton=True, trtllm_gen_usable=True, impl_env=None, matrix=m)
    if not plan.supported:
        return "no"
    assert plan.vllm is not None
    if plan.vllm.strategy == "native":
        return "native"
    w, d, p = (plan.bindings[o].impl or "-" for o in ("write", "decode", "prefill"))
    abbrev = {"flashinfer": "FI", "triton": "Triton", "native": "native", "dequant_fa3": "deq+FA3",
              "dequant_fa2": "deq+FA2", "-": "-"}  # fmt: skip
    reader = abbrev[d] if d == p else f"{abbrev[d]}/{abbrev[p]}"
    return f"{plan.vllm.strategy}: W {abbrev[w]}, R {reader}"


def _arch_groups(m: Matrix, rows: list[list[str]]) -> list[tuple[list[str], list[str]]]:
    """Merge adjacent arch columns whose cells are identical in every row."""
    arches = list(m.arches)
    groups: list[tuple[list[str], list[str]]] = []
    for j, a in enumerate(arches):
        col = [r[j] for r in rows]
        if groups and groups[-1][1] == col:
            groups[-1][0].append(a)
        else:
            groups.append(([a], col))
    return groups


def _sm_label(arches: list[str]) -> str:
    nums = [a[3:] for a in arches]
    return "SM" + "/".join(nums)


def matrix_markdown(m: Matrix) -> str:
    """The README compatibility tables (vLLM x arch, then FlashInfer releases)."""
    rows = [[vllm_cell(m, r.version, a) for a in m.arches] for r in m.vllm.releases]
    groups = _arch_groups(m, rows)
    out: list[str] = []
    out.append("| vLLM (pinned FlashInfer) | " + " | ".join(_sm_label(g[0]) for g in groups) + " |")
    out.append("|---|" + "---|" * len(groups))
    for i, r in enumerate(m.vllm.releases):
        u = r.pins.unpublished_pin("flashinfer_python")
        pin = r.pins.flashinfer_python if u is None else f"{r.pins.flashinfer_python}, unpublished: {u.install_instead}"
        out.append(f"| {r.version} ({pin}) | " + " | ".join(g[1][i] for g in groups) + " |")
    out.append("")
    out.append(
        "Cells: patch strategy, then the bound writer (W) and readers (R); FI = FlashInfer, `native` = vLLM's own "
        "trtllm-gen path, `no` = unsupported (`nvfp4compat query --arch ... --vllm ...` says why). Assumes the pinned "
        "FlashInfer (or, for a pin that is not on the package index, the release named after it), Triton installed and trtllm-gen usable on SM100/103/107."
    )
    out.append("")
    out.append("| FlashInfer | slot-mapping writer | paged dequant | writer `nvfp4_4over6` | trtllm-gen SMs | writer scale check | cubin/jit-cache mismatch | CPU `import flashinfer` (default deps) |")
    out.append("|---|---|---|---|---|---|---|---|")
    writer, dequant = (m.implementations.flashinfer_helper(op) or "" for op in ("write", "dequant"))
    for rel in m.flashinfer:
        h = rel.helpers
        out.append(
            f"| {rel.version} | {'yes' if h[writer].present else 'no'} "
            f"| {'yes' if h[dequant].present else 'no'} "
            f"| {'yes' if rel.nvfp4_4over6.writer_param else 'no'} "
            f"| {', '.join(str(s) for s in rel.consumers['trtllm_gen'].sms)} "
            f"| {rel.scale_check.mode.replace('_', ' ')} "
            f"| {rel.version_check.on_mismatch}s at import "
            f"| {rel.cpu_import.default_deps} |"
        )
    out.append("")
    writers = m.releases_with_helper(m.implementations.flashinfer_helper("write") or "")
    out.append(
        f"Slot-mapping writer in {release_span(m, writers)}. Every release imports on a CPU-only torch with "
        "`--no-deps` and the minimal set in `matrix/flashinfer.yaml` (`cpu_import.requirements`)."
    )
    return "\n".join(out) + "\n"


def matrix_json(m: Matrix) -> str:
    """The whole matrix plus the computed vLLM x arch cells, as JSON."""
    data: dict[str, Any] = m.model_dump(mode="json")
    data["computed"] = {
        "vllm_by_arch": {r.version: {a: vllm_cell(m, r.version, a) for a in m.arches} for r in m.vllm.releases},
    }
    return json.dumps(data, indent=2)
