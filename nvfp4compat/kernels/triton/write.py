"""Triton NVFP4 slot-mapping writer: FlashInfer's ``nvfp4_quantize_append_paged_kv_cache_with_slot_mapping``.

Quantizes fp16/bf16 K and V rows ``[rows, num_kv_heads, head_dim]`` to NVFP4 (E2M1 codes, one E4M3
scale per 16 elements, decoded as ``x = e2m1 * sf * gs``) and writes them in place into a paged cache
at ``page = slot // page_size``, ``offset = slot % page_size``. Bit for bit the numerics of FlashInfer's
writer (``docs/architecture.md``, "Numerics of the writer"); on CUDA the approximate division and
reciprocal of FlashInfer's ``-use_fast_math`` build are used (inline PTX), so the bytes match
FlashInfer's; under ``TRITON_INTERPRET=1`` and on the CPU the arithmetic is exact IEEE fp32, byte-equal
to :mod:`nvfp4compat.kernels.reference`.

Kernel design (one launch for K and V, grid ``(programs, 2)``): a tile is ``ROWS`` consecutive
(token, head) rows of one side as a ``[ROWS*head_dim/16, 16]`` tensor, one 16-block per tile row, so
loads are 32-byte segments of consecutive memory and every reduction stays inside a block. A program
loops over tiles ``pid, pid + programs, ...`` and issues the next tile's loads (slots and source rows,
independent of each other) before quantizing the current one. The tile size and the program count
(one per tile, or a few per SM) are one of :data:`CONFIGS`, picked by :func:`pick_config` from the
problem size. The writer is issue-bound, so its arithmetic is kept short: the E2M1 encoder is three
fp32 multiply-adds and two selects per element (:func:`~nvfp4compat.kernels.triton.nvfp4.e2m1_encode_low`),
E4M3 scales use the hardware conversions from SM89 on (integer arithmetic on SM80/86), and the head
count, page size and cache strides are compile-time constants (one compile per cache geometry).

Host path: :func:`append_slot_mapping` validates an argument signature once and caches what the
launch needs; later calls with that signature check row counts and scale values, then launch
(``benchmarks/bench_write_host.py`` measures it against Triton's bare launch and FlashInfer's call).

Device-scale policy: a Python-number scale is validated on the host. A device tensor scale is read by
the kernel (no host sync, CUDA-graph safe). When it is not finite or not > 0, the kernel does not trap
(FlashInfer 0.7.4 executes ``trap``, which can leave the CUDA context unusable): every block of that
side it would write gets data bytes 0 and scale byte ``0x7F`` (E4M3 NaN), so any reader decodes NaN
for those tokens instead of plausible wrong values, and it sets bit 0 (K) or bit 1 (V) of a per-device
int32 error flag, read by :func:`check_scale_errors`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from nvfp4compat.kernels.checks import (
    MAX_INDEX,
    check_metadata_values,
    check_write_inputs,
    default_fast_math,
    interpreting,
    metadata_checks_on,
    resolve_scale,
    scale_meta,
    sm_count,
    tensor_meta,
)
from nvfp4compat.kernels.errors import SCALE_BITS, KernelInputError, error_flag, read_errors
from nvfp4compat.kernels.layout import normalize_cache, split_combined_page
from nvfp4compat.kernels.rotation import fused_rotation
from nvfp4compat.kernels.triton import hadamard, nvfp4

__all__ = [
    "WriteConfig",
    "CONFIGS",
    "pick_config",
    "append_slot_mapping",
    "scale_error_flag",
    "check_scale_errors",
    "ScaleError",
    "aot_kernels",
]

_FLT_MAX: tl.constexpr = tl.constexpr(3.4028234663852886e38)
_INF: tl.constexpr = tl.constexpr(float("inf"))


@triton.jit
def _block_error(x, absx, sf, gs, FAST_MATH: tl.constexpr):
    """Squared error of each 16-block ``[N, 16]`` decoded with block scale ``sf`` ``[N]`` (4over6)."""
    denom = sf * gs
    if FAST_MATH:
        inv = nvfp4.rcp_approx(denom)
    else:
        nonzero = denom != 0.0
        inv = tl.where(nonzero, tl.math.div_rn(1.0, tl.where(nonzero, denom, 1.0)), _INF)
    level = nvfp4.e2m1_encode(x * inv[:, None]) & 7
    mag = nvfp4.e2m1_decode(level)
    diff = mag * sf[:, None] * gs - absx
    return tl.sum(diff * diff, axis=1)


@triton.jit
def _tile_rows(tile, NUM_HEADS: tl.constexpr, n_rows, ROWS: tl.constexpr, NB: tl.constexpr):
    """(token, head, 16-block index, in range) of every 16-block of tile ``tile`` (token-major rows)."""
    i = tl.arange(0, ROWS * NB)
    row = tile * ROWS + i // NB
    token = row // NUM_HEADS
    return token, row - token * NUM_HEADS, i % NB, row < n_rows


@triton.jit
def _load_tile(
    src_ptr, src_sn, src_sh, slot_ptr, tile, NUM_HEADS: tl.constexpr, n_rows,
    ROWS: tl.constexpr, NB: tl.constexpr,
):  # fmt: skip
    """Issue the loads of one tile: its slots and its ``[ROWS*NB, 16]`` source blocks (as stored).

    Neither load depends on the other (rows past ``n_rows`` are masked; a row whose slot turns out to
    be skipped is read anyway, it exists since ``rows >= len(slot_mapping)``), so both are in flight
    together, and the caller issues them one tile ahead of the arithmetic.
    """
    token, head, blk, in_range = _tile_rows(tile, NUM_HEADS, n_rows, ROWS, NB)
    slot = tl.load(slot_ptr + token, mask=in_range, other=-1)
    src = token.to(tl.int64) * src_sn + head.to(tl.int64) * src_sh + blk * 16
    x = tl.load(
        src_ptr + src[:, None] + tl.arange(0, 16)[None, :], mask=in_range[:, None], other=0.0
    )
    return slot, x


@triton.jit
def _quantize_store(
    x, slot, gs, gs_bad, tile, NUM_HEADS: tl.constexpr, n_rows, PAGE_SIZE: tl.constexpr, num_slots,
    data_ptr, d_sp: tl.constexpr, d_st: tl.constexpr, d_sh: tl.constexpr,
    sf_ptr, f_sp: tl.constexpr, f_st: tl.constexpr, f_sh: tl.constexpr,
    ROWS: tl.constexpr, NB: tl.constexpr, FOUR_OVER_SIX: tl.constexpr, FAST_MATH: tl.constexpr, FP8_CVT: tl.constexpr,
    ROTATE: tl.constexpr = False,
):  # fmt: skip
    """Quantize one loaded tile (``x`` as stored, ``slot`` per block) and store codes and scales.

    ``ROTATE``: each (token, head) row is multiplied by the normalized Hadamard matrix first (exact
    float32 butterflies, :func:`~nvfp4compat.kernels.triton.hadamard.fwht_rows`) and rounded to the
    source dtype, as the unfused ``rotate(key)`` before the writer does.
    """
    BLOCKS: tl.constexpr = ROWS * NB
    token, head, blk, in_range = _tile_rows(tile, NUM_HEADS, n_rows, ROWS, NB)
    valid = in_range & (slot >= 0) & (slot < num_slots)
    slot32 = tl.where(valid, slot, 0).to(tl.int32)  # < 2**31: checked on the host
    page = slot32 // PAGE_SIZE
    offset = slot32 - page * PAGE_SIZE

    # fast math without 4over6: no explicit flush; the scale division and the scaling multiply are
    # .ftz (subnormal inputs count as zero there, as FlashInfer's -use_fast_math build has it)
    LEAN: tl.constexpr = FAST_MATH and not FOUR_OVER_SIX
    SRC: tl.constexpr = x.dtype
    x = x.to(tl.float32)
    if ROTATE:
        rows = hadamard.fwht_rows(tl.reshape(x, (ROWS, NB * 16)), NB * 16)
        x = tl.reshape(hadamard.round_to(rows, SRC), (BLOCKS, 16))
    if not LEAN:
        x = nvfp4.flush_denormal(x)
    absx = tl.abs(x)
    # tl.max is maxnum: NaN ignored, as fmaxf does (GPU and interpreter)
    amax = tl.max(absx, axis=1)

    six_gs = 6.0 * gs
    if FAST_MATH:
        sf_val = nvfp4.div_approx(amax, tl.zeros_like(amax) + six_gs)
    else:  # IEEE division (triton's `/` is div.full.f32, not correctly rounded)
        sf_val = tl.math.div_rn(amax, tl.zeros_like(amax) + six_gs)
    sf_val = tl.where(amax > 0.0, sf_val, 0.0)
    if FP8_CVT:
        sf_byte = nvfp4.e4m3_encode_cvt(sf_val)
    else:
        sf_byte = nvfp4.e4m3_encode(sf_val)
    if FOUR_OVER_SIX:
        sf4_byte = nvfp4.e4m3_encode(sf_val * 1.5)
        err6 = _block_error(x, absx, nvfp4.e4m3_decode(sf_byte), gs, FAST_MATH)
        err4 = _block_error(x, absx, nvfp4.e4m3_decode(sf4_byte), gs, FAST_MATH)
        sf_byte = tl.where(err4 < err6, sf4_byte, sf_byte)
    if FP8_CVT:
        sf_r = nvfp4.e4m3_decode_cvt(sf_byte)
    else:
        sf_r = nvfp4.e4m3_decode(sf_byte)
    ok = (amax > 0.0) & (sf_r > 0.0)
    denom = tl.where(ok, sf_r * gs, 1.0)
    if FAST_MATH:
        inv = nvfp4.rcp_approx(denom)
    else:
        inv = tl.math.div_rn(tl.full(denom.shape, 1.0, tl.float32), denom)
    inv = tl.where(ok, inv, 0.0)
    if LEAN:
        codes = nvfp4.e2m1_encode_low(nvfp4.mul_ftz(x, tl.broadcast_to(inv[:, None], x.shape)))
    else:
        codes = nvfp4.e2m1_encode_low(x * inv[:, None])
    lo, hi = tl.split(tl.reshape(codes, (BLOCKS, 8, 2)))
    packed = lo + (hi << 4)  # the low byte is code_lo | code_hi << 4 (see e2m1_encode_low)
    # Bad device scale: zero codes and a NaN block scale (0x7F), so readers decode NaN, not garbage.
    packed = tl.where(gs_bad, 0, packed).to(tl.uint8)
    sf_byte = tl.where(gs_bad, 0x7F, sf_byte).to(tl.uint8)

    page64 = page.to(tl.int64)
    offset64 = offset.to(tl.int64)
    head64 = head.to(tl.int64)
    dst = page64 * d_sp + offset64 * d_st + head64 * d_sh + blk * 8
    tl.store(data_ptr + dst[:, None] + tl.arange(0, 8)[None, :], packed, mask=valid[:, None])
    sdst = page64 * f_sp + offset64 * f_st + head64 * f_sh + blk
    tl.store(sf_ptr + sdst, sf_byte, mask=valid)


@triton.jit
def _side(
    src_ptr, src_sn, src_sh,
    data_ptr, d_sp: tl.constexpr, d_st: tl.constexpr, d_sh: tl.constexpr,
    sf_ptr, f_sp: tl.constexpr, f_st: tl.constexpr, f_sh: tl.constexpr,
    scale_ptr, scale_val, err_ptr, err_bit,
    slot_ptr, n_rows, NUM_HEADS: tl.constexpr, PAGE_SIZE: tl.constexpr, num_slots,
    HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, SCALE_PTR: tl.constexpr,
    FOUR_OVER_SIX: tl.constexpr, FAST_MATH: tl.constexpr, FP8_CVT: tl.constexpr, ROTATE: tl.constexpr,
):  # fmt: skip
    """One side (K or V): tiles ``pid, pid + nprog, ...``, each tile's loads issued one tile ahead."""
    NB: tl.constexpr = HEAD_DIM // 16
    sf_ptr = sf_ptr.to(tl.pointer_type(tl.uint8))  # float8_e4m3fn or uint8 caches: written as bytes
    if SCALE_PTR:
        gs = tl.load(scale_ptr)
    else:
        gs = scale_val
    gs_bad = (gs != gs) | (gs <= 0.0) | (gs > _FLT_MAX)
    if gs_bad:
        tl.atomic_or(err_ptr, err_bit)

    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    n_tiles = tl.cdiv(n_rows, ROWS)
    slot, x = _load_tile(src_ptr, src_sn, src_sh, slot_ptr, pid, NUM_HEADS, n_rows, ROWS, NB)
    for tile in tl.range(pid, n_tiles, nprog, num_stages=1):
        # the next tile's loads first (past the last tile they are fully masked)
        slot_next, x_next = _load_tile(
            src_ptr, src_sn, src_sh, slot_ptr, tile + nprog, NUM_HEADS, n_rows, ROWS, NB
        )
        _quantize_store(
            x, slot, gs, gs_bad, tile, NUM_HEADS, n_rows, PAGE_SIZE, num_slots,
            data_ptr, d_sp, d_st, d_sh, sf_ptr, f_sp, f_st, f_sh,
            ROWS, NB, FOUR_OVER_SIX, FAST_MATH, FP8_CVT, ROTATE,
        )  # fmt: skip
        slot = slot_next
        x = x_next


