"""Every implementation of an op has its op's signature (``nvfp4compat.kernels.contract``).

Signatures are read from the source with ``ast``, so the FlashInfer implementations are checked on a
machine without FlashInfer (or a GPU) too. An implementation written against its op's arguments
(``@implements(XArgs)``) has the signature of ``XArgs``: of the contract's class when ``XArgs`` is
one, else of the implementation module's subclass (imported: such modules import without FlashInfer).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path

import pytest

from nvfp4compat.kernels import KERNELS, contract
from nvfp4compat.kernels.contract import CONTRACTS

# the float32 torch references implement write and dequant too
REFERENCES = {
    ("write", "reference"): "nvfp4compat.kernels.reference:append_slot_mapping",
    ("dequant", "reference"): "nvfp4compat.kernels.reference:dequantize_paged",
}


def _source_params(target: str) -> list[tuple[str, str, str | None]]:
    """``(name, kind, default source)`` of each parameter of ``module:function``, read from source."""
    module, func = target.split(":")
    spec = importlib.util.find_spec(module.rsplit(".", 1)[0])
    assert spec is not None and spec.submodule_search_locations, module
    path = Path(next(iter(spec.submodule_search_locations))) / f"{module.rsplit('.', 1)[1]}.py"
    tree = ast.parse(path.read_text())
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == func), None)
    assert fn is not None, f"{path} defines no top-level function {func}"
    args_class = _implemented_args(fn)
    if args_class is not None:  # @implements(XArgs): XArgs' signature
        cls = getattr(contract, args_class, None) or getattr(importlib.import_module(module), args_class)
        return _signature_params(inspect.signature(cls))
    a = fn.args
    out: list[tuple[str, str, str | None]] = []
    positional = a.posonlyargs + a.args
    pos_defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    kinds = ["POSITIONAL_ONLY"] * len(a.posonlyargs) + ["POSITIONAL_OR_KEYWORD"] * len(a.args)
    for arg, kind, default in zip(positional, kinds, pos_defaults, strict=True):
        out.append((arg.arg, kind, None if default is None else ast.unparse(default)))
    for arg, kw_default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        out.append(
            (arg.arg, "KEYWORD_ONLY", None if kw_default is None else ast.unparse(kw_default))
        )
    assert a.vararg is None and a.kwarg is None, f"{target} takes *args/**kwargs"
    return out


def _implemented_args(fn: ast.FunctionDef) -> str | None:
    """``XArgs`` of an ``@implements(XArgs)`` decorator on ``fn``, else None."""
    for d in fn.decorator_list:
        if isinstance(d, ast.Call) and ast.unparse(d.func).split(".")[-1] == "implements":
            assert len(d.args) == 1 and isinstance(d.args[0], ast.Name), ast.unparse(d)
            return d.args[0].id
    return None


def _signature_params(sig: inspect.Signature) -> list[tuple[str, str, str | None]]:
    return [
        (p.name, p.kind.name, None if p.default is inspect.Parameter.empty else repr(p.default))
        for p in sig.parameters.values()
    ]


def _contract_params(op: str) -> list[tuple[str, str, str | None]]:
    return _signature_params(inspect.signature(CONTRACTS[op]))


def _quote(params: list[tuple[str, str, str | None]]) -> list[tuple[str, str, str | None]]:
    """Defaults as Python literals, so ``'NHD'`` (repr) and ``"NHD"`` (source) compare equal."""
    return [(n, k, None if d is None else repr(ast.literal_eval(d))) for n, k, d in params]


@pytest.mark.parametrize(
    "op,impl,target",
    [(op, impl, t) for (op, impl), t in sorted({**KERNELS, **REFERENCES}.items())],
    ids=lambda x: x if ":" not in str(x) else "",
)
def test_implementation_has_the_op_signature(op: str, impl: str, target: str) -> None:
    want = _quote(_contract_params(op))
    have = _quote(_source_params(target))
    assert have[: len(want)] == want, f"{target} departs from the {op} contract"
    extra = have[len(want) :]
    # an implementation may add options of its own, keyword-only and with a default
    assert all(kind == "KEYWORD_ONLY" and d is not None for _, kind, d in extra), (target, extra)


def test_every_op_has_a_contract_and_every_contract_an_implementation() -> None:
    assert {op for op, _ in KERNELS} == set(CONTRACTS)


def test_signature_reader_sees_a_departure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "fakeimpl"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "w.py").write_text(
        "def write(key, value, slot_mapping, paged_kv_cache, kv_cache_sf, k_scale, v_scale,\n"
        "          kv_layout='HND', *, nvfp4_4over6=False):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    have = _quote(_source_params("fakeimpl.w:write"))
    assert have[: len(_contract_params("write"))] != _quote(_contract_params("write"))


def test_implements_gives_the_op_signature_and_names_the_implementation() -> None:
    from nvfp4compat.kernels.contract import WriteArgs, implements

    seen: list[WriteArgs] = []

    @implements(WriteArgs)
    def write(a: WriteArgs) -> None:
        """doc"""
        seen.append(a)

    assert write.__name__ == "write" and write.__doc__ == "doc"
    assert _signature_params(inspect.signature(write)) == _contract_params("write")
    write(1, 2, 3, "cache", "sf", 1.0, 2.0, nvfp4_4over6=True)
    assert (seen[0].key, seen[0].kv_layout, seen[0].nvfp4_4over6) == (1, "NHD", True)
    with pytest.raises(TypeError, match=r"^write\(\): missing a required argument: 'v_scale'"):
        write(1, 2, 3, "cache", "sf", 1.0)
    with pytest.raises(TypeError, match=r"^write\(\): .*'bogus'"):
        write(1, 2, 3, "cache", "sf", 1.0, 2.0, bogus=1)
