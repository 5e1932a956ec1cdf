"""The ``flashinfer`` implementations of ``write``/``dequant`` against a real FlashInfer, on a CPU.

Run by ``nox -s flashinfer-<version>`` (one real release per session). Without a GPU FlashInfer's kernels
cannot run, but these facts can be checked with the real package:

* the helper probe: releases before 0.6.15 lack the helpers, and ``get_kernel`` says so (ImportError
  naming the version and the way out);
* ``nvfp4_4over6`` is detected from the real signature (0.7.4+); asking for it on an older release
  raises ``NotImplementedError`` naming the version and ``impl 'triton'``;
* the arguments the wrapper hands to FlashInfer pass FlashInfer's own Python validation for every cache
  form and layout: the call gets as far as FlashInfer's JIT step, which needs a GPU.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from nvfp4_cases import CacheSpec, alloc_cache, cache_args, make_rows, make_slots

pytestmark = pytest.mark.flashinfer

fi = pytest.importorskip("flashinfer", reason="needs a real FlashInfer release (nox -s flashinfer)")
HAS_WRITE = hasattr(fi, "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping")
HAS_DEQUANT = hasattr(fi, "nvfp4_kv_dequantize_paged")
CPU_ONLY = pytest.mark.skipif(
    torch.cuda.is_available(), reason="CPU-only check (the GPU tier runs the kernels)"
)


@pytest.mark.parametrize("op,has", [("write", HAS_WRITE), ("dequant", HAS_DEQUANT)])
def test_helper_probe(op, has):
    from nvfp4compat.kernels import get_kernel

    if has:
        fn = get_kernel(op, "flashinfer")
        assert fn.__module__.startswith("nvfp4compat.kernels.flashinfer.")
    else:
        with pytest.raises(
            ImportError, match=rf"flashinfer {fi.__version__} lacks .*0\.6\.15.*'triton'"
        ):
            get_kernel(op, "flashinfer")


@pytest.mark.skipif(not HAS_WRITE, reason="this FlashInfer has no slot-mapping writer")
def test_4over6_detection_matches_the_real_signature():
    from nvfp4compat.kernels.flashinfer import write as fia

    real = (
        "nvfp4_4over6"
        in inspect.signature(fi.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping).parameters
    )
    assert fia.supports_4over6() is real
    if not real:
        spec = CacheSpec("tuple", "NHD", 2, 16, 2, 128)
        bufs = alloc_cache(spec, torch.device("cpu"), torch.Generator().manual_seed(0))
        key = torch.zeros(2, 2, 128, dtype=torch.bfloat16)
        with pytest.raises(
            NotImplementedError, match=rf"flashinfer {fi.__version__} is installed.*impl 'triton'"
        ):
            fia.append_slot_mapping(
                key,
                key,
                torch.arange(2),
                *cache_args(spec, bufs),
                1.0,
                1.0,
                "NHD",
                nvfp4_4over6=True,
            )


FORMS = [
    CacheSpec("tuple", "NHD", 3, 16, 2, 128),
    CacheSpec("tuple", "HND", 3, 16, 2, 64),
    CacheSpec("stacked", "NHD", 3, 5, 2, 256),
    CacheSpec("3d", "HND", 8, 1, 2, 128),
    CacheSpec("strided", "HND", 3, 16, 2, 128),
    CacheSpec("combined", "NHD", 3, 16, 2, 128),
    CacheSpec("combined", "HND", 3, 16, 2, 512),
]


@CPU_ONLY
@pytest.mark.skipif(not HAS_WRITE, reason="this FlashInfer has no slot-mapping writer")
@pytest.mark.parametrize("spec", FORMS, ids=[s.id for s in FORMS])
@pytest.mark.parametrize("scale", ["float", "tensor"])
def test_writer_arguments_pass_flashinfer_validation(spec, scale):
    from nvfp4compat.kernels.flashinfer import write as fia

    gen = torch.Generator().manual_seed(1)
    bufs = alloc_cache(spec, torch.device("cpu"), gen)
    key = make_rows(
        6, spec.heads, spec.head_dim, torch.float16, torch.device("cpu"), gen, strided=True
    )
    slots = make_slots(
        6, spec.num_pages * spec.page_size, torch.int32, torch.device("cpu"), gen, invalid=2
    )
    ks = 0.5 if scale == "float" else torch.tensor([0.5])
    # FlashInfer's Python checks (dtypes, shapes, scales) pass; its JIT then needs a GPU.
    with pytest.raises(RuntimeError, match="requires GPUs with sm75 or higher"):
        fia.append_slot_mapping(key, key, slots, *cache_args(spec, bufs), ks, ks, spec.layout)
