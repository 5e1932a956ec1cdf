"""Shared Triton device functions for NVFP4: E2M1 and E4M3 encode/decode with integer arithmetic.

No ``tl.float8e4nv`` cast is used anywhere: those do not compile for SM80/SM86, so the E4M3 scale bytes
are encoded and decoded with integer bit arithmetic, which builds for every target (SM80-SM121) and runs
under ``TRITON_INTERPRET=1``. The semantics are those of :mod:`nvfp4compat.kernels.reference`.
"""

from __future__ import annotations

import triton
import triton.language as tl

FLT_MIN_NORMAL = 1.1754943508222875e-38


@triton.jit
def flush_denormal(x):
    """Flush fp32 values below the normal range to signed zero (FlashInfer's ftz build)."""
    return tl.where(tl.abs(x) < 1.1754943508222875e-38, x * 0.0, x)


@triton.jit
def e2m1_encode(v):
    """fp32 -> E2M1 code (int32 0..15): RNE with ties to the even code, saturating at 6.

    The sign is ``signbit(v)`` (``-0.0`` gives 8); NaN gives magnitude 0. See :func:`e2m1_encode_low`.
    """
    return e2m1_encode_low(v) & 15


@triton.jit
def e2m1_encode_low(v):
    """:func:`e2m1_encode` in the low four bits of an int32 whose higher bits are not zero.

    ``w = min(maxnum(|v|, 0), 6)`` (maxnum turns NaN into 0, on the GPU and in the interpreter). Each
    of E2M1's three binades is an integer grid after one exact scaling: ``2w`` below 2, ``w`` in
    [2, 4), ``w/2`` in [4, 6]. Adding ``2^23`` (plus the binade's first code) rounds that scaled value
    to an integer with one IEEE round-to-nearest-even, which lands ties on the even code, and leaves the
    pattern ``0x4B000000 + code``: three multiply-adds and two selects per element, no integer rounding
    arithmetic (the products are exact, so ``fma`` and ``mul`` + ``add`` agree). The sign adds 8.

    A writer packs two of these as ``lo + (hi << 4)`` and keeps the low byte: ``0x4B000000`` has a
    zero low byte, so the byte is exactly ``code_lo | code_hi << 4`` without masking either.
    """
    w = tl.minimum(tl.maximum(tl.abs(v), 0.0), 6.0)
    # 2^23 + rint(2w) (codes 0..4), 2^23 + 2 + rint(w) (4..6), 2^23 + 4 + rint(w/2) (6, 7)
    p = tl.where(
        w < 2.0, w * 2.0 + 8388608.0, tl.where(w < 4.0, w + 8388610.0, w * 0.5 + 8388612.0)
    )
    sign = (v.to(tl.uint32, bitcast=True) >> 31).to(tl.int32, bitcast=True)
    return p.to(tl.int32, bitcast=True) + (sign << 3)


@triton.jit
def mul_ftz(a, b):
    """``mul.ftz.f32``: a product that flushes subnormal inputs and results to signed zero, as
    FlashInfer's ``-use_fast_math`` build multiplies (GPU only)."""
    return tl.inline_asm_elementwise(
        "mul.ftz.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32, is_pure=True, pack=1
    )


@triton.jit
def e2m1_decode(code):
    """E2M1 code (int32 0..15) -> fp32 (code 8 decodes to -0.0).

    ``(code & 7) << 22`` places E2M1's two exponent bits and its mantissa bit at fp32 bits 24..22: the
    pattern of ``e2m1 * 2^-126`` (a subnormal for code 1, 0.5); one IEEE multiply by ``2^126`` gives
    the value exactly (triton emits ``mul.f32``: no flush-to-zero). The sign is OR-ed in as a bit:
    triton 3.6 lowers a float negation to ``0.0 - x``, which would turn code 8 into +0.0.
    """
    bits = ((code & 7) << 22) | ((code & 8) << 28)
    return bits.to(tl.float32, bitcast=True) * 8.507059173023462e37  # 2^126


@triton.jit
def e4m3_encode(f):
    """Non-negative fp32 (or +inf) -> float8_e4m3fn byte as int32: RNE, saturating at 448."""
    f = tl.minimum(f, 448.0)
    bits = f.to(tl.int32, bitcast=True)
    rounded = bits + 0x7FFFF + ((bits >> 20) & 1)
    normal = (rounded >> 20) - (120 << 3)
    # E4M3 subnormals are multiples of 2^-9: round f * 512 to the nearest even integer.
    sub = ((f * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)
    return tl.where(f < 0.015625, sub, normal)


@triton.jit
def e4m3_encode_cvt(f):
    """:func:`e4m3_encode` with the hardware conversion (``cvt.rn.satfinite.e4m3x2.f32``): SM89+ only.

    Same bytes for every input the writer passes (non-negative fp32 or +inf, never NaN): RNE,
    saturating at 448, fp32 subnormals to 0 (they are far below E4M3's smallest subnormal, 2^-9).
    """
    return f.to(tl.float8e4nv).to(tl.uint8, bitcast=True).to(tl.int32)


@triton.jit
def e4m3_decode_cvt(byte):
    """:func:`e4m3_decode` of a non-negative, non-NaN scale byte with the hardware conversion
    (``cvt.rn.f16x2.e4m3x2``, exact): SM89+ only."""
    return byte.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)


@triton.jit
def e4m3_decode(byte):
    """float8_e4m3fn byte (int32 0..255) -> fp32. (0x7F/0xFF, NaN in E4M3, decode as +-480.)

    The sign is OR-ed in as a bit (0x80 decodes to -0.0): triton 3.6 lowers ``-x`` to ``0.0 - x``.
    """
    e = (byte >> 3) & 15
    m = byte & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    v = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)
    return (v.to(tl.int32, bitcast=True) | ((byte & 0x80) << 24)).to(tl.float32, bitcast=True)


@triton.jit
def div_approx(a, b):
    """``div.approx.ftz.f32``: what ``a / b`` compiles to under nvcc ``-use_fast_math`` (GPU only)."""
    return tl.inline_asm_elementwise(
        "div.approx.ftz.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32, is_pure=True, pack=1
    )


@triton.jit
def rcp_approx(a):
    """``rcp.approx.ftz.f32``: what ``1.0f / a`` compiles to under nvcc ``-use_fast_math`` (GPU only)."""
    return tl.inline_asm_elementwise(
        "rcp.approx.ftz.f32 $0, $1;", "=r,r", [a], dtype=tl.float32, is_pure=True, pack=1
    )
