"""Builders and comparators shared by the NVFP4 write/dequant tests (CPU interpreter, GPU tier, golden).

* Cache forms: ``tuple`` (separate K/V tensors), ``stacked`` (one ``[pages, 2, ...]`` tensor), ``3d``
  (page_size 1, 3-D tensors), ``strided`` (views into larger buffers at odd offsets: only the last dim
  is dense) and ``combined`` (vLLM 0.32+'s one-uint8-page layout through ``split_combined_page``).
  Every form is built over *base buffers* filled with random bytes, so a comparison of the base
  buffers also proves that nothing outside the written rows changed.
* :func:`compare_write` compares two writes of the same input: scale bytes must match exactly (with
  ``nvfp4_4over6``, a block whose two candidate errors are within a relative 1e-6 may pick either),
  and every differing E2M1 code is classified; only ties at exact rounding midpoints are accepted
  where one side used approximate (fast-math) arithmetic.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field

import pytest
import torch

from nvfp4compat.kernels import reference as ref
from nvfp4compat.kernels.layout import (
    CacheViews,
    normalize_cache,
    nvfp4_full_dim,
    split_combined_page,
)

FORMS = ("tuple", "stacked", "3d", "strided", "combined")
IMPLS = ("triton", "flashinfer")


def pick_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def impl_params(op: str) -> list:
    """``pytest.param`` per implementation, with the reason when it cannot run here."""
    params = []
    for impl in IMPLS:
        marks = []
        if impl == "flashinfer":
            reason = flashinfer_unavailable(op)
            if reason:
                marks.append(pytest.mark.skip(reason=reason))
        params.append(pytest.param(impl, id=impl, marks=marks))
    return params


def flashinfer_unavailable(op: str) -> str | None:
    """Why the FlashInfer implementation of ``op`` cannot run here, or None."""
    if not torch.cuda.is_available():
        return "impl 'flashinfer' needs a CUDA GPU (FlashInfer's helpers have no CPU path)"
    try:
        importlib.import_module(f"nvfp4compat.kernels.flashinfer.{op}")
    except ImportError as exc:
        return str(exc)
    return None


def kernel(op: str, impl: str):
    from nvfp4compat.kernels import get_kernel

    return get_kernel(op, impl)


def exact_arithmetic(impl: str, device: torch.device) -> bool:
    """True when ``impl`` computes exact IEEE fp32 (the interpreter), so its bytes equal the reference."""
    return impl == "triton" and (device.type == "cpu" or os.environ.get("TRITON_INTERPRET") == "1")


# --------------------------------------------------------------------------------------------------
# Caches


@dataclass(frozen=True)
class CacheSpec:
    form: str
    layout: str
    num_pages: int
    page_size: int
    heads: int
    head_dim: int

    def __post_init__(self) -> None:
        if self.form == "3d" and self.page_size != 1:
            raise ValueError("the 3d form means page_size 1")

    @property
    def id(self) -> str:
        return f"{self.form}-{self.layout}-p{self.page_size}-h{self.heads}-d{self.head_dim}"

    def dims(self) -> tuple[int, int]:
        """The two middle dims in layout order."""
        if self.layout == "NHD":
            return self.page_size, self.heads
        return self.heads, self.page_size


def _rand_bytes(shape, device, gen) -> torch.Tensor:
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen).to(device)


def alloc_cache(spec: CacheSpec, device: torch.device, gen: torch.Generator) -> list[torch.Tensor]:
    """Random-byte base buffers for ``spec`` (see :func:`cache_args`)."""
    P, X, S = spec.num_pages, spec.head_dim // 2, spec.head_dim // 16
    d1, d2 = spec.dims()
    if spec.form == "tuple":
        return [_rand_bytes((P, d1, d2, n), device, gen) for n in (X, X, S, S)]
    if spec.form == "3d":
        return [_rand_bytes((P, spec.heads, n), device, gen) for n in (X, X, S, S)]
    if spec.form == "stacked":
        return [
            _rand_bytes((P, 2, d1, d2, X), device, gen),
            _rand_bytes((P, 2, d1, d2, S), device, gen),
        ]
    if spec.form == "strided":
        return [_rand_bytes((2 * P + 1, d1 + 1, d2 + 2, n + 12), device, gen) for n in (X, X, S, S)]
    if spec.form == "combined":
        full = nvfp4_full_dim(spec.head_dim)
        if spec.layout == "HND":
            return [_rand_bytes((P, 2 * spec.heads, spec.page_size, full), device, gen)]
        return [_rand_bytes((P, spec.page_size, 2 * spec.heads, full), device, gen)]
    raise ValueError(f"unknown cache form {spec.form!r}; known: {FORMS}")


def cache_args(spec: CacheSpec, bufs: list[torch.Tensor]):
    """``(paged_kv_cache, kv_cache_sf)`` views over ``bufs`` in the kernels' argument format."""
    f8 = torch.float8_e4m3fn
    if spec.form in ("tuple", "3d"):
        kd, vd, ks, vs = bufs
        return (kd, vd), (ks.view(f8), vs.view(f8))
    if spec.form == "stacked":
        return bufs[0], bufs[1].view(f8)
    if spec.form == "strided":
        P = spec.num_pages
        d1, d2 = spec.dims()
        views = [b[1 : 2 * P : 2, 1 : d1 + 1, 2 : d2 + 2, 3 : b.shape[-1] - 9] for b in bufs]
        kd, vd, ks, vs = views
        return (kd, vd), (ks.view(f8), vs.view(f8))
    if spec.form == "combined":
        kv = bufs[0] if spec.layout == "HND" else bufs[0].permute(0, 2, 1, 3)
        data, scales, layout = split_combined_page(kv, spec.heads)
        assert layout == spec.layout
        return data, scales
    raise ValueError(f"unknown cache form {spec.form!r}")