@triton.jit(do_not_specialize=("n_rows",))
def _write_kernel(
    key_ptr, value_ptr, slot_ptr,
    k_data_ptr, v_data_ptr, k_sf_ptr, v_sf_ptr,
    k_scale_ptr, v_scale_ptr, k_scale_val, v_scale_val, err_ptr,
    n_rows, NUM_HEADS: tl.constexpr, PAGE_SIZE: tl.constexpr, num_slots,
    key_sn, key_sh, value_sn, value_sh,
    KD_SP: tl.constexpr, KD_ST: tl.constexpr, KD_SH: tl.constexpr,
    VD_SP: tl.constexpr, VD_ST: tl.constexpr, VD_SH: tl.constexpr,
    KS_SP: tl.constexpr, KS_ST: tl.constexpr, KS_SH: tl.constexpr,
    VS_SP: tl.constexpr, VS_ST: tl.constexpr, VS_SH: tl.constexpr,
    HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, SCALE_PTR: tl.constexpr,
    FOUR_OVER_SIX: tl.constexpr, FAST_MATH: tl.constexpr, FP8_CVT: tl.constexpr,
    ROTATE: tl.constexpr = False,
):  # fmt: skip
    """Program ``(p, side)`` of ``(nprog, 2)``: tiles ``p, p + nprog, ...`` of ``ROWS`` rows of
    ``nnz*heads`` (token-major); side 0 = K, 1 = V. ``ROTATE``: Hadamard-rotate the rows first."""
    if tl.program_id(1) == 0:
        _side(
            key_ptr, key_sn, key_sh, k_data_ptr, KD_SP, KD_ST, KD_SH, k_sf_ptr, KS_SP, KS_ST, KS_SH,
            k_scale_ptr, k_scale_val, err_ptr, 1, slot_ptr, n_rows, NUM_HEADS, PAGE_SIZE, num_slots,
            HEAD_DIM, ROWS, SCALE_PTR, FOUR_OVER_SIX, FAST_MATH, FP8_CVT, ROTATE,
        )  # fmt: skip
    else:
        _side(
            value_ptr, value_sn, value_sh, v_data_ptr, VD_SP, VD_ST, VD_SH, v_sf_ptr, VS_SP, VS_ST, VS_SH,
            v_scale_ptr, v_scale_val, err_ptr, 2, slot_ptr, n_rows, NUM_HEADS, PAGE_SIZE, num_slots,
            HEAD_DIM, ROWS, SCALE_PTR, FOUR_OVER_SIX, FAST_MATH, FP8_CVT, ROTATE,
        )  # fmt: skip


