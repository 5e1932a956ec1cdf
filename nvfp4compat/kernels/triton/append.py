"""Triton NVFP4 slot-mapping writer: FlashInfer's ``nvfp4_quantize_append_paged_kv_cache_with_slot_mapping``.

Quantizes fp16/bf16 K and V rows ``[rows, num_kv_heads, head_dim]`` to NVFP4 (E2M1 codes, one E4M3
scale per 16 elements, decoded as ``x = e2m1 * sf * gs``) and writes them in place into a paged cache
at ``page = slot // page_size``, ``offset = slot % page_size``. Bit for bit the numerics of FlashInfer's
writer (``docs/architecture.md``, "Numerics of the writer"); on CUDA the approximate division and
reciprocal of FlashInfer's ``-use_fast_math`` build are used (inline PTX), so the bytes match
FlashInfer's; under ``TRITON_INTERPRET=1`` and on the CPU the arithmetic is exact IEEE fp32, byte-equal
to :mod:`nvfp4compat.kernels.reference`.

Kernel design (one launch for K and V, grid ``(cdiv(nnz*heads, ROWS), 2)``): a program quantizes
``ROWS`` consecutive (token, head) rows of one side as a ``[ROWS*head_dim/16, 16]`` tile, one 16-block
per tile row, so loads are 32-byte segments of consecutive memory and every reduction stays inside a
block. The tile size is one of :data:`CONFIGS`, picked by :func:`pick_config` from the problem size.

Device-scale policy: a Python-number scale is validated on the host. A device tensor scale is read by
the kernel (no host sync, CUDA-graph safe). When it is not finite or not > 0, the kernel does not trap
(FlashInfer 0.7.4 executes ``trap``, which can leave the CUDA context unusable): every block of that
side it would write gets data bytes 0 and scale byte ``0x7F`` (E4M3 NaN), so any reader decodes NaN
for those tokens instead of plausible wrong values, and it sets bit 0 (K) or bit 1 (V) of a per-device
int32 error flag, read by :func:`check_scale_errors`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from nvfp4compat.kernels.layout import normalize_cache
from nvfp4compat.kernels.triton import nvfp4
from nvfp4compat.kernels.validate import (
    MAX_INDEX,
    check_append_inputs,
    default_fast_math,
    interpreting,
    resolve_scale,
)

__all__ = [
    "AppendConfig",
    "CONFIGS",
    "pick_config",
    "append_slot_mapping",
    "launch_append",
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
def _quantize_side(
    src_ptr, src_sn, src_sh,
    data_ptr, d_sp, d_st, d_sh,
    sf_ptr, f_sp, f_st, f_sh,
    scale_ptr, scale_val, err_ptr, err_bit,
    token, head, blk, page, offset, valid,
    HEAD_DIM: tl.constexpr, BLOCKS: tl.constexpr, SCALE_PTR: tl.constexpr,
    FOUR_OVER_SIX: tl.constexpr, FAST_MATH: tl.constexpr,
):  # fmt: skip
    """Quantize ``BLOCKS`` 16-blocks of one side (K or V) and store codes and scales."""
    if SCALE_PTR:
        gs = tl.load(scale_ptr)
    else:
        gs = scale_val
    gs_bad = (gs != gs) | (gs <= 0.0) | (gs > _FLT_MAX)
    if gs_bad:
        tl.atomic_or(err_ptr, err_bit)

    e16 = tl.arange(0, 16)
    src = token.to(tl.int64) * src_sn + head.to(tl.int64) * src_sh + blk * 16
    x = tl.load(src_ptr + src[:, None] + e16[None, :], mask=valid[:, None], other=0.0).to(
        tl.float32
    )
    x = nvfp4.flush_denormal(x)
    absx = tl.abs(x)
    amax = tl.max(tl.where(absx == absx, absx, 0.0), axis=1)  # NaN ignored, as fmaxf does

    six_gs = 6.0 * gs
    if FAST_MATH:
        sf_val = nvfp4.div_approx(amax, tl.zeros_like(amax) + six_gs)
    else:  # IEEE division (triton's `/` is div.full.f32, not correctly rounded)
        sf_val = tl.math.div_rn(amax, tl.zeros_like(amax) + six_gs)
    sf_val = tl.where(amax > 0.0, sf_val, 0.0)
    sf_byte = nvfp4.e4m3_encode(sf_val)
    if FOUR_OVER_SIX:
        sf4_byte = nvfp4.e4m3_encode(sf_val * 1.5)
        err6 = _block_error(x, absx, nvfp4.e4m3_decode(sf_byte), gs, FAST_MATH)
        err4 = _block_error(x, absx, nvfp4.e4m3_decode(sf4_byte), gs, FAST_MATH)
        sf_byte = tl.where(err4 < err6, sf4_byte, sf_byte)
    sf_r = nvfp4.e4m3_decode(sf_byte)
    ok = (amax > 0.0) & (sf_r > 0.0)
    denom = tl.where(ok, sf_r * gs, 1.0)
    if FAST_MATH:
        inv = nvfp4.rcp_approx(denom)
    else:
        inv = tl.math.div_rn(tl.full(denom.shape, 1.0, tl.float32), denom)
    inv = tl.where(ok, inv, 0.0)
    codes = nvfp4.e2m1_encode(x * inv[:, None])
    lo, hi = tl.split(tl.reshape(codes, (BLOCKS, 8, 2)))
    packed = lo | (hi << 4)
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
def _append_kernel(
    key_ptr, value_ptr, slot_ptr,
    k_data_ptr, v_data_ptr, k_sf_ptr, v_sf_ptr,
    k_scale_ptr, v_scale_ptr, k_scale_val, v_scale_val, err_ptr,
    n_rows, num_heads, page_size, num_slots,
    key_sn, key_sh, value_sn, value_sh,
    kd_sp, kd_st, kd_sh, vd_sp, vd_st, vd_sh,
    ks_sp, ks_st, ks_sh, vs_sp, vs_st, vs_sh,
    HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, SCALE_PTR: tl.constexpr,
    FOUR_OVER_SIX: tl.constexpr, FAST_MATH: tl.constexpr,
):  # fmt: skip
    """Program ``(p, side)``: rows ``[p*ROWS, (p+1)*ROWS)`` of ``nnz*heads`` (token-major), side 0=K, 1=V."""
    NB: tl.constexpr = HEAD_DIM // 16
    BLOCKS: tl.constexpr = ROWS * NB
    pid = tl.program_id(0)
    side = tl.program_id(1)
    i = tl.arange(0, BLOCKS)
    row = pid * ROWS + i // NB
    blk = i % NB
    in_range = row < n_rows
    token = row // num_heads
    head = row - token * num_heads
    slot = tl.load(slot_ptr + token, mask=in_range, other=-1)
    valid = in_range & (slot >= 0) & (slot < num_slots)
    slot32 = tl.where(valid, slot, 0).to(tl.int32)  # < 2**31: checked on the host
    page = slot32 // page_size
    offset = slot32 - page * page_size
    if side == 0:
        _quantize_side(
            key_ptr, key_sn, key_sh, k_data_ptr, kd_sp, kd_st, kd_sh, k_sf_ptr, ks_sp, ks_st, ks_sh,
            k_scale_ptr, k_scale_val, err_ptr, 1, token, head, blk, page, offset, valid,
            HEAD_DIM, BLOCKS, SCALE_PTR, FOUR_OVER_SIX, FAST_MATH,
        )  # fmt: skip
    else:
        _quantize_side(
            value_ptr, value_sn, value_sh, v_data_ptr, vd_sp, vd_st, vd_sh, v_sf_ptr, vs_sp, vs_st, vs_sh,
            v_scale_ptr, v_scale_val, err_ptr, 2, token, head, blk, page, offset, valid,
            HEAD_DIM, BLOCKS, SCALE_PTR, FOUR_OVER_SIX, FAST_MATH,
        )  # fmt: skip


@dataclass(frozen=True)
class AppendConfig:
    """One tile configuration of the writer.

    ``blocks`` 16-element blocks per program (``rows = blocks // (head_dim/16)`` (token, head) rows,
    at least 1) and ``num_warps`` warps.
    """

    blocks: int
    num_warps: int

    def rows(self, head_dim: int) -> int:
        return max(1, self.blocks // (head_dim // 16))

    @property
    def name(self) -> str:
        return f"b{self.blocks}w{self.num_warps}"


# The variants the GPU benchmark sweeps (benchmarks/bench_append.py) and aot.py compiles.
CONFIGS: tuple[AppendConfig, ...] = (
    AppendConfig(32, 1),
    AppendConfig(64, 2),
    AppendConfig(128, 4),
    AppendConfig(256, 8),
    AppendConfig(512, 8),
    AppendConfig(1024, 8),
    AppendConfig(1024, 16),
)
CONFIG_BY_NAME = {c.name: c for c in CONFIGS}
# Under TRITON_INTERPRET=1 every program is a Python-level step: one large tile is far faster.
INTERPRETER_CONFIG = AppendConfig(4096, 4)


def pick_config(n_rows: int, head_dim: int) -> AppendConfig:
    """Pick the tile configuration for ``n_rows`` (token, head) rows per side.

    Heuristic, from the H200 sweep of ``benchmarks/bench_append.py`` (BENCHMARKS.md): decode-sized
    writes (at most 2,048 16-blocks per side, e.g. 32 tokens x 8 heads x 128) use small programs so
    that the few blocks spread over many SMs (their time is launch-bound: 2.1-3.3 us of device time in
    a CUDA graph); mid-sized writes 128-block programs; large writes (4,096 tokens x 8 heads x 128 and
    up) 512-block programs with 8 warps, the fastest measured there (65,536 tokens: 0.251 ms against
    0.265 ms for 256-block programs; 4,096 tokens: 68.5 us against 86.9 us).
    """
    total_blocks = n_rows * (head_dim // 16)
    if total_blocks <= 2048:
        return CONFIG_BY_NAME["b32w1"]
    if total_blocks <= 65536:
        return CONFIG_BY_NAME["b128w4"]
    return CONFIG_BY_NAME["b512w8"]


class ScaleError(ValueError):
    """A device-side global scale was not finite or not > 0 (see :func:`check_scale_errors`)."""


_flags: dict[torch.device, torch.Tensor] = {}
_flags_lock = threading.Lock()


def scale_error_flag(device: torch.device | str) -> torch.Tensor:
    """The per-device int32 error flag ``[1]`` the writer sets on a bad device scale (bit 0 K, bit 1 V).

    Allocated (zeroed) on first use. Call it once, or run one eager write, before capturing a CUDA
    graph: a flag first allocated during capture is zeroed by the graph itself at each replay.
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    flag = _flags.get(device)
    if flag is None:
        with _flags_lock:
            flag = _flags.get(device)
            if flag is None:
                flag = torch.zeros(1, dtype=torch.int32, device=device)
                _flags[device] = flag
    return flag


