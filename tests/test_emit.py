"""``nvfp4compat verify --emit``: the matrix entry of the installed FlashInfer, from verify's probes.

With a real FlashInfer installed (nox ``flashinfer(<version>)`` sessions, marker ``flashinfer``) the
emitted entry has the same facts as the one in ``matrix/flashinfer.yaml`` (every field but evidence
prose). Without one, the delta and its YAML are checked on the matrix's own entries.
"""

from __future__ import annotations

import importlib.metadata
import json
from typing import Any

import pytest
import yaml

from nvfp4compat import emit
from nvfp4compat.cli import main
from nvfp4compat.loader import _fill_version, expand_flashinfer, load_matrix
from nvfp4compat.spec import FlashInferRelease


def _installed() -> str | None:
    try:
        return importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        return None


# Releases whose whole entry (carried facts included) the emitter reproduces; others: the probed facts.
REPRODUCED = ("0.6.15", "0.7.2.post1", "0.7.4")

needs_fi = pytest.mark.skipif(_installed() is None, reason="flashinfer-python is not installed (run via nox -s flashinfer)")


def _facts(node: Any) -> Any:
    """Everything but evidence prose (``*evidence``, ``*reason``)."""
    if isinstance(node, dict):
        return {k: _facts(v) for k, v in node.items() if not k.endswith(("evidence", "reason"))}
    if isinstance(node, list):
        return [_facts(x) for x in node]
    return node


@pytest.mark.flashinfer
@needs_fi
def test_emit_reproduces_the_matrix_entry_of_the_installed_release(capsys: pytest.CaptureFixture[str]) -> None:
    m = load_matrix()
    template = emit.emit_flashinfer(m)
    version = template["version"]
    rel = m.flashinfer_release(version)
    assert rel is not None, f"flashinfer {version} is not in matrix/flashinfer.yaml"
    # the emitted entry passes the strict schema, and has the facts of the stored one
    emitted = json.loads(FlashInferRelease.model_validate(_fill_version(template, version)).model_dump_json(exclude_none=True))
    stored = json.loads(rel.model_dump_json(exclude_none=True))
    full = json.loads(json.dumps(emitted))
    if version not in REPRODUCED:
        # what no probe sees is carried from the release before; it may differ (0.6.14's CPU import)
        for node in (emitted, stored):
            node.pop("cpu_import")
            for consumer in ("fa2_decode", "fa2_prefill", "xqa_decode"):
                node["consumers"][consumer]["sms"] = bool(node["consumers"][consumer]["sms"])
    assert _facts(emitted) == _facts(stored)
    # the printed delta, expanded on the previous release, is the same entry again
    rc = main(["verify", "--emit"])
    out = capsys.readouterr().out
    assert rc == 0
    delta = next(item for item in yaml.safe_load(out) if "helpers" in item or "cpu_import" in item)
    previous = emit._stored_template(m, emit._previous(m, version))
    expanded = expand_flashinfer([previous, delta])[1]
    expanded = json.loads(FlashInferRelease.model_validate(expanded).model_dump_json(exclude_none=True))
    assert _facts(expanded) == _facts(full)


def test_delta_of_an_unchanged_release_is_its_version_and_evidence() -> None:
    m = load_matrix()
    rel = m.flashinfer_release("0.6.16.post2")
    assert rel is not None
    template = emit._stored_template(m, rel)
    delta = emit.flashinfer_delta(m, template)
    assert set(delta) == {"version", "evidence"} and delta["version"] == "0.6.16.post2"


def test_delta_keeps_only_what_changed_and_renders_as_the_file_does() -> None:
    m = load_matrix()
    rel = m.flashinfer_release("0.7.4")
    assert rel is not None
    template = emit._stored_template(m, rel)
    delta = emit.flashinfer_delta(m, template)
    previous = emit._stored_template(m, emit._previous(m, "0.7.4"))
    for key in ("nvfp4_4over6", "scale_check"):  # 0.7.4 adds the writer's 4over6 and the device check
        assert delta[key] == template[key]
    assert "version_check" not in delta and "cpu_import" not in delta
    text = emit.render_delta(delta)
    assert text.startswith('- version: "0.7.4"\n')
    assert "[{version}]" in text
    expanded = expand_flashinfer([previous, yaml.safe_load(text)[0]])[1]
    assert _facts(expanded) == _facts(json.loads(rel.model_dump_json(exclude_none=True)))


