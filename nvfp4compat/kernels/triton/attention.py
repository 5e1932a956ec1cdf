"""Fused Triton paged attention over an NVFP4 KV cache: split-KV decode and varlen causal prefill.

The cache is never dequantized to memory: every tile of ``BLOCK_N`` tokens is gathered through the block
table (a tile spans several pages), its E2M1 nibbles and E4M3 block scales are decoded in registers into
fp16/bf16 MMA operands (``e2m1 * sf``, exact in both), and the global scales are folded in
(``k_scale`` into the softmax scale, ``v_scale`` into the output). Signatures and semantics are those of
``docs/architecture.md``; the design and the tuning heuristic are in ``docs/attention.md``.

* :func:`decode`: flash-decoding. One program per ``(work chunk, kv head)`` serves every query head of
  its KV head (the GQA group ``G = Hq / Hkv``) and every one of its request's ``q_len_per_req`` query
  tokens: ``G * q_len`` rows padded to the MMA minimum of 16. The batch's KV tiles are shared out on the
  device, by the real lengths, over one to three waves of programs (:func:`decode_programs`,
  :func:`decode_waves`, :func:`_decode_kernel`); a second kernel merges the chunks of split requests (log-sum-exp weighted),
  and a request of one chunk is written directly.
* :func:`prefill`: FlashAttention-2 over query tiles of all requests (``BLOCK_M`` rows = ``BLOCK_M // G``
  tokens x ``G`` heads, one program per tile and KV head), with the causal diagonal, the sliding window
  and the sequence end masked only on the tiles that need it. Requests with at most ``16 // G`` query
  tokens (the decode rows of a mixed batch) go through the split-KV decode kernel instead, so a mixed
  prefill/decode batch is one call and the decode rows still fill the GPU.
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from nvfp4compat.kernels.checks import (
    check_metadata_values,
    check_query_start_loc,
    interpreting,
    metadata_checks_on,
    resolve_scale,
    scale_meta,
    sm_count,
    tensor_meta,
)
from nvfp4compat.kernels.errors import error_flag
from nvfp4compat.kernels.layout import FP32_MAX, CacheViews, normalize_cache
from nvfp4compat.kernels.rotation import fused_rotation
from nvfp4compat.kernels.triton import attention_nvfp4 as fp4
from nvfp4compat.kernels.triton.hadamard import rotate_planes, rotate_query

try:  # Gluon ships inside the triton package (3.5+); without it every launch takes the plain kernel
    from nvfp4compat.kernels.triton import decode_gluon as _gluon
except ImportError:  # pragma: no cover - depends on the installed triton
    _gluon = None  # type: ignore[assignment]

__all__ = [
    "decode",
    "prefill",
    "DecodeConfig",
    "PrefillConfig",
    "decode_config",
    "prefill_config",
    "decode_programs",
    "decode_waves",
    "decode_split",
    "decode_spread",
    "DecodeSplit",
    "decode_grid",
    "override_configs",
    "aot_kernels",
]

_LOG2E = 1.4426950408889634
_MAX_GRID_YZ = 65535
_MAX_TOKENS = 2**31 - 1
# The query_start_loc guard (prefill): rows per program, qsl entries per scan step.
_GUARD_ROWS = 64
_GUARD_BLOCK_B = 1024


# --------------------------------------------------------------------------------------------------
# Device code
# --------------------------------------------------------------------------------------------------


@triton.jit
def _load_raw(
    base, row_off, sf_base, sf_row_off, n_ok,
    HEAD_DIM: tl.constexpr, MASKED: tl.constexpr, SF_WORDS: tl.constexpr,
):
    """The raw bytes of one K or V tile: E2M1 codes ``[BLOCK_N, D/2]`` (uint8) and its E4M3 scales,
    as loaded (:func:`_split_scales` makes them ``[BLOCK_N, D/16]`` bytes).

    ``SF_WORDS`` (rows 4-byte aligned): the scales are loaded as 32-bit words, so every thread
    moves at least 4 bytes and Triton's pipeliner can stage the load with ``cp.async``.
    """
    D2: tl.constexpr = HEAD_DIM // 2
    D16: tl.constexpr = HEAD_DIM // 16
    offs_b = tl.arange(0, D2)
    ptrs = base + row_off[:, None] + offs_b[None, :]
    if SF_WORDS:
        W: tl.constexpr = D16 // 4
        sf_ptrs = (sf_base + sf_row_off[:, None]).to(tl.pointer_type(tl.int32)) + tl.arange(0, W)[None, :]
    else:
        sf_ptrs = sf_base + sf_row_off[:, None] + tl.arange(0, D16)[None, :]
    if MASKED:
        byte = tl.load(ptrs, mask=n_ok[:, None], other=0)
        sf_raw = tl.load(sf_ptrs, mask=n_ok[:, None], other=0)
    else:
        byte = tl.load(ptrs)
        sf_raw = tl.load(sf_ptrs)
    return byte, sf_raw


@triton.jit
def _split_scales(sf_raw, D16: tl.constexpr, SF_WORDS: tl.constexpr):
    """:func:`_load_raw`'s scales -> ``[BLOCK_N, D/16]`` E4M3 bytes (uint8 values in int32)."""
    if SF_WORDS:
        shifts = tl.arange(0, 4) * 8
        sfb = (sf_raw[:, :, None] >> shifts[None, None, :]) & 0xFF
        return tl.reshape(sfb, (sf_raw.shape[0], D16))
    else:
        return sf_raw.to(tl.int32)


@triton.jit
def _decode_raw(
    byte, sf_raw,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, FAST: tl.constexpr, DTYPE: tl.constexpr,
    SF_WORDS: tl.constexpr,
):
    """Decode one tile's raw bytes (:func:`_load_raw`): ``(lo, hi)`` planes ``[BLOCK_N, D/2]`` in ``DTYPE``."""
    D2: tl.constexpr = HEAD_DIM // 2
    D16: tl.constexpr = HEAD_DIM // 16
    sfb = _split_scales(sf_raw, D16, SF_WORDS)
    if FAST:
        if DTYPE == tl.float16:  # noqa: SIM300 (DTYPE is a constexpr, not a constant)
            sf = fp4.scales_f16_scaled(sfb)  # sf * 2^-8: the caller folds 2^8 into the scales
        elif FAST == 2:
            sf = fp4.scales_bf16_biased(sfb)  # planes come out e2m1 * sf * 2^-8, folded like fp16's
        else:
            sf = fp4.scales_f32(sfb).to(DTYPE)
        lo, hi = fp4.planes_fast(byte, fp4.broadcast_scales(sf, D2, D16, BLOCK_N), FAST == 2)
    else:
        sf = fp4.scales_f32(sfb)
        lo, hi = fp4.planes_portable(byte, fp4.broadcast_scales(sf, D2, D16, BLOCK_N), DTYPE)
    return lo, hi


@triton.jit
def _load_planes(
    base, row_off, sf_base, sf_row_off, n_ok,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, FAST: tl.constexpr,
    DTYPE: tl.constexpr, SF_WORDS: tl.constexpr,
):
    """Gather and decode one K or V tile: ``(lo, hi)`` planes ``[BLOCK_N, D/2]`` in ``DTYPE``."""
    byte, sf_raw = _load_raw(base, row_off, sf_base, sf_row_off, n_ok, HEAD_DIM, MASKED, SF_WORDS)
    return _decode_raw(byte, sf_raw, HEAD_DIM, BLOCK_N, FAST, DTYPE, SF_WORDS)


@triton.jit
def _page_slot(offs_n, page_size, page_shift, PAGE_POW2: tl.constexpr):
    """Key positions -> (block-table index, int64 slot in the page): shift and mask for power-of-two
    page sizes, division otherwise."""
    if PAGE_POW2:
        return offs_n >> page_shift, (offs_n & (page_size - 1)).to(tl.int64)
    else:
        return offs_n // page_size, (offs_n % page_size).to(tl.int64)


@triton.jit
def _attend_tile(
    acc_lo, acc_hi, m_i, l_i, q_lo, q_hi, qpos,
    n0, kv_end, window, qk_scale2, softcap_pre, softcap_post,
    bt_row, page_size, page_shift, num_pages,
    k_base, v_base, ks_base, vs_base,
    stride_kp, stride_kt, stride_vp, stride_vt,
    stride_ksp, stride_kst, stride_vsp, stride_vst,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL_ROWS: tl.constexpr, WINDOW_ROWS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, FAST: tl.constexpr, DOT_FP32: tl.constexpr, PAGE_POW2: tl.constexpr,
    SF_WORDS: tl.constexpr, RAW: tl.constexpr = False, k_byte=None, k_sf=None, v_byte=None, v_sf=None,
    SWAP_AB: tl.constexpr = False,
):
    """Online-softmax update of the running state with the keys ``[n0, n0 + BLOCK_N)``.

    ``SWAP_AB``: the decoded K tile is the first operand of the logits' MMA (``S^T = K Q^T``, then
    transposed in registers). With ``BLOCK_N`` keys as its M, SM90 runs it as a wgmma whose first
    operand stays in registers, so the layout conversion of K happens on its bytes, before the decode
    (SM90's wgmma takes its second operand from shared memory only, and the 16 query rows are too few
    for a wgmma M). ``P V`` keeps its orientation: an ``mma.sync`` with V in registers (opt-in:
    ``DecodeConfig.swap_ab``).

    ``RAW`` (unmasked tiles only): the tile's bytes were loaded already (:func:`_attend_prefetched`)
    and come in as ``k_byte, k_sf, v_byte, v_sf`` (:func:`_load_raw`); nothing is loaded here.

    ``MASKED`` tiles mask keys ``>= kv_end`` and, per row, the causal diagonal (``CAUSAL_ROWS``:
    key ``<= qpos``) and the window (``WINDOW_ROWS``: key ``> qpos - window``); unmasked tiles are
    known to be fully visible to every row. Logits are kept in the log2 domain. On a masked tile a
    key whose page id is outside ``[0, num_pages)`` is masked too (its logit is -inf): its page id is
    replaced by 0, so its bytes are read from inside the cache and decode to finite values, which
    weigh 0. Unmasked tiles neither check nor mask page ids: :func:`_attend_range` runs a tile
    unmasked only when every page id it reads was checked to be in range.
    """
    DTYPE: tl.constexpr = q_lo.dtype
    offs_n = n0 + tl.arange(0, BLOCK_N)
    n_ok = offs_n < kv_end
    if RAW:
        tl.static_assert(not MASKED, "prefetched tiles are unmasked tiles")
        k_lo, k_hi = _decode_raw(k_byte, k_sf, HEAD_DIM, BLOCK_N, FAST, DTYPE, SF_WORDS)
    else:
        pidx, slot = _page_slot(offs_n, page_size, page_shift, PAGE_POW2)
        if MASKED:
            page = tl.load(bt_row + pidx, mask=n_ok, other=-1)
            # A page id outside the cache reads nothing: its keys are masked like keys past the end.
            page_ok = (page >= 0) & (page < num_pages)
            n_ok = n_ok & page_ok
            page = tl.where(page_ok, page, 0).to(tl.int64)
        else:
            page = tl.load(bt_row + pidx).to(tl.int64)
        k_lo, k_hi = _load_planes(
            k_base, page * stride_kp + slot * stride_kt, ks_base, page * stride_ksp + slot * stride_kst,
            n_ok, HEAD_DIM, BLOCK_N, MASKED, FAST, DTYPE, SF_WORDS,
        )
    qd_lo, qd_hi, kd_lo, kd_hi = q_lo, q_hi, k_lo, k_hi
    if DOT_FP32:
        qd_lo, qd_hi = q_lo.to(tl.float32), q_hi.to(tl.float32)
        kd_lo, kd_hi = k_lo.to(tl.float32), k_hi.to(tl.float32)
    if SWAP_AB:
        s = tl.trans(tl.dot(kd_hi, tl.trans(qd_hi), tl.dot(kd_lo, tl.trans(qd_lo))))
    else:
        s = tl.dot(qd_hi, tl.trans(kd_hi), tl.dot(qd_lo, tl.trans(kd_lo)))
    if HAS_SOFTCAP:
        # cap * tanh(x / cap) in the log2 domain; tanh(y) = 1 - 2 / (exp(2y) + 1) saturates cleanly.
        y = s * softcap_pre
        t = 1.0 - 2.0 / (tl.exp2(y * 2.8853900817779268) + 1.0)
        s = t * softcap_post
    if MASKED:
        s = tl.where(n_ok[None, :], s, float("-inf"))
        if CAUSAL_ROWS:
            s = tl.where(offs_n[None, :] <= qpos[:, None], s, float("-inf"))
        if WINDOW_ROWS:
            s = tl.where(offs_n[None, :] > (qpos - window)[:, None], s, float("-inf"))

    if HAS_SOFTCAP:
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
    else:
        # s is unscaled here: max commutes with the positive scale, and s * scale - m is one FMA.
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale2)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s * qk_scale2 - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc_lo = acc_lo * alpha[:, None]
    acc_hi = acc_hi * alpha[:, None]

    if RAW:
        v_lo, v_hi = _decode_raw(v_byte, v_sf, HEAD_DIM, BLOCK_N, FAST, DTYPE, SF_WORDS)
    else:
        v_lo, v_hi = _load_planes(
            v_base, page * stride_vp + slot * stride_vt, vs_base, page * stride_vsp + slot * stride_vst,
            n_ok, HEAD_DIM, BLOCK_N, MASKED, FAST, DTYPE, SF_WORDS,
        )
    p16 = p.to(DTYPE)
    if DOT_FP32:
        p32 = p16.to(tl.float32)
        acc_lo = tl.dot(p32, v_lo.to(tl.float32), acc_lo)
        acc_hi = tl.dot(p32, v_hi.to(tl.float32), acc_hi)
    else:
        acc_lo = tl.dot(p16, v_lo, acc_lo)
        acc_hi = tl.dot(p16, v_hi, acc_hi)
    return acc_lo, acc_hi, m_new, l_i


@triton.jit
def _tile_keys(t, kv_lo, ok, BLOCK_N: tl.constexpr):
    """Tile ``t``'s key positions ``kv_lo + t * BLOCK_N + [0, BLOCK_N)`` and a load mask that is
    ``ok`` for all of them (broadcast by hand: triton 3.9's interpreter rejects a scalar bool & a
    vector as a mask)."""
    offs_n = kv_lo + t * BLOCK_N + tl.arange(0, BLOCK_N)
    return offs_n, (tl.zeros_like(offs_n) + ok.to(tl.int32)) != 0


@triton.jit
def _tile_pages(t, kv_lo, bt_row, page_size, page_shift, ok, BLOCK_N: tl.constexpr, PAGE_POW2: tl.constexpr):
    """Page ids (int32) of tile ``t``'s keys; nothing is read where ``ok`` is false (ids 0)."""
    offs_n, n_ok = _tile_keys(t, kv_lo, ok, BLOCK_N)
    pidx, _ = _page_slot(offs_n, page_size, page_shift, PAGE_POW2)
    return tl.load(bt_row + pidx, mask=n_ok, other=0)


@triton.jit
def _tile_raw(
    t, page, ok, kv_lo, page_size, page_shift,
    k_base, v_base, ks_base, vs_base,
    stride_kp, stride_kt, stride_vp, stride_vt,
    stride_ksp, stride_kst, stride_vsp, stride_vst,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, SF_WORDS: tl.constexpr, PAGE_POW2: tl.constexpr,
):
    """The raw K and V bytes of tile ``t`` (:func:`_load_raw`) at page ids ``page``; nothing is read
    where ``ok`` is false."""
    offs_n, n_ok = _tile_keys(t, kv_lo, ok, BLOCK_N)
    _, slot = _page_slot(offs_n, page_size, page_shift, PAGE_POW2)
    p64 = page.to(tl.int64)
    k_byte, k_sf = _load_raw(
        k_base, p64 * stride_kp + slot * stride_kt, ks_base, p64 * stride_ksp + slot * stride_kst,
        n_ok, HEAD_DIM, True, SF_WORDS,
    )
    v_byte, v_sf = _load_raw(
        v_base, p64 * stride_vp + slot * stride_vt, vs_base, p64 * stride_vsp + slot * stride_vst,
        n_ok, HEAD_DIM, True, SF_WORDS,
    )
    return k_byte, k_sf, v_byte, v_sf


@triton.jit
def _attend_prefetched(
    acc_lo, acc_hi, m_i, l_i, q_lo, q_hi, qpos,
    kv_lo, kv_hi, b_begin, b_end,
    window, qk_scale2, softcap_pre, softcap_post,
    bt_row, page_size, page_shift, num_pages,
    k_base, v_base, ks_base, vs_base,
    stride_kp, stride_kt, stride_vp, stride_vt,
    stride_ksp, stride_kst, stride_vsp, stride_vst,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL_ROWS: tl.constexpr, WINDOW_ROWS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, FAST: tl.constexpr, DOT_FP32: tl.constexpr, PAGE_POW2: tl.constexpr,
    SF_WORDS: tl.constexpr, SWAP_AB: tl.constexpr = False,
):
    """The unmasked tiles ``[b_begin, b_end)`` with register double buffering (``PREFETCH``): tile
    ``i + 1``'s K/V bytes and tile ``i + 2``'s page ids are loaded before tile ``i`` is decoded, so
    their memory latency overlaps its decode and MMAs within the program (Triton's own pipelining of
    the gather waits for every copy at the top of each iteration). Run with ``num_stages=1``. Every
    page id read here was checked by :func:`_attend_range`'s scan; loads past ``b_end`` are
    predicated off."""
    page = _tile_pages(b_begin, kv_lo, bt_row, page_size, page_shift, b_begin < b_end, BLOCK_N, PAGE_POW2)
    k_byte, k_sf, v_byte, v_sf = _tile_raw(
        b_begin, page, b_begin < b_end, kv_lo, page_size, page_shift, k_base, v_base, ks_base, vs_base,
        stride_kp, stride_kt, stride_vp, stride_vt, stride_ksp, stride_kst, stride_vsp, stride_vst,
        HEAD_DIM, BLOCK_N, SF_WORDS, PAGE_POW2,
    )
    page_next = _tile_pages(
        b_begin + 1, kv_lo, bt_row, page_size, page_shift, b_begin + 1 < b_end, BLOCK_N, PAGE_POW2
    )
    for i in range(b_begin, b_end):
        k_byte_n, k_sf_n, v_byte_n, v_sf_n = _tile_raw(
            i + 1, page_next, i + 1 < b_end, kv_lo, page_size, page_shift, k_base, v_base, ks_base, vs_base,
            stride_kp, stride_kt, stride_vp, stride_vt, stride_ksp, stride_kst, stride_vsp, stride_vst,
            HEAD_DIM, BLOCK_N, SF_WORDS, PAGE_POW2,
        )
        page_next = _tile_pages(i + 2, kv_lo, bt_row, page_size, page_shift, i + 2 < b_end, BLOCK_N, PAGE_POW2)
        acc_lo, acc_hi, m_i, l_i = _attend_tile(
            acc_lo, acc_hi, m_i, l_i, q_lo, q_hi, qpos, kv_lo + i * BLOCK_N, kv_hi, window,
            qk_scale2, softcap_pre, softcap_post, bt_row, page_size, page_shift, num_pages,
            k_base, v_base, ks_base, vs_base,
            stride_kp, stride_kt, stride_vp, stride_vt, stride_ksp, stride_kst, stride_vsp, stride_vst,
            HEAD_DIM, BLOCK_N, False, CAUSAL_ROWS, WINDOW_ROWS, HAS_SOFTCAP, FAST, DOT_FP32, PAGE_POW2, SF_WORDS,
            True, k_byte, k_sf, v_byte, v_sf, SWAP_AB=SWAP_AB,
        )
        k_byte, k_sf, v_byte, v_sf = k_byte_n, k_sf_n, v_byte_n, v_sf_n
    return acc_lo, acc_hi, m_i, l_i


