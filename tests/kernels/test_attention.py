"""Paged NVFP4 attention, every implementation against the float32 reference on the dequantized cache.

Small shapes: on a CPU-only machine the Triton kernels run under ``TRITON_INTERPRET=1`` (set by
``tests/conftest.py``) and the FlashInfer implementation is skipped; on a GPU both run for real.
Each feature is checked alone and once all together; relative L2 of the output <= 1e-2.
"""

from __future__ import annotations

import dataclasses
import re
import warnings

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from _attention_helpers import (
    DEVICE,
    FI_D64_REFUSAL,
    IMPLS,
    Recorder,
    fi_refuses_head_dim_64,
    kernel,
    run_case,
)

from nvfp4compat.kernels import get_kernel, reference
from nvfp4compat.kernels import reference_attention as ra
from nvfp4compat.kernels.layout import normalize_cache
from nvfp4compat.kernels.triton import attention as _att

bf16, fp16 = torch.bfloat16, torch.float16

# (dtype, head_dim, page_size, layout, q_len_per_req, num_qo_heads, num_kv_heads, seq_lens)
DECODE_SHAPES = [
    pytest.param(bf16, 128, 16, "NHD", 1, 8, 2, [1, 37, 100], id="bf16-d128-p16-NHD-q1-g4"),
    pytest.param(fp16, 64, 32, "HND", 1, 4, 4, [64, 5], id="fp16-d64-p32-HND-q1-g1"),
    pytest.param(bf16, 256, 64, "combined-NHD", 3, 8, 2, [3, 70], id="bf16-d256-p64-combinedNHD-q3-g4"),
    pytest.param(fp16, 128, 16, "combined-HND", 8, 2, 2, [8, 33], id="fp16-d128-p16-combinedHND-q8-g1"),
    pytest.param(bf16, 512, 16, "NHD-stacked", 1, 8, 1, [20, 50], id="bf16-d512-p16-stacked-q1-g8"),
    pytest.param(fp16, 64, 16, "HND-stacked", 2, 6, 2, [9, 40], id="fp16-d64-p16-HNDstacked-q2-g3"),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype,head_dim,page_size,layout,q_len,hq,hkv,seq_lens", DECODE_SHAPES)
def test_decode_matches_reference(impl, dtype, head_dim, page_size, layout, q_len, hq, hkv, seq_lens):
    kwargs = dict(
        seq_lens=seq_lens, q_len_per_req=q_len, num_qo_heads=hq, num_kv_heads=hkv, head_dim=head_dim,
        page_size=page_size, layout=layout, dtype=dtype, return_lse=True,
    )
    if fi_refuses_head_dim_64(impl, "decode", head_dim, q_len):
        with pytest.raises(NotImplementedError, match=FI_D64_REFUSAL):
            run_case(impl, "decode", **kwargs)
        return
    run_case(impl, "decode", **kwargs).check()


FEATURES = [
    pytest.param(dict(sliding_window=9), id="window"),
    pytest.param(dict(sliding_window=1), id="window1"),
    pytest.param(dict(logits_soft_cap=3.0), id="softcap"),
    pytest.param(dict(use_sinks=True), id="sinks"),
    pytest.param(dict(scale_as_tensor=True), id="tensor-scales"),
    pytest.param(dict(out_buffer=False, strided_query=True), id="strided-query-no-out"),
    pytest.param(
        dict(sliding_window=20, logits_soft_cap=5.0, use_sinks=True, scale_as_tensor=True, strided_query=True),
        id="all",
    ),
]


def _expect_sinks_refused(impl: str, features: dict) -> bool:
    return impl == "flashinfer" and features.get("use_sinks", False)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("q_len", [1, 4])
@pytest.mark.parametrize("features", FEATURES)
def test_decode_features(impl, q_len, features):
    # FlashInfer refuses head_dim 64 on its prefill wrapper (q_len > 1): test its features at 128.
    kwargs = dict(
        seq_lens=[4, 45, 130], q_len_per_req=q_len, num_qo_heads=4, num_kv_heads=2,
        head_dim=128 if impl == "flashinfer" else 64,
        page_size=16, dtype=bf16, return_lse=True, seed=q_len, **features,
    )
    if _expect_sinks_refused(impl, features):
        with pytest.raises(NotImplementedError, match="sinks.*triton"):
            run_case(impl, "decode", **kwargs)
        return
    run_case(impl, "decode", **kwargs).check()


@pytest.mark.parametrize("splits,block_n", [(1, 16), (3, 16), (7, 16), (40, 16)])
def test_decode_split_counts(splits, block_n):
    """Every split count (incl. more splits than tiles) gives the same result; merge kernel exercised."""
    from nvfp4compat.kernels.triton import attention as att

    with att.override_configs(decode=att.DecodeConfig(block_n, 4, 1), num_splits=splits):
        r = run_case(
            "triton", "decode", seq_lens=[1, 150, 64], q_len_per_req=2, num_qo_heads=4, num_kv_heads=1,
            head_dim=64, dtype=fp16, return_lse=True, use_sinks=True, sliding_window=70, seed=splits,
        )
    r.check()


@pytest.mark.parametrize(
    "splits,features",
    [
        (1, {}),
        (3, {"sliding_window": 70, "use_sinks": True}),
        (2, {"logits_soft_cap": 30.0, "layout": "HND", "page_size": 8}),
        (4, {"q_len_per_req": 3, "dtype": torch.float16}),
    ],
)
def test_decode_prefetch_matches_reference(splits, features):
    """The register double-buffered loop (DecodeConfig.prefetch) over chunks of 0, 1, 2 and many
    unmasked tiles, with every feature: the same results as the reference."""
    from nvfp4compat.kernels.triton import attention as att

    kw = {"dtype": fp16, **features}
    with att.override_configs(decode=att.DecodeConfig(16, 4, 1, prefetch=True), num_splits=splits):
        r = run_case(
            "triton", "decode", seq_lens=[300, 3, 17, 4, 45, 130], num_qo_heads=4, num_kv_heads=2,
            head_dim=64, return_lse=True, seed=splits, **kw,
        )
    r.check()


@pytest.mark.parametrize(
    "splits,features",
    [
        (1, {}),
        (3, {"sliding_window": 70, "use_sinks": True, "layout": "HND"}),
        (2, {"q_len_per_req": 3, "logits_soft_cap": 30.0, "dtype": torch.bfloat16}),
    ],
)
def test_decode_byte_scales_match_reference(splits, features):
    """Block scales loaded as bytes (DecodeConfig.scale_words=False) where the cache's alignment would
    allow 32-bit words (head_dim 64: 4 scale bytes a row): the same results as the reference."""
    from nvfp4compat.kernels.triton import attention as att

    kw = {"dtype": fp16, **features}
    with att.override_configs(decode=att.DecodeConfig(16, 4, 1, scale_words=False), num_splits=splits):
        r = run_case(
            "triton", "decode", seq_lens=[300, 3, 17, 130], num_qo_heads=4, num_kv_heads=2,
            head_dim=64, return_lse=True, seed=splits, **kw,
        )
    r.check()


@pytest.mark.parametrize(
    "features",
    [
        {"dtype": torch.bfloat16},
        {"dtype": fp16, "sliding_window": 200, "use_sinks": True, "layout": "HND", "page_size": 32},
        {"dtype": torch.bfloat16, "logits_soft_cap": 30.0, "scale_as_tensor": True},
    ],
)
def test_decode_head_dim_128_default_config_matches_reference(features):
    """The launch decode() picks for head_dim 128 and 16 rows, unforced: the byte-scale config with 128-key
    tiles (what ships), across the split (several chunks a request) and the features."""
    from nvfp4compat.kernels.triton import attention as att

    assert not att.decode_config(128).scale_words
    with att.override_configs(num_splits=3):
        r = run_case(
            "triton", "decode", seq_lens=[600, 5, 129, 300], num_qo_heads=8, num_kv_heads=2,
            head_dim=128, return_lse=True, seed=7, **features,
        )
    r.check()


@pytest.mark.parametrize(
    "splits,features",
    [
        (1, {}),
        (3, {"sliding_window": 70, "use_sinks": True, "layout": "HND"}),
        (2, {"q_len_per_req": 3, "logits_soft_cap": 30.0, "dtype": torch.bfloat16}),
        (4, {"page_size": 8}),
    ],
)
def test_decode_swapped_operands_match_reference(splits, features):
    """K as the first operand of the logits' MMA (DecodeConfig.swap_ab), with byte-loaded scales and with
    the register prefetch: the same results as the reference."""
    from nvfp4compat.kernels.triton import attention as att

    kw = {"dtype": fp16, **features}
    for cfg in (att.DecodeConfig(16, 4, 1, scale_words=False, swap_ab=True),
                att.DecodeConfig(16, 4, 1, prefetch=True, swap_ab=True)):
        with att.override_configs(decode=cfg, num_splits=splits):
            r = run_case(
                "triton", "decode", seq_lens=[300, 3, 17, 130], num_qo_heads=4, num_kv_heads=2,
                head_dim=64, return_lse=True, seed=splits, **kw,
            )
        r.check()


@pytest.mark.parametrize(
    "op,splits,seq_lens,features",
    [
        ("decode", 3, [1, 150, 64], {"q_len_per_req": 2, "use_sinks": True, "sliding_window": 70}),
        ("decode", 7, [0, 150, 300], {"use_sinks": True}),
        ("decode", 40, [300, 5, 17], {"logits_soft_cap": 30.0, "layout": "HND"}),
        # a mixed batch: requests 0 and 2 are decode rows (varlen), request 1 is the prefill kernel's
        ("prefill", 5, [130, 45, 200], {"q_lens": [1, 40, 2], "use_sinks": True}),
    ],
)
def test_decode_fused_merge_matches_reference(monkeypatch, op, splits, seq_lens, features):
    """FUSED_MERGE: the last chunk of each request merges the partials inside the decode kernel (no
    merge launch); requests with no key get a chunk that writes their zero rows. Same results as the
    reference, and every counter is back at 0 afterwards (the next launch starts from zeros)."""
    from nvfp4compat.kernels.triton import attention as att

    monkeypatch.setattr(att, "FUSED_MERGE", True)
    launched = []
    monkeypatch.setattr(att, "_decode_reduce_kernel", Recorder(launched))
    with att.override_configs(decode=att.DecodeConfig(16, 4, 1), num_splits=splits):
        r = run_case(
            "triton", op, seq_lens=seq_lens, num_qo_heads=4, num_kv_heads=2, head_dim=64,
            dtype=fp16, return_lse=True, seed=splits, **features,
        )
    r.check()
    assert launched == [], "the merge kernel ran although the decode kernel merges"
    assert att._merge_counter_bufs and all(int(t.abs().sum()) == 0 for t in att._merge_counter_bufs.values())


def test_fused_merge_counters_for_a_stream_first_seen_in_a_capture(monkeypatch):
    """``FUSED_MERGE``'s counters: an eager launch makes its stream's zeroed buffer and keeps
    ``MERGE_COUNTER_SPARES`` zeroed spares of that size, so a stream whose first launch is captured in a CUDA graph
    (``do_bench_cudagraph``'s, which warms up on another) takes a spare instead of the merge kernel; once they are gone, or
    where a capture needs more counters than they hold, the capture gets None (the merge kernel); the next eager launch
    makes new spares, and a stream keeps the buffer it took."""
    from nvfp4compat.kernels.triton import attention as att

    for name in ("_merge_counter_bufs", "_merge_counter_spares"):
        monkeypatch.setattr(att, name, {})
    monkeypatch.setattr(att, "_merge_counter_kept", [])
    cpu = torch.device("cpu")
    assert att._stream_counters(cpu, 7, 100, True) is None  # nothing eager yet
    eager = att._stream_counters(cpu, 1, 100, False)
    assert eager.numel() == att.MERGE_COUNTERS_MIN and int(eager.abs().sum()) == 0
    spares = list(att._merge_counter_spares[cpu])
    assert len(spares) == att.MERGE_COUNTER_SPARES == 2
    got = att._stream_counters(cpu, 7, 100, True)
    assert got is spares[0] and int(got.abs().sum()) == 0
    assert att._stream_counters(cpu, 7, 100, True) is got  # the captured stream keeps it
    assert att._stream_counters(cpu, 8, 100, True) is spares[1]
    assert att._stream_counters(cpu, 9, 100, True) is None  # no spare left: the merge kernel
    assert att._stream_counters(cpu, 1, 100, False) is eager  # an eager launch makes new spares
    assert len(att._merge_counter_spares[cpu]) == 2
    assert att._stream_counters(cpu, 9, 10_000, True) is None  # larger than the spares
    big = att._stream_counters(cpu, 1, 10_000, False)
    assert big.numel() == 10_000 and eager in att._merge_counter_kept  # a graph may still point at the old one
    assert all(sp.numel() == 10_000 for sp in att._merge_counter_spares[cpu])
    assert att._stream_counters(cpu, 9, 10_000, True).numel() == 10_000


@pytest.mark.parametrize("chunk_block", [2, 16])
def test_decode_merge_over_many_chunk_blocks(monkeypatch, chunk_block):
    """A request cut into more chunks than one merge step holds (39 chunks: 20 steps of 2, 3 steps of
    16, the last one partial) merges to the reference, beside a request of one chunk."""
    from nvfp4compat.kernels.triton import attention as att

    monkeypatch.setattr(att, "MERGE_CHUNK_BLOCK", chunk_block)
    with att.override_configs(decode=att.DecodeConfig(16, 4, 1), num_splits=40):
        r = run_case(
            "triton", "decode", seq_lens=[700, 5], q_len_per_req=1, num_qo_heads=4, num_kv_heads=2,
            head_dim=64, dtype=fp16, return_lse=True, use_sinks=True, seed=chunk_block,
        )
    r.check()


def _bf16_bits_to_f64(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (in uint32) -> float64 values."""
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32).astype(np.float64)


def _run_ptx(text: str, regs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Execute the straight-line b32 PTX of the fast decoder on uint32 arrays (one lane per element).

    Covers exactly the instructions it uses: ``mov/and/or/shl/shr.b32``, ``prmt.b32`` (default mode:
    selector nibble bit 3 replicates the sign of the selected byte), ``mul.rn.f16x2`` and
    ``fma.rn.bf16x2``. ``regs`` holds the operands ``$4``.. as uint32 arrays; returns every register.
    """
    regs = dict(regs)

    def val(tok: str) -> np.ndarray:
        tok = tok.strip()
        if tok in regs:
            return regs[tok]
        return np.uint32(int(tok, 0))

    def halves_f16(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return ((x & 0xFFFF).astype(np.uint16).view(np.float16), (x >> 16).astype(np.uint16).view(np.float16))

    def f64_to_bf16_rne(x: np.ndarray) -> np.ndarray:
        bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)  # exact here: products fit fp32
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint32)

    for line in text.strip().splitlines():
        line = line.strip().rstrip(";")
        if line in ("{", "}") or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        args = [a.strip() for a in rest.split(",")]
        dst, src = args[0], [val(a) for a in args[1:]]
        if op == "mov.b32":
            out = np.broadcast_to(np.uint32(src[0]), next(iter(regs.values())).shape).copy()
        elif op == "and.b32":
            out = src[0] & src[1]
        elif op == "or.b32":
            out = src[0] | src[1]
        elif op == "shl.b32":
            out = (src[0].astype(np.uint64) << np.uint64(src[1])).astype(np.uint32)
        elif op == "shr.b32":  # untyped: logical shift
            out = src[0] >> src[1]
        elif op == "prmt.b32":
            a, b, c = (np.asarray(x, dtype=np.uint32) for x in src)
            pool = (b.astype(np.uint64) << 32) | a  # bytes 0-3 from a, 4-7 from b
            out = np.zeros(np.broadcast(a, b, c).shape, dtype=np.uint32)
            for i in range(4):
                sel = (c >> (4 * i)) & 0xF
                byte = ((pool >> ((sel & 7) * 8).astype(np.uint64)) & 0xFF).astype(np.uint32)
                byte = np.where(sel & 8, np.where(byte & 0x80, 0xFF, 0x00), byte).astype(np.uint32)
                out |= byte << (8 * i)
        elif op == "mul.rn.f16x2":
            (a0, a1), (b0, b1) = halves_f16(src[0]), halves_f16(src[1])
            lo, hi = (a0 * b0).view(np.uint16), (a1 * b1).view(np.uint16)  # one rounding: products fit fp32
            out = lo.astype(np.uint32) | (hi.astype(np.uint32) << 16)
        elif op == "fma.rn.bf16x2":
            parts = []
            for sh in (0, 16):
                a, b, c = ((x >> sh) & 0xFFFF for x in src)
                parts.append(f64_to_bf16_rne(_bf16_bits_to_f64(a) * _bf16_bits_to_f64(b) + _bf16_bits_to_f64(c)) << sh)
            out = parts[0] | parts[1]
        else:
            raise AssertionError(f"PTX emulator: unhandled instruction {line!r}")
        regs[dst] = np.asarray(out, dtype=np.uint32)
    return regs


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "bf16-bitwise"])
def test_fast_decoder_ptx_bit_exact(dtype):
    """The inline PTX (the exact text the kernels ship) gives ``e2m1 * sf`` for every byte x scale.

    Inputs as Triton packs them (``pack=4``): ``$4`` = four cache bytes, ``$5``/``$6`` = the scales of
    bytes (0, 1)/(2, 3) as 16-bit pairs; outputs ``$0``/``$1`` = lo plane (even elements of bytes 0-3),
    ``$2``/``$3`` = hi plane. Scales are every E4M3 byte 0..126 in the kernels' encodings: fp16
    ``(b & 0x7F) << 7`` (``sf * 2^-8``), bf16 ``sf`` itself, and for the bf16 bit-placement decoder
    ``sf * 2^118`` (its planes are ``e2m1 * sf * 2^-8``, through the bf16 subnormal pattern of 0.5).
    """
    from nvfp4compat.kernels.triton import attention_nvfp4 as fp4

    text = {"fp16": fp4._ASM_F16_TEXT, "bf16": fp4._ASM_BF16_TEXT, "bf16-bitwise": fp4._ASM_BF16_BITWISE_TEXT}[dtype]
    e2m1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
    sf_bytes = np.arange(127, dtype=np.uint32)
    e, m = sf_bytes >> 3, sf_bytes & 7
    sf = np.where(e == 0, m / 8 * 2.0**-6, (1 + m / 8) * 2.0 ** (e.astype(np.int64) - 7))
    if dtype == "fp16":
        sf_bits = (sf_bytes << 7).astype(np.uint32)
        want_scale = 2.0**-8
        assert np.array_equal(sf_bits.astype(np.uint16).view(np.float16).astype(np.float64), sf * want_scale)
    elif dtype == "bf16":
        sf_bits = (sf.astype(np.float32).view(np.uint32) >> 16).astype(np.uint32)
        want_scale = 1.0
        assert np.array_equal(_bf16_bits_to_f64(sf_bits), sf)
    else:
        sf_bits = ((sf * 2.0**118).astype(np.float32).view(np.uint32) >> 16).astype(np.uint32)
        want_scale = 2.0**-8
        assert np.array_equal(_bf16_bits_to_f64(sf_bits), sf * 2.0**118)
    # every byte value at every one of the four positions, with four different scales per word
    rng = np.random.default_rng(0)
    n = 256 * 127
    byte_val = np.tile(np.arange(256, dtype=np.uint32), 127)
    sf_idx = np.repeat(np.arange(127), 256)
    for pos in range(4):
        others = rng.integers(0, 256, size=(n, 4), dtype=np.uint32)
        others[:, pos] = byte_val
        sidx = rng.integers(0, 127, size=(n, 4))
        sidx[:, pos] = sf_idx
        word = others[:, 0] | (others[:, 1] << 8) | (others[:, 2] << 16) | (others[:, 3] << 24)
        s = sf_bits[sidx]
        regs = _run_ptx(text, {"$4": word, "$5": s[:, 0] | (s[:, 1] << 16), "$6": s[:, 2] | (s[:, 3] << 16)})
        for plane, (r0, r1), shift in (("lo", ("$0", "$1"), 0), ("hi", ("$2", "$3"), 4)):
            got_bits = np.stack([regs[r0] & 0xFFFF, regs[r0] >> 16, regs[r1] & 0xFFFF, regs[r1] >> 16], 1)
            if dtype == "fp16":
                got = got_bits.astype(np.uint16).view(np.float16).astype(np.float64)
            else:
                got = _bf16_bits_to_f64(got_bits)
            want = e2m1[(others >> shift) & 15] * sf[sidx] * want_scale
            assert np.array_equal(got, want), f"{dtype} {plane} plane, byte position {pos}"
            # signed zeros too: code 8 is -0.0
            assert np.array_equal(np.signbit(got), np.signbit(want)), f"{dtype} {plane} sign, position {pos}"


