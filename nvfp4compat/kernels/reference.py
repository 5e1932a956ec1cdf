"""Pure-torch NVFP4 paged-KV codec: the oracle every kernel is tested against.

The format is FlashInfer's (``flashinfer/data/include/flashinfer/page.cuh``, the
``nvfp4_append_quantize_block`` function, identical from 0.6.15 to 0.7.4), bit for bit:

* per 16-element block of one (token, head) row, ``amax = max|x|`` (NaN ignored),
  ``sf = e4m3_sat(amax / (6 * gs))`` (round to nearest even, saturating at 448, 0 when ``amax == 0``),
  ``inv = 1 / (sf * gs)`` (0 when ``sf == 0``), ``q = e2m1(x * inv)`` (round to nearest, ties to the
  even code, saturating at 6; sign bit from ``signbit(x)``, so ``-0.0`` and negative values that round
  to zero are stored as ``0x8``; NaN gives magnitude 0 with its sign);
* packing: ``byte[k] = q[2k] | (q[2k+1] << 4)`` (even element in the low nibble);
* decode: ``x = e2m1 * float(sf) * gs``.

Inputs below the fp32 normal range (bf16 denormals) are flushed to signed zero, as FlashInfer's
``-use_fast_math`` build does. Arithmetic here is exact IEEE fp32; FlashInfer's GPU build uses an
approximate division and reciprocal, so its bytes can differ from these at exact rounding midpoints
(see :func:`classify_code_differences`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nvfp4compat.kernels.contract import DequantArgs, WriteArgs, implements
from nvfp4compat.kernels.layout import CacheViews, normalize_cache

__all__ = [
    "E2M1_VALUES",
    "E4M3_MAX",
    "FLT_MIN_NORMAL",
    "e4m3_encode",
    "e4m3_decode",
    "e2m1_encode",
    "e2m1_decode",
    "quantize_rows",
    "dequantize_rows",
    "pack_nibbles",
    "unpack_nibbles",
    "append_slot_mapping",
    "dequantize_paged",
    "gather_dequantized",
    "CodeDiffReport",
    "classify_code_differences",
]

E4M3_MAX = 448.0
FLT_MIN_NORMAL = 2.0**-126
# Magnitudes of E2M1 codes 0..7; codes 8..15 are the negatives (8 is -0.0).
E2M1_VALUES = torch.tensor(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=torch.float32,
)
# E2M1 rounding boundaries of the magnitude: the code is the number of thresholds passed, where
# ``>`` thresholds round their midpoint down (to the even code) and ``>=`` ones round it up.
_E2M1_GT = (0.25, 1.25, 2.5, 5.0)
_E2M1_GE = (0.75, 1.75, 3.5)


def _scalar_f32(scale: float | torch.Tensor, device: torch.device) -> torch.Tensor:
    if isinstance(scale, torch.Tensor):
        return scale.detach().reshape(()).to(device=device, dtype=torch.float32)
    return torch.tensor(float(scale), dtype=torch.float32, device=device)


def e4m3_encode(value: torch.Tensor) -> torch.Tensor:
    """Encode non-negative fp32 values as float8_e4m3fn bytes: RNE, saturating at 448.

    Parameters
    ----------
    value : torch.Tensor
        float32, any shape, ``>= 0`` or ``+inf`` (``+inf`` saturates to 448, byte ``0x7E``).

    Returns
    -------
    torch.Tensor
        uint8, same shape.
    """
    return value.float().clamp(max=E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def e4m3_decode(byte: torch.Tensor) -> torch.Tensor:
    """Decode float8_e4m3fn bytes (uint8 or float8_e4m3fn tensor) to float32."""
    if byte.dtype == torch.uint8:
        byte = byte.view(torch.float8_e4m3fn)
    return byte.float()


def e2m1_encode(value: torch.Tensor) -> torch.Tensor:
    """Encode fp32 values as 4-bit E2M1 codes (uint8 0..15), FlashInfer's branch ladder.

    Round to nearest, ties to the even code, saturate at 6. The sign bit (``0x8``) is
    ``signbit(value)``: ``-0.0`` and small negatives give ``0x8``. NaN gives magnitude 0.
    """
    value = value.float()
    mag = value.abs()
    code = torch.zeros(value.shape, dtype=torch.int32, device=value.device)
    for t in _E2M1_GT:
        code += (mag > t).to(torch.int32)
    for t in _E2M1_GE:
        code += (mag >= t).to(torch.int32)
    code |= torch.signbit(value).to(torch.int32) << 3
    return code.to(torch.uint8)


def e2m1_decode(code: torch.Tensor) -> torch.Tensor:
    """Decode E2M1 codes (uint8 0..15) to float32 (code 8 decodes to -0.0)."""
    return E2M1_VALUES.to(code.device)[code.long()]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Pack uint8 codes ``[..., 2n]`` into bytes ``[..., n]``, even element in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_nibbles`: ``[..., n]`` uint8 to codes ``[..., 2n]``."""
    lo = packed & 0x0F
    hi = packed >> 4
    return torch.stack((lo, hi), dim=-1).flatten(-2)


