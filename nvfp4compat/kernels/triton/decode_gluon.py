"""Split-KV NVFP4 decode in Gluon (SM80+ CUDA): the E2M1 nibbles are decoded straight into the
registers of the tensor-core operands, with no shared-memory round trip and no barrier in the key loop.

Same contract, same work split and same partial-result protocol as the plain-Triton decode kernel
(:func:`nvfp4compat.kernels.triton.attention._decode_kernel`, whose arguments this kernel takes): the
plain-Triton kernel's merge kernel merges what this one writes, and the plain-Triton kernel stays the
path of the CPU interpreter and of the cases this one does not take (:func:`gluon_decode_eligible`).

How it differs:

* **Warps own keys.** Each of the ``NW`` warps of a program runs its own online softmax over its own
  ``KW`` keys of every tile (the tile is ``NW * KW`` keys) with its own accumulator; the warps' states
  are merged once, after the loop. Nothing in the loop crosses a warp: the logits ``S = Q K^T`` and
  ``O += P V`` are ``mma.sync`` m16n8k16 per warp (3-D ``mma_v2`` with the warps on the batch axis), and
  ``P`` goes from the logits' accumulator registers to the A operand without moving.
* **Loads in the operand layout.** A dot product does not care in which order it visits the head
  dimension, so the kernel picks the order in which the cache's bytes already lie. In the logits'
  B operand (``K^T``, k = head dim, n = keys) a thread holds four consecutive k values of one key per
  k16 slab: the kernel assigns them so that each thread's values of a key are 16 consecutive cache
  bytes (one 128-bit load, one 16-bit load of its two block scales), and loads the query in the same
  permuted order once. In ``P V``'s B operand (``V``, k = keys, n = head dim) a thread holds one
  column of two neighbouring keys: the output columns are permuted so that each thread's columns are
  eight consecutive bytes of a key (one 64-bit load, one scale byte), and the output is stored
  un-permuted. The key order is natural in both.
* **Decode.** Four cache bytes become four packed bf16 pairs with the bit-placement decode of
  :mod:`~nvfp4compat.kernels.triton.attention_nvfp4` (``e2m1 * sf * 2^-8``, exact; the ``2^8`` is
  folded into the global scales as there) in inline PTX; for V the bytes of two keys are interleaved
  first (two ``prmt``), so every output register is one operand register. fp16 queries take FlashInfer's
  ``prmt`` table instead; ``CVT8`` (SM89+, opt-in) places E2M1 into E4M3 bits and converts pairs with
  ``cvt.rn.f16x2.e4m3x2``, with fp16 MMAs (a bf16 query scaled into fp16's range by a power of two).
* **At most 8 rows** (``ROWS8``): the output is accumulated transposed, ``O^T = V^T P^T``, with ``P^T``
  taken from the logits' accumulator registers: half the registers and ``P V`` MMAs of 16 rows.
* **Prefetch.** The unmasked tiles are software-pipelined in registers: tile ``i + 1``'s cache words
  and tile ``i + 2``'s page ids are loaded before tile ``i`` is decoded.

Metadata is handled as in the plain-Triton kernel: lengths and ``query_start_loc`` are clamped the
same way, the unmasked tiles run only after one scan found every page id of the range inside the
cache, and on a masked tile a key whose page id is outside the cache is masked (nothing is read there).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.language.extra.cuda import gdc_launch_dependents

from nvfp4compat.kernels.triton import attention_nvfp4 as fp4

# cp.async of a tensor of pointers into shared memory: async_load from triton 3.7 on (async_copy_global_to_shared, its
# name in 3.6, is removed in 3.9)
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
# a TMA load into shared memory: tma.async_copy_global_to_shared in triton 3.6, tma.async_load from 3.7 on (3.9 removed
# the old name)
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
# a shared-memory buffer seen as another type / shape: _reinterpret in triton 3.6, reinterpret from 3.7 on
_HAS_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))
# a barrier of the program's threads (bar.sync): thread_barrier in triton 3.6, barrier from 3.7 on (3.9 removed the old
# name)
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


def _with_scale_register(text: str, cvt: str) -> str:
    """One of attention_nvfp4's four-byte decoders (scales ``$5``/``$6`` as packed pairs) with one scale
    register ``s`` instead, made from the fp32 ``$5`` by ``cvt`` (both pairs share a block scale here)."""
    body = text.replace(".reg .b32 ", ".reg .b32 s, ", 1) if "nz," not in text else text.replace(
        ".reg .b32 z, nz,", ".reg .b32 z, nz, s,", 1)
    head, rest = body.split(";\n", 1)
    for old in (", $5, nz;", ", $6, nz;"):
        rest = rest.replace(old, ", s, nz;")
    for old in (", $5;", ", $6;"):
        rest = rest.replace(old, ", s;")
    return f"{head};\n{cvt}\n{rest}"


# Four cache bytes ($4) with the scale sf * 2^118 as fp32 ($5) -> four bf16x2 registers:
# $0 / $1 = low nibbles of bytes (0, 1) / (2, 3), $2 / $3 = high nibbles of bytes (0, 1) / (2, 3),
# each value e2m1 * sf * 2^-8 (the bit placement of attention_nvfp4._ASM_BF16_BITWISE_TEXT).
_ASM_K_BF16 = _with_scale_register(fp4._ASM_BF16_BITWISE_TEXT, "cvt.rn.bf16x2.f32 s, $5, $5;")
# fp16: FlashInfer's prmt table (attention_nvfp4._ASM_F16_TEXT), the scale sf * 2^-8 as fp32 ($5); same order.
_ASM_K_F16 = _with_scale_register(fp4._ASM_F16_TEXT, "cvt.rn.f16x2.f32 s, $5, $5;")


def _bf16_lanes(r: str, lo: str, hi: str) -> str:
    """PTX: the two bytes in the high bytes of ``r``'s 16-bit lanes -> ``lo`` (their low nibbles) and ``hi``
    (their high nibbles) as bf16x2 times ``s`` (the bit placement; temporaries t0-t3)."""
    return (
        f"shl.b32 t0, {r}, 4;\nshr.b32 t1, {r}, 2;\nor.b32 t0, t0, t1;\nand.b32 t0, t0, 0x81C081C0;\n"
        f"fma.rn.bf16x2 {lo}, t0, s, nz;\n"
        f"shr.b32 t2, {r}, 6;\nand.b32 t2, t2, 0x01C001C0;\nand.b32 t3, {r}, nz;\nor.b32 t2, t2, t3;\n"
        f"fma.rn.bf16x2 {hi}, t2, s, nz;\n"
    )


# The V decoders' first step: the four bytes of key a ($8) and of key b ($9) interleaved, x0 = a0 b0 a1 b1,
# x1 = a2 b2 a3 b3 (each 16-bit lane then holds one head dim of both keys: a register of the P V operand)
_V_INTERLEAVE = "prmt.b32 x0, $8, $9, 0x5140;\nprmt.b32 x1, $8, $9, 0x7362;\n"
# Four cache bytes of key a ($8) and of key b ($9), scales sf_a, sf_b * 2^118 as fp32 ($10, $11) ->
# eight bf16x2 registers (value of key a low, key b high): $(2m) / $(2m+1) = low / high nibble of
# byte m. The bytes are interleaved (a0 b0 a1 b1 | a2 b2 a3 b3) and decoded as above.
_ASM_V_BF16 = (
    "\n{\n.reg .b32 z, nz, s, x0, x1, r0, r1, r2, r3, t0, t1, t2, t3;\ncvt.rn.bf16x2.f32 s, $11, $10;\n"
    "mov.b32 z, 0;\nmov.b32 nz, 0x80008000;\n" + _V_INTERLEAVE
    + "prmt.b32 r0, x0, z, 0x1404;\nprmt.b32 r1, x0, z, 0x3424;\nprmt.b32 r2, x1, z, 0x1404;\n"
    "prmt.b32 r3, x1, z, 0x3424;\n"
    + "".join(_bf16_lanes(f"r{m}", f"${2 * m}", f"${2 * m + 1}") for m in range(4))
    + "}\n"
)


def _f16_table(x: str, outs: tuple[str, str, str, str]) -> str:
    """PTX: FlashInfer's prmt-table decode of the four bytes of ``x`` times ``s`` (f16x2) into ``outs`` =
    (low nibbles of bytes 0, 1; high nibbles of bytes 0, 1; low of 2, 3; high of 2, 3)."""
    return (
        f"and.b32 m, {x}, 0x77777777;\nshr.b32 m16, m, 16;\nprmt.b32 ha, ka, kb, m;\nprmt.b32 hb, ka, kb, m16;\n"
        f"shl.b32 x4, {x}, 4;\nprmt.b32 sa, x4, {x}, 0xD9C8;\nprmt.b32 sb, x4, {x}, 0xFBEA;\n"
        "and.b32 sa, sa, 0x80808080;\nand.b32 sb, sb, 0x80808080;\nor.b32 ha, ha, sa;\nor.b32 hb, hb, sb;\n"
        "prmt.b32 l0, ha, z, 0x2404;\nprmt.b32 l1, hb, z, 0x2404;\nprmt.b32 h0, ha, z, 0x3414;\n"
        "prmt.b32 h1, hb, z, 0x3414;\n"
        f"mul.rn.f16x2 {outs[0]}, l0, s;\nmul.rn.f16x2 {outs[1]}, h0, s;\nmul.rn.f16x2 {outs[2]}, l1, s;\n"
        f"mul.rn.f16x2 {outs[3]}, h1, s;\n"
    )


# fp16 V: four bytes of key a ($8) and of key b ($9), scales sf_a, sf_b * 2^-8 as fp32 ($10, $11) -> eight f16x2
# registers in the order of _ASM_V_BF16: the bytes interleaved (a0 b0 a1 b1 | a2 b2 a3 b3), then the table decode.
_ASM_V_F16 = (
    "\n{\n.reg .b32 m, m16, ka, kb, ha, hb, x4, sa, sb, z, s, x0, x1, l0, l1, h0, h1;\n"
    "cvt.rn.f16x2.f32 s, $11, $10;\nmov.b32 ka, 0x3E3C3800;\nmov.b32 kb, 0x46444240;\nmov.b32 z, 0;\n"
    + _V_INTERLEAVE
    + _f16_table("x0", ("$0", "$1", "$2", "$3")) + _f16_table("x1", ("$4", "$5", "$6", "$7"))
    + "}\n"
)


def _e4m3_cvt(x: str, outs: tuple[str, str, str, str], imad_shr: bool = False) -> str:
    """PTX: the four bytes of ``x`` -> E4M3 bytes of their low and high nibbles (bit placement), converted to
    f16x2 pairs times ``s`` into ``outs`` = (low nibbles of bytes 0, 1; high of 0, 1; low of 2, 3; high of 2, 3).
    ``imad_shr``: the high nibbles' right shift by 2 as ``mul.hi.u32`` of the masked bytes by ``2^30 + 1`` (exact: the
    masked low bits are zero, so the ``+ 1`` adds nothing to the high word), which ptxas emits as an ``IMAD.HI`` on
    the FMA pipe; ``shr`` becomes an ``SHF`` on the ALU pipe, which the E2M1 decode keeps busy (a power-of-two
    multiplier ptxas turns back into the shift)."""
    shr = (f"and.b32 a, {x}, 0x70707070;\nmul.hi.u32 a, a, 0x40000001;\n" if imad_shr
           else f"shr.b32 a, {x}, 2;\nand.b32 a, a, 0x1C1C1C1C;\n")
    return (
        f"shl.b32 a, {x}, 2;\nand.b32 a, a, 0x1C1C1C1C;\nshl.b32 b, {x}, 4;\nand.b32 b, b, 0x80808080;\n"
        f"or.b32 lo, a, b;\n{shr}and.b32 b, {x}, 0x80808080;\n"
        "or.b32 hi, a, b;\nmov.b32 {l0, l1}, lo;\nmov.b32 {h0, h1}, hi;\n"
        "cvt.rn.f16x2.e4m3x2 t0, l0;\ncvt.rn.f16x2.e4m3x2 t1, h0;\ncvt.rn.f16x2.e4m3x2 t2, l1;\n"
        "cvt.rn.f16x2.e4m3x2 t3, h1;\n"
        f"mul.rn.f16x2 {outs[0]}, t0, s;\nmul.rn.f16x2 {outs[1]}, t1, s;\nmul.rn.f16x2 {outs[2]}, t2, s;\n"
        f"mul.rn.f16x2 {outs[3]}, t3, s;\n"
    )


def _k_cvt8(scale: str, imad_shr: bool = False) -> str:
    """The K decoder with the E4M3 conversion, its f16x2 scale register ``s`` set by the PTX ``scale``."""
    return (
        "\n{\n.reg .b32 a, b, lo, hi, s, t0, t1, t2, t3;\n.reg .b16 l0, l1, h0, h1;\n" + scale + "\n"
        + _e4m3_cvt("$4", ("$0", "$2", "$1", "$3"), imad_shr) + "}\n"
    )


def _v_cvt8(scale: str, imad_shr: bool = False) -> str:
    """The V decoder with the E4M3 conversion, its f16x2 scale register ``s`` set by the PTX ``scale``."""
    return (
        "\n{\n.reg .b32 a, b, lo, hi, s, x0, x1, t0, t1, t2, t3;\n.reg .b16 l0, l1, h0, h1;\n" + scale + "\n"
        + _V_INTERLEAVE + _e4m3_cvt("x0", ("$0", "$1", "$2", "$3"), imad_shr)
        + _e4m3_cvt("x1", ("$4", "$5", "$6", "$7"), imad_shr) + "}\n"
    )


# E2M1 -> E4M3 is a bit placement (``e4m3 = e2m1 * 2^-6``: sign to bit 7, the three magnitude bits to bits
# 4..2, E2M1's subnormal 0.5 landing on E4M3's subnormal 2^-7), and SM89+ converts an E4M3 pair to f16x2 in one
# instruction (``cvt.rn.f16x2.e4m3x2``). Four cache bytes ($4), the scale sf * 2^-2 as fp32 ($5) -> four f16x2
# registers in the order of _ASM_K_BF16 ($0, $1 low nibbles, $2, $3 high), each value e2m1 * sf * 2^-8 (exact in
# fp16). SM89+ only (CVT8).
_ASM_K_CVT8 = _k_cvt8("cvt.rn.f16x2.f32 s, $5, $5;")
# V with the E4M3 conversion: bytes of keys a ($8) and b ($9) interleaved, scales sf_a, sf_b * 2^-2 ($10, $11) ->
# eight f16x2 registers in the order of _ASM_V_BF16. SM89+ only (CVT8).
_ASM_V_CVT8 = _v_cvt8("cvt.rn.f16x2.f32 s, $11, $10;")

# LEAN: the decoders take the scale as an f16x2 register already ($5 for K, $10 for V: the E4M3 scale bytes converted
# by the same cvt.rn.f16x2.e4m3x2, exact), in place of an fp32 biased scale and cvt.rn.f16x2.f32 per register
_ASM_K_CVT8_S = _k_cvt8("mov.b32 s, $5;")
_ASM_V_CVT8_S = _v_cvt8("mov.b32 s, $10;")
# IMAD_SHR: the same decoders with the high nibbles' shift on the FMA pipe (_e4m3_cvt's imad_shr)
_ASM_K_CVT8_SHR = _k_cvt8("cvt.rn.f16x2.f32 s, $5, $5;", True)
_ASM_V_CVT8_SHR = _v_cvt8("cvt.rn.f16x2.f32 s, $11, $10;", True)
_ASM_K_CVT8_S_SHR = _k_cvt8("mov.b32 s, $5;", True)
_ASM_V_CVT8_S_SHR = _v_cvt8("mov.b32 s, $10;", True)
# a K scale pair (the low 16 bits of $2: scales 2t, 2t + 1) -> $0 = (sf_2t, sf_2t) and $1 = (sf_2t+1, sf_2t+1), f16x2
_ASM_KS_PAIR = (
    "\n{\n.reg .b16 l, h;\n.reg .b32 p;\nmov.b32 {l, h}, $2;\ncvt.rn.f16x2.e4m3x2 p, l;\n"
    "prmt.b32 $0, p, p, 0x1010;\nprmt.b32 $1, p, p, 0x3232;\n}\n"
)
# V scale bytes of keys a ($1) and b ($2) -> $0 = (sf_a, sf_b), f16x2
_ASM_VS_PAIR = (
    "\n{\n.reg .b16 l, h;\n.reg .b32 p;\nprmt.b32 p, $1, $2, 0x0040;\nmov.b32 {l, h}, p;\n"
    "cvt.rn.f16x2.e4m3x2 $0, l;\n}\n"
)

# one 8x8 block of 16-bit values in the accumulator fragment -> its transpose in the same fragment (sm_75+)
_MOVMATRIX_T = gl.constexpr("movmatrix.sync.aligned.m8n8.trans.b16 $0, $1;")
_LOG2E = gl.constexpr(1.4426950408889634)
# LAZY: the reference maximum moves when a row's logits pass it by more than this (log2 units): p <= 2^8
_LAZY_TAU = gl.constexpr(8.0)
_KS_PAIR = gl.constexpr(_ASM_KS_PAIR)
_VS_PAIR = gl.constexpr(_ASM_VS_PAIR)


# The decoders' texts as one constexpr: Triton hashes the values of the constexpr globals a kernel (or a constexpr
# function it calls) reads into the kernel's cache key, not those of plain strings, so a changed decoder text makes a
# new key and is compiled anew instead of reusing a cached binary built from the old text
_DECODER_PTX = gl.constexpr({
    "k_lean": _ASM_K_CVT8_S, "v_lean": _ASM_V_CVT8_S, "k_cvt8": _ASM_K_CVT8, "v_cvt8": _ASM_V_CVT8,
    "k_f16": _ASM_K_F16, "v_f16": _ASM_V_F16, "k_bf16": _ASM_K_BF16, "v_bf16": _ASM_V_BF16,
    "k_lean_shr": _ASM_K_CVT8_S_SHR, "v_lean_shr": _ASM_V_CVT8_S_SHR, "k_cvt8_shr": _ASM_K_CVT8_SHR,
    "v_cvt8_shr": _ASM_V_CVT8_SHR,
})


@gluon.constexpr_function
def _decoder_text(v, lean, cvt8, dt, imad_shr=False):
    """The inline PTX of the V (``v``) or K decoder a launch takes: the lean E4M3 one (scales as f16x2 registers), the
    E4M3 one (SM89+), FlashInfer's table for fp16 queries, the bit placement for bf16 ones; the E4M3 ones with the
    high nibbles' shift on the FMA pipe where ``imad_shr``."""
    kind = "lean" if lean else "cvt8" if cvt8 else "f16" if dt == gl.float16 else "bf16"
    if imad_shr and (lean or cvt8):
        kind += "_shr"
    return _DECODER_PTX.value[("v_" if v else "k_") + kind]


@gluon.constexpr_function
def _axis_layout(layout, rank, axis):
    """The 1-D layout of an index vector on ``axis`` of a rank-``rank`` tensor in ``layout``."""
    out = layout
    for d in reversed(range(rank)):
        if d != axis:
            out = gl.SliceLayout(d, out)
    return out


@gluon.jit
def _iota(N: gl.constexpr, L: gl.constexpr, RANK: gl.constexpr, AXIS: gl.constexpr):
    """``arange(N)`` on axis ``AXIS`` of a rank-``RANK`` tensor in layout ``L`` (other axes of size 1)."""
    x = gl.arange(0, N, layout=_axis_layout(L, RANK, AXIS))
    for d in gl.static_range(RANK):
        if d != AXIS:
            x = gl.expand_dims(x, d)
    return x


@gluon.jit
def _halves(x, DT: gl.constexpr):
    """int32 holding a pair of 16-bit floats ``DT`` -> ``[..., 2]`` ``DT`` (low half first)."""
    lo = (x & 0xFFFF).to(gl.int16).to(DT, bitcast=True)
    hi = (x >> 16).to(gl.int16).to(DT, bitcast=True)
    return gl.join(lo, hi)


@gluon.jit
def _rows8(x):
    """Rows 0..7 of ``x`` (``[NW, 16]`` or ``[NW, 16, N]``, the rows on axis 1)."""
    if len(x.shape) == 2:
        return gl.split(gl.permute(gl.reshape(x, [x.shape[0], 2, 8]), (0, 2, 1)))[0]
    else:
        return gl.split(gl.permute(gl.reshape(x, [x.shape[0], 2, 8, x.shape[2]]), (0, 2, 3, 1)))[0]


@gluon.jit
def _scale_biased(sf_byte, DT: gl.constexpr, CVT8: gl.constexpr = False):
    """E4M3 scale bytes (int32 0..255, non-negative) -> fp32 scale operand of the decoders, exactly: ``sf * 2^118``
    for bf16 (the bit placement), ``sf * 2^-8`` for fp16 (the table), ``sf * 2^-2`` for the E4M3 conversion
    (``CVT8``, whose E2M1 values come out times ``2^-6``). ``(b & 0x7F) << 20`` is ``sf * 2^-120``."""
    bits = (sf_byte & 0x7F) << 20
    if CVT8:
        return bits.to(gl.float32, bitcast=True) * 3.32306998946229e35  # 2^118
    elif DT == gl.float16:  # noqa: SIM300 (DT is a constexpr, not a constant)
        return bits.to(gl.float32, bitcast=True) * 5.192296858534828e33  # 2^112
    else:
        return bits.to(gl.float32, bitcast=True) * 1.329227995784916e36 * 3.32306998946229e35


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _query_span(q0, q1, num_tokens):
    start = gl.minimum(gl.maximum(q0, 0), num_tokens)
    return start, gl.minimum(gl.maximum(q1, start), num_tokens) - start


