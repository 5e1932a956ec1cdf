"""Triton device functions that turn NVFP4 cache tiles into MMA operands.

A cache row of ``head_dim`` E2M1 values is ``head_dim/2`` bytes, even element in the low nibble. The
attention kernels never interleave nibbles: they split each tile into two *planes* ``[BLOCK_N, D/2]``,
``lo`` (elements ``0, 2, 4, ...``) and ``hi`` (elements ``1, 3, 5, ...``), and split the query the same
way, so ``q . k = q_lo . k_lo + q_hi . k_hi`` and ``p @ v = [p @ v_lo | p @ v_hi]`` (interleaved again
only when the output is stored). Plane column ``j`` of a row is scaled by block scale ``j // 8``.

Two decoders produce the same values, ``e2m1 * sf`` in the query dtype (exact in fp16 and bf16:
``|e2m1 * sf| in [2^-10, 2688]`` with at most 6 significant bits):

* :func:`planes_fast` (CUDA): FlashInfer's ``prmt`` LUT (``vec_dtypes.cuh``, ``e2m1x8_to_f16x8``) in
  inline PTX, four cache bytes (eight values) per call, ~12 integer ops per 8 values, then one packed
  ``mul.rn.f16x2`` / ``fma.rn.bf16x2`` per pair for the block scale. Every instruction exists on
  SM80+ (``fma.rn.bf16x2`` is SM80; ``mul.rn.bf16x2`` would need SM90, so it is not used).
* :func:`planes_portable`: integer arithmetic in plain Triton (fp32), what the CPU interpreter runs.

The interpreter cannot run inline PTX. Under ``TRITON_INTERPRET=1`` :func:`planes_fast` therefore
computes the same products (``e2m1 * sf`` in ``sf``'s dtype, with the fast path's scale encodings) in
plain Triton, so a CPU run with the fast path forced (``override_configs(fast_decode=True)``)
exercises everything around the PTX: the fp16 ``2^-8`` scale encoding and the places where its
``2^8`` must be folded back. The PTX text itself is checked bit for bit on the CPU by a small PTX
emulator in ``tests/kernels/test_attention.py``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nvfp4compat.kernels.triton import nvfp4
from nvfp4compat.kernels.validate import interpreting

# Inputs: $4 = four cache bytes (u8x4), $5/$6 = block scales of bytes (0, 1) / (2, 3) as f16x2.
# Outputs: $0/$1 = lo plane (elements 0,2 / 4,6), $2/$3 = hi plane (elements 1,3 / 5,7).
# `ha`/`hb` = fp16 high bytes of values 0..3 / 4..7 (the low bytes of every E2M1 value are 0 in fp16).
_ASM_F16_TEXT = """
{
.reg .b32 m, m16, ka, kb, ha, hb, x4, sa, sb, z, l0, l1, h0, h1;
mov.b32 ka, 0x3E3C3800;
mov.b32 kb, 0x46444240;
mov.b32 z, 0;
and.b32 m, $4, 0x77777777;
shr.b32 m16, m, 16;
prmt.b32 ha, ka, kb, m;
prmt.b32 hb, ka, kb, m16;
shl.b32 x4, $4, 4;
prmt.b32 sa, x4, $4, 0xD9C8;
prmt.b32 sb, x4, $4, 0xFBEA;
and.b32 sa, sa, 0x80808080;
and.b32 sb, sb, 0x80808080;
or.b32 ha, ha, sa;
or.b32 hb, hb, sb;
prmt.b32 l0, ha, z, 0x2404;
prmt.b32 l1, hb, z, 0x2404;
prmt.b32 h0, ha, z, 0x3414;
prmt.b32 h1, hb, z, 0x3414;
mul.rn.f16x2 $0, l0, $5;
mul.rn.f16x2 $1, l1, $6;
mul.rn.f16x2 $2, h0, $5;
mul.rn.f16x2 $3, h1, $6;
}
"""

# bf16: E2M1 values have non-zero low bytes, so a second table gives them; `fma.rn.bf16x2 .., -0`
# is an exact multiply on SM80+ (adding -0.0 leaves every product, including -0.0, unchanged).
_ASM_BF16_TEXT = """
{
.reg .b32 m, m16, ka, kb, kc, kd, ha, hb, la, lb, x4, sa, sb, nz, l0, l1, h0, h1;
mov.b32 ka, 0x3F3F3F00;
mov.b32 kb, 0x40404040;
mov.b32 kc, 0xC0800000;
mov.b32 kd, 0xC0804000;
mov.b32 nz, 0x80008000;
and.b32 m, $4, 0x77777777;
shr.b32 m16, m, 16;
prmt.b32 ha, ka, kb, m;
prmt.b32 hb, ka, kb, m16;
prmt.b32 la, kc, kd, m;
prmt.b32 lb, kc, kd, m16;
shl.b32 x4, $4, 4;
prmt.b32 sa, x4, $4, 0xD9C8;
prmt.b32 sb, x4, $4, 0xFBEA;
and.b32 sa, sa, 0x80808080;
and.b32 sb, sb, 0x80808080;
or.b32 ha, ha, sa;
or.b32 hb, hb, sb;
prmt.b32 l0, la, ha, 0x6240;
prmt.b32 l1, lb, hb, 0x6240;
prmt.b32 h0, la, ha, 0x7351;
prmt.b32 h1, lb, hb, 0x7351;
fma.rn.bf16x2 $0, l0, $5, nz;
fma.rn.bf16x2 $1, l1, $6, nz;
fma.rn.bf16x2 $2, h0, $5, nz;
fma.rn.bf16x2 $3, h1, $6, nz;
}
"""

_ASM_F16 = tl.constexpr(_ASM_F16_TEXT)
_ASM_BF16 = tl.constexpr(_ASM_BF16_TEXT)
# Fixed at import, as Triton fixes interpreter vs compiler when `@triton.jit` runs: a compiled kernel
# always takes the inline-PTX branch of `planes_fast`.
_INTERPRETED = tl.constexpr(interpreting())


@triton.jit
def broadcast_scales(sf, D2: tl.constexpr, D16: tl.constexpr, BLOCK_N: tl.constexpr):
    """``[BLOCK_N, D/16]`` block scales -> ``[BLOCK_N, D/2]``: plane column ``j`` gets scale ``j // 8``."""
    return tl.reshape(tl.broadcast_to(sf[:, :, None], (BLOCK_N, D16, 8)), (BLOCK_N, D2))


