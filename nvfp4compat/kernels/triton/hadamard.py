"""Device helpers of the fused Hadamard KV rotation (``kv_rotation="hadamard"``).

``H`` is the normalized Sylvester Hadamard matrix of size ``D`` (``H[i, j] = (-1)^popcount(i & j) /
sqrt(D)``, :func:`nvfp4compat.kernels.rotation.hadamard`); it is symmetric and its own inverse, so
one routine rotates and un-rotates. Every kernel uses :func:`fwht_rows`, an exact fast
Walsh-Hadamard transform of ``[R, D]`` rows: ``log2(D)`` butterfly stages of float32 adds and subtracts through reshape/permute/split/join, then
one scaling by ``1/sqrt(D)``. The sums are float32 (as ``x.float() @ H`` is), with no TF32 rounding
to reason about, in ``D log2 D`` adds per row, and a tile of any row count works (the writer's
decode-sized tile holds 4 rows of head_dim 128; an MMA needs 16).

* writer and dequant: on each (token, head) row of the tile (:func:`fwht_rows`, :func:`round_to`).
* decode and prefill (:func:`rotate_query`, :func:`rotate_planes`): the readers keep the query and
  the output as even/odd planes ``lo = x[:, 0::2]``, ``hi = x[:, 1::2]``; they are interleaved,
  transformed and split again, once per program (the query after its load, the accumulator before
  it is normalized and stored).

Why butterflies and not MMAs in the readers: with ``H'`` (the unnormalized Sylvester matrix of size
``D/2``), ``(x H)[:, 0::2] = (lo + hi) H' / sqrt(D)`` and ``(x H)[:, 1::2] = (lo - hi) H' /
sqrt(D)``, two ``tf32x3`` MMAs per tile. Compiled for sm_90 with triton 3.6.0, the head_dim-128
decode kernel took 188 registers with that output rotation (152 unrotated), 152 with the
butterflies; the query rotation took it to 246-255 either way until the rotated query was stored and
loaded back (:func:`~nvfp4compat.kernels.triton.attention._rotated_query`): 158.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rotate_planes(lo, hi, HEAD_DIM: tl.constexpr):
    """Planes of ``x @ H`` from the planes ``lo = x[:, 0::2]``, ``hi = x[:, 1::2]`` ``[M, D/2]``
    (any float dtype): ``(even, odd)`` float32 ``[M, D/2]``, by :func:`fwht_rows` on the
    interleaved rows."""
    M: tl.constexpr = lo.shape[0]
    x = tl.reshape(tl.join(lo.to(tl.float32), hi.to(tl.float32)), (M, HEAD_DIM))
    even, odd = tl.split(tl.reshape(fwht_rows(x, HEAD_DIM), (M, HEAD_DIM // 2, 2)))
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