@gluon.jit
def _request_tiles(
    bs, ok, seq_lens_ptr, qsl_ptr, window, max_kv, num_tokens,
    BLOCK_N: gl.constexpr, QMAX: gl.constexpr, VARLEN: gl.constexpr, HAS_WINDOW: gl.constexpr,
    MARK_EMPTY: gl.constexpr = False,
):
    """attention._request_tiles (same clamps, same arithmetic; ``MARK_EMPTY``: a request the kernel serves that has
    no visible key counts -1, not 0)."""
    seq_len = gl.load(seq_lens_ptr + bs, mask=ok, other=0).to(gl.int64)
    seq_len = gl.minimum(gl.maximum(seq_len, 0), max_kv)
    if VARLEN:
        _, q_len = _query_span(
            gl.load(qsl_ptr + bs, mask=ok, other=0), gl.load(qsl_ptr + bs + 1, mask=ok, other=0), num_tokens
        )
        q_len = q_len.to(gl.int64)
        live = ok & (q_len > 0) & (q_len <= QMAX)
    else:
        q_len = QMAX
        live = ok
    if HAS_WINDOW:
        kv_lo = gl.maximum(seq_len - q_len - window + 1, 0)
    else:
        kv_lo = seq_len * 0
    tiles = (gl.maximum(seq_len - kv_lo, 0) + BLOCK_N - 1) // BLOCK_N
    if MARK_EMPTY:
        tiles = gl.where(tiles == 0, -1, tiles)
    return gl.where(live, tiles, 0).to(gl.int32)


@gluon.jit
def _cdiv_small(t, d):
    """``cdiv(t, d)`` (int32) for ``0 <= t < 2^26``, ``1 <= d < 2^26`` and a quotient below 2^21, without an integer
    division: an fp32 estimate of ``t / d`` is within 2 of the floor, two exact corrections make it the floor."""
    q = (t.to(gl.float32) * (1.0 / d.to(gl.float32))).to(gl.int32)
    for _ in gl.static_range(2):
        q = gl.where(q * d > t, q - 1, gl.where((q + 1) * d <= t, q + 1, q))
    return q + (q * d < t).to(gl.int32)  # floor -> ceiling


@gluon.jit
def _cdiv_wide(a, d):
    """``cdiv(a, d)`` (int64) for ``0 <= a < 2^53`` (the batch's tiles) and ``1 <= d < 2^31`` (int32) without a 64-bit
    integer division (a call of about a hundred instructions): the fp64 quotient is within 1 of the floor, one exact
    correction makes it the floor."""
    d64 = gl.to_tensor(d).to(gl.int64)
    q = (a.to(gl.float64) / d64.to(gl.float64)).to(gl.int64)
    q = gl.where(q * d64 > a, q - 1, gl.where((q + 1) * d64 <= a, q + 1, q))
    return q + (q * d64 < a).to(gl.int64)


@gluon.jit
def _part_of(tiles, total, n):
    """``floor(tiles * n / total)`` (int64) for ``0 <= tiles <= total`` and ``0 <= n < 2^21`` without a 64-bit
    division (a call of about a hundred instructions per request on sm_90): the quotient is at most ``n``, so an fp32
    estimate is within 2 of it, and two exact integer corrections make it the quotient."""
    prod = tiles.to(gl.int64) * n
    ratio = gl.to_tensor(n).to(gl.float32) / total.to(gl.float32)
    q = (tiles.to(gl.float32) * ratio).to(gl.int64)
    for _ in gl.static_range(2):
        rem = prod - q * total
        q = gl.where(rem < 0, q - 1, gl.where(rem >= total, q + 1, q))
    return q