def clone_all(bufs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [b.clone() for b in bufs]


# --------------------------------------------------------------------------------------------------
# Inputs


def make_rows(
    rows: int,
    heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    gen: torch.Generator,
    *,
    strided: bool = False,
    spread: int = 6,
) -> torch.Tensor:
    """Random ``[rows, heads, head_dim]`` rows whose 16-blocks span ``2**-spread .. 2**spread``.

    ``strided=True`` returns a view into a fused ``[rows, (heads + 3) * head_dim]`` buffer (as vLLM's
    key/value slices of the QKV projection are): only the last dim is dense.
    """
    nb = head_dim // 16
    x = torch.randn(rows, heads, nb, 16, generator=gen)
    x = x * torch.exp2(
        torch.randint(-spread, spread + 1, (rows, heads, nb, 1), generator=gen).float()
    )
    x = x.reshape(rows, heads, head_dim).to(dtype)
    if not strided:
        return x.to(device)
    fused = torch.randn(rows, (heads + 3) * head_dim, generator=gen).to(dtype)
    fused[:, 2 * head_dim : (heads + 2) * head_dim] = x.reshape(rows, -1)
    return fused.to(device)[:, 2 * head_dim : (heads + 2) * head_dim].unflatten(
        1, (heads, head_dim)
    )


def make_slots(
    nnz: int,
    num_slots: int,
    dtype: torch.dtype,
    device: torch.device,
    gen: torch.Generator,
    *,
    invalid: int = 0,
) -> torch.Tensor:
    """``nnz`` distinct valid slots, ``invalid`` of them replaced by negative or out-of-range ones."""
    if nnz > num_slots:
        raise ValueError(f"{nnz} distinct slots do not fit in {num_slots}")
    slots = torch.randperm(num_slots, generator=gen)[:nnz].to(torch.int64)
    if invalid:
        pos = torch.randperm(nnz, generator=gen)[:invalid]
        bad = torch.tensor([-1, num_slots, -(2**20), num_slots + 7, -2], dtype=torch.int64)
        slots[pos] = bad[torch.arange(pos.numel()) % bad.numel()]
    return slots.to(dtype).to(device)


def edge_rows(dtype: torch.dtype, head_dim: int, gs: float) -> torch.Tensor:
    """Rows of edge-value 16-blocks ``[n, 1, head_dim]`` for global scale ``gs``.

    Zeros, -0.0, mixed signed zeros, denormals (flushed), values saturating the E4M3 scale at 448,
    scales in the E4M3 subnormal range, scales that underflow to 0, NaN (ignored in amax, code 0),
    +-inf (scale saturates, code 7), exact E2M1 midpoints, fp16 overflow neighbours.
    """
    f = torch.finfo(dtype)
    tiny_normal = float(f.tiny)
    blocks = []
    blocks.append(torch.zeros(16))
    blocks.append(-torch.zeros(16))
    blocks.append(torch.tensor([0.0, -0.0] * 8))
    blocks.append(
        torch.full((16,), tiny_normal / 4) * torch.tensor([1.0, -1.0] * 8)
    )  # dtype denormals
    blocks.append(torch.linspace(-1, 1, 16) * tiny_normal)
    big = min(float(f.max), 448 * 6 * gs * 64)
    blocks.append(torch.linspace(-big, big, 16))  # sf saturates at 448
    blocks.append(
        torch.full((16,), 6 * gs * 2.0**-8) * torch.linspace(-1, 1, 16)
    )  # E4M3 subnormal sf
    blocks.append(
        torch.full((16,), 6 * gs * 2.0**-12) * torch.linspace(-1, 1, 16)
    )  # sf underflows to 0
    blocks.append(torch.full((16,), 6 * gs * 2.0**-10))  # sf exactly at the 2**-10 rounding edge
    nan_block = torch.randn(16)
    nan_block[3] = float("nan")
    nan_block[10] = -float(
        "nan"
    )  # sign of a NaN: either code sign is accepted (see compare_blocks)
    blocks.append(nan_block)
    blocks.append(torch.full((16,), float("nan")))
    inf_block = torch.randn(16)
    inf_block[0] = float("inf")
    inf_block[7] = -float("inf")
    blocks.append(inf_block)
    # Midpoints: amax 6*gs*sf with sf=1 gives inv = 1/gs exactly when gs is a power of two.
    mids = torch.tensor(
        [
            0.25,
            0.75,
            1.25,
            1.75,
            2.5,
            3.5,
            5.0,
            6.0,
            -0.25,
            -0.75,
            -1.25,
            -1.75,
            -2.5,
            -3.5,
            -5.0,
            -6.0,
        ]
    )
    blocks.append(mids * gs)
    blocks.append(torch.tensor([6.0] + [5.9999] * 15) * gs)
    n = head_dim // 16
    out = []
    for i in range(0, len(blocks), n):
        chunk = blocks[i : i + n]
        while len(chunk) < n:
            chunk.append(torch.randn(16))
        out.append(torch.cat(chunk))
    return torch.stack(out).unsqueeze(1).to(dtype)


# --------------------------------------------------------------------------------------------------
# Comparison


def _token_view(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t if layout == "NHD" else t.transpose(1, 2)


def gather_written(views: CacheViews, slots: torch.Tensor):
    """Packed codes and scale bytes of the valid slots: ``[(k_packed, k_sf), (v_packed, v_sf)]``."""
    s = slots.to(torch.int64)
    valid = (s >= 0) & (s < views.num_pages * views.page_size)
    page = s[valid] // views.page_size
    off = s[valid] % views.page_size
    out = []
    for data, sf in ((views.k_data, views.k_sf), (views.v_data, views.v_sf)):
        out.append(
            (
                _token_view(data, views.layout)[page, off],
                _token_view(sf.view(torch.uint8), views.layout)[page, off],
            )
        )
    return valid, page, off, out


def encode_with_scale(
    x: torch.Tensor, sf_bytes: torch.Tensor, gs: float | torch.Tensor
) -> torch.Tensor:
    """Exact E2M1 codes (packed) of 16-blocks ``x [N, 16]`` under given scale bytes ``[N]``."""
    gs_t = torch.as_tensor(gs, dtype=torch.float32, device=x.device).reshape(())
    xf = torch.where(x.float().abs() < ref.FLT_MIN_NORMAL, x.float() * 0.0, x.float())
    absx = xf.abs()
    amax = torch.where(torch.isnan(absx), torch.zeros_like(absx), absx).amax(-1)
    sf_r = ref.e4m3_decode(sf_bytes)
    ok = (amax > 0) & (sf_r > 0)
    inv = torch.where(
        ok, 1.0 / torch.where(ok, sf_r * gs_t, torch.ones_like(sf_r)), torch.zeros_like(sf_r)
    )
    return ref.pack_nibbles(ref.e2m1_encode(xf * inv.unsqueeze(-1)))


def _errors64(x: torch.Tensor, sf_bytes: torch.Tensor, gs: float | torch.Tensor) -> torch.Tensor:
    """Squared reconstruction error per block in float64 (the 4over6 criterion, exact)."""
    gs64 = float(torch.as_tensor(gs).float())
    xf = torch.where(x.float().abs() < ref.FLT_MIN_NORMAL, x.float() * 0.0, x.float())
    sf = ref.e4m3_decode(sf_bytes)
    denom = sf * torch.tensor(gs64, dtype=torch.float32, device=x.device)
    inv = torch.where(
        denom != 0,
        1.0 / torch.where(denom != 0, denom, torch.ones_like(denom)),
        torch.full_like(denom, float("inf")),
    )
    level = ref.e2m1_encode(xf * inv.unsqueeze(-1)) & 7
    mag = ref.E2M1_VALUES.to(x.device)[level.long()].double()
    diff = mag * sf.double().unsqueeze(-1) * gs64 - xf.double().abs()
    return (diff * diff).sum(-1)


@dataclass
class SideReport:
    blocks: int = 0
    scale_diff: int = 0
    scale_ties: int = 0
    code_diff: int = 0
    code_ties: int = 0
    violations: int = 0
    examples: list[str] = field(default_factory=list)

    def violate(self, messages: list[str], count: int | None = None) -> None:
        self.violations += len(messages) if count is None else count
        self.examples.extend(messages[: max(0, 16 - len(self.examples))])

    def merge(self, other: SideReport) -> None:
        self.blocks += other.blocks
        self.scale_diff += other.scale_diff
        self.scale_ties += other.scale_ties
        self.code_diff += other.code_diff
        self.code_ties += other.code_ties
        self.violate(other.examples, other.violations)

    def __str__(self) -> str:
        v = f"; first: {self.examples[:8]}" if self.examples else ""
        return (
            f"{self.blocks} blocks: {self.scale_diff} scale bytes differ ({self.scale_ties} 4over6 near-ties), "
            f"{self.code_diff} codes differ ({self.code_ties} midpoint ties), {self.violations} violations{v}"
        )


def compare_blocks(
    x: torch.Tensor,
    gs: float | torch.Tensor,
    packed_a: torch.Tensor,
    sf_a: torch.Tensor,
    packed_b: torch.Tensor,
    sf_b: torch.Tensor,
    *,
    four_over_six: bool,
    allow_code_ties: bool,
    rel_tie: float = 1e-6,
) -> SideReport:
    """Compare two encodings ``(packed, sf)`` of ``x [..., head_dim]`` block by block.

    Scale bytes must be equal, except (``four_over_six``) where the two bytes are the two candidates and
    their exact errors are within ``rel_tie``, or (``allow_code_ties``: a fast-math writer against the
    exact reference) where they are adjacent and the exact ``amax / (6 * gs)`` sits within 4 ulps of
    their midpoint; those blocks' codes must each be the exact encoding under their own scale.
    Differing codes in equal-scale blocks are ties when one step apart at a midpoint
    (``allow_code_ties``) and violations otherwise. NaN inputs accept either sign (a GPU multiply
    returns the canonical positive NaN).
    """
    xb = x.reshape(-1, 16)
    pa, pb = packed_a.reshape(-1, 8), packed_b.reshape(-1, 8)
    sa, sb = sf_a.reshape(-1).view(torch.uint8), sf_b.reshape(-1).view(torch.uint8)
    rep = SideReport(blocks=xb.shape[0])
    nan_any = torch.isnan(xb.float()).any(-1)
    if (
        nan_any.any()
    ):  # NaN -> magnitude 0 with either sign: normalize the sign bits of NaN positions
        nanpos = torch.isnan(xb.float())
        pa = _clear_sign(pa, nanpos)
        pb = _clear_sign(pb, nanpos)
    sdiff = sa != sb
    rep.scale_diff = int(sdiff.sum())
    tie_blocks = torch.zeros_like(sdiff)
    if rep.scale_diff:
        idx = torch.nonzero(sdiff).flatten()
        if four_over_six:
            ea, eb = _errors64(xb[idx], sa[idx], gs), _errors64(xb[idx], sb[idx], gs)
            close = (ea - eb).abs() <= rel_tie * torch.maximum(ea.abs(), eb.abs())
        elif allow_code_ties:
            close = _division_ties(xb[idx], sa[idx], sb[idx], gs)
        else:
            close = torch.zeros_like(idx, dtype=torch.bool)
        tie_blocks[idx[close]] = True
        rep.scale_ties = int(close.sum())
        far = idx[~close].tolist()
        rep.violate(
            [f"block {i}: scale 0x{int(sa[i]):02x} vs 0x{int(sb[i]):02x}" for i in far[:16]],
            len(far),
        )
        t = torch.nonzero(tie_blocks).flatten()
        for packed, sfb in ((pa, sa), (pb, sb)):  # each tie block: exact codes under its own scale
            exp = _clear_sign(encode_with_scale(xb[t], sfb[t], gs), torch.isnan(xb[t].float()))
            sub = _classify(xb[t], packed[t], exp, sfb[t], gs, allow_code_ties)
            rep.code_diff += sub.code_diff
            rep.code_ties += sub.code_ties
            rep.violate(sub.examples, sub.violations)
    same = ~sdiff
    sub = _classify(xb[same], pa[same], pb[same], sa[same], gs, allow_code_ties)
    rep.code_diff += sub.code_diff
    rep.code_ties += sub.code_ties
    rep.violate(sub.examples, sub.violations)
    return rep


def _division_ties(x: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, gs) -> torch.Tensor:
    """Scale bytes that differ because of the fast-math division ``amax / (6 * gs)``: adjacent E4M3
    bytes, with the exact quotient within 4 fp32 ulps of their midpoint (``div.approx`` is within 2
    ulps of the quotient, so it may land on either side of a midpoint that close)."""
    xf = torch.nan_to_num(x.double().abs(), nan=0.0)
    xf = torch.where(xf < ref.FLT_MIN_NORMAL, 0.0, xf)
    g = gs if not isinstance(gs, torch.Tensor) else float(gs.reshape(-1)[0])
    q = xf.amax(-1) / (6.0 * g)
    va, vb = ref.e4m3_decode(sa).double(), ref.e4m3_decode(sb).double()
    mid = (va + vb) / 2
    ulp = torch.nextafter(q.float(), torch.tensor(float("inf"))).double() - q.float().double()
    adjacent = (sa.int() - sb.int()).abs() == 1
    return adjacent & ((q - mid).abs() <= 4 * ulp)


def _clear_sign(packed: torch.Tensor, nanpos: torch.Tensor) -> torch.Tensor:
    codes = ref.unpack_nibbles(packed)
    codes = torch.where(nanpos.reshape(codes.shape), codes & 7, codes)
    return ref.pack_nibbles(codes)


def _classify(x, pa, pb, sf, gs, allow_ties) -> SideReport:
    rep = SideReport()
    if pa.numel() == 0 or torch.equal(pa, pb):
        return rep
    r = ref.classify_code_differences(
        x.cpu(), pa.cpu(), pb.cpu(), sf.cpu().unsqueeze(-1), torch.as_tensor(gs).cpu().float()
    )
    rep.code_diff = r.differing
    msgs = [f"code {i}: {a} vs {b} (scaled {s!r})" for (i, a, b, s) in r.violations[:16]]
    if allow_ties:
        rep.code_ties = r.ties
        rep.violate(msgs, len(r.violations))
    else:  # exact arithmetic on both sides: even a midpoint tie is a bug
        rep.violate(
            msgs + [f"{r.ties} midpoint ties (not allowed here)"] * bool(r.ties), r.differing
        )
    return rep


def compare_write(
    key: torch.Tensor,
    value: torch.Tensor,
    slots: torch.Tensor,
    k_scale: float | torch.Tensor,
    v_scale: float | torch.Tensor,
    spec: CacheSpec,
    bufs_expected: list[torch.Tensor],
    bufs_got: list[torch.Tensor],
    *,
    four_over_six: bool,
    allow_code_ties: bool,
) -> SideReport:
    """Compare a write into ``bufs_got`` with the expected one in ``bufs_expected`` (same inputs).

    Identical base buffers pass at once. Otherwise the written rows are classified with
    :func:`compare_blocks`, then the expected rows are copied over the written rows of a copy of
    ``bufs_got``, which must then equal ``bufs_expected`` byte for byte (nothing else was touched).
    """
    if all(torch.equal(a, b) for a, b in zip(bufs_expected, bufs_got, strict=True)):
        n = (
            int(((slots >= 0) & (slots < spec.num_pages * spec.page_size)).sum())
            * spec.heads
            * spec.head_dim
            // 16
            * 2
        )
        return SideReport(blocks=n)
    layout = spec.layout
    ve = normalize_cache(*cache_args(spec, bufs_expected), layout)
    got_copy = clone_all(bufs_got)
    vg = normalize_cache(*cache_args(spec, got_copy), layout)
    valid, page, off, exp_rows = gather_written(ve, slots)
    _, _, _, got_rows = gather_written(vg, slots)
    nnz = slots.shape[0]
    rep = SideReport()
    for (src, gs), (pe, se), (pg, sg) in zip(
        ((key, k_scale), (value, v_scale)), exp_rows, got_rows, strict=True
    ):
        x = src[:nnz][valid.to(src.device)]
        rep.merge(
            compare_blocks(
                x, gs, pg, sg, pe, se, four_over_six=four_over_six, allow_code_ties=allow_code_ties
            )
        )
    for data, sf, (pe, se) in (
        (vg.k_data, vg.k_sf, exp_rows[0]),
        (vg.v_data, vg.v_sf, exp_rows[1]),
    ):
        _token_view(data, layout)[page, off] = pe
        _token_view(sf.view(torch.uint8), layout)[page, off] = se
    for i, (a, b) in enumerate(zip(bufs_expected, got_copy, strict=True)):
        if not torch.equal(a, b):
            n = int((a != b).sum())
            rep.violate([f"base buffer {i}: {n} bytes outside the written rows differ"])
    return rep


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality of two fp16/bf16 tensors, any NaN equal to any NaN."""
    ai, bi = a.view(torch.int16), b.view(torch.int16)
    return bool(((ai == bi) | (torch.isnan(a) & torch.isnan(b))).all())
