"""Hypothesis fuzzing of the metadata of the four Triton kernels (write, dequant, decode, prefill).

Block tables, ``seq_lens``, ``query_start_loc``, slot mappings and scales are drawn valid and hostile
(negative, past the cache, past the row, decreasing, ``2**31 - 1``, fp32-overflowing or subnormal
scales, NaN device scales). Every output and cache tensor sits inside a guard buffer (``_guarded.py``).
Each call must either raise one of the documented errors (``ValueError``/``TypeError``, before any
launch) or leave every guard byte as it was and return finite values equal to the reference for the
metadata as the kernels define it (``reference_attention``'s docstring: clamped, masked); the device
error flag must name exactly what was hostile.

Small on purpose: CI runs it on one CPU core under ``TRITON_INTERPRET=1`` (seeded, ~20 examples a
kernel, no deadline).
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from _guarded import PAD, close_to, guard_cache, guarded  # noqa: E402
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from nvfp4compat.kernels import errors  # noqa: E402
from nvfp4compat.kernels import reference as codec  # noqa: E402
from nvfp4compat.kernels import reference_attention as ra  # noqa: E402
from nvfp4compat.kernels.layout import FP32_MAX, FP32_MIN_NORMAL  # noqa: E402
from nvfp4compat.kernels.triton import attention as att  # noqa: E402
from nvfp4compat.kernels.triton import dequant as tdq  # noqa: E402
from nvfp4compat.kernels.triton import write as tap  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BF16 = torch.bfloat16
HQ, HKV, D, PAGE = 4, 2, 64, 8
INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)
DOCUMENTED = (ValueError, TypeError)

FUZZ = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

# --- strategies -----------------------------------------------------------------------------------

HOSTILE_FLOATS = [0.0, -1.0, float("nan"), float("inf"), 1e-45, 1e-39, 3.5e38, 1e300]


def rarely(common, rare, one_in: int = 6):
    """``rare`` about once in ``one_in`` draws, else ``common`` (``one_of`` would weigh them alike)."""
    return st.integers(0, one_in - 1).flatmap(lambda i: rare if i == 0 else common)


def scales(good=None):
    """A global scale: mostly a good float (sometimes as a NumPy scalar), else a hostile float."""
    good = st.floats(1e-3, 4.0) if good is None else good
    return rarely(rarely(good, good.map(np.float32), 4), st.sampled_from(HOSTILE_FLOATS), 7)


def scale_ok(x) -> bool:
    return isinstance(x, (float, np.floating)) and FP32_MIN_NORMAL <= float(x) <= FP32_MAX


def index(lo: int, hi: int):
    """Mostly in ``[lo, hi]``, sometimes just outside or at the int32 extremes."""
    return rarely(st.integers(lo, hi), st.sampled_from([lo - 1, hi + 1, hi + 100_000, INT32_MAX, INT32_MIN, -1]), 4)


# --- shared cache ---------------------------------------------------------------------------------

_CASE: dict[str, ra.PagedCase] = {}


def base_case() -> ra.PagedCase:
    """A fixed three-request cache (built once): 5 + 3 + 2 pages of 8 tokens and 3 spare pages."""
    if "c" not in _CASE:
        _CASE["c"] = ra.make_paged_cache(
            [37, 20, 9], HKV, D, PAGE, device=DEVICE, generator=torch.Generator().manual_seed(16)
        )
    return _CASE["c"]


@pytest.fixture(autouse=True)
def _clean_flags():
    errors.read_errors(DEVICE)
    yield
    errors.read_errors(DEVICE)


# --- write ----------------------------------------------------------------------------------------


@FUZZ
@given(
    nnz=st.integers(0, 6),
    slots=st.lists(index(0, 4 * PAGE - 1), min_size=6, max_size=6, unique=True),
    slot_dtype=st.sampled_from([torch.int32, torch.int64]),
    k_scale=scales(),
    v_scale=rarely(scales(), st.sampled_from(["tensor", "nan-tensor"]), 3),
    four=rarely(st.booleans(), st.just("no")),
    seed=st.integers(0, 2**16),
)
def test_fuzz_write(nnz, slots, slot_dtype, k_scale, v_scale, four, seed):
    gen = torch.Generator().manual_seed(seed)
    num_pages = 4
    shape = (num_pages, PAGE, HKV)
    parts = [
        guarded(torch.randint(0, 256, (*shape, w), generator=gen, dtype=torch.uint8).to(DEVICE))
        for w in (D // 2, D // 2, D // 16, D // 16)
    ]
    cache = (parts[0].t, parts[1].t)
    sf = (parts[2].t.view(torch.float8_e4m3fn), parts[3].t.view(torch.float8_e4m3fn))
    rows = torch.randn(nnz + 1, HKV, D, generator=gen).to(BF16).to(DEVICE)
    sm = torch.tensor(slots[:nnz], dtype=torch.int64)
    if slot_dtype == torch.int32:
        sm = sm.clamp(INT32_MIN, INT32_MAX)
    sm = sm.to(slot_dtype).to(DEVICE)
    vs = v_scale
    if v_scale == "tensor":
        vs = torch.tensor([0.02], device=DEVICE)
    elif v_scale == "nan-tensor":
        vs = torch.tensor([float("nan")], device=DEVICE)
    before = [p.t.clone() for p in parts]
    event("slot outside the cache" if any(not 0 <= x < num_pages * PAGE for x in sm.tolist()) else "slots valid")
    if not (scale_ok(k_scale) and (isinstance(vs, torch.Tensor) or scale_ok(vs))) or four == "no":
        with pytest.raises(DOCUMENTED):
            tap.append_slot_mapping(rows, rows.flip(0), sm, cache, sf, k_scale, vs, nvfp4_4over6=four)
        assert all(torch.equal(p.all_bytes(), p.snapshot) for p in parts), "a refused call wrote"
        tap.check_scale_errors(DEVICE)  # and left the flag clean
        event("refused before launch")
        return
    tap.append_slot_mapping(rows, rows.flip(0), sm, cache, sf, k_scale, vs, nvfp4_4over6=four)
    assert all(p.guards_intact() for p in parts), "the writer wrote outside the cache"
    if v_scale == "nan-tensor":
        if nnz:  # (no rows: no launch)
            with pytest.raises(tap.ScaleError, match="v_scale"):
                tap.check_scale_errors(DEVICE)
        return
    tap.check_scale_errors(DEVICE)
    want = [b.clone() for b in before]
    codec.append_slot_mapping(
        rows, rows.flip(0), sm, (want[0], want[1]),
        (want[2].view(torch.float8_e4m3fn), want[3].view(torch.float8_e4m3fn)),
        float(k_scale), vs if isinstance(vs, torch.Tensor) else float(vs), "NHD", nvfp4_4over6=four,
    )  # fmt: skip
    for p, w in zip(parts, want, strict=True):
        assert torch.equal(p.t.view(torch.uint8), w), "written bytes differ from the reference writer"


# --- dequant --------------------------------------------------------------------------------------


@FUZZ
@given(
    batch=st.integers(1, 3),
    max_pages=st.integers(1, 4),
    table=st.lists(index(0, 12), min_size=12, max_size=12),
    seq=st.lists(index(0, 40), min_size=3, max_size=3),
    max_seq_len=st.integers(0, 34),
    k_scale=scales(),
    v_scale=scales(),
)
def test_fuzz_dequant(batch, max_pages, table, seq, max_seq_len, k_scale, v_scale):
    max_seq_len %= max_pages * PAGE + 2  # one value past what the table covers: refused
    case = base_case()
    gc = guard_cache(case)
    bt = torch.tensor(table[: batch * max_pages], dtype=torch.int32).view(batch, max_pages).to(DEVICE)
    seq_lens = torch.tensor(seq[:batch], dtype=torch.int64).clamp(INT32_MIN, INT32_MAX).to(torch.int32)
    seq_lens = seq_lens.to(DEVICE)
    outs = [guarded(torch.full((batch, max_seq_len, HKV, D), -7.25, dtype=BF16, device=DEVICE))
            for _ in range(2)]
    args = (gc.cache, gc.sf, bt, seq_lens, k_scale, v_scale, outs[0].t, outs[1].t)
    if not (scale_ok(k_scale) and scale_ok(v_scale)) or max_pages * PAGE < max_seq_len:
        with pytest.raises(DOCUMENTED):
            tdq.dequantize_paged(*args)
        event("refused before launch")
        return
    event("hostile metadata" if _hostile(bt, seq_lens, case.num_pages) else "valid metadata")
    tdq.dequantize_paged(*args)
    assert all(o.guards_intact() for o in outs) and gc.untouched()
    want = [torch.full((batch, max_seq_len, HKV, D), -7.25, dtype=BF16, device=DEVICE) for _ in range(2)]
    codec.dequantize_paged(gc.cache, gc.sf, bt, seq_lens, float(k_scale), float(v_scale), *want)
    for o, w in zip(outs, want, strict=True):
        assert torch.equal(o.t.view(torch.int16), w.view(torch.int16)), "dequant differs from the reference"


# --- decode and prefill ---------------------------------------------------------------------------


def _hostile(bt: torch.Tensor, seq_lens: torch.Tensor, num_pages: int) -> bool:
    """Whether a request reads a page id outside the cache or has a seq_len outside its row."""
    sl = seq_lens.long().cpu()
    cover = bt.shape[1] * PAGE
    used = torch.arange(bt.shape[1])[None, :] * PAGE < sl.clamp(0, cover)[:, None]
    btc = bt.long().cpu()
    return bool(((sl < 0) | (sl > cover)).any() or (used & ((btc < 0) | (btc >= num_pages))).any())


def _hostile_table(case: ra.PagedCase, batch: int, edits: list[tuple[int, int, int]]) -> torch.Tensor:
    bt = case.block_table[:batch].clone()
    for b, j, v in edits:
        bt[b % batch, j % bt.shape[1]] = max(INT32_MIN, min(INT32_MAX, v))
    return bt


def _seq_lens(values: list[int], batch: int) -> torch.Tensor:
    return torch.tensor(values[:batch], dtype=torch.int64).clamp(INT32_MIN, INT32_MAX).to(torch.int32).to(DEVICE)


def _check(out, lse, ref, ref_lse) -> None:
    assert close_to(out, ref), f"max |out - ref| = {float((out.double() - ref.double()).abs().max()):.3g}"
    inf = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse), inf), "rows without keys must have LSE -inf"
    assert close_to(lse[~inf], ref_lse[~inf])


EDITS = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 4), index(0, 12)), max_size=3)


@FUZZ
@given(
    batch=st.integers(1, 3),
    q_len=st.integers(1, 2),
    edits=EDITS,
    seq=st.lists(index(0, 45), min_size=3, max_size=3),
    sm_scale=rarely(st.one_of(st.just(D**-0.5), st.floats(1e-3, 1.0)), st.sampled_from(HOSTILE_FLOATS)),
    k_scale=scales(st.floats(1e-3, 1e-2)),
    v_scale=scales(st.floats(1e-3, 1e-2)),
)
def test_fuzz_decode(batch, q_len, edits, seq, sm_scale, k_scale, v_scale):
    case = base_case()
    gc = guard_cache(case)
    bt = _hostile_table(case, batch, edits)
    seq_lens = _seq_lens(seq, batch)
    query = torch.randn(batch * q_len, HQ, D, generator=torch.Generator().manual_seed(batch)).to(BF16).to(DEVICE)
    qg = guarded(query, fill_value=float("nan"))
    og = guarded(torch.zeros_like(query))
    kw = dict(sm_scale=sm_scale, q_len_per_req=q_len, out=og.t, return_lse=True)
    if not (scale_ok(k_scale) and scale_ok(v_scale) and 0 < sm_scale <= FP32_MAX and math.isfinite(sm_scale)):
        with pytest.raises(DOCUMENTED):
            att.decode(qg.t, gc.cache, gc.sf, bt, seq_lens, k_scale, v_scale, **kw)
        event("refused before launch")
        return
    event("hostile metadata" if _hostile(bt, seq_lens, case.num_pages) else "valid metadata")
    out, lse = att.decode(qg.t, gc.cache, gc.sf, bt, seq_lens, k_scale, v_scale, **kw)
    assert og.guards_intact() and gc.untouched()
    ref, ref_lse = ra.paged_attention_reference(
        query, gc.cache, gc.sf, bt, seq_lens, ra.decode_query_start_loc(batch, q_len, DEVICE),
        float(k_scale), float(v_scale), sm_scale=sm_scale,
    )  # fmt: skip
    _check(out, lse, ref, ref_lse)


@st.composite
def query_start_locs(draw, batch: int, num_tokens: int):
    """Valid (cumulative query lengths, possibly a padded tail) or hostile (any entries)."""
    if draw(st.booleans()):
        lens = draw(st.lists(st.integers(0, num_tokens), min_size=batch, max_size=batch))
        qsl, total = [0], 0
        for n in lens:
            total = min(total + n, num_tokens)
            qsl.append(total)
        return qsl
    return draw(st.lists(index(0, num_tokens), min_size=batch + 1, max_size=batch + 1))


@FUZZ
@given(data=st.data(), batch=st.integers(1, 3), num_tokens=st.integers(1, 12), edits=EDITS,
       seq=st.lists(index(0, 45), min_size=3, max_size=3), causal=st.booleans(),
       window=st.one_of(st.none(), st.integers(1, 20)), k_scale=scales(st.floats(1e-3, 1e-2)))
def test_fuzz_prefill(data, batch, num_tokens, edits, seq, causal, window, k_scale):
    case = base_case()
    gc = guard_cache(case)
    bt = _hostile_table(case, batch, edits)
    seq_lens = _seq_lens(seq, batch)
    qsl_list = data.draw(query_start_locs(batch, num_tokens))
    qsl = torch.tensor([max(INT32_MIN, min(INT32_MAX, x)) for x in qsl_list], dtype=torch.int32, device=DEVICE)
    query = torch.randn(num_tokens, HQ, D, generator=torch.Generator().manual_seed(num_tokens)).to(BF16).to(DEVICE)
    qg = guarded(query, fill_value=float("nan"))
    og = guarded(torch.zeros_like(query))
    kw = dict(sm_scale=D**-0.5, causal=causal, sliding_window=window)
    if not scale_ok(k_scale):
        with pytest.raises(DOCUMENTED):
            att.prefill(qg.t, gc.cache, gc.sf, bt, seq_lens, qsl, k_scale, case.v_scale, out=og.t, **kw)
        event("refused before launch")
        return
    out, lse = att.prefill(qg.t, gc.cache, gc.sf, bt, seq_lens, qsl, k_scale, case.v_scale, out=og.t,
                           return_lse=True, **kw)
    assert og.guards_intact() and gc.untouched()
    ref, ref_lse = ra.paged_attention_reference(
        query, gc.cache, gc.sf, bt, seq_lens, qsl, float(k_scale), case.v_scale, **kw
    )
    _check(out, lse, ref, ref_lse)
    clamped = [min(max(x, 0), num_tokens) for x in qsl.tolist()]
    bits = 0
    if any(b < a for a, b in zip(clamped, clamped[1:], strict=False)):
        bits |= errors.QSL_DECREASING
    if clamped != qsl.tolist():
        bits |= errors.QSL_OUT_OF_RANGE
    if any(s < 0 or s > bt.shape[1] * PAGE for s in seq_lens.tolist()):
        bits |= errors.SEQ_LENS_OUT_OF_RANGE
    event(f"flag {bits:#x}; " + ("hostile table/seq_lens" if _hostile(bt, seq_lens, case.num_pages) else "valid table"))
    got = sum(errors.read_errors(DEVICE).values())
    assert got == bits, f"error flag {got:#x}, expected {bits:#x}: {errors.describe(bits)}"


def test_guards_cover_both_sides():
    """The guard helper itself: a write just outside the view is seen."""
    g = guarded(torch.zeros(4, 2))
    assert g.guards_intact()
    g.big[PAD + 4, 0] = 1.0
    assert not g.guards_intact()