@triton.jit
def _planes_kernel(byte_ptr, sfb_ptr, lo_ptr, hi_ptr, FAST: tl.constexpr, DTYPE: tl.constexpr):
    """64 rows of head_dim 128 per program through the attention kernels' own tile decoder."""
    rows = tl.program_id(0) * 64 + tl.arange(0, 64)
    cols = tl.arange(0, 64)
    lo, hi = _att._load_planes(byte_ptr, rows * 64, sfb_ptr, rows * 8, rows >= 0, 128, 64, False, FAST, DTYPE, True)
    out = rows[:, None] * 64 + cols[None, :]
    tl.store(lo_ptr + out, lo)
    tl.store(hi_ptr + out, hi)


@pytest.mark.parametrize(
    "dtype,decoder",
    [(fp16, "table"), (bf16, "table"), (bf16, "bitwise"), (fp16, "bitwise"), (fp16, "portable"), (bf16, "portable")],
    ids=["fp16-table", "bf16-table", "bf16-bitwise", "fp16-bitwise-is-table", "fp16-portable", "bf16-portable"],
)
def test_decoders_bit_exact_in_a_kernel(dtype, decoder):
    """Each decoder inside a compiled kernel (``_load_planes``, what attention runs) gives exactly
    ``e2m1 * sf`` (times ``2^-8`` where the kernels fold ``2^8`` into the global scales), signed zeros
    included, for every byte value with every E4M3 scale 0..126.

    On a GPU this is the hardware proof of the inline PTX (the CPU proof of its text is
    ``test_fast_decoder_ptx_bit_exact``); under the interpreter the stand-ins run.
    """
    n_rows = 4096  # 32,768 scale blocks of 8 bytes: 32 byte phases x 127 scales cover every pair
    byte = (torch.arange(n_rows * 64) % 256).to(torch.uint8).reshape(n_rows, 64)
    sfb = (torch.arange(n_rows * 8) % 127).to(torch.uint8).reshape(n_rows, 8)
    lo = torch.empty(n_rows, 64, dtype=dtype, device=DEVICE)
    hi = torch.empty_like(lo)
    fast = _att.DECODERS[decoder]
    _planes_kernel[(n_rows // 64,)](byte.to(DEVICE), sfb.to(DEVICE), lo, hi, FAST=fast,
                                   DTYPE=tl.float16 if dtype == fp16 else tl.bfloat16)
    # the oracle: the reference codec's E4M3 and E2M1 decoders
    sf = reference.e4m3_decode(sfb).double().repeat_interleave(8, dim=1)
    folded = 2.0**-8 if fast != _att.DECODERS["portable"] and (dtype == fp16 or decoder == "bitwise") else 1.0
    for got, nib in ((lo, byte & 15), (hi, byte >> 4)):
        want = reference.e2m1_decode(nib).double() * sf * folded
        got64 = got.cpu().double()
        assert torch.equal(got64, want), f"{(got64 != want).sum().item()} values differ"
        assert torch.equal(torch.signbit(got64), torch.signbit(want))
    # the byte/scale pairs really were all covered
    pairs = byte.flatten().int() * 128 + sfb.repeat_interleave(8, 1).flatten().int()
    assert torch.unique(pairs).numel() == 256 * 127


FAST_DECODERS = [
    pytest.param(fp16, "table", id="fp16"),
    pytest.param(bf16, "table", id="bf16"),
    pytest.param(bf16, "bitwise", id="bf16-bitwise"),
]


@pytest.mark.parametrize("dtype,decoder", FAST_DECODERS)
@pytest.mark.parametrize("splits", [1, 3])
def test_fast_decoder_path_decode(dtype, decoder, splits):
    """The fast-decoder path (what CUDA runs) end to end, split and single-pass, on an HND cache.

    Under the interpreter the PTX is replaced by a plain-Triton stand-in with the same values, so this
    checks the scale plumbing around it: the fp16 decoder and the bf16 bit-placement decoder yield
    ``e2m1 * sf * 2^-8`` and every output path must fold the ``2^8`` back (the split-KV merge once did
    not: outputs came out 256x small).
    """
    from nvfp4compat.kernels.triton import attention as att

    with att.override_configs(decoder=decoder, num_splits=splits):
        r = run_case("triton", "decode", seq_lens=[70, 9, 130], num_qo_heads=8, num_kv_heads=2, head_dim=64,
                     page_size=32, layout="HND", dtype=dtype, return_lse=True, use_sinks=True, seed=splits)
    r.check()


@pytest.mark.parametrize("dtype,decoder", FAST_DECODERS)
def test_fast_decoder_path_mixed_prefill(dtype, decoder):
    """Fast-decoder path through a mixed batch: prefill tiles plus decode rows merged from 3 splits."""
    from nvfp4compat.kernels.triton import attention as att

    with att.override_configs(decoder=decoder, num_splits=3):
        r = run_case("triton", "prefill", seq_lens=[50, 7, 90], q_lens=[20, 2, 1], num_qo_heads=4,
                     num_kv_heads=1, head_dim=64, page_size=16, layout="HND-stacked", dtype=dtype,
                     return_lse=True)
    r.check()


# Mixed batches: decode rows (q_len <= 16 // group), chunked-prefill rows and an empty request.
PREFILL_SHAPES = [
    pytest.param(bf16, 64, 16, "NHD", 4, 1, [1, 13, 0, 40, 2], [30, 13, 5, 90, 2], id="bf16-d64-NHD-g4-mixed"),
    pytest.param(fp16, 128, 32, "HND", 2, 2, [33, 3], [33, 80], id="fp16-d128-HND-g1"),
    pytest.param(bf16, 256, 64, "combined-HND", 6, 2, [17, 1], [100, 64], id="bf16-d256-combinedHND-g3"),
    pytest.param(fp16, 64, 16, "combined-NHD", 8, 1, [24], [24], id="fp16-d64-combinedNHD-g8-single"),
    pytest.param(bf16, 512, 16, "HND-stacked", 2, 1, [9, 2], [20, 30], id="bf16-d512-stacked-g2"),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype,head_dim,page_size,layout,hq,hkv,q_lens,seq_lens", PREFILL_SHAPES)
def test_prefill_matches_reference(impl, causal, dtype, head_dim, page_size, layout, hq, hkv, q_lens, seq_lens):
    kwargs = dict(
        seq_lens=seq_lens, q_lens=q_lens, num_qo_heads=hq, num_kv_heads=hkv, head_dim=head_dim,
        page_size=page_size, layout=layout, dtype=dtype, causal=causal, return_lse=True,
    )
    if fi_refuses_head_dim_64(impl, "prefill", head_dim):
        with pytest.raises(NotImplementedError, match=FI_D64_REFUSAL):
            run_case(impl, "prefill", **kwargs)
        return
    run_case(impl, "prefill", **kwargs).check()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("features", FEATURES)
def test_prefill_features(impl, causal, features):
    # FlashInfer refuses head_dim 64 on its prefill wrapper: test its features at 128.
    kwargs = dict(
        seq_lens=[50, 7, 90], q_lens=[50, 2, 21], num_qo_heads=4, num_kv_heads=2,
        head_dim=128 if impl == "flashinfer" else 64,
        page_size=16, dtype=fp16, causal=causal, return_lse=True, **features,
    )
    if _expect_sinks_refused(impl, features):
        with pytest.raises(NotImplementedError, match="sinks.*triton"):
            run_case(impl, "prefill", **kwargs)
        return
    run_case(impl, "prefill", **kwargs).check()


def test_prefill_single_short_request_runs_decode_path():
    """One request with q_len <= 16 // group: only the split-KV kernel runs (host knows q_len)."""
    run_case("triton", "prefill", seq_lens=[77], q_lens=[3], num_qo_heads=8, num_kv_heads=2,
             return_lse=True, use_sinks=True).check()


def test_page_size_not_power_of_two():
    """vLLM hybrid models use page sizes like 48: the kernels divide instead of shifting."""
    run_case("triton", "decode", seq_lens=[100, 47], page_size=48, return_lse=True).check()
    run_case("triton", "prefill", seq_lens=[100, 47], q_lens=[60, 1], page_size=48).check()


def test_decode_and_prefill_agree():
    """decode(q_len_per_req=q) and prefill(qsl = arange * q) are the same computation."""
    dec = run_case("triton", "decode", seq_lens=[40, 61], q_len_per_req=3, return_lse=True, seed=5)
    pre = run_case("triton", "prefill", seq_lens=[40, 61], q_lens=[3, 3], return_lse=True,
                   case=dec.case, query=dec.query)
    assert ra.relative_l2(dec.out, pre.out) <= 5e-3
    assert float((dec.lse - pre.lse).abs().max()) <= 1e-3


def test_registry_routes_to_the_triton_module():
    for op in ("decode", "prefill"):
        fn = get_kernel(op, "triton")
        assert fn.__module__ == "nvfp4compat.kernels.triton.attention"
        assert fn.__name__ == op


def test_decode_work_split_sizes():
    """One wave of programs per launch; the grid bound and the merge slots hold for any lengths."""
    from nvfp4compat.kernels.triton import attention as att

    cfg = att.DecodeConfig(128, 4, 3, programs_per_sm=3)
    # 3 programs per SM: 132 SMs, 8 KV heads -> 50 chunks per head; 1 KV head -> 396.
    assert att.decode_programs(cfg, 8, 132) == (50, att.SPLIT_MIN_CHUNK_TOKENS // 128)
    assert att.decode_programs(cfg, 1, 132) == (396, att.SPLIT_MIN_CHUNK_TOKENS // 128)
    # a config without the figure takes SPLIT_TARGET_PROGRAMS_PER_SM
    assert att.decode_programs(att.DecodeConfig(64, 2, 3), 8, 132)[0] == -(-att.SPLIT_TARGET_PROGRAMS_PER_SM * 132 // 8)
    # a config's own minimum chunk (min_chunk_tokens): one warp of 16 keys per tile, chunks of 128 keys = 8 tiles
    one = att.DecodeConfig(16, 1, 1, programs_per_sm=16, min_chunk_tokens=128)
    assert att.decode_programs(one, 8, 132) == (264, 8)
    assert att.decode_programs(dataclasses.replace(one, min_chunk_tokens=None), 8, 132) == (
        264, att.SPLIT_MIN_CHUNK_TOKENS // 16)
    # one 8K request over 8 KV heads: chunks of 128 keys give 64 chunks per head where 512 gave 16
    assert att.decode_split(1, 8, 128, 16, 512, 132, one).chunks == 64
    assert att.decode_split(1, 8, 128, 16, 512, 132, dataclasses.replace(one, min_chunk_tokens=None)).chunks == 16
    with att.override_configs(num_splits=5):
        assert att.decode_programs(cfg, 8, 132) == (5, 1)
    # chunks <= programs + batch, and <= batch * cdiv(max_tiles, min_tiles); slots <= programs
    assert att.decode_grid(16, 66, 2, 256) == (82, 66)
    assert att.decode_grid(1, 66, 2, 128) == (64, 64)
    assert att.decode_grid(128, 66, 2, 32) == (194, 66)
    assert att.decode_grid(3, 1, 1, 0) == (3, 1)


def test_decode_spreads_a_batch_of_few_tiles(monkeypatch):
    """``SPLIT_SPREAD_PROGRAMS_PER_SM``: one short request is cut into up to one chunk per SM (16 a KV head for 8 KV
    heads on 132 SMs) of at least 2 tiles, where chunks of ``min_tiles`` gave it 2; a batch of ``spread * min_tiles``
    tiles or more keeps the chunks it had (the issue's shapes, 8K keys and up)."""
    from nvfp4compat.kernels.triton import attention as att

    assert att.decode_spread(8, 132) == 16
    assert att.decode_spread(1, 132) == 132
    assert att.decode_spread(64, 16) == 1
    # one request over 8 KV heads, 64-key tiles, chunks of >= 8 tiles, 66 programs a head: 1K, 2K, 8K, 32K keys
    for tiles, before, after in ((16, 2, 8), (32, 4, 16), (128, 16, 16), (512, 64, 64), (3, 1, 1), (1, 1, 1)):
        assert len(_chunk_plan([tiles], 66, 8, 0)) == before, tiles
        assert len(_chunk_plan([tiles], 66, 8, 16)) == after, tiles
    # two requests share the spread by their tiles: 1K + 3K keys -> 4 + 12 chunks (>= 2 tiles each)
    assert [sum(1 for b, _ in _chunk_plan([16, 48], 66, 8, 16) if b == i) for i in (0, 1)] == [4, 12]
    rng = np.random.default_rng(3)
    for _ in range(300):  # 128 tiles or more in all: the plan does not change
        tiles = [int(x) for x in rng.integers(0, 400, size=int(rng.integers(1, 20)))]
        if sum(tiles) >= 16 * 8:
            assert _chunk_plan(tiles, 66, 8, 16) == _chunk_plan(tiles, 66, 8, 0), tiles
    # the host's bounds for the grid: one request of up to 1K keys may take 8 chunks
    assert att.decode_grid(1, 66, 8, 16, 16) == (8, 8)
    assert att.decode_grid(1, 66, 8, 16, 0) == (2, 2)
    cfg = att.DecodeConfig(64, 4, 1, programs_per_sm=4)
    assert att.decode_split(1, 8, 128, 16, 64, 132, cfg).chunks == 8
    monkeypatch.setattr(att, "SPLIT_SPREAD_PROGRAMS_PER_SM", 0)
    assert att.decode_split(1, 8, 128, 16, 64, 132, cfg).chunks == 2
    monkeypatch.setattr(att, "SPLIT_SPREAD_PROGRAMS_PER_SM", -1)
    with pytest.raises(ValueError, match="SPLIT_SPREAD_PROGRAMS_PER_SM is -1.*set it to 1"):
        att.decode_spread(8, 132)


@pytest.mark.parametrize("per_sm", [0, 1, 8])
def test_decode_spread_matches_the_reference(monkeypatch, per_sm):
    """The decode and merge kernels agree on the spread chunks (4 SMs under the interpreter, 2 KV heads: spread 0, 2
    and 16): short batches, one request, an empty one, sinks and LSE, q_len 2 with a window, the balanced split."""
    from nvfp4compat.kernels.triton import attention as att

    monkeypatch.setattr(att, "SPLIT_SPREAD_PROGRAMS_PER_SM", per_sm)
    monkeypatch.setattr(att, "SPLIT_MIN_CHUNK_TOKENS", 64)
    with att.override_configs(decode=att.DecodeConfig(16, 4, 1)):
        for lens in ([200], [60, 0, 33], [130, 7]):
            run_case("triton", "decode", seq_lens=lens, num_qo_heads=4, num_kv_heads=2, head_dim=64, dtype=fp16,
                     return_lse=True, use_sinks=True, seed=per_sm).check()
        run_case("triton", "decode", seq_lens=[90, 150], q_len_per_req=2, sliding_window=70, num_qo_heads=4,
                 num_kv_heads=2, head_dim=64, dtype=fp16, seed=per_sm).check()
        monkeypatch.setattr(att, "SPLIT_BALANCE_STEPS", 2)
        run_case("triton", "decode", seq_lens=[200, 17, 64], num_qo_heads=4, num_kv_heads=2, head_dim=64,
                 dtype=fp16, return_lse=True, seed=per_sm).check()


def test_batch_block_rule_and_its_checks(monkeypatch):
    """``BATCH_BLOCK_TINY`` / ``BATCH_BLOCK_SMALL`` / ``BATCH_BLOCK_MAX``: the kernels scan the batch in blocks of the
    first of the two small ones that holds it, else of its size rounded up to a power of two, at most the largest; a
    value that is not a power of two from 32 to 1024, or one above the
    next, is refused with what it needs. The decode's launch cache keys on all three."""
    from nvfp4compat.kernels.triton import attention as att

    assert (att.BATCH_BLOCK_TINY, att.BATCH_BLOCK_SMALL, att.BATCH_BLOCK_MAX) == (32, 128, 1024)
    assert ([att._batch_block(b) for b in (1, 32, 33, 128, 129, 256, 257, 512, 513, 1024, 5000)]
            == [32, 32, 128, 128, 256, 256, 512, 512, 1024, 1024, 1024])
    knobs = att._knobs()
    monkeypatch.setattr(att, "BATCH_BLOCK_TINY", 128)
    assert att._knobs() != knobs
    assert [att._batch_block(b) for b in (1, 128, 129, 300, 5000)] == [128, 128, 256, 512, 1024]
    monkeypatch.setattr(att, "BATCH_BLOCK_MAX", 256)
    assert [att._batch_block(b) for b in (129, 300, 5000)] == [256, 256, 256]
    monkeypatch.setattr(att, "BATCH_BLOCK_MAX", 1024)
    monkeypatch.setattr(att, "BATCH_BLOCK_TINY", 32)
    monkeypatch.setattr(att, "BATCH_BLOCK_SMALL", 32)
    assert [att._batch_block(b) for b in (1, 32, 33)] == [32, 32, 64]
    for name in ("BATCH_BLOCK_TINY", "BATCH_BLOCK_SMALL", "BATCH_BLOCK_MAX"):
        for bad in (48, 16, 2048, 64.0, "32", True):
            monkeypatch.setattr(att, name, bad)
            with pytest.raises(ValueError, match=rf"attention.{name} is .*power of two from 32 to 1024"):
                att._batch_block(1)
        monkeypatch.setattr(att, name, {"BATCH_BLOCK_TINY": 32, "BATCH_BLOCK_SMALL": 32}.get(name, 1024))
    monkeypatch.setattr(att, "BATCH_BLOCK_TINY", 64)
    with pytest.raises(ValueError, match=r"BATCH_BLOCK_TINY \(64\) is above attention.BATCH_BLOCK_SMALL \(32\)"):
        att._batch_block(1)
    monkeypatch.setattr(att, "BATCH_BLOCK_TINY", 32)
    monkeypatch.setattr(att, "BATCH_BLOCK_SMALL", 256)
    monkeypatch.setattr(att, "BATCH_BLOCK_MAX", 128)
    with pytest.raises(ValueError, match=r"BATCH_BLOCK_SMALL \(256\) is above attention.BATCH_BLOCK_MAX \(128\)"):
        att._batch_block(1)


@pytest.mark.parametrize("fused", [False, True], ids=["merge-kernel", "fused-merge"])
def test_decode_scans_the_batch_in_blocks_of_32(monkeypatch, fused):
    """Blocks of 32 requests (``BATCH_BLOCK_TINY = BATCH_BLOCK_SMALL = BATCH_BLOCK_MAX = 32``): a batch of 40 takes
    the scan's loop over blocks (elsewhere only past 1,024 requests) in the decode and merge kernels, with the
    balanced split's search and the fused merge; the reference's output and LSE, and the same output as the default
    blocks."""
    from nvfp4compat.kernels.triton import attention as att

    lens = [int(x) for x in np.random.default_rng(40).integers(0, 90, size=40)]
    lens[3] = 0
    kw = dict(seq_lens=lens, num_qo_heads=4, num_kv_heads=2, head_dim=64, dtype=fp16, return_lse=True,
              use_sinks=True, seed=40)
    monkeypatch.setattr(att, "FUSED_MERGE", fused)
    monkeypatch.setattr(att, "SPLIT_MIN_CHUNK_TOKENS", 32)
    monkeypatch.setattr(att, "SPLIT_BALANCE_STEPS", 2)
    with att.override_configs(decode=att.DecodeConfig(16, 4, 1)):
        default = run_case("triton", "decode", **kw)
        default.check()
        for name in ("BATCH_BLOCK_TINY", "BATCH_BLOCK_SMALL", "BATCH_BLOCK_MAX"):
            monkeypatch.setattr(att, name, 32)
        blocks: list[int] = []
        real = att._batch_block
        monkeypatch.setattr(att, "_batch_block", lambda batch: blocks.append(real(batch)) or blocks[-1])
        small = run_case("triton", "decode", **kw)
    small.check()
    assert blocks == [32]
    assert torch.equal(small.out, default.out)


def _against_the_scan(monkeypatch, op: str, kw: dict, knob: str, off: int, on: int, wanted) -> list[torch.Tensor]:
    """Run ``op`` with the attention constant ``knob`` at ``off`` (the scan) and at ``on``: both match the reference and
    each other bit for bit. Returns the int32 vectors the second run allocated that ``wanted`` picks, filled with -7
    first (the mark of an entry no kernel wrote)."""
    from nvfp4compat.kernels.triton import attention as att

    got: list[torch.Tensor] = []
    real_empty = torch.empty

    def spy_empty(*shape, **kwargs):
        t = real_empty(*shape, **kwargs)
        if kwargs.get("dtype") is torch.int32 and t.dim() == 1 and wanted(t):
            t.fill_(-7)
            got.append(t)
        return t

    with att.override_configs(decode=att.DecodeConfig(16, 4, 1)):
        monkeypatch.setattr(att, knob, off)
        scan = run_case("triton", op, **kw)
        monkeypatch.setattr(att, knob, on)
        monkeypatch.setattr(att.torch, "empty", spy_empty)
        other = run_case("triton", op, **kw)
        monkeypatch.setattr(att.torch, "empty", real_empty)
    scan.check()
    other.check()
    assert torch.equal(other.out, scan.out)
    return got


@pytest.mark.parametrize("case", ["decode-balanced", "varlen-window-pdl-off"])
def test_merge_reads_the_plan_the_decode_stored(monkeypatch, case):
    """``MERGE_PLAN_MIN_BATCH``: the decode kernel stores each request's chunk count and first slot and the merge
    kernel reads them instead of scanning the batch. A batch of 40 requests (empty ones among them, blocks of 32 so the
    decode's scan loops), decode rows with the balanced split, and varlen rows with a window: the reference's output and
    LSE, the same output bit for bit as the scan, and an entry (at least one chunk) for each request with keys and
    none for the empty ones."""
    from nvfp4compat.kernels.triton import attention as att

    rng = np.random.default_rng(41)
    lens = [int(x) for x in rng.integers(0, 90, size=40)]
    lens[3] = lens[17] = 0
    kw = dict(seq_lens=lens, num_qo_heads=4, num_kv_heads=2, head_dim=64, dtype=fp16, return_lse=True,
              use_sinks=True, seed=41)
    op = "decode"
    if case == "decode-balanced":
        monkeypatch.setattr(att, "SPLIT_BALANCE_STEPS", 2)
    else:
        q_lens = [int(x) for x in rng.integers(0, 3, size=40)]
        kw.update(q_lens=q_lens, sliding_window=24)
        op = "prefill"
    monkeypatch.setattr(att, "SPLIT_MIN_CHUNK_TOKENS", 32)
    for name in ("BATCH_BLOCK_TINY", "BATCH_BLOCK_SMALL", "BATCH_BLOCK_MAX"):
        monkeypatch.setattr(att, name, 32)
    plans = _against_the_scan(monkeypatch, op, kw, "MERGE_PLAN_MIN_BATCH", 10**6, 40,
                              lambda t: tuple(t.shape) == (80,))  # the plan: 2 x batch entries
    assert len(plans) == 1
    entries = plans[0].view(40, 2)
    written = entries[:, 0] != -7
    assert 0 < int(written.sum()) < 40, "every request, or none, has keys: the case tests nothing"
    assert int((entries[written, 0] >= 1).sum()) == int(written.sum())
    assert not bool(written[3]) and not bool(written[17])
    if op == "decode":
        assert written.tolist() == [n > 0 for n in lens]


@pytest.mark.parametrize("case", ["decode-balanced", "fused-merge", "varlen-window"])
def test_decode_reads_the_chunk_table(monkeypatch, case):
    """``DECODE_TABLE_MIN_BATCH``: one program works out the split before the decode and the decode programs read
    their chunk from its table instead of scanning the batch (and the merge kernel its plan). A batch of 40 requests
    (empty ones among them) with the balanced split, with the fused merge (a chunk for each empty request), and varlen
    rows with a window: the reference's output and LSE, the same output bit for bit as the scan, and a table whose
    entries number each request's chunks 0..n-1 in request order, the slots past the last chunk marked -1."""
    from nvfp4compat.kernels.triton import attention as att

    rng = np.random.default_rng(42)
    lens = [int(x) for x in rng.integers(0, 90, size=40)]
    lens[3] = lens[17] = 0
    lens[5], lens[30] = 1200, 700  # requests of several chunks
    kw = dict(seq_lens=lens, num_qo_heads=4, num_kv_heads=2, head_dim=64, dtype=fp16, return_lse=True,
              use_sinks=True, seed=42)
    op = "decode"
    monkeypatch.setattr(att, "SPLIT_MIN_CHUNK_TOKENS", 32)
    if case == "decode-balanced":
        monkeypatch.setattr(att, "SPLIT_BALANCE_STEPS", 2)
    elif case == "fused-merge":
        monkeypatch.setattr(att, "FUSED_MERGE", True)
    else:
        kw.update(q_lens=[int(x) for x in rng.integers(0, 3, size=40)], sliding_window=24)
        op = "prefill"
    tables = _against_the_scan(monkeypatch, op, kw, "DECODE_TABLE_MIN_BATCH", 0, 40,
                               lambda t: t.numel() % 4 == 0 and t.numel() > 80)  # the table: 4 x the chunk slots
    assert len(tables) == 1
    entries = tables[0].view(-1, 4)
    assert not bool((entries[:, 0] == -7).any()), "a chunk slot the table kernel left unwritten"
    used = entries[entries[:, 0] >= 0]
    idle = entries[entries[:, 0] < 0]
    assert len(idle) > 0
    if op == "decode":  # (the varlen launch on the interpreter's few programs gives every request one chunk)
        assert int(used[:, 2].max()) > 1, "no request has several chunks: the case tests less than it should"
    assert bool((entries[: len(used), 0] >= 0).all()), "the chunks come first, then the idle slots"
    assert bool((used[1:, 0] >= used[:-1, 0]).all())
    for b in used[:, 0].unique().tolist():
        rows = used[used[:, 0] == b]
        n = int(rows[0, 2])
        assert rows[:, 1].tolist() == list(range(n)) and bool((rows[:, 2] == n).all())
        assert bool((rows[:, 3] == rows[0, 3]).all())
    if case == "fused-merge":
        assert {3, 17} <= set(used[:, 0].tolist()), "the fused merge gives each empty request a chunk of its own"
    elif case == "decode-balanced":
        assert not {3, 17} & set(used[:, 0].tolist())


def test_decode_table_knob_is_checked(monkeypatch):
    """``DECODE_TABLE_MIN_BATCH``: 0 (off) or a batch size; anything else is refused with what it needs, and the
    decode's launch cache keys on it."""
    from nvfp4compat.kernels.triton import attention as att

    knobs = att._knobs()
    monkeypatch.setattr(att, "DECODE_TABLE_MIN_BATCH", 129)
    assert att._knobs() != knobs and att._decode_table_min_batch() == 129
    for bad in (-1, 1.5, "8", True):
        monkeypatch.setattr(att, "DECODE_TABLE_MIN_BATCH", bad)
        with pytest.raises(ValueError, match=r"DECODE_TABLE_MIN_BATCH is .*it needs an int of at least 0"):
            att._decode_table_min_batch()


def test_decode_waves_fill_the_last_wave(monkeypatch):
    """decode_waves: more waves only where the batch size leaves one wave's last programs empty."""
    from nvfp4compat.kernels.triton import attention as att

    monkeypatch.setattr(att, "SPLIT_WAVES", 0)
    # 50 programs per KV head (3 per SM, 132 SMs, 8 KV heads), chunks of >= 4 tiles
    assert att.decode_waves(32, 50, 4, 64) == 2  # 32 x 8K: 32 of 50 slots -> 96 of 100
    assert att.decode_waves(64, 50, 4, 64) == 3  # 64 x 8K: 64 of 100 -> 128 of 150
    for batch, max_tiles in ((16, 128), (128, 16), (1, 64), (4, 256), (48, 32), (8, 240)):
        assert att.decode_waves(batch, 50, 4, max_tiles) == 1, (batch, max_tiles)
    # the chunk cap (a request's tiles // min_tiles) is what one request can take
    assert att.decode_waves(1, 50, 4, 64) == 1
    # the Python model of the kernel's chunking agrees: 32 x 8K fills 96 of 100 over two waves
    assert len(_chunk_plan([64] * 32, 50, 4)) == 32
    assert len(_chunk_plan([64] * 32, 100, 4)) == 96
    # degenerate inputs still give a count in range
    assert att.decode_waves(0, 0, 0, 0) == 1
    monkeypatch.setattr(att, "SPLIT_WAVES", 2)  # forced
    assert att.decode_waves(16, 50, 4, 128) == 2


@pytest.mark.parametrize("waves", [1, 3])
def test_decode_forced_waves_match_the_reference(monkeypatch, waves):
    """The output does not depend on the wave count: only the split of each request changes."""
    from nvfp4compat.kernels.triton import attention as att

    monkeypatch.setattr(att, "SPLIT_WAVES", waves)
    monkeypatch.setattr(att, "SPLIT_MIN_CHUNK_TOKENS", 16)
    with att.override_configs(decode=att.DecodeConfig(16, 4, 1)):
        r = run_case(
            "triton", "decode", seq_lens=[300, 3, 17, 130], num_qo_heads=4, num_kv_heads=2,
            head_dim=64, dtype=fp16, return_lse=True, seed=waves,
        )
    r.check()


def _cap(t: int, total: int, min_tiles: int, spread: int) -> int:
    """The kernels' chunk cap (_chunk_cap), in Python: ``t // min_tiles`` chunks, or in a batch of few tiles the
    request's part of ``spread`` chunks of at least a quarter of ``min_tiles``."""
    return max(t // min_tiles, min(t // max(min_tiles // 4, 1), t * spread // total), 1)


def _chunk_plan(tiles: list[int], programs: int, min_tiles: int, spread: int = 0) -> list[tuple[int, int]]:
    """The kernel's chunking (_request_chunks), in Python: (request, chunk index) per chunk, in order."""
    total = max(1, sum(tiles))
    plan = []
    for b, t in enumerate(tiles):
        n = 0 if t == 0 else min(max(t * programs // total, 1), _cap(t, total, min_tiles, spread))
        plan += [(b, j) for j in range(n)]
    return plan


def test_decode_chunking_balances_uniform_batches():
    """A uniform batch gets equal chunks that fill one wave: no tail of remainder chunks."""
    for batch, tiles, programs in ((16, 128, 50), (128, 16, 50), (1, 64, 50), (4, 256, 50)):
        plan = _chunk_plan([tiles] * batch, programs, 2)
        per = {b: sum(1 for x, _ in plan if x == b) for b in range(batch)}
        assert len(set(per.values())) == 1
        assert len(plan) <= max(programs, batch)


@pytest.mark.parametrize("programs", [1, 2, 5, 64])
def test_decode_chunking_never_exceeds_its_grid(programs):
    """Random length mixes: the Python model of the kernel's chunking stays inside decode_grid's bounds, with and
    without the spread of batches of few tiles."""
    from nvfp4compat.kernels.triton import attention as att

    rng = np.random.default_rng(programs)
    for _ in range(200):
        batch = int(rng.integers(1, 40))
        max_tiles = int(rng.integers(1, 300))
        tiles = [int(x) for x in rng.integers(0, max_tiles + 1, size=batch)]
        spread = int(rng.choice([0, 1, 16, 132]))
        for min_tiles in (1, 2, 3, 8):
            chunks, slots = att.decode_grid(batch, programs, min_tiles, max_tiles, spread)
            plan = _chunk_plan(tiles, programs, min_tiles, spread)
            assert len(plan) <= chunks
            multi = [b for b in set(b for b, _ in plan) if sum(1 for x, _ in plan if x == b) > 1]
            assert sum(1 for b, _ in plan if b in multi) <= slots


def _balanced_target(tiles: list[int], programs: int, min_tiles: int, steps: int, spread: int = 0) -> int:
    """The kernels' balanced chunk length (``SPLIT_BALANCE_STEPS``: _balance_target), in Python; 0: the floor rule."""
    total = max(1, sum(tiles))
    live = sum(t > 0 for t in tiles)
    cap = [_cap(t, total, min_tiles, spread) for t in tiles]
    hi = max(1, max(tiles, default=0))
    least = min((t for t in tiles if t > 0), default=2**62)
    lo = max(-(-total // programs), 1)
    if live > programs:
        return 0
    if least >= hi:
        n = min(max(programs // max(live, 1), 1), _cap(hi, total, min_tiles, spread))
        return -(-hi // n)
    hi = min(hi, -(-total // max(programs - live, 1)))
    for _ in range(steps):
        mid = (lo + hi) // 2
        fits = sum(min(-(-t // mid), c) for t, c in zip(tiles, cap, strict=True) if t > 0) <= programs
        hi, lo = (mid, lo) if fits else (hi, mid + 1)
    return hi


def _balanced_plan(tiles: list[int], programs: int, min_tiles: int, steps: int,
                   spread: int = 0) -> list[tuple[int, int]]:
    """The kernels' balanced chunking (``SPLIT_BALANCE_STEPS``: _balance_target, _request_chunks), in Python."""
    total = max(1, sum(tiles))
    cap = [_cap(t, total, min_tiles, spread) for t in tiles]
    target = _balanced_target(tiles, programs, min_tiles, steps, spread)
    if target == 0:
        return _chunk_plan(tiles, programs, min_tiles, spread)
    plan = []
    for b, t in enumerate(tiles):
        n = 0 if t == 0 else min(max(-(-t // target), 1), cap[b])
        plan += [(b, j) for j in range(n)]
    return plan


def _longest_chunk(tiles: list[int], plan: list[tuple[int, int]]) -> int:
    n = {b: sum(1 for x, _ in plan if x == b) for b, _ in plan}
    return max(-(-tiles[b] // k) for b, k in n.items())


@pytest.mark.parametrize("steps", [1, 2, 8])
def test_balanced_chunking_fits_the_grid(steps):
    """``SPLIT_BALANCE_STEPS``: random length mixes (empty requests, more requests than programs, equal ones): the
    balanced chunks stay inside decode_grid's chunks and merge slots, never pass the programs while the requests do
    not outnumber them, and the longest chunk is never longer than the floor rule's where both use the programs."""
    from nvfp4compat.kernels.triton import attention as att

    rng = np.random.default_rng(steps)
    for _ in range(400):
        programs = int(rng.choice([1, 2, 5, 33, 66, 198]))
        batch = int(rng.integers(1, 60))
        max_tiles = int(rng.integers(1, 600))
        tiles = [int(x) for x in rng.integers(0, max_tiles + 1, size=batch)]
        if rng.random() < 0.2:
            tiles = [max_tiles] * batch
        spread = int(rng.choice([0, 16, 132]))
        for min_tiles in (1, 2, 8):
            chunks, slots = att.decode_grid(batch, programs, min_tiles, max_tiles, spread)
            plan = _balanced_plan(tiles, programs, min_tiles, steps, spread)
            assert len(plan) <= chunks
            multi = [b for b in set(b for b, _ in plan) if sum(1 for x, _ in plan if x == b) > 1]
            assert sum(1 for b, _ in plan if b in multi) <= slots
            if sum(t > 0 for t in tiles) <= programs:
                assert len(plan) <= programs
                floor = _chunk_plan(tiles, programs, min_tiles, spread)
                if plan and len(floor) <= programs and steps == 8:
                    assert _longest_chunk(tiles, plan) <= _longest_chunk(tiles, floor), (tiles, programs)


def test_balanced_chunking_shortens_the_ragged_bench_batch():
    """The ragged bench batch (8 requests of 1K-30K keys, 64-key tiles) on 66 programs a KV head (132 SMs x 4 / 8
    heads): the floor rule's longest chunk is the 2K request's 32 tiles, whole; balanced, 26 (the mean is 23.5)."""
    tiles = [n // 64 for n in (1024, 30720, 4096, 16384, 2048, 24576, 8192, 12288)]
    assert _longest_chunk(tiles, _chunk_plan(tiles, 66, 8)) == 32
    plan = _balanced_plan(tiles, 66, 8, 4)
    assert _longest_chunk(tiles, plan) == 26 and len(plan) <= 66


@triton.jit(do_not_specialize=("batch", "programs", "min_tiles", "spread"))  # as the decode and merge kernels
def _split_probe_kernel(seq_lens_ptr, out_ptr, batch, programs, min_tiles, spread, BATCH_BLOCK: tl.constexpr,
                        BALANCE: tl.constexpr):
    """The kernels' split arithmetic on lengths of one-key tiles: out = [target, total, chunks of each request]."""
    bs0 = tl.arange(0, BATCH_BLOCK)
    max_kv = tl.full((), 2**40, tl.int64)
    t0 = _att._request_tiles(bs0, bs0 < batch, seq_lens_ptr, seq_lens_ptr, 0, max_kv, 0, 1, 1, False, False)
    total = _att._total_tiles(t0, batch, seq_lens_ptr, seq_lens_ptr, 0, max_kv, 0, 1, 1, False, False, BATCH_BLOCK)
    target = _att._balance_target(t0, batch, total, programs, min_tiles, spread, seq_lens_ptr, seq_lens_ptr, 0,
                                  max_kv, 0, 1, 1, False, False, BATCH_BLOCK, BALANCE)
    tl.store(out_ptr, target)
    tl.store(out_ptr + 1, total)
    ch0 = _att._tiles_chunks(t0, total, programs, min_tiles, spread, False, target, BALANCE)
    tl.store(out_ptr + 2 + bs0, ch0.to(tl.int64), mask=bs0 < batch)
    for b0 in range(BATCH_BLOCK, batch, BATCH_BLOCK):
        bs, ch = _att._block_chunks(b0, batch, total, programs, min_tiles, spread, seq_lens_ptr, seq_lens_ptr, 0,
                                    max_kv, 0, 1, 1, False, False, BATCH_BLOCK, False, target, BALANCE)
        tl.store(out_ptr + 2 + bs, ch.to(tl.int64), mask=bs < batch)


@triton.jit
def _cdiv_probe_kernel(t_ptr, d_ptr, small_ptr, wide_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    t = tl.load(t_ptr + i, mask=i < n, other=0)
    d = tl.load(d_ptr + i, mask=i < n, other=1)
    tl.store(small_ptr + i, _att._cdiv_small(t, d), mask=i < n)
    tl.store(wide_ptr + i, _att._cdiv_wide(t, d.to(tl.int32)), mask=i < n)


def test_division_free_quotients():
    """``_cdiv_small`` (fp32 estimate, two corrections) and ``_cdiv_wide`` (fp64) are the exact ceiling over their
    documented ranges; the first pairs are ones where the fp32 estimate alone is one short (found by a numpy search)."""
    rng = np.random.default_rng(5)
    t = [33682898, 64094330, 50486866, 61301525, 47621826, 41364122, 0, 1, 2**26 - 1, 2**26 - 1, 2**26 - 2]
    d = [71, 31, 165, 61, 25, 230, 1, 1, 2**26 - 1, 32, 2**26 - 1]
    q = rng.integers(1, 2**21, 400)
    dd = (rng.random(400) * (2**26 / (q + 1))).astype(np.int64) + 1
    tt = np.clip(q * dd + rng.integers(-3, 4, 400), 0, 2**26 - 1)
    t += tt.tolist()
    d += dd.tolist()
    tw = torch.tensor(t, dtype=torch.int64, device=DEVICE)
    dw = torch.tensor(d, dtype=torch.int64, device=DEVICE)
    small = torch.zeros_like(tw)
    wide = torch.zeros_like(tw)
    _cdiv_probe_kernel[(triton.cdiv(len(t), 128),)](tw, dw, small, wide, len(t), BLOCK=128)
    want = [-(-a // b) for a, b in zip(t, d, strict=True)]
    assert small.tolist() == want
    assert wide.tolist() == want
    big = [2**53 - 1, 2**53 - 2, 2**40 + 12345, 2**31 * 7, 0]
    div = [2**31 - 1, 3, 2**31 - 1, 2**31 - 1, 5]
    tb = torch.tensor(big, dtype=torch.int64, device=DEVICE)
    db = torch.tensor(div, dtype=torch.int64, device=DEVICE)
    wide = torch.zeros_like(tb)
    _cdiv_probe_kernel[(1,)](tb, db, torch.zeros_like(tb), wide, len(big), BLOCK=128)
    assert wide.tolist() == [-(-a // b) for a, b in zip(big, div, strict=True)]


@pytest.mark.parametrize("steps", [0, 2, 5])
def test_split_arithmetic_matches_the_model(steps):
    """The kernels' split integers (``_request_tiles`` .. ``_balance_target``, ``_tiles_chunks``: the total, the
    balanced chunk length, each request's chunk count) equal the Python models above, across batch blocks (16
    requests a block, batches to 40), with empty, equal and long requests: the division-free quotients
    (``_cdiv_small``, ``_cdiv_wide``) included."""
    rng = np.random.default_rng(100 + steps)
    cases = [([5], 7, 1, 0), ([0, 0], 3, 1, 0), ([9, 9, 9], 4, 2, 0), ([2**25 - 1, 1, 3], 2**20, 1, 0),
             ([2**25 - 1] * 3, 7, 5, 0), ([16], 66, 8, 16), ([32], 66, 8, 16), ([7, 9, 0, 3], 66, 8, 132),
             ([5, 5, 5], 66, 8, 16), ([2**25 - 1, 2], 198, 8, 132)]
    for _ in range(12):
        batch = int(rng.integers(1, 41))
        tiles = [int(x) for x in rng.integers(0, int(rng.choice([4, 300, 2**25])), size=batch)]
        if rng.random() < 0.25:
            tiles = [tiles[0]] * batch
        cases.append((tiles, int(rng.choice([1, 3, 66, 198, 2**20])), int(rng.choice([1, 2, 8])),
                      int(rng.choice([0, 16, 132]))))
    for tiles, programs, min_tiles, spread in cases:
        lens = torch.tensor(tiles, dtype=torch.int32, device=DEVICE)
        out = torch.full((2 + len(tiles),), -7, dtype=torch.int64, device=DEVICE)
        _split_probe_kernel[(1,)](lens, out, len(tiles), programs, min_tiles, spread, BATCH_BLOCK=16, BALANCE=steps)
        target = _balanced_target(tiles, programs, min_tiles, steps, spread) if steps else 0
        plan = (_balanced_plan(tiles, programs, min_tiles, steps, spread) if steps
                else _chunk_plan(tiles, programs, min_tiles, spread))
        want = [target, max(1, sum(tiles))] + [sum(1 for b, _ in plan if b == i) for i in range(len(tiles))]
        assert out.tolist() == want, (tiles, programs, min_tiles, spread)


@pytest.mark.parametrize("steps", [1, 4])
@pytest.mark.parametrize("splits", [None, 3, 9])
def test_decode_balanced_split_matches_reference(monkeypatch, steps, splits):
    """``SPLIT_BALANCE_STEPS``: the decode and merge kernels agree on the balanced chunks: ragged batches (with an
    empty request), equal ones, one request, more requests than programs (``num_splits=3``: the floor rule), q_len 2
    with a window."""
    from nvfp4compat.kernels.triton import attention as att

    monkeypatch.setattr(att, "SPLIT_BALANCE_STEPS", steps)
    monkeypatch.setattr(att, "SPLIT_MIN_CHUNK_TOKENS", 16)
    over = {"decode": att.DecodeConfig(16, 4, 1), **({"num_splits": splits} if splits else {})}
    with att.override_configs(**over):
        for lens in ([300, 3, 17, 130], [300, 2, 17, 0, 45, 2], [64, 64, 64], [500]):
            run_case("triton", "decode", seq_lens=lens, num_qo_heads=4, num_kv_heads=2, head_dim=64, dtype=fp16,
                     return_lse=True, use_sinks=True, seed=steps).check()
        run_case("triton", "decode", seq_lens=[300, 40, 170], q_len_per_req=2, num_qo_heads=4, num_kv_heads=2,
                 head_dim=64, dtype=fp16, sliding_window=100, seed=steps).check()


def test_balance_only_where_it_can_shorten(monkeypatch):
    """The host passes ``BALANCE = 0`` (the floor rule, no search in any program) for one request and for more
    requests than programs, where the kernels would keep the floor rule anyway; the steps otherwise."""
    from nvfp4compat.kernels.triton import attention as att

    monkeypatch.setattr(att, "SPLIT_BALANCE_STEPS", 3)
    assert [att._balance_steps(b, 66) for b in (1, 2, 24, 66, 67, 128)] == [0, 3, 3, 3, 0, 0]
    monkeypatch.setattr(att, "SPLIT_BALANCE_STEPS", 0)
    assert att._balance_steps(24, 66) == 0


@pytest.mark.parametrize("bad", [-1, 33, 2.0, True])
def test_split_balance_steps_is_checked(monkeypatch, bad):
    from nvfp4compat.kernels.triton import attention as att

    monkeypatch.setattr(att, "SPLIT_BALANCE_STEPS", bad)
    with pytest.raises(ValueError, match=r"attention.SPLIT_BALANCE_STEPS is .*needs an int from 0 .* set it to 0"):
        run_case("triton", "decode", seq_lens=[30, 7], num_qo_heads=4, num_kv_heads=2, head_dim=64, dtype=fp16)


@pytest.mark.parametrize("splits", [1, 3, 9])
def test_decode_ragged_batch_matches_reference(splits):
    """A ragged batch (one long request, short ones, an empty one) over every split regime: single-chunk
    requests written directly, multi-chunk ones merged, the empty one zero; with q_len 2 and a window."""
    from nvfp4compat.kernels.triton import attention as att

    with att.override_configs(decode=att.DecodeConfig(16, 4, 1), num_splits=splits):
        r = run_case(
            "triton", "decode", seq_lens=[300, 2, 17, 0, 45, 2], q_len_per_req=1, num_qo_heads=4,
            num_kv_heads=2, head_dim=64, dtype=fp16, return_lse=True, use_sinks=True, seed=splits,
        )
        r.check()
        r = run_case(
            "triton", "decode", seq_lens=[260, 3, 40], q_len_per_req=2, num_qo_heads=4, num_kv_heads=1,
            head_dim=64, dtype=fp16, return_lse=True, sliding_window=50, seed=splits + 1,
        )
        r.check()


def test_decode_config_widens_narrow_configs(monkeypatch):
    """A 2-warp decode config is widened to 4 warps for BLOCK_M > 16 and latency-bound launches."""
    from nvfp4compat.kernels.triton import attention as att

    words = att.DecodeConfig(128, 4, 2, programs_per_sm=3)
    assert att.decode_config(128, 64, 1, 132) == words  # already wide
    monkeypatch.setitem(att._DECODE_CONFIGS, 128, att.DecodeConfig(64, 2, 3))
    monkeypatch.delitem(att._DECODE_CONFIGS_BYTE_SCALES, 128)
    assert att.decode_config(128, 16, 512, 132) == att.DecodeConfig(64, 2, 3)  # fills the GPU
    assert att.decode_config(128, 16, 48, 132) == att.DecodeConfig(64, 4, 3)  # latency-bound
    assert att.decode_config(128, 64, 512, 132) == att.DecodeConfig(64, 4, 3)  # q_len 8 x GQA 8: no spills
    assert att.decode_config(512, 16, 1, 132) == att.DecodeConfig(16, 8, 2)  # never narrowed
    with att.override_configs(decode=att.DecodeConfig(32, 2, 1)):
        assert att.decode_config(128, 64, 1, 132) == att.DecodeConfig(32, 2, 1)


def test_decode_config_takes_byte_scales_where_timed():
    """head_dim 128: 16 rows without rotation take the byte-scale config capped at 168 registers (timed on an
    H200); more rows and the fused rotation keep the word-load config. Both split the work alike:
    decode_split sizes the grid once, from the 16-row config."""
    from nvfp4compat.kernels.triton import attention as att

    byte = att.DecodeConfig(128, 4, 2, maxnreg=168, programs_per_sm=3, scale_words=False)
    words = att.DecodeConfig(128, 4, 2, programs_per_sm=3)
    assert att.decode_config(128) == byte
    assert att.decode_config(128, 16, 1, 132) == byte  # one request: latency-bound, timed too
    assert att.decode_config(128, 32, 512, 132) == words
    assert att.decode_config(128, 16, 512, 132, rotate=True) == words
    assert att.decode_config(64, 16, 512, 132) == att._DECODE_CONFIGS[64]
    for hd, cfg in att._DECODE_CONFIGS_BYTE_SCALES.items():
        base = att._DECODE_CONFIGS[hd]
        assert (cfg.block_n, cfg.programs_per_sm) == (base.block_n, base.programs_per_sm), hd


def test_decode_config_takes_the_gluon_kernel_where_it_can():
    """head_dim 128, 16 rows, no rotation, a launch the Gluon kernel can take: its config (lean + kt + page_tile + l2_fetch 128
    under a 128-register cap, 4 programs per SM, at <= 8 rows; the lean config uncapped, 2 per SM, at 9-16, where
    the transposed logits do not apply); everything else as before. The split is sized from the config the launch
    takes (its block_n and programs per SM), so the grid and the merge agree with the kernel."""
    from nvfp4compat.kernels.triton import attention as att

    g = att._DECODE_CONFIGS_GLUON[128]
    assert g.gluon and g.e4m3_cvt and g.lean and g.kt_logits and g.page_tile and g.block_n == 64
    assert (g.maxnreg, g.programs_per_sm) == (128, 4)
    assert not (g.skew_logits or g.imad_shr or g.lazy_rescale)
    assert (g.l2_fetch, g.l2_ahead, g.ring) == (128, 0, 0)  # the word loads' L2 prefetch size (run V)
    assert g in att.GLUON_DECODE_CONFIGS  # the benchmarks and the GPU tests sweep it
    lean = att.GLUON_DECODE_CONFIGS[0]
    assert lean.lean and not (lean.kt_logits or lean.page_tile) and lean.maxnreg is None
    assert dataclasses.replace(lean, lean=False) == att.GLUON_FP32_SCALES_CONFIG
    assert att.GLUON_FP32_SCALES_CONFIG in att.GLUON_DECODE_CONFIGS
    for rows in (1, 4, 8):
        assert att.decode_config(128, 16, 512, 132, gluon=True, rows=rows) == g
    for rows in (9, 16):
        r16 = att.decode_config(128, 16, 512, 132, gluon=True, rows=rows)
        assert r16 == dataclasses.replace(lean, programs_per_sm=att.GLUON_ROWS16_PROGRAMS_PER_SM)
        assert not att._gluon_kt(g, rows)  # why 9-16 rows do not take g: no transposed logits there
    assert att.decode_config(128, 16, 512, 132, gluon=True, rotate=True) == att.decode_config(128, 16, 512, 132,
                                                                                              rotate=True)
    assert not att.decode_config(128, 32, 512, 132, gluon=True).gluon
    assert not att.decode_config(64, 16, 512, 132, gluon=True).gluon
    assert not att.decode_config(128, 16, 512, 132).gluon
    split = att.decode_split(4, 8, 128, 16, 1024, 132, g)
    assert split.min_tiles == att.SPLIT_MIN_CHUNK_TOKENS // 64
    assert split.programs == -(-4 * 132 // 8)
    assert att.decode_split(4, 8, 128, 16, 1024, 132, lean).programs == -(-3 * 132 // 8)
    plain = att.decode_split(4, 8, 128, 16, 1024, 132)
    assert plain.min_tiles == att.SPLIT_MIN_CHUNK_TOKENS // 128
    with att.override_configs(decode=att.GLUON_DECODE_CONFIGS[2]):
        assert att.decode_config(128, 16, gluon=False) == att.GLUON_DECODE_CONFIGS[2]


def test_merge_pdl_only_where_asked_for_on_sm90_cuda(monkeypatch):
    """``MERGE_PDL``: the merge kernel becomes the decode kernel's programmatic dependent only where asked for, on a
    CUDA device of SM90+ (``griddepcontrol``), outside the interpreter, and when there is a merge kernel (no
    ``FUSED_MERGE``). 2 by default (the trigger as the decode programs' key loops end: faster on all seven bench shapes
    in two calls of run T), 1 (or True): as they start, 0: off; anything else is refused with the values it takes."""
    from nvfp4compat.kernels.triton import attention as att

    assert att.MERGE_PDL == 2
    cuda = torch.device("cuda")
    monkeypatch.setattr(att, "interpreting", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert att._merge_pdl(cuda) == 2
    monkeypatch.setattr(att, "MERGE_PDL", 0)
    assert att._merge_pdl(cuda) == 0  # not asked for
    for bad in (3, -1, 1.0, "1"):
        monkeypatch.setattr(att, "MERGE_PDL", bad)
        with pytest.raises(ValueError, match=r"attention.MERGE_PDL is .*needs 0 \(off\), 1 .* or 2"):
            att._merge_pdl(cuda)
    monkeypatch.setattr(att, "MERGE_PDL", True)
    assert att._merge_pdl(cuda) == 1
    assert not att._merge_pdl(torch.device("cpu"))
    for cc in ((8, 0), (8, 9)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, cc=cc: cc)
        assert not att._merge_pdl(cuda), cc
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (12, 0))
    assert att._merge_pdl(cuda)
    monkeypatch.setattr(att, "FUSED_MERGE", True)
    assert not att._merge_pdl(cuda)
    monkeypatch.setattr(att, "FUSED_MERGE", False)
    monkeypatch.setattr(att, "interpreting", lambda: True)
    assert not att._merge_pdl(cuda)
    assert att._pdl_by_cc(89) == {"PDL": False} and att._pdl_by_cc(90) == {"PDL": True}
    assert att._pdl_by_cc(89, 2) == {"PDL": 0} and att._pdl_by_cc(90, 2) == {"PDL": 2}


def test_decode_with_merge_pdl_asked_for_on_the_cpu_matches_reference(monkeypatch):
    """Asking for ``MERGE_PDL`` where it cannot apply (the interpreter) changes nothing: the split requests' merge
    still runs, after the decode kernel, and the result is the reference's."""
    from nvfp4compat.kernels.triton import attention as att

    monkeypatch.setattr(att, "MERGE_PDL", True)
    with att.override_configs(decode=att.DecodeConfig(16, 4, 1), num_splits=3):
        r = run_case("triton", "decode", seq_lens=[150, 1, 64], num_qo_heads=4, num_kv_heads=2, head_dim=64,
                     dtype=fp16, return_lse=True, seed=5, use_sinks=True)
    r.check()


def test_gluon_eligibility():
    """What the Gluon kernel serves: bf16 or fp16, head_dim 128, <= 16 rows, no rotation, 16-byte data rows, 2-byte
    scale rows (every feature within that: windows, sinks, any page size, varlen rows, the fused merge); on the CPU
    (and under the interpreter) no launch is eligible."""
    from nvfp4compat.kernels.triton import attention as att

    if att._gluon is None:
        pytest.skip("this triton has no Gluon")
    ok = att._gluon.gluon_decode_eligible
    assert ok(128, 16, False, torch.bfloat16, 16, 8)
    assert ok(128, 16, False, torch.float16, 16, 8)
    assert ok(128, 16, False, torch.bfloat16, 16, 2)
    assert not ok(128, 16, False, torch.float32, 16, 8)
    assert not ok(64, 16, False, torch.bfloat16, 16, 8)
    assert not ok(128, 32, False, torch.bfloat16, 16, 8)  # more than 16 rows
    assert not ok(128, 16, True, torch.bfloat16, 16, 8)
    assert not ok(128, 16, False, torch.bfloat16, 8, 8)  # cache rows on 8-byte boundaries only
    assert not ok(128, 16, False, torch.bfloat16, 16, 1)
    c = _cache(head_dim=128)
    cl = att._cache_launch(att.normalize_cache(c.paged_kv_cache, c.kv_cache_sf, c.kv_layout))
    q = torch.zeros(1, 4, 128, dtype=torch.bfloat16)
    assert not att._gluon_eligible(q, 128, 16, False, cl)


def test_gluon_page_tile_only_where_each_warps_keys_share_a_page():
    """``PAGE_TILE`` (one page id per warp and tile, unmasked loads) is set only where the config asks for it, the page
    size is a power of two and a multiple of the keys per warp, and there is no window (tiles start on page-aligned
    keys); everywhere else the launch takes the per-key page ids."""
    from nvfp4compat.kernels.triton import attention as att

    tiled = next(c for c in att.GLUON_DECODE_CONFIGS if c.page_tile)
    assert tiled.block_n // tiled.num_warps == 16
    for page in (16, 32, 64, 128, 256):
        assert att._gluon_page_tile(tiled, page, 0)
        assert not att._gluon_page_tile(tiled, page, 500)  # a window: the tiles start at kv_lo, not on a page
    for page in (1, 2, 8, 12, 13, 24, 48, 0, -16):
        assert not att._gluon_page_tile(tiled, page, 0), page
    assert not att._gluon_page_tile(att.GLUON_DECODE_CONFIGS[0], 16, 0)  # not asked for: the lean config
    assert att._gluon_page_tile(att._DECODE_CONFIGS_GLUON[128], 16, 0)  # the default asks for it
    wide = dataclasses.replace(tiled, block_n=128, num_warps=4)  # 32 keys per warp
    assert not att._gluon_page_tile(wide, 16, 0) and att._gluon_page_tile(wide, 32, 0)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_gluon_token_strides_are_the_bytes_between_a_pages_tokens(layout):
    """``PAGE_TILE`` takes the token strides as constexprs (``TOK_K, TOK_V, TOK_KS, TOK_VS``): for each tensor the bytes
    from a page's token 0 to its token 1 (same head), measured on the cache's own views, whatever the layout."""
    from nvfp4compat.kernels.triton import attention as att

    for heads, head_dim in ((2, 128), (8, 128), (1, 64)):
        c = ra.make_paged_cache([40], heads, head_dim, 16, layout=layout, device=DEVICE,
                                generator=torch.Generator().manual_seed(0))
        views = att.normalize_cache(c.paged_kv_cache, c.kv_cache_sf, c.kv_layout)
        cl = att._cache_launch(views)

        def step(t):  # bytes from (page 0, token 0, head 0) to (page 0, token 1, head 0)
            t1 = t[0, 1, 0] if layout == "NHD" else t[0, 0, 1]
            return t1.data_ptr() - t[0, 0, 0].data_ptr()

        expect = tuple(step(t) for t in (views.k_data, views.v_data, views.k_sf, views.v_sf))
        assert att._gluon_token_strides(cl.strides, cl.data_align, cl.sf_align) == expect
        # what a launch passes: the strides with PAGE_TILE, zeros where it is off (a window, or not asked for)
        tiled = next(cfg for cfg in att.GLUON_DECODE_CONFIGS if cfg.page_tile)
        assert att._gluon_page_tile_tok(tiled, 16, 0, cl) == expect
        assert att._gluon_page_tile_tok(tiled, 16, 500, cl) == (0, 0, 0, 0)
        assert att._gluon_page_tile_tok(att.GLUON_DECODE_CONFIGS[0], 16, 0, cl) == (0, 0, 0, 0)
        assert att._gluon_page_tile_tok(att._DECODE_CONFIGS_GLUON[128], 16, 0, cl) == expect
        row = head_dim // 2 if layout == "HND" else heads * head_dim // 2
        assert expect[0] == expect[1] == row and expect[2] == expect[3] == row // 8


def test_gluon_build_failure_falls_back_once(monkeypatch):
    """A Gluon build failure warns once, then every launch takes the plain kernel."""
    from nvfp4compat.kernels.triton import attention as att

    monkeypatch.setattr(att, "_gluon_failed", False)
    with pytest.warns(RuntimeWarning, match="falls back to the plain-Triton kernel"):
        att._gluon_build_failed(RuntimeError("ptxas: out of registers"))
    assert att._gluon_failed
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        att._gluon_build_failed(RuntimeError("again"))  # no second warning


def test_scales_ahead_takes_a_cp_async_ring_of_three_or_more():
    """DecodeConfig.scales_ahead=2 (the block scales two tiles ahead) is a path of the cp.async ring loop: a config that
    asks for it elsewhere is refused with what it found and what it needs; a launch that does not run the config's ring
    (no PAGE_TILE: RING 0) gets SCALE_AHEAD 1."""
    from dataclasses import replace

    from nvfp4compat.kernels.triton import attention as att

    base = att._GLUON_KT_PAGE_TILE
    cfg = replace(base, ring=4, scales_ahead=2)
    assert cfg in att.GLUON_DECODE_CONFIGS
    assert att._gluon_scale_ahead(cfg, att._gluon_ring(cfg, True)) == 2
    assert att._gluon_scale_ahead(cfg, att._gluon_ring(cfg, False)) == 1
    assert att._gluon_scale_ahead(base, 0) == 1
    for bad in ({"ring": 2}, {"ring": 0}, {"ring": 4, "tma_loader": True}, {"ring": 4, "tile_pairs": True}):
        with pytest.raises(ValueError, match=r"scales_ahead is 1, or 2 with a cp.async ring of 3 or more"):
            replace(base, scales_ahead=2, **bad)
    with pytest.raises(ValueError, match=r"DecodeConfig\(scales_ahead=3"):
        replace(base, ring=4, scales_ahead=3)


def test_ptx_ring_takes_a_cp_async_ring_that_fits_static_shared_memory():
    """DecodeConfig.ptx_ring (the ring declared in inline PTX, outside Triton's allocation) needs a cp.async ring of at
    most PTX_RING_MAX_BYTES; elsewhere it is refused with what was found and the way out. The launch and the AOT build
    pass PRING only where the launch runs the ring."""
    from dataclasses import replace

    from nvfp4compat.kernels.triton import attention as att

    base = att._GLUON_KT_PAGE_TILE
    assert replace(base, ring=3, ptx_ring=True) in att.GLUON_DECODE_CONFIGS
    for bad in ({"ring": 0}, {"ring": 4}, {"ring": 3, "block_n": 128, "num_warps": 8},
                {"ring": 3, "tma_loader": True}, {"ring": 4, "tile_pairs": True}):
        with pytest.raises(ValueError, match=r"ptx_ring takes a cp.async ring .* of at most 24576 bytes"):
            replace(base, ptx_ring=True, **bad)
    gluon = {v.label: v for v in att.aot_variants()["attention_decode_gluon"]}
    i = att.GLUON_DECODE_CONFIGS.index(replace(base, ring=3, ptx_ring=True))
    assert gluon[f"bf16-d128-sweep{i}"].constexprs["PRING"] is True
    assert gluon[f"bf16-d128-sweep{i}"].constexprs["RING"] == 3
    assert gluon["bf16-d128"].constexprs["PRING"] is False


def test_l2_prefetch_configs_are_checked_and_reach_the_launch():
    """DecodeConfig.l2_fetch (the word loads' L2 prefetch size), l2_scales (the block-scale loads' too) and l2_ahead
    (prefetch.global.L2 of the tile n ahead) take the Gluon kernel's page-tiled one-tile loop: a size other than 0/64/128/256, a ring, the plain kernel, a
    distance of 1 or below 0, tile pairs or other than 16 keys per warp, l2_scales without l2_fetch are refused with
    what was found and the way out. The launch and the AOT build pass them only where the launch runs that loop (PAGE_TILE, no ring). The default
    of up to 8 rows is run O's config with l2_fetch 128 (run V)."""
    from dataclasses import replace

    from nvfp4compat.kernels.triton import attention as att

    base = att._GLUON_KT_PAGE_TILE
    assert att._DECODE_CONFIGS_GLUON[128] == replace(base, l2_fetch=128, smem_merge=True)
    assert replace(base, l2_fetch=128) == att.GLUON_REDUCE_MERGE_CONFIG
    assert base in att.GLUON_DECODE_CONFIGS and att._DECODE_CONFIGS_GLUON[128] in att.GLUON_DECODE_CONFIGS
    for bad in ({"l2_fetch": 32}, {"l2_fetch": 512}, {"l2_fetch": 128, "ring": 3},
                {"l2_fetch": 128, "gluon": False}, {"l2_fetch": 64, "ring": 3, "ptx_ring": True, "gluon": False}):
        with pytest.raises(ValueError, match=r"l2_fetch is 0, 64, 128 or 256 \(bytes\), for the Gluon kernel"):
            replace(base, **bad)
    for bad in ({"l2_ahead": 1}, {"l2_ahead": -2}, {"l2_ahead": 3, "ring": 3}, {"l2_ahead": 3, "tile_pairs": True},
                {"l2_ahead": 3, "block_n": 32, "num_warps": 1}, {"l2_ahead": 3, "gluon": False}):
        with pytest.raises(ValueError, match=r"l2_ahead is 0 or a tile distance of 2 or more"):
            replace(base, **bad)
    with pytest.raises(ValueError, match=r"l2_scales=True, l2_fetch=0, ring=0\): .* takes an l2_fetch"):
        replace(base, l2_scales=True)
    with pytest.raises(ValueError, match=r"l2_scales=True, l2_fetch=128, ring=3\): .* and no ring"):
        replace(base, l2_scales=True, l2_fetch=128, ring=3, ptx_ring=True)
    # the inline-PTX ring's cp.async copies take the hint; a launch that keeps the ring in Triton's allocation (16 rows)
    # loads without it
    pring = replace(base, ring=3, ptx_ring=True, l2_fetch=128)
    assert pring in att.GLUON_DECODE_CONFIGS
    assert att._gluon_l2(pring, 3, True, True) == (128, 0, False)
    assert att._gluon_l2(pring, 3, True, False) == (0, 0, False)
    assert att._gluon_l2(pring, 0, False, False) == (0, 0, False)
    cfg = replace(base, l2_fetch=256, l2_ahead=3)
    assert att._gluon_l2(cfg, 0, True) == (256, 3, False)
    assert att._gluon_l2(cfg, 0, False) == (0, 0, False)  # no PAGE_TILE (a window, pages not 2^n keys)
    assert att._gluon_l2(replace(base, l2_fetch=128, ring=0), 3, True) == (0, 0, False)
    assert att._gluon_l2(base, 0, True) == (0, 0, False)
    assert att._gluon_l2(att._DECODE_CONFIGS_GLUON[128], 0, True) == (128, 0, False)
    assert att._gluon_l2(replace(base, l2_fetch=128, l2_scales=True), 0, True) == (128, 0, True)
    assert att._gluon_l2(replace(base, l2_fetch=128, l2_scales=True), 0, False) == (0, 0, False)
    gluon = {v.label: v for v in att.aot_variants()["attention_decode_gluon"]}
    i = att.GLUON_DECODE_CONFIGS.index(cfg)
    assert (gluon[f"bf16-d128-sweep{i}"].constexprs["L2_FETCH"], gluon[f"bf16-d128-sweep{i}"].constexprs["L2_AHEAD"]) \
        == (256, 3)
    assert (gluon["bf16-d128"].constexprs["L2_FETCH"], gluon["bf16-d128"].constexprs["L2_AHEAD"]) == (128, 0)
    assert gluon["bf16-d128"].constexprs["L2_SCALES"] is False
    i = att.GLUON_DECODE_CONFIGS.index(replace(att.GLUON_REDUCE_MERGE_CONFIG, l2_scales=True))
    assert gluon[f"bf16-d128-sweep{i}"].constexprs["L2_SCALES"] is True
    # a launch the default serves without PAGE_TILE (pages that are not 2^n keys) loads plainly
    assert (gluon["bf16-d128-page-any"].constexprs["L2_FETCH"], gluon["bf16-d128-page-any"].constexprs["L2_AHEAD"]) \
        == (0, 0)


def test_l2_bulk_configs_are_checked_and_reach_sm90_launches_only():
    """DecodeConfig.l2_bulk (bulk prefetches of the tile n ahead, SM90+) takes the Gluon kernel's page-tiled one-tile
    loop: a distance of 1 or below 0, no page_tile, a ring, tile pairs, l2_ahead or the plain kernel are refused with
    what was found and the way out. The launch and the AOT build pass it only where the launch runs that loop on an
    SM90+ target; elsewhere (an sm_80 / sm_89 build, a window, pages that are not 2^n keys) the config runs without."""
    from dataclasses import replace

    from nvfp4compat.kernels.triton import attention as att

    base = att.GLUON_REDUCE_MERGE_CONFIG  # (the configs derived from run V's default)
    for bad in ({"l2_bulk": 1}, {"l2_bulk": -3}, {"l2_bulk": 3, "page_tile": False}, {"l2_bulk": 3, "tile_pairs": True},
                {"l2_bulk": 3, "ring": 3, "ptx_ring": True}, {"l2_bulk": 3, "l2_ahead": 3},
                {"l2_bulk": 2, "gluon": False, "l2_fetch": 0}):
        with pytest.raises(ValueError, match=r"l2_bulk is 0 or a tile distance of 2 or more, for the Gluon kernel's "
                                              r"page-tiled loop .*; use l2_bulk=0 or such a config"):
            replace(base, **bad)
    cfg = replace(base, l2_bulk=3)
    assert att.GLUON_DECODE_CONFIGS.count(cfg) == 1 and base.l2_bulk == 0
    assert att._gluon_l2_bulk(cfg, 0, True, 90) == 3 and att._gluon_l2_bulk(cfg, 0, True, 120) == 3
    assert att._gluon_l2_bulk(cfg, 0, True, 89) == 0 and att._gluon_l2_bulk(cfg, 0, True, 80) == 0
    assert att._gluon_l2_bulk(cfg, 0, False, 90) == 0  # no PAGE_TILE
    assert att._gluon_l2_bulk(base, 0, True, 90) == 0
    assert att._cc(torch.device("cpu")) == 0
    gluon = {v.label: v for v in att.aot_variants()["attention_decode_gluon"]}
    v = gluon[f"bf16-d128-sweep{att.GLUON_DECODE_CONFIGS.index(cfg)}"]
    assert v.constexprs_for(90)["L2_BULK"] == 3 and v.constexprs_for(100)["L2_BULK"] == 3
    assert v.constexprs_for(89)["L2_BULK"] == 0 and v.constexprs_for(80)["L2_BULK"] == 0
    assert all(gluon[k].constexprs_for(90)["L2_BULK"] == 0 for k in ("bf16-d128", "bf16-d128-page-any"))


def test_early_check_configs_are_checked_and_reach_page_tiled_launches_only(tmp_path):
    """DecodeConfig.early_check (the unmasked range's page check after its first tile's loads) takes the Gluon kernel's
    page-tiled one-tile loop: the plain kernel, no page_tile, a ring, tile pairs, l2_ahead or l2_bulk are refused with
    what was found and the way out. The launch and the AOT build pass ``EARLY`` only where the launch runs that loop
    and the cache has a page (an empty cache has none to clamp the unchecked ids into). Compiled for sm_90 it spills
    nothing, stays under the default's register cap, and loads what the default loads: the first tile's K / V words
    (``LDG.E.LTC128B``) come before the check's cross-warp reduction (its ``STS``), where the default has them after."""
    import re
    from dataclasses import replace

    from nvfp4compat.kernels import aot
    from nvfp4compat.kernels.triton import attention as att

    base = att.GLUON_REDUCE_MERGE_CONFIG  # (the configs derived from run V's default)
    for bad in ({"page_tile": False}, {"ring": 3}, {"tile_pairs": True}, {"l2_ahead": 3}, {"l2_bulk": 2},
                {"gluon": False, "l2_fetch": 0}):
        with pytest.raises(ValueError, match=r"early_check is for the Gluon kernel's page-tiled loop without a ring, "
                                              r"tile_pairs, l2_ahead or l2_bulk; use early_check=False or such a config"):
            replace(base, early_check=True, **bad)
    cfg = replace(base, early_check=True)
    assert att.GLUON_DECODE_CONFIGS.count(cfg) == 1 and not base.early_check
    assert att._gluon_early(cfg, 0, True, 10) and not att._gluon_early(cfg, 0, True, 0)
    assert not att._gluon_early(cfg, 0, False, 10) and not att._gluon_early(cfg, 3, True, 10)
    assert not att._gluon_early(base, 0, True, 10)
    gluon = {v.label: v for v in att.aot_variants()["attention_decode_gluon"]}
    i = att.GLUON_DECODE_CONFIGS.index(cfg)
    assert gluon[f"bf16-d128-sweep{i}"].constexprs["EARLY"] is True
    assert all(gluon[k].constexprs["EARLY"] is False for k in ("bf16-d128", "bf16-d128-page-any"))
    d = att.GLUON_DECODE_CONFIGS.index(base)
    rep = aot.compile_all([90], kernels=["attention_decode_gluon"],
                          only=[f"attention_decode_gluon/bf16-d128-sweep{k}$" for k in (i, d)],
                          resources=True, sass_dir=str(tmp_path))
    assert rep.ok and len(rep.results) == 2, str(rep)
    res = {r.variant: r.resources for r in rep.results}
    early, default = res[f"bf16-d128-sweep{i}"], res[f"bf16-d128-sweep{d}"]
    assert early["local_bytes"] == 0 and early["registers"] <= (base.maxnreg or 255), early
    assert early["global_loads"] == default["global_loads"], (early, default)

    def check_side(k: int) -> tuple[bool, bool]:
        """Whether the page check's cross-warp reduction (a plain ``STS``) lies within 2 KB of code before / after the
        first K / V word load (``LDG.E.LTC128B``) in variant ``k``'s SASS."""
        text = (tmp_path / f"attention_decode_gluon-bf16-d128-sweep{k}-sm90.sass").read_text()
        ops = [(int(m.group(1), 16), m.group(2))
               for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?(\S+)", text)]
        word = next(o for o, op in ops if op.startswith("LDG.E.LTC128B"))
        sts = [o for o, op in ops if op == "STS"]
        return any(word - 0x800 < o < word for o in sts), any(word < o < word + 0x800 for o in sts)

    assert check_side(i) == (False, True)
    assert check_side(d) == (True, False)


def test_smem_merge_config_is_checked_and_merges_the_warps_in_one_pass(tmp_path):
    """DecodeConfig.smem_merge (the warps' softmax states merged through shared memory in one pass) is the Gluon
    kernel's: a plain-kernel config with it is refused with what was found and the way out. The default of up to 8
    rows takes it (run AC); the sweep keeps run V's default without it (GLUON_REDUCE_MERGE_CONFIG) and the configs
    derived from that one. The AOT variants pass ``SMEM_MERGE``; compiled for sm_90 (<= 8 rows and 16 rows) it spills
    nothing, keeps the register cap and the global loads, and the epilogue after the last MMA has at most a third of
    the cross-warp reductions' barriers and fewer shared-memory accesses (each thread stores its warp's state once and
    loads its own outputs' values)."""
    import re
    from dataclasses import replace

    from nvfp4compat.kernels import aot
    from nvfp4compat.kernels.triton import attention as att

    base = att._DECODE_CONFIGS_GLUON[128]
    with pytest.raises(ValueError, match=r"smem_merge=True, gluon=False\): smem_merge is the Gluon kernel's epilogue; "
                                          r"use smem_merge=False or a gluon=True config"):
        att.DecodeConfig(block_n=64, num_warps=4, num_stages=1, smem_merge=True)
    plain = att.GLUON_REDUCE_MERGE_CONFIG
    assert base.smem_merge and plain == replace(base, smem_merge=False)
    assert att.GLUON_DECODE_CONFIGS.count(plain) == 1 and att.GLUON_DECODE_CONFIGS.count(base) == 1
    assert not att._DECODE_CONFIGS_GLUON_ROWS16[128].smem_merge  # 16 rows: not yet timed with it
    assert not any(c.smem_merge for c in att.GLUON_DECODE_CONFIGS if c.l2_scales or c.l2_bulk or c.early_check)
    gluon = {v.label: v for v in att.aot_variants()["attention_decode_gluon"]}
    i, d = att.GLUON_DECODE_CONFIGS.index(base), att.GLUON_DECODE_CONFIGS.index(plain)
    assert gluon[f"bf16-d128-sweep{i}"].constexprs["SMEM_MERGE"] is True
    assert gluon["bf16-d128"].constexprs["SMEM_MERGE"] is True
    assert gluon["bf16-d128-smem-merge-g16"].constexprs["SMEM_MERGE"] is True
    assert all(gluon[k].constexprs["SMEM_MERGE"] is False for k in (f"bf16-d128-sweep{d}", "bf16-d128-g16"))
    labels = [f"bf16-d128-sweep{i}", f"bf16-d128-sweep{d}", "bf16-d128-smem-merge-g16", "bf16-d128-g16"]
    rep = aot.compile_all([90], kernels=["attention_decode_gluon"],
                          only=[f"attention_decode_gluon/{k}$" for k in labels], resources=True,
                          sass_dir=str(tmp_path))
    assert rep.ok and len(rep.results) == 4, str(rep)
    res = {r.variant: r.resources for r in rep.results}

    def epilogue(label: str) -> tuple[int, int]:
        """(barriers, shared-memory loads and stores) after the last MMA of ``label``'s SASS."""
        text = (tmp_path / f"attention_decode_gluon-{label}-sm90.sass").read_text()
        ops = [m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?(\S+)", text)]
        last = max(k for k, op in enumerate(ops) if op.startswith("HMMA"))
        tail = ops[last + 1:]
        return (sum(op.startswith("BAR") for op in tail),
                sum(op.startswith(("LDS", "STS")) for op in tail))

    for merged, reduced, cap in ((labels[0], labels[1], base.maxnreg),
                                 (labels[2], labels[3], att._DECODE_CONFIGS_GLUON_ROWS16[128].maxnreg)):
        assert res[merged]["local_bytes"] == 0 and res[merged]["registers"] <= (cap or 255), res[merged]
        assert res[merged]["global_loads"] == res[reduced]["global_loads"], (res[merged], res[reduced])
        (bm, sm), (bp, sp) = epilogue(merged), epilogue(reduced)
        assert 3 * bm <= bp and sm < sp, (merged, (bm, sm), (bp, sp))


@pytest.mark.parametrize("exc", [RuntimeError("Triton Error [CUDA]: out of memory"),
                                 torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 18.00 MiB")])
def test_gluon_out_of_memory_is_raised_not_a_fallback(monkeypatch, exc):
    """Running out of GPU memory while the Gluon kernel loads is raised as torch's OutOfMemoryError, naming the way
    out; the Gluon kernel stays on for the next decode (it is no build failure)."""
    from nvfp4compat.kernels.triton import attention as att

    monkeypatch.setattr(att, "_gluon_failed", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(torch.OutOfMemoryError, match="gpu-memory-utilization") as info:
            att._gluon_build_failed(exc)
    assert info.value.__cause__ is exc and "out of memory" in str(info.value)
    assert not att._gluon_failed


def test_decode_kernels_share_their_arguments():
    """_run_decode passes one argument list to both decode kernels: beside their own constexprs
    (_PLAIN_DECODE_ONLY, _GLUON_DECODE_ONLY) they take the same parameters in the same order."""
    import inspect

    from nvfp4compat.kernels.triton import attention as att

    if att._gluon is None:
        pytest.skip("this triton has no Gluon")
    plain = list(inspect.signature(att._decode_kernel.fn).parameters)
    gluon = list(inspect.signature(att._gluon.gluon_decode_kernel.fn).parameters)
    assert set(att._PLAIN_DECODE_ONLY) <= set(plain) and set(att._GLUON_DECODE_ONLY) <= set(gluon)
    assert [p for p in plain if p not in att._PLAIN_DECODE_ONLY] == [p for p in gluon if p not in att._GLUON_DECODE_ONLY]


def test_byte_extent():
    from nvfp4compat.kernels.triton import attention as att

    assert att._byte_extent(torch.empty(10, 4, 3)[:, 1]) == (9 * 12 + 2 + 1) * 4
    assert att._byte_extent(torch.empty(0)) == 0
    assert att._byte_extent(torch.empty(5, 7, dtype=torch.uint8).t()) == 35


def test_aot_set_builds_the_launch_configs():
    from nvfp4compat.kernels.triton import attention as att

    shipped = {(v.constexprs["HEAD_DIM"], v.constexprs["BLOCK_M"], v.constexprs["BLOCK_N"], v.num_warps, v.num_stages,
                v.constexprs["SCALE_WORDS"], v.maxnreg, v.constexprs["ROTATE"])
               for v in att.aot_variants()["attention_decode"]}
    for block_m in (16, 64):
        for rotate in (False, True):
            cfg = att.decode_config(128, block_m, 512, 132, rotate)
            assert (128, block_m, cfg.block_n, cfg.num_warps, cfg.num_stages, cfg.scale_words, cfg.maxnreg,
                    rotate) in shipped, (block_m, rotate)


def _cache(layout="NHD", head_dim=64):
    return ra.make_paged_cache([20], 2, head_dim, 16, layout=layout, device=DEVICE,
                               generator=torch.Generator().manual_seed(0))


BAD_DECODE_ARGS = [
    (lambda a: a.update(query=a["query"].float()), TypeError, "float16 or torch.bfloat16"),
    (lambda a: a.update(query=a["query"][..., :32]), ValueError, "head_dim=64"),
    (lambda a: a.update(query=a["query"][:, :3]), ValueError, "multiple of num_kv_heads"),
    (lambda a: a.update(block_table=a["block_table"].long()), TypeError, "block_table must be an int32"),
    (lambda a: a.update(seq_lens=a["seq_lens"][:0]), ValueError, "seq_lens must be a contiguous"),
    (lambda a: a.update(k_scale=-1.0), ValueError, "finite and > 0"),
    (lambda a: a.update(sliding_window=0), ValueError, "sliding_window"),
    (lambda a: a.update(logits_soft_cap=-2.0), ValueError, "logits_soft_cap"),
    (lambda a: a.update(sinks=torch.zeros(3, device=DEVICE)), ValueError, "sinks must be a float32"),
    (lambda a: a.update(out=torch.empty(1, 4, 64, device=DEVICE)), ValueError, "out must be"),
    (lambda a: a.update(q_len_per_req=2), ValueError, "batch \\* q_len_per_req"),
    (lambda a: a.update(kv_layout="NDH"), ValueError, "kv_layout"),
    (lambda a: a.update(q_len_per_req=True), ValueError, "q_len_per_req must be an int"),
    (lambda a: a.update(sm_scale=True), TypeError, "sm_scale must be a finite"),
]


@pytest.mark.parametrize("mutate,exc,match", BAD_DECODE_ARGS)
def test_decode_rejects_bad_arguments(mutate, exc, match):
    case = _cache()
    args = dict(
        query=torch.randn(1, 4, 64, device=DEVICE).to(bf16), paged_kv_cache=case.paged_kv_cache,
        kv_cache_sf=case.kv_cache_sf, block_table=case.block_table, seq_lens=case.seq_lens,
        k_scale=case.k_scale, v_scale=case.v_scale, sm_scale=0.125, kv_layout=case.kv_layout,
    )
    mutate(args)
    with pytest.raises(exc, match=match):
        kernel("decode", "triton")(**args)


@pytest.mark.parametrize("mutate,exc,match", BAD_DECODE_ARGS)
def test_decode_rejects_bad_arguments_after_validated_calls(mutate, exc, match):
    """decode() caches what validation established per argument signature; a bad argument must still
    raise after valid calls of the same shapes have been cached."""
    case = _cache()

    def args():
        return dict(
            query=torch.randn(1, 4, 64, device=DEVICE).to(bf16), paged_kv_cache=case.paged_kv_cache,
            kv_cache_sf=case.kv_cache_sf, block_table=case.block_table, seq_lens=case.seq_lens,
            k_scale=case.k_scale, v_scale=case.v_scale, sm_scale=0.125, kv_layout=case.kv_layout,
        )

    for _ in range(2):
        kernel("decode", "triton")(**args())
    bad = args()
    mutate(bad)
    with pytest.raises(exc, match=match):
        kernel("decode", "triton")(**bad)


@pytest.mark.parametrize("features", [{}, {"return_lse": True, "use_sinks": True, "sliding_window": 40}])
def test_decode_signature_cache_serves_new_data(monkeypatch, features):
    """A second call with the same metadata skips validation (the cached launch) and still computes
    from its own tensors: other cache contents, queries and scales give their own reference output."""
    from nvfp4compat.kernels.triton import attention as att

    shape = dict(seq_lens=[70, 33], num_qo_heads=8, num_kv_heads=2, **features)
    first = run_case("triton", "decode", seed=11, **shape)
    assert ra.relative_l2(first.out, first.ref) <= 1e-2
    calls = []
    real = att.normalize_cache
    monkeypatch.setattr(att, "normalize_cache", lambda *a, **k: calls.append(1) or real(*a, **k))
    second = run_case("triton", "decode", seed=12, **shape)
    assert calls == [], "the second call re-validated: the signature cache missed"
    assert not torch.equal(first.out, second.out)
    assert ra.relative_l2(second.out, second.ref) <= 1e-2
    if features.get("return_lse"):
        assert float((second.lse - second.ref_lse).abs().max()) <= 1e-2


def test_every_split_and_merge_constant_keys_the_launch_cache(monkeypatch):
    """The decode host path's cache key (``_knobs``) changes with every work-split and merge constant, so a benchmark's
    ``--knob`` (or a user) that changes one between calls gets a launch built for it, not the cached one. (Stop 49:
    ``SPLIT_SPREAD_PROGRAMS_PER_SM`` was missing, and its knob rows timed the default's launch.)"""
    from nvfp4compat.kernels.triton import attention as att

    names = [k for k, v in vars(att).items() if re.fullmatch(r"(SPLIT|MERGE|BATCH_BLOCK)_[A-Z_]+", k)
             and type(v) in (int, float, bool)
             and k not in ("MERGE_COUNTERS_MIN", "MERGE_COUNTER_SPARES")]  # (buffers' sizes, read as they are made)
    assert "SPLIT_SPREAD_PROGRAMS_PER_SM" in names and "MERGE_PDL" in names
    for name in names:
        before = att._knobs()
        value = getattr(att, name)
        monkeypatch.setattr(att, name, (not value) if type(value) is bool else value + 1)
        assert att._knobs() != before, name
        monkeypatch.setattr(att, name, value)


def test_prefill_rejects_bad_query_start_loc():
    case = _cache()
    q = torch.randn(5, 4, 64, device=DEVICE).to(bf16)
    with pytest.raises(ValueError, match="query_start_loc must be an int32 tensor"):
        kernel("prefill", "triton")(q, case.paged_kv_cache, case.kv_cache_sf, case.block_table,
                                    case.seq_lens, torch.tensor([0, 5], device=DEVICE), case.k_scale,
                                    case.v_scale, sm_scale=0.125)


def test_decode_padding_entries_with_zero_length():
    """vLLM pads CUDA-graph batches with seq_len 0 requests: their rows come out 0, never NaN."""
    r = run_case("triton", "decode", seq_lens=[0, 50, 0], return_lse=True, use_sinks=True)
    assert torch.isfinite(r.out).all()
    assert (r.out[[0, 2]] == 0).all()
    assert ra.relative_l2(r.out[1], r.ref[1]) <= 1e-2
    assert float((r.lse[1] - r.ref_lse[1]).abs().max()) <= 1e-2
    # with sinks the softmax has one term, so the padded rows' LSE is the sink itself
    assert torch.isfinite(r.lse).all()


def test_unaligned_cache_views():
    """Cache views at odd byte offsets take the byte-load paths (no 32-bit scale words)."""
    from nvfp4compat.kernels.triton import attention as att

    base = run_case("triton", "decode", seq_lens=[70, 9], return_lse=True, seed=3)
    c = base.case

    def shifted(t: torch.Tensor, offset: int) -> torch.Tensor:
        raw = torch.zeros(t.numel() + offset, dtype=torch.uint8, device=t.device)
        view = raw[offset:].view(t.shape)
        view.copy_(t.view(torch.uint8))
        return view.view(t.dtype)

    data = tuple(shifted(t, 8) for t in c.paged_kv_cache)
    sf = tuple(shifted(t, 1) for t in c.kv_cache_sf)
    launch = att._cache_launch(normalize_cache(data, sf, "NHD"))
    assert (launch.data_align, launch.sf_align) == (8, 1)
    out = kernel("decode", "triton")(base.query, data, sf, c.block_table, c.seq_lens, c.k_scale, c.v_scale,
                                      sm_scale=64**-0.5)
    assert ra.relative_l2(out, base.ref) <= 1e-2


def test_kernel_resources_counts_resident_programs_per_sm():
    """Registers, spills and shared memory of a compiled kernel, and the programs per SM they allow
    (the figures the benchmarks print beside each config; H200 numbers from BENCHMARKS.md run G)."""
    from types import SimpleNamespace

    def compiled(regs, shared, warps=4, spills=0):
        return SimpleNamespace(n_regs=regs, n_spills=spills, metadata=SimpleNamespace(shared=shared, num_warps=warps))

    h200 = 232448  # opt-in shared memory per block on SM90
    shipped = _att.kernel_resources(compiled(154, 59392), h200)
    assert shipped == {"registers": 154, "spills": 0, "shared_bytes": 59392, "num_warps": 4, "programs_per_sm": 3}
    assert _att.kernel_resources(compiled(185, 15616), h200)["programs_per_sm"] == 2  # by registers
    assert _att.kernel_resources(compiled(168, 15616, spills=16), h200)["programs_per_sm"] == 3
    assert _att.kernel_resources(compiled(128, 15616, spills=32), h200)["programs_per_sm"] == 4
    assert _att.kernel_resources(compiled(110, 150000), h200)["programs_per_sm"] == 1  # by shared memory
    assert _att.kernel_resources(compiled(154, 59392), None)["programs_per_sm"] == 3  # registers only
    assert _att.kernel_resources(None) is None and _att.kernel_resources(SimpleNamespace(n_regs=1)) is None
