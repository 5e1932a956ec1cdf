"""The one FlashInfer probe: what the installed FlashInfer has, for detect(), verify/emit and the kernels.

- :func:`probe_installed`: helper presence and parameters, the FA3 ragged prefill, read from the
  installed sources (``find_spec`` + AST, no import) or with ``hasattr`` on an imported module
  (:func:`nvfp4compat.facts.detect`);
- :func:`import_guarded`, :func:`home_module`: guarded imports and where each helper is defined
  (``nvfp4compat verify`` and ``verify --emit``);
- :func:`import_flashinfer`, :func:`require_helper`: the FlashInfer kernels' imports; the helper an op
  needs and the first release that has it come from the matrix (``implementations.yaml``,
  ``flashinfer.yaml``), not from code.

Nothing here imports torch, and flashinfer only where a function says so.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from nvfp4compat.spec import HELPERS, Matrix

__all__ = [
    "dist_version",
    "first_release",
    "first_release_with_4over6",
    "helper_for",
    "home_module",
    "import_flashinfer",
    "import_guarded",
    "probe_fa3_ragged",
    "probe_fa2_ragged",
    "probe_installed",
    "require_helper",
]

_DEFAULT_HOME = "flashinfer.quantization.fp4_quantization"


def home_module(m: Matrix, helper: str) -> str:
    """The module that defines ``helper``: from the ``defined_at`` of the newest flashinfer.yaml
    release that has it (``flashinfer/page.py:905`` -> ``flashinfer.page``); FlashInfer's
    quantization module for a helper no release has."""
    for rel in reversed(m.flashinfer):
        spec = rel.helpers[helper]
        if spec.present and spec.defined_at:
            return spec.defined_at.split(":", 1)[0].removesuffix(".py").replace("/", ".")
    return _DEFAULT_HOME


def dist_version(*names: str) -> str | None:
    """The installed version of the first distribution of ``names`` that is installed, else None."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        except Exception:  # noqa: BLE001 - a broken dist-info must not crash detect()
            continue
    return None


