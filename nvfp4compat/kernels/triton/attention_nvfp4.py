"""Triton device functions that turn NVFP4 cache tiles into MMA operands.

A cache row of ``head_dim`` E2M1 values is ``head_dim/2`` bytes, even element in the low nibble. The
attention kernels never interleave nibbles: they split each tile into two *planes* ``[BLOCK_N, D/2]``,
``lo`` (elements ``0, 2, 4, ...``) and ``hi`` (elements ``1, 3, 5, ...``), and split the query the same
way, so ``q . k = q_lo . k_lo + q_hi . k_hi`` and ``p @ v = [p @ v_lo | p @ v_hi]`` (interleaved again
only when the output is stored). Plane column ``j`` of a row is scaled by block scale ``j // 8``.

Three decoders produce the same values, ``e2m1 * sf`` in the query dtype (exact in fp16 and bf16:
``|e2m1 * sf| in [2^-10, 2688]`` with at most 6 significant bits); the fp16 table decoder and the
bf16 bit-placement decoder give them times ``2^-8``, which the kernels fold into the global scales:

* :func:`planes_fast` (CUDA): FlashInfer's ``prmt`` LUT (``vec_dtypes.cuh``, ``e2m1x8_to_f16x8``) in
  inline PTX, four cache bytes (eight values) per call, ~12 integer ops per 8 values, then one packed
  ``mul.rn.f16x2`` / ``fma.rn.bf16x2`` per pair for the block scale. Every instruction exists on
  SM80+ (``fma.rn.bf16x2`` is SM80; ``mul.rn.bf16x2`` would need SM90, so it is not used).
* bf16 only, opt-in (``override_configs(decoder="bitwise")``): the bit-placement decode vLLM's Marlin
  kernels use for FP4 weights. Two ``prmt`` spread four bytes over the high bytes of 16-bit lanes,
  then per register ``(r & 0x80008000) | (r >> 6 & 0x01C001C0)`` (high nibbles) and
  ``(r << 4 | r >> 2) & 0x81C081C0`` (low nibbles) put each value's sign, exponent and mantissa bits
  where bf16 has them: the bf16 pattern of ``e2m1 * 2^-126`` (a bf16 subnormal for the codes +-0.5), with no table
  constants. The block scale is passed as ``sf * 2^118`` (bf16, normal and exact: at most
  ``448 * 2^118``), so the one packed multiply per pair gives ``e2m1 * sf * 2^-8``, exact and normal,
  and the kernels fold the ``2^8`` into the global scales as for fp16. 18 instructions per 8 values
  where the table decode takes about 22; it relies on the bf16 multiply taking subnormal operands
  exactly (PTX has no ``.ftz`` for bf16; vLLM's Marlin FP4-to-bf16 dequantization,
  ``csrc/quantization/marlin/dequant.h``, relies on the same). Not yet run on a GPU, hence not the
  default.
* :func:`planes_portable`: integer arithmetic in plain Triton (fp32), what the CPU interpreter runs.

The interpreter cannot run inline PTX. Under ``TRITON_INTERPRET=1`` :func:`planes_fast` therefore
computes the same products (``e2m1 * sf`` in ``sf``'s dtype, with the fast path's scale encodings) in
plain Triton, so a CPU run with the fast path forced (``override_configs(decoder="table")``)
exercises everything around the PTX: the fp16 ``2^-8`` scale encoding and the places where its
``2^8`` must be folded back. The PTX text itself is checked bit for bit on the CPU by a small PTX
emulator in ``tests/kernels/test_attention.py``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nvfp4compat.kernels.checks import interpreting
from nvfp4compat.kernels.triton import nvfp4

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

# bf16, bit placement (see the module docstring). $4 = four cache bytes; $5/$6 = `sf * 2^118` of
# bytes (0, 1)/(2, 3) as bf16x2. r0/r1 = bytes (0, 1)/(2, 3) in the high byte of each 16-bit lane,
# low bytes zero. Low nibbles: `l = r << 4` has only zeros below bit 12, so `(l | l >> 6) & mask`
# never mixes bits. High nibbles: the low nibble still sits at bits 8-11 of `r`, and bit 8 is a
# mask bit, so sign and magnitude are masked separately.
_ASM_BF16_BITWISE_TEXT = """
{
.reg .b32 z, nz, r0, r1, h0, h1, s0, s1, l0, l1, c0, c1;
mov.b32 z, 0;
mov.b32 nz, 0x80008000;
prmt.b32 r0, $4, z, 0x1404;
prmt.b32 r1, $4, z, 0x3424;
shr.b32 h0, r0, 6;
shr.b32 h1, r1, 6;
and.b32 h0, h0, 0x01C001C0;
and.b32 h1, h1, 0x01C001C0;
and.b32 s0, r0, nz;
and.b32 s1, r1, nz;
or.b32 h0, h0, s0;
or.b32 h1, h1, s1;
shl.b32 l0, r0, 4;
shl.b32 l1, r1, 4;
shr.b32 c0, r0, 2;
shr.b32 c1, r1, 2;
or.b32 l0, l0, c0;
or.b32 l1, l1, c1;
and.b32 l0, l0, 0x81C081C0;
and.b32 l1, l1, 0x81C081C0;
fma.rn.bf16x2 $0, l0, $5, nz;
fma.rn.bf16x2 $1, l1, $6, nz;
fma.rn.bf16x2 $2, h0, $5, nz;
fma.rn.bf16x2 $3, h1, $6, nz;
}
"""

# Decoder choice, the kernels' FAST constexpr: 0 portable, 1 table (fp16 and bf16), 2 bit placement
# (bf16; fp16 keeps the table).
DECODER_PORTABLE = 0
DECODER_TABLE = 1
DECODER_BITWISE = 2

_ASM_F16 = tl.constexpr(_ASM_F16_TEXT)
_ASM_BF16 = tl.constexpr(_ASM_BF16_TEXT)
_ASM_BF16_BITWISE = tl.constexpr(_ASM_BF16_BITWISE_TEXT)
# Fixed at import, as Triton fixes interpreter vs compiler when `@triton.jit` runs: a compiled kernel
# always takes the inline-PTX branch of `planes_fast`.
_INTERPRETED = tl.constexpr(interpreting())

# The decode kernels' integer arguments that change from one serving step to the next (batch, work
# split, block-table bound, token count), and the split's spread (fixed per GPU and model, 16 for 8 KV heads on
# 132 SMs, so that it does not build again for each). Triton would otherwise compile a variant for each value that
# is 1 or a multiple of 16, in the middle of serving (vLLM's JIT monitor flags it); none of them gates
# a vectorized access, so one compile covers them all.
DECODE_PER_STEP = ("batch", "programs", "min_tiles", "spread", "max_pages", "num_tokens")


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
def scales_bf16_biased(sf_byte):
    """E4M3 block-scale bytes -> bf16 ``sf * 2^118`` exactly, the scale operand of the bit-placement
    decoder (``448 * 2^118 < 2^127``: never inf). Two fp32 multiplies, as ``2^238`` is not an fp32."""
    return (scales_f32(sf_byte) * 3.32306998946229e35).to(tl.bfloat16)


@triton.jit
def planes_fast(byte, sf, BITWISE: tl.constexpr = False):
    """Cache bytes ``[N, D/2]`` uint8 and broadcast scales ``[N, D/2]`` (fp16 or bf16) -> ``(lo, hi)``.

    CUDA: inline PTX; both planes in ``sf``'s dtype, ``e2m1 * sf`` exactly (``BITWISE``, bf16: ``sf``
    is ``sf * 2^118`` and the planes ``e2m1 * sf * 2^-8``). Under the interpreter the same exact
    products are computed in plain Triton (:func:`_planes_fast_emulated`).
    """
    if _INTERPRETED:
        lo, hi = _planes_fast_emulated(byte, sf, BITWISE and sf.dtype == tl.bfloat16)
    elif BITWISE and sf.dtype == tl.bfloat16:
        lo, hi = tl.inline_asm_elementwise(
            _ASM_BF16_BITWISE, "=r,=r,=r,=r,r,r,r", [byte, sf], dtype=(tl.bfloat16, tl.bfloat16),
            is_pure=True, pack=4,
        )
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
def _planes_fast_emulated(byte, sf, BITWISE: tl.constexpr):
    """What the PTX computes, for the interpreter: ``e2m1 * sf`` rounded to ``sf``'s dtype (exact);
    ``BITWISE``: ``(e2m1 * 2^-126) * sf``, the bit-placement decoder's pattern times its scale."""
    b = byte.to(tl.int32)
    s = sf.to(tl.float32)
    lo = nvfp4.e2m1_decode(b & 15)
    hi = nvfp4.e2m1_decode(b >> 4)
    if BITWISE:
        lo = lo * 1.1754943508222875e-38
        hi = hi * 1.1754943508222875e-38
    return (lo * s).to(sf.dtype), (hi * s).to(sf.dtype)


@triton.jit
def planes_portable(byte, sf32, DTYPE: tl.constexpr):
    """Portable decoder: ``byte`` uint8 ``[N, D/2]``, ``sf32`` fp32 ``[N, D/2]`` -> ``(lo, hi)`` in ``DTYPE``."""
    b = byte.to(tl.int32)
    lo = nvfp4.e2m1_decode(b & 15) * sf32
    hi = nvfp4.e2m1_decode(b >> 4) * sf32
    return lo.to(DTYPE), hi.to(DTYPE)