@triton.jit
def scales_f32(sf_byte):
    """E4M3 block-scale bytes (uint8) -> fp32, exactly, with integer arithmetic (builds for SM80/86).

    ``(b & 0x7F) << 20`` is the fp32 pattern of ``sf * 2^-120`` (a subnormal for E4M3 subnormals);
    one IEEE multiply by ``2^120`` (no flush-to-zero) gives ``sf``. Scales are non-negative.
    """
    bits = (sf_byte.to(tl.int32) & 0x7F) << 20
    return bits.to(tl.float32, bitcast=True) * 1.329227995784916e36


@triton.jit
def scales_f16_scaled(sf_byte):
    """E4M3 block-scale bytes -> fp16 ``sf * 2^-8`` exactly (``(b & 0x7F) << 7``; fp16 subnormals
    for the smallest scales). ``e2m1 * sf * 2^-8`` is then a multiple of ``2^-18`` below ``10.5``:
    exact in fp16, so the kernels fold the ``2^8`` into the global scales."""
    return ((sf_byte.to(tl.int16) & 0x7F) << 7).to(tl.float16, bitcast=True)


@triton.jit
def planes_fast(byte, sf):
    """Cache bytes ``[N, D/2]`` uint8 and broadcast scales ``[N, D/2]`` (fp16 or bf16) -> ``(lo, hi)``.

    CUDA: inline PTX; both planes in ``sf``'s dtype, ``e2m1 * sf`` exactly. Under the interpreter the
    same exact products are computed in plain Triton (:func:`_planes_fast_emulated`).
    """
    if _INTERPRETED:
        lo, hi = _planes_fast_emulated(byte, sf)
    elif sf.dtype == tl.bfloat16:
        lo, hi = tl.inline_asm_elementwise(
            _ASM_BF16, "=r,=r,=r,=r,r,r,r", [byte, sf], dtype=(tl.bfloat16, tl.bfloat16),
            is_pure=True, pack=4,
        )
    else:
        lo, hi = tl.inline_asm_elementwise(
            _ASM_F16, "=r,=r,=r,=r,r,r,r", [byte, sf], dtype=(tl.float16, tl.float16),
            is_pure=True, pack=4,
        )
    return lo, hi


@triton.jit
def _planes_fast_emulated(byte, sf):
    """What the PTX computes, for the interpreter: ``e2m1 * sf`` rounded to ``sf``'s dtype (exact)."""
    b = byte.to(tl.int32)
    s = sf.to(tl.float32)
    lo = nvfp4.e2m1_decode(b & 15) * s
    hi = nvfp4.e2m1_decode(b >> 4) * s
    return lo.to(sf.dtype), hi.to(sf.dtype)


@triton.jit
def planes_portable(byte, sf32, DTYPE: tl.constexpr):
    """Portable decoder: ``byte`` uint8 ``[N, D/2]``, ``sf32`` fp32 ``[N, D/2]`` -> ``(lo, hi)`` in ``DTYPE``."""
    b = byte.to(tl.int32)
    lo = nvfp4.e2m1_decode(b & 15) * sf32
    hi = nvfp4.e2m1_decode(b >> 4) * sf32
    return lo.to(DTYPE), hi.to(DTYPE)