def _bound_names(path: Path) -> set[str]:
    """Names a module binds at import: defs, classes, assignments and ``from x import y [as z]``."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node in tree.body:
            names.add(node.name)
    return names


def _params_of(path: Path, func: str) -> list[str] | None:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == func:
            a = node.args
            return [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    return None


_MODULE_FILES = {
    "flashinfer": "__init__.py",
    "flashinfer.page": "page.py",
    "flashinfer.quantization": "quantization/__init__.py",
    "flashinfer.quantization.fp4_quantization": "quantization/fp4_quantization.py",
    "flashinfer.fp4_quantization": "fp4_quantization.py",
}


def _probe_flashinfer_static(pkg_dir: Path) -> tuple[dict[str, bool], dict[str, list[str]]]:
    """Helper presence from the installed sources, without importing flashinfer."""
    top = _bound_names(pkg_dir / "__init__.py")
    helpers = {h: h in top for h in HELPERS}
    params: dict[str, list[str]] = {}
    for h in HELPERS:
        for mod in ("flashinfer.page", "flashinfer.quantization.fp4_quantization"):
            p = _params_of(pkg_dir / _MODULE_FILES[mod], h)
            if p is not None:
                params[h] = p
                break
    return helpers, params


def probe_fa3_ragged(pkg_dir: Path) -> bool:
    """FlashInfer's FA3 ragged prefill, from the installed sources: the wrapper is exported and
    ``prefill.py`` dispatches ``backend == "fa3"`` (true of every release 0.6.10..0.7.4)."""
    return _probe_ragged(pkg_dir, "fa3")


def probe_fa2_ragged(pkg_dir: Path) -> bool:
    """FlashInfer's FA2 ragged prefill, from the installed sources: the wrapper is exported and
    ``prefill.py`` dispatches ``backend == "fa2"`` (true of every release 0.6.10..0.7.4)."""
    return _probe_ragged(pkg_dir, "fa2")


def _probe_ragged(pkg_dir: Path, backend: str) -> bool:
    if "BatchPrefillWithRaggedKVCacheWrapper" not in _bound_names(pkg_dir / "__init__.py"):
        return False
    try:
        text = (pkg_dir / "prefill.py").read_text(encoding="utf-8")
    except (OSError, ValueError):
        return False
    return f'backend == "{backend}"' in text


def _probe_flashinfer_module(mod: object) -> tuple[dict[str, bool], dict[str, list[str]]]:
    import inspect

    helpers: dict[str, bool] = {}
    params: dict[str, list[str]] = {}
    for h in HELPERS:
        fn = getattr(mod, h, None)
        helpers[h] = fn is not None
        if fn is not None:
            with contextlib.suppress(TypeError, ValueError):
                params[h] = list(inspect.signature(fn).parameters)
    return helpers, params


def probe_installed(*, import_modules: bool = False) -> dict[str, object]:
    """The installed FlashInfer as :class:`~nvfp4compat.facts.SystemFacts` fields (``flashinfer``,
    ``flashinfer_helpers``, ``flashinfer_helper_params``, ``flashinfer_probe``,
    ``flashinfer_import_error``, ``flashinfer_fa3_ragged``, ``flashinfer_fa2_ragged``); empty when it is absent. Never raises."""
    out: dict[str, object] = {}
    try:
        spec = importlib.util.find_spec("flashinfer")
    except (ImportError, ValueError) as exc:
        out["flashinfer_import_error"] = f"find_spec('flashinfer') failed: {type(exc).__name__}: {exc}"
        return out
    version = dist_version("flashinfer-python", "flashinfer")
    if spec is None or (spec.origin is None and version is None):
        return out  # absent, or only a namespace directory of that name on sys.path
    out["flashinfer"] = version
    mod = sys.modules.get("flashinfer")
    if mod is None and import_modules:
        try:
            mod = importlib.import_module("flashinfer")
        except BaseException as exc:  # noqa: BLE001 - e.g. AssertionError on CPU torch, RuntimeError version check
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            out["flashinfer_import_error"] = f"import flashinfer failed: {type(exc).__name__}: {exc}".splitlines()[0]
            mod = None
    if mod is not None:
        helpers, params = _probe_flashinfer_module(mod)
        out["flashinfer_probe"] = "module"
        mv = getattr(mod, "__version__", None)
        if isinstance(mv, str) and version is None:
            out["flashinfer"] = mv
    else:
        locs = list(spec.submodule_search_locations or [])
        if not locs:
            out["flashinfer_probe"] = "failed: flashinfer is not a package directory"
            return out
        helpers, params = _probe_flashinfer_static(Path(locs[0]))
        out["flashinfer_probe"] = "static"
    out["flashinfer_helpers"] = helpers
    out["flashinfer_helper_params"] = params
    locs = list(spec.submodule_search_locations or [])
    if locs:
        out["flashinfer_fa3_ragged"] = probe_fa3_ragged(Path(locs[0]))
        out["flashinfer_fa2_ragged"] = probe_fa2_ragged(Path(locs[0]))
    return out


def import_guarded(name: str) -> tuple[Any, str | None]:
    """``(module, None)``, or ``(None, "<Error>: <message>")`` when importing ``name`` fails."""
    try:
        return importlib.import_module(name), None
    except BaseException as exc:  # noqa: BLE001 - report, never crash
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return None, f"{type(exc).__name__}: {exc}".splitlines()[0]


def helper_for(op: str) -> str:
    """The FlashInfer helper implementation ``flashinfer`` of ``op`` calls (implementations.yaml).

    Raises
    ------
    ValueError
        When the matrix lists no ``flashinfer_helper`` requirement for it.
    """
    from nvfp4compat.loader import load_matrix

    helper = load_matrix().implementations.flashinfer_helper(op)
    if helper is None:
        raise ValueError(f"implementations.yaml lists no flashinfer_helper requirement for the flashinfer {op}")
    return helper


def first_release(helper: str) -> str:
    """The first flashinfer-python release that has ``helper`` (flashinfer.yaml), or "no known release"."""
    from nvfp4compat.loader import load_matrix

    releases = load_matrix().releases_with_helper(helper)
    return releases[0] if releases else "no known release"


def first_release_with_4over6() -> str:
    """The first flashinfer-python release whose slot-mapping writer takes ``nvfp4_4over6``
    (flashinfer.yaml: ``nvfp4_4over6.writer_param``)."""
    from nvfp4compat.loader import load_matrix

    releases = [r.version for r in load_matrix().flashinfer if r.nvfp4_4over6.writer_param]
    return releases[0] if releases else "no known release"


def import_flashinfer(op: str = "write") -> ModuleType:
    """Import FlashInfer, turning any import-time failure into an ImportError that says why."""
    try:
        import flashinfer
    except Exception as exc:  # FlashInfer <= 0.7.0 raises AssertionError/RuntimeError on some setups
        raise ImportError(
            f"cannot import flashinfer ({type(exc).__name__}: {exc}); install flashinfer-python "
            f">= {first_release(helper_for(op))} or use impl 'triton'"
        ) from exc
    return flashinfer


def require_helper(module: ModuleType, op: str) -> Any:
    """``module.<helper of op>``, or an ImportError naming the installed FlashInfer and the way out."""
    name = helper_for(op)
    fn = getattr(module, name, None)
    if fn is None:
        raise ImportError(
            f"flashinfer {getattr(module, '__version__', 'unknown')} lacks {name} (needed by impl "
            f"'flashinfer' of {op!r}; first released in flashinfer-python {first_release(name)}); upgrade "
            f"flashinfer-python or use impl 'triton' (NVFP4COMPAT_IMPL={op}=triton)"
        )
    return fn
