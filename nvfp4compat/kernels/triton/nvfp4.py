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

    The sign bit is ``signbit(v)`` (``-0.0`` gives 8); NaN gives magnitude 0.
    """
    mag = tl.abs(v)
    code = (
        (mag > 0.25).to(tl.int32)
        + (mag >= 0.75).to(tl.int32)
        + (mag > 1.25).to(tl.int32)
        + (mag >= 1.75).to(tl.int32)
        + (mag > 2.5).to(tl.int32)
        + (mag >= 3.5).to(tl.int32)
        + (mag > 5.0).to(tl.int32)
    )
    sign = (v.to(tl.int32, bitcast=True) >> 31) & 1
    return code | (sign << 3)


@triton.jit
def e2m1_decode(code):
    """E2M1 code (int32 0..15) -> fp32 (code 8 decodes to -0.0).

    Built from bits, sign included: triton 3.6 lowers a float negation to ``0.0 - x``, which turns
    -(+0.0) into +0.0 and would lose the sign of code 8.
    """
    mag = code & 7
    e = mag >> 1
    m = mag & 1
    bits = tl.where(e == 0, m * 0x3F000000, ((e + 126) << 23) | (m << 22))  # 0x3F000000 = 0.5
    return (bits | ((code & 8) << 28)).to(tl.float32, bitcast=True)


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
