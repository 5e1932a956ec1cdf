"""GPU tier: the Triton writer and dequantizer against FlashInfer and the reference at full size.

Run on a CUDA machine, in its own process (``TRITON_INTERPRET`` must be unset)::

    pytest -m gpu tests/kernels/test_gpu_codec.py -s

* writer, fast math (the default on CUDA): bytes identical to FlashInfer's on millions of blocks;
* writer, ``fast_math=False``: bytes identical to the exact torch reference computed on the GPU;
* FlashInfer against the exact reference: only midpoint ties (the count is printed);
* ``nvfp4_4over6`` (FlashInfer 0.7.4+): scale choices differ only where both candidate errors agree to
  a relative 1e-6 (error sums added in another order), codes identical under equal scales;
* dequant: bit-identical to FlashInfer and to the reference;
* every tile config, CUDA-graph capture and replay, and a bad device scale that must not trap.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("the GPU tier needs a CUDA GPU", allow_module_level=True)

from nvfp4_cases import (  # noqa: E402
    CacheSpec,
    alloc_cache,
    bits_equal,
    cache_args,
    clone_all,
    compare_write,
    edge_rows,
    flashinfer_unavailable,
)
from triton.runtime.jit import JITFunction  # noqa: E402

from nvfp4compat.kernels import reference as ref  # noqa: E402
from nvfp4compat.kernels.triton import dequant as tdq  # noqa: E402
from nvfp4compat.kernels.triton import write as tap  # noqa: E402

pytestmark = pytest.mark.gpu
DEVICE = torch.device("cuda")

if os.environ.get("TRITON_INTERPRET") == "1" or not isinstance(tap._write_kernel, JITFunction):
    pytest.skip(
        "TRITON_INTERPRET is set in this process (a CPU test module sets it at import): run the GPU tier "
        "alone, `pytest -m gpu tests/kernels/test_gpu_codec.py`",
        allow_module_level=True,
    )

TOKENS = 32768  # x 8 heads x 128 = 2.1M 16-blocks per side, 4.2M per write
HEADS, HEAD_DIM, PAGE = 8, 128, 16
PAGES = TOKENS // PAGE + 64


def _fi(op: str):
    reason = flashinfer_unavailable(op)
    if reason:
        pytest.skip(reason)
    import flashinfer

    return flashinfer


def _inputs(dtype: torch.dtype, seed: int, *, midpoints: bool = False):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    x = torch.randn(TOKENS + 5, HEADS, HEAD_DIM, generator=g, device=DEVICE)
    x[..., torch.randperm(HEAD_DIM, generator=g, device=DEVICE)[:4]] *= 8.0  # outlier channels
    if midpoints:  # few mantissa bits: many scaled values land exactly on E2M1 midpoints
        x = torch.round(x * 4) / 4
    x = x.to(dtype)
    slots = torch.randperm(PAGES * PAGE, generator=g, device=DEVICE)[:TOKENS]
    slots[::997] = -1
    gs = (x.float().abs().amax() / (6 * 448)).reshape(1)
    return x, slots, gs


def _spec(layout: str) -> CacheSpec:
    return CacheSpec("tuple", layout, PAGES, PAGE, HEADS, HEAD_DIM)


def _write(fn, spec, bufs, key, value, slots, ks, vs, **kw):
    fn(key, value, slots, *cache_args(spec, bufs), ks, vs, spec.layout, **kw)
    torch.cuda.synchronize()


@pytest.mark.parametrize("midpoints", [False, True], ids=["randn", "midpoint-heavy"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_write_triton_equals_flashinfer(dtype, layout, midpoints):
    fi = _fi("write")
    key, slots, ks = _inputs(dtype, 1, midpoints=midpoints)
    value, _, vs = _inputs(dtype, 2, midpoints=midpoints)
    spec = _spec(layout)
    what = f"{dtype} {layout} {'midpoint-heavy' if midpoints else 'randn'}"
    _triton_vs_flashinfer(fi, spec, 0, key, value, slots, ks, vs, what)


def _triton_vs_flashinfer(fi, spec, seed, key, value, slots, ks, vs, what: str) -> None:
    """Write with FlashInfer and with the Triton writer (fast math) into the same random cache; any
    differing byte fails the test with its classification."""
    bufs = alloc_cache(spec, DEVICE, torch.Generator().manual_seed(seed))
    a, b = clone_all(bufs), clone_all(bufs)
    _write(
        fi.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping,
        spec,
        a,
        key,
        value,
        slots,
        ks,
        vs,
    )
    _write(tap.append_slot_mapping, spec, b, key, value, slots, ks, vs)
    differing = sum(int((x != y).sum()) for x, y in zip(a, b, strict=True))
    print(f"\nflashinfer {fi.__version__} vs triton (fast math), {what}: {differing} bytes differ")
    if differing:
        rep = compare_write(
            key, value, slots, ks, vs, spec, a, b, four_over_six=False, allow_code_ties=True
        )
        pytest.fail(f"triton and flashinfer bytes differ ({what}): {rep}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_write_edge_values_triton_equals_flashinfer(dtype):
    """Zeros, -0.0, subnormals, saturating and underflowing scales, NaN, +-inf, midpoints: the fast-math
    Triton writer (FTZ products, hardware E4M3 conversions from SM89) against FlashInfer, tiled over
    many tokens and heads so every edge block lands at many slot positions."""
    fi = _fi("write")
    gs = 2.0**-7
    block_rows = edge_rows(dtype, HEAD_DIM, gs).to(DEVICE)  # [n, 1, D]
    n = block_rows.shape[0]
    g = torch.Generator(device=DEVICE).manual_seed(21)
    tokens = 4096
    pick = torch.randint(0, n, (tokens, HEADS), generator=g, device=DEVICE)
    key = block_rows[pick, 0]  # [tokens, HEADS, D]
    value = block_rows[pick.flip(0), 0]
    slots = torch.randperm(PAGES * PAGE, generator=g, device=DEVICE)[:tokens]
    _triton_vs_flashinfer(fi, _spec("NHD"), 5, key, value, slots, gs, 1.0, f"edge values, {dtype}")


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_write_triton_exact_equals_reference(dtype, layout):
    key, slots, ks = _inputs(dtype, 3, midpoints=True)
    value, _, vs = _inputs(dtype, 4)
    spec = _spec(layout)
    bufs = alloc_cache(spec, DEVICE, torch.Generator().manual_seed(1))
    a, b = clone_all(bufs), clone_all(bufs)
    _write(ref.append_slot_mapping, spec, a, key, value, slots, ks, vs)
    _write(tap.append_slot_mapping, spec, b, key, value, slots, ks, vs, fast_math=False)
    if not all(torch.equal(x, y) for x, y in zip(a, b, strict=True)):
        rep = compare_write(
            key, value, slots, ks, vs, spec, a, b, four_over_six=False, allow_code_ties=False
        )
        pytest.fail(f"triton (exact) differs from the reference on the GPU: {rep}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_write_flashinfer_vs_exact_reference_only_ties(dtype):
    fi = _fi("write")
    key, slots, ks = _inputs(dtype, 5)
    value, _, vs = _inputs(dtype, 6, midpoints=True)
    spec = _spec("NHD")
    bufs = alloc_cache(spec, DEVICE, torch.Generator().manual_seed(2))
    a, b = clone_all(bufs), clone_all(bufs)
    _write(ref.append_slot_mapping, spec, a, key, value, slots, ks, vs)
    _write(
        fi.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping,
        spec,
        b,
        key,
        value,
        slots,
        ks,
        vs,
    )
    rep = compare_write(
        key, value, slots, ks, vs, spec, a, b, four_over_six=False, allow_code_ties=True
    )
    print(f"\nflashinfer {fi.__version__} vs exact reference, {dtype}: {rep}")
    assert rep.violations == 0 and rep.scale_diff == 0, str(rep)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_write_4over6_triton_vs_flashinfer(dtype, layout):
    fi = _fi("write")
    from nvfp4compat.kernels.flashinfer.write import _four_over_six_config, supports_4over6

    if not supports_4over6():
        pytest.skip(f"flashinfer {fi.__version__} has no nvfp4_4over6 (added in 0.7.4)")
    key, slots, ks = _inputs(dtype, 7)
    value, _, vs = _inputs(dtype, 8, midpoints=True)
    spec = _spec(layout)
    bufs = alloc_cache(spec, DEVICE, torch.Generator().manual_seed(3))
    a, b, c = clone_all(bufs), clone_all(bufs), clone_all(bufs)
    _write(
        fi.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping, spec, a, key, value, slots, ks, vs,
        nvfp4_4over6=_four_over_six_config(),
    )  # fmt: skip
    _write(tap.append_slot_mapping, spec, b, key, value, slots, ks, vs, nvfp4_4over6=True)
    rep = compare_write(
        key, value, slots, ks, vs, spec, a, b, four_over_six=True, allow_code_ties=False
    )
    print(f"\nflashinfer {fi.__version__} vs triton, 4over6, {dtype} {layout}: {rep}")
    assert rep.violations == 0, str(rep)
    # Against the exact reference, the Triton writer runs with exact arithmetic too: under fast math
    # the approximate reciprocal moves the candidates' errors, and both FlashInfer and the fast Triton
    # writer then pick differently from exact arithmetic on ~0.2% of blocks (measured on an H200).
    d = clone_all(bufs)
    _write(
        tap.append_slot_mapping, spec, d, key, value, slots, ks, vs, nvfp4_4over6=True, fast_math=False
    )
    _write(ref.append_slot_mapping, spec, c, key, value, slots, ks, vs, nvfp4_4over6=True)
    rep = compare_write(
        key, value, slots, ks, vs, spec, c, d, four_over_six=True, allow_code_ties=True
    )
    print(f"reference vs triton (exact), 4over6, {dtype} {layout}: {rep}")
    assert rep.violations == 0, str(rep)


def _filled_cache(layout: str, dtype: torch.dtype, seed: int):
    key, slots, ks = _inputs(dtype, seed)
    value, _, vs = _inputs(dtype, seed + 1)
    spec = _spec(layout)
    bufs = alloc_cache(spec, DEVICE, torch.Generator().manual_seed(seed))
    _write(tap.append_slot_mapping, spec, bufs, key, value, slots, ks, vs)
    return spec, bufs, ks, vs


def _tables(batch: int, max_seq_len: int, seed: int):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    max_pages = -(-max_seq_len // PAGE)
    bt = (
        torch.randperm(PAGES, generator=g, device=DEVICE)[: batch * max_pages]
        .view(batch, max_pages)
        .int()
    )
    bt[0, 1] = -1
    seq_lens = torch.randint(
        1, max_seq_len + 1, (batch,), generator=g, device=DEVICE, dtype=torch.int32
    )
    seq_lens[-1] = max_seq_len
    return bt, seq_lens


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_dequant_triton_equals_flashinfer_and_reference(dtype, layout):
    spec, bufs, ks, vs = _filled_cache(layout, dtype, 9)
    bt, seq_lens = _tables(16, 2048, 10)
    shape = (16, 2048, HEADS, HEAD_DIM)
    outs = [torch.full(shape, -7.25, dtype=dtype, device=DEVICE) for _ in range(6)]
    cache, sf = cache_args(spec, bufs)
    tdq.dequantize_paged(cache, sf, bt, seq_lens, ks, vs, outs[0], outs[1], layout)
    ref.dequantize_paged(cache, sf, bt, seq_lens, ks, vs, outs[2], outs[3], layout)
    torch.cuda.synchronize()
    assert bits_equal(outs[0], outs[2]) and bits_equal(outs[1], outs[3]), "triton vs reference"
    reason = flashinfer_unavailable("dequant")
    if reason:
        pytest.skip(f"reference part passed; {reason}")
    import flashinfer

    flashinfer.nvfp4_kv_dequantize_paged(cache, sf, bt, seq_lens, ks, vs, outs[4], outs[5], layout)
    torch.cuda.synchronize()
    assert bits_equal(outs[0], outs[4]) and bits_equal(outs[1], outs[5]), "triton vs flashinfer"
    print(
        f"\ndequant {dtype} {layout}: triton == flashinfer {flashinfer.__version__} == reference on {outs[0].numel() * 2} elements"
    )


@pytest.mark.parametrize("cfg", [c.name for c in tap.CONFIGS])
def test_every_write_config(cfg):
    key, slots, ks = _inputs(torch.bfloat16, 11)
    spec = _spec("HND")
    bufs = alloc_cache(spec, DEVICE, torch.Generator().manual_seed(4))
    a, b = clone_all(bufs), clone_all(bufs)
    _write(tap.append_slot_mapping, spec, a, key, key, slots, ks, ks)
    _write(tap.append_slot_mapping, spec, b, key, key, slots, ks, ks, config=tap.CONFIG_BY_NAME[cfg])
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("cfg", [c.name for c in tdq.CONFIGS])
def test_every_dequant_config(cfg):
    spec, bufs, ks, vs = _filled_cache("NHD", torch.bfloat16, 12)
    bt, seq_lens = _tables(8, 1000, 13)
    outs = [
        torch.full((8, 1000, HEADS, HEAD_DIM), -7.25, dtype=torch.bfloat16, device=DEVICE)
        for _ in range(4)
    ]
    cache, sf = cache_args(spec, bufs)
    ref.dequantize_paged(cache, sf, bt, seq_lens, ks, vs, outs[0], outs[1], "NHD")
    tdq.dequantize_paged(
        cache, sf, bt, seq_lens, ks, vs, outs[2], outs[3], "NHD", config=tdq.CONFIG_BY_NAME[cfg]
    )
    torch.cuda.synchronize()
    assert bits_equal(outs[0], outs[2]) and bits_equal(outs[1], outs[3])


def _graph_write_state(seed: int):
    """``(tokens, spec, static K, V, slots, k_scale, v_scale, cache buffers)`` for a captured write: static
    inputs a CUDA graph reads on every replay, refilled by :func:`_next_write`."""
    n = 256
    spec = CacheSpec("tuple", "NHD", 64, PAGE, HEADS, HEAD_DIM)
    static_k = torch.zeros(n, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=DEVICE)
    static_v = torch.zeros_like(static_k)
    static_slots = torch.zeros(n, dtype=torch.int64, device=DEVICE)
    ks = torch.ones(1, device=DEVICE)
    vs = torch.ones(1, device=DEVICE)
    bufs = alloc_cache(spec, DEVICE, torch.Generator().manual_seed(seed))
    return n, spec, static_k, static_v, static_slots, ks, vs, bufs


def _next_write(seed: int, step: int, static_k, static_v, static_slots, ks, vs) -> None:
    """New data, slots and scales in the static inputs for replay ``step``."""
    n = static_k.shape[0]
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    static_k.copy_(torch.randn(n, HEADS, HEAD_DIM, generator=g, device=DEVICE))
    static_v.copy_(torch.randn(n, HEADS, HEAD_DIM, generator=g, device=DEVICE))
    static_slots.copy_(torch.randperm(64 * PAGE, generator=g, device=DEVICE)[:n])
    ks.fill_(0.01 * (step + 1))
    vs.fill_(0.02 * (step + 1))


def test_cuda_graph_capture_and_replay():
    """The writer and the dequantizer capture into a CUDA graph and replay on new data (no host sync)."""
    _, spec, static_k, static_v, static_slots, ks, vs, bufs = _graph_write_state(5)
    bt = torch.arange(64, dtype=torch.int32, device=DEVICE).view(4, 16)
    seq_lens = torch.full((4,), 256, dtype=torch.int32, device=DEVICE)
    out_k = torch.zeros(4, 256, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=DEVICE)
    out_v = torch.zeros_like(out_k)
    cache, sf = cache_args(spec, bufs)
    tap.scale_error_flag(DEVICE)  # allocate before capture
    # warm up (compile) outside the capture
    tap.append_slot_mapping(static_k, static_v, static_slots, cache, sf, ks, vs, "NHD")
    tdq.dequantize_paged(cache, sf, bt, seq_lens, ks, vs, out_k, out_v, "NHD")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tap.append_slot_mapping(static_k, static_v, static_slots, cache, sf, ks, vs, "NHD")
        tdq.dequantize_paged(cache, sf, bt, seq_lens, ks, vs, out_k, out_v, "NHD")
    for step in range(3):
        _next_write(100 + step, step, static_k, static_v, static_slots, ks, vs)
        expected = clone_all(bufs)
        ref.append_slot_mapping(
            static_k, static_v, static_slots, *cache_args(spec, expected), ks, vs, "NHD"
        )
        graph.replay()
        torch.cuda.synchronize()
        rep = compare_write(
            static_k,
            static_v,
            static_slots,
            ks,
            vs,
            spec,
            expected,
            bufs,
            four_over_six=False,
            allow_code_ties=True,
        )
        assert rep.violations == 0, f"replay {step}: {rep}"
        ek, ev = torch.zeros_like(out_k), torch.zeros_like(out_v)
        ref.dequantize_paged(cache, sf, bt, seq_lens, ks, vs, ek, ev, "NHD")
        assert bits_equal(ek, out_k) and bits_equal(ev, out_v), f"replay {step}: dequant"
    tap.check_scale_errors(DEVICE)


@pytest.mark.parametrize("impl", ["triton", "flashinfer"])
def test_writer_captured_in_a_cuda_graph_writes_on_replay(impl):
    """Each bound writer, captured into a CUDA graph as vLLM's FULL decode graphs do, writes the
    cache on every replay: the capture holds its kernel (torch warns "CUDA Graph is empty" when a
    library launches on another stream) and replays write the same bytes as an eager Triton write."""
    import warnings

    from nvfp4compat.kernels import get_kernel

    if impl == "flashinfer":
        _fi("write")
    write = get_kernel("write", impl)
    _, spec, static_k, static_v, static_slots, ks, vs, bufs = _graph_write_state(6)
    tap.scale_error_flag(DEVICE)  # allocate before capture
    write(static_k, static_v, static_slots, *cache_args(spec, bufs), ks, vs, "NHD")  # compile / JIT
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.cuda.graph(graph):
            write(static_k, static_v, static_slots, *cache_args(spec, bufs), ks, vs, "NHD")
    empty = [str(w.message) for w in caught if "CUDA Graph is empty" in str(w.message)]
    assert not empty, f"{impl} writer: nothing captured ({empty[0]})"
    for step in range(2):
        _next_write(200 + step, step, static_k, static_v, static_slots, ks, vs)
        expected = clone_all(bufs)
        _write(tap.append_slot_mapping, spec, expected, static_k, static_v, static_slots, ks, vs)
        graph.replay()
        torch.cuda.synchronize()
        differing = sum(int((x != y).sum()) for x, y in zip(expected, bufs, strict=True))
        assert differing == 0, f"{impl} writer, replay {step}: {differing} bytes differ from an eager Triton write"
    tap.check_scale_errors(DEVICE)


def test_bad_device_scale_does_not_trap():
    tap.check_scale_errors(DEVICE)
    key, slots, _ = _inputs(torch.bfloat16, 14)
    spec = _spec("NHD")
    bufs = alloc_cache(spec, DEVICE, torch.Generator().manual_seed(6))
    bad = torch.tensor([float("nan")], device=DEVICE)
    tap.append_slot_mapping(
        key, key, slots, *cache_args(spec, bufs), bad, torch.tensor([0.0], device=DEVICE), "NHD"
    )
    torch.cuda.synchronize()  # no CUDA error: the context is healthy
    with pytest.raises(tap.ScaleError, match="k_scale and v_scale"):
        tap.check_scale_errors(DEVICE)
    valid = slots >= 0
    s = slots[valid]
    assert (bufs[2][s // PAGE, s % PAGE] == 0x7F).all() and (
        bufs[0][s // PAGE, s % PAGE] == 0
    ).all()
    torch.ones(4, device=DEVICE).sum().item()  # later work still runs
