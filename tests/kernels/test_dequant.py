"""Paged NVFP4 dequantizer: every implementation against the torch reference, bit for bit.

Dequantization is ``(e2m1 * float(sf)) * gs`` in fp32 rounded to nearest even into fp16/bf16 (only
multiplications, so fast math changes nothing): every implementation must match the reference exactly,
on any bytes (random caches include the E4M3 NaN bytes 0x7F/0xFF, which decode as NaN). Positions past
``seq_lens[b]`` or with a page id outside ``[0, num_pages)`` keep the caller's values.
"""

from __future__ import annotations

import os
import zlib

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from nvfp4_cases import (  # noqa: E402
    CacheSpec,
    alloc_cache,
    bits_equal,
    cache_args,
    clone_all,
    impl_params,
    kernel,
    make_rows,
    make_slots,
    pick_device,
)

from nvfp4compat.kernels import reference as ref  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

DEVICE = pick_device()
IMPL = impl_params("dequant")
SENTINEL = -7.25  # exactly representable in fp16 and bf16


def make_tables(
    batch: int,
    max_pages: int,
    num_pages: int,
    gen: torch.Generator,
    dtype=torch.int32,
    invalid: bool = True,
) -> torch.Tensor:
    bt = torch.randint(0, num_pages, (batch, max_pages), generator=gen)
    if invalid and bt.numel() > 2:
        bt.view(-1)[1] = -1
        bt.view(-1)[-1] = num_pages + 3
    return bt.to(dtype).to(DEVICE)


def run_and_compare(impl, spec, bufs, block_table, seq_lens, max_seq_len, dtype, k_scale, v_scale):
    out = [
        torch.full(
            (block_table.shape[0], max_seq_len, spec.heads, spec.head_dim),
            SENTINEL,
            dtype=dtype,
            device=DEVICE,
        )
        for _ in range(4)
    ]
    cache, sf = cache_args(spec, bufs)
    ref.dequantize_paged(
        cache, sf, block_table, seq_lens, k_scale, v_scale, out[0], out[1], spec.layout
    )
    before = clone_all(bufs)
    kernel("dequant", impl)(
        cache, sf, block_table, seq_lens, k_scale, v_scale, out[2], out[3], spec.layout
    )
    assert all(torch.equal(a, b) for a, b in zip(before, bufs, strict=True)), (
        "the cache was modified"
    )
    assert bits_equal(out[0], out[2]), (
        f"K differs at {int((out[0].view(torch.int16) != out[2].view(torch.int16)).sum())} elements"
    )
    assert bits_equal(out[1], out[3]), (
        f"V differs at {int((out[1].view(torch.int16) != out[3].view(torch.int16)).sum())} elements"
    )
    return out


GRID = [
    (torch.bfloat16, CacheSpec("tuple", "NHD", 7, 16, 4, 128)),
    (torch.float16, CacheSpec("tuple", "HND", 7, 16, 4, 128)),
    (torch.float16, CacheSpec("stacked", "NHD", 9, 5, 3, 64)),
    (torch.bfloat16, CacheSpec("stacked", "HND", 9, 5, 3, 64)),
    (torch.bfloat16, CacheSpec("strided", "NHD", 3, 64, 2, 256)),
    (torch.float16, CacheSpec("strided", "HND", 3, 64, 2, 256)),
    (torch.float16, CacheSpec("combined", "NHD", 5, 16, 2, 512)),
    (torch.bfloat16, CacheSpec("combined", "HND", 5, 16, 2, 512)),
    (torch.bfloat16, CacheSpec("3d", "NHD", 40, 1, 2, 128)),
    (torch.float16, CacheSpec("3d", "HND", 40, 1, 2, 64)),
    (torch.bfloat16, CacheSpec("tuple", "NHD", 2, 64, 1, 512)),
    (torch.float16, CacheSpec("combined", "HND", 12, 5, 3, 256)),
]


