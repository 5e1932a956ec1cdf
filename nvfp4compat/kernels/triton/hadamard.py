"""Device helpers of the fused Hadamard KV rotation (``kv_rotation="hadamard"``).

``H`` is the normalized Sylvester Hadamard matrix of size ``D`` (``H[i, j] = (-1)^popcount(i & j) /
sqrt(D)``, :func:`nvfp4compat.kernels.rotation.hadamard`); it is symmetric and its own inverse, so
one routine rotates and un-rotates. Two forms serve the kernels:

* :func:`rotate_planes` (decode and prefill): the readers keep the query and the output as even/odd
  planes ``lo = x[:, 0::2]``, ``hi = x[:, 1::2]``. With ``H'`` the unnormalized Sylvester matrix of
  size ``D/2`` (entries +-1), ``H[2a + r, 2b + s] = (-1)^(r & s) H'[a, b] / sqrt(D)``, hence
  ``(x H)[:, 0::2] = (lo + hi) H' / sqrt(D)`` and ``(x H)[:, 1::2] = (lo - hi) H' / sqrt(D)``: two
  ``[M, D/2] x [D/2, D/2]`` MMAs per tile, once per program (the query after its load, the
  accumulator before it is stored). ``H'`` is generated in registers (the parity of ``a & b`` by
  xor-folding shifts), no extra kernel argument. The dots take float32 operands with
  ``input_precision="tf32x3"``: ``H'`` is exact in TF32 (entries +-1), and the split of the other
  operand into two TF32 halves keeps about 22 mantissa bits, so the result is float32-accurate (plain
  TF32 would keep 10 bits of the query, worse than its own fp16 rounding). Three MMAs instead of one
  over the kernel's whole key loop cost nothing measurable; ``"ieee"`` would run on the FMA units.
* :func:`fwht_rows` (writer and dequant): an exact fast Walsh-Hadamard transform of ``[R, D]`` rows,
  ``log2(D)`` butterfly stages of float32 adds and subtracts through reshape/permute/split/join.
  Their tiles can be a single row (the writer's decode-sized config holds 4 rows of head_dim 128),
  below the 16 rows an MMA needs, and the values are quantized next: the butterflies give float32
  sums (as ``x.float() @ H`` does) with no TF32 rounding to reason about, in ``D log2 D`` adds per row.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _parity_pm1(a, b, BITS: tl.constexpr):
    """``(-1)^popcount(a & b)`` as float32 (+-1) for int32 ``a``, ``b`` below ``2**BITS``."""
    x = a & b
    for k in tl.static_range(BITS):  # fold: bit 0 of x becomes the parity of its low 2^BITS bits
        x = x ^ (x >> (1 << k))
    return 1.0 - 2.0 * (x & 1).to(tl.float32)


@triton.jit
def sylvester_pm1(N: tl.constexpr):
    """The unnormalized Sylvester Hadamard matrix ``[N, N]`` float32, ``(-1)^popcount(a & b)``."""
    idx = tl.arange(0, N)
    # xor-folding k bits needs ceil(log2(k)) shifts: 5 cover every head dim up to 2^32
    return _parity_pm1(idx[:, None], idx[None, :], 5)


@triton.jit
def rotate_planes(lo, hi, HEAD_DIM: tl.constexpr):
    """Planes of ``x @ H`` from the planes ``lo = x[:, 0::2]``, ``hi = x[:, 1::2]`` ``[M, D/2]``
    (any float dtype, ``M >= 16``): ``(even, odd)`` float32 ``[M, D/2]``."""
    D2: tl.constexpr = HEAD_DIM // 2
    hp = sylvester_pm1(D2)
    a = lo.to(tl.float32)
    b = hi.to(tl.float32)
    inv: tl.constexpr = 1.0 / (HEAD_DIM**0.5)
    even = tl.dot(a + b, hp, input_precision="tf32x3") * inv
    odd = tl.dot(a - b, hp, input_precision="tf32x3") * inv
    return even, odd


@triton.jit
def rotate_query(q_lo, q_hi, HEAD_DIM: tl.constexpr):
    """:func:`rotate_planes` of the query planes, rounded (to nearest even) to their dtype, as the
    unfused path's ``(q.float() @ H).to(q.dtype)``."""
    even, odd = rotate_planes(q_lo, q_hi, HEAD_DIM)
    DTYPE: tl.constexpr = q_lo.dtype
    return round_to(even, DTYPE).to(DTYPE), round_to(odd, DTYPE).to(DTYPE)


@triton.jit
def fwht_rows(x, HEAD_DIM: tl.constexpr):
    """``x @ H`` for float32 rows ``x`` ``[R, D]``: exact butterflies, float32 ``[R, D]``.

    Stage ``k`` pairs elements ``i`` and ``i + 2^k`` (bit ``k`` of the index 0 and 1) into their sum
    and difference; after every bit the result is ``x @ H'`` (Sylvester order), then scaled by
    ``1/sqrt(D)``.
    """
    R: tl.constexpr = x.shape[0]
    tl.static_assert((HEAD_DIM & (HEAD_DIM - 1)) == 0, "fwht_rows: head_dim must be a power of two")
    for k in tl.static_range(16):
        if (1 << k) < HEAD_DIM:
            # [R, D] -> [R, D / 2^(k+1), 2, 2^k]: the pair axis (bit k) moved last, split,
            # butterfly, back
            y = tl.permute(tl.reshape(x, (R, HEAD_DIM >> (k + 1), 2, 1 << k)), (0, 1, 3, 2))
            u, v = tl.split(y)
            x = tl.reshape(tl.permute(tl.join(u + v, u - v), (0, 1, 3, 2)), (R, HEAD_DIM))
    inv: tl.constexpr = 1.0 / (HEAD_DIM**0.5)
    return x * inv


@triton.jit
def round_to(x, DTYPE: tl.constexpr):
    """Float32 ``x`` rounded to nearest even in ``DTYPE`` (float16/bfloat16), returned as float32.

    bfloat16 is rounded in integer arithmetic (NaN and infinities kept): triton's interpreter
    truncates float32 -> bfloat16 casts, and the fused writer must round as ``x.to(torch.bfloat16)``
    does in the unfused path, on the GPU and under the interpreter alike.
    """
    if DTYPE == tl.bfloat16:  # noqa: SIM300 (DTYPE is a constexpr)
        bits = x.to(tl.int32, bitcast=True)
        r = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        return tl.where(x != x, x, r.to(tl.float32, bitcast=True))
    elif DTYPE == tl.float32:  # noqa: SIM300
        return x
    else:
        return x.to(DTYPE).to(tl.float32)