def _flush_denormals(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x.abs() < FLT_MIN_NORMAL, x * 0.0, x)


def _block_error(blocks: torch.Tensor, sf: torch.Tensor, gs: torch.Tensor) -> torch.Tensor:
    """Squared reconstruction error of each 16-block under block scale ``sf`` (4over6 search).

    Mirrors ``page.cuh``: ``scale = 1/(sf*gs)`` (inf when sf is 0), decoded magnitude times
    ``sf * gs`` minus ``|x|``, squared and summed over the 16 elements.
    """
    denom = sf * gs
    inv = torch.where(denom != 0, 1.0 / denom, torch.full_like(denom, float("inf")))
    level = e2m1_encode(blocks * inv.unsqueeze(-1)) & 0x7
    mag = E2M1_VALUES.to(blocks.device)[level.long()]
    diff = mag * sf.unsqueeze(-1) * gs - blocks.abs()
    return (diff * diff).sum(-1)


def quantize_rows(
    x: torch.Tensor, global_scale: float | torch.Tensor, *, nvfp4_4over6: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize rows to NVFP4: the reference of FlashInfer's per-block quantizer.

    Parameters
    ----------
    x : torch.Tensor
        ``[..., head_dim]`` float16, bfloat16 or float32; ``head_dim % 16 == 0``.
    global_scale : float or torch.Tensor
        The global decode scale ``gs`` (``x ~= e2m1 * sf * gs``); positive and finite.
    nvfp4_4over6 : bool
        Also try the block scale ``e4m3(1.5 * sf)`` (which maps amax to 4) and keep it when the
        block's squared reconstruction error is strictly lower (FlashInfer 0.7.4 ``nvfp4_4over6``).

    Returns
    -------
    (packed, sf) : tuple of torch.Tensor
        ``packed``: uint8 ``[..., head_dim/2]``; ``sf``: uint8 ``[..., head_dim/16]`` (float8_e4m3fn bytes).
    """
    if x.shape[-1] % 16 != 0:
        raise ValueError(f"head_dim must be a multiple of 16, got {x.shape[-1]}")
    gs = _scalar_f32(global_scale, x.device)
    xf = _flush_denormals(x.float())
    blocks = xf.unflatten(-1, (x.shape[-1] // 16, 16))
    absb = blocks.abs()
    amax = torch.where(torch.isnan(absb), torch.zeros_like(absb), absb).amax(-1)
    positive = amax > 0
    sf_value = torch.where(positive, amax / (6.0 * gs), torch.zeros_like(amax))
    sf8 = e4m3_encode(sf_value)
    if nvfp4_4over6:
        sf4 = e4m3_encode(sf_value * 1.5)
        better = _block_error(blocks, e4m3_decode(sf4), gs) < _block_error(
            blocks, e4m3_decode(sf8), gs
        )
        sf8 = torch.where(better, sf4, sf8)
    sf_r = e4m3_decode(sf8)
    ok = positive & (sf_r > 0)
    inv = torch.where(ok, 1.0 / torch.where(ok, sf_r * gs, torch.ones_like(sf_r)), torch.zeros_like(sf_r))
    codes = e2m1_encode(blocks * inv.unsqueeze(-1)).flatten(-2)
    return pack_nibbles(codes), sf8


def dequantize_rows(
    packed: torch.Tensor, sf: torch.Tensor, global_scale: float | torch.Tensor
) -> torch.Tensor:
    """Decode NVFP4 rows to float32: ``(e2m1 * float(sf)) * gs``.

    Parameters
    ----------
    packed : torch.Tensor
        uint8 ``[..., head_dim/2]``.
    sf : torch.Tensor
        uint8 or float8_e4m3fn ``[..., head_dim/16]``.
    global_scale : float or torch.Tensor
        The global decode scale.

    Returns
    -------
    torch.Tensor
        float32 ``[..., head_dim]``.
    """
    gs = _scalar_f32(global_scale, packed.device)
    vals = e2m1_decode(unpack_nibbles(packed))
    blocks = vals.unflatten(-1, (vals.shape[-1] // 16, 16))
    return (blocks * e4m3_decode(sf).unsqueeze(-1) * gs).flatten(-2)


def _row_index(views: CacheViews, slots: torch.Tensor, valid: torch.Tensor):
    page = torch.where(valid, slots // views.page_size, torch.zeros_like(slots))
    offset = torch.where(valid, slots % views.page_size, torch.zeros_like(slots))
    return page[valid], offset[valid]


def _token_view(t: torch.Tensor, layout: str) -> torch.Tensor:
    """``[pages, page_size, heads, x]`` view of an NHD or HND cache tensor."""
    return t if layout == "NHD" else t.transpose(1, 2)


@implements(WriteArgs)
def append_slot_mapping(a: WriteArgs) -> None:
    """The ``write`` op (:class:`~nvfp4compat.kernels.contract.WriteArgs`) in exact fp32 torch."""
    views = normalize_cache(a.paged_kv_cache, a.kv_cache_sf, a.kv_layout)
    slots = a.slot_mapping.to(torch.int64)
    n = slots.shape[0]
    valid = (slots >= 0) & (slots < views.num_pages * views.page_size)
    page, offset = _row_index(views, slots, valid)
    for src, data, sfs, gs in (
        (a.key, views.k_data, views.k_sf, a.k_scale),
        (a.value, views.v_data, views.v_sf, a.v_scale),
    ):
        rows = src[:n][valid]
        packed, sf = quantize_rows(rows, gs, nvfp4_4over6=a.nvfp4_4over6)
        _token_view(data, views.layout)[page, offset] = packed
        _token_view(sfs.view(torch.uint8), views.layout)[page, offset] = sf


def gather_dequantized(
    paged_kv_cache: torch.Tensor | Sequence[torch.Tensor],
    kv_cache_sf: torch.Tensor | Sequence[torch.Tensor],
    block_table_row: torch.Tensor,
    seq_len: int,
    k_scale: float | torch.Tensor,
    v_scale: float | torch.Tensor,
    kv_layout: str = "NHD",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantize one request's first ``seq_len`` tokens to float32 ``[seq_len, heads, head_dim]`` (K, V)."""
    views = normalize_cache(paged_kv_cache, kv_cache_sf, kv_layout)
    pos = torch.arange(seq_len, device=block_table_row.device)
    pages = block_table_row.long()[pos // views.page_size]
    offs = pos % views.page_size
    out = []
    for data, sfs, gs in ((views.k_data, views.k_sf, k_scale), (views.v_data, views.v_sf, v_scale)):
        packed = _token_view(data, views.layout)[pages, offs]
        sf = _token_view(sfs.view(torch.uint8), views.layout)[pages, offs]
        out.append(dequantize_rows(packed, sf, gs))
    return out[0], out[1]


@implements(DequantArgs)
def dequantize_paged(a: DequantArgs) -> None:
    """The ``dequant`` op (:class:`~nvfp4compat.kernels.contract.DequantArgs`) in torch."""
    views = normalize_cache(a.paged_kv_cache, a.kv_cache_sf, a.kv_layout)
    max_seq_len = a.output_k.shape[1]
    for b in range(a.block_table.shape[0]):
        n = min(int(a.seq_lens[b]), max_seq_len)
        if n <= 0:
            continue
        pos = torch.arange(n, device=a.block_table.device)
        pages = a.block_table[b].long()[pos // views.page_size]
        ok = (pages >= 0) & (pages < views.num_pages)
        pos, pages = pos[ok], pages[ok]
        offs = pos % views.page_size
        for data, sfs, gs, out in (
            (views.k_data, views.k_sf, a.k_scale, a.output_k),
            (views.v_data, views.v_sf, a.v_scale, a.output_v),
        ):
            packed = _token_view(data, views.layout)[pages, offs]
            sf = _token_view(sfs.view(torch.uint8), views.layout)[pages, offs]
            out[b, pos] = dequantize_rows(packed, sf, gs).to(out.dtype)


@dataclass(frozen=True)
class CodeDiffReport:
    """Classification of E2M1 code differences between two encodings of the same input.

    ``ties`` are codes that differ by one step with the same sign where the scaled input lies within
    ``ulps`` fp32 ulps of the E2M1 rounding midpoint between them: both codes are correct encodings.
    ``violations`` lists ``(flat_index, code_a, code_b, scaled_value)`` for every other difference.
    """

    total: int
    differing: int
    ties: int
    violations: list[tuple[int, int, int, float]]


def classify_code_differences(
    x: torch.Tensor,
    packed_a: torch.Tensor,
    packed_b: torch.Tensor,
    sf: torch.Tensor,
    global_scale: float | torch.Tensor,
    *,
    ulps: int = 4,
) -> CodeDiffReport:
    """Classify every E2M1 code that differs between ``packed_a`` and ``packed_b``.

    Parameters
    ----------
    x : torch.Tensor
        The quantized input ``[..., head_dim]`` (fp16/bf16/fp32).
    packed_a, packed_b : torch.Tensor
        uint8 ``[..., head_dim/2]``: two encodings of ``x`` (e.g. FlashInfer's and ours).
    sf : torch.Tensor
        The (identical) block scales ``[..., head_dim/16]``, uint8 or float8_e4m3fn.
    global_scale : float or torch.Tensor
        The global scale used to quantize.
    ulps : int
        Distance to a midpoint, in fp32 ulps of the scaled value, that still counts as a tie.
    """
    gs = _scalar_f32(global_scale, x.device)
    ca = unpack_nibbles(packed_a).flatten().long()
    cb = unpack_nibbles(packed_b).flatten().long()
    xf = _flush_denormals(x.float())
    sf_r = e4m3_decode(sf).unsqueeze(-1)
    denom = (sf_r * gs).expand(*sf_r.shape[:-1], 16).flatten(-2)
    scaled = torch.where(denom > 0, xf / denom, torch.zeros_like(xf)).flatten()
    diff = torch.nonzero(ca != cb).flatten()
    midpoints = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float32)
    violations: list[tuple[int, int, int, float]] = []
    ties = 0
    for i in diff.tolist():
        a, b, s = int(ca[i]), int(cb[i]), float(scaled[i])
        same_sign = (a & 8) == (b & 8)
        lo = min(a & 7, b & 7)
        one_step = same_sign and abs((a & 7) - (b & 7)) == 1
        if one_step:
            mid = float(midpoints[lo])
            ulp = abs(torch.finfo(torch.float32).eps * mid)
            if abs(abs(s) - mid) <= ulps * ulp:
                ties += 1
                continue
        violations.append((i, a, b, s))
    return CodeDiffReport(
        total=ca.numel(), differing=int(diff.numel()), ties=ties, violations=violations
    )