@pytest.mark.parametrize("impl", IMPL)
@pytest.mark.parametrize("dtype,spec", GRID, ids=[f"{str(d)[6:]}-{s.id}" for d, s in GRID])
def test_matches_reference_on_random_bytes(impl, dtype, spec):
    gen = torch.Generator().manual_seed(
        zlib.crc32(spec.id.encode())
    )  # not hash(): per-process salt
    bufs = alloc_cache(spec, DEVICE, gen)
    batch, max_seq_len = 3, 2 * spec.page_size + 3
    max_pages = -(-max_seq_len // spec.page_size) + 1
    bt_dtype = torch.int64 if spec.page_size == 5 else torch.int32
    bt = make_tables(batch, max_pages, spec.num_pages, gen, bt_dtype)
    seq_lens = torch.tensor([max_seq_len, 0, spec.page_size + 1], dtype=torch.int32, device=DEVICE)
    run_and_compare(impl, spec, bufs, bt, seq_lens, max_seq_len, dtype, 0.75, 0.0123)


@pytest.mark.parametrize("impl", IMPL)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_seq_lens_beyond_max_and_untouched_rows(impl, dtype):
    gen = torch.Generator().manual_seed(11)
    spec = CacheSpec("tuple", "NHD", 6, 4, 2, 64)
    bufs = alloc_cache(spec, DEVICE, gen)
    bt = make_tables(4, 6, 6, gen, invalid=True)
    seq_lens = torch.tensor(
        [100, 3, -5, 9], dtype=torch.int32, device=DEVICE
    )  # 100 > max_seq_len, -5 -> none
    out = run_and_compare(impl, spec, bufs, bt, seq_lens, 9, dtype, 1.0, 2.0)
    assert (out[2][1, 3:] == SENTINEL).all() and (out[2][2] == SENTINEL).all()
    assert (out[3][0, 4:8] == SENTINEL).all()  # page id -1 in block_table[0, 1]
    assert not (out[2][0, :4] == SENTINEL).all()


@pytest.mark.parametrize("impl", IMPL)
def test_fp16_overflow_and_device_scales(impl):
    """Large ``e2m1 * sf * gs`` overflows fp16 to inf exactly as the reference's cast does."""
    gen = torch.Generator().manual_seed(12)
    spec = CacheSpec("tuple", "HND", 3, 16, 2, 128)
    bufs = alloc_cache(spec, DEVICE, gen)
    bt = make_tables(2, 3, 3, gen, invalid=False)
    seq_lens = torch.tensor([48, 20], dtype=torch.int32, device=DEVICE)
    ks = torch.tensor([300.0], device=DEVICE)
    vs = torch.tensor(2.0**-20, device=DEVICE)
    out = run_and_compare(impl, spec, bufs, bt, seq_lens, 48, torch.float16, ks, vs)
    assert torch.isinf(out[2]).any()


@pytest.mark.parametrize("impl", IMPL)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_round_trip_through_the_writer(impl, layout):
    """Write with the reference, dequantize with ``impl``: values are the reference decode of the input."""
    gen = torch.Generator().manual_seed(13)
    spec = CacheSpec("tuple", layout, 8, 16, 2, 128)
    bufs = alloc_cache(spec, DEVICE, gen)
    key = make_rows(100, 2, 128, torch.bfloat16, DEVICE, gen)
    slots = make_slots(100, 128, torch.int64, DEVICE, gen)
    gs = float(key.float().abs().amax()) / (6 * 448)
    ref.append_slot_mapping(key, key, slots, *cache_args(spec, bufs), gs, gs, layout)
    bt = torch.arange(8, dtype=torch.int32, device=DEVICE).view(1, 8)
    out = run_and_compare(
        impl,
        spec,
        bufs,
        bt,
        torch.tensor([128], dtype=torch.int32, device=DEVICE),
        128,
        torch.bfloat16,
        gs,
        gs,
    )
    packed, sf = ref.quantize_rows(key, gs)
    expected = ref.dequantize_rows(packed, sf, gs).to(torch.bfloat16)
    assert bits_equal(out[2][0, slots.long()], expected)
    rel = (out[2][0, slots.long()].float() - key.float()).norm() / key.float().norm()
    assert rel < 0.12


@pytest.mark.parametrize("impl", IMPL)
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(data=st.data())
def test_hypothesis_tables(impl, data):
    page_size = data.draw(st.sampled_from([1, 5, 16]), label="page_size")
    num_pages = data.draw(st.integers(1, 8), label="num_pages")
    batch = data.draw(st.integers(1, 4), label="batch")
    max_seq_len = data.draw(st.integers(1, 40), label="max_seq_len")
    extra_pages = data.draw(st.integers(0, 2), label="extra table columns")
    max_pages = -(-max_seq_len // page_size) + extra_pages
    table = data.draw(
        st.lists(
            st.integers(-3, num_pages + 2), min_size=batch * max_pages, max_size=batch * max_pages
        ),
        label="block table",
    )
    lens = data.draw(
        st.lists(st.integers(-2, max_seq_len + 5), min_size=batch, max_size=batch), label="seq_lens"
    )
    layout = data.draw(st.sampled_from(["NHD", "HND"]), label="layout")
    dtype = data.draw(st.sampled_from([torch.float16, torch.bfloat16]), label="dtype")
    bt_dtype = data.draw(st.sampled_from([torch.int32, torch.int64]), label="table dtype")
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    spec = CacheSpec("tuple", layout, num_pages, page_size, 2, 64)
    bufs = alloc_cache(spec, DEVICE, torch.Generator().manual_seed(seed))
    bt = torch.tensor(table, dtype=bt_dtype, device=DEVICE).view(batch, max_pages)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    run_and_compare(impl, spec, bufs, bt, seq_lens, max_seq_len, dtype, 0.5, 3.0)


@pytest.mark.parametrize("cfg", ["b64w2", "b128w4", "b256w8"])
def test_triton_tile_configs(cfg):
    from nvfp4compat.kernels.triton import dequant as tdq

    gen = torch.Generator().manual_seed(14)
    spec = CacheSpec("tuple", "HND", 6, 5, 3, 128)
    bufs = alloc_cache(spec, DEVICE, gen)
    bt = make_tables(3, 6, 6, gen)
    seq_lens = torch.tensor([27, 13, 30], dtype=torch.int32, device=DEVICE)
    out = [
        torch.full((3, 29, 3, 128), SENTINEL, dtype=torch.bfloat16, device=DEVICE) for _ in range(4)
    ]
    cache, sf = cache_args(spec, bufs)
    ref.dequantize_paged(cache, sf, bt, seq_lens, 0.5, 0.25, out[0], out[1], "HND")
    tdq.dequantize_paged(
        cache, sf, bt, seq_lens, 0.5, 0.25, out[2], out[3], "HND", config=tdq.CONFIG_BY_NAME[cfg]
    )
    assert bits_equal(out[0], out[2]) and bits_equal(out[1], out[3])


def test_pick_config_is_a_listed_config():
    from nvfp4compat.kernels.triton import dequant as tdq

    for n_rows in (1, 64, 4096, 262144 * 8):
        for hd in (64, 128, 256, 512):
            assert tdq.pick_config(n_rows, hd) in tdq.CONFIGS


# ------------------------------------------------------------------------------------------------
# Validation


def _valid_args():
    spec = CacheSpec("tuple", "NHD", 4, 16, 2, 128)
    bufs = alloc_cache(spec, DEVICE, torch.Generator().manual_seed(15))
    cache, sf = cache_args(spec, bufs)
    return dict(
        paged_kv_cache=cache,
        kv_cache_sf=sf,
        block_table=torch.zeros(2, 2, dtype=torch.int32, device=DEVICE),
        seq_lens=torch.tensor([5, 7], dtype=torch.int32, device=DEVICE),
        k_scale=1.0,
        v_scale=1.0,
        output_k=torch.zeros(2, 32, 2, 128, dtype=torch.bfloat16, device=DEVICE),
        output_v=torch.zeros(2, 32, 2, 128, dtype=torch.bfloat16, device=DEVICE),
        kv_layout="NHD",
    )


def _bad(**changes):
    def build():
        args = _valid_args()
        for k, v in changes.items():
            args[k] = v(args) if callable(v) else v
        return args

    return build


BAD_INPUTS = [
    (
        "float tables",
        _bad(block_table=lambda a: a["block_table"].float()),
        TypeError,
        "int32 or int64",
    ),
    (
        "1-D tables",
        _bad(block_table=lambda a: a["block_table"].flatten()),
        ValueError,
        r"\[batch, max_pages\]",
    ),
    (
        "short tables",
        _bad(block_table=lambda a: a["block_table"][:, :1]),
        ValueError,
        "fewer than max_seq_len",
    ),
    ("int64 seq_lens", _bad(seq_lens=lambda a: a["seq_lens"].long()), TypeError, "int32"),
    ("batch mismatch", _bad(seq_lens=lambda a: a["seq_lens"][:1]), ValueError, "batch mismatch"),
    (
        "fp32 output",
        _bad(output_k=lambda a: a["output_k"].float()),
        TypeError,
        "float16 or torch.bfloat16",
    ),
    ("dtype mismatch", _bad(output_v=lambda a: a["output_v"].half()), TypeError, "same dtype"),
    (
        "strided output",
        _bad(output_k=lambda a: a["output_k"].transpose(1, 2)),
        ValueError,
        "contiguous",
    ),
    (
        "wrong heads",
        _bad(
            output_k=lambda a: a["output_k"][:, :, :1].contiguous(),
            output_v=lambda a: a["output_v"][:, :, :1].contiguous(),
        ),
        ValueError,
        "num_kv_heads",
    ),
    (
        "shape mismatch",
        _bad(output_v=lambda a: a["output_v"][:, :16].contiguous()),
        ValueError,
        "differ in shape",
    ),
    ("zero scale", _bad(k_scale=0.0), ValueError, "finite and > 0"),
    ("nan scale", _bad(v_scale=float("nan")), ValueError, "finite and > 0"),
    (
        "fp16 scale tensor",
        _bad(v_scale=torch.ones(1, dtype=torch.float16, device=DEVICE)),
        ValueError,
        "one float32",
    ),
    ("bad layout", _bad(kv_layout="HDN"), ValueError, "kv_layout"),
]


@pytest.mark.parametrize("impl", IMPL)
@pytest.mark.parametrize("name,build,exc,match", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_rejects_bad_inputs(impl, name, build, exc, match):
    with pytest.raises(exc, match=match):
        kernel("dequant", impl)(**build())


def test_routing():
    from nvfp4compat.kernels import get_kernel

    assert get_kernel("dequant", "triton").__module__ == "nvfp4compat.kernels.triton.dequant"
