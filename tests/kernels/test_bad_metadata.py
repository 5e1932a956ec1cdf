"""Issue 16, the kernel cases of "Found": each one fails on the code before the fix.

Hostile metadata must never read or write outside the kernels' tensors (the outputs and the cache sit
in guard buffers, see ``_guarded.py``); what the kernels then compute is the reference's documented
semantics for such metadata (``reference_attention``'s module docstring), and ``check_errors()`` names
what was wrong. Bad host values are one clear ``ValueError``/``TypeError`` before any launch, and
never leave the writer's error flag set for the next valid call.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from _guarded import close_to, guard_cache, guarded  # noqa: E402

from nvfp4compat.kernels import errors  # noqa: E402
from nvfp4compat.kernels import reference_attention as ra  # noqa: E402
from nvfp4compat.kernels.triton import attention as att  # noqa: E402
from nvfp4compat.kernels.triton import dequant as tdq  # noqa: E402
from nvfp4compat.kernels.triton import write as tap  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BF16 = torch.bfloat16
HQ, HKV, D, PAGE = 4, 2, 64, 16
SM = D**-0.5


@pytest.fixture(autouse=True)
def _clean_flags():
    errors.read_errors(DEVICE)  # whatever an earlier test left
    yield
    errors.read_errors(DEVICE)


def _case(seq_lens, seed=0):
    return ra.make_paged_cache(seq_lens, HKV, D, PAGE, device=DEVICE, generator=torch.Generator().manual_seed(seed))


def _query(n, seed=1):
    return torch.randn(n, HQ, D, generator=torch.Generator().manual_seed(seed)).to(BF16).to(DEVICE)


def _prefill(gc, query, bt, seq_lens, qsl, **kw):
    qg = guarded(query, fill_value=float("nan"))  # a read past query makes the output NaN
    og = guarded(torch.zeros_like(query))
    out, lse = att.prefill(
        qg.t, gc.cache, gc.sf, bt, seq_lens, qsl, gc.case.k_scale, gc.case.v_scale, sm_scale=SM,
        out=og.t, return_lse=True, **kw,
    )  # fmt: skip
    assert og.guards_intact(), "prefill wrote outside out"
    assert gc.untouched(), "prefill wrote into the cache"
    ref, ref_lse = ra.paged_attention_reference(
        query, gc.cache, gc.sf, bt, seq_lens, qsl, gc.case.k_scale, gc.case.v_scale, sm_scale=SM, **kw
    )
    return out, lse, ref, ref_lse


def _decode(gc, query, bt, seq_lens, q_len=1):
    og = guarded(torch.zeros_like(query))
    out, lse = att.decode(
        query, gc.cache, gc.sf, bt, seq_lens, gc.case.k_scale, gc.case.v_scale, sm_scale=SM,
        q_len_per_req=q_len, out=og.t, return_lse=True,
    )  # fmt: skip
    assert og.guards_intact(), "decode wrote outside out"
    assert gc.untouched()
    qsl = ra.decode_query_start_loc(bt.shape[0], q_len, DEVICE)
    ref, ref_lse = ra.paged_attention_reference(
        query, gc.cache, gc.sf, bt, seq_lens, qsl, gc.case.k_scale, gc.case.v_scale, sm_scale=SM
    )
    return out, lse, ref, ref_lse


def _lse_match(lse, ref_lse):
    inf = torch.isinf(ref_lse)
    return torch.equal(torch.isinf(lse), inf) and close_to(lse[~inf], ref_lse[~inf])


# ---- memory safety --------------------------------------------------------------------------------


@pytest.mark.parametrize("last", [7, 40])
def test_prefill_query_start_loc_past_num_tokens_stays_inside_out(last):
    gc = guard_cache(_case([12, 30]))
    query = _query(5)
    qsl = torch.tensor([0, 3, last], dtype=torch.int32, device=DEVICE)
    out, lse, ref, ref_lse = _prefill(gc, query, gc.case.block_table, gc.case.seq_lens, qsl)
    assert close_to(out, ref) and _lse_match(lse, ref_lse)
    with pytest.raises(errors.KernelInputError, match="prefill: query_start_loc had entries outside"):
        errors.check_errors(DEVICE)
    errors.check_errors(DEVICE)  # cleared


def test_prefill_decreasing_query_start_loc_writes_every_row():
    gc = guard_cache(_case([12, 30, 9]))
    query = _query(6)
    qsl = torch.tensor([0, 4, 2, 6], dtype=torch.int32, device=DEVICE)
    out, lse, ref, ref_lse = _prefill(gc, query, gc.case.block_table, gc.case.seq_lens, qsl)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()
    assert torch.equal(ref, torch.zeros_like(ref))
    with pytest.raises(errors.KernelInputError, match="query_start_loc had entries that decrease"):
        errors.check_errors(DEVICE)


def test_prefill_rows_past_query_start_loc_are_zero():
    """A padded batch (vLLM pads num_tokens for CUDA graphs): rows past qsl[-1] belong to nobody."""
    gc = guard_cache(_case([12, 30]))
    query = _query(9)
    qsl = torch.tensor([0, 2, 6], dtype=torch.int32, device=DEVICE)
    out, lse, ref, ref_lse = _prefill(gc, query, gc.case.block_table, gc.case.seq_lens, qsl)
    assert close_to(out, ref) and _lse_match(lse, ref_lse)
    assert torch.equal(out[6:], torch.zeros_like(out[6:])) and torch.isneginf(lse[6:]).all()
    errors.check_errors(DEVICE)  # a valid padded batch reports nothing


@pytest.mark.parametrize("extra", [50, 10_000_000])
def test_decode_seq_lens_past_the_block_table_row_are_clamped(extra):
    gc = guard_cache(_case([20, 33]))
    bt = gc.case.block_table
    seq_lens = gc.case.seq_lens.clone()
    seq_lens[1] = bt.shape[1] * PAGE + extra
    out, lse, ref, ref_lse = _decode(gc, _query(2), bt, seq_lens)
    assert close_to(out, ref) and _lse_match(lse, ref_lse)


@pytest.mark.parametrize("bad_page", ["num_pages", -1, "num_pages+100000"])
@pytest.mark.parametrize("op", ["decode", "prefill"])
def test_out_of_range_block_table_entries_read_nothing(op, bad_page):
    gc = guard_cache(_case([40, 33]))
    bt = gc.case.block_table.clone()
    n = gc.case.num_pages
    bt[0, 1] = {"num_pages": n, -1: -1, "num_pages+100000": n + 100000}[bad_page]
    if op == "decode":
        out, lse, ref, ref_lse = _decode(gc, _query(2), bt, gc.case.seq_lens)
    else:
        qsl = torch.tensor([0, 20, 23], dtype=torch.int32, device=DEVICE)
        out, lse, ref, ref_lse = _prefill(gc, _query(23), bt, gc.case.seq_lens, qsl)
    assert close_to(out, ref) and _lse_match(lse, ref_lse)


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("op", ["decode", "prefill", "decode-prefetch"])
def test_out_of_range_entries_under_fully_visible_tiles_read_nothing(op, splits):
    """Bad page ids far from the sequence end and the causal diagonal: the tiles that read them would
    otherwise run the unmasked path, which trusts its page ids (the scan before it must catch them),
    with the split-KV chunks cut so that one chunk holds a bad page and another does not; also
    through the register double-buffered decode loop (``DecodeConfig.prefetch``)."""
    gc = guard_cache(_case([700, 520]))
    bt = gc.case.block_table.clone()
    bt[0, 5] = gc.case.num_pages + 7
    bt[1, 20] = -1
    prefetch = att.PREFETCH_DECODE_CONFIG if op == "decode-prefetch" else None
    op = op.split("-")[0]
    with att.override_configs(num_splits=splits, decode=prefetch):
        if op == "decode":
            out, lse, ref, ref_lse = _decode(gc, _query(2), bt, gc.case.seq_lens)
        else:
            qsl = torch.tensor([0, 20, 41], dtype=torch.int32, device=DEVICE)
            out, lse, ref, ref_lse = _prefill(gc, _query(41), bt, gc.case.seq_lens, qsl)
    assert close_to(out, ref) and _lse_match(lse, ref_lse)


# ---- host checks before launch --------------------------------------------------------------------


@pytest.mark.parametrize("sm_scale", [0.0, -0.125, 3.5e38, 1e300, float("inf"), float("nan")])
@pytest.mark.parametrize("op", ["decode", "prefill"])
def test_bad_sm_scale_is_a_value_error(op, sm_scale):
    case = _case([20])
    q = _query(1)
    with pytest.raises(ValueError, match="sm_scale must be finite and > 0"):
        if op == "decode":
            att.decode(q, case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens,
                       case.k_scale, case.v_scale, sm_scale=sm_scale)
        else:
            qsl = torch.tensor([0, 1], dtype=torch.int32, device=DEVICE)
            att.prefill(q, case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens, qsl,
                        case.k_scale, case.v_scale, sm_scale=sm_scale)


BAD_SCALES = [1e-45, 1e-39, 3.5e38, 1e300]


@pytest.mark.parametrize("scale", BAD_SCALES)
def test_writer_refuses_scales_outside_fp32_and_the_next_call_works(scale):
    case = _case([20])
    k = torch.randn(3, HKV, D).to(BF16).to(DEVICE)
    slots = torch.tensor([0, 1, 2], dtype=torch.int64, device=DEVICE)
    good = dict(k_scale=0.01, v_scale=0.01)
    tap.append_slot_mapping(k, k.clone(), slots, case.paged_kv_cache, case.kv_cache_sf, **good)  # cached
    for name in ("k_scale", "v_scale"):
        bad = dict(good, **{name: scale})
        with pytest.raises(ValueError, match=f"{name}: the global scale .* is not a normal fp32 number"):
            tap.append_slot_mapping(k, k.clone(), slots, case.paged_kv_cache, case.kv_cache_sf, **bad)
    tap.append_slot_mapping(k, k.clone(), slots, case.paged_kv_cache, case.kv_cache_sf, **good)
    tap.check_scale_errors(DEVICE)  # the flag is clean: the bad calls never launched


@pytest.mark.parametrize("scale", BAD_SCALES)
def test_dequant_and_attention_refuse_scales_outside_fp32(scale):
    case = _case([20])
    outk = torch.zeros(1, 20, HKV, D, dtype=BF16, device=DEVICE)
    with pytest.raises(ValueError, match="not a normal fp32 number"):
        tdq.dequantize_paged(case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens,
                             scale, 1.0, outk, outk.clone())
    with pytest.raises(ValueError, match="not a normal fp32 number"):
        att.decode(_query(1), case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens,
                   scale, case.v_scale, sm_scale=SM)


def test_scale_products_that_overflow_fp32_are_refused():
    case = _case([20])
    with pytest.raises(ValueError, match="sm_scale \\* k_scale .* overflows"):
        att.decode(_query(1), case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens,
                   1e35, case.v_scale, sm_scale=1e5)


@pytest.mark.parametrize("flag", ["no", 1, None, np.bool_(True)])
def test_writer_4over6_must_be_a_bool(flag):
    case = _case([20])
    k = torch.randn(2, HKV, D).to(BF16).to(DEVICE)
    slots = torch.tensor([0, 1], dtype=torch.int64, device=DEVICE)
    with pytest.raises(TypeError, match="nvfp4_4over6 must be True or False"):
        tap.append_slot_mapping(k, k.clone(), slots, case.paged_kv_cache, case.kv_cache_sf, 0.01, 0.01,
                                nvfp4_4over6=flag)


def test_numpy_scalars_are_accepted_as_scales():
    case = _case([20])
    q = _query(1)
    ks, vs = np.float32(case.k_scale), np.float32(case.v_scale)
    out = att.decode(q, case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens, ks, vs,
                     sm_scale=np.float32(SM))
    ref = att.decode(q, case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens,
                     float(ks), float(vs), sm_scale=float(np.float32(SM)))
    assert torch.equal(out, ref)
    k = torch.randn(2, HKV, D).to(BF16).to(DEVICE)
    slots = torch.tensor([40, 41], dtype=torch.int64, device=DEVICE)
    tap.append_slot_mapping(k, k, slots, case.paged_kv_cache, case.kv_cache_sf, np.float32(0.01),
                            np.float64(0.02))
    outk = torch.zeros(1, 20, HKV, D, dtype=BF16, device=DEVICE)
    tdq.dequantize_paged(case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens,
                         np.float32(1.0), np.float32(1.0), outk, outk.clone())


def test_k_and_v_aliasing_one_tensor_are_refused():
    case = _case([20])
    k_data, _ = case.paged_kv_cache
    k_sf, _ = case.kv_cache_sf
    rows = torch.randn(2, HKV, D).to(BF16).to(DEVICE)
    slots = torch.tensor([0, 1], dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="paged_kv_cache: K and V are the same memory"):
        tap.append_slot_mapping(rows, rows, slots, (k_data, k_data), case.kv_cache_sf, 0.01, 0.01)
    with pytest.raises(ValueError, match="kv_cache_sf: K and V are the same memory"):
        att.decode(_query(1), case.paged_kv_cache, (k_sf, k_sf), case.block_table, case.seq_lens,
                   case.k_scale, case.v_scale, sm_scale=SM)
    # the decode fast path must not take an aliased pair for a validated signature
    att.decode(_query(1), case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens,
               case.k_scale, case.v_scale, sm_scale=SM)
    k2, v2 = case.paged_kv_cache
    with pytest.raises(ValueError, match="K and V are the same memory"):
        att.decode(_query(1), (k2, k2), case.kv_cache_sf, case.block_table, case.seq_lens,
                   case.k_scale, case.v_scale, sm_scale=SM)


@pytest.mark.skipif(DEVICE != "cpu", reason="compares a CPU call with a meta-device one")
def test_meta_device_tensors_do_not_skip_validation():
    case = _case([20])
    rows = torch.randn(2, HKV, D).to(BF16)
    slots = torch.tensor([0, 1], dtype=torch.int64)
    tap.append_slot_mapping(rows, rows, slots, case.paged_kv_cache, case.kv_cache_sf, 0.01, 0.01)
    with pytest.raises(ValueError, match="key is on meta"):
        tap.append_slot_mapping(rows.to("meta"), rows, slots, case.paged_kv_cache, case.kv_cache_sf, 0.01, 0.01)
    q = _query(1)
    att.decode(q, case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens, case.k_scale,
               case.v_scale, sm_scale=SM)
    with pytest.raises(ValueError, match="query is on meta"):
        att.decode(q.to("meta"), case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens,
                   case.k_scale, case.v_scale, sm_scale=SM)


# ---- debug mode -----------------------------------------------------------------------------------


def test_debug_mode_names_the_bad_entry(monkeypatch):
    monkeypatch.setenv("NVFP4COMPAT_CHECK_METADATA", "1")
    case = _case([20, 33])
    bt = case.block_table.clone()
    bt[1, 2] = case.num_pages + 5
    with pytest.raises(errors.KernelInputError, match=r"decode: block_table\[1, 2\] = \d+ is outside"):
        att.decode(_query(2), case.paged_kv_cache, case.kv_cache_sf, bt, case.seq_lens, case.k_scale,
                   case.v_scale, sm_scale=SM)
    sl = case.seq_lens.clone()
    sl[0] = 10_000
    with pytest.raises(errors.KernelInputError, match=r"dequant: seq_lens\[0\] = 10000 is outside"):
        outk = torch.zeros(2, 40, HKV, D, dtype=BF16, device=DEVICE)
        tdq.dequantize_paged(case.paged_kv_cache, case.kv_cache_sf, case.block_table, sl, 1.0, 1.0, outk,
                             outk.clone())
    qsl = torch.tensor([0, 4, 2], dtype=torch.int32, device=DEVICE)
    with pytest.raises(errors.KernelInputError, match=r"prefill: query_start_loc\[2\] = 2 is below"):
        att.prefill(_query(4), case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens, qsl,
                    case.k_scale, case.v_scale, sm_scale=SM)
    rows = torch.randn(2, HKV, D).to(BF16).to(DEVICE)
    slots = torch.tensor([-1, case.num_pages * PAGE], dtype=torch.int64, device=DEVICE)
    with pytest.raises(errors.KernelInputError, match=r"write: slot_mapping\[1\] = \d+ is past"):
        tap.append_slot_mapping(rows, rows, slots, case.paged_kv_cache, case.kv_cache_sf, 0.01, 0.01)


def test_writer_and_attention_share_one_flag_and_clear_only_their_bits():
    """The writer's scale bits and prefill's metadata bits live in one flag: check_scale_errors()
    clears only the writer's, check_errors() reports (and clears) the rest."""
    case = _case([20])
    rows = torch.randn(2, HKV, D).to(BF16).to(DEVICE)
    slots = torch.tensor([0, 1], dtype=torch.int64, device=DEVICE)
    nan = torch.tensor([float("nan")], device=DEVICE)
    tap.append_slot_mapping(rows, rows, slots, case.paged_kv_cache, case.kv_cache_sf, nan, 0.01)
    qsl = torch.tensor([0, 9], dtype=torch.int32, device=DEVICE)
    att.prefill(_query(3), case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens, qsl,
                case.k_scale, case.v_scale, sm_scale=SM)
    assert tap.scale_error_flag(DEVICE) is errors.error_flag(DEVICE)
    with pytest.raises(tap.ScaleError, match="k_scale"):
        tap.check_scale_errors(DEVICE)
    with pytest.raises(errors.KernelInputError, match="query_start_loc had entries outside") as exc:
        errors.check_errors(DEVICE)
    assert "k_scale" not in str(exc.value)
    errors.check_errors(DEVICE)
