"""Conformance against bytes written by the real FlashInfer on an H200 (``tests/data/golden``).

``scripts/make_golden.py`` stores inputs, global scales, slot mappings, the cache bytes before and after
FlashInfer's slot-mapping writer, and FlashInfer's paged-dequant outputs, once per FlashInfer release.
Here the torch reference and the Triton kernels (under the interpreter on a CPU) reproduce them:

* writer: every scale byte equal; every differing E2M1 code a one-step tie at an exact rounding midpoint
  (FlashInfer's writer uses an approximate reciprocal, exact arithmetic may round such a tie the other
  way); with ``nvfp4_4over6`` a block may pick the other candidate scale only when both candidates'
  errors are within a relative 1e-6; no byte outside the written rows changes;
* dequant: bit-identical outputs, untouched rows included.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from nvfp4_cases import CacheSpec, bits_equal, clone_all, compare_write, pick_device  # noqa: E402

from nvfp4compat.kernels import reference as ref  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
FILES = sorted(GOLDEN.glob("flashinfer-*.pt"))
DEVICE = pick_device()
MISSING = (
    f"no golden files in {GOLDEN}: run `python scripts/make_golden.py --out tests/data/golden` on a CUDA "
    "machine, once with flashinfer-python 0.6.15 and once with 0.7.4"
)


def _load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def _cases():
    params = []
    for path in FILES:
        data = _load(path)
        version = data["meta"]["flashinfer_version"]
        for case in data["cases"]:
            for impl in ("reference", "triton"):
                params.append(
                    pytest.param(path, case["name"], impl, id=f"fi{version}-{case['name']}-{impl}")
                )
    if not params:
        params.append(
            pytest.param(
                None, None, None, marks=pytest.mark.skip(reason=MISSING), id="no-golden-files"
            )
        )
    return params


def _writer(impl: str):
    if impl == "reference":
        return ref.append_slot_mapping
    from nvfp4compat.kernels.triton.write import append_slot_mapping

    return append_slot_mapping


def _dequant(impl: str):
    if impl == "reference":
        return ref.dequantize_paged
    from nvfp4compat.kernels.triton.dequant import dequantize_paged

    return dequantize_paged


@pytest.mark.parametrize("path,name,impl", _cases())
def test_golden(path, name, impl):
    data = _load(path)
    case = next(c for c in data["cases"] if c["name"] == name)
    if case["op"] == "write":
        spec = CacheSpec(
            "tuple",
            case["layout"],
            case["num_pages"],
            case["page_size"],
            case["heads"],
            case["head_dim"],
        )
        before = [t.to(DEVICE) for t in case["cache_before"]]
        expected = [t.to(DEVICE) for t in case["cache_after"]]
        got = clone_all(before)
        key, value = case["key"].to(DEVICE), case["value"].to(DEVICE)
        slots = case["slot_mapping"].to(DEVICE)
        f8 = torch.float8_e4m3fn
        _writer(impl)(
            key, value, slots, (got[0], got[1]), (got[2].view(f8), got[3].view(f8)),
            case["k_scale"], case["v_scale"], case["layout"], nvfp4_4over6=case["nvfp4_4over6"],
        )  # fmt: skip
        rep = compare_write(
            key, value, slots, case["k_scale"], case["v_scale"], spec, expected, got,
            four_over_six=case["nvfp4_4over6"], allow_code_ties=True,
        )  # fmt: skip
        print(f"{path.name} {name} {impl}: {rep}")
        assert rep.violations == 0, str(rep)
        assert rep.scale_diff == rep.scale_ties, str(rep)
        # the FlashInfer bytes differ from the input cache: the write happened
        assert not all(torch.equal(a, b) for a, b in zip(before, expected, strict=True))
    else:
        dtype = getattr(torch, case["dtype"])
        cache = [t.to(DEVICE) for t in case["cache"]]
        out_k = torch.full(case["output_k"].shape, case["fill"], dtype=dtype, device=DEVICE)
        out_v = torch.full(case["output_v"].shape, case["fill"], dtype=dtype, device=DEVICE)
        f8 = torch.float8_e4m3fn
        _dequant(impl)(
            (cache[0], cache[1]), (cache[2].view(f8), cache[3].view(f8)),
            case["block_tables"].to(DEVICE), case["seq_lens"].to(DEVICE),
            case["k_scale"], case["v_scale"], out_k, out_v, case["layout"],
        )  # fmt: skip
        assert bits_equal(out_k.cpu(), case["output_k"])
        assert bits_equal(out_v.cpu(), case["output_v"])
        assert (
            case["output_k"] == case["fill"]
        ).any()  # FlashInfer left rows untouched, and so did we


def test_golden_files_are_tagged():
    if not FILES:
        pytest.skip(MISSING)
    versions = set()
    for path in FILES:
        meta = _load(path)["meta"]
        assert path.name == f"flashinfer-{meta['flashinfer_version']}.pt"
        assert meta["format"] == 1 and meta["device"]
        versions.add(meta["flashinfer_version"])
    assert versions