def test_emit_without_flashinfer_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(emit, "import_guarded", lambda name: (None, "ModuleNotFoundError: No module named 'flashinfer'"))
    with pytest.raises(emit.EmitError, match=r"cannot import flashinfer .*install it the CPU-importable way"):
        emit.emit_flashinfer(load_matrix())
    monkeypatch.setattr(importlib.metadata, "version", lambda dist: "0.7.4")
    rc = main(["verify", "--emit"])
    assert rc == 2 and "cannot import flashinfer" in capsys.readouterr().err


def test_emit_refuses_a_release_older_than_the_matrix() -> None:
    with pytest.raises(emit.EmitError, match=r"older than every release in matrix/flashinfer.yaml \(0.6.10\)"):
        emit._previous(load_matrix(), "0.6.9")


# ----------------------------------------------------------------------------------- vLLM wheel

_FI_PY = """from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    nvfp4_quantize_append_paged_kv_cache_with_slot_mapping,
)


def _nvfp4_kv_on_fa2() -> bool:
    return True


class FlashInferBackend:
    supported_kv_cache_dtypes: list = ["auto", "fp8", "nvfp4", "nvfp4_4over6"]

    @classmethod
    def supports_kv_cache_dtype(cls, kv_cache_dtype):
        return True

    def supports_combination(self):
        return "fa2 prefill misreads an NVFP4 KV cache at head_size 64"


def write():
    nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(1)
"""


def _wheel(tmp_path, version: str, requires: list[str]):  # noqa: ANN202
    import zipfile

    path = tmp_path / f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    meta = "Metadata-Version: 2.1\nName: vllm\nVersion: " + version + "\nRequires-Python: <3.15,>=3.11\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"vllm-{version}.dist-info/METADATA", meta)
        z.writestr("vllm/v1/attention/backends/flashinfer.py", _FI_PY)
        z.writestr("vllm/v1/attention/backend.py", 'REASONS = ["kv_cache_dtype not supported"]\n')
    return path


def test_emit_vllm_reads_a_downloaded_wheel(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    wheel = _wheel(tmp_path, "0.35.0", ["torch==2.15.0", "flashinfer-python==0.7.5", 'vllm-extra==1; extra == "x"'])
    entry = emit.emit_vllm(load_matrix(), wheel)
    assert entry["version"] == "0.35.0"
    assert entry["pins"] == {"torch": "2.15.0", "flashinfer_python": "0.7.5"}
    assert entry["requires_python"] == ">=3.11" and entry["nvfp4_dtypes"] == ["nvfp4", "nvfp4_4over6"]
    assert entry["gate"]["kind"] == "fa2_families" and entry["gate"]["evidence"].startswith("vllm/v1/attention/backends/flashinfer.py:15 [{version}]")
    assert entry["writer"] == {"name": "flashinfer_slot_mapping", "evidence": "vllm/v1/attention/backends/flashinfer.py:23 [{version}] flashinfer_slot_mapping", "status": "read"}
    assert entry["requires_flashinfer_helpers"] == ["nvfp4_quantize_append_paged_kv_cache_with_slot_mapping"]
    texts = {e["text"]: e["evidence"] for e in entry["errors"]}
    assert texts == {  # 0.34.0's messages this file has, with their lines; the others are dropped
        "kv_cache_dtype not supported": "vllm/v1/attention/backend.py:1 [{version}]",
        "fa2 prefill misreads an NVFP4 KV cache at head_size 64": "vllm/v1/attention/backends/flashinfer.py:19 [{version}]",
    }
    assert entry["strategy"]["evidence"].startswith("not probed; as vLLM 0.34.0: ")
    rc = main(["verify", "--emit", "--wheel", str(wheel)])
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith("# matrix/vllm.yaml") and '- version: "0.35.0"' in out and "[0.35.0]" in out
    assert yaml.safe_load(out)[0]["pins"]["torch"] == "2.15.0"


def test_emit_vllm_refuses_what_it_cannot_read(tmp_path) -> None:
    m = load_matrix()
    with pytest.raises(emit.EmitError, match=r"older than every release in matrix/vllm.yaml \(0.25.1\)"):
        emit.emit_vllm(m, _wheel(tmp_path, "0.20.0", ["torch==2.9.0", "flashinfer-python==0.6.0"]))
    with pytest.raises(emit.EmitError, match=r"pins no torch==/flashinfer-python=="):
        emit.emit_vllm(m, _wheel(tmp_path, "0.35.1", ["torch>=2.15"]))
    bad = tmp_path / "x.whl"
    bad.write_text("not a zip")
    with pytest.raises(emit.EmitError, match=r"cannot read .*x.whl as a wheel"):
        emit.emit_vllm(m, bad)
