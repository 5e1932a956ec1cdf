"""The Hadamard-rotated NVFP4 cache (nvfp4compat.kernels.rotation): math, wrappers, kernels.

The reference codec runs the rotated writer/readers at any size (pre/post torch ops); the Triton
kernels run under ``TRITON_INTERPRET=1`` on small shapes, with the rotation fused into them
(``kv_rotation="hadamard"``) and, for comparison, with the pre/post ops around the same kernel
(``rotated(..., fuse=False)``). The oracles: exact float32 attention on the real (unquantized) K/V
(a rotated write + rotated read must match it within the NVFP4 error), and float32 attention on the
dequantized rotated cache (the fused readers must match it within 1e-2 rel L2); an unrotated read of
a rotated cache must be far off.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

from nvfp4compat.kernels import reference as codec
from nvfp4compat.kernels import reference_attention as ra
from nvfp4compat.kernels.rotation import (
    HEAD_DIMS,
    RotationError,
    fused_rotation,
    fuses_rotation,
    hadamard,
    rotate,
    rotated,
)

bf16 = torch.bfloat16


@pytest.mark.parametrize("n", HEAD_DIMS)
def test_hadamard_is_symmetric_orthogonal_and_normalized(n):
    h = hadamard(n).double()
    assert torch.equal(h, h.T)
    torch.testing.assert_close(h @ h, torch.eye(n, dtype=torch.float64), atol=1e-6, rtol=0)
    assert torch.allclose(h.abs(), torch.full_like(h, 1 / math.sqrt(n)))


@pytest.mark.parametrize("dtype", [torch.float32, bf16])
def test_rotate_is_its_own_inverse_and_keeps_norms(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 3, 128, generator=g).to(dtype)
    y = rotate(x)
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y.float().norm(dim=-1), x.float().norm(dim=-1), rtol=1e-2, atol=0)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(rotate(y).float(), x.float(), atol=tol, rtol=tol)
    # strided input (a view of a wider row) is read correctly
    wide = torch.randn(4, 256, generator=g)
    torch.testing.assert_close(rotate(wide[:, :128]), rotate(wide[:, :128].contiguous()))


@pytest.mark.parametrize("head_dim", [32, 96, 1024])
def test_rotation_refuses_other_head_dims(head_dim):
    with pytest.raises(RotationError, match=r"power-of-two head_dim in \[64, 128, 256, 512\].*got"):
        rotate(torch.zeros(2, head_dim))
    w = rotated("write", codec.append_slot_mapping)
    with pytest.raises(RotationError, match="NVFP4COMPAT_KV_ROTATION"):
        w(torch.zeros(1, 1, head_dim), torch.zeros(1, 1, head_dim), torch.zeros(1, dtype=torch.int64), None, None, 1.0, 1.0)


def test_rotated_refuses_unknown_kind_op_and_double_wrap():
    with pytest.raises(RotationError, match=r"accepted: \['hadamard'\]"):
        rotated("write", codec.append_slot_mapping, "givens")
    with pytest.raises(RotationError, match="unknown op"):
        rotated("append", codec.append_slot_mapping)
    once = rotated("write", codec.append_slot_mapping)
    assert once.kv_rotation == "hadamard" and once.__wrapped__ is codec.append_slot_mapping
    with pytest.raises(RotationError, match="already rotated"):
        rotated("write", once)


def test_rotation_is_exact_without_quantization():
    """(QH)(KH)^T = QK^T and P(VH)H = PV: same output and LSE, float32."""
    g = torch.Generator().manual_seed(1)
    seq = [9, 30]
    q = torch.randn(sum(seq), 4, 64, generator=g)
    keys = [torch.randn(n, 2, 64, generator=g) for n in seq]
    values = [torch.randn(n, 2, 64, generator=g) for n in seq]
    qsl = torch.tensor([0, seq[0], sum(seq)], dtype=torch.int32)
    out, lse = ra.attention_reference(q, keys, values, qsl, sm_scale=0.125)
    out_r, lse_r = ra.attention_reference(
        rotate(q), [rotate(k) for k in keys], [rotate(v) for v in values], qsl, sm_scale=0.125
    )
    torch.testing.assert_close(rotate(out_r), out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse_r, lse, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------- helpers


def _ref_reader(op):
    """The float32 reference reader with the decode/prefill signature (out=, return_lse=)."""

    def read(query, kv, sf, block_table, seq_lens, *args, sm_scale, kv_layout="NHD", q_len_per_req=1,
             causal=True, out=None, return_lse=False, **_):
        if op == "decode":
            qsl = ra.decode_query_start_loc(block_table.shape[0], q_len_per_req, query.device)
            ks, vs = args
        else:
            qsl, ks, vs = args
        o, lse = ra.paged_attention_reference(
            query.float(), kv, sf, block_table, seq_lens, qsl, ks, vs, sm_scale=sm_scale,
            kv_layout=kv_layout, causal=causal,
        )
        o = o.to(query.dtype)
        if out is not None:
            out.copy_(o)
            o = out
        return (o, lse) if return_lse else o

    return read


def _case(seq_lens, hq=4, hkv=2, head_dim=64, page_size=16, seed=0, layout="NHD", dtype=bf16):
    """Real K/V (with outlier channels), a paged cache geometry and the exact decode/prefill oracle."""
    g = torch.Generator().manual_seed(seed)
    case = ra.make_paged_cache(seq_lens, hkv, head_dim, page_size, layout=layout, dtype=dtype, generator=g)
    return case, case.slot_mapping(), g


def _write(case, slots, writer, **kwargs):
    writer(
        torch.cat(case.keys), torch.cat(case.values), slots, case.paged_kv_cache, case.kv_cache_sf,
        case.k_scale, case.v_scale, case.kv_layout, **kwargs,
    )


def _decode(case, reader, query, q_len):
    out = torch.full_like(query, float("nan"))
    res = reader(
        query, case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens, case.k_scale,
        case.v_scale, sm_scale=query.shape[-1] ** -0.5, kv_layout=case.kv_layout, q_len_per_req=q_len,
        out=out, return_lse=True,
    )
    assert res[0] is out
    return res


def _prefill(case, reader, query, qsl):
    return reader(
        query, case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens, qsl,
        case.k_scale, case.v_scale, sm_scale=query.shape[-1] ** -0.5, kv_layout=case.kv_layout,
        return_lse=True,
    )


def _exact(case, query, qsl):
    return ra.attention_reference(
        query.float(), [k.float() for k in case.keys], [v.float() for v in case.values], qsl,
        sm_scale=query.shape[-1] ** -0.5,
    )


# ------------------------------------------------------------------------------ reference codec


@pytest.mark.parametrize("head_dim", [64, 128])
def test_rotated_cache_matches_exact_attention_reference_codec(head_dim):
    seq_lens, q_len, hq = [40, 77], 2, 4
    case, slots, g = _case(seq_lens, hq=hq, head_dim=head_dim)
    # peaked attention (queries aligned with a few keys), as in a trained model
    picks = [case.keys[b][torch.randint(0, n, (q_len,), generator=g)] for b, n in enumerate(seq_lens)]
    anchors = torch.cat(picks).float().repeat_interleave(hq // 2, dim=1)
    query = (0.5 * anchors + torch.randn(anchors.shape, generator=g)).to(bf16)
    qsl = ra.decode_query_start_loc(len(seq_lens), q_len, "cpu")
    exact, exact_lse = _exact(case, query, qsl)

    _write(case, slots, codec.append_slot_mapping)
    plain, plain_lse = _decode(case, _ref_reader("decode"), query, q_len)
    err_plain = ra.relative_l2(plain, exact)

    _write(case, slots, rotated("write", codec.append_slot_mapping))
    rot, rot_lse = _decode(case, rotated("decode", _ref_reader("decode")), query, q_len)
    err_rot = ra.relative_l2(rot, exact)
    unrot, _ = _decode(case, _ref_reader("decode"), query, q_len)  # what the plan refuses to do
    err_unrot = ra.relative_l2(unrot, exact)
    print(f"D={head_dim}: rel L2 plain {err_plain:.4f} rotated {err_rot:.4f} rotated-read-unrotated {err_unrot:.4f}")

    assert err_rot < 1.25 * err_plain, "rotated write + rotated read: within the NVFP4 error"
    assert err_unrot > 3 * err_plain, "an unrotated read of a rotated cache is wrong"
    lse_err = float((rot_lse - exact_lse).abs().max())
    assert lse_err < 2 * float((plain_lse - exact_lse).abs().max()), "the LSE is not rotated"


def _dequant(case, fn, extra=5, dtype=bf16, outputs=None):
    shape = (len(case.keys), max(k.shape[0] for k in case.keys) + extra, *case.keys[0].shape[1:])
    out_k = torch.full(shape, float("nan"), dtype=dtype)
    out_v = torch.full_like(out_k, float("nan"))
    fn(case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens, case.k_scale,
       case.v_scale, out_k, out_v, kv_layout=case.kv_layout)
    k_err = ra.relative_l2(torch.cat([out_k[b, : k.shape[0]] for b, k in enumerate(case.keys)]), torch.cat(case.keys))
    v_err = ra.relative_l2(torch.cat([out_v[b, : v.shape[0]] for b, v in enumerate(case.values)]), torch.cat(case.values))
    for b, k in enumerate(case.keys):
        assert torch.isnan(out_k[b, k.shape[0]:]).all() and torch.isnan(out_v[b, k.shape[0]:]).all(), "unwritten rows untouched"
    if outputs is not None:
        outputs.extend([out_k, out_v])
    return k_err, v_err


def test_rotated_prefill_and_dequant_reference_codec():
    seq_lens, hq, d = [21, 50], 4, 64
    case, slots, g = _case(seq_lens, hq=hq, head_dim=d, seed=3, layout="HND")
    q_lens = [21, 13]
    query = torch.randn(sum(q_lens), hq, d, generator=g).to(bf16)
    qsl = torch.tensor([0, q_lens[0], sum(q_lens)], dtype=torch.int32)
    exact, _ = _exact(case, query, qsl)

    _write(case, slots, codec.append_slot_mapping)
    plain, _ = _prefill(case, _ref_reader("prefill"), query, qsl)
    plain_k, plain_v = _dequant(case, codec.dequantize_paged)
    _write(case, slots, rotated("write", codec.append_slot_mapping))
    rot, _ = _prefill(case, rotated("prefill", _ref_reader("prefill")), query, qsl)
    rot_k, rot_v = _dequant(case, rotated("dequant", codec.dequantize_paged))
    raw_k, _ = _dequant(case, codec.dequantize_paged)
    print(f"prefill rel L2 plain {ra.relative_l2(plain, exact):.4f} rotated {ra.relative_l2(rot, exact):.4f}; "
          f"dequant K {plain_k:.4f} -> {rot_k:.4f}, V {plain_v:.4f} -> {rot_v:.4f}, unrotated K {raw_k:.4f}")
    assert ra.relative_l2(rot, exact) < 1.25 * ra.relative_l2(plain, exact)
    assert rot_k < 1.25 * plain_k, "dequant returns the real K within the NVFP4 error"
    assert rot_v < 1.25 * plain_v, "dequant returns the real V within the NVFP4 error"
    assert raw_k > 5 * plain_k, "a rotated cache dequantized without un-rotating is not K"


# ----------------------------------------------------------------------------- Triton kernels


def _triton_kernels():
    from nvfp4compat.kernels import get_kernel

    try:
        return {op: get_kernel(op, "triton") for op in ("write", "decode", "prefill", "dequant")}
    except ImportError as exc:
        pytest.skip(f"triton implementation unavailable: {exc}")


def test_rotated_triton_kernels_interpreter():
    """Triton writer + decode + prefill + dequant, rotated (fused), against the rotated reference codec."""
    kernels = _triton_kernels()
    assert all(rotated(op, fn).kv_rotation_fused for op, fn in kernels.items()), "the Triton kernels fuse"
    seq_lens, hq, d = [5, 33], 4, 64
    case, slots, g = _case(seq_lens, hq=hq, head_dim=d, seed=5)
    _write(case, slots, rotated("write", codec.append_slot_mapping))
    ref_bytes = [t.clone() for t in case.paged_kv_cache]
    _write(case, slots, rotated("write", kernels["write"]))
    for a, b in zip(case.paged_kv_cache, ref_bytes, strict=True):
        # the fused butterflies and torch's matmul sum in another order: a float32 rounding apart,
        # which can move a bf16 rounding (none does on this data)
        assert torch.equal(a, b), "the fused rotated Triton writer stores the rotated reference bytes"

    query = torch.randn(len(seq_lens), hq, d, generator=g).to(bf16)
    qsl = ra.decode_query_start_loc(len(seq_lens), 1, "cpu")
    exact, _ = _exact(case, query, qsl)
    ref, ref_lse = _decode(case, rotated("decode", _ref_reader("decode")), query, 1)
    tri, tri_lse = _decode(case, rotated("decode", kernels["decode"]), query, 1)
    assert ra.relative_l2(tri, ref) < 1e-2
    assert float((tri_lse - ref_lse).abs().max()) < 1e-2

    pq = torch.randn(8, hq, d, generator=g).to(bf16)
    pqsl = torch.tensor([0, 3, 8], dtype=torch.int32)
    ref_p, _ = _prefill(case, rotated("prefill", _ref_reader("prefill")), pq, pqsl)
    tri_p, _ = _prefill(case, rotated("prefill", kernels["prefill"]), pq, pqsl)
    assert ra.relative_l2(tri_p, ref_p) < 1e-2

    assert _dequant(case, rotated("dequant", kernels["dequant"])) == pytest.approx(
        _dequant(case, rotated("dequant", codec.dequantize_paged)), rel=1e-3
    )


# ------------------------------------------------------------- fused rotation in the Triton kernels


def test_fused_rotation_argument_checks():
    assert fused_rotation("decode", None, 96) is False, "None is a plain cache, any head_dim"
    assert fused_rotation("decode", "hadamard", 128) is True
    with pytest.raises(RotationError, match=r"kv_rotation must be None .* \['hadamard'\], got 'givens'.*Way out"):
        fused_rotation("write", "givens", 128)
    with pytest.raises(RotationError, match="got True"):
        fused_rotation("write", True, 128)
    with pytest.raises(RotationError, match=r"prefill: .*head_dim in \[64, 128, 256, 512\].*got 96"):
        fused_rotation("prefill", "hadamard", 96)


def test_rotated_fuses_only_kernels_that_take_kv_rotation():
    kernels = _triton_kernels()
    for op, fn in kernels.items():
        assert fuses_rotation(fn), op
        w = rotated(op, fn)
        assert w.kv_rotation == "hadamard" and w.kv_rotation_fused and w.__wrapped__ is fn
        assert "kv_rotation" not in __import__("inspect").signature(w).parameters
        pp = rotated(op, fn, fuse=False)
        assert not pp.kv_rotation_fused and "kv_rotation" not in __import__("inspect").signature(pp).parameters
        with pytest.raises(RotationError, match="already rotated"):
            rotated(op, w)
    for op, fn in (("write", codec.append_slot_mapping), ("dequant", codec.dequantize_paged),
                   ("decode", _ref_reader("decode"))):
        assert not fuses_rotation(fn) and not rotated(op, fn).kv_rotation_fused, op
    for fuse in (True, False):  # a pre/post wrapper would rotate twice
        w = rotated("decode", kernels["decode"], fuse=fuse)
        with pytest.raises(RotationError, match="passes kv_rotation itself"):
            w(torch.zeros(1, 4, 64, dtype=bf16), None, None, None, None, 1.0, 1.0, sm_scale=1.0,
              kv_rotation="hadamard")


def test_triton_entry_points_refuse_bad_rotations():
    kernels = _triton_kernels()
    seq_lens, hq, d = [5], 4, 64
    case, slots, g = _case(seq_lens, hq=hq, head_dim=d, seed=2)
    query = torch.randn(1, hq, d, generator=g).to(bf16)
    with pytest.raises(RotationError, match=r"write: kv_rotation must be None .*'hadamard'"):
        _write(case, slots, kernels["write"], kv_rotation="walsh")
    with pytest.raises(RotationError, match=r"decode: kv_rotation must be None"):
        _decode(case, functools.partial(kernels["decode"], kv_rotation="walsh"), query, 1)
    with pytest.raises(RotationError, match=r"prefill: kv_rotation must be None"):
        _prefill(case, functools.partial(kernels["prefill"], kv_rotation=["hadamard"]), query,
                 torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(RotationError, match=r"dequant: kv_rotation must be None"):
        _dequant(case, functools.partial(kernels["dequant"], kv_rotation="Hadamard"))
    # the rotated readers stage the rotated query in `out`: an out aliasing the query is refused,
    # on the validating path and on decode's cached one (first call with a separate out)
    _write(case, slots, rotated("write", kernels["write"]))
    dec = rotated("decode", kernels["decode"])
    args = (case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens, case.k_scale, case.v_scale)
    for _ in range(2):
        q = query.clone()
        dec(q, *args, sm_scale=0.125, out=torch.empty_like(q))
        with pytest.raises(ValueError, match="out must not share memory with query"):
            dec(q, *args, sm_scale=0.125, out=q)
        torch.testing.assert_close(q, query, atol=0, rtol=0)
    with pytest.raises(ValueError, match="prefill: with kv_rotation, out must not share memory"):
        rotated("prefill", kernels["prefill"])(
            q, *args[:4], torch.tensor([0, 1], dtype=torch.int32), *args[4:], sm_scale=0.125, out=q
        )


def _bytes_close(a, b, what):
    """Fused and pre/post writers round the rotated rows to the input dtype from float32 sums taken
    in another order: at most a rare code differs."""
    for x, y in zip(a, b, strict=True):
        frac = (x.view(torch.uint8) != y.view(torch.uint8)).float().mean().item()
        assert frac <= 2e-3, f"{what}: {frac:.4%} of the bytes differ"


@pytest.mark.parametrize("head_dim,dtype,four", [(64, bf16, False), (128, torch.float16, True), (128, bf16, True)])
def test_fused_writer_matches_prepost_writer(head_dim, dtype, four):
    kernels = _triton_kernels()
    seq_lens = [7, 20]
    case, slots, _ = _case(seq_lens, hq=4, hkv=2, head_dim=head_dim, seed=11, dtype=dtype)
    kw = {"nvfp4_4over6": four}
    _write(case, slots, rotated("write", kernels["write"], fuse=False), **kw)
    pp = [t.clone() for t in (*case.paged_kv_cache, *case.kv_cache_sf)]
    pp_deq: list[torch.Tensor] = []
    _dequant(case, rotated("dequant", codec.dequantize_paged), dtype=dtype, outputs=pp_deq)
    _write(case, slots, rotated("write", kernels["write"]), **kw)
    fused = [t.clone() for t in (*case.paged_kv_cache, *case.kv_cache_sf)]
    _bytes_close(fused, pp, f"D={head_dim} {dtype} 4over6={four}")
    fu_deq: list[torch.Tensor] = []
    errs = _dequant(case, rotated("dequant", codec.dequantize_paged), dtype=dtype, outputs=fu_deq)
    for a, b in zip(fu_deq, pp_deq, strict=True):
        valid = ~torch.isnan(b)
        assert ra.relative_l2(a[valid], b[valid]) < 2e-3, "the fused rotated cache decodes as the pre/post one"
    # and it is a rotated cache: the real K/V within the NVFP4 error, un-rotated; far off without
    plain = _dequant(case, codec.dequantize_paged, dtype=dtype)
    assert max(errs) < 0.2 and plain[0] > 5 * errs[0], (errs, plain)
    # the plain writer call with the same signature (the host path's cache) stays plain
    _write(case, slots, kernels["write"], **kw)
    assert _dequant(case, codec.dequantize_paged, dtype=dtype)[0] < 0.2


DECODE_CASES = [
    # head_dim, dtype, hq, hkv, q_len, seq_lens, forced programs per KV head (split into chunks)
    pytest.param(64, bf16, 8, 2, 2, [70, 600], 4, id="d64-bf16-gqa4-q2-split"),
    pytest.param(128, torch.float16, 4, 2, 1, [33, 300], 3, id="d128-fp16-gqa2-split"),
]


@pytest.mark.parametrize("head_dim,dtype,hq,hkv,q_len,seq_lens,splits", DECODE_CASES)
def test_fused_decode_matches_prepost_and_reference(head_dim, dtype, hq, hkv, q_len, seq_lens, splits):
    from nvfp4compat.kernels.triton.attention import override_configs

    kernels = _triton_kernels()
    case, slots, g = _case(seq_lens, hq=hq, hkv=hkv, head_dim=head_dim, seed=7, dtype=dtype)
    _write(case, slots, rotated("write", kernels["write"]))
    query = torch.randn(len(seq_lens) * q_len, hq, head_dim, generator=g).to(dtype)
    ref, ref_lse = _decode(case, rotated("decode", _ref_reader("decode")), query, q_len)
    with override_configs(num_splits=splits):  # several chunks per request: partials + merge
        fused, fused_lse = _decode(case, rotated("decode", kernels["decode"]), query, q_len)
        pp, pp_lse = _decode(case, rotated("decode", kernels["decode"], fuse=False), query, q_len)
        again, _ = _decode(case, rotated("decode", kernels["decode"]), query, q_len)  # cached host path
        plain, _ = _decode(case, kernels["decode"], query, q_len)  # same signature, no rotation
    err_ref, err_pp = ra.relative_l2(fused, ref), ra.relative_l2(fused, pp)
    print(f"decode fused: rel L2 vs reference {err_ref:.2e}, vs pre/post {err_pp:.2e}")
    assert err_ref < 1e-2 and err_pp < 1e-2
    assert torch.equal(again, fused)
    torch.testing.assert_close(fused_lse, pp_lse, atol=1e-4, rtol=0)
    torch.testing.assert_close(fused_lse, ref_lse, atol=1e-2, rtol=0)
    assert ra.relative_l2(plain, ref) > 20 * err_ref, "an unrotated read of the rotated cache is far off"
    # the swapped logits MMA (DecodeConfig.swap_ab) reads the rotated cache alike
    from nvfp4compat.kernels.triton.attention import DecodeConfig

    with override_configs(num_splits=splits, decode=DecodeConfig(16, 4, 1, scale_words=False, swap_ab=True)):
        swapped, swapped_lse = _decode(case, rotated("decode", kernels["decode"]), query, q_len)
    assert ra.relative_l2(swapped, ref) < 1e-2
    torch.testing.assert_close(swapped_lse, ref_lse, atol=1e-2, rtol=0)


PREFILL_CASES = [
    # q_lens: a decode-sized request (the decode kernel inside prefill) and a prefill one
    pytest.param(64, bf16, 4, 2, [1, 19], [40, 19], id="d64-bf16-mixed"),
    pytest.param(128, torch.float16, 2, 1, [12, 3], [12, 70], id="d128-fp16-mixed"),
]


@pytest.mark.parametrize("head_dim,dtype,hq,hkv,q_lens,seq_lens", PREFILL_CASES)
def test_fused_prefill_matches_prepost_and_reference(head_dim, dtype, hq, hkv, q_lens, seq_lens):
    kernels = _triton_kernels()
    case, slots, g = _case(seq_lens, hq=hq, hkv=hkv, head_dim=head_dim, seed=9, dtype=dtype)
    _write(case, slots, rotated("write", kernels["write"]))
    query = torch.randn(sum(q_lens), hq, head_dim, generator=g).to(dtype)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    ref, ref_lse = _prefill(case, rotated("prefill", _ref_reader("prefill")), query, qsl)
    fused, fused_lse = _prefill(case, rotated("prefill", kernels["prefill"]), query, qsl)
    pp, pp_lse = _prefill(case, rotated("prefill", kernels["prefill"], fuse=False), query, qsl)
    plain, _ = _prefill(case, kernels["prefill"], query, qsl)
    err_ref, err_pp = ra.relative_l2(fused, ref), ra.relative_l2(fused, pp)
    print(f"prefill fused: rel L2 vs reference {err_ref:.2e}, vs pre/post {err_pp:.2e}")
    assert err_ref < 1e-2 and err_pp < 1e-2
    torch.testing.assert_close(fused_lse, pp_lse, atol=1e-4, rtol=0)
    torch.testing.assert_close(fused_lse, ref_lse, atol=1e-2, rtol=0)
    assert ra.relative_l2(plain, ref) > 20 * err_ref, "an unrotated read of the rotated cache is far off"


@pytest.mark.parametrize("head_dim,dtype", [(64, torch.float16), (128, bf16)])
def test_fused_dequant_matches_prepost_and_reference(head_dim, dtype):
    kernels = _triton_kernels()
    case, slots, _ = _case([9, 26], hq=4, hkv=2, head_dim=head_dim, seed=13, dtype=dtype, layout="HND")
    _write(case, slots, rotated("write", kernels["write"]))
    outs: dict[str, list[torch.Tensor]] = {k: [] for k in ("fused", "pp", "ref")}
    errs = _dequant(case, rotated("dequant", kernels["dequant"]), dtype=dtype, outputs=outs["fused"])
    _dequant(case, rotated("dequant", kernels["dequant"], fuse=False), dtype=dtype, outputs=outs["pp"])
    _dequant(case, rotated("dequant", codec.dequantize_paged), dtype=dtype, outputs=outs["ref"])
    for other in ("pp", "ref"):
        for a, b in zip(outs["fused"], outs[other], strict=True):
            valid = ~torch.isnan(b)
            # one rounding (fused) against two (dequant, then rotate): a dtype ulp apart at most
            assert ra.relative_l2(a[valid], b[valid]) < 5e-3, other
    raw = _dequant(case, kernels["dequant"], dtype=dtype)
    assert max(errs) < 0.2 and raw[0] > 5 * errs[0], (errs, raw)


@pytest.mark.parametrize("impl", ["dequant_fa3", "dequant_fa2"])
def test_fused_rotation_in_dequant_then_attend_prefill(monkeypatch, impl):
    """``dequant_fa3``/``dequant_fa2`` on a rotated cache: the dequantizer un-rotates the scratch, so the
    attention step (the float32 reference in FlashInfer's place, :func:`attend_backend`) sees the real
    K and V and the query as given; decode rows and a request over the scratch cap take the Triton
    kernels' fused rotation. All rows match the rotated reference reader and the pre/post wrapper."""
    from nvfp4compat.kernels import get_kernel
    from nvfp4compat.kernels.composite import prefill_dequant as mod

    fn = get_kernel("prefill", impl)
    assert fuses_rotation(fn) and rotated("prefill", fn).kv_rotation_fused
    seq_lens, q_lens, hq, d = [40, 9, 70], [12, 1, 20], 4, 64
    case, slots, g = _case(seq_lens, hq=hq, hkv=2, head_dim=d, seed=21)
    _write(case, slots, rotated("write", codec.append_slot_mapping))
    per_token = 2 * 2 * d * 2  # K+V, 2 KV heads, bf16
    monkeypatch.setattr(mod, "scratch_cap_bytes", lambda: 50 * per_token)  # the 70-token request is oversize
    seen: list[torch.Tensor] = []

    def attend(a):
        seen.append(a.q)
        mod.reference_attend(a)

    query = torch.randn(sum(q_lens), hq, d, generator=g).to(bf16)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    ref, ref_lse = _prefill(case, rotated("prefill", _ref_reader("prefill")), query, qsl)
    with mod.attend_backend(attend):
        fused, fused_lse = _prefill(case, rotated("prefill", fn), query, qsl)
        assert len(seen) == 1 and torch.equal(seen[0], query[:12]), "FA attends with the query as given"
        pp, pp_lse = _prefill(case, rotated("prefill", fn, fuse=False), query, qsl)
        plain, _ = _prefill(case, fn, query, qsl)
    err_ref, err_pp = ra.relative_l2(fused, ref), ra.relative_l2(fused, pp)
    print(f"{impl} fused rotation: rel L2 vs reference {err_ref:.2e}, vs pre/post {err_pp:.2e}")
    assert err_ref < 1e-2 and err_pp < 1e-2
    # The fused path rounds the un-rotated K to bf16 in the scratch where the reference rounds Q H:
    # the LSEs (about 4-8 here) differ by a bf16 rounding of the logits, not more.
    lse_err = max(float((fused_lse - other).abs().max()) for other in (ref_lse, pp_lse))
    print(f"{impl} fused rotation: LSE max abs difference {lse_err:.2e}")
    assert lse_err < 3e-2
    assert ra.relative_l2(plain, ref) > 20 * err_ref, "an unrotated read of the rotated cache is far off"
    with pytest.raises(RotationError, match="got 'givens'"):
        _prefill(case, functools.partial(fn, kv_rotation="givens"), query, qsl)