@triton.jit
def _bad_pages(bt_row, p_lo, p_hi, num_pages, PAGE_SCAN: tl.constexpr):
    """1 if any block-table entry ``bt_row[p_lo:p_hi]`` is not a page id in ``[0, num_pages)``, else 0.

    ``PAGE_SCAN // 32`` independent loads of 32 entries per step, reduced once at the end: a
    vector of 32 stays within one warp, where wider vectors (or a reduction per step) raised the
    decode kernel from 152 to 194 registers per thread on SM90 (triton 3.6.0), one resident program
    fewer per SM.
    """
    bad = tl.zeros((32,), tl.int32)
    for p0 in range(p_lo, p_hi, PAGE_SCAN):
        for u in tl.static_range(PAGE_SCAN // 32):
            offs = p0 + u * 32 + tl.arange(0, 32)
            page = tl.load(bt_row + offs, mask=offs < p_hi, other=0)
            bad |= ((page < 0) | (page >= num_pages)).to(tl.int32)
    return tl.max(bad, 0)


@triton.jit
def _attend_range(
    acc_lo, acc_hi, m_i, l_i, q_lo, q_hi, qpos,
    kv_lo, kv_hi, t_begin, t_end, n_mask_lo, n_full_end,
    window, qk_scale2, softcap_pre, softcap_post,
    bt_row, page_size, page_shift, num_pages,
    k_base, v_base, ks_base, vs_base,
    stride_kp, stride_kt, stride_vp, stride_vt,
    stride_ksp, stride_kst, stride_vsp, stride_vst,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL_ROWS: tl.constexpr, WINDOW_ROWS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, FAST: tl.constexpr, DOT_FP32: tl.constexpr, PAGE_POW2: tl.constexpr,
    SF_WORDS: tl.constexpr, PREFETCH: tl.constexpr = False, PAGE_SCAN: tl.constexpr = 256,
    SWAP_AB: tl.constexpr = False,
):
    """Attend tiles ``t_begin <= i < t_end`` (tile ``i`` = keys ``kv_lo + i * BLOCK_N + [0, BLOCK_N)``).

    Tiles below ``n_mask_lo`` (window edge) and from ``n_full_end`` on (causal diagonal, sequence end)
    are masked; the tiles in between run the unmasked fast path, which trusts its page ids. So the
    block-table entries of those tiles are checked first, in one pass (:func:`_bad_pages`):
    where any is outside ``[0, num_pages)``, every tile of the range runs masked, and the keys of
    the bad pages are masked tile by tile. Valid metadata pays one vector load per
    ``PAGE_SCAN`` pages, not a check per tile.
    """
    a_end = tl.minimum(t_end, n_mask_lo)
    for i in range(t_begin, a_end):
        acc_lo, acc_hi, m_i, l_i = _attend_tile(
            acc_lo, acc_hi, m_i, l_i, q_lo, q_hi, qpos, kv_lo + i * BLOCK_N, kv_hi, window,
            qk_scale2, softcap_pre, softcap_post, bt_row, page_size, page_shift, num_pages,
            k_base, v_base, ks_base, vs_base,
            stride_kp, stride_kt, stride_vp, stride_vt, stride_ksp, stride_kst, stride_vsp, stride_vst,
            HEAD_DIM, BLOCK_N, True, CAUSAL_ROWS, WINDOW_ROWS, HAS_SOFTCAP, FAST, DOT_FP32, PAGE_POW2, SF_WORDS,
            SWAP_AB=SWAP_AB,
        )
    b_begin = tl.maximum(t_begin, n_mask_lo)
    b_end = tl.minimum(t_end, n_full_end)
    if b_end > b_begin:
        # the block-table entries of keys [kv_lo + b_begin * BLOCK_N, kv_lo + b_end * BLOCK_N), which
        # end at or before kv_hi
        p_lo, _ = _page_slot(kv_lo + b_begin * BLOCK_N, page_size, page_shift, PAGE_POW2)
        p_last, _ = _page_slot(kv_lo + b_end * BLOCK_N - 1, page_size, page_shift, PAGE_POW2)
        if _bad_pages(bt_row, p_lo, p_last + 1, num_pages, PAGE_SCAN) > 0:
            b_end = b_begin  # hostile page ids: the masked loop below takes every tile
    if PREFETCH:
        acc_lo, acc_hi, m_i, l_i = _attend_prefetched(
            acc_lo, acc_hi, m_i, l_i, q_lo, q_hi, qpos, kv_lo, kv_hi, b_begin, b_end,
            window, qk_scale2, softcap_pre, softcap_post, bt_row, page_size, page_shift, num_pages,
            k_base, v_base, ks_base, vs_base,
            stride_kp, stride_kt, stride_vp, stride_vt, stride_ksp, stride_kst, stride_vsp, stride_vst,
            HEAD_DIM, BLOCK_N, CAUSAL_ROWS, WINDOW_ROWS, HAS_SOFTCAP, FAST, DOT_FP32, PAGE_POW2, SF_WORDS,
            SWAP_AB=SWAP_AB,
        )
    else:
        for i in range(b_begin, b_end):
            acc_lo, acc_hi, m_i, l_i = _attend_tile(
                acc_lo, acc_hi, m_i, l_i, q_lo, q_hi, qpos, kv_lo + i * BLOCK_N, kv_hi, window,
                qk_scale2, softcap_pre, softcap_post, bt_row, page_size, page_shift, num_pages,
                k_base, v_base, ks_base, vs_base,
                stride_kp, stride_kt, stride_vp, stride_vt, stride_ksp, stride_kst, stride_vsp, stride_vst,
                HEAD_DIM, BLOCK_N, False, CAUSAL_ROWS, WINDOW_ROWS, HAS_SOFTCAP, FAST, DOT_FP32, PAGE_POW2,
                SF_WORDS, SWAP_AB=SWAP_AB,
            )
    c_begin = tl.maximum(b_begin, b_end)
    for i in range(c_begin, t_end):
        acc_lo, acc_hi, m_i, l_i = _attend_tile(
            acc_lo, acc_hi, m_i, l_i, q_lo, q_hi, qpos, kv_lo + i * BLOCK_N, kv_hi, window,
            qk_scale2, softcap_pre, softcap_post, bt_row, page_size, page_shift, num_pages,
            k_base, v_base, ks_base, vs_base,
            stride_kp, stride_kt, stride_vp, stride_vt, stride_ksp, stride_kst, stride_vsp, stride_vst,
            HEAD_DIM, BLOCK_N, True, CAUSAL_ROWS, WINDOW_ROWS, HAS_SOFTCAP, FAST, DOT_FP32, PAGE_POW2, SF_WORDS,
            SWAP_AB=SWAP_AB,
        )
    return acc_lo, acc_hi, m_i, l_i


@triton.jit
def _scales(
    k_scale, v_scale, sm_scale_log2, softcap, q_ptr,
    K_SCALE_PTR: tl.constexpr, V_SCALE_PTR: tl.constexpr, FAST: tl.constexpr,
):
    """Global scales (device pointers or numbers) -> (qk_scale2, softcap_pre, softcap_post, v_scale).

    The fp16 fast decoder and the bf16 bit-placement decoder (``FAST == 2``) produce
    ``e2m1 * sf * 2^-8``: their ``2^8`` is folded in here.
    """
    if K_SCALE_PTR:
        ks = tl.load(k_scale)
    else:
        ks = k_scale
    if V_SCALE_PTR:
        vs = tl.load(v_scale)
    else:
        vs = v_scale
    if FAST == 2 or (FAST and q_ptr.dtype.element_ty == tl.float16):
        ks = ks * 256.0
        vs = vs * 256.0
    qk_scale2 = sm_scale_log2 * ks  # (q . k_e2m1*sf) * sm_scale * k_scale * log2(e)
    softcap_pre = qk_scale2 / (softcap * 1.4426950408889634)  # x / cap, natural units
    softcap_post = softcap * 1.4426950408889634
    return qk_scale2, softcap_pre, softcap_post, vs


@triton.jit
def _load_query(q_ptr, tok, head, row_ok, stride_qt, stride_qh, HEAD_DIM: tl.constexpr):
    """Query planes ``(q[:, 0::2], q[:, 1::2])`` ``[BLOCK_M, D/2]`` of rows (token, head)."""
    D2: tl.constexpr = HEAD_DIM // 2
    offs = tl.arange(0, D2)
    row = q_ptr + tok.to(tl.int64) * stride_qt + head.to(tl.int64) * stride_qh
    q_lo = tl.load(row[:, None] + 2 * offs[None, :], mask=row_ok[:, None], other=0.0)
    q_hi = tl.load(row[:, None] + 2 * offs[None, :] + 1, mask=row_ok[:, None], other=0.0)
    return q_lo, q_hi


@triton.jit
def _rotated_query(
    q_ptr, o_ptr, kvh, group, tok0, t_lim, stride_qt, stride_qh, stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """The query planes of rows ``m < BLOCK_M`` (token ``tok0 + m // group``, head
    ``kvh * group + m % group``, present while ``m // group < t_lim``) times ``H``
    (:func:`~nvfp4compat.kernels.triton.hadamard.rotate_query`), staged through the rows' output
    memory: rotated 16 rows at a time, stored there, then loaded back as the plain query is.

    Used straight from registers, the rotated query stayed in registers as an MMA operand through
    the key loop (sm_90, triton 3.6.0, head_dim 128 decode: 255 registers against 152 unrotated;
    staged: 158). The head_dim-128 prefill kernel is at 255 registers either way (ptxas reports
    1,064 bytes of spill stores staged, 1,164 not, 436 unrotated; not timed yet). The output rows are
    this program's or, for a request split into chunks, its chunks' (each stores the same values;
    the merge kernel writes the output later), so nothing else reads them before they are
    overwritten; the host refuses an ``out`` that shares memory with ``query``.
    """
    RB: tl.constexpr = 16 if BLOCK_M > 16 else BLOCK_M
    offs = tl.arange(0, HEAD_DIM // 2)
    for r0 in tl.static_range(0, BLOCK_M, RB):
        m = r0 + tl.arange(0, RB)
        t = m // group
        ok = t < t_lim
        tok = tok0 + t
        head = kvh * group + m % group
        q_lo, q_hi = _load_query(q_ptr, tok, head, ok, stride_qt, stride_qh, HEAD_DIM)
        q_lo, q_hi = rotate_query(q_lo, q_hi, HEAD_DIM)
        row = o_ptr + tok.to(tl.int64) * stride_ot + head.to(tl.int64) * stride_oh
        tl.store(row[:, None] + 2 * offs[None, :], q_lo, mask=ok[:, None])
        tl.store(row[:, None] + 2 * offs[None, :] + 1, q_hi, mask=ok[:, None])
    tl.debug_barrier()  # the block's stores are visible to all its threads
    m = tl.arange(0, BLOCK_M)
    ok = m // group < t_lim
    return _load_query(
        o_ptr, tok0 + m // group, kvh * group + m % group, ok, stride_ot, stride_oh, HEAD_DIM
    )


@triton.jit
def _fold_sinks(m, l_sum, sinks_ptr, head, row_ok, HAS_SINKS: tl.constexpr):
    """Fold each row's attention sink (``sinks[head]``) into its running max ``m`` and sum ``l_sum``
    (log2 domain): ``(w, l_safe, lse)``, the weight of the accumulated output, its normalizer (1
    where nothing was attended) and the row's natural-log LSE (-inf where nothing was attended)."""
    if HAS_SINKS:
        sink2 = tl.load(sinks_ptr + head, mask=row_ok, other=0.0) * 1.4426950408889634
        m_fin = tl.maximum(m, sink2)
        w = tl.exp2(m - m_fin)
        l_tot = l_sum * w + tl.exp2(sink2 - m_fin)
    else:
        m_fin = m
        w = tl.full(m.shape, 1.0, tl.float32)
        l_tot = l_sum
    l_safe = tl.where(l_tot > 0.0, l_tot, 1.0)
    lse = tl.where(l_tot > 0.0, (m_fin + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    return w, l_safe, lse


@triton.jit
def _finish(
    acc_lo, acc_hi, m_i, l_i, vs, head, row_ok, tok, o_ptr, lse_ptr, sinks_ptr,
    stride_ot, stride_oh, stride_lt,
    HEAD_DIM: tl.constexpr, HAS_SINKS: tl.constexpr, RETURN_LSE: tl.constexpr,
):
    """Normalize (sinks included), apply ``v_scale``, interleave the planes and store out/LSE."""
    BLOCK_M: tl.constexpr = acc_lo.shape[0]
    w, l_safe, lse = _fold_sinks(m_i, l_i, sinks_ptr, head, row_ok, HAS_SINKS)
    scale = w * vs / l_safe
    o = tl.reshape(
        tl.join(acc_lo * scale[:, None], acc_hi * scale[:, None]), (BLOCK_M, HEAD_DIM)
    )
    offs_d = tl.arange(0, HEAD_DIM)
    o_row = o_ptr + tok.to(tl.int64) * stride_ot + head.to(tl.int64) * stride_oh
    tl.store(o_row[:, None] + offs_d[None, :], o.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
    if RETURN_LSE:
        tl.store(lse_ptr + tok.to(tl.int64) * stride_lt + head, lse, mask=row_ok)


@triton.jit
def _query_span(q0, q1, num_tokens):
    """``query_start_loc`` entries ``qsl[b], qsl[b+1]`` -> ``(start, length)`` of request ``b``'s query
    rows, clamped to ``[0, num_tokens]`` and non-decreasing: what every kernel reads of hostile
    metadata, so that they agree on which rows exist."""
    start = tl.minimum(tl.maximum(q0, 0), num_tokens)
    return start, tl.minimum(tl.maximum(q1, start), num_tokens) - start


@triton.jit
def _request_tiles(
    bs, ok, seq_lens_ptr, qsl_ptr, window, max_kv, num_tokens,
    BLOCK_N: tl.constexpr, QMAX: tl.constexpr, VARLEN: tl.constexpr, HAS_WINDOW: tl.constexpr,
    MARK_EMPTY: tl.constexpr = False,
):
    """KV tiles of requests ``bs`` (masked by ``ok``): ``cdiv(kv_hi - kv_lo, BLOCK_N)``, 0 for requests
    the decode kernel does not serve (varlen rows with no or more than ``QMAX`` query tokens).
    ``MARK_EMPTY``: a request it serves that has no visible key counts -1 (not 0).

    Every bound is clamped the way the kernel body clamps it (``seq_len`` to ``[0, max_kv]``, the
    row's pages; ``query_start_loc`` to ``[0, num_tokens]`` and non-decreasing), in int64 so that no
    hostile value wraps: the work split and the tile loop agree for any metadata.
    """
    seq_len = tl.load(seq_lens_ptr + bs, mask=ok, other=0).to(tl.int64)
    seq_len = tl.minimum(tl.maximum(seq_len, 0), max_kv)
    if VARLEN:
        _, q_len = _query_span(
            tl.load(qsl_ptr + bs, mask=ok, other=0), tl.load(qsl_ptr + bs + 1, mask=ok, other=0), num_tokens
        )
        q_len = q_len.to(tl.int64)
        live = ok & (q_len > 0) & (q_len <= QMAX)
    else:
        q_len = QMAX
        live = ok
    kv_hi = seq_len  # (clamped to the row above)
    if HAS_WINDOW:
        kv_lo = tl.maximum(seq_len - q_len - window + 1, 0)
    else:
        kv_lo = seq_len * 0
    tiles = (tl.maximum(kv_hi - kv_lo, 0) + BLOCK_N - 1) // BLOCK_N
    if MARK_EMPTY:
        tiles = tl.where(tiles == 0, -1, tiles)
    return tl.where(live, tiles, 0).to(tl.int32)


@triton.jit
def _total_tiles(
    t0, batch, seq_lens_ptr, qsl_ptr, window, max_kv, num_tokens,
    BLOCK_N: tl.constexpr, QMAX: tl.constexpr, VARLEN: tl.constexpr, HAS_WINDOW: tl.constexpr,
    BATCH_BLOCK: tl.constexpr,
):
    """KV tiles of the whole batch (int64; at least 1 so that it can divide). ``t0``: the first ``BATCH_BLOCK``
    requests' tiles (:func:`_request_tiles`, loaded once by the caller; a -1 of ``MARK_EMPTY`` counts 0)."""
    total = tl.sum(tl.maximum(t0, 0).to(tl.int64), 0)
    for b0 in range(BATCH_BLOCK, batch, BATCH_BLOCK):
        bs = b0 + tl.arange(0, BATCH_BLOCK)
        total += tl.sum(
            _request_tiles(bs, bs < batch, seq_lens_ptr, qsl_ptr, window, max_kv, num_tokens,
                           BLOCK_N, QMAX, VARLEN, HAS_WINDOW).to(tl.int64), 0
        )
    return tl.maximum(total, 1)


@triton.jit
def _block_chunks(
    b0, batch, total, programs, min_tiles, spread, seq_lens_ptr, qsl_ptr, window, max_kv, num_tokens,
    BLOCK_N: tl.constexpr, QMAX: tl.constexpr, VARLEN: tl.constexpr, HAS_WINDOW: tl.constexpr,
    BATCH_BLOCK: tl.constexpr, EMPTY_CHUNK: tl.constexpr = False, target=0, BALANCE: tl.constexpr = 0,
):
    """Requests ``bs = b0 + [0, BATCH_BLOCK)`` and their chunk counts (0 past ``batch``): one step of
    the decode and merge kernels' scan over the batch, which must agree chunk for chunk
    (:func:`_tiles_chunks`)."""
    bs = b0 + tl.arange(0, BATCH_BLOCK)
    tiles = _request_tiles(bs, bs < batch, seq_lens_ptr, qsl_ptr, window, max_kv, num_tokens,
                           BLOCK_N, QMAX, VARLEN, HAS_WINDOW, EMPTY_CHUNK)
    return bs, _tiles_chunks(tiles, total, programs, min_tiles, spread, EMPTY_CHUNK, target, BALANCE)


@triton.jit
def _tiles_chunks(tiles, total, programs, min_tiles, spread, EMPTY_CHUNK: tl.constexpr = False, target=0,
                  BALANCE: tl.constexpr = 0):
    """Chunk counts of requests with ``tiles`` (:func:`_request_chunks`). ``EMPTY_CHUNK`` (the decode kernel's fused
    merge, no merge kernel; ``tiles`` from ``MARK_EMPTY``): a request the decode kernel serves that has no visible key
    gets one chunk too, whose program writes its zero rows (the sinks alone in the LSE), as the merge kernel does for it
    otherwise."""
    if EMPTY_CHUNK:
        return tl.where(tiles < 0, 1, _request_chunks(tl.maximum(tiles, 0), total, programs, min_tiles, spread,
                                                      target, BALANCE))
    return _request_chunks(tiles, total, programs, min_tiles, spread, target, BALANCE)


@triton.jit
def _request_chunks(tiles, total, programs, min_tiles, spread, target, BALANCE: tl.constexpr = 0):
    """Chunks of requests with ``tiles`` KV tiles: their share of ``programs`` rounded down,
    ``floor(tiles * programs / total)`` (never more chunks than ``programs``: rounding up left a
    last, mostly idle wave; the host picks how many waves ``programs`` spans), at least 1 (0 for no tiles) and at most
    :func:`_chunk_cap`. A request's chunks split its tiles evenly. ``BALANCE`` (``SPLIT_BALANCE_STEPS``):
    ``cdiv(tiles, target)`` (:func:`_cdiv_small`) in place of the share where ``target`` (:func:`_balance_target`) is
    not 0."""
    t64 = tiles.to(tl.int64)
    share = (t64 * programs) // total
    if BALANCE:  # (target 0: more requests than programs, the floor rule)
        share = tl.where(target > 0, _cdiv_small(t64, tl.maximum(target, 1)), share)
    n = tl.minimum(tl.maximum(share, 1), _chunk_cap(tiles, total, min_tiles, spread))
    return tl.where(tiles > 0, n, 0).to(tl.int32)


@triton.jit
def _chunk_cap(tiles, total, min_tiles, spread):
    """The most chunks a request of ``tiles`` KV tiles (>= 0) takes, int64: ``tiles // min_tiles``, or, where the
    batch's ``total`` tiles are few (``SPLIT_SPREAD_PROGRAMS_PER_SM``), its part of ``spread`` chunks,
    ``floor(spread * tiles / total)``, in chunks of at least ``max(min_tiles // 4, 1)`` tiles; at least 1. The second
    term passes the first only where ``total < spread * min_tiles`` (one request of 1K keys: 8 chunks of 2 tiles
    in place of 2 of 8), so a batch of more tiles keeps the chunks of at least ``min_tiles``; it is worked out only
    there (a branch every program takes alike: a larger batch's scan pays one comparison for it)."""
    cap = tl.maximum(tiles // min_tiles, 1).to(tl.int64)
    if total < spread * min_tiles:
        few = tl.minimum((tiles // tl.maximum(min_tiles // 4, 1)).to(tl.int64), (tiles.to(tl.int64) * spread) // total)
        cap = tl.maximum(cap, few)
    return cap


@triton.jit
def _cdiv_small(t, d):
    """``cdiv(t, d)`` (int64) for ``0 <= t < 2^26``, ``1 <= d < 2^26`` and a quotient below 2^21 (a request's tiles,
    a chunk length; at most ``programs`` chunks) without an integer division (a 64-bit one is a call of about a
    hundred instructions): an fp32 estimate of ``t / d`` is within 2 of the floor, two exact corrections make it the
    floor. decode_gluon's twin gives the same integers."""
    q = (t.to(tl.float32) * (1.0 / d.to(tl.float32))).to(tl.int64)
    for _ in tl.static_range(2):
        q = tl.where(q * d > t, q - 1, tl.where((q + 1) * d <= t, q + 1, q))
    return q + (q * d < t).to(tl.int64)  # floor -> ceiling


@triton.jit
def _cdiv_wide(a, d):
    """``cdiv(a, d)`` (int64) for ``0 <= a < 2^53`` (the batch's tiles) and ``1 <= d < 2^31`` without a 64-bit
    integer division: the fp64 quotient is within 1 of the floor, one exact correction makes it the floor."""
    d64 = tl.zeros((), tl.int64) + d  # (d may be an argument specialized to the constant 1)
    q = (a.to(tl.float64) / d64.to(tl.float64)).to(tl.int64)
    q = tl.where(q * d64 > a, q - 1, tl.where((q + 1) * d64 <= a, q + 1, q))
    return q + (q * d64 < a).to(tl.int64)


@triton.jit
def _chunks_within(t, cap, mid):
    """Chunks of requests with ``t`` tiles (int64) and chunk caps ``cap`` at chunk length ``mid``, summed."""
    return tl.sum(tl.where(t > 0, tl.minimum(_cdiv_small(t, mid), cap), 0), 0)


@triton.jit
def _balance_target(
    t0, batch, total, programs, min_tiles, spread, seq_lens_ptr, qsl_ptr, window, max_kv, num_tokens,
    BLOCK_N: tl.constexpr, QMAX: tl.constexpr, VARLEN: tl.constexpr, HAS_WINDOW: tl.constexpr,
    BATCH_BLOCK: tl.constexpr, BALANCE: tl.constexpr,
):
    """``SPLIT_BALANCE_STEPS``: the chunk length ``T`` (tiles, int64) whose chunks (``cdiv(tiles, T)`` a request,
    capped as :func:`_request_chunks` caps them) fit in ``programs``, as short as ``BALANCE`` bisection steps find it.
    No ``T`` below ``cdiv(total, programs)`` fits; ``cdiv(total, programs - live)`` (``live``: requests with tiles)
    and the longest request always do (``sum(cdiv(t, T)) <= total / T + live``), so the search starts between them
    (tiles 24..27 for a ragged batch of 8 requests of 1K-30K keys on 66 programs), and the chunks never pass
    ``programs`` (nor the grid, nor the merge slots) whatever the steps. A batch of equal requests skips the search:
    ``T = cdiv(tiles, n)`` with ``n`` the floor rule's chunk count, the same longest chunk. 0 (the floor rule) where
    the requests outnumber the programs, or ``BALANCE`` is 0. ``t0``: the first ``BATCH_BLOCK`` requests' tiles, loaded
    once by the caller and kept for the steps (a -1 of ``MARK_EMPTY`` counts 0); later blocks are read again in each.
    No integer division on a per-request value (:func:`_cdiv_small`, :func:`_cdiv_wide`)."""
    if BALANCE == 0:
        return tl.zeros((), tl.int64)
    t0 = tl.maximum(t0, 0)
    cap0 = _chunk_cap(t0, total, min_tiles, spread)
    t0 = t0.to(tl.int64)
    hi = tl.max(t0, 0)
    least = tl.min(tl.where(t0 > 0, t0, 2**62), 0)
    live = tl.sum((t0 > 0).to(tl.int64), 0)
    for b0 in range(BATCH_BLOCK, batch, BATCH_BLOCK):
        bs = b0 + tl.arange(0, BATCH_BLOCK)
        t = _request_tiles(bs, bs < batch, seq_lens_ptr, qsl_ptr, window, max_kv, num_tokens,
                           BLOCK_N, QMAX, VARLEN, HAS_WINDOW).to(tl.int64)
        hi = tl.maximum(hi, tl.max(t, 0))
        least = tl.minimum(least, tl.min(tl.where(t > 0, t, 2**62), 0))
        live += tl.sum((t > 0).to(tl.int64), 0)
    hi = tl.maximum(hi, 1)
    if live > programs:
        hi = hi * 0
    elif least >= hi:  # equal requests (or none): the floor rule's chunks
        # (int32: live <= batch, hi < 2^26; inline divisions)
        h32 = hi.to(tl.int32)
        n = tl.minimum(tl.maximum(programs // tl.maximum(live.to(tl.int32), 1), 1),
                       _chunk_cap(h32, total, min_tiles, spread).to(tl.int32))
        hi = ((h32 + n - 1) // n).to(tl.int64)
    else:
        rest = tl.maximum(programs - live, 1)
        lo = tl.maximum(_cdiv_wide(total, programs), 1)  # (only the search needs it)
        hi = tl.minimum(hi, _cdiv_wide(total, rest))
        for _ in tl.static_range(BALANCE):
            mid = (lo + hi) // 2
            used = _chunks_within(t0, cap0, mid)
            for b0 in range(BATCH_BLOCK, batch, BATCH_BLOCK):
                bs = b0 + tl.arange(0, BATCH_BLOCK)
                t = _request_tiles(bs, bs < batch, seq_lens_ptr, qsl_ptr, window, max_kv, num_tokens,
                                   BLOCK_N, QMAX, VARLEN, HAS_WINDOW)
                used += _chunks_within(t.to(tl.int64), _chunk_cap(t, total, min_tiles, spread), mid)
            fits = used <= programs
            hi = tl.where(fits, mid, hi)
            lo = tl.where(fits, lo, mid + 1)
    return hi


@triton.jit
def _scan_block(c, bs, ch, base, base_m, b, j, n_chunks, slot0):
    """One block of the decode kernel's scan over the batch: requests ``bs`` with ``ch`` chunks, numbered from ``base``
    (partial slots from ``base_m``, multi-chunk requests only); chunk ``c``'s request, index, chunk count and first
    slot gathered where ``c`` falls in the block."""
    lo = base + tl.cumsum(ch, 0) - ch
    multi = tl.where(ch > 1, ch, 0)
    lo_m = base_m + tl.cumsum(multi, 0) - multi
    hit = (c >= lo) & (c < lo + ch)
    b = tl.maximum(b, tl.max(tl.where(hit, bs, -1), 0))
    j += tl.sum(tl.where(hit, c - lo, 0), 0)
    n_chunks += tl.sum(tl.where(hit, ch, 0), 0)
    slot0 += tl.sum(tl.where(hit, lo_m, 0), 0)
    return base + tl.sum(ch, 0), base_m + tl.sum(multi, 0), b, j, n_chunks, slot0


@triton.jit
def _split_totals(
    batch, programs, min_tiles, spread, seq_lens_ptr, qsl_ptr, window, max_kv, num_tokens,
    BLOCK_N: tl.constexpr, QMAX: tl.constexpr, VARLEN: tl.constexpr, HAS_WINDOW: tl.constexpr,
    BATCH_BLOCK: tl.constexpr, BALANCE: tl.constexpr, MARK_EMPTY: tl.constexpr,
):
    """What every program of the split needs before its scan: the first ``BATCH_BLOCK`` requests' tiles (loaded once:
    a batch of at most ``BATCH_BLOCK`` reads its lengths once), the batch's total tiles and the balanced target
    (:func:`_request_tiles`, :func:`_total_tiles`, :func:`_balance_target`)."""
    bs0 = tl.arange(0, BATCH_BLOCK)
    t0 = _request_tiles(bs0, bs0 < batch, seq_lens_ptr, qsl_ptr, window, max_kv, num_tokens,
                        BLOCK_N, QMAX, VARLEN, HAS_WINDOW, MARK_EMPTY)
    total = _total_tiles(t0, batch, seq_lens_ptr, qsl_ptr, window, max_kv, num_tokens,
                         BLOCK_N, QMAX, VARLEN, HAS_WINDOW, BATCH_BLOCK)
    target = _balance_target(t0, batch, total, programs, min_tiles, spread, seq_lens_ptr, qsl_ptr, window, max_kv,
                             num_tokens, BLOCK_N, QMAX, VARLEN, HAS_WINDOW, BATCH_BLOCK, BALANCE)
    return bs0, t0, total, target


@triton.jit
def _table_entry(table_ptr, c):
    """``TABLE``: chunk ``c``'s ``(b, j, n_chunks, slot0)`` from :func:`_decode_table_kernel`'s table."""
    e = table_ptr + 4 * c.to(tl.int64)
    return tl.load(e), tl.load(e + 1), tl.load(e + 2), tl.load(e + 3)


@triton.jit
def _store_plan(plan_ptr, b, j, kvh, n_chunks, slot0):
    """``PLAN``: request ``b``'s chunk count and first partial slot, stored once (chunk 0, KV head 0) for the merge
    kernel (:func:`_decode_reduce_kernel` reads them after its wait for the decode)."""
    if (j == 0) & (kvh == 0):
        tl.store(plan_ptr + 2 * b.to(tl.int64), n_chunks)
        tl.store(plan_ptr + 2 * b.to(tl.int64) + 1, slot0)


@triton.jit
def _table_block(
    table_ptr, plan_ptr, bs, tiles, total, programs, min_tiles, spread, target, batch, n_slots, base, base_m,
    EMPTY_CHUNK: tl.constexpr, BALANCE: tl.constexpr,
):
    """One block of :func:`_decode_table_kernel`: requests ``bs`` with ``tiles``, their chunks numbered from ``base``
    (partial slots from ``base_m``), stored; returns the next block's ``base``, ``base_m``."""
    ok = bs < batch
    ch = _tiles_chunks(tiles, total, programs, min_tiles, spread, EMPTY_CHUNK, target, BALANCE)
    lo = base + tl.cumsum(ch, 0) - ch
    multi = tl.where(ch > 1, ch, 0)
    lo_m = base_m + tl.cumsum(multi, 0) - multi
    tl.store(plan_ptr + 2 * bs.to(tl.int64), ch, mask=ok)
    tl.store(plan_ptr + 2 * bs.to(tl.int64) + 1, lo_m, mask=ok)
    for j in range(0, tl.max(ch, 0)):  # a request's chunks, one store of each field per chunk index
        c = lo + j
        m = ok & (j < ch) & (c < n_slots)
        e = table_ptr + 4 * c.to(tl.int64)
        tl.store(e, bs, mask=m)
        tl.store(e + 1, tl.zeros_like(bs) + j, mask=m)
        tl.store(e + 2, ch, mask=m)
        tl.store(e + 3, lo_m, mask=m)
    return base + tl.sum(ch, 0), base_m + tl.sum(multi, 0)


@triton.jit(do_not_specialize=(*fp4.DECODE_PER_STEP, "n_slots"))
def _decode_table_kernel(
    seq_lens_ptr, qsl_ptr, table_ptr, plan_ptr, status_ptr,
    batch, programs, min_tiles, spread, window, max_pages, page_size, num_tokens, n_slots,
    BLOCK_N: tl.constexpr, QMAX: tl.constexpr, VARLEN: tl.constexpr, HAS_WINDOW: tl.constexpr,
    BATCH_BLOCK: tl.constexpr, BALANCE: tl.constexpr, EMPTY_CHUNK: tl.constexpr, SLOT_BLOCK: tl.constexpr,
):
    """``DECODE_TABLE_MIN_BATCH``: the decode's work split worked out once, by one program, before the decode, so that
    no decode program scans the batch. The same integers as the decode kernels' scan (:func:`_request_tiles`,
    :func:`_total_tiles`, :func:`_balance_target`, :func:`_tiles_chunks`, chunks numbered in request order, partial
    slots over the requests of more than one chunk): chunk slot ``c`` of the grid gets ``table[4 c .. 4 c + 3] =
    (b, j, n_chunks, slot0)``, its request, its index there, the request's chunk count and first partial slot (``b =
    -1`` past the last chunk: that program returns), and request ``b`` gets ``plan[2 b], plan[2 b + 1] = (n_chunks,
    slot0)`` for the merge kernel (``PLAN``). Entries are stored only inside the ``n_slots`` slots of the grid.
    ``VARLEN``: nothing when the guard found ``query_start_loc`` decreasing (every decode and merge program returns
    then, before reading the table)."""
    if VARLEN:  # noqa: SIM102
        if tl.load(status_ptr) != 0:
            return
    max_kv = max_pages.to(tl.int64) * page_size
    bs0, t0, total, target = _split_totals(batch, programs, min_tiles, spread, seq_lens_ptr, qsl_ptr, window, max_kv,
                                           num_tokens, BLOCK_N, QMAX, VARLEN, HAS_WINDOW, BATCH_BLOCK, BALANCE,
                                           EMPTY_CHUNK)
    # the first block's lengths as _split_totals loaded them (one round trip less on the decode's critical path)
    zero = tl.zeros((), tl.int32)
    base, base_m = _table_block(table_ptr, plan_ptr, bs0, t0, total, programs, min_tiles, spread, target, batch,
                                n_slots, zero, zero, EMPTY_CHUNK, BALANCE)
    for b0 in range(BATCH_BLOCK, batch, BATCH_BLOCK):
        bs = b0 + tl.arange(0, BATCH_BLOCK)
        tiles = _request_tiles(bs, bs < batch, seq_lens_ptr, qsl_ptr, window, max_kv, num_tokens,
                               BLOCK_N, QMAX, VARLEN, HAS_WINDOW, EMPTY_CHUNK)
        base, base_m = _table_block(table_ptr, plan_ptr, bs, tiles, total, programs, min_tiles, spread, target, batch,
                                    n_slots, base, base_m, EMPTY_CHUNK, BALANCE)
    for c0 in range(0, n_slots, SLOT_BLOCK):  # the slots past the last chunk: no request
        cs = c0 + tl.arange(0, SLOT_BLOCK)
        tl.store(table_ptr + 4 * cs.to(tl.int64), tl.full((SLOT_BLOCK,), -1, tl.int32),
                 mask=(cs >= base) & (cs < n_slots))


@triton.jit(do_not_specialize=fp4.DECODE_PER_STEP)
def _decode_kernel(
    q_ptr, o_ptr, lse_ptr, part_o_ptr, part_lse_ptr,
    k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, seq_lens_ptr, qsl_ptr, sinks_ptr,
    k_scale, v_scale, sm_scale_log2, softcap, window,
    batch, programs, min_tiles, spread, group, num_qo_heads, page_size, page_shift, max_pages, num_tokens,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_lt,
    stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
    stride_ksp, stride_kst, stride_ksh, stride_vsp, stride_vst, stride_vsh,
    stride_bt,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, QMAX: tl.constexpr,
    VARLEN: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr, RETURN_LSE: tl.constexpr, BATCH_BLOCK: tl.constexpr,
    K_SCALE_PTR: tl.constexpr, V_SCALE_PTR: tl.constexpr, FAST: tl.constexpr, DOT_FP32: tl.constexpr,
    DATA_ALIGN: tl.constexpr, SF_ALIGN: tl.constexpr, PAGE_POW2: tl.constexpr,
    num_pages, status_ptr, PREFETCH: tl.constexpr = False, ROTATE: tl.constexpr = False,
    SCALE_WORDS: tl.constexpr = True, counter_ptr=None, FUSED_MERGE: tl.constexpr = False,
    MERGE_CB: tl.constexpr = 1, SWAP_AB: tl.constexpr = False, PDL: tl.constexpr = False,
    BALANCE: tl.constexpr = 0, plan_ptr=None, PLAN: tl.constexpr = False, table_ptr=None,
    TABLE: tl.constexpr = False,
):
    """Length-balanced split-KV decode: program (work chunk ``c``, kv head) over ``G * QMAX`` rows.

    The batch's KV tiles (of every request the kernel serves, counted from the real ``seq_lens`` on
    the device) are shared out over about ``programs`` chunks that never cross a request: request
    ``b`` gets its share ``floor(tiles_b * programs / total)`` (at least 1, at most
    ``tiles_b // min_tiles``, :func:`_request_chunks`; ``BALANCE``: ``cdiv(tiles_b, T)`` chunks with ``T`` from
    :func:`_balance_target`) and splits its tiles evenly over them; chunks
    are numbered in request order and chunk ``c`` is this program's (programs past the last chunk
    return at once). So a long request gets many programs and a short one few, every program does
    about the same work, and the grid (``programs + batch`` chunks at most) is fixed on the host
    without reading a length: safe under CUDA graphs. A request of one chunk writes its output directly; the chunks of a longer request
    write normalized partials (``v_scale`` applied) and base-2 LSEs into slots
    ``[s_b, s_b + chunks_b)`` (numbered over multi-chunk requests only: at most ``programs``)
    that :func:`_decode_reduce_kernel` merges.

    ``VARLEN``: the request's queries are ``qsl[b]..qsl[b+1]`` (requests with more than ``QMAX`` or no
    query tokens get no tiles: the prefill kernel owns them); otherwise ``QMAX`` rows per request.

    Metadata is never trusted: ``seq_lens[b]`` is clamped to ``[0, max_pages * page_size]`` (what
    the block-table row covers), page ids outside ``[0, num_pages)`` read nothing
    (:func:`_attend_tile`), and with ``VARLEN`` the ``qsl`` entries are clamped to ``[0, num_tokens]``
    and every program returns when :func:`_qsl_guard_kernel` found them decreasing (``status_ptr``).

    ``ROTATE``: the cache holds ``K H``, ``V H`` (Hadamard): the query is rotated after its load
    (staged through ``out``, :func:`_rotated_query`) and the output before it is normalized and
    stored (partials too: the merge is linear), :mod:`~nvfp4compat.kernels.triton.hadamard`.

    ``PDL`` (SM90+): the merge kernel is this launch's programmatic dependent (``MERGE_PDL``): every program lets it
    launch (``griddepcontrol.launch_dependents``, triton's ``gdc_launch_dependents``) as it starts (1) or once its key
    loop is done (2); a program that returns early lets it launch as it ends.

    ``PLAN`` (``MERGE_PLAN_MIN_BATCH``): chunk 0 of each request, on KV head 0, stores the request's chunk count and
    first partial slot at ``plan_ptr[2 b]``, ``plan_ptr[2 b + 1]`` for the merge kernel, which then need not scan the
    batch. ``TABLE`` (``DECODE_TABLE_MIN_BATCH``): chunk ``c``'s request, index, chunk count and first slot are read
    from ``table_ptr[4 c ..]`` (:func:`_decode_table_kernel`, launched before this kernel) instead of scanning the batch.
    """
    if PDL == 1:
        gdc_launch_dependents()
    # One flat grid, KV heads fastest: neighbouring programs read the same pages (every KV head of a
    # token is in one page row), and every head's chunks are scheduled before the programs past the
    # last chunk. Measured on an H200 at 32 x 8K, GQA 8: 0.295 ms against 0.392 ms with the chunk
    # index fastest (same split, docs/validation-runs/2026-12-03-h200-b).
    num_kv_heads = num_qo_heads // group
    c = tl.program_id(0) // num_kv_heads
    kvh = tl.program_id(0) % num_kv_heads
    if VARLEN:  # noqa: SIM102 (VARLEN is a constexpr: the load exists only in VARLEN builds)
        if tl.load(status_ptr) != 0:  # decreasing qsl: the guard kernel zeroed every row
            return
    max_kv = max_pages.to(tl.int64) * page_size
    if TABLE:
        b, j, n_chunks, slot0 = _table_entry(table_ptr, c)
    else:
        # the first block's lengths are loaded once: they serve the total, the balanced target and the scan
        bs0, t0, total, target = _split_totals(batch, programs, min_tiles, spread, seq_lens_ptr, qsl_ptr, window,
                                               max_kv, num_tokens, BLOCK_N, QMAX, VARLEN, HAS_WINDOW, BATCH_BLOCK,
                                               BALANCE, FUSED_MERGE)
        # Find this chunk's request b, its index j within b, b's chunk count and b's first partial slot.
        zero = tl.zeros((), tl.int32)
        base, base_m, b, j, n_chunks, slot0 = _scan_block(
            c, bs0, _tiles_chunks(t0, total, programs, min_tiles, spread, FUSED_MERGE, target, BALANCE),
            zero, zero, zero - 1, zero, zero, zero,
        )
        for b0 in range(BATCH_BLOCK, batch, BATCH_BLOCK):
            bs, ch = _block_chunks(b0, batch, total, programs, min_tiles, spread, seq_lens_ptr, qsl_ptr, window, max_kv,
                                   num_tokens, BLOCK_N, QMAX, VARLEN, HAS_WINDOW, BATCH_BLOCK, FUSED_MERGE, target,
                                   BALANCE)
            base, base_m, b, j, n_chunks, slot0 = _scan_block(c, bs, ch, base, base_m, b, j, n_chunks, slot0)
    if b < 0:
        return
    if PLAN:
        _store_plan(plan_ptr, b, j, kvh, n_chunks, slot0)

    # clamped to the row as in _request_tiles: the query positions move with it, as in the reference
    seq_len = tl.minimum(tl.maximum(tl.load(seq_lens_ptr + b).to(tl.int64), 0), max_kv)
    if VARLEN:
        q_start, q_len = _query_span(tl.load(qsl_ptr + b), tl.load(qsl_ptr + b + 1), num_tokens)
    else:
        q_start = b * QMAX
        q_len = QMAX

    offs_m = tl.arange(0, BLOCK_M)
    t = offs_m // group
    head = kvh * group + offs_m % group
    row_ok = t < q_len
    tok = q_start + t
    qpos = seq_len - q_len + t
    if ROTATE:  # Q H, rounded to the query's dtype as the unfused path rounds it
        q_lo, q_hi = _rotated_query(
            q_ptr, o_ptr, kvh, group, q_start, q_len, stride_qt, stride_qh, stride_ot, stride_oh,
            HEAD_DIM, BLOCK_M,
        )
    else:
        q_lo, q_hi = _load_query(q_ptr, tok, head, row_ok, stride_qt, stride_qh, HEAD_DIM)
    qk_scale2, softcap_pre, softcap_post, vs = _scales(
        k_scale, v_scale, sm_scale_log2, softcap, q_ptr, K_SCALE_PTR, V_SCALE_PTR, FAST
    )

    # Keys this request's rows can see: [kv_lo, kv_hi), seq_len being clamped to the block-table row.
    # The bounds are worked out in int64 (hostile lengths must not wrap) and are int32 once clamped.
    kv_hi = seq_len
    if HAS_WINDOW:
        kv_lo = tl.minimum(tl.maximum(seq_len - q_len - window + 1, 0), kv_hi)
        full_lo = seq_len - window  # visible to every row from here on
    else:
        kv_lo = seq_len * 0
        full_lo = seq_len * 0
    if CAUSAL:
        full_hi = tl.minimum(seq_len - q_len + 1, kv_hi)  # keys <= the first row's position
    else:
        full_hi = kv_hi
    n_tiles = tl.cdiv(kv_hi - kv_lo, BLOCK_N)
    t_begin = (j.to(tl.int64) * n_tiles) // n_chunks
    t_end = ((j + 1).to(tl.int64) * n_tiles) // n_chunks
    n_mask_lo = tl.minimum(tl.maximum(tl.cdiv(full_lo - kv_lo, BLOCK_N), 0), n_tiles)
    n_full_end = tl.minimum(tl.maximum((full_hi - kv_lo) // BLOCK_N, 0), n_tiles)
    qpos = qpos.to(tl.int32)
    kv_lo = kv_lo.to(tl.int32)
    kv_hi = kv_hi.to(tl.int32)

    acc_lo = tl.zeros((BLOCK_M, HEAD_DIM // 2), dtype=tl.float32)
    acc_hi = tl.zeros((BLOCK_M, HEAD_DIM // 2), dtype=tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc_lo, acc_hi, m_i, l_i = _attend_range(
        acc_lo, acc_hi, m_i, l_i, q_lo, q_hi, qpos,
        kv_lo, kv_hi, t_begin.to(tl.int32), t_end.to(tl.int32), n_mask_lo.to(tl.int32),
        n_full_end.to(tl.int32),
        window, qk_scale2, softcap_pre, softcap_post,
        bt_ptr + b.to(tl.int64) * stride_bt, page_size, page_shift, num_pages,
        k_ptr + kvh * (stride_kh * DATA_ALIGN), v_ptr + kvh * (stride_vh * DATA_ALIGN),
        ks_ptr + kvh * (stride_ksh * SF_ALIGN), vs_ptr + kvh * (stride_vsh * SF_ALIGN),
        stride_kp * DATA_ALIGN, stride_kt * DATA_ALIGN, stride_vp * DATA_ALIGN, stride_vt * DATA_ALIGN,
        stride_ksp * SF_ALIGN, stride_kst * SF_ALIGN, stride_vsp * SF_ALIGN, stride_vst * SF_ALIGN,
        HEAD_DIM, BLOCK_N, CAUSAL, HAS_WINDOW and (QMAX > 1), HAS_SOFTCAP, FAST, DOT_FP32, PAGE_POW2,
        (SF_ALIGN >= 4) and SCALE_WORDS,
        PREFETCH, SWAP_AB=SWAP_AB,
    )
    if PDL == 2:
        gdc_launch_dependents()
    if ROTATE:  # (P V H) H = P V: un-rotated before the (linear) normalization and merge
        acc_lo, acc_hi = rotate_planes(acc_lo, acc_hi, HEAD_DIM)

    if n_chunks == 1:
        _finish(
            acc_lo, acc_hi, m_i, l_i, vs, head, row_ok, tok, o_ptr, lse_ptr, sinks_ptr,
            stride_ot, stride_oh, stride_lt, HEAD_DIM, HAS_SINKS, RETURN_LSE,
        )
    else:
        # The partial output carries `vs` (v_scale with the fp16 fast decoder's 2^8 folded in, from
        # `_scales`), so the merge kernel never needs to know which decoder produced it.
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        lse2 = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))
        o_scale = vs / l_safe
        o = tl.reshape(
            tl.join(acc_lo * o_scale[:, None], acc_hi * o_scale[:, None]), (BLOCK_M, HEAD_DIM)
        )
        prow = ((slot0 + j).to(tl.int64) * num_qo_heads + head) * QMAX + t
        offs_d = tl.arange(0, HEAD_DIM)
        tl.store(part_o_ptr + prow[:, None] * HEAD_DIM + offs_d[None, :], o, mask=row_ok[:, None])
        tl.store(part_lse_ptr + prow, lse2, mask=row_ok)
        if FUSED_MERGE:
            _merge_if_last(
                part_o_ptr, part_lse_ptr, o_ptr, lse_ptr, sinks_ptr,
                counter_ptr + b.to(tl.int64) * num_kv_heads + kvh, slot0, n_chunks,
                head, t, tok, row_ok, num_qo_heads, stride_ot, stride_oh, stride_lt,
                HEAD_DIM, BLOCK_M, QMAX, HAS_SINKS, RETURN_LSE, MERGE_CB,
            )


@triton.jit
def _merge_if_last(
    part_o_ptr, part_lse_ptr, o_ptr, lse_ptr, sinks_ptr, cnt_ptr, slot0, n_chunks,
    head, t, tok, row_ok, num_qo_heads, stride_ot, stride_oh, stride_lt,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, QMAX: tl.constexpr, HAS_SINKS: tl.constexpr,
    RETURN_LSE: tl.constexpr, MERGE_CB: tl.constexpr,
):
    """The decode kernel's fused merge (``FUSED_MERGE``): the last of a request's chunks to finish,
    for one KV head, merges the ``n_chunks`` partials of its rows as :func:`_decode_reduce_kernel`
    does, and writes the output; there is no merge launch.

    Each chunk counts itself in at ``cnt_ptr`` after its partials are stored (a barrier, then one
    acquire-release atomic: the stores of the whole program happen before it). The program that
    sees ``n_chunks - 1`` is the last; it sets the counter back to 0 for the next launch and loads
    the partials past L1 (``.cg``: another request's merge on this SM may have cached a line that
    holds these LSEs before their chunks stored them).
    """
    tl.debug_barrier()
    done = tl.atomic_add(cnt_ptr, 1, sem="acq_rel")
    if done == n_chunks - 1:
        tl.store(cnt_ptr, 0)
        _merge_rows(
            part_o_ptr, part_lse_ptr, o_ptr, lse_ptr, sinks_ptr, slot0, n_chunks,
            head.to(tl.int64) * QMAX + t, head, tok, row_ok, num_qo_heads * QMAX, stride_ot, stride_oh, stride_lt,
            BLOCK_M, HEAD_DIM, MERGE_CB, HAS_SINKS, RETURN_LSE, ".cg",
        )


@triton.jit
def _merge_rows(
    part_o_ptr, part_lse_ptr, o_ptr, lse_ptr, sinks_ptr, slot0, n_chunks,
    row, head, tok, row_ok, slot_rows, stride_ot, stride_oh, stride_lt,
    ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, CHUNK_BLOCK: tl.constexpr, HAS_SINKS: tl.constexpr,
    RETURN_LSE: tl.constexpr, CACHE: tl.constexpr,
):
    """Merge ``n_chunks`` partials of ``ROWS`` output rows and store the output (and LSE).

    Row ``r`` (query ``head[r]`` of token ``tok[r]``, present where ``row_ok``) has its partial of
    chunk ``c`` at ``(slot0 + c) * slot_rows + row[r]``; ``CHUNK_BLOCK`` chunks are loaded per step,
    with ``cache_modifier=CACHE``. The partials already carry ``v_scale`` (and any decoder scale, see
    :func:`_scales`): the merge only weighs them by their LSEs and adds the sinks. No chunk gives zeros
    (the sinks alone in the LSE). Shared by :func:`_decode_reduce_kernel` and the fused merge.
    """
    offs_d = tl.arange(0, HEAD_DIM)
    offs_c = tl.arange(0, CHUNK_BLOCK)
    m = tl.full((ROWS,), float("-inf"), tl.float32)
    l_sum = tl.zeros((ROWS,), dtype=tl.float32)
    acc = tl.zeros((ROWS, HEAD_DIM), dtype=tl.float32)
    # CHUNK_BLOCK chunks per step, loaded at once: a request split into many chunks costs one
    # round trip to memory per CHUNK_BLOCK of them, not one per chunk.
    for s0 in range(0, n_chunks, CHUNK_BLOCK):
        cs = s0 + offs_c
        ok = (cs < n_chunks)[:, None] & row_ok[None, :]
        prow = (slot0 + cs).to(tl.int64)[:, None] * slot_rows + row[None, :]
        lse_s = tl.load(part_lse_ptr + prow, mask=ok, other=float("-inf"), cache_modifier=CACHE)
        o_s = tl.load(part_o_ptr + prow[:, :, None] * HEAD_DIM + offs_d[None, None, :], mask=ok[:, :, None],
                      other=0.0, cache_modifier=CACHE)
        m_new = tl.maximum(m, tl.max(lse_s, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)
        w = tl.exp2(lse_s - m_safe[None, :])
        acc = acc * alpha[:, None] + tl.sum(o_s * w[:, :, None], 0)
        l_sum = l_sum * alpha + tl.sum(w, 0)
        m = m_new
    w_fin, l_safe, lse = _fold_sinks(m, l_sum, sinks_ptr, head, row_ok, HAS_SINKS)
    o = acc * (w_fin / l_safe)[:, None]
    o_row = o_ptr + tok.to(tl.int64) * stride_ot + head.to(tl.int64) * stride_oh
    tl.store(o_row[:, None] + offs_d[None, :], o.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
    if RETURN_LSE:
        tl.store(lse_ptr + tok.to(tl.int64) * stride_lt + head, lse, mask=row_ok)


@triton.jit(do_not_specialize=fp4.DECODE_PER_STEP)
def _decode_reduce_kernel(
    part_o_ptr, part_lse_ptr, o_ptr, lse_ptr, seq_lens_ptr, qsl_ptr, sinks_ptr,
    batch, programs, min_tiles, spread, window, max_pages, page_size, num_tokens,
    num_qo_heads, stride_ot, stride_oh, stride_lt,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, QMAX: tl.constexpr, VARLEN: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_SINKS: tl.constexpr, RETURN_LSE: tl.constexpr,
    BLOCK_H: tl.constexpr, BATCH_BLOCK: tl.constexpr, CHUNK_BLOCK: tl.constexpr,
    status_ptr, PDL: tl.constexpr = False, BALANCE: tl.constexpr = 0, plan_ptr=None, PLAN: tl.constexpr = False,
):
    """Merge the chunks of rows ``(b * QMAX + t)`` for ``BLOCK_H`` query heads per program,
    ``CHUNK_BLOCK`` chunks at a time (:func:`_merge_rows`).

    It recomputes the decode kernel's chunking (same arguments, same integer arithmetic) to find
    request ``b``'s chunk count and first partial slot. A request of one chunk was written by the
    decode kernel itself; one of no chunk (no visible key) gets zeros (the sinks alone in the LSE).

    ``PDL`` (SM90+): launched as the decode kernel's programmatic dependent (``MERGE_PDL``), so it may run while the
    decode does: everything up to the chunk count reads only what was written before the decode launch (lengths,
    ``query_start_loc``, the guard's status), and ``griddepcontrol.wait`` (triton's ``gdc_wait``) waits for the decode's
    partials.

    ``PLAN`` (``MERGE_PLAN_MIN_BATCH``): the chunk count and first slot are read from what the decode kernel stored
    (:func:`_store_plan`), after the wait for the decode, instead of scanning the batch; a request with no visible key
    (which no decode program serves, and whose entry is not written) is known from its own length.
    """
    row = tl.program_id(0)
    hb = tl.program_id(1)
    b = row // QMAX
    t = row % QMAX
    if VARLEN:  # the decode kernel's clamps, so both agree on which rows exist
        if tl.load(status_ptr) != 0:
            return
        q_start, q_len = _query_span(tl.load(qsl_ptr + b), tl.load(qsl_ptr + b + 1), num_tokens)
    else:
        q_start = b * QMAX
        q_len = QMAX
    if (q_len > QMAX) | (t >= q_len):
        return
    max_kv = max_pages.to(tl.int64) * page_size
    if PLAN:
        # (tiles > 0: chunk 0 of this request ran and stored the entry; 0: none did, nothing to read)
        live = _request_tiles(b, b < batch, seq_lens_ptr, qsl_ptr, window, max_kv, num_tokens,
                              BLOCK_N, QMAX, VARLEN, HAS_WINDOW) > 0
        if PDL:
            gdc_wait()
        n_chunks = tl.load(plan_ptr + 2 * b.to(tl.int64), mask=live, other=0)
        slot0 = tl.load(plan_ptr + 2 * b.to(tl.int64) + 1, mask=live, other=0)
        if n_chunks == 1:
            return
    else:
        bs0, t0, total, target = _split_totals(batch, programs, min_tiles, spread, seq_lens_ptr, qsl_ptr, window,
                                               max_kv, num_tokens, BLOCK_N, QMAX, VARLEN, HAS_WINDOW, BATCH_BLOCK,
                                               BALANCE, False)
        ch = _tiles_chunks(t0, total, programs, min_tiles, spread, False, target, BALANCE)
        slot0 = tl.sum(tl.where((bs0 < b) & (ch > 1), ch, 0), 0)
        n_chunks = tl.sum(tl.where(bs0 == b, ch, 0), 0)
        for b0 in range(BATCH_BLOCK, batch, BATCH_BLOCK):
            bs, ch = _block_chunks(b0, batch, total, programs, min_tiles, spread, seq_lens_ptr, qsl_ptr, window,
                                   max_kv, num_tokens, BLOCK_N, QMAX, VARLEN, HAS_WINDOW, BATCH_BLOCK, False, target,
                                   BALANCE)
            slot0 += tl.sum(tl.where((bs < b) & (ch > 1), ch, 0), 0)
            n_chunks += tl.sum(tl.where(bs == b, ch, 0), 0)
        if n_chunks == 1:
            return
        if PDL:
            gdc_wait()
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    _merge_rows(
        part_o_ptr, part_lse_ptr, o_ptr, lse_ptr, sinks_ptr, slot0, n_chunks,
        heads.to(tl.int64) * QMAX + t, heads, q_start + t, heads < num_qo_heads, num_qo_heads * QMAX,
        stride_ot, stride_oh, stride_lt, BLOCK_H, HEAD_DIM, CHUNK_BLOCK, HAS_SINKS, RETURN_LSE, "",
    )


@triton.jit(do_not_specialize=("batch", "num_tokens", "max_kv"))
def _qsl_guard_kernel(
    qsl_ptr, seq_lens_ptr, status_ptr, err_ptr, o_ptr, lse_ptr,
    batch, num_tokens, num_qo_heads, max_kv, stride_ot, stride_oh, stride_lt,
    HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, BLOCK_B: tl.constexpr, RETURN_LSE: tl.constexpr,
):
    """Check ``query_start_loc`` and write the rows it does not cover (prefill, before the attention
    kernels; no host sync).

    Every program scans the clamped entries ``c[b] = clamp(qsl[b], 0, num_tokens)``. When they never
    decrease, request ``b`` owns rows ``[c[b], c[b+1])`` and the rows outside ``[c[0], c[batch])`` (a
    padded batch's tail) belong to nobody: program ``p`` writes zeros (LSE ``-inf``) to those of its
    ``ROWS`` rows. When they decrease, requests would overlap or leave holes: every row is written
    that way, ``status`` is set and the attention kernels do nothing. Program 0 writes ``status`` and
    ORs into the error flag what it found (:mod:`nvfp4compat.kernels.errors`): decreasing entries (4),
    entries outside ``[0, num_tokens]`` (8), ``seq_lens`` outside ``[0, max_kv]`` (16).
    """
    pid = tl.program_id(0)
    dec = tl.zeros((), dtype=tl.int32)
    oob = tl.zeros((), dtype=tl.int32)
    for start in range(0, batch + 1, BLOCK_B):
        offs = start + tl.arange(0, BLOCK_B)
        m = offs <= batch
        raw = tl.load(qsl_ptr + offs, mask=m, other=0)
        c = tl.minimum(tl.maximum(raw, 0), num_tokens)
        prev = tl.load(qsl_ptr + offs - 1, mask=m & (offs > 0), other=0)
        prev = tl.minimum(tl.maximum(prev, 0), num_tokens)
        dec += tl.sum((m & (offs > 0) & (c < prev)).to(tl.int32))
        oob += tl.sum((m & (c != raw)).to(tl.int32))
    bad = dec > 0
    c0 = tl.minimum(tl.maximum(tl.load(qsl_ptr), 0), num_tokens)
    c_end = tl.minimum(tl.maximum(tl.load(qsl_ptr + batch), 0), num_tokens)
    rows = pid * ROWS + tl.arange(0, ROWS)
    covered = (rows >= c0) & (rows < c_end) & (dec == 0)
    fill = (rows < num_tokens) & (covered == 0)
    if tl.sum(fill.to(tl.int32)) > 0:
        offs_d = tl.arange(0, HEAD_DIM)
        zeros = tl.zeros((ROWS, HEAD_DIM), dtype=o_ptr.dtype.element_ty)
        for h in range(num_qo_heads):
            o_row = o_ptr + rows.to(tl.int64) * stride_ot + h * stride_oh
            tl.store(o_row[:, None] + offs_d[None, :], zeros, mask=fill[:, None])
            if RETURN_LSE:
                tl.store(lse_ptr + rows.to(tl.int64) * stride_lt + h,
                         tl.full((ROWS,), float("-inf"), tl.float32), mask=fill)
    if pid == 0:
        sl_bad = tl.zeros((), dtype=tl.int32)
        for start in range(0, batch, BLOCK_B):
            offs = start + tl.arange(0, BLOCK_B)
            sl = tl.load(seq_lens_ptr + offs, mask=offs < batch, other=0)
            sl_bad += tl.sum(((offs < batch) & ((sl < 0) | (sl > max_kv))).to(tl.int32))
        tl.store(status_ptr, bad.to(tl.int32))
        bits = tl.where(bad, 4, 0) | tl.where(oob > 0, 8, 0) | tl.where(sl_bad > 0, 16, 0)
        if bits != 0:
            tl.atomic_or(err_ptr, bits)


@triton.jit(do_not_specialize=("batch", "min_q_len", "max_kv", "num_tokens"))
def _prefill_kernel(
    q_ptr, o_ptr, lse_ptr,
    k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, seq_lens_ptr, qsl_ptr, sinks_ptr,
    k_scale, v_scale, sm_scale_log2, softcap, window,
    batch, group, block_q, min_q_len, page_size, page_shift,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_lt,
    stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
    stride_ksp, stride_kst, stride_ksh, stride_vsp, stride_vst, stride_vsh,
    stride_bt,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr, RETURN_LSE: tl.constexpr,
    K_SCALE_PTR: tl.constexpr, V_SCALE_PTR: tl.constexpr, FAST: tl.constexpr, DOT_FP32: tl.constexpr,
    DATA_ALIGN: tl.constexpr, SF_ALIGN: tl.constexpr, PAGE_POW2: tl.constexpr,
    num_pages, max_kv, num_tokens, status_ptr, ROTATE: tl.constexpr = False,
):
    """Varlen prefill: program (query tile, kv head); tile = ``block_q`` tokens x ``group`` heads.

    Request ``b``'s tiles are numbered from ``qsl[b] // block_q + b`` (no prefix sum needed); the
    program finds its request by binary search. Requests with fewer than ``min_q_len`` query tokens
    are left to the decode kernel. Metadata is clamped as in :func:`_decode_kernel`: ``qsl`` entries
    to ``[0, num_tokens]`` (nothing runs when :func:`_qsl_guard_kernel` found them decreasing),
    ``seq_lens`` to ``[0, max_kv]``, page ids outside ``[0, num_pages)`` read nothing.
    ``ROTATE``: a Hadamard-rotated cache, as in :func:`_decode_kernel`.
    """
    if tl.load(status_ptr) != 0:  # decreasing qsl: the guard kernel zeroed every row
        return
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    lo = pid * 0
    hi = batch - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        start_mid = tl.minimum(tl.maximum(tl.load(qsl_ptr + mid), 0), num_tokens) // block_q + mid
        go_up = start_mid <= pid
        lo = tl.where(go_up, mid, lo)
        hi = tl.where(go_up, hi, mid - 1)
    b = lo
    q_start, q_len = _query_span(tl.load(qsl_ptr + b), tl.load(qsl_ptr + b + 1), num_tokens)
    tile = pid - (q_start // block_q + b)
    q0 = tile * block_q
    if (q0 < 0) | (q0 >= q_len) | (q_len < min_q_len):
        return
    seq_len = tl.minimum(tl.maximum(tl.load(seq_lens_ptr + b), 0), max_kv)

    offs_m = tl.arange(0, BLOCK_M)
    t = offs_m // group
    head = kvh * group + offs_m % group
    row_ok = (t < block_q) & (q0 + t < q_len)
    tok = q_start + q0 + t
    qpos = seq_len - q_len + q0 + t
    if ROTATE:
        q_lo, q_hi = _rotated_query(
            q_ptr, o_ptr, kvh, group, q_start + q0, tl.minimum(block_q, q_len - q0),
            stride_qt, stride_qh, stride_ot, stride_oh, HEAD_DIM, BLOCK_M,
        )
    else:
        q_lo, q_hi = _load_query(q_ptr, tok, head, row_ok, stride_qt, stride_qh, HEAD_DIM)
    qk_scale2, softcap_pre, softcap_post, vs = _scales(
        k_scale, v_scale, sm_scale_log2, softcap, q_ptr, K_SCALE_PTR, V_SCALE_PTR, FAST
    )

    p_min = seq_len - q_len + q0
    p_max = seq_len - q_len + tl.minimum(q0 + block_q, q_len) - 1
    if CAUSAL:
        kv_hi = p_max + 1
        full_hi = p_min + 1
    else:
        kv_hi = seq_len
        full_hi = seq_len
    if HAS_WINDOW:
        kv_lo = tl.maximum(p_min - window + 1, 0)
        full_lo = p_max - window + 1
    else:
        kv_lo = 0
        full_lo = 0
    n_tiles = tl.cdiv(kv_hi - kv_lo, BLOCK_N)
    n_mask_lo = tl.minimum(tl.maximum(tl.cdiv(full_lo - kv_lo, BLOCK_N), 0), n_tiles)
    n_full_end = tl.maximum((full_hi - kv_lo) // BLOCK_N, 0)

    acc_lo = tl.zeros((BLOCK_M, HEAD_DIM // 2), dtype=tl.float32)
    acc_hi = tl.zeros((BLOCK_M, HEAD_DIM // 2), dtype=tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc_lo, acc_hi, m_i, l_i = _attend_range(
        acc_lo, acc_hi, m_i, l_i, q_lo, q_hi, qpos,
        kv_lo, kv_hi, 0, n_tiles, n_mask_lo, n_full_end,
        window, qk_scale2, softcap_pre, softcap_post,
        bt_ptr + b.to(tl.int64) * stride_bt, page_size, page_shift, num_pages,
        k_ptr + kvh * (stride_kh * DATA_ALIGN), v_ptr + kvh * (stride_vh * DATA_ALIGN),
        ks_ptr + kvh * (stride_ksh * SF_ALIGN), vs_ptr + kvh * (stride_vsh * SF_ALIGN),
        stride_kp * DATA_ALIGN, stride_kt * DATA_ALIGN, stride_vp * DATA_ALIGN, stride_vt * DATA_ALIGN,
        stride_ksp * SF_ALIGN, stride_kst * SF_ALIGN, stride_vsp * SF_ALIGN, stride_vst * SF_ALIGN,
        HEAD_DIM, BLOCK_N, CAUSAL, HAS_WINDOW, HAS_SOFTCAP, FAST, DOT_FP32, PAGE_POW2, SF_ALIGN >= 4,
    )
    if ROTATE:
        acc_lo, acc_hi = rotate_planes(acc_lo, acc_hi, HEAD_DIM)
    _finish(
        acc_lo, acc_hi, m_i, l_i, vs, head, row_ok, tok, o_ptr, lse_ptr, sinks_ptr,
        stride_ot, stride_oh, stride_lt, HEAD_DIM, HAS_SINKS, RETURN_LSE,
    )


# --------------------------------------------------------------------------------------------------
# Configuration heuristics
# --------------------------------------------------------------------------------------------------


# The compiled kernel of the latest decode / prefill launch (triton's CompiledKernel; whatever the
# launch returns under the interpreter): benchmarks report its registers, spills and shared memory
# (kernel_resources) next to each config's time. One dict store per launch.
LAST_KERNELS: dict[str, Any] = {}


def kernel_resources(compiled: Any, max_shared_mem: int | None = None) -> dict[str, int] | None:
    """``{"registers", "spills", "shared_bytes", "num_warps"}`` of a compiled Triton kernel, plus
    ``"programs_per_sm"`` (resident programs by registers and, given the device's opt-in shared
    memory per block ``max_shared_mem``, by shared memory; 64K registers per SM, allocated per warp
    in units of 256, 1 KB of shared memory reserved per program, as on SM80-SM120). None for an
    object that is not a loaded compiled kernel (e.g. under the interpreter)."""
    try:
        regs, spills = int(compiled.n_regs), int(compiled.n_spills)
        shared, warps = int(compiled.metadata.shared), int(compiled.metadata.num_warps)
    except (AttributeError, TypeError, ValueError):
        return None
    out = {"registers": regs, "spills": spills, "shared_bytes": shared, "num_warps": warps}
    per_warp = -(-max(regs, 1) * 32 // 256) * 256
    fit = 65536 // (per_warp * warps)
    if max_shared_mem:
        fit = min(fit, (max_shared_mem + 1024) // (shared + 1024))
    out["programs_per_sm"] = max(0, min(fit, 32))
    return out


# DecodeConfig.ptx_ring: the most static shared memory its ring may take
PTX_RING_MAX_BYTES = 24 * 1024


@dataclass(frozen=True)
class DecodeConfig:
    """Tile config of the decode kernel: keys per tile, warps, pipeline stages and an optional
    register cap per thread (``maxnreg``: more resident programs, at the risk of spills)."""

    block_n: int
    num_warps: int
    num_stages: int
    maxnreg: int | None = None
    # resident programs per SM (registers and shared memory of the compiled kernel on SM90): the
    # work split sizes one wave with it; None = SPLIT_TARGET_PROGRAMS_PER_SM
    programs_per_sm: int | None = None
    # register double buffering of the unmasked tiles (_attend_prefetched; use num_stages=1):
    # opt-in, not yet timed on a GPU
    prefetch: bool = False
    # block scales loaded as 32-bit words (True, what ships) or as bytes (False). Compiled for sm_90
    # (triton 3.6.0, head_dim 128), word loads keep the layout conversion of the decoded K/V tiles to
    # MMA operands after the E2M1 decode: every tile's bf16 planes go to shared memory and back (128 KB
    # a 128-key tile, against 18 KB read from DRAM). With byte loads Triton moves the conversion
    # before the decode, onto the bytes (docs/attention.md, "Where the shared-memory traffic goes").
    # Not yet timed on a GPU: benchmarks/bench_attention.py sweeps it
    scale_words: bool = True
    # K as the first operand of the logits' MMA (_attend_tile's SWAP_AB): opt-in, not yet timed on a GPU
    swap_ab: bool = False
    # the Gluon kernel (decode_gluon.gluon_decode_kernel) where a launch is eligible
    # (decode_gluon.gluon_decode_eligible; the plain-Triton kernel otherwise): warps own keys
    # (block_n // num_warps each), operands decoded in registers, no shared memory in the key loop
    gluon: bool = False
    # with gluon, on SM89+: E2M1 to E4M3 by bit placement and the hardware E4M3 -> f16 conversion, fp16 MMAs
    # (a bf16 query scaled by a power of two into fp16's range); in the default of _DECODE_CONFIGS_GLUON since run L
    e4m3_cvt: bool = False
    # with gluon, <= 8 rows and 16 keys per warp: the logits transposed, S^T = K Q^T (keys as the MMA's rows, the
    # query its B operand: half the logits MMAs, no padded query rows), P^T turned into the P V operand by
    # movmatrix.trans (decode_gluon._softmax_pv_kt). On sm_90 (triton 3.6.0) with the E4M3 conversion: 128 registers
    # without spill under a 128 cap (4 programs per SM, against 152 and 3), 545 instructions per 16 keys and warp in
    # the unmasked loop against 524. On an H200 (run M) 5-7% faster at 128 x 2K and 32 x 8K (GQA 8), 9% slower on a
    # ragged batch, the same elsewhere; with lean and page_tile (run O) the default of up to 8 rows
    kt_logits: bool = False
    # with gluon and e4m3_cvt (SM89+): the block scales converted by cvt.rn.f16x2.e4m3x2 (exact, two a conversion, in
    # place of an fp32 product and cvt.f16x2.f32 per register) and, in the unmasked loop, no page-id compare (one scan
    # checked them): 489 instructions per 16 keys and warp in the unmasked loop against 524, 238 of them on the ALU
    # pipe against 256, 149 registers (sm_90, triton 3.6.0). On an H200 (run N) 2-4% faster on all six decode shapes:
    # in the default of _DECODE_CONFIGS_GLUON since
    lean: bool = False
    # with gluon: the unmasked loop computes the next tile's logits after this tile's softmax and P V (decode_gluon,
    # SKEW), so the scheduler has independent work beside the softmax's dependent chain. Opt-in: with page_tile on an
    # H200 (run O) 9-44% slower than page_tile alone on all six decode shapes; without it not yet timed
    skew_logits: bool = False
    # with gluon, where the page size is a power of two and a multiple of the keys per warp (block_n // num_warps) and
    # there is no window: one page id per warp and tile in the unmasked loop, its loads at one row offset per warp plus
    # loop-invariant thread offsets, unmasked, the token strides as constexprs (decode_gluon, PAGE_TILE): 410
    # instructions per 16 keys and warp in the unmasked loop against lean's 486 (sm_90, triton 3.6.0). On an H200 (run
    # O) 2-5% faster than lean alone on all six decode shapes; with lean and kt_logits the default of up to 8 rows
    page_tile: bool = False
    # with gluon and e4m3_cvt (SM89+): the E2M1 decoders shift the high nibbles by an IMAD.HI (FMA pipe) in place of
    # an SHF (ALU pipe, which the decode keeps busiest): exact, 16 ALU instructions fewer per 16 keys and warp on sm_90.
    # Opt-in: with lean, kt_logits and page_tile on an H200 (run O) 1-2% slower than without it on all six decode shapes
    imad_shr: bool = False
    # with gluon: the unmasked tiles rescale the accumulator only when a row's maximum grows by more than 2^8
    # (decode_gluon, LAZY). Exact. A program of one warp branches on its own state; with more warps the test reduces
    # over them (shared memory and 3 barriers per tile: sm_90, triton 3.6.0, the default's unmasked loop 403
    # instructions per 16 keys and warp where no row moves, against 408). Opt-in, not yet run on a GPU
    lazy_rescale: bool = False
    # with gluon: the softmax sums stay each thread's partial sums of its own logits, reduced once after the key loops
    # instead of across lanes on every tile (decode_gluon, DEFER_SUM): exact up to the order of the additions. sm_90
    # (triton 3.6.0), unmasked loop per 16 keys and warp: the default 405 instructions against 408 (6 shuffles and 8
    # adds fewer, 4 FMAs more; ptxas moves some address arithmetic to the uniform datapath), 121 registers against 116.
    # Opt-in, not yet run on a GPU
    defer_sum: bool = False
    # with gluon, kt_logits and page_tile (where a launch takes them), no skew or lazy rescale, and no ring or a ring of
    # 4: the unmasked loop takes two tiles per step with one online-softmax update for both (one maximum across the
    # lanes, one rescale of the accumulator), decode_gluon PAIR. Exact up to rounding. sm_90 (triton 3.6.0), per 16 keys
    # and warp: the default 383 instructions against 408 at the same 128-register cap without spill (4 programs per
    # SM); with a ring of 4, 411 (126 registers) against the ring of 3's 455. Opt-in, not yet run on a GPU
    tile_pairs: bool = False
    # keys per chunk of the work split at least (None: SPLIT_MIN_CHUNK_TOKENS). A program of fewer warps holds fewer
    # keys per tile: at 512 keys a one-warp program's warp walks 4x the keys of a four-warp program's, and one 8K
    # request splits into 16 one-warp programs per KV head (BENCHMARKS.md run O, config 14: 1.76x the default's time)
    min_chunk_tokens: int | None = None
    # with gluon and page_tile (where a launch takes it), n >= 2: the unmasked loop's K and V words pass through a ring of
    # n tiles in shared memory, copied by cp.async n - 1 tiles ahead, in place of the one tile held ahead in registers
    # (decode_gluon, RING); the block scales stay register loads one tile ahead. 0: off. Opt-in; on an H100 (run P)
    # 2-10% slower than the default (ring of 3)
    ring: int = 0
    # with a ring (n >= 2, no tile_pairs), on SM90+ where the cache's K and V data rows start on 16-byte boundaries: the
    # ring is filled by TMA from one loader warp (decode_gluon, TMA: warp-specialized, one box of 16 keys x 64 B per
    # warp's page and tensor, full / empty mbarriers per stage) instead of cp.async from every thread. The program's
    # warps only wait, read each stage back and release it. The launch has 8 warps (the loader's warp group: 1 working,
    # at 24 registers); the program's 4 warps get the registers maxnreg leaves (maxnreg 64: 104 each, 4 programs per
    # SM). Elsewhere the config runs its ring by cp.async. Opt-in; on an H100 (run Q) correct and 0.1-18% slower than
    # the default
    tma_loader: bool = False
    # with a cp.async ring of 3 or more tiles (no tma_loader, no tile_pairs): how many tiles ahead the unmasked loop loads
    # the block scales to registers, 1 or 2 (decode_gluon, SCALE_AHEAD). With 1 the ring's deeper K / V copies still
    # wait on scale loads issued one step before, which may be why rings of 3-5 did not pay on an H100 (runs P, Q, S);
    # with 2 (and the page ids three tiles ahead) every global load of the loop but the page ids' has two steps to land,
    # for the registers of one more tile's scales. Opt-in: on an H100 (run S) correct (64 GPU tests, memcheck) and 0.9-12%
    # slower than the same ring with 1 (3.8% faster on a ragged batch with a ring of 3, still 5.7% slower than the
    # default). ptxas packs each two 16-bit K scale loads into one register (PRMT) in the step that issues them, so
    # they are waited for there (docs/attention.md item 9)
    scales_ahead: int = 1
    # with a cp.async ring (n >= 2, no tma_loader, no tile_pairs): the ring is a shared-memory array declared in inline
    # PTX, filled by inline-PTX cp.async and read back by ld.shared (decode_gluon, PRING), so Triton sees no
    # shared-memory access and inserts no bar.sync around it (run S: about two per tile and warp with Triton's ring,
    # 11-19% of the stall samples). Each thread reads back only the bytes it copied, after its own cp.async.wait_group.
    # The ring is static shared memory (n x block_n x 128 bytes), beside Triton's dynamic allocation; at most 24 KB, so
    # that both stay within the 48 KB a launch gets without the opt-in that Triton makes only for its dynamic memory.
    # Opt-in, not yet run on a GPU
    ptx_ring: bool = False
    # with gluon and page_tile (where a launch takes it), no ring or the ptx_ring one: the unmasked loop loads its K and
    # V words with an L2 prefetch size of 64, 128 or 256 bytes (decode_gluon, L2_FETCH: ld.global.L2::<n>B in inline
    # PTX; with ptx_ring its cp.async copies take the hint). A KV head's K or V row of a token is 64 bytes, and vLLM's
    # NHD page puts the other KV heads' rows of the token beside it: with 128 or 256, a miss fills the rows of 2 or 4 KV
    # heads in one DRAM access, which the neighbouring programs (the other KV heads of the same chunk, launched beside
    # this one) then find in L2. 0: Triton's load. On an H100 (run V) 128 was 0.2-8.3% faster than 0 on all seven decode
    # shapes (repeated on a second machine, a tie on one 8K request there), 256 about the same: 128 is the default of up
    # to 8 rows (_DECODE_CONFIGS_GLUON)
    l2_fetch: int = 0
    # with gluon and page_tile (where a launch takes it), no ring and no tile_pairs, 16 keys per warp, n >= 2: the
    # one-tile loop asks L2 for tile i + n's K and V rows and block scales in step i (decode_gluon, L2_AHEAD:
    # prefetch.global.L2, which takes no register and is never waited for), on top of tile i + 1's loads to registers.
    # Run S's counters put the default's long-scoreboard stalls on those loads (98% at the first use of a K / V word);
    # the rings that held more tiles in flight paid in barriers and shared-memory round trips. 0: off. Opt-in: on an
    # H100 (run V) 3 and 6 were 11-92% slower than without (DRAM 46% of peak against 75% under ncu at 16 x 16K)
    l2_ahead: int = 0
    # with l2_fetch: the block-scale loads of the same loop take the same L2 prefetch size (decode_gluon, L2_SCALES). A
    # KV head's K scales of a token are 8 bytes of a 64-byte row of all KV heads' (vLLM's NHD page), so each 2-byte load
    # uses 8 bytes of a 32-byte sector: run V's ncu puts 95% of the default's excess L2 sectors on these loads. Opt-in:
    # on an H100 (run V) within 0.7% of the default on all seven decode shapes
    l2_scales: bool = False
    # with gluon and page_tile (where a launch takes it), no ring, no tile_pairs and no l2_ahead, n >= 2, on SM90+ (other
    # GPUs run the config without it): the one-tile loop asks L2 for tile i + n in step i by bulk prefetches (decode_gluon,
    # L2_BULK: cp.async.bulk.prefetch.L2, the TMA unit's, one instruction per warp and tensor, no register, no L1 miss
    # slot, never waited for). In NHD one page span holds every KV head's rows of a warp's keys, and the programs of a
    # chunk's KV heads (running side by side) take turns asking for it; in HND each program asks for its own rows every
    # tile. l2_ahead's per-thread prefetch.global.L2 held the loads back (run V); this one leaves the SM's
    # load path alone. Opt-in: on an H100 (run W) slower on six decode shapes, the more so the further ahead (2: +0.9% to
    # +6.4%, 3: up to +13.5%, 5: up to +32.5%; ncu with 3: 11% more DRAM bytes); GPU tests and memcheck pass. Kept for
    # the H200, where the default reads less of DRAM's peak (run O: 57%, the H100 77%)
    l2_bulk: int = 0
    # with gluon and page_tile (where a launch takes it), no ring, no tile_pairs, no l2_ahead and no l2_bulk: the unmasked
    # range's page ids are checked after its first tile's K and V words are asked for (at those ids clamped into the
    # cache; dropped where an id is bad, and the masked loop takes the range), not before (decode_gluon, EARLY). The
    # check's block-table reads then hit the lines that the first tile's page ids brought to L1, and its round trip
    # overlaps the words' in place of coming before it: one dependent memory round trip less before each program's
    # first tile, which a short chunk (one request of 1K keys: 2 tiles a program) feels most. Opt-in: on an H100 (run Y)
    # within -1.0% / +1.2% of the default on five decode shapes (one request of 1K, 2K and 8K keys, 2 x 4K, 4 short
    # ragged requests); its GPU tests and memcheck pass
    early_check: bool = False
    # with gluon: the warps' softmax states are merged after the key loops in one pass through shared memory (every warp
    # stores its accumulator, maxima and sums, one barrier, each thread merges its own outputs' NW values in registers;
    # decode_gluon._warps_merged, SMEM_MERGE), in place of three cross-warp reductions (each warp summing the whole
    # [rows, 128] result) and their layout conversions. On in the default of up to 8 rows since run AC (H100: 3.4-17.5%
    # faster on ten decode shapes, most on short chunks, where the epilogue is a large share of a program's work)
    smem_merge: bool = False

    def __post_init__(self) -> None:
        if self.smem_merge and not self.gluon:
            raise ValueError(
                f"DecodeConfig(smem_merge=True, gluon={self.gluon}): smem_merge is the Gluon kernel's epilogue; use "
                "smem_merge=False or a gluon=True config"
            )
        if self.early_check and (not self.gluon or not self.page_tile or self.ring or self.tile_pairs or self.l2_ahead
                                 or self.l2_bulk):
            raise ValueError(
                f"DecodeConfig(early_check=True, gluon={self.gluon}, page_tile={self.page_tile}, ring={self.ring}, "
                f"tile_pairs={self.tile_pairs}, l2_ahead={self.l2_ahead}, l2_bulk={self.l2_bulk}): early_check is for "
                "the Gluon kernel's page-tiled loop without a ring, tile_pairs, l2_ahead or l2_bulk; use "
                "early_check=False or such a config"
            )
        if self.l2_bulk < 0 or self.l2_bulk == 1 or (self.l2_bulk and (
                not self.gluon or not self.page_tile or self.ring or self.tile_pairs or self.l2_ahead)):
            raise ValueError(
                f"DecodeConfig(l2_bulk={self.l2_bulk}, gluon={self.gluon}, page_tile={self.page_tile}, ring={self.ring}, "
                f"tile_pairs={self.tile_pairs}, l2_ahead={self.l2_ahead}): l2_bulk is 0 or a tile distance of 2 or "
                "more, for the Gluon kernel's page-tiled loop without a ring, tile_pairs or l2_ahead; use l2_bulk=0 or "
                "such a config"
            )
        if self.l2_scales and (not self.l2_fetch or self.ring):
            raise ValueError(
                f"DecodeConfig(l2_scales=True, l2_fetch={self.l2_fetch}, ring={self.ring}): l2_scales gives the block-scale "
                "loads of the ring-less loop the word loads' L2 prefetch size, so it takes an l2_fetch (64, 128 or 256) "
                "and no ring; use l2_scales=False, or set l2_fetch with ring=0"
            )
        if self.l2_fetch not in (0, 64, 128, 256) or (self.l2_fetch and (
                not self.gluon or (self.ring and not self.ptx_ring))):
            raise ValueError(
                f"DecodeConfig(l2_fetch={self.l2_fetch}, gluon={self.gluon}, ring={self.ring}, ptx_ring={self.ptx_ring}): "
                "l2_fetch is 0, 64, 128 or 256 (bytes), for the Gluon kernel without a ring or with the ring in inline "
                "PTX (ptx_ring, whose cp.async copies take the hint); use l2_fetch=0, or gluon=True with ring=0 or "
                "ptx_ring=True"
            )
        if self.l2_ahead < 0 or self.l2_ahead == 1 or (self.l2_ahead and (
                not self.gluon or self.ring or self.tile_pairs or self.block_n != 16 * self.num_warps)):
            raise ValueError(
                f"DecodeConfig(l2_ahead={self.l2_ahead}, gluon={self.gluon}, ring={self.ring}, "
                f"tile_pairs={self.tile_pairs}, block_n={self.block_n}, num_warps={self.num_warps}): l2_ahead is 0 or a "
                "tile distance of 2 or more, for the Gluon kernel without a ring or tile_pairs, at 16 keys per warp "
                "(block_n = 16 x num_warps); use l2_ahead=0 or such a config"
            )
        if self.ptx_ring and (self.ring < 2 or self.tma_loader or self.tile_pairs
                              or self.ring * self.block_n * 128 > PTX_RING_MAX_BYTES):
            raise ValueError(
                f"DecodeConfig(ptx_ring=True, ring={self.ring}, block_n={self.block_n}, tma_loader={self.tma_loader}, "
                f"tile_pairs={self.tile_pairs}): ptx_ring takes a cp.async ring (ring >= 2, tma_loader and tile_pairs "
                f"off) of at most {PTX_RING_MAX_BYTES} bytes (ring x block_n x 128); use ptx_ring=False or such a ring"
            )
        if self.scales_ahead not in (1, 2) or (
            self.scales_ahead == 2 and (self.ring < 3 or self.tma_loader or self.tile_pairs)
        ):
            raise ValueError(
                f"DecodeConfig(scales_ahead={self.scales_ahead}, ring={self.ring}, tma_loader={self.tma_loader}, "
                f"tile_pairs={self.tile_pairs}): scales_ahead is 1, or 2 with a cp.async ring of 3 or more tiles "
                "(ring >= 3, tma_loader and tile_pairs off); use scales_ahead=1 or such a ring"
            )


@dataclass(frozen=True)
class PrefillConfig:
    """Tile config of the prefill kernel: query rows (tokens x GQA group) per tile, keys per tile."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


# Decode tile configs per head_dim, for BLOCK_M = 16 rows (GQA group x q_len <= 16) on a launch that
# fills the GPU. head_dim 128 is measured (H200, triton 3.6.0, bf16, page 16; BENCHMARKS.md, "Decode"):
# 128-key tiles on 4 warps beat 64-key tiles on 2 warps (245 registers: 4 programs per SM) on every
# uniform, ragged and single-request batch but one (page 32, GQA 5: within 12%). Two stages: with the
# page-id check of every tile, three stages take 77,824 bytes of shared memory on SM90 (2 programs
# per SM; measured 0.306 ms at 16 x 16K against 0.268 before the check), two take 59,392 bytes and
# 156 registers (3 programs per SM, as the measured configs had). The other head dims are not measured: they keep tiles of the same
# 8K elements on 4 warps; `decode_config` widens narrow configs where 2 warps lose (see
# DECODE_WIDE_WARPS).
_DECODE_CONFIGS: dict[int, DecodeConfig] = {
    64: DecodeConfig(block_n=128, num_warps=4, num_stages=3),
    128: DecodeConfig(block_n=128, num_warps=4, num_stages=2, programs_per_sm=3),
    256: DecodeConfig(block_n=32, num_warps=4, num_stages=3),
    512: DecodeConfig(block_n=16, num_warps=8, num_stages=2),
}
# head_dim 128 at BLOCK_M 16: the block scales loaded as bytes (scale_words=False), 128-key tiles, 4 warps, 2
# stages, capped at 168 registers (3 programs per SM). Timed side by side with the word-load config above and
# FlashInfer 0.7.2.post1 on an H200 (2026-12-04, BENCHMARKS.md decode run J): 0.2294 against 0.2449 ms at 16 x
# 16K, 0.2411 / 0.2539 at 128 x 2K, 0.0951 / 0.1002 on the 8-request ragged batch, 0.1245 / 0.1312 at 4 x 32K
# (GQA 5, page 32), 0.0199 / 0.0197 for one 8K request; ncu on 16 x 16K: 168 registers (10 B spilled), 26 KB
# of shared memory against 59 KB. Rows beyond 16 (GQA x q_len > 16) and the fused Hadamard rotation keep the
# word-load config: the cap was timed at 16 rows without rotation only, and compiled for sm_90 (triton 3.9.0) the
# rotation spills 52 B under it (the plain kernel 8 B).
_DECODE_CONFIGS_BYTE_SCALES: dict[int, DecodeConfig] = {
    128: DecodeConfig(block_n=128, num_warps=4, num_stages=2, maxnreg=168, programs_per_sm=3, scale_words=False),
}
# The opt-in register double-buffered decode (DecodeConfig.prefetch, _attend_prefetched): 64-key tiles,
# one Triton stage (the loop prefetches by itself). Compiled for sm_90 (triton 3.6.0) it takes 167
# registers and 22,528 bytes of shared memory at head_dim 128 (3 programs per SM; 128-key tiles take 244
# registers). Not yet timed on a GPU: benchmarks/bench_attention.py sweeps it.
PREFETCH_DECODE_CONFIG = DecodeConfig(block_n=64, num_warps=4, num_stages=1, programs_per_sm=3, prefetch=True)
# Byte-loaded block scales (DecodeConfig.scale_words=False): no shared-memory round trip of the decoded
# tiles, but more registers. Compiled for sm_90 (triton 3.6.0, head_dim 128, bf16, 8-byte scale rows as
# the cache has them; registers, shared memory, programs per SM by registers): 64-key tiles, 4 warps,
# 2 stages: 188, 15,616 B, 2; 3 stages: 185, 16,128 B, 2; 32-key tiles: 110, 9,344 B, 4; 128-key tiles:
# 255 (8 B spilled), 26,624 B, 2. Capped at 168 registers (3 per SM) the 64-key configs spill 16 B and
# the 128-key one 48 B. Timed on an H200 (BENCHMARKS.md, decode run G) uncapped, with programs_per_sm 3
# where 2 fit: ncu on 16 x 16K gave 185 registers, 10% achieved occupancy, DRAM 15%, L1/TEX (shared
# memory's unit) 38% busy (76% for the shipped word loads), 2 waves: 1.7x the shipped kernel's time; 3 stages came
# within 10-15% of it over two waves. The capped configs below put 3 per SM again; capped at 128 the
# 64-key, 2-stage config spills 32 B and fits 4 per SM. Timed on an H200 (2026-12-04, BENCHMARKS.md decode run J):
# the 128-key one capped at 168 was 4-6% faster than the word loads on four of five shapes (and within 1% on one
# 8K request): it is the head_dim-128 default (_DECODE_CONFIGS_BYTE_SCALES); the 64-key and 32-key ones were
# slower on most shapes (up to 1.77x).
BYTE_SCALE_DECODE_CONFIGS = (
    DecodeConfig(block_n=64, num_warps=4, num_stages=2, maxnreg=168, programs_per_sm=3, scale_words=False),
    DecodeConfig(block_n=64, num_warps=4, num_stages=3, maxnreg=168, programs_per_sm=3, scale_words=False),
    DecodeConfig(block_n=32, num_warps=4, num_stages=2, programs_per_sm=4, scale_words=False),
    DecodeConfig(block_n=128, num_warps=4, num_stages=2, maxnreg=168, programs_per_sm=3, scale_words=False),
    DecodeConfig(block_n=64, num_warps=4, num_stages=2, maxnreg=128, programs_per_sm=4, scale_words=False),
)
# K as the first operand of the logits' MMA (DecodeConfig.swap_ab, _attend_tile's SWAP_AB), with byte-loaded
# scales: compiled for sm_90 (head_dim 128, bf16, 8-byte scale rows; 2026-12-03) with triton 3.6.0 and 3.9.0, the
# TTGIR keeps no decoded plane in shared memory: the K/V bytes are staged by cp.async (pipelined over the stages)
# and decoded in registers in the operand layouts; S^T = K Q^T is a wgmma with K in registers (64 keys its M), P V
# an mma.sync with V in registers; only Q (once) and the 16 x 64 P tile (per tile) pass through shared memory.
# (Swapping P V too, V^T P^T, kept the decoded V planes in shared memory: Triton does not move that conversion
# across the transpose.) Registers (triton 3.6.0 / 3.9.0), programs per SM by registers: 64-key tiles, 4 warps,
# 3 stages: 196 / 175, 2; capped at 168: 24 / 48 B spilled, 3; 2 stages: 192 / 172, 2. Timed on an H200 (2026-12-04,
# BENCHMARKS.md decode run J): slower than the word-load config on every shape, 1.16-1.78x its time (16 x 16K: 0.3256,
# 0.2901 and 0.3444 ms against 0.2449); ncu on 16 x 16K: L1/TEX 50-58% busy (76% for word loads) but DRAM 18-22%
# (26%). Opt-in only; benchmarks/bench_attention.py still sweeps them.
SWAP_DECODE_CONFIGS = (
    DecodeConfig(block_n=64, num_warps=4, num_stages=3, programs_per_sm=2, scale_words=False, swap_ab=True),
    DecodeConfig(block_n=64, num_warps=4, num_stages=3, maxnreg=168, programs_per_sm=3, scale_words=False,
                 swap_ab=True),
    DecodeConfig(block_n=64, num_warps=4, num_stages=2, programs_per_sm=2, scale_words=False, swap_ab=True),
)
# The Gluon decode (DecodeConfig.gluon, decode_gluon.py): head_dim 128, up to 16 rows, bf16, no rotation. Compiled
# for sm_90 (triton 3.6.0) with at most 8 rows (GQA x q_len <= 8: the O^T orientation), even pages, 32-bit offsets
# (registers, spills, shared memory for the final merge of the warps): 64-key tiles on 4 warps (16 keys per warp
# per tile): 168, none, 16 KB (3 programs per SM); capped at 128: 132 B spilled (4 per SM); 32-key tiles on 2 warps:
# 164, none, 8 KB (6 per SM); 128-key tiles on 8 warps: 177, none (1 per SM), capped at 128 (2 per SM). With 9-16
# rows the 64-key, 4-warp kernel takes 211 registers (2 per SM).
# The default where a launch can take the Gluon kernel (decode_config(gluon=True)). Timed on an H200 against the
# plain-Triton default in one run (2026-12-04, BENCHMARKS.md decode run K): see BENCHMARKS.md.
# The E4M3 conversion (e4m3_cvt: SM89+; SM80/86 take the bit placement of the same config) was 6-12% faster than
# the bit placement on five of six decode shapes and 2% slower on one 8K request (run L, BENCHMARKS.md). Its lean
# scales (lean: the block scales converted by cvt.rn.f16x2.e4m3x2, no page-id compare in the unmasked loop; SM89+ as
# well) were 2-4% faster than the fp32 scales on all six decode shapes of run N (BENCHMARKS.md): the default from run
# N until run O (_GLUON_LEAN), and still the default of 9-16 rows (_DECODE_CONFIGS_GLUON_ROWS16).
_GLUON_LEAN = DecodeConfig(block_n=64, num_warps=4, num_stages=1, programs_per_sm=3, gluon=True, e4m3_cvt=True,
                           lean=True)
# Lean with the transposed logits and one page id per warp and tile (kt_logits, page_tile), capped at 128 registers (4
# programs per SM; over the AOT variants of the default 120-128 registers on sm_80-120 with triton 3.9.0 and 121-127 on
# sm_90 with 3.6.0, none spilled but sm_80's with pages that are not a power of two, 8 bytes):
# 2-15% faster than _GLUON_LEAN on all six decode shapes in two calls of run O (2026-12-05, BENCHMARKS.md): the default
# of up to 8 rows since. Where a launch cannot take a feature (a window or a page size that is not a power of two and
# a multiple of 16 keys: no page_tile; 9-16 rows: no kt_logits) it runs without it; 9-16 rows take _GLUON_LEAN.
# Since run V (2026-12-06) the default loads its K and V words with an L2 prefetch size of 128 bytes (l2_fetch=128):
# 0.2-8.3% faster than without it on all seven decode shapes on an H100 (BENCHMARKS.md, run V). _GLUON_KT_PAGE_TILE is
# the config without it (run O's default, config 11): the sweep's other configs derive from it.
_GLUON_KT_PAGE_TILE = DecodeConfig(block_n=64, num_warps=4, num_stages=1, maxnreg=128, programs_per_sm=4, gluon=True,
                                   e4m3_cvt=True, kt_logits=True, lean=True, page_tile=True)
# Since stop 53 (2026-12-07) the default merges its warps' softmax states in one pass through shared memory
# (smem_merge): on an H100 (run AC, FlashInfer in the same run) 3.4-17.5% faster than without on all ten decode shapes
# timed, one short request included (1 x 1K 0.976x FlashInfer's bf16 time, was 1.065x). GLUON_REDUCE_MERGE_CONFIG is
# the config without it (run V's default), in the sweep as config 53; the sweep's configs that were timed against run
# V's default as "the default with ..." (l2_scales, l2_bulk, early_check) derive from it
_DECODE_CONFIGS_GLUON: dict[int, DecodeConfig] = {
    128: replace(_GLUON_KT_PAGE_TILE, l2_fetch=128, smem_merge=True),
}
GLUON_REDUCE_MERGE_CONFIG = replace(_DECODE_CONFIGS_GLUON[128], smem_merge=False)
# The E4M3 conversion with fp32 block scales (an fp32 product and cvt.f16x2.f32 per register; the default of runs L
# and M): 152 registers and 524 instructions per 16 keys and warp in the unmasked loop on sm_90 (triton 3.6.0), against
# the lean default's 149 and 489. Kept in the sweep, the GPU tests and the sanitizer runs.
GLUON_FP32_SCALES_CONFIG = DecodeConfig(block_n=64, num_warps=4, num_stages=1, programs_per_sm=3, gluon=True,
                                        e4m3_cvt=True)
# 9-16 rows (the 16-row orientation: 211 registers on sm_90) hold 2 programs per SM; without the transposed logits
# (<= 8 rows only) a 128-register cap would spill there, so they take the lean config uncapped
GLUON_ROWS16_PROGRAMS_PER_SM = 2
_DECODE_CONFIGS_GLUON_ROWS16: dict[int, DecodeConfig] = {
    128: replace(_GLUON_LEAN, programs_per_sm=GLUON_ROWS16_PROGRAMS_PER_SM),
}
# the default's features on one warp per program (16 keys per tile), chunks of 128 keys (see GLUON_DECODE_CONFIGS)
_GLUON_ONE_WARP = replace(_GLUON_KT_PAGE_TILE, block_n=16, num_warps=1, maxnreg=104, programs_per_sm=19,
                          min_chunk_tokens=128)
# set when the Gluon kernel failed to compile in this process: every later launch takes the plain-Triton kernel
_gluon_failed = False
# The Gluon kernel's work split divides in 32 bits and fp32 (decode_gluon._chunk_edge, _request_chunks), exact while a
# launch has fewer programs per KV head than this (a few thousand at most on today's GPUs; the plain kernel beyond)
_GLUON_MAX_PROGRAMS = 2**15
# The decode kernels' arguments beyond the ones they share (_run_decode passes the shared ones to both)
_PLAIN_DECODE_ONLY = ("FAST", "DOT_FP32", "PREFETCH", "ROTATE", "SCALE_WORDS", "MERGE_CB", "SWAP_AB")
_GLUON_DECODE_ONLY = ("NW", "ROWS8", "PAGE_EVEN", "OFF32", "CVT8", "KT", "LEAN", "SKEW", "PAGE_TILE", "IMAD_SHR",
                      "LAZY", "TOK_K", "TOK_V", "TOK_KS", "TOK_VS", "RING", "DEFER_SUM", "PAIR", "k_desc", "v_desc",
                      "TMA", "SCALE_AHEAD", "PRING", "L2_FETCH", "L2_AHEAD", "L2_SCALES", "L2_BULK", "EARLY",
                      "SMEM_MERGE")
# The SASS counts in the comments below are those of the change that added each config. Since the page_tile thread
# offsets were split into lane and register parts (decode_gluon._thread_offsets, 2026-12-05) the page_tile configs'
# unmasked loops are shorter (sm_90, triton 3.6.0, per 16 keys and warp): the default 408 instructions and 116
# registers (430, 122 before), page_tile alone and on one warp uncapped 403 at 128 (410 at 156, 148), the one-warp
# config 420 at 104 (434), the ring of 3 455 at 116 (474 at 110), its one-warp form 467 at 103 (475).
# the bit-placement decode (what SM80/86 run; the default of run K), in GLUON_DECODE_CONFIGS as config 48
GLUON_PLACED_CONFIG = DecodeConfig(block_n=64, num_warps=4, num_stages=1, programs_per_sm=3, gluon=True)
GLUON_DECODE_CONFIGS = (
    # the lean scales (the default from run N until run O; 9-16 rows still take it)
    _GLUON_LEAN,
    DecodeConfig(block_n=64, num_warps=4, num_stages=1, maxnreg=128, programs_per_sm=4, gluon=True, e4m3_cvt=True),
    DecodeConfig(block_n=32, num_warps=2, num_stages=1, programs_per_sm=6, gluon=True, e4m3_cvt=True),
    DecodeConfig(block_n=128, num_warps=8, num_stages=1, maxnreg=128, programs_per_sm=2, gluon=True, e4m3_cvt=True),
    # the transposed logits (kt_logits): 4 programs per SM under a 128-register cap (timed in runs M and N: opt-in)
    DecodeConfig(block_n=64, num_warps=4, num_stages=1, maxnreg=128, programs_per_sm=4, gluon=True, e4m3_cvt=True,
                 kt_logits=True),
    GLUON_FP32_SCALES_CONFIG,
    # the lean scales with the transposed logits: 128 registers under the cap, no spill on sm_90. Run N: 6-9% faster
    # than the lean default at 128 x 2K and 32 x 8K (GQA 8), within 1% at 16 x 16K, 4 x 32K (page 32) and on one
    # request, 7% slower on the ragged batch: opt-in
    DecodeConfig(block_n=64, num_warps=4, num_stages=1, maxnreg=128, programs_per_sm=4, gluon=True, e4m3_cvt=True,
                 kt_logits=True, lean=True),
    # the default with the next tile's logits computed after this tile's P V (skew_logits; 160 registers, 3 programs
    # per SM), and lean + kt with it (120 registers under the cap, no spill; sm_90, triton 3.6.0): not yet run on a GPU
    replace(_GLUON_LEAN, skew_logits=True),
    DecodeConfig(block_n=64, num_warps=4, num_stages=1, maxnreg=128, programs_per_sm=4, gluon=True, e4m3_cvt=True,
                 kt_logits=True, lean=True, skew_logits=True),
    # lean with one page id per warp and tile (page_tile), alone, with the skewed logits, and lean + kt with it. Run O
    # (two calls, six decode shapes): page_tile alone 2-5% faster than lean; with the skewed logits 9-44% slower than
    # alone; lean + kt + page_tile 2-15% faster than lean (the default from run O; with l2_fetch=128 since run V)
    replace(_GLUON_LEAN, page_tile=True),
    replace(_GLUON_LEAN, page_tile=True, skew_logits=True),
    _GLUON_KT_PAGE_TILE,  # lean + kt + page_tile: the default of up to 8 rows from run O to run V
    # and both with the high nibbles' shift on the FMA pipe (imad_shr; run O: lean + kt + page_tile with it 1-2% slower
    # than without on all six shapes; page_tile alone with it not yet timed)
    replace(_GLUON_LEAN, page_tile=True, imad_shr=True),
    DecodeConfig(block_n=64, num_warps=4, num_stages=1, maxnreg=128, programs_per_sm=4, gluon=True, e4m3_cvt=True,
                 kt_logits=True, lean=True, page_tile=True, imad_shr=True),
    # one warp per program (16-key tiles; 148 registers on sm_90 with page_tile, 152 allocated: 13 programs per SM), and
    # with the lazy rescale that a program of one warp allows (154, 160 allocated: 12 per SM). Run O: one warp with
    # page_tile within 3% of the default on the ragged batch and 32 x 8K, 1.1-1.8x its time on the other four shapes
    # (1.76x on one 8K request); the lazy rescale not yet timed
    DecodeConfig(block_n=16, num_warps=1, num_stages=1, programs_per_sm=13, gluon=True, e4m3_cvt=True, lean=True,
                 page_tile=True),
    DecodeConfig(block_n=16, num_warps=1, num_stages=1, programs_per_sm=12, gluon=True, e4m3_cvt=True, lean=True,
                 page_tile=True, lazy_rescale=True),
    # the default's features on one warp (16 keys per tile) and on two (32), with chunks of 128 keys per warp at least
    # (min_chunk_tokens; the default's 512 per 4-warp program), and the default with chunks of 256. Smaller programs fit
    # a tighter cap: sm_90 (triton 3.6.0), unmasked loop per 16 keys and warp, without spill: one warp capped at 104
    # registers 434 instructions (19 programs, i.e. warps, per SM; at 96 it spills 48 B), with the lazy rescale at 112
    # 458 (18; at 104 it spills); two warps at 104 431 (9 programs, 18 warps); the default 430 at 122 (16 warps; at
    # 112 no spill but still 4 programs, at 96 56 B spilled). With triton 3.9.0 the two-warp one spills 24-56 B on
    # sm_80-90, the one-warp ones 8 B on sm_100 / sm_120 (lazy). Not yet run on a GPU
    _GLUON_ONE_WARP,
    replace(_GLUON_ONE_WARP, maxnreg=112, programs_per_sm=18, lazy_rescale=True),
    replace(_GLUON_KT_PAGE_TILE, block_n=32, num_warps=2, maxnreg=104, programs_per_sm=9, min_chunk_tokens=256),
    replace(_GLUON_KT_PAGE_TILE, min_chunk_tokens=256),
    # the K and V words through a shared-memory ring of 3 tiles (ring; cp.async two tiles ahead), on the default and on
    # the one-warp config above. sm_90 (triton 3.6.0), unmasked loop per 16 keys and warp: the default 474 instructions
    # against 430 (6 LDGSTS, 9 LDS and 2 barriers that Triton's shared-memory analysis inserts, against 5 LDG of
    # words), 110 registers against 122 (still 4 programs per SM), 24 KB of rings per program; one warp 475 against 434
    # at the 104 cap. The rings need the H100/H200's shared memory for these programs per SM (100 KB SMs fit fewer).
    # Not yet run on a GPU
    replace(_GLUON_KT_PAGE_TILE, ring=3),
    replace(_GLUON_ONE_WARP, ring=3),
    # the softmax sums reduced once after the loop (defer_sum) on the default, on the default with the lazy rescale
    # (four warps: its test crosses them), on the one-warp config and on the ring. sm_90 (triton 3.6.0), unmasked loop
    # per 16 keys and warp, no spill: 405 instructions against the default's 408 (121 registers against 116); with the
    # lazy rescale 391 where no row moves (120 registers, 3 barriers per tile); one warp 424 against 420 (104); the ring
    # 442 against 455 (111 registers against 116). Not yet run on a GPU
    replace(_GLUON_KT_PAGE_TILE, defer_sum=True),
    replace(_GLUON_KT_PAGE_TILE, defer_sum=True, lazy_rescale=True),
    replace(_GLUON_ONE_WARP, defer_sum=True),
    replace(_GLUON_KT_PAGE_TILE, ring=3, defer_sum=True),
    # five programs (20 warps) per SM instead of four: the default and its ring of 3 capped at 96 registers. sm_90
    # (triton 3.6.0), unmasked loop per 16 keys and warp: 427 instructions against 408, 5 of them local-memory spill
    # traffic (48 B spilled); the ring 473 against 455 (4; 40 B), 24 KB of rings per program. Not yet run on a GPU
    replace(_GLUON_KT_PAGE_TILE, maxnreg=96, programs_per_sm=5),
    replace(_GLUON_KT_PAGE_TILE, maxnreg=96, programs_per_sm=5, ring=3),
    # two tiles per softmax update (tile_pairs) on the default, with defer_sum, and on the one-warp config. sm_90 (triton
    # 3.6.0), unmasked loop per 16 keys and warp, no spill: 383 instructions against 408 (128 registers under the cap:
    # still 4 programs per SM), with defer_sum 376; one warp 388 against 420 at a 112 cap (18 warps per SM; at 104 it
    # spills 48 B). Not yet run on a GPU
    replace(_GLUON_KT_PAGE_TILE, tile_pairs=True),
    replace(_GLUON_KT_PAGE_TILE, tile_pairs=True, defer_sum=True),
    replace(_GLUON_ONE_WARP, tile_pairs=True, maxnreg=112, programs_per_sm=18),
    # and with the words through a ring of 4 tiles (two tiles copied ahead, a pair per step), on the default (126
    # registers, 411 instructions per 16 keys and warp, 3 barriers per pair, 32 KB of rings per program) and on one warp
    # (112 registers, 416; 8 KB). Not yet run on a GPU
    replace(_GLUON_KT_PAGE_TILE, tile_pairs=True, ring=4),
    replace(_GLUON_ONE_WARP, tile_pairs=True, ring=4, maxnreg=112, programs_per_sm=18),
    # the ring filled by TMA from one loader warp (tma_loader; SM90+, elsewhere its cp.async ring): 8 warps a program
    # (the loader's group), registers per thread at launch 64 (4 programs per SM; the 4 decoding warps run at 104, the
    # loader at 24) with a ring of 4 (32 KB a program), and 80 (3 per SM; 136 and 24) with a ring of 6 (48 KB). sm_90
    # (triton 3.6.0), the decoding warps' unmasked loop per 16 keys and warp, no spill: 432 and 434 instructions against
    # the default's 408, 6 LDS and 2 barriers among them; the loader starts 8 boxes a tile. H100 (run Q): its GPU tests
    # and memcheck pass; 0.1-18% (ring 4) and 5.5-20% (ring 6) slower than the default on five decode shapes
    replace(_GLUON_KT_PAGE_TILE, ring=4, tma_loader=True, maxnreg=64),
    replace(_GLUON_KT_PAGE_TILE, ring=6, tma_loader=True, maxnreg=80, programs_per_sm=3),
    # the cp.async ring of config 20 (ring 3: two tiles copied ahead) deeper: 3 and 4 tiles ahead. sm_90 (triton 3.6.0):
    # 116 registers, no spill, 32 / 40 KB of rings a program (4 programs per SM). The bet is the H200: at its 4.8 TB/s
    # a latency-bound reader needs more bytes in flight than on an H100, where ring 3 lost 2-10% (run Q). H100 (run S):
    # GPU tests and memcheck pass; 4.1-11.0% (ring 4) and 7.8-14.3% (ring 5) slower than the default on six decode shapes
    replace(_GLUON_KT_PAGE_TILE, ring=4),
    replace(_GLUON_KT_PAGE_TILE, ring=5),
    # the rings of 4 and 3 with the block scales two tiles ahead (scales_ahead=2; page ids three ahead). sm_90: 110 / 109
    # registers, no spill. H100 (run S): GPU tests and memcheck pass; against configs 35 / 20 +12.2% / +1.8% at
    # 16 x 16K, +6.1% / +3.7% at 128 x 2K, +0.9% / -3.8% on the ragged batch
    replace(_GLUON_KT_PAGE_TILE, ring=4, scales_ahead=2),
    replace(_GLUON_KT_PAGE_TILE, ring=3, scales_ahead=2),
    # the ring of 3 (config 20) declared in inline PTX (ptx_ring): no bar.sync in the unmasked loop (config 20: two
    # per tile), 451 instructions per 16 keys and warp against 455, 112 registers, 24 KB of static shared memory
    # beside 16 KB of Triton's (sm_90, triton 3.6.0). Not yet run on a GPU
    replace(_GLUON_KT_PAGE_TILE, ring=3, ptx_ring=True),
    # config 11 with its word loads under an L2 prefetch size of 128 and 256 bytes (l2_fetch: the rows of 2 and 4 KV heads
    # a miss). H100 (run V, seven decode shapes against config 11): 128 0.2-8.3% faster on all seven (the default since),
    # 256 0.6-8.2%. GPU tests and memcheck pass
    _DECODE_CONFIGS_GLUON[128],
    replace(_GLUON_KT_PAGE_TILE, l2_fetch=256),
    # the default with its block-scale loads under the same L2 prefetch size (l2_scales), and l2_fetch 256 with it. H100
    # (run V): within 0.7% and -0.4% to +1.9% of the default on seven shapes; GPU tests and memcheck pass
    replace(GLUON_REDUCE_MERGE_CONFIG, l2_scales=True),
    replace(_GLUON_KT_PAGE_TILE, l2_fetch=256, l2_scales=True),
    # the PTX ring of 3 (config 39) with the default's L2 prefetch size on its cp.async copies (.L2::128B): a candidate
    # for the H200, where the default was latency-bound (run O); not yet run on a GPU
    replace(_GLUON_KT_PAGE_TILE, ring=3, ptx_ring=True, l2_fetch=128),
    # config 11 with prefetch.global.L2 of the tile 3 and 6 ahead (l2_ahead), and 3 with l2_fetch 256. H100 (run V,
    # against config 11): 11-92% slower (with 256, 11-81%); GPU tests and memcheck pass
    replace(_GLUON_KT_PAGE_TILE, l2_ahead=3),
    replace(_GLUON_KT_PAGE_TILE, l2_ahead=6),
    replace(_GLUON_KT_PAGE_TILE, l2_ahead=3, l2_fetch=256),
    # the bit-placement decode (what SM80/86 run; the default of run K): compiled for sm_90 (triton 3.6.0, <= 8 rows)
    # 161 registers and 580 instructions in the unmasked loop per 16 keys and warp, against the E4M3 conversion's
    # 152 and 524 (64 F2FP.F16.E4M3 in place of the bit placement)
    GLUON_PLACED_CONFIG,
    # the default with the tile 2, 3 and 5 ahead asked of L2 by bulk prefetches (l2_bulk, SM90+; elsewhere the default;
    # one program of a chunk's KV heads in turn asks for the rows of all of them, NHD). sm_90 (triton 3.6.0): 122 / 122
    # / 121 registers, no spill; the unmasked loop 433 instructions per 16 keys and warp where it is not this program's
    # turn (the default 408; 17 more of them on the uniform pipe), 25 more in its turn. Candidates for the H200, where
    # the default is latency-bound (run O: DRAM 57% of peak). H100 (run W, six decode shapes against the default):
    # +0.9-6.4% (2), +2.6-13.5% (3), +3.4-32.5% (5); GPU tests and memcheck pass
    replace(GLUON_REDUCE_MERGE_CONFIG, l2_bulk=2),
    replace(GLUON_REDUCE_MERGE_CONFIG, l2_bulk=3),
    replace(GLUON_REDUCE_MERGE_CONFIG, l2_bulk=5),
    # the default with the unmasked range's page check after its first tile's loads (early_check): one dependent round
    # trip less before each program's first tile. sm_90 (triton 3.6.0): 120 registers (the default 119), no spill, the
    # same loads. H100 (run Y, five short decode shapes): within -1.0% / +1.2% of the default; GPU tests and memcheck pass
    replace(GLUON_REDUCE_MERGE_CONFIG, early_check=True),
    # the default before stop 53: the warps' states merged by three cross-warp reductions (the default has smem_merge).
    # sm_90 (triton 3.6.0): 4,860 instructions and 17 barriers against the default's 4,474 and 8; the key loop 408
    # instructions per step against 413. H100 (run AC): 3.4-17.5% slower than the default on ten decode shapes
    GLUON_REDUCE_MERGE_CONFIG,
)
# Warps of a decode launch whose config has fewer, when (a) BLOCK_M > 16: at 2 warps the
# accumulators do not fit (SM90, head_dim 128: BLOCK_M 32 spills 8 bytes, BLOCK_M 64 spills 1.5 KB,
# 4 warps none), or (b) the launch has fewer programs than the GPU has SMs (latency-bound: measured
# at B=1 L=1K, 0.0164 ms at 4 warps against 0.0188 ms at 2).
DECODE_WIDE_WARPS = 4
# Prefill: head_dim 128 measured (same run): (128, 64, 8, 2) took 2.507 ms for B=4 q=kv=4K causal
# (2.576 ms with 3 stages) and 1.875 ms for the mixed batch (1.879 ms). Other head dims unmeasured.
_PREFILL_CONFIGS: dict[int, PrefillConfig] = {
    64: PrefillConfig(block_m=128, block_n=64, num_warps=8, num_stages=3),
    128: PrefillConfig(block_m=128, block_n=64, num_warps=8, num_stages=2),
    256: PrefillConfig(block_m=64, block_n=32, num_warps=8, num_stages=2),
    512: PrefillConfig(block_m=32, block_n=16, num_warps=8, num_stages=2),
}
# Work-split knobs (see decode_programs). The batch's KV tiles are shared out over waves of
# resident programs (decode_waves): DecodeConfig.programs_per_sm per SM (SPLIT_TARGET_PROGRAMS_PER_SM where a config
# does not say), in chunks of at least SPLIT_MIN_CHUNK_TOKENS keys.
SPLIT_TARGET_PROGRAMS_PER_SM = 4
SPLIT_MIN_CHUNK_TOKENS = 512
# A batch of few KV tiles (one short request) is spread over up to this many programs per SM, in chunks shorter than
# SPLIT_MIN_CHUNK_TOKENS (down to a quarter of it): the kernels' `spread` argument, SPLIT_SPREAD_PROGRAMS_PER_SM *
# num_sms // num_kv_heads chunks a KV head for the batch, each request its part by its tiles (_chunk_cap); 0: off.
# It changes only batches of fewer than spread * min_tiles tiles (16 x 8 tiles, 8K keys, for 8 KV heads on 132 SMs).
# On an H100 (run X) one request of 1K / 2K keys took 1.43x / 1.32x FlashInfer's bf16 time in chunks of 512 keys
# (2 / 4 of them) and 1.11x / 1.06x in chunks of 128 keys (8 / 16); at 8K keys, 16 chunks of 512 were the fastest
# (32 of 256: +28%, 64 of 128: +62%): about one program per SM, as the rule gives. With the rule (run Y, the same run
# as the split before it): one request of 0.5K / 1K / 2K keys 1.18x / 1.13x / 1.08x FlashInfer's bf16 time (before
# 1.32x / 1.43x / 1.33x), 1 x 8K and 2 x 4K within 1.7%; 2 programs per SM no faster there and 19-29% slower from 8K.
SPLIT_SPREAD_PROGRAMS_PER_SM = 1
# Waves of resident programs the batch's tiles are shared out over (decode_waves): 0 picks 1 to
# SPLIT_MAX_WAVES per launch from the batch size; n > 0 forces n (benchmark sweeps).
SPLIT_WAVES = 0
SPLIT_MAX_WAVES = 3
# A larger wave count is taken only when it fills its last wave by this much more (more, shorter
# chunks cost partials to merge and per-program set-up).
SPLIT_WAVE_GAIN = 0.10
# How a request's share of the programs is rounded (_request_chunks). 0: down, floor(tiles * programs / total), so a
# request whose share is just under 2 gets one chunk of nearly twice the mean (a ragged batch of 8 requests, 1K-30K
# keys, on 132 SMs: the longest chunk 32 tiles, the mean 23.5). N > 0: every request gets cdiv(tiles, T) chunks with T
# the smallest chunk length whose chunks still fit the programs, found on the device by N bisection steps
# (_balance_target; 26 tiles there, and 42 against 62 for 12 random lengths of 0.1K-32K). Each program pays N steps
# over the first 128 requests' tiles, which it loaded once for the total and the scan (later blocks are read again in
# each step), without an integer division on a per-request value; one request, and more requests than programs, keep
# the floor rule with no search (_balance_steps). Opt-in: on an H100 (run U) 2 steps were 9.5% faster on 24 requests of
# 0.1K-32K and 0.3% on the ragged 8, but 0.4-3.1% slower on the large uniform batches (run T, before the set-up was made
# cheaper: +1.2-4.1%, +11% on one 8K).
SPLIT_BALANCE_STEPS = 0
# The merge kernel (merge_blocks): partial outputs per step, and chunks per step.
# 2048: one 8K request 0.0182 ms against 0.0197 with 8192 (more, smaller merge programs), the other batches
# within 1% (H200, BENCHMARKS.md decode runs G and J)
MERGE_STEP_ELEMENTS = 2048
MERGE_CHUNK_BLOCK = 16
# The merge inside the decode kernel (the plain kernel's _merge_if_last, the Gluon kernel's
# decode_gluon._merge_last): the last chunk of a request to finish merges its partials, and no merge kernel is
# launched. Opt-in: first timed in run AA (H100, the Gluon decode, FlashInfer in the same run): 1.2-4.5% faster than
# the default's merge kernel on batches of 8 requests and more, a tie at 4 x 32K, and slower where few requests
# each merge alone at the end (+9.3% on one 8K request, +1.9% to +12.0% on one of 0.5K-2K keys): the last chunk's
# atomic and its round trips to the partials are on the critical path, where the merge kernel's launch overlaps the
# decode (MERGE_PDL). Runs G, Y and Z timed its knob, but their CUDA graphs were captured on a stream without
# counters and took the merge kernel (run Z; fixed by the spares of _merge_counters). Needs one int32 counter per
# (request, KV head), zero between launches (kept per device and stream). Compiled for sm_90 (triton 3.6.0,
# head_dim 128) the plain kernel's merge tail raises it from 152 to 250 registers (2 programs per SM instead of 3);
# the Gluon default's from 119 to 121.
FUSED_MERGE = False
# The merge kernel as a programmatic dependent launch of the decode kernel (PDL, SM90+): every decode program lets it
# launch (griddepcontrol.launch_dependents), so its programs are placed, and find their request's chunks from the
# lengths, while the decode runs; they wait for the decode's partials (griddepcontrol.wait) before reading them. This
# removes the merge's launch gap and set-up from the pair's time, the part of it that does not move bytes (one 8K
# request: 5.5 of 28 us under ncu, decode run F). 1: as each decode program starts; 2 (the default): once its key loop
# is done, so the merge's programs take no SM slot from decode programs still to start; 0: a plain launch. On an H100
# (run T, two calls, seven decode shapes with FlashInfer in the same run) 2 was faster than 0 on every shape (0.5-8.1%;
# one 8K request 7.3 / 8.1%, 128 x 2K 2.9 / 2.8%), where 1 was up to 1.1% slower at 4 x 32K and 16 x 16K (as in run P).
# Not yet timed on an H200.
MERGE_PDL = 2
# Requests scanned per step of the kernels' on-device prefix over the batch: 32 for batches up to 32, 128 up to 128,
# else the batch rounded up to a power of two (256, 512), at most 1024 (one step up to 1024 requests; a compiled
# variant per block size). Powers of two from 32 to 1024, TINY <= SMALL <= MAX (_batch_block checks). The Gluon decode
# holds a block of up to 128 requests in every warp, BATCH_BLOCK // 32 a thread, and works out each one's chunk count:
# the path by which a program of a batch of at most 128 finds its chunk is about 790 SASS instructions with blocks of
# 128, about 350 with 32 (sm_90, triton 3.6.0; static count, the loops over further blocks left out). Run AB (H100,
# FlashInfer in the same run): blocks of 32 made one request of 0.5K-2K keys 4.7-6.3% faster (one 1K request's decode
# 839,808 -> 728,448 instructions under ncu), ragged 4 x 0.2K-3K 6.7%, 2 x 4K 3.8-4.1%, 1 x 8K and 1 x 32K 1.5-2.2%,
# batches of more than 32 requests unchanged; past 128 requests a block of the batch's size in place of 1024 made
# 256 x 1K 4.6% and 512 x 0.5K 5.7% faster (ragged 512 x 0.1K-2K 3.0%), where looping over blocks of 128 or 256 made
# 1024 x 0.25K 44% / 22% slower.
BATCH_BLOCK_TINY = 32
BATCH_BLOCK_SMALL = 128
BATCH_BLOCK_MAX = 1024
# The merge kernel's plan: for a batch of at least MERGE_PLAN_MIN_BATCH requests the decode kernel's first chunk of each
# request (KV head 0) stores the request's chunk count and first partial slot, and the merge kernel reads them after
# its wait for the decode instead of scanning the batch. Without it each of the merge's batch x heads programs scans
# the whole batch: on an H100 (run AB, ncu) the merge took 70 us after a 168 us decode at 256 x 1K, and 136 us after
# 211 us at 512 x 0.5K, where one request of one chunk has nothing to merge; 7 us at 128 x 2K (blocks of 128). The
# plan's read follows the wait, so it is on the critical path; small batches keep the scan, which runs before it.
MERGE_PLAN_MIN_BATCH = 33
# The decode's chunk table: for a batch of at least DECODE_TABLE_MIN_BATCH requests (0: never) one program
# (_decode_table_kernel, launched before the decode) works out the split once and stores each chunk's request, index,
# chunk count and first slot, and every request's plan for the merge kernel; the decode programs read their entry
# instead of scanning the batch. Past 128 requests each decode program scans the batch in one block of up to 1,024
# requests (in the Gluon decode spread over the warps: 67 barriers in its sm_90 build against 17 with blocks of 32);
# 1024 x 0.25K took 0.82x FlashInfer's bf16 time on an H100 (run AB) where 128 x 2K, the same bytes, took 0.37x. It
# costs one more launch, on the critical path. Opt-in: not yet timed.
DECODE_TABLE_MIN_BATCH = 0

_overrides: dict[str, Any] = {}
# E2M1 decoders by name -> the kernels' FAST constexpr (see attention_nvfp4).
DECODERS: dict[str, int] = {
    "portable": fp4.DECODER_PORTABLE, "table": fp4.DECODER_TABLE, "bitwise": fp4.DECODER_BITWISE,
}


@contextlib.contextmanager
def override_configs(
    *,
    decode: DecodeConfig | None = None,
    prefill: PrefillConfig | None = None,
    num_splits: int | None = None,
    decoder: str | None = None,
) -> Iterator[None]:
    """Force tile configs, the split count or the decoder choice inside the block (benchmark sweeps).

    ``decoder`` is one of :data:`DECODERS`: ``"portable"`` (plain-Triton integer decode, the
    interpreter's default), ``"table"`` (FlashInfer's ``prmt`` table in inline PTX) or ``"bitwise"``
    (bf16 bit placement, the CUDA default; fp16 keeps the table). Forcing an inline-PTX decoder under
    the interpreter runs a plain-Triton stand-in with the same values.
    """
    if decoder is not None and decoder not in DECODERS:
        raise ValueError(f"override_configs: decoder must be one of {sorted(DECODERS)}, got {decoder!r}")
    saved = dict(_overrides)
    for key, val in (("decode", decode), ("prefill", prefill), ("num_splits", num_splits), ("decoder", decoder)):
        if val is not None:
            _overrides[key] = val
    try:
        yield
    finally:
        _overrides.clear()
        _overrides.update(saved)


def decode_config(
    head_dim: int, block_m: int = 16, num_programs: int | None = None, num_sms: int | None = None,
    rotate: bool = False, gluon: bool = False, rows: int | None = None,
) -> DecodeConfig:
    """The decode tile config for ``head_dim`` (override with :func:`override_configs`).

    ``block_m`` is the padded row count (``max(16, next_pow2(G * q_len))``), ``num_programs`` the
    launch's grid size and ``num_sms`` the GPU's SM count, ``rotate`` a fused Hadamard rotation. Where
    :data:`_DECODE_CONFIGS_BYTE_SCALES` has ``head_dim``, a launch of 16 rows without rotation takes
    that config (the one timed); others keep :data:`_DECODE_CONFIGS`. A config with fewer than
    :data:`DECODE_WIDE_WARPS` warps is widened to that many when ``block_m > 16`` or when
    ``num_programs < num_sms``; ``block_n`` (and hence the split count) never changes. ``gluon``: the
    launch can take the Gluon kernel (:func:`_gluon_eligible`): where :data:`_DECODE_CONFIGS_GLUON` has
    ``head_dim``, 16 rows without rotation take that config (``rows``, the real ``G x q_len``, above 8:
    :data:`_DECODE_CONFIGS_GLUON_ROWS16`). An override is returned as it is.
    """
    forced = _overrides.get("decode")
    if forced is not None:
        return forced
    if gluon and block_m <= 16 and not rotate and head_dim in _DECODE_CONFIGS_GLUON:
        if rows is not None and rows > 8:
            return _DECODE_CONFIGS_GLUON_ROWS16[head_dim]
        return _DECODE_CONFIGS_GLUON[head_dim]
    cfg = _DECODE_CONFIGS[head_dim]
    if block_m <= 16 and not rotate and head_dim in _DECODE_CONFIGS_BYTE_SCALES:
        cfg = _DECODE_CONFIGS_BYTE_SCALES[head_dim]
    latency_bound = num_programs is not None and num_sms is not None and num_programs < num_sms
    if cfg.num_warps < DECODE_WIDE_WARPS and (block_m > 16 or latency_bound):
        cfg = replace(cfg, num_warps=DECODE_WIDE_WARPS)
    return cfg


def prefill_config(head_dim: int) -> PrefillConfig:
    """The prefill tile config for ``head_dim`` (override with :func:`override_configs`)."""
    return _overrides.get("prefill") or _PREFILL_CONFIGS[head_dim]


_sm_count = sm_count  # (benchmarks read it under this name)


def decode_programs(cfg: DecodeConfig, num_kv_heads: int, num_sms: int, waves: int = 1) -> tuple[int, int]:
    """``(programs per KV head, min tiles per chunk)`` of a decode launch with tile config ``cfg``.

    The work split happens on the device (:func:`_decode_kernel`): the batch's real KV tiles are
    shared out over about ``programs * num_kv_heads`` equal chunks, ``waves`` waves of resident
    programs (``cfg.programs_per_sm * num_sms`` each; :func:`decode_waves` picks the count from the
    batch size) whatever the lengths, each of at least
    ``cfg.min_chunk_tokens`` (default ``SPLIT_MIN_CHUNK_TOKENS``) keys so that the partial results stay cheap to
    merge.
    ``override_configs(num_splits=P)`` forces ``P`` programs per KV head and chunks of any size
    (``min_tiles`` 1): ``P = 1`` gives every request one chunk, i.e. no split.
    """
    if "num_splits" in _overrides:
        return max(1, int(_overrides["num_splits"])), 1
    wave = max(1, waves) * (cfg.programs_per_sm or SPLIT_TARGET_PROGRAMS_PER_SM) * num_sms
    min_tiles = (cfg.min_chunk_tokens or SPLIT_MIN_CHUNK_TOKENS) // cfg.block_n
    return max(1, -(-wave // max(1, num_kv_heads))), max(1, min_tiles)


def decode_spread(num_kv_heads: int, num_sms: int) -> int:
    """The kernels' ``spread``: ``SPLIT_SPREAD_PROGRAMS_PER_SM * num_sms // num_kv_heads`` chunks a KV head (at least
    1) that a batch of few KV tiles is spread over (:func:`_chunk_cap`); 0 when the knob is 0. Refused when the knob
    is no count."""
    per_sm = SPLIT_SPREAD_PROGRAMS_PER_SM
    if isinstance(per_sm, bool) or not isinstance(per_sm, int) or not 0 <= per_sm <= 64:
        raise ValueError(f"attention.SPLIT_SPREAD_PROGRAMS_PER_SM is {per_sm!r}; it needs an int from 0 (off) to 64 "
                         "(programs per SM a batch of few KV tiles is spread over); set it to 1, the default")
    return max(1, per_sm * max(1, num_sms) // max(1, num_kv_heads)) if per_sm else 0


def decode_waves(batch: int, programs: int, min_tiles: int, max_tiles: int, spread: int = 0) -> int:
    """Waves of ``programs`` (one wave's programs per KV head) a launch shares the tiles out over.

    Each request's share of the programs is rounded down (:func:`_request_chunks`), so when the
    batch has few requests per wave much of a wave can stay empty: 32 requests of 8K keys over 50
    programs get 1 chunk each (shares of 1.56), 32 of 50 slots. Over two waves (99 programs) they
    get 3 each, 96 of 100. The host reads no length (CUDA graphs): the rule assumes requests of
    equal length, which the batch size alone decides, and takes the wave count (1 to
    ``SPLIT_MAX_WAVES``) whose last wave is fullest, a larger one only when it fills that wave
    ``SPLIT_WAVE_GAIN`` better. ``SPLIT_WAVES > 0`` forces a count.
    Measured on an H200 (BENCHMARKS.md, decode run E, the counts forced): 32 x 8K GQA 8 took
    0.353 ms over one wave and 0.259 ms over two; 64 x 8K 0.535 ms over one and 0.494 ms over
    three; the batches whose one wave is already full lost 2-9% when forced to two or three, and
    the rule keeps them at one.
    """
    if SPLIT_WAVES > 0:
        return SPLIT_WAVES
    batch, programs = max(1, batch), max(1, programs)
    cap = _chunk_cap_host(max(1, max_tiles), batch * max(1, max_tiles), min_tiles, spread)  # chunks a request
    best, best_fill = 1, -1.0
    for waves in range(1, max(1, SPLIT_MAX_WAVES) + 1):
        chunks = batch * min(max(1, waves * programs // batch), cap)
        fill = chunks / (-(-chunks // programs) * programs)
        if fill > best_fill + SPLIT_WAVE_GAIN:
            best, best_fill = waves, fill
    return best


def _chunk_cap_host(tiles: int, total: int, min_tiles: int, spread: int) -> int:
    """The kernels' :func:`_chunk_cap` for ``tiles >= 0`` and ``total >= 1``: the most chunks a request takes."""
    min_tiles = max(1, min_tiles)
    few = min(tiles // max(min_tiles // 4, 1), tiles * max(0, spread) // max(1, total))
    return max(tiles // min_tiles, few, 1)


def decode_grid(batch: int, programs: int, min_tiles: int, max_tiles: int, spread: int = 0) -> tuple[int, int]:
    """``(chunks, partial slots)``: the decode grid's chunk count and the merge buffer's slot count.

    Request ``b`` gets ``max(1, floor(x_b))`` chunks with ``sum(x_b) = programs``, so chunks never
    exceed ``programs + batch``, nor ``batch`` times the most one request of ``max_tiles`` can take
    (:func:`_chunk_cap`: ``cdiv(max_tiles, min_tiles)``, or up to ``spread`` chunks of a quarter of that length).
    Only requests of two or more chunks write partials; they have ``floor(x_b) <= x_b``, so their chunks number at
    most ``programs``.
    """
    min_tiles, max_tiles = max(1, min_tiles), max(1, max_tiles)
    # (a request of t <= max_tiles tiles: floor(spread * t / total) <= spread, as total >= t)
    per_request = max(-(-max_tiles // min_tiles), _chunk_cap_host(max_tiles, max_tiles, min_tiles, spread))
    chunks = max(1, min(programs + batch, batch * per_request))
    return chunks, max(1, min(chunks, programs))


@dataclass(frozen=True)
class DecodeSplit:
    """How a decode launch splits the batch (:func:`decode_split`): programs per KV head, the
    minimum tiles per chunk, the waves they span, the grid's chunks and the merge buffer's slots."""

    programs: int
    min_tiles: int
    waves: int
    chunks: int
    slots: int
    spread: int = 0  # the kernels' spread (SPLIT_SPREAD_PROGRAMS_PER_SM): chunks a KV head for a batch of few tiles


def decode_split(
    batch: int, num_kv_heads: int, head_dim: int, page_size: int, max_pages: int, num_sms: int,
    cfg: DecodeConfig | None = None,
) -> DecodeSplit:
    """The split of a decode launch over ``batch`` block-table rows of ``max_pages`` pages:
    :func:`decode_programs` for one wave, :func:`decode_waves` (unless ``num_splits`` is forced),
    then :func:`decode_grid`. Reads no length (CUDA graphs). ``cfg``: the launch's tile config
    (its ``block_n`` and ``programs_per_sm`` size the split); default ``decode_config(head_dim)``."""
    cfg = cfg or decode_config(head_dim)
    programs, min_tiles = decode_programs(cfg, num_kv_heads, num_sms)
    max_tiles = -(-max_pages * page_size // cfg.block_n)
    spread = 0 if "num_splits" in _overrides else decode_spread(num_kv_heads, num_sms)
    waves = 1 if "num_splits" in _overrides else decode_waves(batch, programs, min_tiles, max_tiles, spread)
    if waves > 1:
        programs = decode_programs(cfg, num_kv_heads, num_sms, waves)[0]
    chunks, slots = decode_grid(batch, programs, min_tiles, max_tiles, spread)
    return DecodeSplit(programs, min_tiles, waves, chunks, slots, spread)


def merge_blocks(num_qo_heads: int, head_dim: int) -> tuple[int, int]:
    """``(BLOCK_H, CHUNK_BLOCK)`` of the merge kernel: query heads per program and chunks per step.

    One step holds ``CHUNK_BLOCK x BLOCK_H x head_dim`` partial outputs, ``MERGE_STEP_ELEMENTS`` at
    most (64 fp32 registers per thread on 4 warps). Chunks come first (``MERGE_CHUNK_BLOCK``): a
    lone long request is cut into tens of chunks, which one step then merges in one round trip to
    memory; the heads get what is left, so a small batch still spreads over several programs.
    """
    chunk_block = MERGE_CHUNK_BLOCK
    block_h = max(1, MERGE_STEP_ELEMENTS // (chunk_block * head_dim))
    block_h = min(triton.next_power_of_2(num_qo_heads), block_h)
    chunk_block = max(1, min(chunk_block, MERGE_STEP_ELEMENTS // (block_h * head_dim)))
    return block_h, chunk_block


def _fast(device: torch.device) -> int:
    """The kernels' ``FAST`` constexpr: which E2M1 decoder they compile (:data:`DECODERS`).

    Default: the inline-PTX bf16 bit-placement decoder for CUDA launches (fp16 queries take the
    table decoder inside it), the portable one under the interpreter. On the H200 it was 3-6% faster
    than the table decoder on every decode batch of BENCHMARKS.md, with the same output error.
    ``override_configs(decoder=...)`` forces any; an inline-PTX decoder forced under the interpreter
    runs with a plain-Triton stand-in for the PTX (same values), so CPU tests cover its scale handling.
    """
    forced = _overrides.get("decoder")
    if forced is not None:
        return DECODERS[forced]
    return DECODERS["bitwise"] if device.type == "cuda" and not interpreting() else DECODERS["portable"]


# --------------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Args:
    views: CacheViews
    group: int
    num_qo_heads: int
    k_scale: float | torch.Tensor
    v_scale: float | torch.Tensor
    sm_scale_log2: float
    softcap: float
    window: int
    sinks: torch.Tensor | None
    out: torch.Tensor
    lse: torch.Tensor | None


def _check_common(
    name: str,
    query: torch.Tensor,
    views: CacheViews,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    k_scale: float | torch.Tensor,
    v_scale: float | torch.Tensor,
    sm_scale: float,
    sliding_window: int | None,
    logits_soft_cap: float | None,
    sinks: torch.Tensor | None,
    out: torch.Tensor | None,
    return_lse: bool,
) -> _Args:
    device = views.device
    if not isinstance(query, torch.Tensor) or query.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(
            f"{name}: query must be a torch.float16 or torch.bfloat16 tensor, got "
            f"{getattr(query, 'dtype', type(query).__name__)}"
        )
    if query.dim() != 3 or query.shape[2] != views.head_dim:
        raise ValueError(
            f"{name}: query must be [num_tokens, num_qo_heads, head_dim={views.head_dim}], got shape "
            f"{tuple(query.shape)}"
        )
    if query.stride(2) != 1:
        raise ValueError(f"{name}: query's last dim must be contiguous, got strides {query.stride()}")
    if query.device != device:
        raise ValueError(f"{name}: query is on {query.device}, the cache is on {device}")
    hq = query.shape[1]
    if hq % views.num_kv_heads != 0:
        raise ValueError(
            f"{name}: num_qo_heads {hq} must be a multiple of num_kv_heads {views.num_kv_heads} (GQA)"
        )
    for arg, t in (("block_table", block_table), ("seq_lens", seq_lens)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
            raise TypeError(
                f"{name}: {arg} must be an int32 tensor, got {getattr(t, 'dtype', type(t).__name__)}"
            )
        if t.device != device:
            raise ValueError(f"{name}: {arg} is on {t.device}, the cache is on {device}")
    if block_table.dim() != 2 or (block_table.shape[1] > 1 and block_table.stride(1) != 1):
        raise ValueError(
            f"{name}: block_table must be [batch, max_pages] with a contiguous last dim, got shape "
            f"{tuple(block_table.shape)} strides {block_table.stride()}"
        )
    if seq_lens.dim() != 1 or seq_lens.shape[0] != block_table.shape[0] or not seq_lens.is_contiguous():
        raise ValueError(
            f"{name}: seq_lens must be a contiguous [batch={block_table.shape[0]}] tensor, got shape "
            f"{tuple(seq_lens.shape)}"
        )
    if block_table.shape[0] > _MAX_GRID_YZ:
        raise ValueError(f"{name}: batch {block_table.shape[0]} exceeds the {_MAX_GRID_YZ}-request launch limit")
    k_scale = resolve_scale(k_scale, "k_scale", device)
    v_scale = resolve_scale(v_scale, "v_scale", device)
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
        raise TypeError(f"{name}: sm_scale must be a finite Python number, got {sm_scale!r}")
    if not (0.0 < float(sm_scale) <= FP32_MAX):
        raise ValueError(
            f"{name}: sm_scale must be finite and > 0 (at most the fp32 maximum {FP32_MAX:.6g}), got "
            f"{sm_scale!r}; the usual value is head_dim ** -0.5"
        )
    # The kernels fold the global scales into fp32 factors (with up to 2^8 for the fp16 decoders):
    # the products must stay finite, or every output is NaN.
    for arg, prod in (
        ("sm_scale * k_scale", float(sm_scale) * _LOG2E * k_scale if not isinstance(k_scale, torch.Tensor) else 0.0),
        ("v_scale", v_scale if not isinstance(v_scale, torch.Tensor) else 0.0),
    ):
        if prod * 256.0 > FP32_MAX:
            raise ValueError(
                f"{name}: {arg} = {prod:.6g} overflows the kernels' fp32 scale factors (must be at most "
                f"{FP32_MAX / 256:.6g}); rescale the cache's global scales"
            )
    window = 0
    if sliding_window is not None:
        if isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 1:
            raise ValueError(
                f"{name}: sliding_window must be a positive int (keys j with i - W < j <= i) or None, "
                f"got {sliding_window!r}"
            )
        window = min(int(sliding_window), 2**30)  # wider is no window: int32 math stays exact
    softcap = 0.0
    if logits_soft_cap is not None and logits_soft_cap != 0:
        if not (isinstance(logits_soft_cap, (int, float)) and logits_soft_cap > 0 and math.isfinite(logits_soft_cap)):
            raise ValueError(f"{name}: logits_soft_cap must be a positive finite number or None, got {logits_soft_cap!r}")
        softcap = float(logits_soft_cap)
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor) or sinks.dtype != torch.float32 or tuple(sinks.shape) != (hq,):
            raise ValueError(
                f"{name}: sinks must be a float32 tensor [num_qo_heads={hq}], got "
                f"{getattr(sinks, 'dtype', type(sinks).__name__)} {tuple(getattr(sinks, 'shape', ()))}"
            )
        if sinks.device != device:
            raise ValueError(f"{name}: sinks is on {sinks.device}, the cache is on {device}")
        sinks = sinks.contiguous()
    if out is None:
        out = torch.empty_like(query, memory_format=torch.contiguous_format)
    else:
        if out.shape != query.shape or out.dtype != query.dtype or out.device != device:
            raise ValueError(
                f"{name}: out must be {tuple(query.shape)} {query.dtype} on {device}, got "
                f"{tuple(out.shape)} {out.dtype} on {out.device}"
            )
        if out.stride(2) != 1:
            raise ValueError(f"{name}: out's last dim must be contiguous, got strides {out.stride()}")
    lse = torch.empty(query.shape[0], hq, dtype=torch.float32, device=device) if return_lse else None
    return _Args(
        views=views,
        group=hq // views.num_kv_heads,
        num_qo_heads=hq,
        k_scale=k_scale,
        v_scale=v_scale,
        sm_scale_log2=float(sm_scale) * _LOG2E,
        softcap=softcap,
        window=window,
        sinks=sinks,
        out=out,
        lse=lse,
    )


def _pow2_align(values: list[int], cap: int = 16) -> int:
    """Largest power of two <= ``cap`` dividing every value (0 divides nothing and is skipped)."""
    a = cap
    for v in values:
        v = abs(int(v))
        while v and v % a:
            a //= 2
    return a


@dataclass(frozen=True)
class _CacheLaunch:
    """Cache pointers and strides as the kernels take them.

    Strides are passed in units of ``data_align`` / ``sf_align`` bytes (the largest power of two <= 16
    dividing all of them) and multiplied back by a constexpr in the kernel, so Triton knows every row
    starts on that boundary and vectorizes the byte loads (16 B for data rows of NHD/HND caches, 8 B
    for vLLM's combined page, whose rows are ``9 * head_dim / 16`` bytes apart).
    """

    tensors: list[torch.Tensor]
    strides: list[int]
    data_align: int
    sf_align: int


def _page_shift(page_size: int) -> int:
    """``log2(page_size)`` for a power of two (the kernels then shift and mask), else -1 (divide)."""
    return page_size.bit_length() - 1 if page_size & (page_size - 1) == 0 else -1


def _max_kv(block_table: torch.Tensor, page_size: int) -> int:
    """Keys a block-table row covers (``max_pages * page_size``, capped to int32)."""
    return min(block_table.shape[1] * page_size, 2**31 - 1)


def _cache_launch(views: CacheViews) -> _CacheLaunch:
    k_sf = views.k_sf.view(torch.uint8)
    v_sf = views.v_sf.view(torch.uint8)
    data = [*views.strides(views.k_data), *views.strides(views.v_data)]
    sf = [*views.strides(k_sf), *views.strides(v_sf)]
    # Base addresses count too: scale rows are read as 32-bit words only when 4-byte aligned.
    da = _pow2_align([*data, views.k_data.data_ptr(), views.v_data.data_ptr()])
    sa = _pow2_align([*sf, k_sf.data_ptr(), v_sf.data_ptr()])
    return _CacheLaunch(
        tensors=[views.k_data, views.v_data, k_sf, v_sf],
        strides=[x // da for x in data] + [x // sa for x in sf],
        data_align=da,
        sf_align=sa,
    )


@dataclass(frozen=True)
class _DecodeLaunch:
    """What a decode launch derives from the arguments' metadata (no tensors): the cached part of
    :func:`decode`'s host path, keyed there by the arguments' metadata and options."""

    num_kv_heads: int
    head_dim: int
    page_size: int
    num_qo_heads: int
    group: int
    qmax: int
    block_m: int
    programs: int
    min_tiles: int
    spread: int
    chunks: int
    slots: int
    batch_block: int
    max_pages: int
    cfg: DecodeConfig
    merge_block_h: int  # merge_blocks(): the merge kernel's heads per program and chunks per step
    merge_chunk_block: int
    fast: int
    dot_fp32: bool
    k_ptr: bool
    v_ptr: bool
    sm_scale_log2: float
    softcap: float
    window: int
    has_sinks: bool
    return_lse: bool
    strides: tuple[int, ...]
    data_align: int
    sf_align: int
    num_pages: int  # page ids outside [0, num_pages) read nothing
    rotate: bool = False  # a Hadamard-rotated cache (kv_rotation="hadamard"): the ROTATE constexpr
    fused_merge: bool = False  # FUSED_MERGE: the decode kernel merges the split partials itself
    merge_cb: int = 1  # its chunks per merge step (MERGE_STEP_ELEMENTS // (BLOCK_M x head_dim))
    off32: bool = False  # every byte offset into the four cache tensors fits in int32 (the Gluon kernel's OFF32)
    gluon: bool = False  # the launch takes the Gluon kernel (cfg.gluon and _gluon_eligible)
    cvt8: bool = False  # ... with the E4M3 conversion (cfg.e4m3_cvt on an SM89+ device)
    # ... and its PAGE_TILE's token strides (TOK_K, TOK_V, TOK_KS, TOK_VS; all 0: no PAGE_TILE)
    page_tile_tok: tuple[int, int, int, int] = (0, 0, 0, 0)
    pdl: int = 0  # the merge kernel as a programmatic dependent launch of the decode kernel (MERGE_PDL, SM90+)
    balance: int = 0  # SPLIT_BALANCE_STEPS: the kernels' BALANCE (decode and merge must agree)
    plan: bool = False  # MERGE_PLAN_MIN_BATCH: the decode kernel stores each request's chunks for the merge kernel
    table: bool = False  # DECODE_TABLE_MIN_BATCH: _decode_table_kernel works out the split before the decode
    tma: bool = False  # the Gluon ring filled by a TMA loader warp (cfg.tma_loader, _gluon_tma), where the bases allow
    l2_bulk: int = 0  # the Gluon kernel's L2_BULK (_gluon_l2_bulk)


def _balance_steps(batch: int, programs: int) -> int:
    """The kernels' ``BALANCE``: ``SPLIT_BALANCE_STEPS`` as a step count (0: the floor rule), refused when it is no
    count the kernels can unroll. 0 where balancing cannot shorten the longest chunk, so that no program pays for the
    search: one request (it gets the same longest chunk either way), and more requests than ``programs`` (the kernels
    keep the floor rule once the live requests outnumber the programs; a batch padded past ``programs`` with empty
    requests keeps it too). Run U (H100) measured 3.1% at 128 x 2K on 66 programs, where the kernels fell back."""
    steps = SPLIT_BALANCE_STEPS
    if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps <= 32:
        raise ValueError(f"attention.SPLIT_BALANCE_STEPS is {steps!r}; it needs an int from 0 (a request's share of the "
                         "programs rounded down) to 32 (bisection steps of the balanced chunk length); set it to 0")
    return steps if 1 < batch <= programs else 0


def _byte_extent(t: torch.Tensor) -> int:
    """One past the largest byte offset from ``t``'s data pointer that ``t`` addresses."""
    if t.numel() == 0:
        return 0
    return (sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True) if st > 0) + 1) * t.element_size()


def _decode_launch(
    a: _Args, query: torch.Tensor, block_table: torch.Tensor, qmax: int, cl: _CacheLaunch,
    rotate: bool = False,
) -> _DecodeLaunch:
    views = a.views
    device = views.device
    batch = block_table.shape[0]
    block_m = max(16, triton.next_power_of_2(a.group * qmax))
    num_sms = _sm_count(device)
    rows = a.group * qmax
    gluon = _gluon_eligible(query, views.head_dim, block_m, rotate, cl)
    split = decode_split(batch, views.num_kv_heads, views.head_dim, views.page_size, block_table.shape[1], num_sms,
                         decode_config(views.head_dim, block_m, rotate=rotate, gluon=gluon, rows=rows))
    programs, min_tiles, chunks, slots = split.programs, split.min_tiles, split.chunks, split.slots
    merge_block_h, merge_chunk_block = merge_blocks(a.num_qo_heads, views.head_dim)
    cfg = decode_config(views.head_dim, block_m, chunks * views.num_kv_heads, num_sms, rotate, gluon, rows)
    tok = _gluon_page_tile_tok(cfg, views.page_size, a.window, cl) if gluon and cfg.gluon else (0, 0, 0, 0)
    ring = _gluon_ring(cfg, tok[0] > 0)
    return _DecodeLaunch(
        num_kv_heads=views.num_kv_heads, head_dim=views.head_dim, page_size=views.page_size,
        num_qo_heads=a.num_qo_heads, group=a.group, qmax=qmax, block_m=block_m, programs=programs,
        min_tiles=min_tiles, spread=split.spread, chunks=chunks, slots=slots,
        batch_block=_batch_block(batch),
        max_pages=block_table.shape[1],
        cfg=cfg,
        merge_block_h=merge_block_h, merge_chunk_block=merge_chunk_block, fast=_fast(device), dot_fp32=interpreting() and query.dtype == torch.bfloat16,
        k_ptr=isinstance(a.k_scale, torch.Tensor), v_ptr=isinstance(a.v_scale, torch.Tensor),
        sm_scale_log2=a.sm_scale_log2, softcap=a.softcap, window=a.window,
        has_sinks=a.sinks is not None, return_lse=a.lse is not None,
        strides=tuple(cl.strides), data_align=cl.data_align, sf_align=cl.sf_align,
        num_pages=views.num_pages, rotate=rotate, fused_merge=bool(FUSED_MERGE),
        merge_cb=_pow2_floor(max(1, MERGE_STEP_ELEMENTS // (block_m * views.head_dim))),
        off32=all(_byte_extent(t) < 2**31 for t in cl.tensors),
        gluon=gluon and cfg.gluon,  # (a forced config may ask for the Gluon kernel where it cannot run)
        cvt8=gluon and cfg.gluon and cfg.e4m3_cvt and torch.cuda.get_device_capability(device) >= (8, 9),
        page_tile_tok=tok,
        pdl=_merge_pdl(device),
        balance=_balance_steps(batch, programs),
        plan=not FUSED_MERGE and batch >= _merge_plan_min_batch(),
        table=0 < _decode_table_min_batch() <= batch,
        tma=gluon and cfg.gluon and _gluon_tma(cfg, ring, device, cl),
        l2_bulk=_gluon_l2_bulk(cfg, ring, tok[0] > 0, _cc(device)) if gluon and cfg.gluon else 0,
    )  # fmt: skip


def _decode_table_min_batch() -> int:
    """``DECODE_TABLE_MIN_BATCH``, checked: an int of at least 0 (0: no table)."""
    v = DECODE_TABLE_MIN_BATCH
    if type(v) is not int or v < 0:
        raise ValueError(f"attention.DECODE_TABLE_MIN_BATCH is {v!r}; it needs an int of at least 0 (0, the default: "
                         "every decode program scans the batch; N: batches of N requests and more read a chunk table "
                         "built before the decode); set it to one")
    return v


def _merge_plan_min_batch() -> int:
    """``MERGE_PLAN_MIN_BATCH``, checked: an int of at least 1."""
    v = MERGE_PLAN_MIN_BATCH
    if type(v) is not int or v < 1:
        raise ValueError(f"attention.MERGE_PLAN_MIN_BATCH is {v!r}; it needs an int of at least 1 (1: every batch; the "
                         "default 33: batches of more than 32 requests); set it to one")
    return v


def _batch_block(batch: int) -> int:
    """The kernels' ``BATCH_BLOCK`` for a batch of ``batch`` requests: ``BATCH_BLOCK_TINY`` or ``BATCH_BLOCK_SMALL``
    where one holds the batch, else the batch rounded up to a power of two, at most ``BATCH_BLOCK_MAX`` (larger batches
    loop over blocks of that size); all three checked (powers of two from 32 to 1024, in that order, each at most the
    next)."""
    blocks = (("BATCH_BLOCK_TINY", BATCH_BLOCK_TINY), ("BATCH_BLOCK_SMALL", BATCH_BLOCK_SMALL),
              ("BATCH_BLOCK_MAX", BATCH_BLOCK_MAX))
    for name, val in blocks:
        if type(val) is not int or not 32 <= val <= 1024 or val & (val - 1):
            raise ValueError(f"attention.{name} is {val!r}; it needs a power of two from 32 to 1024 (the defaults: "
                             "BATCH_BLOCK_TINY = 32, BATCH_BLOCK_SMALL = 128, BATCH_BLOCK_MAX = 1024); set it to one")
    for (name, val), (name_next, val_next) in zip(blocks[:-1], blocks[1:], strict=True):
        if val > val_next:
            raise ValueError(f"attention.{name} ({val}) is above attention.{name_next} ({val_next}); it needs to be "
                             f"at most that: lower {name} or raise {name_next}")
    if batch <= BATCH_BLOCK_SMALL:
        return BATCH_BLOCK_TINY if batch <= BATCH_BLOCK_TINY else BATCH_BLOCK_SMALL
    return min(triton.next_power_of_2(batch), BATCH_BLOCK_MAX)


def _cc(device: torch.device) -> int:
    """``device``'s compute capability as ``major * 10 + minor`` (0 off CUDA or under the interpreter)."""
    if device.type != "cuda" or interpreting():
        return 0
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


def _pdl_by_cc(cc: int, level: int = 1) -> dict[str, Any]:
    """``PDL`` per compile target as :func:`_merge_pdl` sets it on a device (``griddepcontrol`` is SM90+): True / False
    for ``MERGE_PDL`` 1 (the merge kernel's flag too), ``level`` / 0 for the decode kernels' late trigger (2)."""
    return {"PDL": cc >= 90} if level == 1 else {"PDL": level if cc >= 90 else 0}


def _merge_pdl(device: torch.device) -> int:
    """The decode kernel's ``PDL`` on ``device``: ``MERGE_PDL`` (1 or 2, where its programs let the merge kernel
    launch as a programmatic dependent) where CUDA on SM90+ (``griddepcontrol``), not interpreted, with a merge kernel
    to launch (no ``FUSED_MERGE``); else 0."""
    if MERGE_PDL not in (0, 1, 2) or isinstance(MERGE_PDL, float):
        raise ValueError(f"attention.MERGE_PDL is {MERGE_PDL!r}; it needs 0 (off), 1 (the merge kernel launches as "
                         "the decode programs start) or 2 (as their key loops end); set it to one of those")
    on = (not FUSED_MERGE and device.type == "cuda" and not interpreting()
          and torch.cuda.get_device_capability(device) >= (9, 0))
    return int(MERGE_PDL) if on else 0


def _launch_decode_path(
    a: _Args,
    query: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    qsl: torch.Tensor | None,
    qmax: int,
    causal: bool,
    status: torch.Tensor | None = None,
    rotate: bool = False,
) -> _DecodeLaunch:
    """Launch the split-KV decode kernel (+ merge) for ``batch`` requests of at most ``qmax`` rows;
    returns what the launch derived (``decode()`` caches it). ``status``: the guard kernel's word
    (with ``qsl``); ``rotate``: a Hadamard-rotated cache."""
    cl = _cache_launch(a.views)
    d = _decode_launch(a, query, block_table, qmax, cl, rotate)
    _run_decode(
        d, query, a.out, a.lse, cl.tensors, block_table, seq_lens, qsl, a.sinks, a.k_scale,
        a.v_scale, causal, status,
    )  # fmt: skip
    return d


def _gluon_eligible(query: torch.Tensor, head_dim: int, block_m: int, rotate: bool, cl: _CacheLaunch) -> bool:
    """Whether a decode launch can take the Gluon kernel: CUDA, not interpreted, Gluon importable, no
    earlier compile failure of it in this process, and a launch it serves
    (:func:`decode_gluon.gluon_decode_eligible`)."""
    return (
        _gluon is not None and not _gluon_failed and query.is_cuda and not interpreting()
        and _gluon.gluon_decode_eligible(head_dim, block_m, rotate, query.dtype, cl.data_align, cl.sf_align)
    )


def _gluon_ring(cfg: DecodeConfig, page_tile: bool) -> int:
    """The Gluon kernel's ``RING`` for a launch with ``cfg``: the config's ring where the launch takes ``PAGE_TILE``
    (the ring is a path of the page-tiled loop), else 0."""
    return cfg.ring if page_tile else 0


def _gluon_scale_ahead(cfg: DecodeConfig, ring: int) -> int:
    """The Gluon kernel's ``SCALE_AHEAD`` for a launch with ``cfg`` and ``RING`` ``ring`` (:func:`_gluon_ring`): the
    config's where the launch runs its ring (the config itself allows 2 only with a cp.async ring of 3 or more), else 1."""
    return cfg.scales_ahead if ring >= 3 else 1


def _gluon_l2(cfg: DecodeConfig, ring: int, page_tile: bool, pring: bool = False) -> tuple[int, int, bool]:
    """The Gluon kernel's ``L2_FETCH``, ``L2_AHEAD`` and ``L2_SCALES`` for a launch with ``cfg``, ``RING`` ``ring``
    (:func:`_gluon_ring`), ``PAGE_TILE`` ``page_tile`` and ``PRING`` ``pring`` (:func:`_gluon_pring`): the config's
    where the launch runs the page-tiled loop without a ring (``l2_ahead``: its one-tile form; the config refuses it with
    ``tile_pairs``); with a ring, ``l2_fetch`` alone where the ring is the inline-PTX one (its copies take the hint;
    a launch that keeps the ring in Triton's allocation, 16 rows, loads without it); else off."""
    if not page_tile or (ring and not pring):
        return 0, 0, False
    if ring:
        return cfg.l2_fetch, 0, False
    return cfg.l2_fetch, cfg.l2_ahead, cfg.l2_scales


def _gluon_early(cfg: DecodeConfig, ring: int, page_tile: bool, num_pages: int = 1) -> bool:
    """The Gluon kernel's ``EARLY`` for a launch with ``cfg``, ``RING`` ``ring`` (:func:`_gluon_ring`), ``PAGE_TILE``
    ``page_tile`` and a cache of ``num_pages`` pages: the config's ``early_check`` where the launch runs the page-tiled
    loop without a ring and the cache has a page to clamp the unchecked ids into, else False."""
    return cfg.early_check and page_tile and not ring and num_pages > 0


def _gluon_l2_bulk(cfg: DecodeConfig, ring: int, page_tile: bool, cc: int) -> int:
    """The Gluon kernel's ``L2_BULK`` for a launch with ``cfg``, ``RING`` ``ring`` (:func:`_gluon_ring`) and
    ``PAGE_TILE`` ``page_tile`` on a device of compute capability ``cc`` (``major * 10 + minor``): the config's
    ``l2_bulk`` where the launch runs the page-tiled loop without a ring on SM90+ (the bulk prefetch is Hopper's), else
    0."""
    return cfg.l2_bulk if page_tile and not ring and cc >= 90 else 0


def _gluon_pring(cfg: DecodeConfig, ring: int, rows: int) -> bool:
    """The Gluon kernel's ``PRING`` for a launch with ``cfg``, ``RING`` ``ring`` (:func:`_gluon_ring`) and ``rows`` query
    rows per program: the config's ``ptx_ring`` where the launch runs its ring with at most 8 rows, else False (the ring
    then lies in Triton's allocation). A launch gets 48 KiB of shared memory unless the kernel opts in to more, and
    Triton opts in by its own allocation only: at 16 rows that (32 KiB with triton 3.6) and the PTX ring's static 24 KiB
    pass 48 KiB, and the launch fails ("invalid argument"); at 8 rows they take 40 KiB."""
    return cfg.ptx_ring and ring > 0 and rows <= 8


# the type of _tma_descriptors' descriptors in a kernel signature (ahead-of-time builds)
_TMA_DESC_TYPE = ("tensordesc<u8[1, 16, 1, 64],NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=4, "
                  "transposed=False, fp4_padded=False, cga_layout=[])>")


def _tma_ring(cfg: DecodeConfig, ring: int) -> bool:
    """Whether the Gluon kernel's ``RING`` (``ring``, :func:`_gluon_ring`) of a launch with ``cfg`` is one the config
    fills by TMA where the target has it (``TMA`` takes a ring and no ``PAIR``)."""
    return cfg.tma_loader and ring >= 2 and not cfg.tile_pairs


def _gluon_tma(cfg: DecodeConfig, ring: int, device: torch.device, cl: _CacheLaunch) -> bool:
    """Whether a Gluon launch with ``cfg`` and ``RING`` ``ring`` fills its ring by TMA (``TMA``): where
    :func:`_tma_ring` says so, the device is SM90+ and every data stride of the cache is a multiple of 16 bytes (a TMA
    descriptor's rule; the bases are checked per call, :func:`_tma_descriptors`)."""
    return (_tma_ring(cfg, ring) and device.type == "cuda" and not interpreting()
            and torch.cuda.get_device_capability(device) >= (9, 0) and cl.data_align == 16)


def _tma_descriptors(d: _DecodeLaunch, cache: Sequence[torch.Tensor]) -> tuple[Any, Any] | None:
    """The TMA descriptors of the K and V data for a launch with ``d.tma`` (``[pages, page_size, kv heads, 64 B]`` at
    the cache's strides, boxes of one warp's 16 keys of one page), or None where a base is not 16-byte aligned (the
    launch then runs its ring by cp.async)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    k, v = cache[0], cache[1]
    if k.data_ptr() % 16 or v.data_ptr() % 16:
        return None
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=4)
    kw = d.cfg.block_n // d.cfg.num_warps
    a = d.data_align
    shape = [d.num_pages, d.page_size, d.num_kv_heads, d.head_dim // 2]
    return tuple(
        TensorDescriptor(t.view(torch.uint8), shape, [sp * a, st * a, sh * a, 1], [1, kw, 1, d.head_dim // 2], layout)
        for t, (sp, st, sh) in ((k, d.strides[0:3]), (v, d.strides[3:6]))
    )


def _gluon_kt(cfg: DecodeConfig, rows: int) -> bool:
    """The Gluon kernel's ``KT`` for a launch of ``rows`` (``G x q_len``) with ``cfg``: the transposed logits where the
    config asks for them and the launch has the ``O^T`` orientation (<= 8 rows) and 16 keys per warp."""
    return cfg.kt_logits and rows <= 8 and cfg.block_n == 16 * cfg.num_warps


def _gluon_page_tile(cfg: DecodeConfig, page_size: int, window: int) -> bool:
    """The Gluon kernel's ``PAGE_TILE`` for a launch: where the config asks for it, the page size is a power of two
    and a multiple of the keys per warp, and there is no window (so every warp's keys of a tile lie in one page)."""
    kw = cfg.block_n // cfg.num_warps
    return cfg.page_tile and page_size > 0 and page_size & (page_size - 1) == 0 and page_size % kw == 0 and window <= 0


def _gluon_token_strides(strides: Sequence[int], data_align: int, sf_align: int) -> tuple[int, int, int, int]:
    """The bytes between consecutive tokens of a page in the K data, V data, K scales and V scales: the Gluon
    kernel's ``TOK_K, TOK_V, TOK_KS, TOK_VS`` with ``PAGE_TILE`` (from :class:`_CacheLaunch`'s strides, in units of
    the alignments; page, token, head per tensor)."""
    return strides[1] * data_align, strides[4] * data_align, strides[7] * sf_align, strides[10] * sf_align


def _gluon_page_tile_tok(cfg: DecodeConfig, page_size: int, window: int, cl: _CacheLaunch) -> tuple[int, int, int, int]:
    """The token strides a Gluon launch passes with ``PAGE_TILE`` (:func:`_gluon_page_tile`; a zero stride turns it
    off), or all 0 (no ``PAGE_TILE``: the kernel ignores them)."""
    tok = _gluon_token_strides(cl.strides, cl.data_align, cl.sf_align)
    return tok if _gluon_page_tile(cfg, page_size, window) and min(tok) > 0 else (0, 0, 0, 0)


def _out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is the GPU running out of memory: torch's error, or the CUDA driver's as Triton
    reports it when a kernel's module is loaded (``Triton Error [CUDA]: out of memory``)."""
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _gluon_build_failed(exc: Exception) -> None:
    """Record that the Gluon decode kernel failed to build or launch here and warn once: every later
    decode in this process takes the plain-Triton kernel (same results, its speed).

    Running out of GPU memory is not such a failure: it would pass once memory is free, and the plain
    kernel needs memory to load too. It is raised as ``torch.OutOfMemoryError`` and the Gluon kernel stays
    on (in run S, test processes sharing one GPU had switched it off for good after one such error)."""
    global _gluon_failed
    if _out_of_memory(exc):
        raise torch.OutOfMemoryError(
            "nvfp4compat: the GPU ran out of memory while the Gluon decode kernel was loaded or launched "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}); it needs a few MiB "
            "free for its module. Free GPU memory (in vLLM: a lower --gpu-memory-utilization) and retry; the "
            "kernel is not switched off."
        ) from exc
    if not _gluon_failed:
        warnings.warn(
            f"nvfp4compat: the Gluon decode kernel failed on this GPU and triton {triton.__version__} "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}); decode falls back to "
            "the plain-Triton kernel for this process (same results, slower). Please report it with the output "
            "of `nvfp4compat validate`.",
            RuntimeWarning,
            stacklevel=3,
        )
    _gluon_failed = True


_zero_statuses: dict[torch.device, torch.Tensor] = {}
# FUSED_MERGE's counters, one buffer per (device, stream): launches on one stream run one after the
# other, so each starts with the zeros the previous one left. A buffer that grows is replaced, and
# the old one is kept alive: a captured CUDA graph may still point at it.
_merge_counter_bufs: dict[tuple[torch.device, int], torch.Tensor] = {}
_merge_counter_kept: list[torch.Tensor] = []
# Zeroed buffers made by eager launches, MERGE_COUNTER_SPARES per device, for a stream whose first fused launch is
# captured in a CUDA graph (nothing can be allocated and zeroed then): triton.testing.do_bench_cudagraph warms up on one
# stream and captures on torch's default capture stream (vLLM 0.26 warms up on its capture stream first).
_merge_counter_spares: dict[torch.device, list[torch.Tensor]] = {}
MERGE_COUNTERS_MIN = 4096
MERGE_COUNTER_SPARES = 2


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _merge_counters(device: torch.device, n: int) -> torch.Tensor | None:
    """At least ``n`` zeroed int32 counters for a fused-merge launch on the current stream of
    ``device``. A stream captured in a CUDA graph before any eager launch on it takes one of the spares that eager
    launches keep zeroed (:data:`MERGE_COUNTER_SPARES`); None where none fits (no eager launch of this size came
    first: that launch takes the merge kernel instead)."""
    if device.type == "cuda":
        return _stream_counters(device, torch.cuda.current_stream(device).cuda_stream, n,
                                torch.cuda.is_current_stream_capturing())
    return _stream_counters(device, 0, n, False)


def _stream_counters(device: torch.device, stream: int, n: int, capturing: bool) -> torch.Tensor | None:
    """:func:`_merge_counters` for stream handle ``stream`` of ``device``, ``capturing`` a CUDA graph or not."""
    key = (device, stream)
    t = _merge_counter_bufs.get(key)
    spares = _merge_counter_spares.setdefault(device, [])
    if t is None or t.numel() < n:
        fit = next((i for i, sp in enumerate(spares) if sp.numel() >= n), None) if capturing else None
        if capturing and fit is None:
            return None
        if t is not None:
            _merge_counter_kept.append(t)
        t = _merge_counter_bufs[key] = (spares.pop(fit) if fit is not None else
                                        torch.zeros(max(n, MERGE_COUNTERS_MIN), dtype=torch.int32, device=device))
    if not capturing and (len(spares) < MERGE_COUNTER_SPARES or spares[0].numel() < t.numel()):
        # (made together, so spares[0] is as large as the others; no graph holds an unclaimed spare: they may go)
        spares[:] = [torch.zeros_like(t) for _ in range(MERGE_COUNTER_SPARES)]
    return t


def _zero_status(device: torch.device) -> torch.Tensor:
    """A status word that stays 0 (the kernels only read it), one per device: a varlen decode launch
    without the guard kernel needs no allocation and fill per call."""
    t = _zero_statuses.get(device)
    if t is None:
        t = _zero_statuses[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return t


def _run_decode(
    d: _DecodeLaunch,
    query: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    cache: list[torch.Tensor],
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    qsl: torch.Tensor | None,
    sinks: torch.Tensor | None,
    k_scale: float | torch.Tensor,
    v_scale: float | torch.Tensor,
    causal: bool,
    status: torch.Tensor | None = None,
) -> None:
    """The launches of one decode call, from its :class:`_DecodeLaunch` and the call's tensors."""
    batch = block_table.shape[0]
    device = query.device
    qmax = d.qmax
    part_o = torch.empty(d.slots, d.num_qo_heads, qmax, d.head_dim, dtype=torch.float32, device=device)
    part_lse = torch.empty(d.slots, d.num_qo_heads, qmax, dtype=torch.float32, device=device)
    lse_arg = lse if lse is not None else out
    sinks_arg = sinks if sinks is not None else out
    qsl_arg = qsl if qsl is not None else seq_lens
    if status is not None:
        status_arg = status
    elif qsl is not None:  # no guard kernel ran: query_start_loc is taken as it is (clamped)
        status_arg = _zero_status(device)
    else:
        status_arg = seq_lens  # never read without VARLEN
    num_tokens = query.shape[0]
    page_shift = _page_shift(d.page_size)
    softcap = d.softcap if d.softcap else 1.0
    counters = _merge_counters(device, batch * d.num_kv_heads) if d.fused_merge else None
    fused = counters is not None
    table = torch.empty(4 * d.chunks, dtype=torch.int32, device=device) if d.table else None
    # the merge kernel's plan: stored by the decode kernel, or by the table kernel where it runs
    plan = torch.empty(2 * batch, dtype=torch.int32, device=device) if d.table or (d.plan and not fused) else None
    # what both decode kernels take; each adds its own constexprs (_PLAIN_DECODE_ONLY / _GLUON_DECODE_ONLY)
    args = (
        query, out, lse_arg, part_o, part_lse,
        *cache, block_table, seq_lens, qsl_arg, sinks_arg,
        k_scale, v_scale, d.sm_scale_log2, softcap, d.window,
        batch, d.programs, d.min_tiles, d.spread, d.group, d.num_qo_heads, d.page_size, page_shift, d.max_pages,
        num_tokens,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1), d.num_qo_heads,
        *d.strides, block_table.stride(0),
    )
    common = dict(
        HEAD_DIM=d.head_dim, BLOCK_M=d.block_m, BLOCK_N=d.cfg.block_n, QMAX=qmax,
        VARLEN=qsl is not None, CAUSAL=causal and qmax > 1, HAS_WINDOW=d.window > 0,
        HAS_SOFTCAP=d.softcap > 0, HAS_SINKS=d.has_sinks, RETURN_LSE=d.return_lse,
        BATCH_BLOCK=d.batch_block, K_SCALE_PTR=d.k_ptr, V_SCALE_PTR=d.v_ptr,
        DATA_ALIGN=d.data_align, SF_ALIGN=d.sf_align, PAGE_POW2=page_shift >= 0,
        num_pages=d.num_pages, status_ptr=status_arg, PDL=d.pdl, BALANCE=d.balance,
        counter_ptr=counters if fused else seq_lens, FUSED_MERGE=fused,
        plan_ptr=plan if plan is not None else seq_lens, PLAN=plan is not None and table is None,
        table_ptr=table if table is not None else seq_lens, TABLE=table is not None,
        num_warps=d.cfg.num_warps, maxnreg=d.cfg.maxnreg,
    )  # fmt: skip
    if table is not None:
        _decode_table_kernel[(1,)](
            seq_lens, qsl_arg, table, plan, status_arg,
            batch, d.programs, d.min_tiles, d.spread, d.window, d.max_pages, d.page_size, num_tokens, d.chunks,
            BLOCK_N=d.cfg.block_n, QMAX=qmax, VARLEN=qsl is not None, HAS_WINDOW=d.window > 0,
            BATCH_BLOCK=max(128, d.batch_block), BALANCE=d.balance, EMPTY_CHUNK=fused, SLOT_BLOCK=1024, num_warps=8,
        )  # fmt: skip
    launched = False
    if d.gluon and not _gluon_failed and d.programs < _GLUON_MAX_PROGRAMS:
        # PAGE_TILE takes the token strides as constexprs (one build per cache layout); elsewhere they stay 0
        tok = d.page_tile_tok
        ring = _gluon_ring(d.cfg, tok[0] > 0)
        l2 = _gluon_l2(d.cfg, ring, tok[0] > 0, _gluon_pring(d.cfg, ring, d.group * qmax))
        try:
            descs = _tma_descriptors(d, cache) if d.tma else None
            LAST_KERNELS["decode"] = _gluon.gluon_decode_kernel[(d.chunks * d.num_kv_heads,)](
                *args, **common, NW=d.cfg.num_warps, ROWS8=d.group * qmax <= 8,
                PAGE_EVEN=d.page_size % 2 == 0 and d.window <= 0, OFF32=d.off32, CVT8=d.cvt8,
                KT=_gluon_kt(d.cfg, d.group * qmax), LEAN=d.cfg.lean and d.cvt8, SKEW=d.cfg.skew_logits,
                PAGE_TILE=tok[0] > 0, IMAD_SHR=d.cfg.imad_shr and d.cvt8, LAZY=d.cfg.lazy_rescale,
                TOK_K=tok[0], TOK_V=tok[1], TOK_KS=tok[2], TOK_VS=tok[3], RING=ring,
                DEFER_SUM=d.cfg.defer_sum, PAIR=d.cfg.tile_pairs,
                SCALE_AHEAD=_gluon_scale_ahead(d.cfg, ring), PRING=_gluon_pring(d.cfg, ring, d.group * qmax),
                L2_FETCH=l2[0], L2_AHEAD=l2[1], L2_SCALES=l2[2], L2_BULK=d.l2_bulk,
                EARLY=_gluon_early(d.cfg, ring, tok[0] > 0, d.num_pages),
                SMEM_MERGE=d.cfg.smem_merge,
                k_desc=descs[0] if descs else None, v_desc=descs[1] if descs else None, TMA=descs is not None,
            )  # fmt: skip
            launched = True
        except Exception as exc:  # a build failure on this GPU / triton: the plain kernel from now on
            _gluon_build_failed(exc)
    if not launched:
        LAST_KERNELS["decode"] = _decode_kernel[(d.chunks * d.num_kv_heads,)](
            *args, **common, FAST=d.fast, DOT_FP32=d.dot_fp32, PREFETCH=d.cfg.prefetch, ROTATE=d.rotate,
            SCALE_WORDS=d.cfg.scale_words, MERGE_CB=d.merge_cb if fused else 1, SWAP_AB=d.cfg.swap_ab,
            num_stages=d.cfg.num_stages,
        )  # fmt: skip
    if fused:
        return
    _decode_reduce_kernel[(batch * qmax, triton.cdiv(d.num_qo_heads, d.merge_block_h))](
        part_o, part_lse, out, lse_arg, seq_lens, qsl_arg, sinks_arg,
        batch, d.programs, d.min_tiles, d.spread, d.window, d.max_pages, d.page_size, query.shape[0],
        d.num_qo_heads, out.stride(0), out.stride(1), d.num_qo_heads,
        HEAD_DIM=d.head_dim, BLOCK_N=d.cfg.block_n, QMAX=qmax, VARLEN=qsl is not None,
        HAS_WINDOW=d.window > 0, HAS_SINKS=d.has_sinks, RETURN_LSE=d.return_lse, BLOCK_H=d.merge_block_h,
        BATCH_BLOCK=d.batch_block, CHUNK_BLOCK=d.merge_chunk_block, status_ptr=status_arg, PDL=d.pdl > 0,
        BALANCE=d.balance, plan_ptr=plan if plan is not None else seq_lens, PLAN=plan is not None, num_warps=4,
        launch_pdl=d.pdl > 0,
    )  # fmt: skip


# The decode host path's cache: what full validation established for one argument signature.
_decode_cache: dict[tuple, _DecodeLaunch] = {}
_DECODE_CACHE_MAX = 512


def _cache_pair(arg) -> tuple[tuple, torch.Tensor, torch.Tensor] | None:
    """(signature, K, V) of a 4-D tuple/list pair or a 5-D stacked tensor; None otherwise (such
    arguments take the validating path every call)."""
    t = type(arg)
    if t is torch.Tensor:
        if arg.dim() != 5:
            return None
        k, v = arg[:, 0], arg[:, 1]
    elif (t is tuple or t is list) and len(arg) == 2:
        k, v = arg
        if type(k) is not torch.Tensor or type(v) is not torch.Tensor or k.dim() != 4 or v.dim() != 4:
            return None
    else:
        return None
    # base-address alignment is part of the signature: it picks the kernel's vector widths; K and V
    # sharing memory is refused by the validating path, so it must never match a cached signature
    kp, vp = k.data_ptr(), v.data_ptr()
    return (t, tensor_meta(k), tensor_meta(v), kp % 16, vp % 16, kp == vp), k, v


def _opt_meta(t) -> object:
    return None if t is None else (tensor_meta(t) if type(t) is torch.Tensor else object())


def _knobs() -> tuple:
    """Everything besides the arguments that a launch depends on (tuning constants, overrides)."""
    return (
        SPLIT_TARGET_PROGRAMS_PER_SM, SPLIT_MIN_CHUNK_TOKENS, SPLIT_SPREAD_PROGRAMS_PER_SM, SPLIT_WAVES, SPLIT_MAX_WAVES,
        SPLIT_WAVE_GAIN,
        SPLIT_BALANCE_STEPS, BATCH_BLOCK_TINY, BATCH_BLOCK_SMALL, BATCH_BLOCK_MAX, MERGE_PLAN_MIN_BATCH,
        DECODE_TABLE_MIN_BATCH, DECODE_WIDE_WARPS,
        MERGE_STEP_ELEMENTS, MERGE_CHUNK_BLOCK, FUSED_MERGE, MERGE_PDL, tuple(_DECODE_CONFIGS.items()), tuple(_DECODE_CONFIGS_BYTE_SCALES.items()), tuple(sorted(_overrides.items())), interpreting(),
        _gluon_failed, tuple(_DECODE_CONFIGS_GLUON.items()), tuple(_DECODE_CONFIGS_GLUON_ROWS16.items()),
    )  # fmt: skip


def _float_scales_fit(k_scale: object, v_scale: object, sm_scale_log2: float) -> bool:
    """Whether Python-float scales keep the kernels' fp32 factors finite (``_check_common``'s rule;
    tensor scales are read on the device). False sends the call to the validating path."""
    lim = FP32_MAX / 256.0
    return not (
        (type(k_scale) is float and k_scale * sm_scale_log2 > lim)
        or (type(v_scale) is float and v_scale > lim)
    )


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors are views of one storage (the rotated readers stage the rotated query in
    ``out``: ``out`` must not alias ``query``)."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _check_rotation_out(name: str, query: torch.Tensor, out: torch.Tensor | None) -> None:
    if out is not None and _shares_memory(out, query):
        raise ValueError(
            f"{name}: with kv_rotation, out must not share memory with query (the kernel stages the "
            "rotated query in out's rows, which other programs of the call may still read as the "
            "query); pass a separate out buffer, or out=None"
        )


def _result(a: _Args) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    if a.lse is not None:
        return a.out, a.lse
    return a.out


def decode(
    query: torch.Tensor,
    paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    kv_cache_sf: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    k_scale: float | torch.Tensor,
    v_scale: float | torch.Tensor,
    *,
    sm_scale: float,
    kv_layout: str = "NHD",
    q_len_per_req: int = 1,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    return_lse: bool = False,
    kv_rotation: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The ``decode`` op (:class:`~nvfp4compat.kernels.contract.DecodeArgs`): split-KV flash-decoding
    with the E2M1 decode fused. Runs on any CUDA GPU Triton supports (SM80+; no FP8/FP4 hardware
    instruction is used) and under ``TRITON_INTERPRET=1`` on the CPU. ``q_len_per_req`` up to 64;
    ``seq_lens`` are clamped on the device; a device-tensor scale is read on the device.

    ``kv_rotation="hadamard"``: the cache holds ``K H`` and ``V H`` (written with the same option,
    :mod:`nvfp4compat.kernels.rotation`); the kernel attends with ``Q H`` and returns the output
    times ``H``, both fused (no extra launch or allocation; the rotated query is staged in ``out``'s
    rows, so ``out`` must not share memory with ``query``); the LSE is unchanged. ``None``: a plain
    cache.
    """
    debug = metadata_checks_on()
    kc, sc = _cache_pair(paged_kv_cache), _cache_pair(kv_cache_sf)
    key = None
    if kc is not None and sc is not None and type(query) is torch.Tensor and not debug:
        ks_meta, vs_meta = scale_meta(k_scale), scale_meta(v_scale)
        if ks_meta is not None and vs_meta is not None and type(block_table) is torch.Tensor:
            key = (
                tensor_meta(query), kc[0], sc[0], tensor_meta(block_table), _opt_meta(seq_lens),
                ks_meta, vs_meta,
                # with their types: True == 1 and 1 == 1.0 hash alike, and bools are refused
                type(sm_scale), sm_scale, kv_layout, type(q_len_per_req), q_len_per_req,
                type(sliding_window), sliding_window, type(logits_soft_cap), logits_soft_cap,
                _opt_meta(sinks), _opt_meta(out), bool(return_lse), type(kv_rotation), kv_rotation,
                _knobs(),
            )  # fmt: skip
            try:
                d = _decode_cache.get(key)
            except TypeError:  # an unhashable argument: the validating path reports it
                key = d = None
            if d is not None and d.rotate and out is not None and _shares_memory(out, query):
                d = None  # the validating path refuses it
            if d is not None and _float_scales_fit(k_scale, v_scale, d.sm_scale_log2):
                # validated before: same metadata, other tensors
                o = torch.empty_like(query, memory_format=torch.contiguous_format) if out is None else out
                lse = (
                    torch.empty(query.shape[0], d.num_qo_heads, dtype=torch.float32, device=query.device)
                    if return_lse
                    else None
                )
                if block_table.shape[0]:
                    sf_k, sf_v = sc[1], sc[2]
                    if sf_k.dtype != torch.uint8:
                        sf_k, sf_v = sf_k.view(torch.uint8), sf_v.view(torch.uint8)
                    _run_decode(
                        d, query, o, lse, [kc[1], kc[2], sf_k, sf_v], block_table, seq_lens, None,
                        sinks.contiguous() if sinks is not None else None, k_scale, v_scale, True,
                    )  # fmt: skip
                return (o, lse) if lse is not None else o
    views = normalize_cache(paged_kv_cache, kv_cache_sf, kv_layout)
    if isinstance(q_len_per_req, bool) or not isinstance(q_len_per_req, int) or not 1 <= q_len_per_req <= 64:
        raise ValueError(f"decode: q_len_per_req must be an int in 1..64, got {q_len_per_req!r}")
    a = _check_common(
        "decode", query, views, block_table, seq_lens, k_scale, v_scale, sm_scale, sliding_window,
        logits_soft_cap, sinks, out, return_lse,
    )
    rotate = fused_rotation("decode", kv_rotation, views.head_dim)
    if rotate:
        _check_rotation_out("decode", query, out)
    batch = block_table.shape[0]
    if query.shape[0] != batch * q_len_per_req:
        raise ValueError(
            f"decode: query has {query.shape[0]} rows, expected batch * q_len_per_req = "
            f"{batch} * {q_len_per_req} = {batch * q_len_per_req}"
        )
    if batch == 0:
        return _result(a)
    if debug:
        check_metadata_values(
            "decode", num_pages=views.num_pages, page_size=views.page_size, block_table=block_table,
            seq_lens=seq_lens, min_seq_len=q_len_per_req,
        )  # fmt: skip
    d = _launch_decode_path(a, query, block_table, seq_lens, None, q_len_per_req, True, rotate=rotate)
    if key is not None and not any(
        isinstance(sc, torch.Tensor) and sc.device != views.device for sc in (k_scale, v_scale)
    ):  # (a host tensor scale is read on the host every call: never cached)
        if len(_decode_cache) >= _DECODE_CACHE_MAX:
            _decode_cache.clear()
        _decode_cache[key] = d
    return _result(a)


def prefill(
    query: torch.Tensor,
    paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    kv_cache_sf: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    k_scale: float | torch.Tensor,
    v_scale: float | torch.Tensor,
    *,
    sm_scale: float,
    kv_layout: str = "NHD",
    causal: bool = True,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    return_lse: bool = False,
    kv_rotation: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The ``prefill`` op (:class:`~nvfp4compat.kernels.contract.PrefillArgs`). Requests with at most
    ``16 // (num_qo_heads // num_kv_heads)`` queries (decode rows) run through the split-KV decode
    kernel in the same call. ``query_start_loc`` is checked on the device without a sync: bad
    entries, and ``seq_lens`` past their rows, set the device error flag that
    :func:`nvfp4compat.kernels.errors.check_errors` reports. ``kv_rotation``: as in :func:`decode`
    (both kernels rotate, fused).
    """
    views = normalize_cache(paged_kv_cache, kv_cache_sf, kv_layout)
    a = _check_common(
        "prefill", query, views, block_table, seq_lens, k_scale, v_scale, sm_scale, sliding_window,
        logits_soft_cap, sinks, out, return_lse,
    )
    rotate = fused_rotation("prefill", kv_rotation, views.head_dim)
    if rotate:
        _check_rotation_out("prefill", query, out)
    batch = block_table.shape[0]
    qsl = check_query_start_loc("prefill", query_start_loc, batch, views.device)
    num_tokens = query.shape[0]
    if batch == 0 or num_tokens == 0:
        return _result(a)
    if metadata_checks_on():
        check_metadata_values(
            "prefill", num_pages=views.num_pages, page_size=views.page_size, block_table=block_table,
            seq_lens=seq_lens, query_start_loc=qsl, num_tokens=num_tokens,
        )  # fmt: skip
    if num_tokens > _MAX_TOKENS:
        raise ValueError(f"prefill: {num_tokens} query rows exceed the kernels' int32 row index ({_MAX_TOKENS})")
    max_kv = _max_kv(block_table, views.page_size)
    # query_start_loc is checked on the device (no host sync): the guard writes the rows it does not
    # cover and sets `status` when its entries decrease (then the attention kernels do nothing).
    status = torch.empty(1, dtype=torch.int32, device=views.device)
    _qsl_guard_kernel[(triton.cdiv(num_tokens, _GUARD_ROWS),)](
        qsl, seq_lens, status, error_flag(views.device), a.out, a.lse if a.lse is not None else a.out,
        batch, num_tokens, a.num_qo_heads, max_kv, a.out.stride(0), a.out.stride(1), a.num_qo_heads,
        HEAD_DIM=views.head_dim, ROWS=_GUARD_ROWS, BLOCK_B=_GUARD_BLOCK_B, RETURN_LSE=a.lse is not None,
    )  # fmt: skip
    qmax = max(1, 16 // a.group)
    # With one request the query length is known on the host: launch only the kernel it needs.
    only_decode = batch == 1 and num_tokens <= qmax
    only_prefill = batch == 1 and num_tokens > qmax
    if not only_decode:
        cfg = prefill_config(views.head_dim)
        block_m = max(cfg.block_m, triton.next_power_of_2(a.group))
        block_q = block_m // a.group
        grid0 = num_tokens // block_q + batch
        k_ptr = isinstance(a.k_scale, torch.Tensor)
        v_ptr = isinstance(a.v_scale, torch.Tensor)
        lse = a.lse if a.lse is not None else a.out
        sinks_arg = a.sinks if a.sinks is not None else a.out
        cl = _cache_launch(views)
        LAST_KERNELS["prefill"] = _prefill_kernel[(grid0, views.num_kv_heads)](
            query, a.out, lse,
            *cl.tensors, block_table, seq_lens, qsl, sinks_arg,
            a.k_scale, a.v_scale, a.sm_scale_log2, a.softcap if a.softcap else 1.0, a.window,
            batch, a.group, block_q, 1 if only_prefill else qmax + 1, views.page_size,
            _page_shift(views.page_size),
            query.stride(0), query.stride(1), a.out.stride(0), a.out.stride(1), a.num_qo_heads,
            *cl.strides, block_table.stride(0),
            HEAD_DIM=views.head_dim, BLOCK_M=block_m, BLOCK_N=cfg.block_n,
            CAUSAL=bool(causal), HAS_WINDOW=a.window > 0, HAS_SOFTCAP=a.softcap > 0,
            HAS_SINKS=a.sinks is not None, RETURN_LSE=a.lse is not None,
            K_SCALE_PTR=k_ptr, V_SCALE_PTR=v_ptr, FAST=_fast(views.device),
            DOT_FP32=interpreting() and query.dtype == torch.bfloat16,
            DATA_ALIGN=cl.data_align, SF_ALIGN=cl.sf_align, PAGE_POW2=_page_shift(views.page_size) >= 0,
            num_pages=views.num_pages, max_kv=max_kv, num_tokens=num_tokens, status_ptr=status,
            ROTATE=rotate, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
    if not only_prefill:
        _launch_decode_path(a, query, block_table, seq_lens, qsl, qmax, bool(causal), status, rotate)
    return _result(a)


# --------------------------------------------------------------------------------------------------
# Ahead-of-time variants (nvfp4compat.kernels.aot provider)
# --------------------------------------------------------------------------------------------------


def _cache_sig() -> dict[str, str]:
    sig = {"k_ptr": "*u8", "v_ptr": "*u8", "ks_ptr": "*u8", "vs_ptr": "*u8", "bt_ptr": "*i32",
           "seq_lens_ptr": "*i32", "qsl_ptr": "*i32", "sinks_ptr": "*fp32"}
    return sig


def _guard_sig() -> dict[str, str]:
    """The metadata-clamp arguments at the end of the decode and prefill kernels."""
    return {"num_pages": "i32", "max_kv": "i32", "num_tokens": "i32", "status_ptr": "*i32"}


def _decode_signature(dtype: str, k_ptr: bool, v_ptr: bool) -> dict[str, str]:
    sig: dict[str, str] = {"q_ptr": f"*{dtype}", "o_ptr": f"*{dtype}", "lse_ptr": "*fp32",
                           "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32"}
    sig.update(_cache_sig())
    sig.update({"k_scale": "*fp32" if k_ptr else "fp32", "v_scale": "*fp32" if v_ptr else "fp32",
                "sm_scale_log2": "fp32", "softcap": "fp32", "window": "i32",
                "batch": "i32", "programs": "i32", "min_tiles": "i32", "spread": "i32", "group": "i32",
                "num_qo_heads": "i32", "page_size": "i32", "page_shift": "i32", "max_pages": "i32",
                "num_tokens": "i32"})
    for name in ("stride_qt", "stride_qh", "stride_ot", "stride_oh", "stride_lt",
                 "stride_kp", "stride_kt", "stride_kh", "stride_vp", "stride_vt", "stride_vh",
                 "stride_ksp", "stride_kst", "stride_ksh", "stride_vsp", "stride_vst", "stride_vsh",
                 "stride_bt"):
        sig[name] = "i64" if name.endswith("p") else "i32"
    for name in ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "QMAX", "VARLEN", "CAUSAL", "HAS_WINDOW",
                 "HAS_SOFTCAP", "HAS_SINKS", "RETURN_LSE", "BATCH_BLOCK", "K_SCALE_PTR", "V_SCALE_PTR",
                 "FAST", "DOT_FP32", "DATA_ALIGN", "SF_ALIGN", "PAGE_POW2"):
        sig[name] = "constexpr"
    sig.update({"num_pages": "i32", "status_ptr": "*i32", "PREFETCH": "constexpr",
                "ROTATE": "constexpr", "SCALE_WORDS": "constexpr", "counter_ptr": "*i32",
                "FUSED_MERGE": "constexpr", "MERGE_CB": "constexpr",
                "SWAP_AB": "constexpr", "PDL": "constexpr", "BALANCE": "constexpr", "plan_ptr": "*i32",
                "PLAN": "constexpr", "table_ptr": "*i32", "TABLE": "constexpr"})  # (num_tokens, max_pages are above)
    return sig


def _prefill_signature(dtype: str, k_ptr: bool, v_ptr: bool) -> dict[str, str]:
    sig: dict[str, str] = {"q_ptr": f"*{dtype}", "o_ptr": f"*{dtype}", "lse_ptr": "*fp32"}
    sig.update(_cache_sig())
    sig.update({"k_scale": "*fp32" if k_ptr else "fp32", "v_scale": "*fp32" if v_ptr else "fp32",
                "sm_scale_log2": "fp32", "softcap": "fp32", "window": "i32",
                "batch": "i32", "group": "i32", "block_q": "i32", "min_q_len": "i32", "page_size": "i32",
                "page_shift": "i32"})
    for name in ("stride_qt", "stride_qh", "stride_ot", "stride_oh", "stride_lt",
                 "stride_kp", "stride_kt", "stride_kh", "stride_vp", "stride_vt", "stride_vh",
                 "stride_ksp", "stride_kst", "stride_ksh", "stride_vsp", "stride_vst", "stride_vsh",
                 "stride_bt"):
        sig[name] = "i64" if name.endswith("p") else "i32"
    for name in ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "CAUSAL", "HAS_WINDOW", "HAS_SOFTCAP", "HAS_SINKS",
                 "RETURN_LSE", "K_SCALE_PTR", "V_SCALE_PTR", "FAST", "DOT_FP32", "DATA_ALIGN", "SF_ALIGN", "PAGE_POW2"):
        sig[name] = "constexpr"
    sig.update(_guard_sig())
    sig["ROTATE"] = "constexpr"
    return sig


def _pointer_attrs(sig: dict[str, str]) -> dict[Any, Any]:
    """16-byte alignment of every pointer argument: what Triton's launcher specializes at run time."""
    return {(i,): [["tt.divisibility", 16]] for i, t in enumerate(sig.values()) if t.startswith("*")}


_FEATURES_OFF: dict[str, Any] = {"HAS_WINDOW": False, "HAS_SOFTCAP": False, "HAS_SINKS": False, "RETURN_LSE": False}
_FEATURES_ON: dict[str, Any] = {"HAS_WINDOW": True, "HAS_SOFTCAP": True, "HAS_SINKS": True, "RETURN_LSE": True}


def aot_variants() -> dict[str, list[Any]]:
    """The covering set of shipped variants per kernel, as ``AotVariant`` lists (see ``aot.py``).

    Every head_dim x dtype with the default features; every feature flag on alone and all together;
    q_len 1 and 8 (rows 16 and 64 with GQA 8); batch blocks 1-1024 of the on-device work split; tensor and float scales;
    the inline-PTX bit-placement decoder (what CUDA runs; the table decoder for fp16) and, once per
    kernel, the portable decoder (the fallback) and the bf16 table decoder.
    Each decode variant uses the config :func:`decode_config` picks for its launch: head_dim 128 at
    2 warps for 16 rows, and the widened 4-warp config for 64 rows and for latency-bound grids.
    """
    from nvfp4compat.kernels.aot import AotVariant

    dec: list[AotVariant] = []
    pre: list[AotVariant] = []
    red: list[AotVariant] = []

    def add_decode(label: str, dtype: str, hd: int, *, qmax: int = 1, group: int = 4, varlen: bool = False,
                   batch_block: int = 128, decoder: str = "bitwise", ptr: bool = True, combined: bool = False,
                   pow2: bool = True, latency: bool = False, config: DecodeConfig | None = None, pdl: int = 0,
                   **features: Any) -> None:
        block_m = max(16, triton.next_power_of_2(group * qmax))
        # the launch config decode() picks (latency=True is a grid smaller than the GPU), or `config`
        cfg = config or decode_config(hd, block_m, 1 if latency else None, 2 if latency else None,
                                      bool(features.get("ROTATE")))
        c: dict[str, Any] = {"HEAD_DIM": hd, "BLOCK_M": block_m,
                             "BLOCK_N": cfg.block_n, "QMAX": qmax, "VARLEN": varlen, "CAUSAL": qmax > 1,
                             "BATCH_BLOCK": batch_block, "K_SCALE_PTR": ptr, "V_SCALE_PTR": ptr, "FAST": DECODERS[decoder],
                             "DOT_FP32": False, "DATA_ALIGN": 8 if combined else 16,
                             "SF_ALIGN": min(16, hd // 16), "PAGE_POW2": pow2, "PREFETCH": cfg.prefetch,
                             "ROTATE": False, "SCALE_WORDS": cfg.scale_words, "FUSED_MERGE": False, "MERGE_CB": 1,
                             "SWAP_AB": cfg.swap_ab, "PDL": False, "BALANCE": 0, "PLAN": False, "TABLE": False}
        c.update(_FEATURES_OFF)
        c.update(features)
        sig = _decode_signature(dtype, ptr, ptr)
        dec.append(AotVariant(label, sig, c, cfg.num_warps, cfg.num_stages, _pointer_attrs(sig), maxnreg=cfg.maxnreg,
                              by_cc=functools.partial(_pdl_by_cc, level=pdl) if pdl else None))

    def add_prefill(label: str, dtype: str, hd: int, *, causal: bool = True, decoder: str = "bitwise",
                    ptr: bool = True, combined: bool = False, pow2: bool = True, **features: Any) -> None:
        cfg = _PREFILL_CONFIGS[hd]
        c: dict[str, Any] = {"HEAD_DIM": hd, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
                             "CAUSAL": causal, "K_SCALE_PTR": ptr, "V_SCALE_PTR": ptr, "FAST": DECODERS[decoder],
                             "DOT_FP32": False, "DATA_ALIGN": 8 if combined else 16,
                             "SF_ALIGN": min(16, hd // 16), "PAGE_POW2": pow2, "ROTATE": False}
        c.update(_FEATURES_OFF)
        c.update(features)
        sig = _prefill_signature(dtype, ptr, ptr)
        pre.append(AotVariant(label, sig, c, cfg.num_warps, cfg.num_stages, _pointer_attrs(sig)))

    for dtype in ("bf16", "fp16"):
        for hd in (64, 128, 256, 512):
            add_decode(f"{dtype}-d{hd}", dtype, hd)
            add_prefill(f"{dtype}-d{hd}", dtype, hd)
    add_decode("bf16-d128-batch1024", "bf16", 128, batch_block=1024)
    add_decode("bf16-d128-batch32", "bf16", 128, batch_block=32)  # (BATCH_BLOCK_TINY)
    add_decode("bf16-d128-plan-batch256", "bf16", 128, batch_block=256, PLAN=True)  # (MERGE_PLAN_MIN_BATCH)
    add_decode("bf16-d128-chunk-table", "bf16", 128, TABLE=True)  # (DECODE_TABLE_MIN_BATCH)
    add_decode("bf16-d128-pdl", "bf16", 128, pdl=1)
    add_decode("bf16-d128-pdl-late", "bf16", 128, pdl=2)
    # the balanced split (SPLIT_BALANCE_STEPS): with both batch blocks, and varlen rows
    add_decode("bf16-d128-balance", "bf16", 128, BALANCE=8)
    add_decode("bf16-d128-varlen-balance-batch1024", "bf16", 128, qmax=4, varlen=True, batch_block=1024, BALANCE=3)
    add_decode("bf16-d128-latency", "bf16", 128, latency=True)
    add_decode("fp16-d128-latency-batch128", "fp16", 128, latency=True, batch_block=128)
    add_decode("bf16-d128-floatscale", "bf16", 128, ptr=False)
    add_decode("bf16-d128-q8-g8", "bf16", 128, qmax=8, group=8)
    add_decode("fp16-d64-q4-all", "fp16", 64, qmax=4, **_FEATURES_ON)
    add_decode("bf16-d128-varlen", "bf16", 128, qmax=4, varlen=True)
    add_decode("bf16-d128-combined", "bf16", 128, combined=True)
    add_decode("bf16-d128-page-any", "bf16", 128, pow2=False)
    add_decode("bf16-d128-all-batch1024", "bf16", 128, batch_block=1024, **_FEATURES_ON)
    add_decode("bf16-d256-portable", "bf16", 256, decoder="portable", **_FEATURES_ON)
    add_decode("fp16-d128-portable", "fp16", 128, decoder="portable")
    add_decode("bf16-d128-table", "bf16", 128, decoder="table")
    add_decode("bf16-d64-q4-table-all", "bf16", 64, qmax=4, decoder="table", **_FEATURES_ON)
    # the opt-in register double-buffered loop (DecodeConfig.prefetch), as benchmarks/bench_attention.py sweeps it
    add_decode("bf16-d128-prefetch", "bf16", 128, config=PREFETCH_DECODE_CONFIG)
    # K as the first operand of the logits' MMA (DecodeConfig.swap_ab), as the sweep has them: a wgmma on
    # SM90, mma.sync with K in registers elsewhere
    add_decode("bf16-d128-swap", "bf16", 128, config=SWAP_DECODE_CONFIGS[0])
    add_decode("bf16-d128-swap-capped", "bf16", 128, config=SWAP_DECODE_CONFIGS[1])
    add_decode("fp16-d64-q4-swap-all", "fp16", 64, qmax=4, config=SWAP_DECODE_CONFIGS[2], **_FEATURES_ON)
    add_decode("fp16-d64-q4-prefetch-all", "fp16", 64, qmax=4, config=PREFETCH_DECODE_CONFIG, **_FEATURES_ON)
    # the merge inside the decode kernel (FUSED_MERGE): one request of 16 rows, and GQA 8 x q_len 8 with
    # every feature
    add_decode("bf16-d128-fused-merge", "bf16", 128, FUSED_MERGE=True, MERGE_CB=1)
    add_decode("fp16-d64-q8-g8-fused-merge-all", "fp16", 64, qmax=8, group=8, FUSED_MERGE=True, MERGE_CB=1,
               **_FEATURES_ON)
    # byte-loaded block scales (DecodeConfig.scale_words=False), as benchmarks/bench_attention.py sweeps them
    add_decode("bf16-d128-bytescales", "bf16", 128, config=BYTE_SCALE_DECODE_CONFIGS[0])
    add_decode("fp16-d64-q4-bytescales-all", "fp16", 64, qmax=4, config=BYTE_SCALE_DECODE_CONFIGS[2],
               **_FEATURES_ON)
    # the fused Hadamard rotation (kv_rotation="hadamard"): the default build, GQA 8 x q_len 8 with
    # the split merge and every feature, and fp16 at the smallest and largest head_dim
    add_decode("bf16-d128-rotate", "bf16", 128, ROTATE=True)
    add_decode("bf16-d128-q8-g8-rotate-all", "bf16", 128, qmax=8, group=8, ROTATE=True, **_FEATURES_ON)
    add_decode("fp16-d64-rotate", "fp16", 64, ROTATE=True)
    add_decode("fp16-d512-rotate", "fp16", 512, ROTATE=True)
    add_prefill("bf16-d128-rotate", "bf16", 128, ROTATE=True)
    add_prefill("fp16-d64-rotate-all", "fp16", 64, ROTATE=True, **_FEATURES_ON)
    add_prefill("bf16-d512-rotate", "bf16", 512, ROTATE=True)
    for feat in ("HAS_WINDOW", "HAS_SOFTCAP", "HAS_SINKS", "RETURN_LSE"):
        on: dict[str, Any] = {feat: True}
        add_prefill(f"bf16-d128-{feat.lower()}", "bf16", 128, **on)
    add_prefill("fp16-d256-all", "fp16", 256, **_FEATURES_ON)
    add_prefill("bf16-d128-noncausal-floatscale", "bf16", 128, causal=False, ptr=False)
    add_prefill("fp16-d128-combined", "fp16", 128, combined=True)
    add_prefill("bf16-d128-page-any", "bf16", 128, pow2=False)
    add_prefill("bf16-d128-portable", "bf16", 128, decoder="portable", **_FEATURES_ON)
    add_prefill("fp16-d512-portable", "fp16", 512, decoder="portable")
    add_prefill("bf16-d128-table", "bf16", 128, decoder="table")

    # the Gluon decode: the default launch (<= 8 rows, even pages, 32-bit offsets; the E4M3 conversion on SM89+), 16
    # rows (the lean config), every feature with q_len 2 and 64-bit offsets (a window: no page_tile), sinks, soft-cap and
    # LSE with page_tile, pages of any size, a batch block of 1024, fp16 queries, the bit placement everywhere, and
    # every config of GLUON_DECODE_CONFIGS
    glu: list[AotVariant] = []

    def add_gluon(label: str, cfg: DecodeConfig, *, dtype: str = "bf16", group: int = 4, qmax: int = 1,
                  pow2: bool = True, even: bool = True, off32: bool = True, batch_block: int = 128, ptr: bool = True,
                  pdl: int = 0, **features: Any) -> None:
        sig = _decode_signature(dtype, ptr, ptr)
        for name in _PLAIN_DECODE_ONLY:
            sig.pop(name)
        sig.update(dict.fromkeys(_GLUON_DECODE_ONLY, "constexpr"))
        c: dict[str, Any] = {"HEAD_DIM": 128, "BLOCK_M": 16, "BLOCK_N": cfg.block_n, "QMAX": qmax, "VARLEN": False,
                             "CAUSAL": qmax > 1, "BATCH_BLOCK": batch_block, "K_SCALE_PTR": ptr, "V_SCALE_PTR": ptr,
                             "DATA_ALIGN": 16, "SF_ALIGN": 8, "PAGE_POW2": pow2, "NW": cfg.num_warps,
                             "ROWS8": group * qmax <= 8, "PAGE_EVEN": even, "OFF32": off32, "CVT8": False,
                             "KT": _gluon_kt(cfg, group * qmax), "LEAN": False, "SKEW": cfg.skew_logits,
                             "IMAD_SHR": False, "LAZY": cfg.lazy_rescale, "DEFER_SUM": cfg.defer_sum, "PDL": False,
                             "PAIR": cfg.tile_pairs, "TMA": False, "BALANCE": 0, "FUSED_MERGE": False,
                             "PLAN": False, "TABLE": False, "SMEM_MERGE": cfg.smem_merge}
        c.update(_FEATURES_OFF)
        c.update(features)
        # pages of 16 keys where the variant has pages of 2^n keys
        c["PAGE_TILE"] = _gluon_page_tile(cfg, 16 if pow2 else 13, 1 if c["HAS_WINDOW"] else 0)
        # with it, the token strides of an NHD cache of 8 KV heads (64 data and 8 scale bytes per head and token)
        tok = (512, 512, 64, 64) if c["PAGE_TILE"] else (0, 0, 0, 0)
        c.update(zip(("TOK_K", "TOK_V", "TOK_KS", "TOK_VS"), tok, strict=True))
        c["RING"] = _gluon_ring(cfg, c["PAGE_TILE"])
        c["SCALE_AHEAD"] = _gluon_scale_ahead(cfg, c["RING"])
        c["PRING"] = _gluon_pring(cfg, c["RING"], group * qmax)
        c["L2_FETCH"], c["L2_AHEAD"], c["L2_SCALES"] = _gluon_l2(cfg, c["RING"], c["PAGE_TILE"], c["PRING"])
        c["EARLY"] = _gluon_early(cfg, c["RING"], c["PAGE_TILE"])
        # the ring filled by TMA (tma_loader) where the launcher takes it: SM90+, the descriptors of a uint8 cache
        tma = _tma_ring(cfg, c["RING"])
        if tma:
            sig.update(dict.fromkeys(("k_desc", "v_desc"), _TMA_DESC_TYPE))
        else:
            c.update(k_desc=None, v_desc=None)
        # the bulk L2 prefetch where the launcher takes it (SM90+: _gluon_l2_bulk per target in by_cc)
        c["L2_BULK"] = 0
        # the E4M3 conversion where the launcher takes it: SM89+
        by_cc = (lambda cc: {"CVT8": cc >= 89, "LEAN": cfg.lean and cc >= 89, "IMAD_SHR": cfg.imad_shr and cc >= 89,
                             **(_pdl_by_cc(cc, pdl) if pdl else {}), **({"TMA": cc >= 90} if tma else {}),
                             **({"L2_BULK": _gluon_l2_bulk(cfg, c["RING"], c["PAGE_TILE"], cc)} if cfg.l2_bulk else {})}
                 ) if cfg.e4m3_cvt else (functools.partial(_pdl_by_cc, level=pdl) if pdl else None)
        glu.append(AotVariant(label, sig, c, cfg.num_warps, 1, _pointer_attrs(sig), maxnreg=cfg.maxnreg, by_cc=by_cc))

    gdef, g16def = _DECODE_CONFIGS_GLUON[128], _DECODE_CONFIGS_GLUON_ROWS16[128]
    add_gluon("bf16-d128", gdef)
    add_gluon("bf16-d128-g16", g16def, group=16)
    add_gluon("bf16-d128-q2-all-off64", gdef, qmax=2, off32=False, **_FEATURES_ON)
    add_gluon("bf16-d128-q2-sinks-softcap-lse-off64", gdef, qmax=2, off32=False, HAS_SOFTCAP=True, HAS_SINKS=True,
              RETURN_LSE=True)
    add_gluon("bf16-d128-g8-q2-varlen", g16def, group=8, qmax=2, VARLEN=True)
    add_gluon("bf16-d128-page-any", gdef, pow2=False, even=False, ptr=False)
    add_gluon("bf16-d128-batch1024", gdef, batch_block=1024)
    add_gluon("bf16-d128-batch32", gdef, batch_block=32)  # (BATCH_BLOCK_TINY: one request a thread)
    add_gluon("bf16-d128-plan-batch256", gdef, batch_block=256, PLAN=True)  # (MERGE_PLAN_MIN_BATCH)
    add_gluon("bf16-d128-plan-batch512", gdef, batch_block=512, PLAN=True)
    add_gluon("bf16-d128-chunk-table", gdef, TABLE=True)  # (DECODE_TABLE_MIN_BATCH)
    add_gluon("bf16-d128-pdl", gdef, pdl=1)
    add_gluon("bf16-d128-pdl-late", gdef, pdl=2)
    add_gluon("bf16-d128-balance", gdef, BALANCE=8)
    add_gluon("bf16-d128-balance-batch1024", gdef, batch_block=1024, BALANCE=3)
    # the fused merge (FUSED_MERGE): 8 rows with every feature, 16 rows in fp16 with a varlen batch, the one-warp config
    add_gluon("bf16-d128-fused-merge", gdef, FUSED_MERGE=True)
    add_gluon("bf16-d128-fused-merge-q2-all", gdef, qmax=2, FUSED_MERGE=True, **_FEATURES_ON)
    add_gluon("fp16-d128-fused-merge-g16-varlen", g16def, dtype="fp16", group=16, VARLEN=True, FUSED_MERGE=True)
    add_gluon("bf16-d128-fused-merge-one-warp", _GLUON_ONE_WARP, FUSED_MERGE=True, HAS_SINKS=True, RETURN_LSE=True)
    # the warps' merge through shared memory (smem_merge; the default's at <= 8 rows, whose variants above cover it with
    # every feature and the fused merge) on 16 rows, in bf16 and in fp16 with varlen rows
    sm16 = replace(g16def, smem_merge=True)
    add_gluon("bf16-d128-smem-merge-g16", sm16, group=16)
    add_gluon("fp16-d128-smem-merge-g8-varlen", sm16, dtype="fp16", group=8, VARLEN=True)
    # two tiles per softmax update (tile_pairs) with q_len 2, sinks, soft-cap and LSE, and with fp16 queries
    add_gluon("bf16-d128-pairs-q2-sinks-softcap-lse", replace(_GLUON_KT_PAGE_TILE, tile_pairs=True), qmax=2, HAS_SOFTCAP=True,
              HAS_SINKS=True, RETURN_LSE=True)
    add_gluon("fp16-d128-pairs", replace(_GLUON_KT_PAGE_TILE, tile_pairs=True), dtype="fp16")
    add_gluon("bf16-d128-ring4-pairs-q2-sinks-softcap-lse", replace(_GLUON_KT_PAGE_TILE, tile_pairs=True, ring=4), qmax=2,
              HAS_SOFTCAP=True, HAS_SINKS=True, RETURN_LSE=True)
    add_gluon("fp16-d128", gdef, dtype="fp16")
    add_gluon("fp16-d128-q2-all", gdef, dtype="fp16", qmax=2, **_FEATURES_ON)
    kt = next(c for c in GLUON_DECODE_CONFIGS if c.kt_logits)
    add_gluon("bf16-d128-kt-q2-all", kt, qmax=2, **_FEATURES_ON)
    add_gluon("fp16-d128-kt-page-any", kt, dtype="fp16", pow2=False, even=False)
    full = GLUON_FP32_SCALES_CONFIG
    add_gluon("bf16-d128-fp32-scales-q2-all", full, qmax=2, **_FEATURES_ON)
    add_gluon("fp16-d128-fp32-scales-g16-page-any", full, dtype="fp16", group=16, pow2=False, even=False)
    add_gluon("bf16-d128-lean-kt", replace(kt, lean=True))
    skew = next(c for c in GLUON_DECODE_CONFIGS if c.skew_logits)
    add_gluon("bf16-d128-skew-q2-all", skew, qmax=2, **_FEATURES_ON)
    add_gluon("fp16-d128-skew-g16-page-any", skew, dtype="fp16", group=16, pow2=False, even=False)
    tiled = next(c for c in GLUON_DECODE_CONFIGS if c.page_tile)
    add_gluon("bf16-d128-page-tile-q2-sinks-softcap-lse-off64", tiled, qmax=2, off32=False, HAS_SOFTCAP=True,
              HAS_SINKS=True, RETURN_LSE=True)
    add_gluon("fp16-d128-page-tile-g16-varlen", tiled, dtype="fp16", group=16, VARLEN=True)
    lazy = next(c for c in GLUON_DECODE_CONFIGS if c.lazy_rescale)
    add_gluon("bf16-d128-lazy-q2-sinks-softcap-lse", lazy, qmax=2, HAS_SOFTCAP=True, HAS_SINKS=True, RETURN_LSE=True)
    add_gluon("fp16-d128-lazy-g16-window-page-any", lazy, dtype="fp16", group=16, pow2=False, even=False,
              HAS_WINDOW=True)
    placed = GLUON_PLACED_CONFIG  # the bit placement on every target
    add_gluon("bf16-d128-placed-q2-all", placed, qmax=2, **_FEATURES_ON)
    add_gluon("fp16-d128-placed-g16", placed, dtype="fp16", group=16)
    # the ring declared in inline PTX (ptx_ring) at 16 rows (built without it) and at 8 and 4 rows with features
    pring = next(c for c in GLUON_DECODE_CONFIGS if c.ptx_ring)
    add_gluon("bf16-d128-pring-g16", pring, group=16)
    add_gluon("bf16-d128-pring-q8-g1-all", pring, group=1, qmax=8, **_FEATURES_ON)
    add_gluon("bf16-d128-pring-g8-sinks-softcap-lse", pring, group=8, HAS_SOFTCAP=True, HAS_SINKS=True,
              RETURN_LSE=True)
    add_gluon("fp16-d128-pring-q2-g4-sinks-softcap-lse", pring, dtype="fp16", qmax=2, HAS_SOFTCAP=True,
              HAS_SINKS=True, RETURN_LSE=True)
    for i, gcfg in enumerate(GLUON_DECODE_CONFIGS):
        add_gluon(f"bf16-d128-sweep{i}", gcfg)

    red_sig_base = {"part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "o_ptr": "*bf16", "lse_ptr": "*fp32",
                    "seq_lens_ptr": "*i32", "qsl_ptr": "*i32", "sinks_ptr": "*fp32", "batch": "i32",
                    "programs": "i32", "min_tiles": "i32", "spread": "i32", "window": "i32", "max_pages": "i32",
                    "page_size": "i32", "num_tokens": "i32", "num_qo_heads": "i32", "stride_ot": "i32",
                    "stride_oh": "i32", "stride_lt": "i32"}
    for name in ("HEAD_DIM", "BLOCK_N", "QMAX", "VARLEN", "HAS_WINDOW", "HAS_SINKS", "RETURN_LSE", "BLOCK_H",
                 "BATCH_BLOCK", "CHUNK_BLOCK"):
        red_sig_base[name] = "constexpr"
    red_sig_base.update({"status_ptr": "*i32", "PDL": "constexpr", "BALANCE": "constexpr", "plan_ptr": "*i32",
                         "PLAN": "constexpr"})
    for dtype in ("bf16", "fp16"):
        for hd in (64, 128, 256, 512):
            sig = dict(red_sig_base, o_ptr=f"*{dtype}")
            block_h, chunk_block = merge_blocks(32, hd)
            c = {"HEAD_DIM": hd, "BLOCK_N": _DECODE_CONFIGS[hd].block_n, "QMAX": 1, "VARLEN": False,
                 "HAS_WINDOW": hd == 64, "HAS_SINKS": hd == 64, "RETURN_LSE": hd == 64,
                 "BLOCK_H": block_h, "BATCH_BLOCK": 128, "CHUNK_BLOCK": chunk_block, "PDL": False, "BALANCE": 0,
                 "PLAN": False}
            red.append(AotVariant(f"{dtype}-d{hd}", sig, c, 4, 1, _pointer_attrs(sig)))
            if (dtype, hd) == ("bf16", 128):  # the dependent launch (MERGE_PDL) where it exists: SM90+
                red.append(AotVariant(f"{dtype}-d{hd}-pdl", sig, c, 4, 1, _pointer_attrs(sig), by_cc=_pdl_by_cc))
                # the plan the decode stored (MERGE_PLAN_MIN_BATCH), with and without the dependent launch
                red.append(AotVariant(f"{dtype}-d{hd}-plan-batch1024", sig, dict(c, PLAN=True, BATCH_BLOCK=1024), 4, 1,
                                      _pointer_attrs(sig)))
                red.append(AotVariant(f"{dtype}-d{hd}-plan-pdl", sig, dict(c, PLAN=True), 4, 1, _pointer_attrs(sig),
                                      by_cc=_pdl_by_cc))
    red.append(AotVariant("bf16-d128-varlen", red_sig_base,
                          {"HEAD_DIM": 128, "BLOCK_N": 64, "QMAX": 4, "VARLEN": True, "HAS_WINDOW": False,
                           "HAS_SINKS": True, "RETURN_LSE": True, "BLOCK_H": 1, "BATCH_BLOCK": 1024,
                           "CHUNK_BLOCK": 64, "PDL": False, "BALANCE": 8, "PLAN": False}, 4, 1,
                          _pointer_attrs(red_sig_base)))
    guard: list[AotVariant] = []
    for dtype, hd, lse in (("bf16", 64, True), ("bf16", 128, True), ("bf16", 256, False), ("bf16", 512, True),
                           ("fp16", 128, False), ("fp16", 64, True)):
        sig = {"qsl_ptr": "*i32", "seq_lens_ptr": "*i32", "status_ptr": "*i32", "err_ptr": "*i32",
               "o_ptr": f"*{dtype}", "lse_ptr": "*fp32", "batch": "i32", "num_tokens": "i32",
               "num_qo_heads": "i32", "max_kv": "i32", "stride_ot": "i32", "stride_oh": "i32",
               "stride_lt": "i32", "HEAD_DIM": "constexpr", "ROWS": "constexpr", "BLOCK_B": "constexpr",
               "RETURN_LSE": "constexpr"}
        c = {"HEAD_DIM": hd, "ROWS": _GUARD_ROWS, "BLOCK_B": _GUARD_BLOCK_B, "RETURN_LSE": lse}
        guard.append(AotVariant(f"{dtype}-d{hd}{'-lse' if lse else ''}", sig, c, 4, 1, _pointer_attrs(sig)))
    table: list[AotVariant] = []
    tsig = {"seq_lens_ptr": "*i32", "qsl_ptr": "*i32", "table_ptr": "*i32", "plan_ptr": "*i32", "status_ptr": "*i32",
            "batch": "i32", "programs": "i32", "min_tiles": "i32", "spread": "i32", "window": "i32",
            "max_pages": "i32", "page_size": "i32", "num_tokens": "i32", "n_slots": "i32"}
    tsig.update(dict.fromkeys(("BLOCK_N", "QMAX", "VARLEN", "HAS_WINDOW", "BATCH_BLOCK", "BALANCE", "EMPTY_CHUNK",
                               "SLOT_BLOCK"), "constexpr"))
    for label, c in (
        ("b128", {"QMAX": 1, "VARLEN": False, "HAS_WINDOW": False, "BATCH_BLOCK": 128, "BALANCE": 0,
                  "EMPTY_CHUNK": False}),
        ("b1024-balance-fused", {"QMAX": 1, "VARLEN": False, "HAS_WINDOW": False, "BATCH_BLOCK": 1024, "BALANCE": 3,
                                 "EMPTY_CHUNK": True}),
        ("b256-varlen-window", {"QMAX": 4, "VARLEN": True, "HAS_WINDOW": True, "BATCH_BLOCK": 256, "BALANCE": 0,
                                "EMPTY_CHUNK": False}),
    ):
        table.append(AotVariant(label, tsig, dict(c, BLOCK_N=64, SLOT_BLOCK=1024), 8, 1, _pointer_attrs(tsig)))
    return {"attention_decode": dec, "attention_decode_gluon": glu, "attention_decode_reduce": red, "attention_prefill": pre,
            "attention_qsl_guard": guard, "attention_decode_table": table}


def aot_kernels() -> list[Any]:
    """AOT provider hook for :mod:`nvfp4compat.kernels.aot`: the decode, merge, prefill, ``query_start_loc`` guard and
    chunk-table kernels."""
    from nvfp4compat.kernels.aot import AotKernel

    v = aot_variants()
    return [
        AotKernel("attention_decode", _decode_kernel, v["attention_decode"]),
        *([AotKernel("attention_decode_gluon", _gluon.gluon_decode_kernel, v["attention_decode_gluon"])]
          if _gluon is not None else []),
        AotKernel("attention_decode_reduce", _decode_reduce_kernel, v["attention_decode_reduce"]),
        AotKernel("attention_prefill", _prefill_kernel, v["attention_prefill"]),
        AotKernel("attention_qsl_guard", _qsl_guard_kernel, v["attention_qsl_guard"]),
        AotKernel("attention_decode_table", _decode_table_kernel, v["attention_decode_table"]),
    ]
