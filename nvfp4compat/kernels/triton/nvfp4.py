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

    The sign is ``signbit(v)`` (``-0.0`` gives 8); NaN gives magnitude 0.

    From ``|v| >= 1`` on, the codes are fp32's own exponent and top mantissa bit: rounding the fp32
    mantissa to one bit (``+ 0x1FFFFF`` plus the kept bit: ties to even, carrying into the exponent)
    and taking bits 30..22 gives ``code + 252``. Below 1 the grid is the subnormal 0, 0.5, 1.0 (codes
    0-2): two comparisons, ties 0.25 and 0.75 going to the even code.
    """
    mag = tl.abs(v)
    bits = tl.minimum(mag, 6.0).to(tl.int32, bitcast=True)
    normal = ((bits + 0x1FFFFF + ((bits >> 22) & 1)) >> 22) - 252
    sub = (mag > 0.25).to(tl.int32) + (mag >= 0.75).to(tl.int32)
    code = tl.where(mag < 1.0, sub, normal)
    code = tl.where(mag == mag, code, 0)  # NaN (min(NaN, 6) is 6 on the GPU, NaN in the interpreter)
    sign = (v.to(tl.int32, bitcast=True) >> 31) & 1
    return code | (sign << 3)


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
