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


def _installed() -> str | None:
    try:
        return importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        return None


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
    emitted = json.loads(json.dumps(_fill_version(template, version)))
    stored = json.loads(rel.model_dump_json(exclude_none=True))
    assert _facts(emitted) == _facts(stored)
    # the printed delta, expanded on the previous release, is the same entry again
    rc = main(["verify", "--emit"])
    out = capsys.readouterr().out
    assert rc == 0
    delta = yaml.safe_load(out)[0]
    previous = emit._stored_template(m, emit._previous(m, version))
    expanded = expand_flashinfer([previous, delta])[1]
    assert _facts(expanded) == _facts(stored)


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
    monkeypatch.setattr(emit, "_import", lambda name: (None, "ModuleNotFoundError: No module named 'flashinfer'"))
    with pytest.raises(emit.EmitError, match=r"cannot import flashinfer .*install it the CPU-importable way"):
        emit.emit_flashinfer(load_matrix())
    rc = main(["verify", "--emit"])
    assert rc == 2 and "cannot import flashinfer" in capsys.readouterr().err


def test_emit_refuses_a_release_older_than_the_matrix() -> None:
    with pytest.raises(emit.EmitError, match=r"older than every release in matrix/flashinfer.yaml \(0.6.10\)"):
        emit._previous(load_matrix(), "0.6.9")