@gluon.jit
def _chunk_cap(tiles, total, min_tiles, spread):
    """attention._chunk_cap (int32 ``tiles >= 0``): ``tiles // min_tiles`` or, in a batch of few tiles, its part of
    ``spread`` chunks of at least ``max(min_tiles // 4, 1)`` tiles (:func:`_part_of`; int32 divisions inline). The
    second term is worked out only where it can pass the first (``total < spread * min_tiles``, a branch the whole
    program takes alike), so a larger batch's scan pays one comparison for it."""
    cap = gl.maximum(tiles // min_tiles, 1).to(gl.int64)
    if total < spread * min_tiles:
        few = gl.minimum((tiles // gl.maximum(min_tiles // 4, 1)).to(gl.int64), _part_of(tiles, total, spread))
        cap = gl.maximum(cap, few)
    return cap


@gluon.jit
def _request_chunks(tiles, total, programs, min_tiles, spread, target, BALANCE: gl.constexpr = 0):
    """attention._request_chunks: the same integers without a 64-bit division. The share
    ``floor(tiles * programs / total)`` by :func:`_part_of` (the launcher keeps ``programs`` below
    ``attention._GLUON_MAX_PROGRAMS``, 2^21), capped by :func:`_chunk_cap`. ``BALANCE``: ``cdiv(tiles, target)``
    (:func:`_cdiv_small`: both below 2^26, the quotient at most ``programs``) where the target from
    :func:`_balance_target` is not 0."""
    share = _part_of(tiles, total, programs)
    if BALANCE:  # (target 0: more requests than programs, the floor rule)
        share = gl.where(target > 0, _cdiv_small(tiles, gl.maximum(target, 1)).to(gl.int64), share)
    n = gl.minimum(gl.maximum(share, 1), _chunk_cap(tiles, total, min_tiles, spread))
    return gl.where(tiles > 0, n, 0).to(gl.int32)


@gluon.jit
def _tiles_chunks(tiles, total, programs, min_tiles, spread, target, BALANCE: gl.constexpr, EMPTY_CHUNK: gl.constexpr):
    """attention._tiles_chunks: :func:`_request_chunks`, and with ``EMPTY_CHUNK`` (the fused merge: no merge kernel
    writes the rows of a request with no visible key; ``tiles`` from ``MARK_EMPTY``) one chunk for such a request,
    whose program writes its zero rows (the sinks alone in the LSE)."""
    if EMPTY_CHUNK:
        return gl.where(tiles < 0, 1, _request_chunks(gl.maximum(tiles, 0), total, programs, min_tiles, spread, target,
                                                      BALANCE))
    return _request_chunks(tiles, total, programs, min_tiles, spread, target, BALANCE)


@gluon.jit
def _chunks_within(t, cap, mid):
    """attention._chunks_within in int32 without a division per request (:func:`_cdiv_small`: the quotient is at most
    ``programs``, below 2^21; ``mid`` and ``t`` below 2^26)."""
    return gl.sum(gl.where(t > 0, gl.minimum(_cdiv_small(t, mid), cap), 0), 0)


@gluon.jit
def _balance_target(
    t0, batch, total, programs, min_tiles, spread, seq_lens_ptr, qsl_ptr, window, max_kv, num_tokens,
    BLOCK_N: gl.constexpr, QMAX: gl.constexpr, VARLEN: gl.constexpr, HAS_WINDOW: gl.constexpr,
    BATCH_BLOCK: gl.constexpr, NW: gl.constexpr, BALANCE: gl.constexpr,
):
    """attention._balance_target (the same bracket, steps and integers; int32 where they fit: a request's tiles and
    the chunk length stay below 2^26; the two 64-bit quotients by :func:`_cdiv_wide`), in :func:`_find_chunk`'s
    layout. ``t0``: the first ``BATCH_BLOCK`` requests' tiles, which :func:`_find_chunk` loaded once."""
    LB: gl.constexpr = gl.BlockedLayout([_scan_per_thread(BATCH_BLOCK)], [32], [NW], [0])
    zero = gl.program_id(0) * 0
    cap0 = _chunk_cap(t0, total, min_tiles, spread).to(gl.int32)
    hi = zero + gl.max(t0, 0)
    least = zero + gl.min(gl.where(t0 > 0, t0, 2**30), 0)
    live = zero + gl.sum((t0 > 0).to(gl.int32), 0)
    for b0 in range(BATCH_BLOCK, batch, BATCH_BLOCK):
        bs = b0 + gl.arange(0, BATCH_BLOCK, layout=LB)
        t = _request_tiles(bs, bs < batch, seq_lens_ptr, qsl_ptr, window, max_kv, num_tokens,
                           BLOCK_N, QMAX, VARLEN, HAS_WINDOW)
        hi = gl.maximum(hi, gl.max(t, 0))
        least = gl.minimum(least, gl.min(gl.where(t > 0, t, 2**30), 0))
        live += gl.sum((t > 0).to(gl.int32), 0)
    hi = gl.maximum(hi, 1)
    if live > programs:
        hi = zero
    elif least >= hi:  # equal requests (or none): the floor rule's chunks
        n = gl.minimum(gl.maximum(programs // gl.maximum(live, 1), 1), _chunk_cap(hi, total, min_tiles, spread).to(gl.int32))
        hi = (hi + n - 1) // n
    else:
        rest = gl.maximum(programs - live, 1)
        lo = gl.maximum(_cdiv_wide(total, programs), 1).to(gl.int32)  # (only the search needs it)
        hi = gl.minimum(hi, _cdiv_wide(total, rest).to(gl.int32))
        for _ in gl.static_range(BALANCE):
            mid = (lo + hi) // 2
            used = _chunks_within(t0, cap0, mid)
            for b0 in range(BATCH_BLOCK, batch, BATCH_BLOCK):
                bs = b0 + gl.arange(0, BATCH_BLOCK, layout=LB)
                t = _request_tiles(bs, bs < batch, seq_lens_ptr, qsl_ptr, window, max_kv, num_tokens,
                                   BLOCK_N, QMAX, VARLEN, HAS_WINDOW)
                used += _chunks_within(t, _chunk_cap(t, total, min_tiles, spread).to(gl.int32), mid)
            fits = used <= programs
            hi = gl.where(fits, mid, hi)
            lo = gl.where(fits, lo, mid + 1)
    return hi


@gluon.constexpr_function
def _scan_per_thread(batch_block):
    """Requests per thread in :func:`_find_chunk`'s blocks: the whole block in each warp up to 128 (4 per thread),
    else 1 (the block spread over the warps, a few registers)."""
    return gl.constexpr(batch_block // 32 if batch_block <= 128 else 1)


@gluon.jit
def _chunk_edge(j, n_tiles, n_chunks):
    """``floor(j * n_tiles / n_chunks)`` (int32) for ``0 <= j <= n_chunks``: the first tile of chunk ``j``, in 32-bit
    divisions (inline; a 64-bit one is a call). ``n_tiles = a * n_chunks + b`` gives ``j * a + (j * b) // n_chunks``,
    exact, with ``j * b < n_chunks^2 <= 2^30`` (the launcher keeps ``programs``, which bounds ``n_chunks``, below
    ``attention._GLUON_MAX_PROGRAMS``) and ``n_tiles < 2^31`` (keys < 2^31)."""
    nt = n_tiles.to(gl.int32)
    a = nt // n_chunks
    return j * a + (j * (nt - a * n_chunks)) // n_chunks


@gluon.jit
def _scan_block(c, bs, ch, base, base_m, b, j, n_chunks, slot0):
    """One block of :func:`_find_chunk`'s scan: requests ``bs`` with ``ch`` chunks, numbered from ``base`` (partial
    slots from ``base_m``, multi-chunk requests only); chunk ``c``'s request, index, chunk count and first slot
    gathered where ``c`` falls in the block."""
    lo = base + gl.associative_scan(ch, 0, _add) - ch
    multi = gl.where(ch > 1, ch, 0)
    lo_m = base_m + gl.associative_scan(multi, 0, _add) - multi
    hit = (c >= lo) & (c < lo + ch)
    b = gl.maximum(b, gl.max(gl.where(hit, bs, -1), 0))
    j += gl.sum(gl.where(hit, c - lo, 0), 0)
    n_chunks += gl.sum(gl.where(hit, ch, 0), 0)
    slot0 += gl.sum(gl.where(hit, lo_m, 0), 0)
    return base + gl.sum(ch, 0), base_m + gl.sum(multi, 0), b, j, n_chunks, slot0


@gluon.jit
def _find_chunk(
    c, batch, programs, min_tiles, spread, seq_lens_ptr, qsl_ptr, window, max_kv, num_tokens,
    BLOCK_N: gl.constexpr, QMAX: gl.constexpr, VARLEN: gl.constexpr, HAS_WINDOW: gl.constexpr,
    BATCH_BLOCK: gl.constexpr, NW: gl.constexpr, BALANCE: gl.constexpr = 0, EMPTY_CHUNK: gl.constexpr = False,
):
    """Chunk ``c``'s request ``b`` (-1: none), its index ``j`` there, the request's chunk count and
    first partial slot: the plain-Triton kernel's scan over the batch, step for step (``EMPTY_CHUNK``: the fused
    merge's, where a request with no visible key has a chunk of its own, :func:`_tiles_chunks`).

    Up to 128 requests a block, every warp holds the whole block (``BATCH_BLOCK // 32`` per thread, the warps
    replicated), so the block's sums, maximum and prefix scans stay inside a warp: no shared memory and no barrier
    (sm_90: 3 barriers before the key loop against 29 with the block spread over the warps). Larger blocks (1024)
    keep one request per thread and cross the warps. The first block's lengths are loaded once and serve the total,
    the balanced target and the scan: a batch of at most ``BATCH_BLOCK`` requests reads them once."""
    LB: gl.constexpr = gl.BlockedLayout([_scan_per_thread(BATCH_BLOCK)], [32], [NW], [0])
    zero = gl.program_id(0) * 0  # a run-time int32 (batch may be specialized to the constant 1)
    bs0 = gl.arange(0, BATCH_BLOCK, layout=LB)
    t0 = _request_tiles(bs0, bs0 < batch, seq_lens_ptr, qsl_ptr, window, max_kv, num_tokens,
                        BLOCK_N, QMAX, VARLEN, HAS_WINDOW, EMPTY_CHUNK)
    p0 = t0
    if EMPTY_CHUNK:  # (a -1 of MARK_EMPTY counts 0)
        p0 = gl.maximum(t0, 0)
    total = zero.to(gl.int64) + gl.sum(p0.to(gl.int64), 0)
    for b0 in range(BATCH_BLOCK, batch, BATCH_BLOCK):
        bs = b0 + gl.arange(0, BATCH_BLOCK, layout=LB)
        t = _request_tiles(bs, bs < batch, seq_lens_ptr, qsl_ptr, window, max_kv, num_tokens,
                           BLOCK_N, QMAX, VARLEN, HAS_WINDOW)
        total += gl.sum(t.to(gl.int64), 0)
    total = gl.maximum(total, 1)
    target = zero
    if BALANCE:
        target = _balance_target(p0, batch, total, programs, min_tiles, spread, seq_lens_ptr, qsl_ptr, window, max_kv,
                                 num_tokens, BLOCK_N, QMAX, VARLEN, HAS_WINDOW, BATCH_BLOCK, NW, BALANCE)
    base, base_m, b, j, n_chunks, slot0 = _scan_block(
        c, bs0, _tiles_chunks(t0, total, programs, min_tiles, spread, target, BALANCE, EMPTY_CHUNK), zero, zero, zero - 1,
        zero, zero, zero,
    )
    for b0 in range(BATCH_BLOCK, batch, BATCH_BLOCK):
        bs = b0 + gl.arange(0, BATCH_BLOCK, layout=LB)
        tiles = _request_tiles(bs, bs < batch, seq_lens_ptr, qsl_ptr, window, max_kv, num_tokens,
                               BLOCK_N, QMAX, VARLEN, HAS_WINDOW, EMPTY_CHUNK)
        base, base_m, b, j, n_chunks, slot0 = _scan_block(
            c, bs, _tiles_chunks(tiles, total, programs, min_tiles, spread, target, BALANCE, EMPTY_CHUNK), base, base_m,
            b, j, n_chunks, slot0,
        )
    return b, j, n_chunks, slot0


@gluon.jit
def _bad_pages(bt_row, p_lo, p_hi, num_pages, NW: gl.constexpr):
    """1 if any ``bt_row[p_lo:p_hi]`` is outside ``[0, num_pages)``, else 0."""
    LB: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
    bad = gl.zeros([32 * NW], gl.int32, layout=LB)
    for p0 in range(p_lo, p_hi, 32 * NW):
        offs = p0 + gl.arange(0, 32 * NW, layout=LB)
        page = gl.load(bt_row + offs, mask=offs < p_hi, other=0)
        bad |= ((page < 0) | (page >= num_pages)).to(gl.int32)
    return gl.max(bad, 0)


@gluon.jit
def _slot_of(key, page_size, page_shift, PAGE_POW2: gl.constexpr):
    """Keys -> (block-table index, slot in the page), int32."""
    if PAGE_POW2:
        return key >> page_shift, key & (page_size - 1)
    else:
        return key // page_size, key % page_size


@gluon.jit
def _tile_keys(n0, LK: gl.constexpr, LV: gl.constexpr, NW: gl.constexpr, KW: gl.constexpr):
    """Key positions of a tile at ``n0`` (warp ``w``: ``n0 + w * KW + [0, KW)``) as the K words hold
    them (``[NW, KW, 1, 1]``) and the even keys of the V word pairs (``[NW, KW/2, 1, 1]``)."""
    key_k = n0 + _iota(NW, LK, 4, 0) * KW + _iota(KW, LK, 4, 1)
    key_a = n0 + _iota(NW, LV, 4, 0) * KW + 2 * _iota(KW // 2, LV, 4, 1)
    return key_k, key_a


@gluon.jit
def _tile_pages(
    n0, lim, bt_row, page_size, page_shift,
    LK: gl.constexpr, LV: gl.constexpr, NW: gl.constexpr, KW: gl.constexpr, PAGE_POW2: gl.constexpr,
    PAGE_EVEN: gl.constexpr,
):
    """Page ids (int32) of a tile's keys in the K and V word layouts; -1 (nothing read) for keys
    ``>= lim``. ``PAGE_EVEN`` (even page sizes): the odd keys of the V pairs share their even key's
    page, whose id stands for both."""
    key_k, key_a = _tile_keys(n0, LK, LV, NW, KW)
    pk = gl.load(bt_row + _slot_of(key_k, page_size, page_shift, PAGE_POW2)[0], mask=key_k < lim, other=-1)
    pa = gl.load(bt_row + _slot_of(key_a, page_size, page_shift, PAGE_POW2)[0], mask=key_a < lim, other=-1)
    if PAGE_EVEN:  # keys 2 kp and 2 kp + 1 share a page
        pb = pa
    else:
        pb = gl.load(bt_row + _slot_of(key_a + 1, page_size, page_shift, PAGE_POW2)[0], mask=key_a + 1 < lim,
                     other=-1)
    return pk, pa, pb


@gluon.jit
def _tile_words(
    n0, lim, pk, pa, pb, page_size, page_shift, num_pages,
    k_base, v_base, ks_base, vs_base,
    stride_kp, stride_kt, stride_vp, stride_vt, stride_ksp, stride_kst, stride_vsp, stride_vst,
    LK: gl.constexpr, LV: gl.constexpr, NW: gl.constexpr, KW: gl.constexpr, PAGE_POW2: gl.constexpr,
    PAGE_EVEN: gl.constexpr, OFF32: gl.constexpr, CHECKED: gl.constexpr = False,
):
    """The raw words of one tile at page ids ``pk, pa, pb`` (:func:`_tile_pages`): K words
    ``[NW, KW, 4, 4]`` int32 (thread ``(key, t)``: bytes ``[16 t, 16 t + 16)`` of its key's row) with
    the K scale pairs ``[NW, KW, 4, 1]`` int16 (scales ``2t, 2t + 1``); V words of the even / odd keys
    ``[NW, KW/2, 8, 2]`` int32 (thread ``(c, kp)``: bytes ``[8 c, 8 c + 8)`` of keys ``2 kp, 2 kp + 1``)
    with their scale bytes ``[NW, KW/2, 8, 1]``. Keys ``>= lim`` or on a page outside
    ``[0, num_pages)`` read nothing (zeros). ``OFF32``: every byte offset into the cache tensors fits
    in int32 (the host checked their extents), so the row offsets are 32-bit products. ``CHECKED``: every page id
    of the tile's range is inside the cache (one scan checked them), so only ``key < lim`` masks (a key past it has
    page id -1 and is not read)."""
    IT: gl.constexpr = gl.int32 if OFF32 else gl.int64
    key_k, key_a = _tile_keys(n0, LK, LV, NW, KW)
    t_k = _iota(4, LK, 4, 2)
    w_k = _iota(4, LK, 4, 3)
    c_v = _iota(8, LV, 4, 2)
    wv = _iota(2, LV, 4, 3)
    if CHECKED:
        ok_k = key_k < lim
        ok_a = key_a < lim
        pk_ = pk.to(IT)
        pa_ = pa.to(IT)
    else:
        ok_k = (key_k < lim) & (pk >= 0) & (pk < num_pages)
        ok_a = (key_a < lim) & (pa >= 0) & (pa < num_pages)
        pk_ = gl.where(ok_k, pk, 0).to(IT)
        pa_ = gl.where(ok_a, pa, 0).to(IT)
    sk = _slot_of(key_k, page_size, page_shift, PAGE_POW2)[1].to(IT)
    sa = _slot_of(key_a, page_size, page_shift, PAGE_POW2)[1].to(IT)
    row_k = pk_ * stride_kp + sk * stride_kt
    srow_k = pk_ * stride_ksp + sk * stride_kst
    row_a = pa_ * stride_vp + sa * stride_vt
    srow_a = pa_ * stride_vsp + sa * stride_vst
    if PAGE_EVEN:
        ok_b = (key_a + 1 < lim) & ok_a
        row_b = row_a + stride_vt
        srow_b = srow_a + stride_vst
    else:
        if CHECKED:
            ok_b = key_a + 1 < lim
            pb_ = pb.to(IT)
        else:
            ok_b = (key_a + 1 < lim) & (pb >= 0) & (pb < num_pages)
            pb_ = gl.where(ok_b, pb, 0).to(IT)
        sb = _slot_of(key_a + 1, page_size, page_shift, PAGE_POW2)[1].to(IT)
        row_b = pb_ * stride_vp + sb * stride_vt
        srow_b = pb_ * stride_vsp + sb * stride_vst
    k_ptr = (k_base + row_k).to(gl.pointer_type(gl.int32)) + t_k * 4 + w_k
    ks_ptr = (ks_base + srow_k).to(gl.pointer_type(gl.int16)) + t_k
    va_ptr = (v_base + row_a + c_v * 8).to(gl.pointer_type(gl.int32)) + wv
    vb_ptr = (v_base + row_b + c_v * 8).to(gl.pointer_type(gl.int32)) + wv
    vsa_ptr = vs_base + srow_a + c_v
    vsb_ptr = vs_base + srow_b + c_v
    kw = gl.load(k_ptr, mask=ok_k & (w_k >= 0) & (t_k >= 0), other=0)
    ks = gl.load(ks_ptr, mask=ok_k & (t_k >= 0), other=0)
    va = gl.load(va_ptr, mask=ok_a & (wv >= 0) & (c_v >= 0), other=0)
    vb = gl.load(vb_ptr, mask=ok_b & (wv >= 0) & (c_v >= 0), other=0)
    vsa = gl.load(vsa_ptr, mask=ok_a & (c_v >= 0), other=0)
    vsb = gl.load(vsb_ptr, mask=ok_b & (c_v >= 0), other=0)
    return kw, ks, va, vb, vsa, vsb


@gluon.jit
def _warp_page(n0, last, bt_row, page_shift, L: gl.constexpr, RANK: gl.constexpr, NW: gl.constexpr, KW: gl.constexpr):
    """``PAGE_TILE``: the page id of each warp's ``KW`` keys of the tile at ``n0`` (one page holds them), its
    block-table index clamped to ``last``, the range's last checked page (so a tile past the range reads a checked
    page; its words go unused). One per warp: ``[NW, 1, ...]`` (rank ``RANK``) in layout ``L``."""
    return gl.load(bt_row + gl.minimum((n0 + _iota(NW, L, RANK, 0) * KW) >> page_shift, last))


@gluon.jit
def _warp_pages(n0, last, bt_row, page_shift, LK: gl.constexpr, LV: gl.constexpr, NW: gl.constexpr, KW: gl.constexpr):
    """:func:`_warp_page` in the K and the V word layouts (``[NW, 1, 1, 1]`` in ``LK`` and in ``LV``)."""
    return (_warp_page(n0, last, bt_row, page_shift, LK, 4, NW, KW),
            _warp_page(n0, last, bt_row, page_shift, LV, 4, NW, KW))


@gluon.constexpr_function
def _lanes(layout, axis):
    """The threads of a warp along ``axis`` of a blocked ``layout``."""
    return gl.constexpr(layout.threads_per_warp[axis])


@gluon.jit
def _thread_offsets(
    TOK_K: gl.constexpr, TOK_V: gl.constexpr, TOK_KS: gl.constexpr, TOK_VS: gl.constexpr,
    LK: gl.constexpr, LV: gl.constexpr, KW: gl.constexpr,
):
    """``PAGE_TILE``: each thread's byte offsets (loop-invariant, int64) from its warp's first key in a page to its K row
    (``[1, KW, 1, 1]`` in ``LK``), K scale row, V rows of keys ``2 kp`` and ``2 kp + 1`` at column ``8 c`` and V scale
    bytes (``[1, KW/2, 8, 1]`` in ``LV``), in the word layouts of :func:`_tile_words`. The token strides ``TOK_*``
    are constexprs, and the offsets 64-bit, so that LLVM can split off the constant parts: rows of one thread that
    differ by a constant share one address (``LDG [R.64 + imm]``). A key index is written as its lane part plus its
    register part (``k = k % T + T * (k // T)``, ``T`` the layout's threads along the keys): each is extended to 64 bits
    on its own, so the register part is a constant of each element. (One 64-bit extension of the whole index hid that
    the rows of a thread's keys ``k`` and ``k + T`` differ by a constant: sm_90, triton 3.6.0, the default's unmasked
    loop computed an address per key and per pair, 430 instructions per 16 keys and warp and 122 registers against 408
    and 116.)"""
    TK: gl.constexpr = _lanes(LK, 1)
    TV: gl.constexpr = _lanes(LV, 1)
    kk = _iota(KW, LK, 4, 1)
    k_lo = (kk % TK).to(gl.int64)
    k_hi = (kk // TK).to(gl.int64)
    kp = _iota(KW // 2, LV, 4, 1)
    p_lo = (kp % TV).to(gl.int64)
    p_hi = (kp // TV).to(gl.int64)
    c_v = _iota(8, LV, 4, 2).to(gl.int64)
    off_va = p_lo * (2 * TOK_V) + p_hi * (2 * TV * TOK_V) + c_v * 8
    off_vsa = p_lo * (2 * TOK_VS) + p_hi * (2 * TV * TOK_VS) + c_v
    off_k = k_lo * TOK_K + k_hi * (TK * TOK_K)
    off_ks = k_lo * TOK_KS + k_hi * (TK * TOK_KS)
    return off_k, off_ks, off_va, off_va + TOK_V, off_vsa, off_vsa + TOK_VS


@gluon.jit
def _wide(x):
    """Unsigned ``x`` (loaded uint8 / uint16) zero-extended to int32 where it is loaded, and kept 32-bit (an opaque
    ``mov``, which ptxas drops): a value carried across loop steps in a narrow type costs a mask at each use."""
    return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x.to(gl.int32)], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _page_row(n0, p, page_size, s_p, TOK: gl.constexpr, L: gl.constexpr, NW: gl.constexpr, KW: gl.constexpr,
              IT: gl.constexpr):
    """``PAGE_TILE``: the byte offset of each warp's first key of the tile at ``n0`` in one cache tensor (page stride
    ``s_p``, token stride ``TOK``; ``IT``, one per warp, in layout ``L``), at the warp's page id ``p``
    (:func:`_warp_pages`)."""
    slot = ((n0 + _iota(NW, L, 4, 0) * KW) & (page_size - 1)).to(IT)
    row = p.to(IT) * s_p + slot * TOK
    if IT == gl.int32:  # noqa: SIM300 (IT is a constexpr) OFF32: in [0, 2^31), zero-extended (a sign extension costs a shift)
        row = row.to(gl.uint32).to(gl.int64)
    return row


@gluon.jit
def _k_word_ptrs(n0, pk, page_size, k_base, s_kp, off_k, TOK_K: gl.constexpr, LK: gl.constexpr, NW: gl.constexpr,
                 KW: gl.constexpr, IT: gl.constexpr):
    """``PAGE_TILE``: the tile at ``n0``'s K words (``[NW, KW, 4, 4]`` int32): one row offset per warp
    (:func:`_page_row`) plus the threads' offsets of :func:`_thread_offsets`."""
    row_k = _page_row(n0, pk, page_size, s_kp, TOK_K, LK, NW, KW, IT)
    return ((k_base + row_k) + off_k).to(gl.pointer_type(gl.int32)) + _iota(4, LK, 4, 2) * 4 + _iota(4, LK, 4, 3)


@gluon.jit
def _k_scale_ptrs(n0, pk, page_size, ks_base, s_ksp, off_ks, TOK_KS: gl.constexpr, LK: gl.constexpr,
                  NW: gl.constexpr, KW: gl.constexpr, IT: gl.constexpr):
    """``PAGE_TILE``: the tile at ``n0``'s K scale pairs (uint16), in the layout of :func:`_k_word_ptrs`."""
    row_ks = _page_row(n0, pk, page_size, s_ksp, TOK_KS, LK, NW, KW, IT)
    return ((ks_base + row_ks) + off_ks).to(gl.pointer_type(gl.uint16)) + _iota(4, LK, 4, 2)


@gluon.jit
def _v_word_ptrs(n0, pv, page_size, v_base, s_vp, off_va, off_vb, TOK_V: gl.constexpr, LV: gl.constexpr,
                 NW: gl.constexpr, KW: gl.constexpr, IT: gl.constexpr):
    """``PAGE_TILE``: the tile at ``n0``'s V words of the even and odd keys (``[NW, KW / 2, 8, 2]`` int32 each)."""
    row_v = _page_row(n0, pv, page_size, s_vp, TOK_V, LV, NW, KW, IT)
    wv = _iota(2, LV, 4, 3)
    return (((v_base + row_v) + off_va).to(gl.pointer_type(gl.int32)) + wv,
            ((v_base + row_v) + off_vb).to(gl.pointer_type(gl.int32)) + wv)


@gluon.jit
def _v_scale_ptrs(n0, pv, page_size, vs_base, s_vsp, off_vsa, off_vsb, TOK_VS: gl.constexpr, LV: gl.constexpr,
                  NW: gl.constexpr, KW: gl.constexpr, IT: gl.constexpr):
    """``PAGE_TILE``: the tile at ``n0``'s V scale bytes of the even and odd keys, in the layout of
    :func:`_v_word_ptrs`."""
    row_vs = _page_row(n0, pv, page_size, s_vsp, TOK_VS, LV, NW, KW, IT)
    return (vs_base + row_vs) + off_vsa, (vs_base + row_vs) + off_vsb


@gluon.constexpr_function
def _ld_words_text(n, fetch):
    """``L2_FETCH``: inline PTX that loads ``n`` consecutive 32-bit words (``n`` = 4 or 2: one 128- or 64-bit load)
    from the first of ``n`` pointers, with the L2 prefetch-size hint ``.L2::<fetch>B`` (PTX ISA: ``ld`` with
    ``.level::prefetch_size``, sm_75+): on a miss L2 fills the whole aligned ``fetch``-byte block around the words, not
    only their sectors."""
    outs = ", ".join(f"${i}" for i in range(n))
    return f"ld.global.L2::{fetch}B.v{n}.b32 {{{outs}}}, [${n}];"


@gluon.constexpr_function
def _ld_words_constraints(n):
    """``L2_FETCH``: the constraints of :func:`_ld_words_text`'s asm with ``pack = n``: ``n`` 32-bit outputs, ``n``
    64-bit pointer inputs (only the first is read)."""
    return ",".join(["=r"] * n + ["l"] * n)


@gluon.jit
def _load_words(ptr, N: gl.constexpr, FETCH: gl.constexpr):
    """``gl.load(ptr)`` of int32 words that each thread holds ``N`` at a time in consecutive addresses (``N`` = 4: the
    K words, 2: the V words), with ``FETCH`` (``L2_FETCH``) 0: Triton's load; 64, 128 or 256: one inline-PTX load of
    the ``N`` words with that L2 prefetch size (:func:`_ld_words_text`)."""
    if FETCH == 0:
        return gl.load(ptr)
    else:
        return gl.inline_asm_elementwise(_ld_words_text(N, FETCH), _ld_words_constraints(N),
                                         [ptr.to(gl.int64, bitcast=True)], dtype=gl.int32, is_pure=True, pack=N)


@gluon.constexpr_function
def _ld_scale_text(bits, fetch):
    """``L2_SCALES``: inline PTX that loads one ``bits``-bit block-scale value (16: a K scale pair, 8: a V scale byte),
    zero-extended into a 32-bit register (PTX lets ``ld`` fill a register wider than its type), with the L2 prefetch
    size ``.L2::<fetch>B``."""
    return f"ld.global.L2::{fetch}B.u{bits} $0, [$1];"


@gluon.jit
def _load_scales(ptr, FETCH: gl.constexpr):
    """The block scales at ``ptr`` (uint16 K scale pairs or uint8 V scale bytes) as int32: with ``FETCH`` 0 Triton's
    load then :func:`_wide`; else one inline-PTX load each with that L2 prefetch size (:func:`_ld_scale_text`)."""
    if FETCH == 0:
        return _wide(gl.load(ptr))
    else:
        return gl.inline_asm_elementwise(_ld_scale_text(ptr.dtype.element_ty.primitive_bitwidth, FETCH), "=r,l",
                                         [ptr.to(gl.int64, bitcast=True)], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _k_words_paged(
    n0, pk, page_size, k_base, ks_base, s_kp, s_ksp, off_k, off_ks, TOK_K: gl.constexpr, TOK_KS: gl.constexpr,
    LK: gl.constexpr, NW: gl.constexpr, KW: gl.constexpr, IT: gl.constexpr, FETCH: gl.constexpr = 0,
    SF_FETCH: gl.constexpr = 0,
):
    """The K half of :func:`_tile_words` for a tile whose warps' keys each lie in one page (``PAGE_TILE``), at the page
    ids of :func:`_warp_pages`: no mask (every page id is a checked one; the slots stay inside the page). The scale
    pairs come back as int32. ``FETCH`` / ``SF_FETCH``: the words' / the scales' L2 prefetch size (:func:`_load_words`,
    :func:`_load_scales`)."""
    kw = _load_words(_k_word_ptrs(n0, pk, page_size, k_base, s_kp, off_k, TOK_K, LK, NW, KW, IT), 4, FETCH)
    return kw, _load_scales(_k_scale_ptrs(n0, pk, page_size, ks_base, s_ksp, off_ks, TOK_KS, LK, NW, KW, IT), SF_FETCH)


@gluon.jit
def _v_words_paged(
    n0, pv, page_size, v_base, vs_base, s_vp, s_vsp, off_va, off_vb, off_vsa, off_vsb,
    TOK_V: gl.constexpr, TOK_VS: gl.constexpr, LV: gl.constexpr, NW: gl.constexpr, KW: gl.constexpr, IT: gl.constexpr,
    FETCH: gl.constexpr = 0, SF_FETCH: gl.constexpr = 0,
):
    """The V half of :func:`_k_words_paged`: the V words of the even and odd keys and their scale bytes (int32)."""
    va_ptr, vb_ptr = _v_word_ptrs(n0, pv, page_size, v_base, s_vp, off_va, off_vb, TOK_V, LV, NW, KW, IT)
    vsa_ptr, vsb_ptr = _v_scale_ptrs(n0, pv, page_size, vs_base, s_vsp, off_vsa, off_vsb, TOK_VS, LV, NW, KW, IT)
    return (_load_words(va_ptr, 2, FETCH), _load_words(vb_ptr, 2, FETCH), _load_scales(vsa_ptr, SF_FETCH),
            _load_scales(vsb_ptr, SF_FETCH))


@gluon.constexpr_function
def _lanes_layout(nw):
    """``L2_AHEAD``: ``[NW, 32]``, one element per lane of each warp (:func:`_l2_prefetch`'s layout)."""
    return gl.BlockedLayout([1, 1], [1, 32], [nw, 1], [1, 0])


@gluon.jit
def _prefetch_pages(n0, last, bt_row, page_shift, NW: gl.constexpr, KW: gl.constexpr):
    """``L2_AHEAD``: :func:`_warp_page` in :func:`_l2_prefetch`'s layout (``[NW, 1]``)."""
    return _warp_page(n0, last, bt_row, page_shift, _lanes_layout(NW), 2, NW, KW)


@gluon.jit
def _l2_prefetch(
    n0, p, page_size, k_base, v_base, ks_base, vs_base, s_kp, s_vp, s_ksp, s_vsp,
    TOK_K: gl.constexpr, TOK_V: gl.constexpr, TOK_KS: gl.constexpr, TOK_VS: gl.constexpr,
    NW: gl.constexpr, KW: gl.constexpr, IT: gl.constexpr,
):
    """``L2_AHEAD``: ask L2 for the tile at ``n0``'s bytes of this KV head (``prefetch.global.L2``: no register, no
    wait), at the warps' checked page ids ``p`` (:func:`_prefetch_pages`). Lane ``l < KW`` of a warp takes its key
    ``l``'s K row (64 bytes: its first and last byte, so both lines where a row straddles two) and K scale row, lane
    ``KW + l`` key ``l``'s V rows. Every address lies in a checked page."""
    gl.static_assert(KW == 16, "L2_AHEAD takes 16 keys per warp: one lane each for a key's K and its V rows")
    LP: gl.constexpr = _lanes_layout(NW)
    lane = _iota(32, LP, 2, 1)
    key = lane % KW
    is_v = lane >= KW
    slot = (((n0 + _iota(NW, LP, 2, 0) * KW) & (page_size - 1)) + key).to(IT)
    pp = p.to(IT)
    row_k = pp * s_kp + slot * TOK_K
    row_v = pp * s_vp + slot * TOK_V
    row_ks = pp * s_ksp + slot * TOK_KS
    row_vs = pp * s_vsp + slot * TOK_VS
    data = gl.where(is_v, (v_base + row_v).to(gl.int64, bitcast=True), (k_base + row_k).to(gl.int64, bitcast=True))
    sf = gl.where(is_v, (vs_base + row_vs).to(gl.int64, bitcast=True), (ks_base + row_ks).to(gl.int64, bitcast=True))
    gl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];\n\tprefetch.global.L2 [$1+63];\n\tprefetch.global.L2 [$2];\n\tmov.b32 $0, 0;",
        "=r,l,l", [data, sf], dtype=gl.int32, is_pure=False, pack=1,
    )


# ``L2_BULK``: one bulk prefetch into L2 (the TMA unit's ``cp.async.bulk.prefetch.L2``, SM90+: no register, no L1
# miss slot, never waited for) of ``$2`` bytes (a multiple of 16; 0: none) at the 16-byte aligned address ``$1``
_BULK_PREFETCH_TEXT = gl.constexpr(
    "{\n\t.reg .pred bp;\n\tsetp.ne.s32 bp, $2, 0;\n\t@bp cp.async.bulk.prefetch.L2.global [$1], $2;\n\t"
    "mov.b32 $0, 0;\n\t}"
)


@gluon.jit
def _bulk_span(base, s_p, hs, kvh, num_kv_heads, TOK: gl.constexpr, ROW: gl.constexpr, KW: gl.constexpr):
    """``L2_BULK``: the bytes of one cache tensor under a warp's ``KW`` keys of a page that :func:`_l2_bulk` asks
    for, as an offset from the tensor's row of KV head 0 and the warp's first key (int64) and a length (int32; 0: no
    prefetch). With the KV heads inside a token's row (NHD: head stride ``hs`` below the token stride ``TOK``), the
    span from KV head 0's row of the first key to the end of the last KV head's row of the last key: every KV head's
    rows of the keys, which the chunk's programs of all KV heads (adjacent program ids, running side by side) read.
    Otherwise (HND: a KV head's rows of a page are contiguous), this KV head's own rows. Every byte lies between two
    rows of the cache, inside its storage. The length is cut to a multiple of 16 bytes, and is 0 where the span's start
    cannot be 16-byte aligned (the tensor's base, page stride or head offset is not a multiple of 16: the bulk copy's
    rule; the warp's first key is a multiple of ``KW`` >= 16, so the key offset keeps the alignment)."""
    nhd = hs < TOK
    head_off = gl.where(nhd, 0, kvh.to(gl.int64) * hs)
    span = gl.where(nhd, (num_kv_heads - 1) * hs, 0) + ((KW - 1) * TOK + ROW)
    aligned = ((base.to(gl.int64, bitcast=True) + head_off) % 16 == 0) & (s_p % 16 == 0)
    return head_off, gl.where(aligned, span // 16 * 16, 0).to(gl.int32)


@gluon.jit
def _bulk_lanes(
    kvh, num_kv_heads, k_ptr, v_ptr, ks_ptr, vs_ptr, s_kp, s_vp, s_ksp, s_vsp, hs_k, hs_v, hs_ks, hs_vs,
    TOK_K: gl.constexpr, TOK_V: gl.constexpr, TOK_KS: gl.constexpr, TOK_VS: gl.constexpr, NW: gl.constexpr,
    KW: gl.constexpr,
):
    """``L2_BULK``: the loop-invariant part of :func:`_l2_bulk`'s prefetches, one per lane in :func:`_lanes_layout`:
    lane 0 the K words, 1 the V words, 2 the K scales, 3 the V scales (:func:`_bulk_span`); the other lanes none.
    Returns each lane's address at page 0 and key 0 (int64), page stride (int64), token stride and length (int32),
    and how many programs take turns (the KV heads where the K words' span holds them all, NHD; else 1)."""
    LP: gl.constexpr = _lanes_layout(NW)
    lane = _iota(32, LP, 2, 1) + _iota(NW, LP, 2, 0) * 0
    ok, nk = _bulk_span(k_ptr, s_kp, hs_k, kvh, num_kv_heads, TOK_K, 64, KW)
    ov, nv = _bulk_span(v_ptr, s_vp, hs_v, kvh, num_kv_heads, TOK_V, 64, KW)
    oks, nks = _bulk_span(ks_ptr, s_ksp, hs_ks, kvh, num_kv_heads, TOK_KS, 8, KW)
    ovs, nvs = _bulk_span(vs_ptr, s_vsp, hs_vs, kvh, num_kv_heads, TOK_VS, 8, KW)
    at = gl.where(lane == 0, k_ptr.to(gl.int64, bitcast=True) + ok,
                  gl.where(lane == 1, v_ptr.to(gl.int64, bitcast=True) + ov,
                           gl.where(lane == 2, ks_ptr.to(gl.int64, bitcast=True) + oks,
                                    vs_ptr.to(gl.int64, bitcast=True) + ovs)))
    sp = gl.where(lane == 0, s_kp.to(gl.int64),
                  gl.where(lane == 1, s_vp.to(gl.int64), gl.where(lane == 2, s_ksp.to(gl.int64), s_vsp.to(gl.int64))))
    tok = gl.where(lane == 0, TOK_K, gl.where(lane == 1, TOK_V, gl.where(lane == 2, TOK_KS, TOK_VS)))
    n = gl.where(lane == 0, nk, gl.where(lane == 1, nv, gl.where(lane == 2, nks, gl.where(lane == 3, nvs, 0))))
    turns = gl.where(hs_k < TOK_K, num_kv_heads, 1)
    return at, sp, tok, n, turns


@gluon.jit
def _l2_bulk(n0, p, page_size, at, sp, tok, n, NW: gl.constexpr, KW: gl.constexpr):
    """``L2_BULK``: the tile at ``n0``'s spans (:func:`_bulk_lanes`) asked of L2 by bulk prefetches
    (:data:`_BULK_PREFETCH_TEXT`), one per tensor and warp, at the warps' checked page ids ``p``
    (:func:`_prefetch_pages`). The operands differ between the warps, so ptxas issues the four lanes' prefetches
    one after another (``R2UR``, ``UBLKPF.L2``, ``BRA.U.ANY``)."""
    slot = (n0 + _iota(NW, _lanes_layout(NW), 2, 0) * KW) & (page_size - 1)
    addr = at + p.to(gl.int64) * sp + (slot * tok).to(gl.int64)
    gl.inline_asm_elementwise(_BULK_PREFETCH_TEXT, "=r,l,r", [addr, n], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _ring_copy(n0, pk, pv, page_size, k_base, v_base, s_kp, s_vp, off_k, off_va, off_vb, k_ring, va_ring, vb_ring,
               stage, TOK_K: gl.constexpr, TOK_V: gl.constexpr, LK: gl.constexpr, LV: gl.constexpr, NW: gl.constexpr,
               KW: gl.constexpr, IT: gl.constexpr):
    """``RING``: start the copies of the tile at ``n0``'s K and V words into ``stage`` of the shared-memory rings
    (``cp.async``, each thread the bytes it reads back) and commit them as one group. The block scales are not
    copied (2- and 1-byte loads: below ``cp.async``'s 4 bytes)."""
    kw_ptr = _k_word_ptrs(n0, pk, page_size, k_base, s_kp, off_k, TOK_K, LK, NW, KW, IT)
    va_ptr, vb_ptr = _v_word_ptrs(n0, pv, page_size, v_base, s_vp, off_va, off_vb, TOK_V, LV, NW, KW, IT)
    _async_load(k_ring.index(stage), kw_ptr)
    _async_load(va_ring.index(stage), va_ptr)
    _async_load(vb_ring.index(stage), vb_ptr)
    async_copy.commit_group()


@gluon.constexpr_function
def _pring_decl(nbytes):
    """``PRING``: inline PTX that declares the ring (``nbytes`` of shared memory, outside Triton's allocation and so
    outside its barrier insertion) in a block of the kernel's body and returns its 32-bit shared address."""
    return "{ .shared .align 16 .b8 nvfp4c_pring[" + str(nbytes) + "]; mov.u32 $0, nvfp4c_pring; }"


@gluon.jit
def _pring_base(NBYTES: gl.constexpr, NW: gl.constexpr):
    """``PRING``: the ring's shared address (int32 scalar). The declaring asm runs once per thread (one element per
    thread), so the kernel holds one array of ``NBYTES``."""
    L1: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
    a = gl.inline_asm_elementwise(_pring_decl(NBYTES), "=r,r", [gl.full([32 * NW], 0, gl.int32, L1)], dtype=gl.int32,
                                  is_pure=False, pack=1)
    return gl.max(a, 0)


@gluon.jit
def _pring_offsets(NW: gl.constexpr, KW: gl.constexpr, LK: gl.constexpr, LV: gl.constexpr):
    """``PRING``: each thread's byte offsets in one ring stage (int32): its K words (``[NW, KW, 4, 4]`` in ``LK``,
    row-major) first, then the V words of the even keys and of the odd keys (``[NW, KW / 2, 8, 2]`` in ``LV``). A
    thread copies and reads back only these bytes, 16 (K) and 8 (V) contiguous bytes at a time."""
    k_off = (((_iota(NW, LK, 4, 0) * KW + _iota(KW, LK, 4, 1)) * 4 + _iota(4, LK, 4, 2)) * 4 + _iota(4, LK, 4, 3)) * 4
    v_off = (((_iota(NW, LV, 4, 0) * (KW // 2) + _iota(KW // 2, LV, 4, 1)) * 8 + _iota(8, LV, 4, 2)) * 2
             + _iota(2, LV, 4, 3)) * 4
    KB: gl.constexpr = NW * KW * 64  # the K words of a stage, then as many bytes of V words (even and odd keys)
    return k_off, KB + v_off, KB + KB // 2 + v_off


@gluon.constexpr_function
def _pring_copy_text(nbytes, fetch):
    """``PRING``: the inline PTX of one ``cp.async`` of ``nbytes`` (16: ``.cg``, past L1; 8: ``.ca``) from the first
    pointer operand to the shared address operand, with the L2 prefetch size ``.L2::<fetch>B`` where ``fetch`` > 0
    (``L2_FETCH``), and the dummy outputs' zeros."""
    hint = f".L2::{fetch}B" if fetch else ""
    if nbytes == 16:
        return (f"cp.async.cg.shared.global{hint} [$4], [$8], 16;\n\tmov.b32 $0, 0;\n\tmov.b32 $1, 0;\n\t"
                "mov.b32 $2, 0;\n\tmov.b32 $3, 0;")
    return f"cp.async.ca.shared.global{hint} [$2], [$4], 8;\n\tmov.b32 $0, 0;\n\tmov.b32 $1, 0;"


@gluon.jit
def _pring_copy(n0, pk, pv, page_size, k_base, v_base, s_kp, s_vp, off_k, off_va, off_vb, ring, sk, sva, svb, stage,
                TOK_K: gl.constexpr, TOK_V: gl.constexpr, LK: gl.constexpr, LV: gl.constexpr, NW: gl.constexpr,
                KW: gl.constexpr, IT: gl.constexpr, FETCH: gl.constexpr = 0):
    """``PRING``: :func:`_ring_copy` into the ring at shared address ``ring`` (:func:`_pring_base`), ``stage``, at the
    thread offsets ``sk`` / ``sva`` / ``svb`` (:func:`_pring_offsets`), by inline-PTX ``cp.async`` (16 bytes of K, 8
    of V per copy; ``FETCH`` > 0: with that L2 prefetch size, :func:`_pring_copy_text`), and commit them as one group.
    Triton sees no shared-memory access here, so it puts no barrier around the ring: each thread reads back only what
    it copied, after its own ``cp.async.wait_group``."""
    kw_ptr = _k_word_ptrs(n0, pk, page_size, k_base, s_kp, off_k, TOK_K, LK, NW, KW, IT)
    va_ptr, vb_ptr = _v_word_ptrs(n0, pv, page_size, v_base, s_vp, off_va, off_vb, TOK_V, LV, NW, KW, IT)
    at = ring + stage * (NW * KW * 128)
    gl.inline_asm_elementwise(
        _pring_copy_text(16, FETCH), "=r,=r,=r,=r,r,r,r,r,l,l,l,l", [at + sk, kw_ptr.to(gl.int64, bitcast=True)],
        dtype=gl.int32, is_pure=False, pack=4,
    )
    _pring_copy8(at + sva, va_ptr, FETCH)
    _pring_copy8(at + svb, vb_ptr, FETCH)
    _pring_sync(_pring_group_text(-1), NW)


@gluon.jit
def _pring_copy8(saddr, ptr, FETCH: gl.constexpr = 0):
    """``PRING``: ``cp.async`` of each thread's pairs of int32 at ``ptr`` to the shared addresses ``saddr`` (8 bytes a
    copy: the first address of each pair; ``FETCH``: the L2 prefetch size)."""
    gl.inline_asm_elementwise(
        _pring_copy_text(8, FETCH), "=r,=r,r,r,l,l", [saddr, ptr.to(gl.int64, bitcast=True)], dtype=gl.int32,
        is_pure=False, pack=2,
    )


@gluon.constexpr_function
def _pring_group_text(n):
    """``PRING``: ``cp.async.commit_group`` (``n < 0``) or ``cp.async.wait_group n``, as one inline-asm statement."""
    return ("cp.async.commit_group;" if n < 0 else f"cp.async.wait_group {n};") + "\n\tmov.b32 $0, 0;"


@gluon.jit
def _pring_sync(TEXT: gl.constexpr, NW: gl.constexpr):
    """``PRING``: one ``cp.async`` group instruction (``TEXT``, :func:`_pring_group_text`) per thread, ordered with
    the ring's other inline PTX."""
    L1: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
    gl.inline_asm_elementwise(TEXT, "=r,r", [gl.full([32 * NW], 0, gl.int32, L1)], dtype=gl.int32, is_pure=False,
                              pack=1)


@gluon.jit
def _pring_read(ring, sk, sva, svb, stage, NW: gl.constexpr, KW: gl.constexpr):
    """``PRING``: ``stage``'s K words and the V words of the even and odd keys, read back by inline-PTX ``ld.shared``
    in :func:`_pring_offsets`' layouts (after ``cp.async.wait_group``)."""
    at = ring + stage * (NW * KW * 128)
    kw = gl.inline_asm_elementwise("ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r,r,r,r", [at + sk],
                                   dtype=gl.int32, is_pure=False, pack=4)
    va = gl.inline_asm_elementwise("ld.shared.v2.b32 {$0, $1}, [$2];", "=r,=r,r,r", [at + sva], dtype=gl.int32,
                                   is_pure=False, pack=2)
    vb = gl.inline_asm_elementwise("ld.shared.v2.b32 {$0, $1}, [$2];", "=r,=r,r,r", [at + svb], dtype=gl.int32,
                                   is_pure=False, pack=2)
    return kw, va, vb


@gluon.jit
def _smem_as(buf, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
    """``buf`` (shared memory) seen as ``dtype`` of ``shape`` in ``layout`` (same bytes)."""
    if _HAS_REINTERPRET:
        return buf.reinterpret(dtype, shape, layout)
    else:
        return buf._reinterpret(dtype, shape, layout)


@gluon.jit
def _loader_words(k_ring, v_ring, full, stage, phase, RING: gl.constexpr, LK: gl.constexpr, LV: gl.constexpr,
                  NW: gl.constexpr, KW: gl.constexpr):
    """``TMA``: wait until ``stage``'s boxes have landed (``full``), then read back its K words (``[NW, KW, 4, 4]`` in
    ``LK``) and the V words of the even and odd keys (``[NW, KW / 2, 8, 2]`` in ``LV``, :func:`_v_word_ptrs`' layout).
    A box holds one warp's ``KW`` keys of one page, 64 bytes each, in the cache's order: as int32 words that is
    ``[KW, 4, 4]`` for K, and ``[KW / 2, 2, 8, 2]`` (key pair, even / odd key, column, word) for V, read as one
    ``[KW / 2, 8, 2, 2]`` load and split in registers."""
    mbarrier.wait(full.index(stage), phase)
    PL4: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [3, 2, 1, 0])
    PL5: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [4, 3, 2, 1, 0])
    kw = _smem_as(k_ring, gl.int32, [RING, NW, KW, 4, 4], PL4).index(stage).load(LK)
    v6 = _smem_as(v_ring, gl.int32, [RING, NW, KW // 2, 2, 8, 2], PL5).index(stage)
    L5: gl.constexpr = gl.BlockedLayout([1, 1, 1, 2, 2], [1, 4, 8, 1, 1], [NW, 1, 1, 1, 1], [4, 3, 1, 2, 0])
    va, vb = gl.split(v6.permute([0, 1, 3, 4, 2]).load(L5))
    return kw, gl.convert_layout(va, LV), gl.convert_layout(vb, LV)


@gluon.jit
def _tma_loader(bt_row, kv_lo, b_begin, b_end, last, page_shift, page_size, kvh, k_desc, v_desc, k_ring, v_ring, full,
                empty, NW: gl.constexpr, KW: gl.constexpr, BLOCK_N: gl.constexpr, RING: gl.constexpr):
    """``TMA``, the loader warp: the unmasked tiles ``b_begin .. b_end``, each into stage ``j % RING`` (``j`` its index in
    the range) once the program's warps have released the stage (``empty``; a fresh barrier passes the first round),
    counted on ``full``: per warp's page of the tile one box of K words and one of V words (``[1, KW, 1, 64]`` at the
    page, the warp's first slot and this KV head). Every page id of the range was checked before (and the descriptors
    bound every box to the cache)."""
    for i in range(b_begin, b_end):
        j = i - b_begin
        st = j % RING
        mbarrier.wait(empty.index(st), ((j // RING) & 1) ^ 1)
        n0 = kv_lo + i * BLOCK_N
        bar = full.index(st)
        mbarrier.expect(bar, 2 * NW * KW * 64)
        for w in gl.static_range(NW):
            key = n0 + w * KW
            page = gl.load(bt_row + gl.minimum(key >> page_shift, last))
            slot = key & (page_size - 1)
            _tma_load(k_desc, [page, slot, kvh, 0], bar, k_ring.index(st * NW + w))
            _tma_load(v_desc, [page, slot, kvh, 0], bar, v_ring.index(st * NW + w))


@gluon.jit
def _tma_consumer(acc, m_i, l_i, q_op, qpos, kv_hi, window, qk_scale2, softcap_pre, softcap_post, bt_row, page_size,
                  page_shift, num_pages, ks_base, vs_base, s_ksp, s_vsp, off_ks, off_vsa, off_vsb, pk, pa, last, kv_lo,
                  b_begin, b_end, k_ring, v_ring, full, empty,
                  MMA: gl.constexpr, LK: gl.constexpr, LV: gl.constexpr, NW: gl.constexpr, KW: gl.constexpr,
                  BLOCK_N: gl.constexpr, RING: gl.constexpr, CAUSAL: gl.constexpr, WINDOW_ROWS: gl.constexpr,
                  HAS_SOFTCAP: gl.constexpr, PAGE_POW2: gl.constexpr, ROWS8: gl.constexpr, CVT8: gl.constexpr,
                  KT: gl.constexpr, LEAN: gl.constexpr, IMAD_SHR: gl.constexpr, LAZY: gl.constexpr,
                  TOK_KS: gl.constexpr, TOK_VS: gl.constexpr, IT: gl.constexpr):
    """``TMA``, the program's warps: the unmasked tiles' words from the ring (the stage released once read back to
    registers), their block scales loaded to registers one tile ahead (``pk``, ``pa``: the first tile's page ids)."""
    n0 = kv_lo + b_begin * BLOCK_N
    ks, vsa, vsb = _scales_paged(n0, pk, pa, page_size, ks_base, vs_base, s_ksp, s_vsp, off_ks, off_vsa, off_vsb,
                                 TOK_KS, TOK_VS, LK, LV, NW, KW, IT)
    pk, pa = _warp_pages(n0 + BLOCK_N, last, bt_row, page_shift, LK, LV, NW, KW)
    for i in range(b_begin, b_end):
        n0 = kv_lo + i * BLOCK_N
        j = i - b_begin
        ks_n, vsa_n, vsb_n = _scales_paged(n0 + BLOCK_N, pk, pa, page_size, ks_base, vs_base, s_ksp, s_vsp, off_ks,
                                           off_vsa, off_vsb, TOK_KS, TOK_VS, LK, LV, NW, KW, IT)
        pk, pa = _warp_pages(n0 + 2 * BLOCK_N, last, bt_row, page_shift, LK, LV, NW, KW)
        kw, va, vb = _loader_words(k_ring, v_ring, full, j % RING, (j // RING) & 1, RING, LK, LV, NW, KW)
        mbarrier.arrive(empty.index(j % RING), count=1)
        acc, m_i, l_i = _attend(
            acc, m_i, l_i, q_op, qpos, n0, kv_hi, window, qk_scale2, softcap_pre, softcap_post,
            bt_row, page_size, page_shift, num_pages, kw, ks, va, vb, vsa, vsb,
            MMA, LK, NW, KW, False, CAUSAL, WINDOW_ROWS, HAS_SOFTCAP, PAGE_POW2, ROWS8, CVT8, KT, LEAN,
            IMAD_SHR, LAZY,
        )
        ks, vsa, vsb = ks_n, vsa_n, vsb_n
    return acc, m_i, l_i


@gluon.jit
def _scales_paged(
    n0, pk, pv, page_size, ks_base, vs_base, s_ksp, s_vsp, off_ks, off_vsa, off_vsb,
    TOK_KS: gl.constexpr, TOK_VS: gl.constexpr, LK: gl.constexpr, LV: gl.constexpr, NW: gl.constexpr,
    KW: gl.constexpr, IT: gl.constexpr,
):
    """``RING``: the tile at ``n0``'s block scales (K pairs, V bytes of the even and odd keys; int32), loaded to
    registers (:func:`_k_words_paged`'s and :func:`_v_words_paged`'s scale loads alone)."""
    ks = _wide(gl.load(_k_scale_ptrs(n0, pk, page_size, ks_base, s_ksp, off_ks, TOK_KS, LK, NW, KW, IT)))
    vsa_ptr, vsb_ptr = _v_scale_ptrs(n0, pv, page_size, vs_base, s_vsp, off_vsa, off_vsb, TOK_VS, LV, NW, KW, IT)
    return ks, _wide(gl.load(vsa_ptr)), _wide(gl.load(vsb_ptr))


@gluon.jit
def _v_decoded(
    va, vb, vsa, vsb, DT: gl.constexpr, CVT8: gl.constexpr, LEAN: gl.constexpr = False, IMAD_SHR: gl.constexpr = False,
):
    """The V words of a tile (:func:`_tile_words`) decoded: ``[NW, KP, c, wv, h, m0, m1, pair]`` of ``DT``, the pair
    being keys ``2 kp`` and ``2 kp + 1`` (see :func:`_attend`). ``LEAN`` (with ``CVT8``): the scale bytes converted
    by ``cvt.rn.f16x2.e4m3x2`` (values ``e2m1 * sf * 2^-6``)."""
    if LEAN:
        sv = gl.inline_asm_elementwise(
            _VS_PAIR, "=r,r,r", [vsa.to(gl.int32), vsb.to(gl.int32)], dtype=gl.int32, is_pure=True, pack=1,
        )
        r = gl.inline_asm_elementwise(
            _decoder_text(True, True, CVT8, DT, IMAD_SHR), "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r", [va, vb, sv], dtype=(gl.int32,) * 8, is_pure=True, pack=1,
        )
    else:
        sf_a = _scale_biased(vsa.to(gl.int32), DT, CVT8)
        sf_b = _scale_biased(vsb.to(gl.int32), DT, CVT8)
        r = gl.inline_asm_elementwise(
            _decoder_text(True, False, CVT8, DT, IMAD_SHR), "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r", [va, vb, sf_a, sf_b], dtype=(gl.int32,) * 8, is_pure=True, pack=1,
        )
    y = gl.join(
        gl.join(gl.join(r[0], r[1]), gl.join(r[2], r[3])),
        gl.join(gl.join(r[4], r[5]), gl.join(r[6], r[7])),
    )  # [NW, KP, c, wv, h, m0, m1]
    y = _halves(y, DT)  # [..., pair]
    return y


@gluon.jit
def _mask_logits(
    s, key_s, qpos, kv_hi, window, bt_row, page_size, page_shift, num_pages,
    PAGE_POW2: gl.constexpr, CAUSAL_ROWS: gl.constexpr, WINDOW_ROWS: gl.constexpr, AX: gl.constexpr,
):
    """Logits ``s`` of keys ``key_s`` (the keys on axis ``AX``) with no weight past ``kv_hi``, on a page outside the
    cache (nothing is read there) or outside a row's causal / window range."""
    ok_s = key_s < kv_hi
    page_s = gl.load(bt_row + _slot_of(key_s, page_size, page_shift, PAGE_POW2)[0], mask=ok_s, other=-1)
    s = gl.where(ok_s & (page_s >= 0) & (page_s < num_pages), s, float("-inf"))
    if CAUSAL_ROWS:
        s = gl.where(key_s <= gl.expand_dims(qpos, AX), s, float("-inf"))
    if WINDOW_ROWS:
        s = gl.where(key_s > gl.expand_dims(qpos - window, AX), s, float("-inf"))
    return s


@gluon.jit
def _softcapped(s, softcap_pre, softcap_post):
    """Raw logits ``s`` soft-capped, in the softmax's base-2 units: ``softcap * tanh(s * scale / softcap) * log2(e)``
    (``softcap_pre`` = ``scale / (softcap * log2(e))`` with the base-2 scale, ``softcap_post`` = ``softcap *
    log2(e)``; ``tanh(x) = 1 - 2 / (e^2x + 1)``)."""
    y = s * softcap_pre
    return (1.0 - 2.0 / (gl.exp2(y * 2.8853900817779268) + 1.0)) * softcap_post


@gluon.jit
def _tile_max(s, qk_scale2, HAS_SOFTCAP: gl.constexpr, AX: gl.constexpr):
    """The largest of the logits ``s`` over the keys on axis ``AX``, in base-2 units (soft-capped ones are already)."""
    if HAS_SOFTCAP:
        return gl.max(s, AX)
    else:
        return gl.max(s, AX) * qk_scale2


@gluon.jit
def _probs(s, m_safe, qk_scale2, HAS_SOFTCAP: gl.constexpr, AX: gl.constexpr):
    """``2^(s - m)`` in base-2 units, ``m_safe`` the rows' reference maximum (finite) over the keys on axis ``AX``."""
    if HAS_SOFTCAP:
        return gl.exp2(s - gl.expand_dims(m_safe, AX))
    else:
        return gl.exp2(s * qk_scale2 - gl.expand_dims(m_safe, AX))


@gluon.jit
def _finite(m):
    """A reference maximum that is ``-inf`` (no key yet) as 0, so that ``2^(x - m)`` stays defined."""
    return gl.where(m == float("-inf"), 0.0, m)


@gluon.jit
def _sums_rescaled(l_i, alpha, AX: gl.constexpr):
    """The softmax sums times the rows' ``alpha``: ``l_i`` one per row, or (``DEFER_SUM``) each thread's partial sums
    in the logits' shape, the keys on axis ``AX``."""
    if len(l_i.shape) == len(alpha.shape):
        return l_i * alpha
    else:
        return l_i * gl.expand_dims(alpha, AX)


@gluon.jit
def _sums_plus(l_i, p, AX: gl.constexpr):
    """The softmax sums plus the probabilities ``p`` (keys on axis ``AX``): their row sums, or (``DEFER_SUM``, the sums in
    ``p``'s shape) ``p`` itself, the reduction across the lanes left to the end of the key loops."""
    if len(l_i.shape) == len(p.shape):
        return l_i + p
    else:
        return l_i + gl.sum(p, AX)


@gluon.jit
def _online_softmax(s, m_i, l_i, qk_scale2, HAS_SOFTCAP: gl.constexpr, AX: gl.constexpr):
    """One online-softmax step over the keys on axis ``AX`` of ``s``: ``(p, m_new, l_i, alpha)`` (base 2; with
    soft-cap ``s`` is already scaled)."""
    m_new = gl.maximum(m_i, _tile_max(s, qk_scale2, HAS_SOFTCAP, AX))
    m_safe = _finite(m_new)
    p = _probs(s, m_safe, qk_scale2, HAS_SOFTCAP, AX)
    alpha = gl.exp2(m_i - m_safe)
    return p, m_new, _sums_plus(_sums_rescaled(l_i, alpha, AX), p, AX), alpha


@gluon.jit
def _rescaled(acc, alpha, MMA: gl.constexpr, ACC: gl.constexpr):
    """``acc`` times the rows' ``alpha`` (the eager and the lazy online softmax both rescale through it): ``ACC`` 0 = ``O^T`` with the state in the output columns' layout (``KT``),
    1 = ``O^T`` with the state of the logits' rows 0..7 (``ROWS8``), 2 = ``O`` of 16 rows."""
    if ACC == 0:
        return acc * gl.expand_dims(alpha, 1)
    elif ACC == 1:
        return acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, MMA)), 1)
    else:
        return acc * gl.expand_dims(alpha, 2)


@gluon.jit
def _online_softmax_lazy(
    s, m_i, l_i, acc, qk_scale2, HAS_SOFTCAP: gl.constexpr, AX: gl.constexpr, MMA: gl.constexpr, ACC: gl.constexpr,
):
    """``LAZY``: :func:`_online_softmax` with a reference maximum that moves, and the state rescaled, only when a row's
    logits exceed it by more than a factor ``2^_LAZY_TAU`` (base-2 logits: by more than ``_LAZY_TAU``); ``p`` stays
    ``<= 2^_LAZY_TAU``. Exact: the accumulator and the sum keep the same reference. The test is one scalar per
    program: with one warp the branch is that warp's; with several it reduces over the warps (shared memory and a
    barrier per tile), and when one warp's row passes its reference every warp moves to its own new maximum (an
    ordinary rescale for the others). Returns ``(p, m_ref, l_i, acc)``."""
    m_tile = _tile_max(s, qk_scale2, HAS_SOFTCAP, AX)
    if gl.max(gl.max(m_tile - m_i, 1), 0) > _LAZY_TAU:  # (also on the first tile: m_i = -inf)
        m_new = gl.maximum(m_i, m_tile)
        alpha = gl.exp2(m_i - _finite(m_new))
        acc = _rescaled(acc, alpha, MMA, ACC)
        l_i = _sums_rescaled(l_i, alpha, AX)
        m_i = m_new
    p = _probs(s, _finite(m_i), qk_scale2, HAS_SOFTCAP, AX)
    return p, m_i, _sums_plus(l_i, p, AX), acc


@gluon.jit
def _softmax_pv_kt(
    acc, m_i, l_i, s, qpos, n0, kv_hi, window, qk_scale2, softcap_pre, softcap_post,
    bt_row, page_size, page_shift, num_pages, va, vb, vsa, vsb,
    MMA: gl.constexpr, NW: gl.constexpr, KW: gl.constexpr, MASKED: gl.constexpr, CAUSAL_ROWS: gl.constexpr,
    WINDOW_ROWS: gl.constexpr, HAS_SOFTCAP: gl.constexpr, PAGE_POW2: gl.constexpr, CVT8: gl.constexpr,
    DT: gl.constexpr, LEAN: gl.constexpr = False, IMAD_SHR: gl.constexpr = False, LAZY: gl.constexpr = False,
):
    """:func:`_attend` from the transposed logits ``s`` = ``S^T`` ``[NW, KW keys, 8 rows]`` (``KT``): the softmax runs
    over axis 1, its state ``[NW, 8]`` has the layout of the output's columns, and ``P^T`` becomes the ``P V``
    operand by one ``movmatrix.trans`` per 8 x 8 block (no shuffle, no shared memory; :func:`_pv_operands_kt`)."""
    if HAS_SOFTCAP:
        s = _softcapped(s, softcap_pre, softcap_post)
    if MASKED:
        key_s = n0 + _iota(NW, MMA, 3, 0) * KW + _iota(KW, MMA, 3, 1) + gl.zeros([NW, KW, 8], gl.int32, layout=MMA)
        s = _mask_logits(s, key_s, qpos, kv_hi, window, bt_row, page_size, page_shift, num_pages,
                         PAGE_POW2, CAUSAL_ROWS, WINDOW_ROWS, 1)
    if LAZY and not MASKED:
        p, m_new, l_i, acc = _online_softmax_lazy(s, m_i, l_i, acc, qk_scale2, HAS_SOFTCAP, 1, MMA, 0)
    else:
        p, m_new, l_i, alpha = _online_softmax(s, m_i, l_i, qk_scale2, HAS_SOFTCAP, 1)
    v_t, p_t = _pv_operands_kt(p, va, vb, vsa, vsb, MMA, NW, KW, CVT8, DT, LEAN, IMAD_SHR)
    if not (LAZY and not MASKED):
        acc = _rescaled(acc, alpha, MMA, 0)
    acc = mma_v2(v_t, p_t, acc)
    return acc, m_new, l_i


@gluon.jit
def _pv_operands_kt(
    p, va, vb, vsa, vsb, MMA: gl.constexpr, NW: gl.constexpr, KW: gl.constexpr, CVT8: gl.constexpr, DT: gl.constexpr,
    LEAN: gl.constexpr, IMAD_SHR: gl.constexpr,
):
    """``KT``: the operands of ``O^T += V^T P^T`` from a tile's ``P^T`` ``[NW, KW, 8]`` (fp32, the logits' accumulator
    fragment) and its V words: ``(V^T, P^T)``. ``P^T`` goes to the B operand by one ``movmatrix.trans`` per 8 x 8
    block: each thread's pair (key g, rows 2t, 2t + 1) becomes (keys 2t, 2t + 1, row g), relabelled."""
    OPA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    OPB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    p16 = p.to(DT)
    t = gl.inline_asm_elementwise(_MOVMATRIX_T, "=r,r", [p16], dtype=p16.dtype, is_pure=True, pack=2)
    t = gl.reshape(gl.permute(gl.reshape(t, [NW, 2, 8, 8]), (0, 1, 3, 2)), [NW, KW, 8])
    p_t = gl.convert_layout(t, OPB, assert_trivial=True)
    y = _v_decoded(va, vb, vsa, vsb, DT, CVT8, LEAN, IMAD_SHR)
    y = gl.permute(y, (0, 3, 6, 5, 4, 2, 1, 7))  # [NW, wv, m1, m0, h, c, kp, pair]
    v_t = gl.convert_layout(gl.reshape(y, [NW, 128, KW]), OPA, assert_trivial=True)
    return v_t, p_t


@gluon.jit
def _softmax_pv_kt2(
    acc, m_i, l_i, s0, s1, qk_scale2, softcap_pre, softcap_post,
    va0, vb0, vsa0, vsb0, va1, vb1, vsa1, vsb1,
    MMA: gl.constexpr, NW: gl.constexpr, KW: gl.constexpr, HAS_SOFTCAP: gl.constexpr, CVT8: gl.constexpr,
    DT: gl.constexpr, LEAN: gl.constexpr = False, IMAD_SHR: gl.constexpr = False,
):
    """``PAIR``: :func:`_softmax_pv_kt` for two unmasked tiles at once, from their transposed logits ``s0``, ``s1``
    (``[NW, KW, 8]`` each) and V words: one online-softmax update over both tiles' keys (one maximum across the lanes,
    one rescale of the accumulator and the sums), then both ``P V`` products. Exact: the same state as two single
    steps up to rounding (the maximum of both tiles is reached in one step instead of two)."""
    if HAS_SOFTCAP:
        s0 = _softcapped(s0, softcap_pre, softcap_post)
        s1 = _softcapped(s1, softcap_pre, softcap_post)
    m_new = gl.maximum(m_i, _tile_max(gl.maximum(s0, s1), qk_scale2, HAS_SOFTCAP, 1))
    m_safe = _finite(m_new)
    p0 = _probs(s0, m_safe, qk_scale2, HAS_SOFTCAP, 1)
    p1 = _probs(s1, m_safe, qk_scale2, HAS_SOFTCAP, 1)
    alpha = gl.exp2(m_i - m_safe)
    l_i = _sums_plus(_sums_rescaled(l_i, alpha, 1), p0 + p1, 1)
    v0, p0_t = _pv_operands_kt(p0, va0, vb0, vsa0, vsb0, MMA, NW, KW, CVT8, DT, LEAN, IMAD_SHR)
    acc = mma_v2(v0, p0_t, _rescaled(acc, alpha, MMA, 0))
    v1, p1_t = _pv_operands_kt(p1, va1, vb1, vsa1, vsb1, MMA, NW, KW, CVT8, DT, LEAN, IMAD_SHR)
    acc = mma_v2(v1, p1_t, acc)
    return acc, m_new, l_i


@gluon.jit
def _logits(
    q_op, kw, ks,
    MMA: gl.constexpr, LK: gl.constexpr, NW: gl.constexpr, KW: gl.constexpr, ROWS8: gl.constexpr,
    CVT8: gl.constexpr = False, KT: gl.constexpr = False, LEAN: gl.constexpr = False, IMAD_SHR: gl.constexpr = False,
):
    """The raw logits of a tile from its K words (:func:`_tile_words`): ``S = Q K^T`` ``[NW, 16, KW]`` (rows 0..7,
    ``[NW, 8, KW]``, with ``ROWS8``), or ``S^T = K Q^T`` ``[NW, KW, 8]`` with ``KT``."""
    OPA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    OPB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    # K^T operand [NW, 128, KW]: k = 16 q + 8 h + 2 t + p <-> cache byte 2 q + p of thread t's 16
    # (word q // 2), nibble h; q = 2 w + qlow
    DT: gl.constexpr = q_op.dtype
    k_sf = ks.to(gl.int32)
    wsel = _iota(4, LK, 4, 3)
    if LEAN:  # the scale pair converted once per (key, t) and duplicated into each half: f16x2 registers
        s_lo, s_hi = gl.inline_asm_elementwise(
            _KS_PAIR, "=r,=r,r", [k_sf], dtype=(gl.int32, gl.int32), is_pure=True, pack=1,
        )
        sf_k = gl.where(wsel < 2, s_lo, s_hi)
    else:
        sf_k = gl.where(wsel < 2, _scale_biased(k_sf & 0xFF, DT, CVT8), _scale_biased((k_sf >> 8) & 0xFF, DT, CVT8))
    o0, o1, o2, o3 = gl.inline_asm_elementwise(
        _decoder_text(False, LEAN, CVT8, DT, IMAD_SHR), "=r,=r,=r,=r,r,r", [kw, sf_k], dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True, pack=1,
    )
    x = _halves(gl.join(gl.join(o0, o1), gl.join(o2, o3)), DT)  # [NW, KW, t, w, qlow, h, p]
    x = gl.permute(x, (0, 3, 4, 5, 2, 6, 1))
    if KT:  # S^T = K Q^T: the keys are the MMA's rows, the query (q_op) its B operand [NW, 128, 8]
        k_a = gl.convert_layout(gl.permute(gl.reshape(x, [NW, 128, KW]), (0, 2, 1)), OPA, assert_trivial=True)
        s = mma_v2(k_a, q_op, gl.zeros([NW, KW, 8], gl.float32, layout=MMA))
    else:
        k_op = gl.convert_layout(gl.reshape(x, [NW, 128, KW]), OPB, assert_trivial=True)
        s = mma_v2(q_op, k_op, gl.zeros([NW, 16, KW], gl.float32, layout=MMA))
        if ROWS8:  # rows 8..15 hold no query: the softmax runs on rows 0..7 only (the same registers)
            s = _rows8(s)
    return s


@gluon.jit
def _softmax_pv(
    acc, m_i, l_i, s, qpos, n0, kv_hi, window, qk_scale2, softcap_pre, softcap_post,
    bt_row, page_size, page_shift, num_pages, va, vb, vsa, vsb,
    MMA: gl.constexpr, NW: gl.constexpr, KW: gl.constexpr, MASKED: gl.constexpr, CAUSAL_ROWS: gl.constexpr,
    WINDOW_ROWS: gl.constexpr, HAS_SOFTCAP: gl.constexpr, PAGE_POW2: gl.constexpr, ROWS8: gl.constexpr,
    CVT8: gl.constexpr, KT: gl.constexpr, LEAN: gl.constexpr, DT: gl.constexpr, IMAD_SHR: gl.constexpr = False,
    LAZY: gl.constexpr = False,
):
    """The online-softmax update of each warp's state from a tile's logits ``s`` (:func:`_logits`) and its V words.
    ``MASKED``: keys past ``kv_hi``, on a page outside the cache or outside a row's causal / window range get no
    weight. ``LAZY``: the unmasked tiles' state moves only when a row's maximum grows by more than a factor
    ``2^_LAZY_TAU`` (:func:`_online_softmax_lazy`)."""
    if KT:
        acc, m_new, l_i = _softmax_pv_kt(
            acc, m_i, l_i, s, qpos, n0, kv_hi, window, qk_scale2, softcap_pre, softcap_post,
            bt_row, page_size, page_shift, num_pages, va, vb, vsa, vsb,
            MMA, NW, KW, MASKED, CAUSAL_ROWS, WINDOW_ROWS, HAS_SOFTCAP, PAGE_POW2, CVT8, DT, LEAN, IMAD_SHR, LAZY,
        )
    else:
        OPA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
        OPB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
        KP: gl.constexpr = KW // 2
        if HAS_SOFTCAP:
            s = _softcapped(s, softcap_pre, softcap_post)
        if MASKED:
            key_s = n0 + _iota(NW, MMA, 3, 0) * KW + _iota(KW, MMA, 3, 2)
            if ROWS8:
                key_s = _rows8(key_s + gl.zeros([NW, 16, KW], gl.int32, layout=MMA))
            s = _mask_logits(s, key_s, qpos, kv_hi, window, bt_row, page_size, page_shift, num_pages,
                             PAGE_POW2, CAUSAL_ROWS, WINDOW_ROWS, 2)
        if LAZY and not MASKED:
            p, m_new, l_i, acc = _online_softmax_lazy(s, m_i, l_i, acc, qk_scale2, HAS_SOFTCAP, 2, MMA,
                                                      1 if ROWS8 else 2)
        else:
            p, m_new, l_i, alpha = _online_softmax(s, m_i, l_i, qk_scale2, HAS_SOFTCAP, 2)
        p16 = p.to(DT)

        # V [NW, KW, 128] (k = 2 kp + pair, the keys; n = 8 (8 wv + 4 m1 + 2 m0 + h) + c) <-> byte
        # 8 c + 4 wv + 2 m1 + m0 of the key, nibble h (head dim 16 c + 2 (4 wv + 2 m1 + m0) + h)
        y = _v_decoded(va, vb, vsa, vsb, DT, CVT8, LEAN, IMAD_SHR)  # [NW, KP, c, wv, h, m0, m1, pair]
        if ROWS8:
            # O^T += V^T P^T: V^T the A operand (m = the permuted head dim, k = keys), P^T the B operand
            # straight from the logits' accumulator registers (rows 0..7, n = row), O^T [NW, 128, 8]
            p_t = gl.convert_layout(gl.permute(p16, (0, 2, 1)), OPB, assert_trivial=True)
            y = gl.permute(y, (0, 3, 6, 5, 4, 2, 1, 7))  # [NW, wv, m1, m0, h, c, kp, pair]
            v_t = gl.convert_layout(gl.reshape(y, [NW, 128, 2 * KP]), OPA, assert_trivial=True)
            if not (LAZY and not MASKED):
                acc = _rescaled(acc, alpha, MMA, 1)
            acc = mma_v2(v_t, p_t, acc)
        else:
            p_op = gl.convert_layout(p16, OPA, assert_trivial=True)
            y = gl.permute(y, (0, 1, 7, 3, 6, 5, 4, 2))  # [NW, kp, pair, wv, m1, m0, h, c]
            v_op = gl.convert_layout(gl.reshape(y, [NW, 2 * KP, 128]), OPB, assert_trivial=True)
            if not (LAZY and not MASKED):
                acc = _rescaled(acc, alpha, MMA, 2)
            acc = mma_v2(p_op, v_op, acc)
    return acc, m_new, l_i


@gluon.jit
def _attend(
    acc, m_i, l_i, q_op, qpos, n0, kv_hi, window, qk_scale2, softcap_pre, softcap_post,
    bt_row, page_size, page_shift, num_pages,
    kw, ks, va, vb, vsa, vsb,
    MMA: gl.constexpr, LK: gl.constexpr, NW: gl.constexpr, KW: gl.constexpr,
    MASKED: gl.constexpr, CAUSAL_ROWS: gl.constexpr, WINDOW_ROWS: gl.constexpr,
    HAS_SOFTCAP: gl.constexpr, PAGE_POW2: gl.constexpr, ROWS8: gl.constexpr, CVT8: gl.constexpr = False,
    KT: gl.constexpr = False, LEAN: gl.constexpr = False, IMAD_SHR: gl.constexpr = False, LAZY: gl.constexpr = False,
):
    """Online-softmax update of each warp's state with its keys of the tile at ``n0``, from the tile's
    raw words (:func:`_tile_words`): :func:`_logits`, then :func:`_softmax_pv`."""
    s = _logits(q_op, kw, ks, MMA, LK, NW, KW, ROWS8, CVT8, KT, LEAN, IMAD_SHR)
    return _softmax_pv(
        acc, m_i, l_i, s, qpos, n0, kv_hi, window, qk_scale2, softcap_pre, softcap_post,
        bt_row, page_size, page_shift, num_pages, va, vb, vsa, vsb,
        MMA, NW, KW, MASKED, CAUSAL_ROWS, WINDOW_ROWS, HAS_SOFTCAP, PAGE_POW2, ROWS8, CVT8, KT, LEAN, q_op.dtype,
        IMAD_SHR, LAZY,
    )


@gluon.jit
def _fold_sinks(m, l_sum, sinks_ptr, head, ok, HAS_SINKS: gl.constexpr):
    """Each row's attention sink (``sinks[head]``) folded into its maximum ``m`` and sum ``l_sum`` (log2 domain), as
    ``attention._fold_sinks``: ``(m_fin, w, l_tot)``, the final maximum, the weight of the accumulated output and the
    final sum."""
    if HAS_SINKS:
        sink2 = gl.load(sinks_ptr + head, mask=ok, other=0.0) * _LOG2E
        m_fin = gl.maximum(m, sink2)
        w = gl.exp2(m - m_fin)
        l_tot = l_sum * w + gl.exp2(sink2 - m_fin)
    else:
        m_fin = m
        w = gl.full(m.shape, 1.0, gl.float32, m.type.layout)
        l_tot = l_sum
    return m_fin, w, l_tot


@gluon.jit
def _warps_merged(acc, m_i, l_i, LE: gl.constexpr, NW: gl.constexpr, R: gl.constexpr, HEAD_DIM: gl.constexpr,
                  ROWS8: gl.constexpr):
    """The warps' softmax states merged in one pass through shared memory (``SMEM_MERGE``): every warp stores its
    accumulator (in head-dim order), running maxima and sums, and after one barrier each thread loads all ``NW`` warps'
    values of its own outputs (layout ``LE``, ``[NW, R, HEAD_DIM]`` with the warps' axis in each thread) and merges
    them in registers. The cross-warp reductions of the plain epilogue instead pass through shared memory once each
    (max, sum, accumulator), every warp summing the whole ``[R, HEAD_DIM]`` result, then a layout conversion. Returns
    ``o`` (``[R, HEAD_DIM]``, ``SliceLayout(0, LE)``, column = head dim), the maxima and the sums (``[R]``).

    ``acc``: ``[NW, HEAD_DIM, 8]`` (``ROWS8``: O^T) or ``[NW, R, HEAD_DIM]``, whose column ``n`` holds head dim
    ``16 (n % 8) + n // 8`` (the P V operand's order); ``m_i``, ``l_i``: ``[NW, R]``."""
    if ROWS8:
        a = gl.permute(acc, (0, 2, 1))
    else:
        a = acc
    # n = 8 hi + lo holds head dim 16 lo + hi: [.., hi, lo] -> [.., lo, hi] puts the columns in head-dim order
    a = gl.reshape(gl.permute(gl.reshape(a, [NW, R, HEAD_DIM // 8, 8]), (0, 1, 3, 2)), [NW, R, HEAD_DIM])
    a_s = gl.allocate_shared_memory(gl.float32, [NW, R, HEAD_DIM], gl.SwizzledSharedLayout(4, 1, 8, [2, 1, 0]), a)
    ML: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    m_s = gl.allocate_shared_memory(gl.float32, [NW, R], ML, m_i)
    l_s = gl.allocate_shared_memory(gl.float32, [NW, R], ML, l_i)
    av = a_s.load(LE)
    ms = m_s.load(gl.SliceLayout(2, LE))
    ls = l_s.load(gl.SliceLayout(2, LE))
    m = gl.max(ms, 0)
    w = gl.exp2(ms - gl.expand_dims(_finite(m), 0))
    return gl.sum(av * gl.expand_dims(w, 2), 0), m, gl.sum(ls * w, 0)


@gluon.jit
def _merge_last(
    part_o_ptr, part_lse_ptr, o_ptr, lse_ptr, sinks_ptr, slot0, n_chunks, num_qo_heads, kvh, group, q_start, q_len,
    stride_ot, stride_oh, stride_lt,
    R: gl.constexpr, QMAX: gl.constexpr, HEAD_DIM: gl.constexpr, NW: gl.constexpr, HAS_SINKS: gl.constexpr,
    RETURN_LSE: gl.constexpr,
):
    """The fused merge (``FUSED_MERGE``): merge the ``n_chunks`` partials of this KV head's ``R`` rows, as
    :func:`attention._merge_rows` does, and store the output (and LSE). Run by the last of the request's chunks to
    finish (:func:`gluon_decode_kernel`); the partials are loaded past L1 (``.cg``: this SM may hold a line of them
    from before their chunks stored them).

    One layout for everything, ``[chunks, rows, head_dim]`` with the lanes on the head dimension and the warps on the
    rows; the running max and sum keep that rank (``[1, R, 1]``, replicated over the lanes), so nothing changes
    layout. ``MCB`` chunks per step, loaded at once (one round trip to L2 per step): ``MCB x R <= 8 NW`` keeps each
    thread's share of a step at 32 floats."""
    MCB: gl.constexpr = 8 * NW // R if 8 * NW >= R else 1
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 1, 32], [1, NW, 1], [2, 1, 0])
    cc = _iota(MCB, L3, 3, 0)
    rr = _iota(R, L3, 3, 1)
    dd = _iota(HEAD_DIM, L3, 3, 2)
    t = rr // group
    head = kvh * group + rr % group
    ok = t < q_len
    row = head.to(gl.int64) * QMAX + t
    slot_rows = num_qo_heads * QMAX
    m = gl.full([1, R, 1], float("-inf"), gl.float32, L3)
    l_sum = gl.zeros([1, R, 1], gl.float32, L3)
    acc = gl.zeros([1, R, HEAD_DIM], gl.float32, L3)
    for s0 in range(0, n_chunks, MCB):
        cs = s0 + cc
        okc = (cs < n_chunks) & ok
        prow = (slot0 + cs).to(gl.int64) * slot_rows + row
        lse_s = gl.load(part_lse_ptr + prow, mask=okc, other=float("-inf"), cache_modifier=".cg")
        o_s = gl.load(part_o_ptr + prow * HEAD_DIM + dd, mask=okc & (dd >= 0), other=0.0, cache_modifier=".cg")
        m_new = gl.maximum(m, gl.max(lse_s, 0, keep_dims=True))
        m_safe = _finite(m_new)
        alpha = gl.exp2(m - m_safe)
        w = gl.exp2(lse_s - m_safe)
        acc = acc * alpha + gl.sum(o_s * w, 0, keep_dims=True)
        l_sum = l_sum * alpha + gl.sum(w, 0, keep_dims=True)
        m = m_new
    m_fin, w_fin, l_tot = _fold_sinks(m, l_sum, sinks_ptr, head, ok, HAS_SINKS)
    l_safe = gl.where(l_tot > 0.0, l_tot, 1.0)
    o = acc * (w_fin / l_safe)
    tok = (q_start + t).to(gl.int64)
    o_row = o_ptr + tok * stride_ot + head.to(gl.int64) * stride_oh
    gl.store(o_row + dd, o.to(o_ptr.dtype.element_ty), mask=ok & (dd >= 0))
    if RETURN_LSE:
        lse = gl.where(l_tot > 0.0, (m_fin + gl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
        gl.store(lse_ptr + tok * stride_lt + head, lse, mask=ok)


@gluon.jit(do_not_specialize=fp4.DECODE_PER_STEP)
def gluon_decode_kernel(
    q_ptr, o_ptr, lse_ptr, part_o_ptr, part_lse_ptr,
    k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, seq_lens_ptr, qsl_ptr, sinks_ptr,
    k_scale, v_scale, sm_scale_log2, softcap, window,
    batch, programs, min_tiles, spread, group, num_qo_heads, page_size, page_shift, max_pages, num_tokens,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_lt,
    stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
    stride_ksp, stride_kst, stride_ksh, stride_vsp, stride_vst, stride_vsh,
    stride_bt,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, QMAX: gl.constexpr,
    VARLEN: gl.constexpr, CAUSAL: gl.constexpr, HAS_WINDOW: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
    HAS_SINKS: gl.constexpr, RETURN_LSE: gl.constexpr, BATCH_BLOCK: gl.constexpr,
    K_SCALE_PTR: gl.constexpr, V_SCALE_PTR: gl.constexpr,
    DATA_ALIGN: gl.constexpr, SF_ALIGN: gl.constexpr, PAGE_POW2: gl.constexpr,
    num_pages, status_ptr, NW: gl.constexpr, ROWS8: gl.constexpr = False, PAGE_EVEN: gl.constexpr = False,
    OFF32: gl.constexpr = False, CVT8: gl.constexpr = False, KT: gl.constexpr = False, LEAN: gl.constexpr = False,
    SKEW: gl.constexpr = False, PAGE_TILE: gl.constexpr = False, IMAD_SHR: gl.constexpr = False,
    LAZY: gl.constexpr = False, TOK_K: gl.constexpr = 0, TOK_V: gl.constexpr = 0, TOK_KS: gl.constexpr = 0,
    TOK_VS: gl.constexpr = 0, RING: gl.constexpr = 0, DEFER_SUM: gl.constexpr = False, counter_ptr=None,
    FUSED_MERGE: gl.constexpr = False, PDL: gl.constexpr = False,
    PAIR: gl.constexpr = False, k_desc=None, v_desc=None, TMA: gl.constexpr = False, SCALE_AHEAD: gl.constexpr = 1,
    PRING: gl.constexpr = False, BALANCE: gl.constexpr = 0, L2_FETCH: gl.constexpr = 0, L2_AHEAD: gl.constexpr = 0,
    L2_SCALES: gl.constexpr = False, L2_BULK: gl.constexpr = 0, EARLY: gl.constexpr = False, plan_ptr=None,
    PLAN: gl.constexpr = False, table_ptr=None, TABLE: gl.constexpr = False, SMEM_MERGE: gl.constexpr = False,
):
    """:func:`attention._decode_kernel` (bf16 or fp16 queries, head_dim 128, at most 16 rows, no rotation), with the key
    loop of this module's docstring. ``NW`` = the launch's ``num_warps``;
    ``ROWS8``: ``G x q_len <= 8``; ``PAGE_EVEN``: an even page size and no window; ``OFF32``: every cache
    offset fits in int32; ``CVT8``: the E4M3-conversion decode (SM89+); ``KT`` (with ``ROWS8``): the logits
    transposed, ``S^T = K Q^T`` (:func:`_softmax_pv_kt`); ``SKEW``: the unmasked loop computes tile ``i + 1``'s
    logits in step ``i``, after tile ``i``'s softmax and ``P V`` (independent work for the scheduler beside the
    softmax's dependent chain); ``PAGE_TILE`` (the launcher sets it only where the page size is a power of two and a
    multiple of ``KW``, and there is no window, so tiles start at multiples of ``BLOCK_N``): each warp's keys of a tile
    lie in one page, and the unmasked loop reads one page id per warp and tile and loads at one row offset per warp
    plus loop-invariant thread offsets, with no mask (:func:`_k_words_paged`, :func:`_v_words_paged`; the token
    strides ``TOK_*`` as constexprs, the launcher's :func:`attention._gluon_token_strides`); ``IMAD_SHR`` (with
    ``CVT8``): the E4M3 decoders move the high nibbles' shift from the ALU pipe to the FMA pipe (:func:`_e4m3_cvt`);
    ``LAZY``: the unmasked tiles rescale the accumulator only when a row's maximum grows by more than a factor
    ``2^_LAZY_TAU`` (:func:`_online_softmax_lazy`; with ``NW > 1`` its test reduces over the warps); ``DEFER_SUM``: the
    softmax sums stay each thread's partial sums of its own logits (the logits' shape and layout) and are reduced once
    after the key loops, instead of a reduction across lanes per tile (:func:`_online_softmax`); ``RING`` (``n >= 2``, with
    ``PAGE_TILE``): the unmasked loop's K and V words pass through a ring of ``n`` tiles in shared memory, copied by
    ``cp.async`` ``n - 1`` tiles ahead (:func:`_ring_copy`; each thread reads back the bytes it copied), in place of the
    one tile held ahead in registers; the block scales stay register loads ``SCALE_AHEAD`` tiles ahead (1, or 2 with a
    ring of 3 or more and no ``PAIR`` or ``TMA``: then every global load of the loop but the page ids' has two steps to
    land; :func:`_scales_paged`); ``PDL`` (SM90+): the merge kernel is this launch's programmatic dependent
    (``attention.MERGE_PDL``), which every program lets launch as it starts (1) or once its key loops are done (2); ``TMA`` (SM90+, with a ``RING``, no ``PAIR``; ``k_desc`` / ``v_desc`` the K and V
    data's TMA descriptors, ``attention._tma_descriptors``): the ring is filled by one loader warp's TMA boxes
    (:func:`_tma_loader`) while the program's warps decode (:func:`_tma_consumer`), warp-specialized; ``PRING`` (with a
    ``RING``, no ``PAIR`` or ``TMA``): the ring is a static shared-memory array declared in inline PTX
    (:func:`_pring_base`), filled and read back by inline PTX (:func:`_pring_copy`, :func:`_pring_read`), so Triton
    inserts no ``bar.sync`` around it: each thread reads back only its own bytes, after its own
    ``cp.async.wait_group``; ``L2_FETCH`` (64, 128 or 256; with ``PAGE_TILE``, no ``RING`` or the ``PRING`` one): the
    unmasked loop (one tile or, ``TILE_PAIRS``, two a step; or ``PRING``'s copies) loads its K and V words
    (``L2_SCALES``, no ring: and their block scales) with that L2 prefetch size (:func:`_load_words`: L2 fills the
    aligned block around a missed row, the other KV heads' rows of the token beside it); ``L2_AHEAD`` (``n >= 2``; with ``PAGE_TILE``, no ``RING`` or ``PAIR``,
    16 keys per warp): the one-tile loop asks L2 for tile ``i + n``'s K and V rows and block scales in step ``i``
    (:func:`_l2_prefetch`; page ids one step before, clamped to the checked range), on top of tile ``i + 1``'s loads
    to registers; ``L2_BULK`` (``n >= 2``, SM90+; with ``PAGE_TILE``, no ``RING``, ``PAIR`` or ``L2_AHEAD``): the
    same distance by bulk prefetches (:func:`_l2_bulk`: one ``cp.async.bulk.prefetch.L2`` per warp and tensor, of the
    page span that holds every KV head's rows of the warp's keys, asked for by the chunk's KV head programs in turn
    (NHD), or of the program's own rows, every tile (HND)); ``EARLY`` (with ``PAGE_TILE``, no ``RING``, ``PAIR``,
    ``L2_AHEAD`` or ``L2_BULK``): the unmasked range's page ids are checked (:func:`_bad_pages`) after its first tile's
    words are asked for, at those page ids clamped into the cache, not before: the check's block-table reads then hit
    the lines that tile's page ids brought to L1, and its round trip overlaps the words'. Where a page id is bad the
    words go unused and the masked loop takes the range, as without it; ``FUSED_MERGE`` (``counter_ptr``: one zeroed
    int32 counter per request and KV head, ``attention._merge_counters``): no merge kernel; the last chunk of a split
    request and KV head merges the partials (:func:`_merge_last`), and a request with no visible key gets a chunk of its
    own that writes its zero rows (:func:`_tiles_chunks`), as the plain kernel's ``FUSED_MERGE`` does. ``PLAN``
    (``attention.MERGE_PLAN_MIN_BATCH``): chunk 0 of each request, on KV head 0, stores the request's chunk count and
    first partial slot at ``plan_ptr[2 b]``, ``plan_ptr[2 b + 1]`` for the merge kernel. ``TABLE``
    (``attention.DECODE_TABLE_MIN_BATCH``): the chunk's request, index, chunk count and first slot come from
    ``table_ptr[4 c ..]`` (``attention._decode_table_kernel``), with no scan of the batch."""
    gl.static_assert(HEAD_DIM == 128, "the Gluon decode serves head_dim 128")
    gl.static_assert(BLOCK_M == 16, "the Gluon decode serves 16 rows")
    gl.static_assert(DATA_ALIGN >= 16, "cache rows must start on 16-byte boundaries")
    gl.static_assert(SF_ALIGN >= 2, "scale rows must start on 2-byte boundaries")
    KW: gl.constexpr = BLOCK_N // NW
    gl.static_assert(KW * NW == BLOCK_N, "BLOCK_N must be a multiple of the warps")
    gl.static_assert(KW % 16 == 0, "each warp takes a multiple of 16 keys per tile")
    gl.static_assert(not KT or (ROWS8 and KW == 16), "the transposed logits (KT) take <= 8 rows and 16 keys per warp")
    gl.static_assert(not PAGE_TILE or (PAGE_POW2 and not HAS_WINDOW), "PAGE_TILE takes pages of 2^n keys, no window")
    gl.static_assert(RING == 0 or (RING >= 2 and PAGE_TILE and not SKEW), "RING takes PAGE_TILE, no SKEW, >= 2 tiles")
    gl.static_assert(not TMA or (RING >= 2 and not PAIR), "TMA takes a RING (PAGE_TILE, no SKEW) and no PAIR")
    gl.static_assert(SCALE_AHEAD == 1 or (SCALE_AHEAD == 2 and RING >= 3 and not PAIR and not TMA),
                     "SCALE_AHEAD 2 takes a RING of 3 or more, no PAIR, no TMA")
    gl.static_assert(not PRING or (RING >= 2 and not PAIR and not TMA), "PRING takes a RING, no PAIR, no TMA")
    gl.static_assert(L2_FETCH == 0 or ((L2_FETCH == 64 or L2_FETCH == 128 or L2_FETCH == 256) and PAGE_TILE
                                       and (RING == 0 or PRING)),
                     "L2_FETCH is 0, or 64, 128 or 256 with PAGE_TILE and no RING or the PRING one")
    gl.static_assert(not L2_SCALES or (L2_FETCH > 0 and RING == 0), "L2_SCALES takes an L2_FETCH and no RING")
    SF_FETCH: gl.constexpr = L2_FETCH if L2_SCALES else 0
    gl.static_assert(L2_AHEAD == 0 or (L2_AHEAD >= 2 and PAGE_TILE and RING == 0 and not PAIR),
                     "L2_AHEAD is 0 or >= 2, and takes PAGE_TILE, no RING, no PAIR")
    gl.static_assert(L2_BULK == 0 or (L2_BULK >= 2 and PAGE_TILE and RING == 0 and not PAIR and L2_AHEAD == 0),
                     "L2_BULK is 0 or >= 2, and takes PAGE_TILE, no RING, no PAIR, no L2_AHEAD")
    gl.static_assert(not EARLY or (PAGE_TILE and RING == 0 and not PAIR and L2_AHEAD == 0 and L2_BULK == 0),
                     "EARLY takes PAGE_TILE, no RING, no PAIR, no L2_AHEAD, no L2_BULK")
    gl.static_assert(not PAGE_TILE or (TOK_K > 0 and TOK_V > 0 and TOK_KS > 0 and TOK_VS > 0),
                     "PAGE_TILE takes the token strides as constexprs (TOK_K, TOK_V, TOK_KS, TOK_VS)")
    # PAGE_TILE's next V words are loaded, in source, after the P V of the current ones: on sm_90 (triton 3.6.0, when
    # it was chosen) the unmasked loop of 4 warps then had no register copies at its end (412 instructions per 16 keys
    # against 423, 155 registers against 168); with the skewed logits or one warp it had more (430 / 441 against
    # 424 / 423)
    V_LATE: gl.constexpr = PAGE_TILE and NW > 1 and not SKEW and RING == 0
    # PAIR where it applies: the transposed logits and PAGE_TILE, neither the skew nor the lazy rescale; with the
    # words in registers (TILE_PAIRS) or in a ring of 4 tiles (RING_PAIRS)
    TILE_PAIRS: gl.constexpr = PAIR and KT and PAGE_TILE and RING == 0 and not SKEW and not LAZY
    RING_PAIRS: gl.constexpr = PAIR and KT and PAGE_TILE and RING == 4 and not SKEW and not LAZY
    # the one-tile ring loop with its block scales two tiles ahead (tiles i + 1's and i + 2's in registers in step i)
    SCALES2: gl.constexpr = SCALE_AHEAD == 2
    # how far ahead the one-tile ring loop loads the page ids that its scale loads take
    PAGES_AHEAD: gl.constexpr = 3 if SCALES2 else 2
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[NW, 1, 1], instr_shape=[1, 16, 8])
    OPA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    LK: gl.constexpr = gl.BlockedLayout([1, 1, 1, 4], [1, 8, 4, 1], [NW, 1, 1, 1], [3, 2, 1, 0])
    LV: gl.constexpr = gl.BlockedLayout([1, 1, 1, 2], [1, 4, 8, 1], [NW, 1, 1, 1], [3, 1, 2, 0])
    LQ: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 2, 16], [NW, 1, 1], [2, 1, 0])

    if PDL == 1:
        gdc_launch_dependents()
    num_kv_heads = num_qo_heads // group
    c = gl.program_id(0) // num_kv_heads
    kvh = gl.program_id(0) % num_kv_heads
    if VARLEN:  # noqa: SIM102
        if gl.load(status_ptr) != 0:
            return
    # (gl.to_tensor: an int argument equal to 1 arrives as the constant 1, which has no .to)
    max_kv = gl.to_tensor(max_pages).to(gl.int64) * page_size
    if TABLE:  # attention._decode_table_kernel's entry for chunk c: no scan
        e = table_ptr + 4 * c.to(gl.int64)
        b = gl.load(e)
        j = gl.load(e + 1)
        n_chunks = gl.load(e + 2)
        slot0 = gl.load(e + 3)
    else:
        b, j, n_chunks, slot0 = _find_chunk(
            c, batch, programs, min_tiles, spread, seq_lens_ptr, qsl_ptr, window, max_kv, num_tokens,
            BLOCK_N, QMAX, VARLEN, HAS_WINDOW, BATCH_BLOCK, NW, BALANCE, FUSED_MERGE,
        )
    if b < 0:
        return
    if PLAN:  # noqa: SIM102 (a constexpr; attention._store_plan: the merge kernel reads b's chunks, no scan)
        if (j == 0) & (kvh == 0):
            gl.store(plan_ptr + 2 * b.to(gl.int64), n_chunks)
            gl.store(plan_ptr + 2 * b.to(gl.int64) + 1, slot0)

    seq_len = gl.minimum(gl.maximum(gl.load(seq_lens_ptr + b).to(gl.int64), 0), max_kv)
    if VARLEN:
        q_start, q_len = _query_span(gl.load(qsl_ptr + b), gl.load(qsl_ptr + b + 1), num_tokens)
    else:
        q_start = b * QMAX
        q_len = QMAX

    # the query, k permuted as the K operand's (see _attend): k = 16 q + 8 h + 2 t + p <-> dim
    # 32 t + 4 q + 2 p + h
    rq = _iota(16, LQ, 3, 1)
    kq = _iota(128, LQ, 3, 2)
    dim_q = 32 * ((kq // 2) % 4) + 4 * (kq // 16) + 2 * (kq % 2) + (kq // 8) % 2
    tq = rq // group
    q_rows = q_ptr + (q_start + tq).to(gl.int64) * stride_qt + (kvh * group + rq % group).to(gl.int64) * stride_qh
    q_val = gl.load(q_rows + dim_q + _iota(NW, LQ, 3, 0) * 0, mask=(tq < q_len) & (kq >= 0), other=0.0)
    q_shift = 1.0
    if CVT8 and q_ptr.dtype.element_ty == gl.bfloat16:
        # fp16 MMAs for a bf16 query: scaled by 2^-e into fp16's range (the largest |q| below 2^15), 2^e folded
        # back into the softmax scale; both exact powers of two
        qf = q_val.to(gl.float32)
        qmax = gl.max(gl.max(gl.max(gl.abs(qf), 2), 1), 0)
        e = gl.maximum(((qmax.to(gl.int32, bitcast=True) >> 23) & 0xFF) - 127 - 14, 0)
        e = gl.minimum(e, 100)
        q_val = (qf * ((127 - e) << 23).to(gl.float32, bitcast=True)).to(gl.float16)
        q_shift = ((127 + e) << 23).to(gl.float32, bitcast=True)
    if KT:  # Q^T [NW, 128, 8], the B operand of S^T = K Q^T
        q_op = gl.convert_layout(gl.permute(_rows8(q_val), (0, 2, 1)),
                                 gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2))
    else:
        q_op = gl.convert_layout(q_val, OPA)

    if K_SCALE_PTR:
        ks_g = gl.load(k_scale)
    else:
        ks_g = k_scale
    if V_SCALE_PTR:
        vs_g = gl.load(v_scale)
    else:
        vs_g = v_scale
    # the decoded values are e2m1 * sf * 2^-8 (2^-6 with LEAN's exact scales): the global scales take the power back
    UNSCALE: gl.constexpr = 64.0 if LEAN else 256.0
    qk_scale2 = sm_scale_log2 * ks_g * UNSCALE * q_shift
    vs_g = vs_g * UNSCALE
    softcap_pre = qk_scale2 / (softcap * _LOG2E)
    softcap_post = softcap * _LOG2E

    kv_hi = seq_len
    if HAS_WINDOW:
        kv_lo = gl.minimum(gl.maximum(seq_len - q_len - window + 1, 0), kv_hi)
        full_lo = seq_len - window
    else:
        kv_lo = seq_len * 0
        full_lo = seq_len * 0
    if CAUSAL:
        full_hi = gl.minimum(seq_len - q_len + 1, kv_hi)
    else:
        full_hi = kv_hi
    n_tiles = (kv_hi - kv_lo + BLOCK_N - 1) // BLOCK_N
    t_begin = _chunk_edge(j, n_tiles, n_chunks)
    t_end = _chunk_edge(j + 1, n_tiles, n_chunks)
    n_mask_lo = gl.minimum(gl.maximum((full_lo - kv_lo + BLOCK_N - 1) // BLOCK_N, 0), n_tiles).to(gl.int32)
    n_full_end = gl.minimum(gl.maximum((full_hi - kv_lo) // BLOCK_N, 0), n_tiles).to(gl.int32)
    kv_lo = kv_lo.to(gl.int32)
    kv_hi = kv_hi.to(gl.int32)

    # rows of the logits: row m = token m // group, head m % group
    rs = _iota(16, gl.SliceLayout(2, MMA), 2, 1) + _iota(NW, gl.SliceLayout(2, MMA), 2, 0) * 0
    qpos = (seq_len - q_len).to(gl.int32) + rs // group

    bt_row = bt_ptr + b.to(gl.int64) * stride_bt
    k_base = k_ptr + kvh * (stride_kh * DATA_ALIGN)
    v_base = v_ptr + kvh * (stride_vh * DATA_ALIGN)
    ks_base = ks_ptr + kvh * (stride_ksh * SF_ALIGN)
    vs_base = vs_ptr + kvh * (stride_vsh * SF_ALIGN)
    IT: gl.constexpr = gl.int32 if OFF32 else gl.int64
    s_kp = gl.to_tensor(stride_kp).to(IT) * DATA_ALIGN
    s_kt = gl.to_tensor(stride_kt).to(IT) * DATA_ALIGN
    s_vp = gl.to_tensor(stride_vp).to(IT) * DATA_ALIGN
    s_vt = gl.to_tensor(stride_vt).to(IT) * DATA_ALIGN
    s_ksp = gl.to_tensor(stride_ksp).to(IT) * SF_ALIGN
    s_kst = gl.to_tensor(stride_kst).to(IT) * SF_ALIGN
    s_vsp = gl.to_tensor(stride_vsp).to(IT) * SF_ALIGN
    s_vst = gl.to_tensor(stride_vst).to(IT) * SF_ALIGN
    WINDOW_ROWS: gl.constexpr = HAS_WINDOW and (QMAX > 1)

    if ROWS8:  # O^T: [NW, head dim, 8 rows]
        acc = gl.zeros([NW, HEAD_DIM, 8], gl.float32, layout=MMA)
    else:
        acc = gl.zeros([NW, 16, HEAD_DIM], gl.float32, layout=MMA)
    if KT:  # the softmax state of rows 0..7 in the layout of the output's columns
        m_i = gl.full([NW, 8], float("-inf"), gl.float32, layout=gl.SliceLayout(1, MMA))
        qpos = gl.convert_layout(_rows8(qpos), m_i.type.layout)
    elif ROWS8:  # the softmax state of rows 0..7, in the layout the logits' rows 0..7 reduce to
        m_i = gl.max(_rows8(gl.full([NW, 16, KW], float("-inf"), gl.float32, layout=MMA)), 2)
        qpos = gl.convert_layout(_rows8(qpos), m_i.type.layout)
    else:
        m_i = gl.full([NW, 16], float("-inf"), gl.float32, layout=gl.SliceLayout(2, MMA))
    if DEFER_SUM:  # the softmax sums as each thread's partial sums of its own logits (reduced after the key loops)
        if KT:
            l_i = gl.zeros([NW, KW, 8], gl.float32, layout=MMA)
        elif ROWS8:
            l_i = _rows8(gl.zeros([NW, 16, KW], gl.float32, layout=MMA))
        else:
            l_i = gl.zeros([NW, 16, KW], gl.float32, layout=MMA)
    else:
        l_i = gl.zeros_like(m_i)

    # masked tiles below the window edge
    a_end = gl.minimum(t_end, n_mask_lo)
    for i in range(t_begin, a_end):
        n0 = kv_lo + i * BLOCK_N
        pk, pa, pb = _tile_pages(n0, kv_hi, bt_row, page_size, page_shift, LK, LV, NW, KW, PAGE_POW2, PAGE_EVEN)
        kw, ks, va, vb, vsa, vsb = _tile_words(
            n0, kv_hi, pk, pa, pb, page_size, page_shift, num_pages, k_base, v_base, ks_base, vs_base,
            s_kp, s_kt, s_vp, s_vt, s_ksp, s_kst, s_vsp, s_vst, LK, LV, NW, KW, PAGE_POW2, PAGE_EVEN, OFF32,
        )
        acc, m_i, l_i = _attend(
            acc, m_i, l_i, q_op, qpos, n0, kv_hi, window, qk_scale2, softcap_pre, softcap_post,
            bt_row, page_size, page_shift, num_pages, kw, ks, va, vb, vsa, vsb,
            MMA, LK, NW, KW, True, CAUSAL, WINDOW_ROWS, HAS_SOFTCAP, PAGE_POW2, ROWS8, CVT8, KT, LEAN, IMAD_SHR,
        )
    if PRING:  # the ring in inline PTX (_pring_base): no Triton allocation, so no barriers around it
        ring = _pring_base(RING * NW * KW * 128, NW)
        sk, sva, svb = _pring_offsets(NW, KW, LK, LV)
    elif RING > 0 and not TMA:  # the unmasked loop's K / V words, RING tiles (no swizzle: each thread reads back its bytes)
        RL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [3, 2, 1, 0])
        k_ring = gl.allocate_shared_memory(gl.int32, [RING, NW, KW, 4, 4], RL)
        va_ring = gl.allocate_shared_memory(gl.int32, [RING, NW, KW // 2, 8, 2], RL)
        vb_ring = gl.allocate_shared_memory(gl.int32, [RING, NW, KW // 2, 8, 2], RL)
    if TMA:  # RING stages of NW boxes of K and of V words (unswizzled: the cache's byte order), full / empty barriers
        TL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=4)
        kt_ring = gl.allocate_shared_memory(gl.uint8, [RING * NW, 1, KW, 1, 64], TL)
        vt_ring = gl.allocate_shared_memory(gl.uint8, [RING * NW, 1, KW, 1, 64], TL)
        full = gl.allocate_shared_memory(gl.int64, [RING, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [RING, 1], mbarrier.MBarrierLayout())
        for r in gl.static_range(RING):
            mbarrier.init(full.index(r), count=1)
            mbarrier.init(empty.index(r), count=1)
    # unmasked tiles once every page id of theirs is checked: tile i + 1's words and tile i + 2's
    # page ids are loaded before tile i is decoded (nothing is read outside the checked pages: past b_end the loads
    # are masked, or with PAGE_TILE read the last checked page)
    b_begin = gl.maximum(t_begin, n_mask_lo)
    b_end = gl.minimum(t_end, n_full_end)
    if not EARLY and b_end > b_begin:  # (EARLY: after the range's first loads, below)
        if PAGE_POW2:
            p_lo = (kv_lo + b_begin * BLOCK_N) >> page_shift
            p_last = (kv_lo + b_end * BLOCK_N - 1) >> page_shift
        else:
            p_lo = (kv_lo + b_begin * BLOCK_N) // page_size
            p_last = (kv_lo + b_end * BLOCK_N - 1) // page_size
        if _bad_pages(bt_row, p_lo, p_last + 1, num_pages, NW) > 0:
            b_end = b_begin
    if RING_PAIRS:  # pairs of unmasked tiles only: an odd last one takes the masked loop
        b_end = b_begin + gl.maximum(b_end - b_begin, 0) // 2 * 2
    if TMA:  # one loader warp copies the unmasked tiles' words by TMA (_tma_loader), the program's warps decode them
        if b_end > b_begin:
            n0 = kv_lo + b_begin * BLOCK_N
            last = (kv_lo + b_end * BLOCK_N - 1) >> page_shift
            off_k, off_ks, off_va, off_vb, off_vsa, off_vsb = _thread_offsets(TOK_K, TOK_V, TOK_KS, TOK_VS, LK, LV, KW)
            pk, pa = _warp_pages(n0, last, bt_row, page_shift, LK, LV, NW, KW)
            acc, m_i, l_i = gl.warp_specialize(
                [(_tma_consumer, (acc, m_i, l_i, q_op, qpos, kv_hi, window, qk_scale2, softcap_pre, softcap_post, bt_row,
                                  page_size, page_shift, num_pages, ks_base, vs_base, s_ksp, s_vsp, off_ks, off_vsa,
                                  off_vsb, pk, pa, last, kv_lo, b_begin, b_end, kt_ring, vt_ring, full, empty,
                                  MMA, LK, LV, NW, KW, BLOCK_N, RING, CAUSAL, WINDOW_ROWS, HAS_SOFTCAP, PAGE_POW2,
                                  ROWS8, CVT8, KT, LEAN, IMAD_SHR, LAZY, TOK_KS, TOK_VS, IT)),
                 (_tma_loader, (bt_row, kv_lo, b_begin, b_end, last, page_shift, page_size, kvh, k_desc, v_desc,
                                kt_ring, vt_ring, full, empty, NW, KW, BLOCK_N, RING))],
                [1], [24],
            )
    elif b_end > b_begin:
        end_key = kv_lo + b_end * BLOCK_N  # (<= kv_hi)
        n0 = kv_lo + b_begin * BLOCK_N
        if PAGE_TILE:  # one page id per warp and tile, loop-invariant thread offsets, no mask
            last = (end_key - 1) >> page_shift
            off_k, off_ks, off_va, off_vb, off_vsa, off_vsb = _thread_offsets(TOK_K, TOK_V, TOK_KS, TOK_VS, LK, LV, KW)
            pk, pa = _warp_pages(n0, last, bt_row, page_shift, LK, LV, NW, KW)
            if RING_PAIRS:
                # tiles 0 and 1 of the range into stages 0 and 1, their scales to registers; the page ids of tiles 2
                # and 3 (copied, and their scales loaded, in step 0)
                pk1, pa1 = _warp_pages(n0 + BLOCK_N, last, bt_row, page_shift, LK, LV, NW, KW)
                ks, vsa, vsb = _scales_paged(n0, pk, pa, page_size, ks_base, vs_base, s_ksp, s_vsp, off_ks, off_vsa,
                                             off_vsb, TOK_KS, TOK_VS, LK, LV, NW, KW, IT)
                ks1, vsa1, vsb1 = _scales_paged(n0 + BLOCK_N, pk1, pa1, page_size, ks_base, vs_base, s_ksp, s_vsp, off_ks,
                                                off_vsa, off_vsb, TOK_KS, TOK_VS, LK, LV, NW, KW, IT)
                _ring_copy(n0, pk, pa, page_size, k_base, v_base, s_kp, s_vp, off_k, off_va, off_vb, k_ring, va_ring,
                           vb_ring, 0, TOK_K, TOK_V, LK, LV, NW, KW, IT)
                _ring_copy(n0 + BLOCK_N, pk1, pa1, page_size, k_base, v_base, s_kp, s_vp, off_k, off_va, off_vb, k_ring,
                           va_ring, vb_ring, 1, TOK_K, TOK_V, LK, LV, NW, KW, IT)
                pk1, pa1 = _warp_pages(n0 + 3 * BLOCK_N, last, bt_row, page_shift, LK, LV, NW, KW)
            elif RING > 0:
                # tiles 0 .. RING - 2 of the range into the ring, tile 0's scales (SCALES2: and tile 1's) to registers;
                # then the page ids of tile SCALE_AHEAD (its scales, loaded in step 0) and of tile RING - 1 (copied in
                # step 0)
                ks, vsa, vsb = _scales_paged(n0, pk, pa, page_size, ks_base, vs_base, s_ksp, s_vsp, off_ks, off_vsa,
                                             off_vsb, TOK_KS, TOK_VS, LK, LV, NW, KW, IT)
                if SCALES2:  # and tile 1's scales, at its page ids
                    pk1, pa1 = _warp_pages(n0 + BLOCK_N, last, bt_row, page_shift, LK, LV, NW, KW)
                    ks1, vsa1, vsb1 = _scales_paged(n0 + BLOCK_N, pk1, pa1, page_size, ks_base, vs_base, s_ksp, s_vsp,
                                                    off_ks, off_vsa, off_vsb, TOK_KS, TOK_VS, LK, LV, NW, KW, IT)
                if PRING:
                    _pring_copy(n0, pk, pa, page_size, k_base, v_base, s_kp, s_vp, off_k, off_va, off_vb, ring, sk, sva,
                                svb, 0, TOK_K, TOK_V, LK, LV, NW, KW, IT, L2_FETCH)
                else:
                    _ring_copy(n0, pk, pa, page_size, k_base, v_base, s_kp, s_vp, off_k, off_va, off_vb, k_ring,
                               va_ring, vb_ring, 0, TOK_K, TOK_V, LK, LV, NW, KW, IT)
                for r in gl.static_range(1, RING - 1):
                    pk_r, pa_r = _warp_pages(n0 + r * BLOCK_N, last, bt_row, page_shift, LK, LV, NW, KW)
                    if PRING:
                        _pring_copy(n0 + r * BLOCK_N, pk_r, pa_r, page_size, k_base, v_base, s_kp, s_vp, off_k, off_va,
                                    off_vb, ring, sk, sva, svb, r, TOK_K, TOK_V, LK, LV, NW, KW, IT, L2_FETCH)
                    else:
                        _ring_copy(n0 + r * BLOCK_N, pk_r, pa_r, page_size, k_base, v_base, s_kp, s_vp, off_k, off_va,
                                   off_vb, k_ring, va_ring, vb_ring, r, TOK_K, TOK_V, LK, LV, NW, KW, IT)
                pk_c, pa_c = _warp_pages(n0 + (RING - 1) * BLOCK_N, last, bt_row, page_shift, LK, LV, NW, KW)
            else:
                if EARLY:  # not yet checked: read inside the cache whatever the ids (the words are dropped if bad)
                    pk = gl.minimum(gl.maximum(pk, 0), num_pages - 1)
                    pa = gl.minimum(gl.maximum(pa, 0), num_pages - 1)
                kw, ks = _k_words_paged(n0, pk, page_size, k_base, ks_base, s_kp, s_ksp, off_k, off_ks, TOK_K, TOK_KS,
                                        LK, NW, KW, IT, L2_FETCH, SF_FETCH)
                va, vb, vsa, vsb = _v_words_paged(n0, pa, page_size, v_base, vs_base, s_vp, s_vsp, off_va, off_vb,
                                                  off_vsa, off_vsb, TOK_V, TOK_VS, LV, NW, KW, IT, L2_FETCH, SF_FETCH)
                if L2_AHEAD > 0:
                    # tiles 2 .. L2_AHEAD - 1 asked of L2 now (tile 1 is loaded in step 0, tile L2_AHEAD there too), and
                    # the page ids of tile L2_AHEAD
                    for r in gl.static_range(2, L2_AHEAD):
                        _l2_prefetch(n0 + r * BLOCK_N, _prefetch_pages(n0 + r * BLOCK_N, last, bt_row, page_shift, NW, KW),
                                     page_size, k_base, v_base, ks_base, vs_base, s_kp, s_vp, s_ksp, s_vsp, TOK_K, TOK_V,
                                     TOK_KS, TOK_VS, NW, KW, IT)
                    pq = _prefetch_pages(n0 + L2_AHEAD * BLOCK_N, last, bt_row, page_shift, NW, KW)
                if L2_BULK > 0:
                    # the tiles 2 .. L2_BULK - 1 of this program's turns asked of L2 now, and the page ids of tile
                    # L2_BULK
                    b_at, b_sp, b_tok, b_n, b_turns = _bulk_lanes(
                        kvh, num_kv_heads, k_ptr, v_ptr, ks_ptr, vs_ptr, s_kp, s_vp, s_ksp, s_vsp,
                        gl.to_tensor(stride_kh).to(gl.int64) * DATA_ALIGN, gl.to_tensor(stride_vh).to(gl.int64) * DATA_ALIGN,
                        gl.to_tensor(stride_ksh).to(gl.int64) * SF_ALIGN, gl.to_tensor(stride_vsh).to(gl.int64) * SF_ALIGN,
                        TOK_K, TOK_V, TOK_KS, TOK_VS, NW, KW,
                    )
                    # the programs of a chunk's KV heads take turns where one span holds all their rows (NHD): this
                    # one asks for the tiles j with j - b_begin = kvh (mod turns) in step j - L2_BULK (b_turn counts
                    # down to the next); with HND every program asks for its own rows of every tile
                    b_turn = kvh % b_turns
                    for r in gl.static_range(2, L2_BULK):
                        if (r - b_turn) % b_turns == 0:
                            _l2_bulk(n0 + r * BLOCK_N, _prefetch_pages(n0 + r * BLOCK_N, last, bt_row, page_shift, NW, KW),
                                     page_size, b_at, b_sp, b_tok, b_n, NW, KW)
                    b_turn = (b_turn - L2_BULK % b_turns + b_turns) % b_turns
                    pq = _prefetch_pages(n0 + L2_BULK * BLOCK_N, last, bt_row, page_shift, NW, KW)
            pk, pa = _warp_pages(n0 + (2 if RING_PAIRS or SCALES2 else 1) * BLOCK_N, last, bt_row, page_shift, LK, LV,
                                 NW, KW)
        else:
            pk, pa, pb = _tile_pages(n0, end_key, bt_row, page_size, page_shift, LK, LV, NW, KW, PAGE_POW2, PAGE_EVEN)
            kw, ks, va, vb, vsa, vsb = _tile_words(
                n0, end_key, pk, pa, pb, page_size, page_shift, num_pages, k_base, v_base, ks_base, vs_base,
                s_kp, s_kt, s_vp, s_vt, s_ksp, s_kst, s_vsp, s_vst, LK, LV, NW, KW, PAGE_POW2, PAGE_EVEN, OFF32, LEAN,
            )
            pk, pa, pb = _tile_pages(
                n0 + BLOCK_N, end_key, bt_row, page_size, page_shift, LK, LV, NW, KW, PAGE_POW2, PAGE_EVEN
            )
        # EARLY: the range's page ids, now that its first tile's words are on their way (PAGE_TILE: pages of 2^n; a
        # constexpr, so the check exists only in EARLY builds)
        if EARLY:  # noqa: SIM102
            if _bad_pages(bt_row, n0 >> page_shift, last + 1, num_pages, NW) > 0:
                b_end = b_begin
        if SKEW:  # tile i's logits are computed in step i - 1 (the first before the loop)
            s_cur = _logits(q_op, kw, ks, MMA, LK, NW, KW, ROWS8, CVT8, KT, LEAN, IMAD_SHR)
        b_one = b_begin  # the first tile of the one-tile loop below
        if TILE_PAIRS:
            # two tiles i, i + 1 per step while two remain, one softmax update for both (_softmax_pv_kt2). A step starts
            # with tiles i's and i + 1's K words and tile i's V words (from the step before, or here for the first);
            # it loads tile i + 1's V words first, tiles i + 2's and i + 3's K words after tile i's and tile i + 1's
            # logits, and tile i + 2's V words after the P V: every load has about half a step or more to land (past
            # the range they read the range's last checked page). An odd last tile takes the one-tile loop below, with
            # its own words; what it loads ahead (past the range) is unused.
            kw1, ks1 = _k_words_paged(n0 + BLOCK_N, pk, page_size, k_base, ks_base, s_kp, s_ksp, off_k, off_ks,
                                      TOK_K, TOK_KS, LK, NW, KW, IT, L2_FETCH, SF_FETCH)
            pa1 = pa
            pk, pa = _warp_pages(n0 + 2 * BLOCK_N, last, bt_row, page_shift, LK, LV, NW, KW)
            for i in range(b_begin, b_end - 1, 2):
                n0 = kv_lo + i * BLOCK_N
                va1, vb1, vsa1, vsb1 = _v_words_paged(
                    n0 + BLOCK_N, pa1, page_size, v_base, vs_base, s_vp, s_vsp, off_va, off_vb, off_vsa, off_vsb,
                    TOK_V, TOK_VS, LV, NW, KW, IT, L2_FETCH, SF_FETCH,
                )
                s0 = _logits(q_op, kw, ks, MMA, LK, NW, KW, ROWS8, CVT8, KT, LEAN, IMAD_SHR)
                kw, ks = _k_words_paged(n0 + 2 * BLOCK_N, pk, page_size, k_base, ks_base, s_kp, s_ksp, off_k, off_ks,
                                        TOK_K, TOK_KS, LK, NW, KW, IT, L2_FETCH, SF_FETCH)
                pa2 = pa
                pk, pa = _warp_pages(n0 + 3 * BLOCK_N, last, bt_row, page_shift, LK, LV, NW, KW)
                s1 = _logits(q_op, kw1, ks1, MMA, LK, NW, KW, ROWS8, CVT8, KT, LEAN, IMAD_SHR)
                kw1, ks1 = _k_words_paged(n0 + 3 * BLOCK_N, pk, page_size, k_base, ks_base, s_kp, s_ksp, off_k,
                                          off_ks, TOK_K, TOK_KS, LK, NW, KW, IT, L2_FETCH, SF_FETCH)
                pa1 = pa
                pk, pa = _warp_pages(n0 + 4 * BLOCK_N, last, bt_row, page_shift, LK, LV, NW, KW)
                acc, m_i, l_i = _softmax_pv_kt2(
                    acc, m_i, l_i, s0, s1, qk_scale2, softcap_pre, softcap_post,
                    va, vb, vsa, vsb, va1, vb1, vsa1, vsb1, MMA, NW, KW, HAS_SOFTCAP, CVT8, q_op.dtype, LEAN, IMAD_SHR,
                )
                va, vb, vsa, vsb = _v_words_paged(
                    n0 + 2 * BLOCK_N, pa2, page_size, v_base, vs_base, s_vp, s_vsp, off_va, off_vb, off_vsa, off_vsb,
                    TOK_V, TOK_VS, LV, NW, KW, IT, L2_FETCH, SF_FETCH,
                )
            b_one = b_end - (b_end - b_begin) % 2
        if RING_PAIRS:
            # two tiles i, i + 1 per step (an even count, above), their words through a ring of 4 tiles: tiles i + 2
            # and i + 3 are copied into the stages of tiles i - 2 and i - 1 (read in the step before) and their scales
            # loaded to registers, the next step's page ids loaded; then tiles i's and i + 1's copies are waited for
            # (2 groups stay in flight) and their words read back
            for i in range(b_begin, b_end, 2):
                n0 = kv_lo + i * BLOCK_N
                _ring_copy(n0 + 2 * BLOCK_N, pk, pa, page_size, k_base, v_base, s_kp, s_vp, off_k, off_va, off_vb, k_ring,
                           va_ring, vb_ring, (i - b_begin + 2) & 3, TOK_K, TOK_V, LK, LV, NW, KW, IT)
                _ring_copy(n0 + 3 * BLOCK_N, pk1, pa1, page_size, k_base, v_base, s_kp, s_vp, off_k, off_va, off_vb,
                           k_ring, va_ring, vb_ring, (i - b_begin + 3) & 3, TOK_K, TOK_V, LK, LV, NW, KW, IT)
                ks2, vsa2, vsb2 = _scales_paged(n0 + 2 * BLOCK_N, pk, pa, page_size, ks_base, vs_base, s_ksp, s_vsp,
                                                off_ks, off_vsa, off_vsb, TOK_KS, TOK_VS, LK, LV, NW, KW, IT)
                ks3, vsa3, vsb3 = _scales_paged(n0 + 3 * BLOCK_N, pk1, pa1, page_size, ks_base, vs_base, s_ksp, s_vsp,
                                                off_ks, off_vsa, off_vsb, TOK_KS, TOK_VS, LK, LV, NW, KW, IT)
                pk, pa = _warp_pages(n0 + 4 * BLOCK_N, last, bt_row, page_shift, LK, LV, NW, KW)
                pk1, pa1 = _warp_pages(n0 + 5 * BLOCK_N, last, bt_row, page_shift, LK, LV, NW, KW)
                async_copy.wait_group(2)
                st = (i - b_begin) & 3
                s0 = _logits(q_op, k_ring.index(st).load(LK), ks, MMA, LK, NW, KW, ROWS8, CVT8, KT, LEAN, IMAD_SHR)
                s1 = _logits(q_op, k_ring.index(st + 1).load(LK), ks1, MMA, LK, NW, KW, ROWS8, CVT8, KT, LEAN,
                             IMAD_SHR)
                acc, m_i, l_i = _softmax_pv_kt2(
                    acc, m_i, l_i, s0, s1, qk_scale2, softcap_pre, softcap_post,
                    va_ring.index(st).load(LV), vb_ring.index(st).load(LV), vsa, vsb,
                    va_ring.index(st + 1).load(LV), vb_ring.index(st + 1).load(LV), vsa1, vsb1,
                    MMA, NW, KW, HAS_SOFTCAP, CVT8, q_op.dtype, LEAN, IMAD_SHR,
                )
                ks, vsa, vsb = ks2, vsa2, vsb2
                ks1, vsa1, vsb1 = ks3, vsa3, vsb3
        if not RING_PAIRS:  # the one-tile loop (with PAIR, an odd last tile)
            for i in range(b_one, b_end):
                n0 = kv_lo + i * BLOCK_N
                if RING > 0:
                    # copy tile i + RING - 1 into the stage tile i - 1 held; tile i + SCALE_AHEAD's scales to registers;
                    # the next step's page ids; then wait for tile i's copies and read its words back
                    if PRING:
                        _pring_copy(n0 + (RING - 1) * BLOCK_N, pk_c, pa_c, page_size, k_base, v_base, s_kp, s_vp, off_k,
                                    off_va, off_vb, ring, sk, sva, svb, (i - b_begin + RING - 1) % RING, TOK_K, TOK_V, LK,
                                    LV, NW, KW, IT, L2_FETCH)
                    else:
                        _ring_copy(n0 + (RING - 1) * BLOCK_N, pk_c, pa_c, page_size, k_base, v_base, s_kp, s_vp, off_k,
                                   off_va, off_vb, k_ring, va_ring, vb_ring, (i - b_begin + RING - 1) % RING, TOK_K, TOK_V,
                                   LK, LV, NW, KW, IT)
                    ks_n, vsa_n, vsb_n = _scales_paged(n0 + SCALE_AHEAD * BLOCK_N, pk, pa, page_size, ks_base, vs_base,
                                                       s_ksp, s_vsp, off_ks, off_vsa, off_vsb, TOK_KS, TOK_VS, LK, LV, NW,
                                                       KW, IT)
                    pk, pa = _warp_pages(n0 + PAGES_AHEAD * BLOCK_N, last, bt_row, page_shift, LK, LV, NW, KW)
                    if RING == PAGES_AHEAD:
                        pk_c, pa_c = pk, pa
                    else:
                        pk_c, pa_c = _warp_pages(n0 + RING * BLOCK_N, last, bt_row, page_shift, LK, LV, NW, KW)
                    st = (i - b_begin) % RING
                    if PRING:
                        _pring_sync(_pring_group_text(RING - 1), NW)
                        kw, va, vb = _pring_read(ring, sk, sva, svb, st, NW, KW)
                    else:
                        async_copy.wait_group(RING - 1)
                        kw = k_ring.index(st).load(LK)
                        va = va_ring.index(st).load(LV)
                        vb = vb_ring.index(st).load(LV)
                    acc, m_i, l_i = _attend(
                        acc, m_i, l_i, q_op, qpos, n0, kv_hi, window, qk_scale2, softcap_pre, softcap_post,
                        bt_row, page_size, page_shift, num_pages, kw, ks, va, vb, vsa, vsb,
                        MMA, LK, NW, KW, False, CAUSAL, WINDOW_ROWS, HAS_SOFTCAP, PAGE_POW2, ROWS8, CVT8, KT, LEAN,
                        IMAD_SHR, LAZY,
                    )
                    if SCALES2:
                        ks, vsa, vsb = ks1, vsa1, vsb1
                        ks1, vsa1, vsb1 = ks_n, vsa_n, vsb_n
                    else:
                        ks, vsa, vsb = ks_n, vsa_n, vsb_n
                else:
                    if PAGE_TILE:
                        if L2_AHEAD > 0:  # tile i + L2_AHEAD asked of L2; the page ids of the one after it
                            _l2_prefetch(n0 + L2_AHEAD * BLOCK_N, pq, page_size, k_base, v_base, ks_base, vs_base, s_kp,
                                         s_vp, s_ksp, s_vsp, TOK_K, TOK_V, TOK_KS, TOK_VS, NW, KW, IT)
                            pq = _prefetch_pages(n0 + (L2_AHEAD + 1) * BLOCK_N, last, bt_row, page_shift, NW, KW)
                        if L2_BULK > 0:  # tile i + L2_BULK where it is this program's turn; the page ids of the next
                            if b_turn == 0:
                                _l2_bulk(n0 + L2_BULK * BLOCK_N, pq, page_size, b_at, b_sp, b_tok, b_n, NW, KW)
                            b_turn = gl.where(b_turn == 0, b_turns, b_turn) - 1
                            pq = _prefetch_pages(n0 + (L2_BULK + 1) * BLOCK_N, last, bt_row, page_shift, NW, KW)
                        # the next tile's K words here, its V words here or (V_LATE) after this tile's P V (below)
                        kw_n, ks_n = _k_words_paged(n0 + BLOCK_N, pk, page_size, k_base, ks_base, s_kp, s_ksp, off_k,
                                                    off_ks, TOK_K, TOK_KS, LK, NW, KW, IT, L2_FETCH, SF_FETCH)
                        if not V_LATE:
                            va_n, vb_n, vsa_n, vsb_n = _v_words_paged(
                                n0 + BLOCK_N, pa, page_size, v_base, vs_base, s_vp, s_vsp, off_va, off_vb, off_vsa, off_vsb,
                                TOK_V, TOK_VS, LV, NW, KW, IT, L2_FETCH, SF_FETCH,
                            )
                        pa_n = pa
                        pk, pa = _warp_pages(n0 + 2 * BLOCK_N, last, bt_row, page_shift, LK, LV, NW, KW)
                    else:
                        kw_n, ks_n, va_n, vb_n, vsa_n, vsb_n = _tile_words(
                            n0 + BLOCK_N, end_key, pk, pa, pb, page_size, page_shift, num_pages,
                            k_base, v_base, ks_base, vs_base, s_kp, s_kt, s_vp, s_vt, s_ksp, s_kst, s_vsp, s_vst,
                            LK, LV, NW, KW, PAGE_POW2, PAGE_EVEN, OFF32, LEAN,
                        )
                        pk, pa, pb = _tile_pages(
                            n0 + 2 * BLOCK_N, end_key, bt_row, page_size, page_shift, LK, LV, NW, KW, PAGE_POW2, PAGE_EVEN
                        )
                    if SKEW:
                        acc, m_i, l_i = _softmax_pv(
                            acc, m_i, l_i, s_cur, qpos, n0, kv_hi, window, qk_scale2, softcap_pre, softcap_post,
                            bt_row, page_size, page_shift, num_pages, va, vb, vsa, vsb,
                            MMA, NW, KW, False, CAUSAL, WINDOW_ROWS, HAS_SOFTCAP, PAGE_POW2, ROWS8, CVT8, KT, LEAN,
                            q_op.dtype, IMAD_SHR, LAZY,
                        )
                        # the next tile's logits (past the range its words are zeros, or with PAGE_TILE a checked page's,
                        # and these logits go unused)
                        s_cur = _logits(q_op, kw_n, ks_n, MMA, LK, NW, KW, ROWS8, CVT8, KT, LEAN, IMAD_SHR)
                    else:
                        acc, m_i, l_i = _attend(
                            acc, m_i, l_i, q_op, qpos, n0, kv_hi, window, qk_scale2, softcap_pre, softcap_post,
                            bt_row, page_size, page_shift, num_pages, kw, ks, va, vb, vsa, vsb,
                            MMA, LK, NW, KW, False, CAUSAL, WINDOW_ROWS, HAS_SOFTCAP, PAGE_POW2, ROWS8, CVT8, KT, LEAN,
                            IMAD_SHR, LAZY,
                        )
                        kw, ks = kw_n, ks_n
                    if V_LATE:
                        # in source after the P V that reads this tile's V words, so that the next tile's take their
                        # registers (no copy at the loop's end; ptxas still issues these loads mid-step, once the current
                        # words are decoded)
                        va, vb, vsa, vsb = _v_words_paged(
                            n0 + BLOCK_N, pa_n, page_size, v_base, vs_base, s_vp, s_vsp, off_va, off_vb, off_vsa, off_vsb,
                            TOK_V, TOK_VS, LV, NW, KW, IT, L2_FETCH, SF_FETCH,
                        )
                    else:
                        va, vb, vsa, vsb = va_n, vb_n, vsa_n, vsb_n
        if PRING:  # the copies past the range (their words unused) land before the program ends
            _pring_sync(_pring_group_text(0), NW)
        elif RING > 0:  # the copies past the range (their words unused) land before the ring's memory is reused
            async_copy.wait_group(0)
    # masked tiles from the causal diagonal / sequence end on
    c_begin = gl.maximum(b_begin, b_end)
    for i in range(c_begin, t_end):
        n0 = kv_lo + i * BLOCK_N
        pk, pa, pb = _tile_pages(n0, kv_hi, bt_row, page_size, page_shift, LK, LV, NW, KW, PAGE_POW2, PAGE_EVEN)
        kw, ks, va, vb, vsa, vsb = _tile_words(
            n0, kv_hi, pk, pa, pb, page_size, page_shift, num_pages, k_base, v_base, ks_base, vs_base,
            s_kp, s_kt, s_vp, s_vt, s_ksp, s_kst, s_vsp, s_vst, LK, LV, NW, KW, PAGE_POW2, PAGE_EVEN, OFF32,
        )
        acc, m_i, l_i = _attend(
            acc, m_i, l_i, q_op, qpos, n0, kv_hi, window, qk_scale2, softcap_pre, softcap_post,
            bt_row, page_size, page_shift, num_pages, kw, ks, va, vb, vsa, vsb,
            MMA, LK, NW, KW, True, CAUSAL, WINDOW_ROWS, HAS_SOFTCAP, PAGE_POW2, ROWS8, CVT8, KT, LEAN, IMAD_SHR,
        )

    if PDL == 2:
        gdc_launch_dependents()
    if DEFER_SUM:
        l_i = gl.sum(l_i, 1 if KT else 2)
    # merge the warps' states, then store rows R (16, or 8 with ROWS8) from a plain layout
    R: gl.constexpr = 8 if ROWS8 else 16
    # SMEM_MERGE: [NW, R, 128] with the warps' axis in each thread (_warps_merged), o in its slice
    LE: gl.constexpr = gl.BlockedLayout([NW, 1, 4], [1, 1, 32], [1, NW, 1], [2, 1, 0])
    LO: gl.constexpr = gl.SliceLayout(0, LE) if SMEM_MERGE else gl.BlockedLayout([1, 4], [4, 8], [1, NW], [1, 0])
    LR: gl.constexpr = gl.SliceLayout(1, LO)
    if SMEM_MERGE:  # one pass through shared memory; o [R, 128] in head-dim order
        o, m, l_sum = _warps_merged(acc, m_i, l_i, LE, NW, R, HEAD_DIM, ROWS8)
    else:
        m = gl.max(m_i, 0)
        m_safe = _finite(m)
        wgt = gl.exp2(m_i - gl.expand_dims(m_safe, 0))
        l_sum = gl.sum(l_i * wgt, 0)
        if ROWS8:
            w8 = gl.convert_layout(wgt, gl.SliceLayout(1, MMA))
            o = gl.convert_layout(gl.permute(gl.sum(acc * gl.expand_dims(w8, 1), 0), (1, 0)), LO)
        else:
            o = gl.convert_layout(gl.sum(acc * gl.expand_dims(wgt, 2), 0), LO)
    m1 = gl.convert_layout(m, LR)
    l1 = gl.convert_layout(l_sum, LR)
    ro = _iota(R, LO, 2, 0)
    no = _iota(HEAD_DIM, LO, 2, 1)
    if SMEM_MERGE:
        dim_o = no
    else:  # o [R, 128]: column n holds head dim 16 (n % 8) + n // 8
        dim_o = 16 * (no % 8) + no // 8
    to = ro // group
    head_o = kvh * group + ro % group
    ok_o = (to < q_len) & (no >= 0)
    r1 = gl.arange(0, R, layout=LR)
    t1 = r1 // group
    head1 = kvh * group + r1 % group
    ok1 = t1 < q_len
    tok1 = q_start + t1
    if n_chunks == 1:
        m_fin, w_fin, l_tot = _fold_sinks(m1, l1, sinks_ptr, head1, ok1, HAS_SINKS)
        l_safe = gl.where(l_tot > 0.0, l_tot, 1.0)
        out = o * gl.expand_dims(w_fin * vs_g / l_safe, 1)
        o_row = o_ptr + (q_start + to).to(gl.int64) * stride_ot + head_o.to(gl.int64) * stride_oh
        gl.store(o_row + dim_o, out.to(o_ptr.dtype.element_ty), mask=ok_o)
        if RETURN_LSE:
            lse = gl.where(l_tot > 0.0, (m_fin + gl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
            gl.store(lse_ptr + tok1.to(gl.int64) * stride_lt + head1, lse, mask=ok1)
    else:
        l_safe = gl.where(l1 > 0.0, l1, 1.0)
        lse2 = gl.where(l1 > 0.0, m1 + gl.log2(l_safe), float("-inf"))
        out = o * gl.expand_dims(vs_g / l_safe, 1)
        prow = ((slot0 + j).to(gl.int64) * num_qo_heads + head_o) * QMAX + to
        gl.store(part_o_ptr + prow * HEAD_DIM + dim_o, out, mask=ok_o)
        prow1 = ((slot0 + j).to(gl.int64) * num_qo_heads + head1) * QMAX + t1
        gl.store(part_lse_ptr + prow1, lse2, mask=ok1)
        if FUSED_MERGE:
            # count this chunk in once every thread's partials are stored (a barrier, then one acquire-release
            # atomic at GPU scope); the last chunk of the request and KV head sets the counter back to 0 for the next
            # launch and merges
            _cta_barrier()
            cnt = counter_ptr + b.to(gl.int64) * num_kv_heads + kvh
            done = gl.atomic_add(cnt, 1, sem="acq_rel")
            if done == n_chunks - 1:
                gl.store(cnt, 0)
                _merge_last(
                    part_o_ptr, part_lse_ptr, o_ptr, lse_ptr, sinks_ptr, slot0, n_chunks, num_qo_heads, kvh, group,
                    q_start, q_len, stride_ot, stride_oh, stride_lt, R, QMAX, HEAD_DIM, NW, HAS_SINKS, RETURN_LSE,
                )


def gluon_decode_eligible(
    head_dim: int, block_m: int, rotate: bool, query_dtype, data_align: int, sf_align: int,
) -> bool:
    """Whether a decode launch can take :func:`gluon_decode_kernel` (else the plain-Triton kernel).

    What the kernel serves: bf16 or fp16 queries, head_dim 128, at most 16 rows (``G x q_len``), no rotation,
    cache rows on 16-byte boundaries and scale rows on 2-byte ones (vLLM's page at head_dim 128 has both); every feature
    of the decode contract within that (sliding windows, soft-cap, sinks, LSE, any page size, NHD/HND, the decode rows
    of a varlen prefill batch, the merge kernel or the fused merge). All of these but the fused merge passed the GPU
    tier on an H200 (``tests/kernels/test_gpu_decode_gluon.py``, run L). The fused merge's first form failed its GPU
    tests on an H100 (run Z: empty requests' rows, the capture stream's counters); its fixed form passed them there
    (run AA), once their graph-replay comparison allowed for the merge kernel's other order of the fp32 sums.
    """
    served = (
        head_dim == 128 and block_m == 16 and not rotate and query_dtype in (torch.bfloat16, torch.float16)
        and data_align >= 16 and sf_align >= 2
    )
    return served

