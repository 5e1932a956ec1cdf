"""Load and validate the capability matrix (``matrix/*.yaml``).

The wheel ships the repo-root ``matrix/`` as package data at ``nvfp4compat/matrix`` (hatch
``force-include``); a source checkout or editable install falls back to the repo-root copy.
Loading is cached per directory. Any problem (a YAML syntax error, a duplicate key, an
unknown or missing field, a cross-file contradiction) raises :class:`MatrixError` naming the
file, the entry, the field, what was found and what is allowed.
"""

from __future__ import annotations

import functools
import importlib.resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from nvfp4compat.spec import Matrix

__all__ = ["FILES", "MatrixError", "expand_flashinfer", "load_matrix", "matrix_dir"]

FILES: dict[str, str] = {
    "arches": "arches.yaml",
    "flashinfer": "flashinfer.yaml",
    "vllm": "vllm.yaml",
    "implementations": "implementations.yaml",
    "errors": "errors.yaml",
}


# Optional top-level keys of a file besides its main key, and the Matrix field each one fills.
_EXTRA_TOP_LEVEL: dict[str, dict[str, str]] = {
    "flashinfer": {"index_checked": "flashinfer_index_checked"},
}


class MatrixError(ValueError):
    """The matrix YAML is malformed or contradictory."""


_BaseLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _UniqueKeyLoader(_BaseLoader):
    """A safe loader (libyaml when available) that refuses duplicate mapping keys.

    Plain YAML silently keeps the last of two equal keys; here that is an error.
    """


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r} (first at line {seen[key] + 1}); each key may appear once",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def matrix_dir() -> Path:
    """The directory holding the matrix YAML files.

    The installed package's ``nvfp4compat/matrix`` when present (a wheel install), else the
    repo-root ``matrix/`` next to the package (a source checkout or editable install).
    """
    try:
        pkg = importlib.resources.files("nvfp4compat") / "matrix"
        if pkg.is_dir() and (pkg / FILES["flashinfer"]).is_file():
            return Path(str(pkg))
    except (ModuleNotFoundError, FileNotFoundError):  # pragma: no cover - defensive
        pass
    repo = Path(__file__).resolve().parent.parent / "matrix"
    if (repo / FILES["flashinfer"]).is_file():
        return repo
    raise MatrixError(
        f"matrix YAML not found: neither the package data directory nvfp4compat/matrix nor {repo} "
        "holds flashinfer.yaml; reinstall nvfp4compat (the wheel force-includes matrix/)"
    )


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise MatrixError(f"{path.name}: cannot read {path}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise MatrixError(
            f"{path.name}: not UTF-8 text ({path}, byte {exc.start}: {exc.reason}); save it as UTF-8 "
            "or restore it from the release (git checkout / reinstall nvfp4compat)"
        ) from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "unknown position"
        raise MatrixError(f"{path.name}: invalid YAML at {where}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise MatrixError(f"{path.name}: invalid YAML: {exc}") from None


# flashinfer.yaml stores each release as a delta on the release before it: these sections, and each
# helper and consumer inside ``helpers``/``consumers``, may be left out to mean "as the previous
# release", with ``{version}`` in its text read as this release's version.
_FI_WHOLE_SECTIONS = ("nvfp4_4over6", "scale_check", "version_check", "cpu_import")
_FI_OPTIONAL_SECTIONS = ("fa3_ragged", "fa2_ragged")  # inherited when the previous release has it
_FI_KEYED_SECTIONS = ("helpers", "consumers")
VERSION_PLACEHOLDER = "{version}"


def _fill_version(node: Any, version: str) -> Any:
    """``node`` with every ``{version}`` in its strings replaced by ``version`` (other braces kept)."""
    if isinstance(node, str):
        return node.replace(VERSION_PLACEHOLDER, version)
    if isinstance(node, list):
        return [_fill_version(x, version) for x in node]
    if isinstance(node, dict):
        return {k: _fill_version(v, version) for k, v in node.items()}
    return node


def expand_flashinfer(releases: Any) -> Any:
    """Expand the delta form of ``flashinfer.yaml`` into one full entry per release.

    Each release inherits from the release before it every section it leaves out (``helpers`` and
    ``consumers`` entry by entry); ``{version}`` in any string (its own or inherited) becomes the
    release's version. The first release must state everything. Anything not a list of mappings is
    returned unchanged for the schema to reject.

    Raises
    ------
    MatrixError
        When a section is left out of the first release, or ``helpers``/``consumers`` is not a mapping.
    """
    if not isinstance(releases, list):
        return releases
    out: list[Any] = []
    previous: dict[str, Any] | None = None  # the previous release, with {version} left in
    for i, rel in enumerate(releases):
        if not isinstance(rel, dict):
            out.append(rel)
            continue
        label = f"flashinfer[{i}] ({rel.get('version', '?')})"
        template = dict(rel)
        for key in _FI_KEYED_SECTIONS:
            own = rel.get(key, {})
            if not isinstance(own, dict):
                raise MatrixError(f"flashinfer.yaml: {label}: {key} must be a mapping of name to entry; got {type(own).__name__}")
            if previous is None:
                if key not in rel:
                    raise MatrixError(f"flashinfer.yaml: {label}: {key} is missing; the first release must state every section")
                continue
            merged = dict(previous.get(key, {}))
            merged.update(own)
            template[key] = merged
        for key in _FI_WHOLE_SECTIONS:
            if key in rel:
                continue
            if previous is None or key not in previous:
                raise MatrixError(f"flashinfer.yaml: {label}: {key} is missing; the first release must state every section")
            template[key] = previous[key]
        for key in _FI_OPTIONAL_SECTIONS:
            if key not in rel and previous is not None and key in previous:
                template[key] = previous[key]
        previous = template
        version = rel.get("version")
        out.append(_fill_version(template, version) if isinstance(version, str) else template)
    return out


def _entry_label(data: Any, loc: tuple[Any, ...]) -> str:
    """Turn a pydantic error location into ``file: entry: field`` words."""
    parts: list[str] = []
    node = data
    for item in loc:
        if isinstance(item, int) and isinstance(node, list) and 0 <= item < len(node):
            node = node[item]
            label = node.get("version") or node.get("id") or node.get("family") if isinstance(node, dict) else None
            parts.append(f"[{item}]" + (f" ({label})" if label else ""))
        else:
            parts.append(str(item))
            node = node.get(item) if isinstance(node, dict) else None
    return ".".join(parts).replace(".[", "[")


def _format_validation_error(exc: ValidationError, raw: dict[str, Any]) -> str:
    lines = []
    for err in exc.errors():
        loc = err.get("loc", ())
        if loc and loc[0] in FILES:
            fname = FILES[str(loc[0])]
            inner = _entry_label(raw.get(str(loc[0])), tuple(loc[1:]))
        else:
            fname = "matrix"
            inner = _entry_label(raw, tuple(loc))
        found = err.get("input")
        found_txt = repr(found) if not isinstance(found, (dict, list)) else type(found).__name__
        if len(found_txt) > 120:
            found_txt = found_txt[:117] + "..."
        msg = err.get("msg", "invalid")
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        lines.append(f"[{fname}] {inner or '(top level)'}: {msg}; got {found_txt}")
    return "\n".join(lines)


@functools.lru_cache(maxsize=8)
def _load(directory: str) -> Matrix:
    root = Path(directory)
    raw: dict[str, Any] = {}
    for key, fname in FILES.items():
        data = _read_yaml(root / fname)
        if not isinstance(data, dict) or key not in data:
            raise MatrixError(f"{fname}: the top level must be a mapping with the key {key!r}; got {type(data).__name__} with keys {sorted(data) if isinstance(data, dict) else '-'}")
        allowed = {key, "schema_version", *_EXTRA_TOP_LEVEL.get(key, {})}
        extra = sorted(set(data) - allowed)
        if extra:
            raise MatrixError(f"{fname}: unknown top-level key(s) {extra}; allowed are {sorted(allowed)}")
        for top, field_name in _EXTRA_TOP_LEVEL.get(key, {}).items():
            if top in data:
                raw[field_name] = data[top]
        if data.get("schema_version", 1) != 1:
            raise MatrixError(f"{fname}: schema_version {data.get('schema_version')!r} is not supported; this nvfp4compat reads schema_version 1")
        raw[key] = expand_flashinfer(data[key]) if key == "flashinfer" else data[key]
    try:
        return importlib.import_module("nvfp4compat.explain").check_placeholders(
            Matrix.model_validate(raw))
    except ValidationError as exc:
        raise MatrixError("capability matrix is invalid:\n" + _format_validation_error(exc, raw)) from None


def load_matrix(directory: str | Path | None = None) -> Matrix:
    """Load, validate and cache the capability matrix.

    Parameters
    ----------
    directory : str or Path, optional
        A directory holding the five YAML files; defaults to :func:`matrix_dir`.

    Raises
    ------
    MatrixError
        On malformed or contradictory YAML, naming the file, entry and field.
    """
    root = Path(directory) if directory is not None else matrix_dir()
    return _load(str(root.resolve()))