def check_scale_errors(device: torch.device | str | None = None, *, reset: bool = True) -> None:
    """Raise :class:`ScaleError` if a writer launch on ``device`` saw a bad device-tensor scale.

    Reads the flag of :func:`scale_error_flag` (a host sync: call it where a sync is acceptable, e.g.
    after a step or in tests), then clears it when ``reset``. ``device=None`` checks every device
    the writer has used.
    """
    devices = list(_flags) if device is None else [torch.device(device)]
    bad = []
    for dev in devices:
        flag = _flags.get(dev)
        if flag is None and dev.type == "cuda" and dev.index is None:
            flag = _flags.get(torch.device("cuda", torch.cuda.current_device()))
        if flag is None:
            continue
        bits = int(flag.item())
        if reset and bits:
            flag.zero_()
        if bits:
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
        return (type(x), *(_sig(e) for e in x))
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


def _sides(arg, as_bytes: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V tensors whose ``data_ptr`` is that of the normalized views (tuple or stacked)."""
    if isinstance(arg, torch.Tensor):
        k, v = arg.select(1, 0), arg.select(1, 1)
    else:
        k, v = arg[0], arg[1]
    if as_bytes and k.dtype != torch.uint8:
        k, v = k.view(torch.uint8), v.view(torch.uint8)
    return k, v


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
    check_append_inputs(key, value, slot_mapping, views)
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


def launch_append(
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
    config: AppendConfig | None = None,
) -> None:
    """:func:`append_slot_mapping` with the kernel knobs exposed (tests and benchmarks).

    ``fast_math=None`` means :func:`~nvfp4compat.kernels.validate.default_fast_math` (on for CUDA, off
    in the interpreter); ``config=None`` means :func:`pick_config`.

    Host overhead: the arguments are validated in full the first time their signature (dtypes,
    shapes except the row count, strides, devices, scale kinds) is seen; later calls with the same
    signature only check the row count and the values of Python-number scales, then launch.
    """
    plan = _plan_for(
        key, value, slot_mapping, paged_kv_cache, kv_cache_sf, k_scale, v_scale, kv_layout
    )
    device = plan.device
    nnz = slot_mapping.shape[0]
    if key.shape[0] < nnz or value.shape[0] < nnz:
        check_append_inputs(
            key, value, slot_mapping, normalize_cache(paged_kv_cache, kv_cache_sf, kv_layout)
        )
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
    if fast_math is None:
        fast_math = default_fast_math(device)
    if config is None:
        config = INTERPRETER_CONFIG if interpreting() else pick_config(n_rows, plan.head_dim)
    rows = config.rows(plan.head_dim)
    err = scale_error_flag(device)
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
        k_t = v_t = err  # unused pointer arguments
        k_val, v_val = float(ks), float(vs)
    kd, vd = _sides(paged_kv_cache, False)
    kf, vf = _sides(kv_cache_sf, True)
    grid = (triton.cdiv(n_rows, rows), 2)
    _append_kernel[grid](
        key, value, slot_mapping,
        kd, vd, kf, vf,
        k_t, v_t, k_val, v_val, err,
        n_rows, plan.num_kv_heads, plan.page_size, plan.num_slots,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        *plan.cache_strides,
        HEAD_DIM=plan.head_dim, ROWS=rows, SCALE_PTR=scale_ptr,
        FOUR_OVER_SIX=bool(nvfp4_4over6), FAST_MATH=bool(fast_math),
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
) -> None:
    """Quantize K/V rows to NVFP4 and write them into a paged cache by slot mapping (in place).

    FlashInfer's ``nvfp4_quantize_append_paged_kv_cache_with_slot_mapping``, bit for bit:
    ``sf = e4m3_sat(amax / (6 * gs))`` per 16 elements, ``q = e2m1_rne_sat(x / (sf * gs))``, decoded as
    ``x = e2m1 * sf * gs``. No host sync and no data-dependent allocation: safe in CUDA-graph capture
    (pass device-tensor scales there).

    Parameters
    ----------
    key, value : torch.Tensor
        ``[rows, num_kv_heads, head_dim]``, float16 or bfloat16 (one dtype), last dim contiguous, other
        strides arbitrary; ``rows >= len(slot_mapping)`` (extra rows are ignored).
    slot_mapping : torch.Tensor
        ``[nnz]`` int32 or int64: row ``i`` goes to ``page = slot // page_size``,
        ``offset = slot % page_size``. Negative (padding) and out-of-range slots are skipped.
    paged_kv_cache : tuple of torch.Tensor or torch.Tensor
        ``(k_data, v_data)`` uint8, NHD ``[num_pages, page_size, num_kv_heads, head_dim/2]`` or HND
        ``[num_pages, num_kv_heads, page_size, head_dim/2]`` (even element in the low nibble), or one
        stacked ``[num_pages, 2, ...]`` tensor; only the last dim must be contiguous (vLLM's combined
        page views from :func:`~nvfp4compat.kernels.layout.split_combined_page` are accepted).
    kv_cache_sf : tuple of torch.Tensor or torch.Tensor
        Same structure, float8_e4m3fn (or uint8), last dim ``head_dim/16``, linear.
    k_scale, v_scale : float or torch.Tensor
        Global decode scales: positive finite numbers (checked on the host), or one-element float32
        tensors on the cache's device (read on the device; see the module docstring for a bad value).
    kv_layout : str
        ``"NHD"`` or ``"HND"``.
    nvfp4_4over6 : bool
        Per block, also try the scale ``e4m3(1.5 * sf)`` and keep it when the block's squared
        reconstruction error is strictly lower (FlashInfer 0.7.4 ``nvfp4_4over6``).

    head_dim is 64, 128, 256 or 512; any page size; ``num_pages * page_size < 2**31``.
    """
    launch_append(
        key, value, slot_mapping, paged_kv_cache, kv_cache_sf, k_scale, v_scale, kv_layout,
        nvfp4_4over6=nvfp4_4over6,
    )  # fmt: skip


def aot_kernels() -> list:
    """AOT variants of the writer (see :mod:`nvfp4compat.kernels.aot`)."""
    from nvfp4compat.kernels.aot import AotKernel, AotVariant, aligned

    sig = {
        "key_ptr": "*bf16", "value_ptr": "*bf16", "slot_ptr": "*i64",
        "k_data_ptr": "*u8", "v_data_ptr": "*u8", "k_sf_ptr": "*u8", "v_sf_ptr": "*u8",
        "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32", "k_scale_val": "fp32", "v_scale_val": "fp32",
        "err_ptr": "*i32",
    }  # fmt: skip
    for name in (
        "n_rows", "num_heads", "page_size", "num_slots", "key_sn", "key_sh", "value_sn", "value_sh",
        "kd_sp", "kd_st", "kd_sh", "vd_sp", "vd_st", "vd_sh", "ks_sp", "ks_st", "ks_sh",
        "vs_sp", "vs_st", "vs_sh",
    ):  # fmt: skip
        sig[name] = "i32"
    for name in ("HEAD_DIM", "ROWS", "SCALE_PTR", "FOUR_OVER_SIX", "FAST_MATH"):
        sig[name] = "constexpr"
    variants = []
    # Every tile config once (head_dim 128, bf16, int64 slots, device scales, fast math) with the
    # alignment a dense tuple cache gets at JIT time: the code the heuristic launches on a GPU. The
    # other variants carry no alignment hints (vLLM's combined page has 72-byte rows).
    dense = aligned(
        sig,
        [n for n in sig if n.endswith("_ptr")]
        + [
            "key_sn",
            "key_sh",
            "value_sn",
            "value_sh",
            "kd_sp",
            "kd_st",
            "kd_sh",
            "vd_sp",
            "vd_st",
            "vd_sh",
        ],
    )
    for cfg in CONFIGS:
        c = {
            "HEAD_DIM": 128,
            "ROWS": cfg.rows(128),
            "SCALE_PTR": True,
            "FOUR_OVER_SIX": False,
            "FAST_MATH": True,
        }
        variants.append(
            AotVariant(
                f"{cfg.name}-d128-bf16-i64-ptr-fast", dict(sig), c, cfg.num_warps, attrs=dense
            )
        )
    # Every head_dim, fp16/bf16, int32/int64 slots, float/device scales, 4over6 on/off, exact/fast.
    extra = [
        (64, "*fp16", "*i32", False, True, True),
        (256, "*bf16", "*i32", True, True, False),
        (512, "*fp16", "*i64", False, False, False),
    ]
    for hd, dt, it, ptr, fours, fast in extra:
        cfg = pick_config(1 << 20, hd)
        s = dict(sig, key_ptr=dt, value_ptr=dt, slot_ptr=it)
        c = {
            "HEAD_DIM": hd,
            "ROWS": cfg.rows(hd),
            "SCALE_PTR": ptr,
            "FOUR_OVER_SIX": fours,
            "FAST_MATH": fast,
        }
        label = f"{cfg.name}-d{hd}-{dt[1:]}-{it[1:]}-{'ptr' if ptr else 'val'}{'-4o6' if fours else ''}-{'fast' if fast else 'exact'}"
        variants.append(AotVariant(label, s, c, cfg.num_warps))
    return [AotKernel("append_slot_mapping", _append_kernel, variants)]
