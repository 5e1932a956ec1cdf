"""Triton paged NVFP4 dequantizer: FlashInfer's ``nvfp4_kv_dequantize_paged``.

Gathers each request's pages through its block-table row and writes ``(e2m1 * float(sf)) * gs`` (fp32,
rounded to nearest even into fp16/bf16) to caller-owned contiguous outputs
``[batch, max_seq_len, num_kv_heads, head_dim]``. Position ``t`` of request ``b`` is written iff
``t < seq_lens[b]`` and its page id ``block_table[b, t // page_size]`` is in ``[0, num_pages)``;
every other output element is left untouched.

Kernel design (one launch for K and V, grid ``(batch * cdiv(max_seq_len*heads, ROWS), 2)``): a program
decodes ``ROWS`` consecutive (token, head) rows of one request and one side as a ``[ROWS*head_dim/16,
16]`` tile, one 16-block per tile row: 8-byte loads of packed codes, one scale byte per block, and
32-byte (bf16) stores that are contiguous across the whole tile. Scale bytes ``0x7F``/``0xFF`` (E4M3
NaN) decode as NaN, as a float8_e4m3fn cast does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from nvfp4compat.kernels.checks import (
    check_dequant_inputs,
    check_metadata_values,
    interpreting,
    metadata_checks_on,
    resolve_scale,
)
from nvfp4compat.kernels.layout import normalize_cache
from nvfp4compat.kernels.rotation import fused_rotation
from nvfp4compat.kernels.triton import hadamard, nvfp4

__all__ = [
    "DequantConfig",
    "CONFIGS",
    "pick_config",
    "dequantize_paged",
    "aot_kernels",
]


@triton.jit
def _bf16_rne(x):
    """fp32 -> bf16, round to nearest even, in integer arithmetic (NaN stays NaN).

    Used under the interpreter only: triton's interpreter truncates fp32 -> bf16 casts (and its
    ``fp_downcast_rounding="rtne"`` rounds ties away from zero without carrying into the exponent).
    """
    bits = x.to(tl.int32, bitcast=True)
    r = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    r = tl.where(x != x, (bits >> 16) | 0x40, r)
    return r.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _dequant_side(
    data_ptr, d_sp, d_st, d_sh, sf_ptr, f_sp, f_st, f_sh, scale_ptr, scale_val, out_ptr,
    out_base, r, head, page, offset, blk, valid,
    HEAD_DIM: tl.constexpr, BLOCKS: tl.constexpr, SCALE_PTR: tl.constexpr, SOFT_BF16: tl.constexpr,
    ROTATE: tl.constexpr,
):  # fmt: skip
    if SCALE_PTR:
        gs = tl.load(scale_ptr)
    else:
        gs = scale_val
    page64 = page.to(tl.int64)
    offset64 = offset.to(tl.int64)
    head64 = head.to(tl.int64)
    src = page64 * d_sp + offset64 * d_st + head64 * d_sh + blk * 8
    packed = tl.load(
        data_ptr + src[:, None] + tl.arange(0, 8)[None, :], mask=valid[:, None], other=0
    )
    packed = packed.to(tl.int32)
    sfb = tl.load(
        sf_ptr + page64 * f_sp + offset64 * f_st + head64 * f_sh + blk, mask=valid, other=0
    )
    sfb = sfb.to(tl.int32)
    is_nan = (sfb & 0x7F) == 0x7F  # E4M3 NaN bytes decode as NaN (a float8_e4m3fn cast does too)
    nan = tl.where(is_nan, 0x7FC00000, 0).to(tl.float32, bitcast=True)
    sf = tl.where(is_nan, nan, nvfp4.e4m3_decode(sfb))
    codes = tl.reshape(tl.join(packed & 15, packed >> 4), (BLOCKS, 16))
    vals = nvfp4.e2m1_decode(codes) * sf[:, None] * gs
    if ROTATE:  # the cache holds rows x H: un-rotate each (token, head) row, (x H) H = x
        ROWS: tl.constexpr = BLOCKS // (HEAD_DIM // 16)
        vals = tl.reshape(hadamard.fwht_rows(tl.reshape(vals, (ROWS, HEAD_DIM)), HEAD_DIM), (BLOCKS, 16))
    dst = out_base + r.to(tl.int64) * HEAD_DIM + blk * 16
    if SOFT_BF16:
        out = _bf16_rne(vals)
    else:
        out = vals.to(out_ptr.dtype.element_ty)  # cvt.rn: round to nearest even
    tl.store(out_ptr + dst[:, None] + tl.arange(0, 16)[None, :], out, mask=valid[:, None])


@triton.jit(do_not_specialize=("max_seq_len", "tiles_per_req"))
def _dequant_kernel(
    k_data_ptr, v_data_ptr, k_sf_ptr, v_sf_ptr, bt_ptr, seq_ptr,
    k_scale_ptr, v_scale_ptr, k_scale_val, v_scale_val, out_k_ptr, out_v_ptr,
    max_seq_len, num_heads, page_size, num_pages, bt_stride, tiles_per_req,
    kd_sp, kd_st, kd_sh, vd_sp, vd_st, vd_sh,
    ks_sp, ks_st, ks_sh, vs_sp, vs_st, vs_sh,
    HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, SCALE_PTR: tl.constexpr, SOFT_BF16: tl.constexpr,
    ROTATE: tl.constexpr = False,
):  # fmt: skip
    """Program ``(p, side)``: request ``p // tiles_per_req``, rows ``[tile*ROWS, (tile+1)*ROWS)`` of its
    ``max_seq_len * heads`` (token-major) rows; side 0 = K, 1 = V. ``ROTATE``: a Hadamard-rotated
    cache, each decoded row is multiplied by ``H`` (exact float32 butterflies) before it is rounded."""
    NB: tl.constexpr = HEAD_DIM // 16
    BLOCKS: tl.constexpr = ROWS * NB
    pid = tl.program_id(0)
    side = tl.program_id(1)
    b = pid // tiles_per_req
    tile = pid - b * tiles_per_req
    seq_len = tl.minimum(tl.load(seq_ptr + b), max_seq_len)
    i = tl.arange(0, BLOCKS)
    r = tile * ROWS + i // NB
    blk = i % NB
    in_range = r < seq_len * num_heads
    token = r // num_heads
    head = r - token * num_heads
    page_idx = token // page_size
    page = tl.load(bt_ptr + b.to(tl.int64) * bt_stride + page_idx, mask=in_range, other=-1)
    valid = in_range & (page >= 0) & (page < num_pages)
    page32 = tl.where(valid, page, 0).to(tl.int32)
    offset = token - page_idx * page_size
    out_base = b.to(tl.int64) * max_seq_len * num_heads * HEAD_DIM
    if side == 0:
        _dequant_side(
            k_data_ptr, kd_sp, kd_st, kd_sh, k_sf_ptr, ks_sp, ks_st, ks_sh, k_scale_ptr, k_scale_val,
            out_k_ptr, out_base, r, head, page32, offset, blk, valid, HEAD_DIM, BLOCKS, SCALE_PTR, SOFT_BF16,
            ROTATE,
        )  # fmt: skip
    else:
        _dequant_side(
            v_data_ptr, vd_sp, vd_st, vd_sh, v_sf_ptr, vs_sp, vs_st, vs_sh, v_scale_ptr, v_scale_val,
            out_v_ptr, out_base, r, head, page32, offset, blk, valid, HEAD_DIM, BLOCKS, SCALE_PTR, SOFT_BF16,
            ROTATE,
        )  # fmt: skip


@dataclass(frozen=True)
class DequantConfig:
    """One tile configuration: ``blocks`` 16-blocks per program (``rows = blocks // (head_dim/16)``,
    at least 1) and ``num_warps``."""

    blocks: int
    num_warps: int

    def rows(self, head_dim: int) -> int:
        return max(1, self.blocks // (head_dim // 16))

    @property
    def name(self) -> str:
        return f"b{self.blocks}w{self.num_warps}"


# The variants the GPU benchmark sweeps (benchmarks/bench_dequant.py) and aot.py compiles.
CONFIGS: tuple[DequantConfig, ...] = (
    DequantConfig(64, 2),
    DequantConfig(128, 4),
    DequantConfig(256, 8),
    DequantConfig(512, 8),
    DequantConfig(1024, 8),
    DequantConfig(1024, 16),
)
CONFIG_BY_NAME = {c.name: c for c in CONFIGS}
# Under TRITON_INTERPRET=1 every program is a Python-level step: one large tile is far faster.
INTERPRETER_CONFIG = DequantConfig(4096, 4)


def pick_config(n_rows: int, head_dim: int) -> DequantConfig:
    """Pick the tile for ``n_rows = batch * max_seq_len * heads`` rows per side.

    Heuristic, from the H200 sweep of ``benchmarks/bench_dequant.py`` (BENCHMARKS.md): up to about a
    million 16-blocks per side (e.g. 8 x 1,024 tokens x 8 heads x 128) 64-block programs (37.6 us there on
    2026-11-29, against 44-77 us for larger tiles); above that 512-block programs with 8 warps (64 x 4,096
    tokens on 2026-12-02: 0.413 ms = 3.33 TB/s, against 0.48-0.50 ms for 64- to 256-block programs and
    0.400 ms for 1024-block ones, within the run's noise).
    """
    total_blocks = n_rows * (head_dim // 16)
    if total_blocks <= 1 << 20:
        return CONFIG_BY_NAME["b64w2"]
    return CONFIG_BY_NAME["b512w8"]


def dequantize_paged(
    paged_kv_cache: torch.Tensor | Sequence[torch.Tensor],
    kv_cache_sf: torch.Tensor | Sequence[torch.Tensor],
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    k_scale: float | torch.Tensor,
    v_scale: float | torch.Tensor,
    output_k: torch.Tensor,
    output_v: torch.Tensor,
    kv_layout: str = "NHD",
    *,
    config: DequantConfig | None = None,
    kv_rotation: str | None = None,
) -> None:
    """The ``dequant`` op (:class:`~nvfp4compat.kernels.contract.DequantArgs`) with the Triton kernel.

    No host sync; a device-tensor scale is read on the device and not checked. ``config`` picks the
    tile configuration (tests and benchmarks); None means :func:`pick_config`.
    ``kv_rotation="hadamard"``: the cache holds ``K H`` and ``V H``; each decoded row is multiplied
    by ``H`` in the kernel (float32, before the rounding to the output dtype), so the outputs are
    the real K and V. ``None``: a plain cache.
    """
    views = normalize_cache(paged_kv_cache, kv_cache_sf, kv_layout)
    check_dequant_inputs(views, block_table, seq_lens, output_k, output_v)
    rotate = fused_rotation("dequant", kv_rotation, views.head_dim)
    if metadata_checks_on():
        check_metadata_values(
            "dequant", num_pages=views.num_pages, page_size=views.page_size, block_table=block_table,
            seq_lens=seq_lens, max_seq_len=output_k.shape[1],
        )  # fmt: skip
    device = views.device
    ks = resolve_scale(k_scale, "k_scale", device)
    vs = resolve_scale(v_scale, "v_scale", device)
    batch, max_seq_len, heads, head_dim = output_k.shape
    rows_per_req = max_seq_len * heads
    if batch == 0 or rows_per_req == 0:
        return
    if config is None:
        config = (
            INTERPRETER_CONFIG if interpreting() else pick_config(batch * rows_per_req, head_dim)
        )
    rows = config.rows(head_dim)
    tiles = triton.cdiv(rows_per_req, rows)
    scale_ptr = isinstance(ks, torch.Tensor) or isinstance(vs, torch.Tensor)
    if scale_ptr:
        k_t = (
            ks
            if isinstance(ks, torch.Tensor)
            else torch.full((1,), ks, dtype=torch.float32, device=device)
        )
        v_t = (
            vs
            if isinstance(vs, torch.Tensor)
            else torch.full((1,), vs, dtype=torch.float32, device=device)
        )
        k_val = v_val = 0.0
    else:
        k_t, v_t = seq_lens, seq_lens  # unused pointer arguments
        k_val, v_val = float(ks), float(vs)
    kd, vd = views.k_data, views.v_data
    kf, vf = views.k_sf.view(torch.uint8), views.v_sf.view(torch.uint8)
    grid = (batch * tiles, 2)
    _dequant_kernel[grid](
        kd, vd, kf, vf, block_table, seq_lens,
        k_t, v_t, k_val, v_val, output_k, output_v,
        max_seq_len, heads, views.page_size, views.num_pages, block_table.stride(0), tiles,
        *views.strides(kd), *views.strides(vd), *views.strides(kf), *views.strides(vf),
        HEAD_DIM=head_dim, ROWS=rows, SCALE_PTR=scale_ptr,
        SOFT_BF16=interpreting() and output_k.dtype == torch.bfloat16, ROTATE=rotate,
        num_warps=config.num_warps,
    )  # fmt: skip


def aot_kernels() -> list:
    """AOT variants of the dequantizer (see :mod:`nvfp4compat.kernels.aot`)."""
    from nvfp4compat.kernels.aot import AotKernel, AotVariant, aligned

    sig = {
        "k_data_ptr": "*u8", "v_data_ptr": "*u8", "k_sf_ptr": "*u8", "v_sf_ptr": "*u8",
        "bt_ptr": "*i32", "seq_ptr": "*i32", "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32",
        "k_scale_val": "fp32", "v_scale_val": "fp32", "out_k_ptr": "*bf16", "out_v_ptr": "*bf16",
    }  # fmt: skip
    for name in (
        "max_seq_len", "num_heads", "page_size", "num_pages", "bt_stride", "tiles_per_req",
        "kd_sp", "kd_st", "kd_sh", "vd_sp", "vd_st", "vd_sh", "ks_sp", "ks_st", "ks_sh",
        "vs_sp", "vs_st", "vs_sh",
    ):  # fmt: skip
        sig[name] = "i32"
    for name in ("HEAD_DIM", "ROWS", "SCALE_PTR", "SOFT_BF16", "ROTATE"):
        sig[name] = "constexpr"
    variants = []
    # The tile configs with a dense tuple cache's JIT-time alignment (what a GPU launch builds); the
    # other variants without alignment hints.
    dense = aligned(
        sig,
        [n for n in sig if n.endswith("_ptr")]
        + ["bt_stride", "kd_sp", "kd_st", "kd_sh", "vd_sp", "vd_st", "vd_sh"],
    )
    for cfg in CONFIGS:
        c = {"HEAD_DIM": 128, "ROWS": cfg.rows(128), "SCALE_PTR": True, "SOFT_BF16": False, "ROTATE": False}
        variants.append(
            AotVariant(f"{cfg.name}-d128-bf16-i32-ptr", dict(sig), c, cfg.num_warps, attrs=dense)
        )
    # ... and the fused Hadamard un-rotation (kv_rotation) on the small and the large tile
    for hd, dt, it, ptr, rot, tile in (
        (64, "*fp16", "*i64", False, False, None),
        (256, "*bf16", "*i64", True, False, None),
        (512, "*fp16", "*i32", True, False, None),
        (128, "*bf16", "*i32", True, True, CONFIG_BY_NAME["b64w2"]),
        (64, "*fp16", "*i64", False, True, None),
    ):
        cfg = tile or pick_config(1 << 22, hd)
        s = dict(sig, out_k_ptr=dt, out_v_ptr=dt, bt_ptr=it)
        c = {"HEAD_DIM": hd, "ROWS": cfg.rows(hd), "SCALE_PTR": ptr, "SOFT_BF16": False, "ROTATE": rot}
        label = f"{cfg.name}-d{hd}-{dt[1:]}-{it[1:]}-{'ptr' if ptr else 'val'}{'-rotate' if rot else ''}"
        variants.append(AotVariant(label, s, c, cfg.num_warps))
    return [AotKernel("dequantize_paged", _dequant_kernel, variants)]
