"""``docs/patches.md`` lists exactly the targets the code declares, overrides and applies."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.version import Version

from nvfp4compat.vllm_plugin.patches import (
    DTYPE_REGISTRY_TARGET,
    PATCH_TARGETS,
    PLUGIN_PATCH_IDS,
    REGISTRY_TARGET,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "patches.md"
FI = "vllm.v1.attention.backends.flashinfer"
_COLUMNS = ["target", "kind", "patch ids", "why", "how", "vLLM releases", "upstream", "remove when"]


def ledger_rows() -> dict[str, dict[str, str]]:
    """The rows of the "Ledger" table, keyed by full target name (``FI.`` expanded)."""
    text = DOC.read_text()
    section = text.split("## Ledger", 1)[1]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == _COLUMNS, header
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == len(_COLUMNS), line
        row = dict(zip(_COLUMNS, cells, strict=True))
        target = row["target"].strip("`").replace("FI.", f"{FI}.", 1)
        assert target not in rows, f"duplicate ledger row {target}"
        for column in _COLUMNS:
            assert row[column], f"{target}: empty {column!r}"
        rows[target] = row
    return rows


def doc_targets() -> dict[str, set[str]]:
    return {t: {p.strip() for p in r["patch ids"].split(",")} for t, r in ledger_rows().items()}


def code_targets() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for patch_id, targets in PATCH_TARGETS.items():
        for target in targets:
            out.setdefault(target, set()).add(patch_id)
    return out


def test_ledger_table_matches_patch_targets():
    assert doc_targets() == code_targets()
    kinds = {t: r["kind"] for t, r in ledger_rows().items()}
    assert kinds.pop(REGISTRY_TARGET) == "registry"
    assert kinds.pop(DTYPE_REGISTRY_TARGET) == "dtype registry"
    assert set(kinds.values()) == {"override"}


def test_patch_id_table_lists_every_id():
    section = DOC.read_text().split("## Patch ids", 1)[1].split("## Ledger", 1)[0]
    ids = re.findall(r"^\| `([a-z0-9_]+)` \|", section, flags=re.M)
    assert ids == list(PLUGIN_PATCH_IDS)


def test_every_override_exists_in_vllm_and_in_the_subclass(cpu_vllm):
    """Each override target is a real attribute of the release's class and is defined by the
    registered subclass; the subclasses override nothing the ledger does not list."""
    from nvfp4compat.vllm_plugin import backend

    ours = {
        "FlashInferBackend": backend.Nvfp4CompatFlashInferBackend,
        "FlashInferMetadataBuilder": backend.Nvfp4CompatMetadataBuilder,
        "FlashInferImpl": backend.Nvfp4CompatFlashInferImpl,
    }
    installed = Version(Version(cpu_vllm.version).base_version)
    rows = ledger_rows()
    listed = set()
    for target in code_targets():
        if target == REGISTRY_TARGET:
            continue
        if target == DTYPE_REGISTRY_TARGET:  # a vLLM function, not a class attribute
            import vllm.config.cache as cache_module

            span = re.match(r"(\d+\.\d+\.\d+)-(\d+\.\d+\.\d+)", rows[target]["vLLM releases"])
            assert span is not None, f"{target}: vLLM releases must start with LOW-HIGH"
            exists = hasattr(cache_module, "register_kv_cache_dtype")
            assert exists == (Version(span[1]) <= installed <= Version(span[2])), (target, cpu_vllm.version)
            continue
        cls_name, attr = target.removeprefix(f"{FI}.").split(".")
        listed.add((cls_name, attr))
        assert attr in vars(ours[cls_name]), f"{ours[cls_name].__name__} does not override {attr}"
        span = re.match(r"(\d+\.\d+\.\d+)-(\d+\.\d+\.\d+)", rows[target]["vLLM releases"])
        assert span is not None, f"{target}: vLLM releases must start with LOW-HIGH"
        exists = hasattr(getattr(cpu_vllm.fi, cls_name), attr)
        if Version(span[1]) <= installed <= Version(span[2]):
            assert exists, f"vLLM {cpu_vllm.version} has no {target} (ledger: {span[0]})"
        else:
            assert not exists, (
                f"vLLM {cpu_vllm.version} has {target}: widen its ledger range {span[0]}"
            )
    defined = {
        (name, attr)
        for name, cls in ours.items()
        for attr, value in vars(cls).items()
        if callable(value) or isinstance(value, (classmethod, staticmethod))
        if not attr.startswith("__") or attr == "__init__"
        if not attr.startswith("_nvfp4")
    }
    assert defined == listed, f"undocumented overrides: {sorted(defined - listed)}"


def test_applied_targets_are_in_the_ledger(cpu_vllm, clean_plugin):
    from vllm_cpu_support import load_plugin_through_entry_point

    from nvfp4compat import vllm_plugin

    for arch in ("sm_90", "sm_86"):
        vllm_plugin.unpatch()
        cpu_vllm.set_arch(arch)
        load_plugin_through_entry_point()
        assert vllm_plugin.last_plan() is not None, "register() resolved no plan"
        route = vllm_plugin.active_route()
        applied = vllm_plugin.applied()
        plan = vllm_plugin.last_plan()
        dtype_routes = plan.vllm.dtype_routes.values() if plan.vllm is not None else ()
        expected = {t for r in (route, *dtype_routes) if r is not None for p in r.patches for t in PATCH_TARGETS[p]}
        if route is not None and route.refusal is not None:
            expected = set(PATCH_TARGETS["refuse_nvfp4"])
        assert set(applied) == expected, arch
        documented = doc_targets()
        for target, ids in applied.items():
            assert set(ids) <= documented[target], (target, ids)
