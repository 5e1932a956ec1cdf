"""``nvfp4compat verify --emit`` on the installed vLLM: the probed facts equal the matrix entry's."""

from __future__ import annotations

import pytest

from nvfp4compat.emit import emit_vllm
from nvfp4compat.loader import _fill_version, load_matrix


def test_emit_vllm_probes_what_the_matrix_says(cpu_vllm) -> None:
    m = load_matrix()
    rel = m.vllm_release(cpu_vllm.version)
    if rel is None or rel.parsed <= m.vllm.releases[0].parsed:
        pytest.skip(f"vLLM {cpu_vllm.version}: not in the matrix, or nothing older to carry from")
    entry = _fill_version(emit_vllm(m), cpu_vllm.version)
    assert entry["pins"] == rel.pins.model_dump(exclude_none=True, exclude={"unpublished"})
    assert entry["requires_python"] == rel.requires_python
    assert entry["nvfp4_dtypes"] == rel.nvfp4_dtypes
    assert entry["gate"]["kind"] == rel.gate.kind
    assert entry["writer"]["name"] == rel.writer.name
    assert entry["requires_flashinfer_helpers"] == rel.requires_flashinfer_helpers
    assert {e["text"] for e in entry["errors"]} <= {e.text for e in rel.errors}
    # the KV-cache dtype registry (0.33.0+) is probed from vllm/config/cache.py
    assert ("kv_cache_dtype_registry" in entry) == (rel.kv_cache_dtype_registry is not None)
