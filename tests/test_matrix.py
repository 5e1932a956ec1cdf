"""The capability matrix: loading, strictness, cross-file validation, and the facts it must carry."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from nvfp4compat.loader import FILES, MatrixError, load_matrix, matrix_dir
from nvfp4compat.spec import HELPERS, PATCH_IDS, Matrix
from nvfp4compat.versions import Version, VersionError, parse_version, public_version

SLOT = "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping"
DQ = "nvfp4_kv_dequantize_paged"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def m() -> Matrix:
    return load_matrix()


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def _load(path: Path) -> dict:
    return yaml.load(path.read_text(), Loader=_LOADER)


def _dump(path: Path, data: dict) -> None:
    path.write_text(yaml.dump(data, Dumper=_DUMPER, sort_keys=False))


def _copy_matrix(tmp_path: Path) -> Path:
    d = tmp_path / "matrix"
    shutil.copytree(matrix_dir(), d)
    return d


# ------------------------------------------------------------------------------ versions


@pytest.mark.parametrize(
    "text, norm",
    [
        ("0.6.15", "0.6.15"),
        ("0.6.15.post1", "0.6.15.post1"),
        ("0.7.0rc1", "0.7.0rc1"),
        ("0.7.5.dev20261101", "0.7.5.dev20261101"),
        ("2.13.0+cpu", "2.13.0+cpu"),
        ("0.0.0+unknown", "0.0.0+unknown"),
        ("v1.2", "1.2"),
    ],
)
def test_parse_version_forms(text: str, norm: str) -> None:
    assert str(parse_version(text)) == norm


def test_version_ordering_follows_pep440() -> None:
    chain = ["0.7.5.dev1", "0.7.5a1", "0.7.5rc1", "0.7.5", "0.7.5+cu129", "0.7.5.post1", "0.7.6"]
    parsed = [parse_version(v) for v in chain]
    assert parsed == sorted(parsed)
    assert parse_version("0.7") == parse_version("0.7.0")
    assert parse_version("0.6.16.post3") > parse_version("0.6.16")
    assert public_version("0.6.15+cu129") == parse_version("0.6.15")
    assert isinstance(parse_version("1.0"), Version)


@pytest.mark.parametrize("bad", ["latest", "", "0.6.x", "1..2", "nightly-2026", "0.7.0 rc"])
def test_parse_version_rejects_nonsense(bad: str) -> None:
    with pytest.raises(VersionError, match="expected a PEP 440 version"):
        parse_version(bad)


# ------------------------------------------------------------------------------- loading


def test_matrix_loads_from_source_checkout(m: Matrix) -> None:
    assert matrix_dir() == REPO / "matrix" or (matrix_dir() / "flashinfer.yaml").is_file()
    assert load_matrix() is m  # cached


def test_flashinfer_releases_cover_0_6_10_to_0_7_4(m: Matrix) -> None:
    versions = [r.version for r in m.flashinfer]
    for needed in ("0.6.10", "0.6.13", "0.6.14", "0.6.15", "0.6.15.post1", "0.6.16", "0.6.16.post3", "0.6.17",
                   "0.6.18", "0.6.18.post1", "0.7.0", "0.7.0.post1", "0.7.2.post1", "0.7.4"):
        assert needed in versions
    assert versions[0] == "0.6.10" and versions[-1] == "0.7.4"


def test_every_vllm_pin_is_a_known_flashinfer_release(m: Matrix) -> None:
    assert [r.version for r in m.vllm.releases] == ["0.25.1", "0.26.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"]
    for r in m.vllm.releases:
        unpublished = r.pins.unpublished_pin("flashinfer_python")
        if unpublished is None:
            assert m.flashinfer_release(r.pins.flashinfer_python) is not None, r.version
        else:
            assert m.flashinfer_release(r.pins.flashinfer_python) is None, r.version
            assert m.flashinfer_release(unpublished.install_instead) is not None, r.version
    assert m.vllm_release("0.25.1").pins.flashinfer_cubin == "0.6.13"


def test_vllm_0_34_0_records_its_unpublished_flashinfer_pin(m: Matrix) -> None:
    r = m.vllm_release("0.34.0")
    assert r is not None
    assert (r.pins.torch, r.pins.flashinfer_python) == ("2.14.0", "0.7.3")
    u = r.pins.unpublished_pin("flashinfer_python")
    assert u is not None and u.install_instead == "0.7.4" and "0.7.3" in u.evidence
    assert m.vllm.index_checked.newest == "0.34.0"
    assert m.flashinfer_index_checked is not None and m.flashinfer_index_checked.newest == "0.7.4"


def _vllm_yaml_with(tmp_path: Path, old: str, new: str) -> Path:
    src = matrix_dir()
    for f in src.glob("*.yaml"):
        text = f.read_text()
        if f.name == "vllm.yaml":
            assert old in text
            text = text.replace(old, new, 1)
        (tmp_path / f.name).write_text(text)
    return tmp_path


def test_unpublished_pin_must_name_a_known_release_to_install_instead(tmp_path: Path) -> None:
    d = _vllm_yaml_with(tmp_path, 'install_instead: "0.7.4"', 'install_instead: "0.7.9"')
    with pytest.raises(MatrixError, match=r"install_instead 0.7.9 is not a release in flashinfer.yaml"):
        load_matrix(d)


def test_unknown_pin_without_unpublished_entry_is_an_error(tmp_path: Path) -> None:
    d = _vllm_yaml_with(tmp_path, 'flashinfer_python: "0.7.2.post1"\n    requires_python', 'flashinfer_python: "0.7.3"\n    requires_python')
    with pytest.raises(MatrixError, match=r"pins flashinfer-python==0.7.3, which flashinfer.yaml does not know"):
        load_matrix(d)


def test_index_checked_must_not_be_older_than_the_releases(tmp_path: Path) -> None:
    d = _vllm_yaml_with(tmp_path, 'newest: "0.34.0"', 'newest: "0.33.0"')
    with pytest.raises(MatrixError, match=r"index_checked.newest: 0.33.0 is older than the newest release"):
        load_matrix(d)


def test_arches_cover_the_issue_list(m: Matrix) -> None:
    assert list(m.arches) == ["sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_100", "sm_103", "sm_107", "sm_110", "sm_120", "sm_121"]
    assert m.arches["sm_90"].fa2_nvfp4_read.value and not m.arches["sm_90"].native_e2m1.value
    assert m.arches["sm_100"].native_trtllm_path.value and not m.arches["sm_120"].native_trtllm_path.value
    assert m.arches["sm_120"].xqa_nvfp4.value and not m.arches["sm_90"].xqa_nvfp4.value
    assert not m.arches["sm_110"].triton_kernels.value and not m.arches["sm_75"].triton_kernels.value


def test_helper_facts_per_release(m: Matrix) -> None:
    has = {r.version: r.helpers[SLOT].present for r in m.flashinfer}
    assert not any(v for k, v in has.items() if parse_version(k) < parse_version("0.6.15"))
    assert all(v for k, v in has.items() if parse_version(k) >= parse_version("0.6.15"))
    r615 = m.flashinfer_release("0.6.15")
    assert r615.helpers[SLOT].exports == ["flashinfer", "flashinfer.page"]
    assert r615.helpers[SLOT].defined_at == "flashinfer/page.py:743"
    assert r615.helpers[DQ].compute_capability == [80, 86, 89, 90, 100, 103, 110, 120, 121]
    assert 107 in m.flashinfer_release("0.6.16").helpers[DQ].compute_capability
    assert m.flashinfer_release("0.7.4").nvfp4_4over6.writer_param
    assert not m.flashinfer_release("0.7.2.post1").nvfp4_4over6.writer_param
    assert m.flashinfer_release("0.7.4").scale_check.mode == "device_trap"
    assert m.flashinfer_release("0.6.15").scale_check.mode == "host_sync"


def test_version_check_and_trtllm_and_cpu_import_facts(m: Matrix) -> None:
    for r in m.flashinfer:
        expected = "warn" if r.parsed >= parse_version("0.7.2") else "raise"
        assert r.version_check.on_mismatch == expected, r.version
        assert (107 in r.consumers["trtllm_gen"].sms) == (r.parsed >= parse_version("0.6.16")), r.version
        assert all("cutlass" not in q for q in r.cpu_import.requirements)
        assert any(q.startswith("apache-tvm-ffi") for q in r.cpu_import.requirements)
        assert any(q.startswith("numpy") for q in r.cpu_import.requirements) == (r.parsed >= parse_version("0.6.18"))
    assert m.flashinfer_release("0.6.13").cpu_import.default_deps == "ok"
    assert m.flashinfer_release("0.6.14").cpu_import.default_deps == "fails"
    for v in ("0.6.14", "0.6.15", "0.7.4"):
        assert m.flashinfer_release(v).cpu_import.requirements_status == "verified"


def test_vllm_release_facts(m: Matrix) -> None:
    for r in m.vllm.releases:
        new = r.parsed >= parse_version("0.32.0")
        assert r.gate.kind == ("fa2_families" if new else "fam100_trtllm")
        assert r.writer.name == ("flashinfer_slot_mapping" if new else "reshape_and_cache_flash")
        assert ("nvfp4_4over6" in r.nvfp4_dtypes) == (r.parsed >= parse_version("0.28.0"))
        assert r.strategy.for_arch("sm_86") == ("extend" if new else "backport")
        assert r.strategy.for_arch("sm_100") == "native"
        assert r.strategy.for_arch("sm_75") == r.strategy.for_arch("sm_110") == "none"
        assert any(e.text == "kv_cache_dtype not supported" for e in r.errors)
        assert (r.plugin.decode == ["triton"]) == (not new)
        # declared strategy agrees with the stock paths
        for arch in r.strategy.extend:
            assert r.stock_for(arch) is not None and r.stock_for(arch).path == "fa2"
        for arch in r.strategy.backport:
            assert r.stock_for(arch) is None
        for arch in r.strategy.native:
            assert r.stock_for(arch).path == "native"
    assert set(m.vllm.patches) == set(PATCH_IDS)
    assert m.vllm.backport_patches == ["gate_nvfp4", "metadata_builder", "kv_cache_update", "forward_reader"]


def test_preferences_are_one_list_per_family_and_op(m: Matrix) -> None:
    hopper = m.preference_for("sm_90")
    assert hopper.decode.order == ["triton", "flashinfer"] and hopper.write.order[0] == "flashinfer"
    assert "BENCHMARKS.md" in hopper.decode.reason and hopper.decode.status == "verified"
    assert hopper.dequant.order[0] == "triton"
    assert m.preference_for("sm_100").decode.order[0] == "native"
    assert m.preference_for("sm_130").family == "unknown"


def test_every_claim_has_evidence_and_status(m: Matrix) -> None:
    def walk(obj: object, path: str) -> None:
        if isinstance(obj, dict):
            if "status" in obj:
                assert obj["status"] in ("verified", "read", "expected"), path
                assert "evidence" in obj or "reason" in obj, path
            for k, v in obj.items():
                walk(v, f"{path}.{k}")
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                walk(v, f"{path}[{i}]")

    dumped = m.model_dump()
    walk(dumped, "matrix")
    for r in m.flashinfer:
        for h in HELPERS:
            assert r.helpers[h].evidence and r.helpers[h].status


# ----------------------------------------------------------------------- malformed YAML


def test_duplicate_key_is_an_error_naming_file_and_key(tmp_path: Path) -> None:
    d = _copy_matrix(tmp_path)
    text = (d / "arches.yaml").read_text()
    text = text.replace("  sm_80:\n", "  sm_80:\n    major: 8\n", 1)
    (d / "arches.yaml").write_text(text)
    with pytest.raises(MatrixError, match=r"arches\.yaml.*duplicate key 'major'"):
        load_matrix(d)


def test_unknown_field_names_file_entry_field_and_value(tmp_path: Path) -> None:
    d = _copy_matrix(tmp_path)
    data = _load(d / "flashinfer.yaml")
    data["flashinfer"][9]["helpers"][SLOT]["colour"] = "blue"
    _dump(d / "flashinfer.yaml", data)
    with pytest.raises(MatrixError) as ei:
        load_matrix(d)
    msg = str(ei.value)
    assert "[flashinfer.yaml]" in msg and "(0.6.15)" in msg and "colour" in msg and "'blue'" in msg


def test_bad_status_lists_allowed_values(tmp_path: Path) -> None:
    d = _copy_matrix(tmp_path)
    data = _load(d / "arches.yaml")
    data["arches"]["sm_90"]["hw_e4m3"]["status"] = "probably"
    _dump(d / "arches.yaml", data)
    with pytest.raises(MatrixError, match=r"\[arches\.yaml\] sm_90\.hw_e4m3\.status: .*'verified'.*'probably'"):
        load_matrix(d)


def test_vllm_pin_to_unknown_flashinfer_is_a_cross_file_error(tmp_path: Path) -> None:
    d = _copy_matrix(tmp_path)
    text = (d / "vllm.yaml").read_text().replace('flashinfer_python: "0.6.14"', 'flashinfer_python: "0.6.9"', 1)
    (d / "vllm.yaml").write_text(text)
    with pytest.raises(MatrixError, match=r"pins flashinfer-python==0\.6\.9, which flashinfer\.yaml does not know"):
        load_matrix(d)


def test_malformed_version_and_missing_file(tmp_path: Path) -> None:
    d = _copy_matrix(tmp_path)
    text = (d / "flashinfer.yaml").read_text().replace('- version: "0.6.12"', '- version: "latest"', 1)
    (d / "flashinfer.yaml").write_text(text)
    with pytest.raises(MatrixError, match=r"invalid version 'latest'"):
        load_matrix(d)
    (d / FILES["errors"]).unlink()
    with pytest.raises(MatrixError, match=r"errors\.yaml: cannot read"):
        load_matrix(d)


def test_strategy_must_cover_every_arch(tmp_path: Path) -> None:
    d = _copy_matrix(tmp_path)
    data = _load(d / "vllm.yaml")
    data["vllm"]["releases"][0]["strategy"]["none"] = ["sm_75"]
    _dump(d / "vllm.yaml", data)
    with pytest.raises(MatrixError, match=r"arches \['sm_110'\] have no strategy"):
        load_matrix(d)


# ------------------------------------------------------------------- flashinfer.yaml as deltas


def test_flashinfer_yaml_stores_deltas_that_expand_to_full_entries(m: Matrix) -> None:
    raw = _load(matrix_dir() / "flashinfer.yaml")["flashinfer"]
    assert [r["version"] for r in raw] == [r.version for r in m.flashinfer]
    # most releases repeat the previous one: they state only their version and evidence
    bare = [r["version"] for r in raw if set(r) == {"version", "evidence"}]
    assert len(bare) >= 8, bare
    post = m.flashinfer_release("0.6.16.post2")
    assert post is not None and "version" not in raw[[r["version"] for r in raw].index("0.6.16.post2")].get("helpers", {})
    # inherited text names the release it belongs to, never the one it was inherited from
    slot = post.helpers["nvfp4_quantize_append_paged_kv_cache_with_slot_mapping"]
    assert "[0.6.16.post2]" in slot.evidence and "[0.6.16]" not in slot.evidence
    assert "{version}" not in m.model_dump_json()


def test_delta_inherits_entry_by_entry_and_fills_the_version() -> None:
    from nvfp4compat.loader import expand_flashinfer

    first = {
        "version": "1.0", "evidence": "e",
        "helpers": {"a": {"x": "a.py:1 [{version}]"}, "b": {"x": "b"}},
        "consumers": {"c": {"sms": [80]}},
        "nvfp4_4over6": {"n": "{version}"}, "scale_check": {}, "version_check": {"message": "{installed} {flashinfer}"},
        "cpu_import": {},
    }  # fmt: skip
    second = {"version": "1.1", "evidence": "f", "helpers": {"b": {"x": "b2 [{version}]"}}, "scale_check": {"m": 1}}
    a, b = expand_flashinfer([first, second])
    assert a["helpers"] == {"a": {"x": "a.py:1 [1.0]"}, "b": {"x": "b"}}
    assert b["helpers"] == {"a": {"x": "a.py:1 [1.1]"}, "b": {"x": "b2 [1.1]"}}
    assert b["nvfp4_4over6"] == {"n": "1.1"} and b["scale_check"] == {"m": 1} and b["consumers"] == {"c": {"sms": [80]}}
    assert b["version_check"]["message"] == "{installed} {flashinfer}"  # other placeholders are kept


def test_first_flashinfer_release_must_state_every_section(tmp_path: Path) -> None:
    d = _copy_matrix(tmp_path)
    data = _load(d / "flashinfer.yaml")
    del data["flashinfer"][0]["scale_check"]
    _dump(d / "flashinfer.yaml", data)
    with pytest.raises(MatrixError, match=r"flashinfer\[0\] \(0.6.10\): scale_check is missing; the first release must state"):
        load_matrix(d)


def test_a_delta_is_validated_as_strictly_as_a_full_entry(tmp_path: Path) -> None:
    d = _copy_matrix(tmp_path)
    data = _load(d / "flashinfer.yaml")
    data["flashinfer"][1]["helpers"] = {"nvfp4_kv_dequantize": {"present": "maybe"}}
    _dump(d / "flashinfer.yaml", data)
    with pytest.raises(MatrixError, match=r"\[flashinfer.yaml\] \[1\] \(0.6.10.post1\).helpers.nvfp4_kv_dequantize"):
        load_matrix(d)


# ------------------------------------------------------------------------------- evidence

# What a reader can open: an upstream file (path with an extension, ":line" where it applies, "[release]"),
# vllm.yaml's FI:/BE: abbreviations of the release's flashinfer.py/backend.py (file:line), a URL (an
# upstream PR, a PyPI page), a "vllm#N"/"flashinfer#N" PR reference, or a path in this repo.
_OPENABLE = re.compile(
    r"[\w./*-]+\.(py|cuh|cu|h|hpp|cpp|inc|jinja|md|txt|yaml|whl|toml|sh|json)\b|\b(FI|BE):\d+|https?://\S+|\b(vllm|flashinfer)#\d+"
)


def _evidence_strings(node: object, path: str = "") -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if isinstance(v, str) and "evidence" in k:
                out.append((f"{path}.{k}", v))
            else:
                out.extend(_evidence_strings(v, f"{path}.{k}"))
    elif isinstance(node, list):
        for i, x in enumerate(node):
            out.extend(_evidence_strings(x, f"{path}[{i}]"))
    return out


def test_every_evidence_points_at_something_openable(m: Matrix) -> None:
    found = _evidence_strings(json.loads(m.model_dump_json()))
    assert len(found) > 500
    bad = [f"{p}: {e[:100]}" for p, e in found if not _OPENABLE.search(e)]
    assert not bad, "\n".join(bad)


def test_a_matrix_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    d = _copy_matrix(tmp_path)
    with open(d / "arches.yaml", "ab") as f:
        f.write(b"\n# \xff\xfe\n")
    with pytest.raises(MatrixError, match=r"arches\.yaml: not UTF-8 text .*save it as UTF-8"):
        load_matrix(d)


def test_whitespace_only_evidence_is_refused(tmp_path: Path) -> None:
    d = _copy_matrix(tmp_path)
    data = _load(d / "vllm.yaml")
    data["vllm"]["releases"][0]["evidence"] = "   "
    _dump(d / "vllm.yaml", data)
    with pytest.raises(MatrixError, match=r"evidence is blank"):
        load_matrix(d)