@dataclass(frozen=True)
class WriteConfig:
    """One tile configuration of the writer.

    ``blocks`` 16-element blocks per tile (``rows = blocks // (head_dim/16)`` (token, head) rows, at
    least 1), ``num_warps`` warps, and ``per_sm``: with 0 the grid has one program per tile; with
    ``n > 0`` it is capped at ``n`` programs per SM (K and V together), each program looping over
    tiles with the next tile's loads issued before the current tile's arithmetic.
    """

    blocks: int
    num_warps: int
    per_sm: int = 0

    def rows(self, head_dim: int) -> int:
        return max(1, self.blocks // (head_dim // 16))

    def programs(self, n_tiles: int, num_sms: int) -> int:
        """Programs per side for ``n_tiles`` tiles per side on a device with ``num_sms`` SMs."""
        if self.per_sm <= 0:
            return n_tiles
        return max(1, min(n_tiles, (num_sms * self.per_sm) // 2))

    @property
    def name(self) -> str:
        return f"b{self.blocks}w{self.num_warps}" + (f"p{self.per_sm}" if self.per_sm else "")


# The variants the GPU benchmark sweeps (benchmarks/bench_write.py) and aot.py compiles.
CONFIGS: tuple[WriteConfig, ...] = (
    WriteConfig(32, 1),
    WriteConfig(64, 2),
    WriteConfig(128, 4),
    WriteConfig(256, 8),
    WriteConfig(512, 8),
    WriteConfig(1024, 8),
    WriteConfig(1024, 16),
    WriteConfig(128, 4, 16),
    WriteConfig(256, 4, 8),
    WriteConfig(256, 8, 4),
    WriteConfig(256, 8, 8),
    WriteConfig(512, 8, 2),
    WriteConfig(512, 8, 4),
    WriteConfig(512, 8, 8),
)
CONFIG_BY_NAME = {c.name: c for c in CONFIGS}
# Under TRITON_INTERPRET=1 every program is a Python-level step: one large tile is far faster.
INTERPRETER_CONFIG = WriteConfig(4096, 4)


def pick_config(n_rows: int, head_dim: int) -> WriteConfig:
    """Pick the tile configuration for ``n_rows`` (token, head) rows per side.

    Heuristic, from the H200 sweeps of ``benchmarks/bench_write.py`` (BENCHMARKS.md, CUDA-graph device
    times): decode-sized writes (at most 2,048 16-blocks per side, e.g. 32 tokens x 8 heads x 128) use
    small programs so that the few blocks spread over many SMs (device time 1.8-2.5 us, launch-bound);
    mid-sized writes one 128-block program per tile; large writes (from 4,096 tokens x 8 heads x 128)
    512-block tiles looped over by 8 programs per SM (4 per side), each program issuing the next
    tile's loads before quantizing the current one: 65,536 tokens in 0.144 ms against 0.171 ms for
    one program per tile (2026-12-02).
    """
    total_blocks = n_rows * (head_dim // 16)
    if total_blocks <= 2048:
        return CONFIG_BY_NAME["b32w1"]
    if total_blocks <= 65536:
        return CONFIG_BY_NAME["b128w4"]
    return CONFIG_BY_NAME["b512w8p8"]


class ScaleError(KernelInputError):
    """A device-side global scale was not finite or not > 0 (see :func:`check_scale_errors`)."""


def _num_sms(device: torch.device) -> int:
    """Multiprocessor count of a CUDA device; 1 elsewhere (the interpreter)."""
    return sm_count(device) if device.type == "cuda" else 1


def _fp8_cvt(device: torch.device) -> bool:
    """Use the hardware E4M3 conversions: CUDA devices of SM89 and newer (they do not build for
    SM80/86), never under the interpreter."""
    return device.type == "cuda" and not interpreting() and _capability(device) >= (8, 9)


@functools.lru_cache(maxsize=16)
def _capability(device: torch.device) -> tuple[int, int]:
    """A CUDA device's compute capability (cached per device, as :func:`sm_count` caches its SMs)."""
    return torch.cuda.get_device_capability(device)


def scale_error_flag(device: torch.device | str) -> torch.Tensor:
    """The per-device int32 error flag ``[1]`` the writer sets on a bad device scale (bit 0 K, bit 1 V).

    The kernels' shared flag (:func:`nvfp4compat.kernels.errors.error_flag`), allocated (zeroed) on
    first use. Call it once, or run one eager write, before capturing a CUDA graph: a flag first
    allocated during capture is zeroed by the graph itself at each replay.
    """
    return error_flag(device)


def check_scale_errors(device: torch.device | str | None = None, *, reset: bool = True) -> None:
    """Raise :class:`ScaleError` if a writer launch on ``device`` saw a bad device-tensor scale.

    Reads the writer's two bits of :func:`scale_error_flag` (a host sync: call it where a sync is
    acceptable, e.g. after a step or in tests), then clears them when ``reset``. ``device=None``
    checks every device used so far. :func:`nvfp4compat.kernels.errors.check_errors` reports these
    bits and those of the other kernels.
    """
    found = read_errors(device, bits=SCALE_BITS, reset=reset)
    bad = []
    for dev, bits in found.items():
        names = [n for b, n in ((1, "k_scale"), (2, "v_scale")) if bits & b]
        bad.append(f"{dev}: {' and '.join(names)}")
    if bad:
        raise ScaleError(
            "NVFP4 KV write saw a device global scale that is not finite or not > 0 "
            f"({'; '.join(bad)}); the affected blocks hold scale 0x7F (NaN) and decode as NaN. "
            "Pass positive finite k_scale/v_scale (e.g. amax / (6 * 448))"
        )


@dataclass(frozen=True)
class _Plan:
    """What validation established for one argument signature (everything but pointers and sizes)."""

    num_kv_heads: int
    page_size: int
    num_slots: int
    head_dim: int
    cache_strides: tuple[int, ...]  # (page, token, head) x (k_data, v_data, k_sf, v_sf)
    device: torch.device


_plans: dict[tuple, _Plan] = {}
_MAX_PLANS = 256


def _sig(x) -> tuple:
    """Cheap metadata signature of an argument: what the validation of that argument depends on."""
    if isinstance(x, torch.Tensor):
        return (x.dtype, x.shape, x.stride(), x.device)
    if isinstance(x, (tuple, list)):
        # K and V sharing memory is refused: it is part of the signature
        alias = len(x) == 2 and all(isinstance(e, torch.Tensor) for e in x) and x[0].data_ptr() == x[1].data_ptr()
        return (type(x), alias, *(_sig(e) for e in x))
    return (type(x),)


def _rows_sig(t) -> tuple:
    # the row count varies from call to call (it is checked per call): leave it out
    if isinstance(t, torch.Tensor):
        return (t.dtype, t.shape[1:], t.stride(), t.device, t.dim())
    return (type(t),)


def _scale_sig(x) -> tuple:
    if isinstance(x, torch.Tensor):
        return (torch.Tensor, x.dtype, x.numel(), x.device)
    return (type(x),)


def _plan_for(
    key, value, slot_mapping, paged_kv_cache, kv_cache_sf, k_scale, v_scale, kv_layout
) -> _Plan:
    sig = (
        _rows_sig(key), _rows_sig(value),
        (slot_mapping.dtype, slot_mapping.dim(), slot_mapping.dim() == 1 and slot_mapping.shape[0] > 1 and slot_mapping.stride(0) != 1, slot_mapping.device)
        if isinstance(slot_mapping, torch.Tensor) else (type(slot_mapping),),
        _sig(paged_kv_cache), _sig(kv_cache_sf), _scale_sig(k_scale), _scale_sig(v_scale), kv_layout,
    )  # fmt: skip
    plan = _plans.get(sig)
    if plan is not None:
        return plan
    # Full validation, once per signature; invalid arguments raise here and are never cached.
    views = normalize_cache(paged_kv_cache, kv_cache_sf, kv_layout)
    check_write_inputs(key, value, slot_mapping, views)
    for name, sc in (("k_scale", k_scale), ("v_scale", v_scale)):
        resolve_scale(sc, name, views.device)
    kf, vf = views.k_sf.view(torch.uint8), views.v_sf.view(torch.uint8)
    plan = _Plan(
        num_kv_heads=views.num_kv_heads,
        page_size=views.page_size,
        num_slots=views.num_pages * views.page_size,
        head_dim=views.head_dim,
        cache_strides=(
            *views.strides(views.k_data),
            *views.strides(views.v_data),
            *views.strides(kf),
            *views.strides(vf),
        ),  # fmt: skip
        device=views.device,
    )
    if len(_plans) >= _MAX_PLANS:
        _plans.clear()
    _plans[sig] = plan
    return plan


@dataclass(frozen=True)
class _Launch:
    """Everything a launch needs beyond the per-call pointers, sizes and scale values."""

    plan: _Plan
    fast_math: bool
    fp8_cvt: bool
    num_sms: int
    err: torch.Tensor
    interp: bool


_launches: dict[tuple, _Launch] = {}


def _pair_key(arg) -> tuple | None:
    """Signature of a K/V pair given as one stacked tensor or a 2-sequence of tensors."""
    t = type(arg)
    if t is torch.Tensor:
        return tensor_meta(arg)
    if (t is tuple or t is list) and len(arg) == 2:
        a, b = arg
        if type(a) is torch.Tensor and type(b) is torch.Tensor:
            return (tensor_meta(a), tensor_meta(b), a.data_ptr() == b.data_ptr())
    return None


def _fast_key(
    key, value, slot_mapping, cache, sf, k_scale, v_scale, kv_layout, four, rotation=None
) -> tuple | None:
    """A flat signature of every argument property the launch depends on, built with plain attribute
    reads (row counts excluded), or None for argument forms the fast path does not take."""
    if type(key) is not torch.Tensor or type(value) is not torch.Tensor:
        return None
    if rotation is not None and type(rotation) is not str:
        return None  # the validating path rejects it
    if type(slot_mapping) is not torch.Tensor:
        return None
    ksh, vsh = key.shape, value.shape
    if len(ksh) != 3 or len(vsh) != 3:
        return None
    tc, tf = type(cache), type(sf)
    ck, fk = _pair_key(cache), _pair_key(sf)
    if ck is None or fk is None:
        return None
    sk, sv = scale_meta(k_scale), scale_meta(v_scale)
    if sk is None or sv is None:
        return None  # the validating path converts or rejects such scales
    return (
        key.dtype, ksh[1], ksh[2], key.stride(), key.device,
        value.dtype, vsh[1], vsh[2], value.stride(), value.device,
        slot_mapping.dtype, slot_mapping.dim(), slot_mapping.stride(), slot_mapping.device,
        tc, ck, tf, fk, sk, sv, kv_layout, four, type(rotation), rotation, interpreting(),
    )  # fmt: skip


def _check_flag(nvfp4_4over6: object) -> None:
    if not isinstance(nvfp4_4over6, bool):
        raise TypeError(
            f"nvfp4_4over6 must be True or False, got {nvfp4_4over6!r} ({type(nvfp4_4over6).__name__}); "
            "a string such as 'no' would otherwise count as true"
        )


def _write_checked(
    key, value, slot_mapping, paged_kv_cache, kv_cache_sf, k_scale, v_scale, kv_layout: str,
    nvfp4_4over6: bool, fast_math: bool | None, config: WriteConfig | None,
    kv_rotation: str | None = None,
) -> None:  # fmt: skip
    """:func:`append_slot_mapping`'s validating path: every argument checked, then the launch."""
    _check_flag(nvfp4_4over6)
    plan = _plan_for(
        key, value, slot_mapping, paged_kv_cache, kv_cache_sf, k_scale, v_scale, kv_layout
    )
    rotate = fused_rotation("write", kv_rotation, plan.head_dim)
    device = plan.device
    nnz = slot_mapping.shape[0]
    if key.shape[0] < nnz or value.shape[0] < nnz:
        check_write_inputs(
            key, value, slot_mapping, normalize_cache(paged_kv_cache, kv_cache_sf, kv_layout)
        )
    if metadata_checks_on():
        check_metadata_values(
            "write", num_pages=plan.num_slots // plan.page_size, page_size=plan.page_size,
            slot_mapping=slot_mapping,
        )  # fmt: skip
    n_rows = nnz * plan.num_kv_heads
    if n_rows > MAX_INDEX:
        raise ValueError(
            f"{nnz} rows x {plan.num_kv_heads} heads exceeds {MAX_INDEX} (row, head) pairs"
        )
    ks = k_scale if isinstance(k_scale, torch.Tensor) else resolve_scale(k_scale, "k_scale", device)
    vs = v_scale if isinstance(v_scale, torch.Tensor) else resolve_scale(v_scale, "v_scale", device)
    if (
        isinstance(ks, torch.Tensor) and ks.device != device
    ):  # a CPU tensor for a CUDA cache: a host value
        ks = resolve_scale(ks, "k_scale", device)
    if isinstance(vs, torch.Tensor) and vs.device != device:
        vs = resolve_scale(vs, "v_scale", device)
    if n_rows == 0:
        return
    _launch(
        plan, key, value, slot_mapping, paged_kv_cache, kv_cache_sf, ks, vs, n_rows,
        bool(nvfp4_4over6), default_fast_math(device) if fast_math is None else bool(fast_math),
        config, _fp8_cvt(device), _num_sms(device), scale_error_flag(device), interpreting(), rotate,
    )  # fmt: skip


def _launch(
    plan: _Plan, key, value, slot_mapping, cache, sf, ks, vs, n_rows: int, four: bool,
    fast_math: bool, config: WriteConfig | None, fp8_cvt: bool, num_sms: int, err: torch.Tensor,
    interp: bool, rotate: bool = False,
) -> None:  # fmt: skip
    """Launch on validated arguments (``ks``/``vs``: floats or float32 tensors on the cache's device)."""
    if config is None:
        config = INTERPRETER_CONFIG if interp else pick_config(n_rows, plan.head_dim)
    rows = config.rows(plan.head_dim)
    kt, vt = type(ks) is torch.Tensor, type(vs) is torch.Tensor
    if kt or vt:
        k_t = ks if kt else torch.full((1,), ks, dtype=torch.float32, device=plan.device)
        v_t = vs if vt else torch.full((1,), vs, dtype=torch.float32, device=plan.device)
        k_val = v_val = 0.0
    else:
        k_t = v_t = err  # unused pointer arguments
        k_val, v_val = ks, vs
    if type(cache) is torch.Tensor:
        kd, vd = cache.select(1, 0), cache.select(1, 1)
    else:
        kd, vd = cache
    # (the kernel reads the scale pointers as bytes, whatever their dtype: no uint8 views here)
    if type(sf) is torch.Tensor:
        kf, vf = sf.select(1, 0), sf.select(1, 1)
    else:
        kf, vf = sf
    grid = (config.programs(-(-n_rows // rows), num_sms), 2)
    _write_kernel[grid](
        key, value, slot_mapping,
        kd, vd, kf, vf,
        k_t, v_t, k_val, v_val, err,
        n_rows, plan.num_kv_heads, plan.page_size, plan.num_slots,  # heads, page size: constexpr
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        *plan.cache_strides,
        HEAD_DIM=plan.head_dim, ROWS=rows, SCALE_PTR=kt or vt,
        FOUR_OVER_SIX=four, FAST_MATH=fast_math, FP8_CVT=fp8_cvt, ROTATE=rotate,
        num_warps=config.num_warps,
    )  # fmt: skip


def append_slot_mapping(
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
    paged_kv_cache: torch.Tensor | Sequence[torch.Tensor],
    kv_cache_sf: torch.Tensor | Sequence[torch.Tensor],
    k_scale: float | torch.Tensor,
    v_scale: float | torch.Tensor,
    kv_layout: str = "NHD",
    *,
    nvfp4_4over6: bool = False,
    fast_math: bool | None = None,
    config: WriteConfig | None = None,
    kv_rotation: str | None = None,
) -> None:
    """The ``write`` op (:class:`~nvfp4compat.kernels.contract.WriteArgs`) with the Triton kernel.

    No host sync and no data-dependent allocation: safe in CUDA-graph capture (pass device-tensor
    scales there). A bad device-tensor scale poisons the side's blocks and sets the error flag
    (module docstring).

    The kernel knobs (tests and benchmarks): ``fast_math=None`` means
    :func:`~nvfp4compat.kernels.checks.default_fast_math` (on for CUDA, off in the interpreter),
    ``config=None`` means :func:`pick_config`. A call that sets either is validated in full.

    Host overhead: the arguments are validated in full the first time their signature (dtypes,
    shapes except the row count, strides, devices, scale kinds) is seen; later calls with the same
    signature only check the row count and the values of Python-number scales, then launch.

    ``kv_rotation="hadamard"``: each K and V row is multiplied by the normalized Hadamard matrix
    (float32, rounded to the input dtype) inside the kernel before it is quantized, so the cache
    holds ``K H`` and ``V H`` (:mod:`nvfp4compat.kernels.rotation`); ``head_dim`` must be one of
    ``rotation.HEAD_DIMS``. Works with ``nvfp4_4over6``. ``None``: a plain cache.
    """
    if type(nvfp4_4over6) is not bool:
        _check_flag(nvfp4_4over6)
    if fast_math is not None or config is not None or metadata_checks_on():
        fk = None  # knobs set, or debug mode: the checking path
    else:
        fk = _fast_key(
            key, value, slot_mapping, paged_kv_cache, kv_cache_sf, k_scale, v_scale, kv_layout,
            nvfp4_4over6, kv_rotation,
        )  # fmt: skip
    ln = _launches.get(fk) if fk is not None else None
    if ln is not None:  # a signature validated before: check the row counts, launch
        nnz = slot_mapping.shape[0]
        n_rows = nnz * ln.plan.num_kv_heads
        if key.shape[0] >= nnz and value.shape[0] >= nnz and n_rows <= MAX_INDEX:
            if n_rows:
                _launch(
                    ln.plan, key, value, slot_mapping, paged_kv_cache, kv_cache_sf, k_scale, v_scale,
                    n_rows, bool(nvfp4_4over6), ln.fast_math, None, ln.fp8_cvt, ln.num_sms, ln.err,
                    ln.interp, kv_rotation is not None,  # (a rotation in the key was validated)
                )  # fmt: skip
            return
    # First call with this signature, or a bad row count: full validation (raises on bad input).
    _write_checked(
        key, value, slot_mapping, paged_kv_cache, kv_cache_sf, k_scale, v_scale, kv_layout,
        nvfp4_4over6, fast_math, config, kv_rotation,
    )  # fmt: skip
    if fk is None:
        return
    plan = _plan_for(
        key, value, slot_mapping, paged_kv_cache, kv_cache_sf, k_scale, v_scale, kv_layout
    )
    dev = plan.device
    if any(isinstance(s, torch.Tensor) and s.device != dev for s in (k_scale, v_scale)):
        return  # a host tensor scale is read on the host each call (slow path)
    if len(_launches) >= _MAX_PLANS:
        _launches.clear()
    _launches[fk] = _Launch(
        plan,
        default_fast_math(dev),
        _fp8_cvt(dev),
        _num_sms(dev),
        scale_error_flag(dev),
        interpreting(),
    )


def _cache_constexprs(layout: str, combined: bool, page: int, heads: int, head_dim: int) -> dict:
    """The stride constexprs a launch passes for a cache of this geometry (from the real views)."""
    cache: Sequence[torch.Tensor]
    sf: Sequence[torch.Tensor]
    if combined:  # vLLM's one-uint8-page form, split as the plugin does
        full = head_dim // 2 + head_dim // 16
        if layout == "HND":
            page_t = torch.zeros(2, 2 * heads, page, full, dtype=torch.uint8)
        else:
            page_t = torch.zeros(2, page, 2 * heads, full, dtype=torch.uint8).permute(0, 2, 1, 3)
        cache, sf, layout = split_combined_page(page_t, heads)
    else:
        shape = (2, page, heads) if layout == "NHD" else (2, heads, page)
        cache = tuple(torch.zeros(*shape, head_dim // 2, dtype=torch.uint8) for _ in range(2))
        sf = tuple(torch.zeros(*shape, head_dim // 16, dtype=torch.uint8) for _ in range(2))
    views = normalize_cache(cache, sf, layout)
    names = [
        f"{side}{kind}_{s}"
        for kind, side in (("D", "K"), ("D", "V"), ("S", "K"), ("S", "V"))
        for s in ("SP", "ST", "SH")
    ]
    values = (
        *views.strides(views.k_data), *views.strides(views.v_data),
        *views.strides(views.k_sf), *views.strides(views.v_sf),
    )  # fmt: skip
    return dict(zip(names, values, strict=True))


def aot_kernels() -> list:
    """AOT variants of the writer (see :mod:`nvfp4compat.kernels.aot`)."""
    from nvfp4compat.kernels.aot import AotKernel, AotVariant, aligned

    sig = {
        "key_ptr": "*bf16", "value_ptr": "*bf16", "slot_ptr": "*i64",
        "k_data_ptr": "*u8", "v_data_ptr": "*u8", "k_sf_ptr": "*u8", "v_sf_ptr": "*u8",
        "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32", "k_scale_val": "fp32", "v_scale_val": "fp32",
        "err_ptr": "*i32",
    }  # fmt: skip
    # in the kernel's argument order: `aligned` indexes the signature by position
    for name in (
        "n_rows", "NUM_HEADS", "PAGE_SIZE", "num_slots", "key_sn", "key_sh", "value_sn", "value_sh",
        "KD_SP", "KD_ST", "KD_SH", "VD_SP", "VD_ST", "VD_SH", "KS_SP", "KS_ST", "KS_SH",
        "VS_SP", "VS_ST", "VS_SH",
        "HEAD_DIM", "ROWS", "SCALE_PTR", "FOUR_OVER_SIX", "FAST_MATH", "FP8_CVT", "ROTATE",
    ):  # fmt: skip
        sig[name] = "constexpr" if name.isupper() else "i32"
    assert list(sig) == list(_write_kernel.arg_names), "AOT signature out of the kernel's order"
    variants = []
    # Every tile config once (head_dim 128, bf16, int64 slots, device scales, fast math, a dense NHD
    # tuple cache of 8 heads, page 16) with the alignment such a cache gets at JIT time: the code the
    # heuristic launches on a GPU. The other variants carry no alignment hints.
    dense = aligned(
        sig, [n for n in sig if n.endswith("_ptr")] + ["key_sn", "key_sh", "value_sn", "value_sh"]
    )
    tiles: dict[tuple[int, int], WriteConfig] = {}  # configs differing only in per_sm: one compile
    for t in CONFIGS:
        tiles.setdefault((t.blocks, t.num_warps), t)
    for cfg in tiles.values():
        c = {
            "NUM_HEADS": 8,
            "PAGE_SIZE": 16,
            **_cache_constexprs("NHD", False, 16, 8, 128),
            "HEAD_DIM": 128,
            "ROWS": cfg.rows(128),
            "SCALE_PTR": True,
            "FOUR_OVER_SIX": False,
            "FAST_MATH": True,
            "ROTATE": False,
        }
        variants.append(
            AotVariant(
                f"{cfg.name}-d128-bf16-i64-ptr-fast",
                dict(sig),
                c,
                cfg.num_warps,
                attrs=dense,
                by_cc=_aot_arch,
            )
        )
    # Every head_dim, fp16/bf16, int32/int64 slots, float/device scales, 4over6 on/off, exact/fast;
    # head counts and page sizes powers of two and not; HND, and vLLM's combined page (both layouts);
    # the fused Hadamard rotation (kv_rotation) with and without 4over6, on the decode-sized tile
    # (4 rows) and the large one.
    extra = [
        (64, "*fp16", "*i32", False, True, True, 1, 32, "HND", True, False, None),
        (256, "*bf16", "*i32", True, True, False, 6, 24, "NHD", True, False, None),
        (512, "*fp16", "*i64", False, False, False, 2, 16, "HND", False, False, None),
        (128, "*bf16", "*i64", True, False, True, 8, 16, "NHD", False, True, CONFIG_BY_NAME["b32w1"]),
        (128, "*fp16", "*i64", True, True, True, 8, 16, "NHD", True, True, None),
        (512, "*bf16", "*i32", False, True, False, 2, 16, "HND", False, True, None),
    ]
    for hd, dt, it, ptr, fours, fast, heads, page, layout, combined, rot, tile in extra:
        cfg = tile or pick_config(1 << 20, hd)
        s = dict(sig, key_ptr=dt, value_ptr=dt, slot_ptr=it)
        c = {
            "NUM_HEADS": heads,
            "PAGE_SIZE": page,
            **_cache_constexprs(layout, combined, page, heads, hd),
            "HEAD_DIM": hd,
            "ROWS": cfg.rows(hd),
            "SCALE_PTR": ptr,
            "FOUR_OVER_SIX": fours,
            "FAST_MATH": fast,
            "ROTATE": rot,
        }
        label = (
            f"{cfg.name}-d{hd}-{dt[1:]}-{it[1:]}-{'ptr' if ptr else 'val'}{'-4o6' if fours else ''}"
            f"-{'fast' if fast else 'exact'}-{layout}{'-combined' if combined else ''}{'-rotate' if rot else ''}"
        )
        variants.append(AotVariant(label, s, c, cfg.num_warps, by_cc=_aot_arch))
    return [AotKernel("append_slot_mapping", _write_kernel, variants)]


def _aot_arch(cc: int) -> dict:
    """What :func:`append_slot_mapping` picks on a device of compute capability ``cc``."""
    return {"FP8_CVT": cc >= 89}
