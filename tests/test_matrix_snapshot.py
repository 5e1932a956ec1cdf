"""The matrix resolves to the same plans as the snapshot taken before the YAML was compacted.

``tests/data/plan_snapshot.json`` holds the plan (support, bindings, vLLM strategy and patches,
features, environment, warnings, unverified notes) of every FlashInfer release x arch and every vLLM
release x arch. A change to ``matrix/*.yaml`` that only changes how facts are stored (ranges of
releases, deltas) must leave every plan equal; one meant to change facts regenerates the file with
``python scripts/snapshot_plans.py`` and shows the diff in review.
"""

from __future__ import annotations

import json
from pathlib import Path

from _scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT = ROOT / "tests" / "data" / "plan_snapshot.json"


def _snapshot_module():  # noqa: ANN202
    return load_script(ROOT / "scripts" / "snapshot_plans.py", "snapshot_plans")


def test_every_release_x_arch_resolves_as_in_the_snapshot() -> None:
    expected = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    actual = json.loads(json.dumps(_snapshot_module().snapshot()))
    assert sorted(actual) == sorted(expected), "the release x arch combinations changed"
    changed = [key for key in expected if actual[key] != expected[key]]
    assert not changed, f"{len(changed)} plans changed, first {changed[:5]}: {actual[changed[0]]} != {expected[changed[0]]}"


def test_snapshot_covers_every_release_and_arch() -> None:
    from nvfp4compat.loader import load_matrix

    m = load_matrix()
    keys = set(json.loads(SNAPSHOT.read_text(encoding="utf-8")))
    for arch in m.arches:
        assert {f"flashinfer {r.version} {arch}" for r in m.flashinfer} <= keys
        assert {f"vllm {r.version} {arch}" for r in m.vllm.releases} <= keys
