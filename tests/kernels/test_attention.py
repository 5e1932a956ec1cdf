"""Paged NVFP4 attention, every implementation against the float32 reference on the dequantized cache.

Small shapes: on a CPU-only machine the Triton kernels run under ``TRITON_INTERPRET=1`` (set by
``tests/conftest.py``) and the FlashInfer implementation is skipped; on a GPU both run for real.
Each feature is checked alone and once all together; relative L2 of the output <= 1e-2.
"""

from __future__ import annotations

import pytest
import torch
from _attention_helpers import DEVICE, IMPLS, kernel, run_case

from nvfp4compat.kernels import get_kernel
from nvfp4compat.kernels import reference_attention as ra
from nvfp4compat.kernels.layout import normalize_cache

bf16, fp16 = torch.bfloat16, torch.float16

# (dtype, head_dim, page_size, layout, q_len_per_req, num_qo_heads, num_kv_heads, seq_lens)
DECODE_SHAPES = [
    pytest.param(bf16, 128, 16, "NHD", 1, 8, 2, [1, 37, 100], id="bf16-d128-p16-NHD-q1-g4"),
    pytest.param(fp16, 64, 32, "HND", 1, 4, 4, [64, 5], id="fp16-d64-p32-HND-q1-g1"),
    pytest.param(bf16, 256, 64, "combined-NHD", 3, 8, 2, [3, 70], id="bf16-d256-p64-combinedNHD-q3-g4"),
    pytest.param(fp16, 128, 16, "combined-HND", 8, 2, 2, [8, 33], id="fp16-d128-p16-combinedHND-q8-g1"),
    pytest.param(bf16, 512, 16, "NHD-stacked", 1, 8, 1, [20, 50], id="bf16-d512-p16-stacked-q1-g8"),
    pytest.param(fp16, 64, 16, "HND-stacked", 2, 6, 2, [9, 40], id="fp16-d64-p16-HNDstacked-q2-g3"),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype,head_dim,page_size,layout,q_len,hq,hkv,seq_lens", DECODE_SHAPES)
def test_decode_matches_reference(impl, dtype, head_dim, page_size, layout, q_len, hq, hkv, seq_lens):
    r = run_case(
        impl, "decode", seq_lens=seq_lens, q_len_per_req=q_len, num_qo_heads=hq, num_kv_heads=hkv,
        head_dim=head_dim, page_size=page_size, layout=layout, dtype=dtype, return_lse=True,
    )
    r.check()


FEATURES = [
    pytest.param(dict(sliding_window=9), id="window"),
    pytest.param(dict(sliding_window=1), id="window1"),
    pytest.param(dict(logits_soft_cap=3.0), id="softcap"),
    pytest.param(dict(use_sinks=True), id="sinks"),
    pytest.param(dict(scale_as_tensor=True), id="tensor-scales"),
    pytest.param(dict(out_buffer=False, strided_query=True), id="strided-query-no-out"),
    pytest.param(
        dict(sliding_window=20, logits_soft_cap=5.0, use_sinks=True, scale_as_tensor=True, strided_query=True),
        id="all",
    ),
]


def _expect_sinks_refused(impl: str, features: dict) -> bool:
    return impl == "flashinfer" and features.get("use_sinks", False)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("q_len", [1, 4])
@pytest.mark.parametrize("features", FEATURES)
def test_decode_features(impl, q_len, features):
    kwargs = dict(
        seq_lens=[4, 45, 130], q_len_per_req=q_len, num_qo_heads=4, num_kv_heads=2, head_dim=64,
        page_size=16, dtype=bf16, return_lse=True, seed=q_len, **features,
    )
    if _expect_sinks_refused(impl, features):
        with pytest.raises(NotImplementedError, match="sinks.*triton"):
            run_case(impl, "decode", **kwargs)
        return
    run_case(impl, "decode", **kwargs).check()


@pytest.mark.parametrize("splits,block_n", [(1, 16), (3, 16), (7, 16), (40, 16)])
def test_decode_split_counts(splits, block_n):
    """Every split count (incl. more splits than tiles) gives the same result; merge kernel exercised."""
    from nvfp4compat.kernels.triton import attention as att

    with att.override_configs(decode=att.DecodeConfig(block_n, 4, 1), num_splits=splits):
        r = run_case(
            "triton", "decode", seq_lens=[1, 150, 64], q_len_per_req=2, num_qo_heads=4, num_kv_heads=1,
            head_dim=64, dtype=fp16, return_lse=True, use_sinks=True, sliding_window=70, seed=splits,
        )
    r.check()


# Mixed batches: decode rows (q_len <= 16 // group), chunked-prefill rows and an empty request.
PREFILL_SHAPES = [
    pytest.param(bf16, 64, 16, "NHD", 4, 1, [1, 13, 0, 40, 2], [30, 13, 5, 90, 2], id="bf16-d64-NHD-g4-mixed"),
    pytest.param(fp16, 128, 32, "HND", 2, 2, [33, 3], [33, 80], id="fp16-d128-HND-g1"),
    pytest.param(bf16, 256, 64, "combined-HND", 6, 2, [17, 1], [100, 64], id="bf16-d256-combinedHND-g3"),
    pytest.param(fp16, 64, 16, "combined-NHD", 8, 1, [24], [24], id="fp16-d64-combinedNHD-g8-single"),
    pytest.param(bf16, 512, 16, "HND-stacked", 2, 1, [9, 2], [20, 30], id="bf16-d512-stacked-g2"),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype,head_dim,page_size,layout,hq,hkv,q_lens,seq_lens", PREFILL_SHAPES)
def test_prefill_matches_reference(impl, causal, dtype, head_dim, page_size, layout, hq, hkv, q_lens, seq_lens):
    r = run_case(
        impl, "prefill", seq_lens=seq_lens, q_lens=q_lens, num_qo_heads=hq, num_kv_heads=hkv,
        head_dim=head_dim, page_size=page_size, layout=layout, dtype=dtype, causal=causal, return_lse=True,
    )
    r.check()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("features", FEATURES)
def test_prefill_features(impl, causal, features):
    kwargs = dict(
        seq_lens=[50, 7, 90], q_lens=[50, 2, 21], num_qo_heads=4, num_kv_heads=2, head_dim=64,
        page_size=16, dtype=fp16, causal=causal, return_lse=True, **features,
    )
    if _expect_sinks_refused(impl, features):
        with pytest.raises(NotImplementedError, match="sinks.*triton"):
            run_case(impl, "prefill", **kwargs)
        return
    run_case(impl, "prefill", **kwargs).check()


def test_prefill_single_short_request_runs_decode_path():
    """One request with q_len <= 16 // group: only the split-KV kernel runs (host knows q_len)."""
    run_case("triton", "prefill", seq_lens=[77], q_lens=[3], num_qo_heads=8, num_kv_heads=2,
             return_lse=True, use_sinks=True).check()


def test_page_size_not_power_of_two():
    """vLLM hybrid models use page sizes like 48: the kernels divide instead of shifting."""
    run_case("triton", "decode", seq_lens=[100, 47], page_size=48, return_lse=True).check()
    run_case("triton", "prefill", seq_lens=[100, 47], q_lens=[60, 1], page_size=48).check()


def test_decode_and_prefill_agree():
    """decode(q_len_per_req=q) and prefill(qsl = arange * q) are the same computation."""
    dec = run_case("triton", "decode", seq_lens=[40, 61], q_len_per_req=3, return_lse=True, seed=5)
    pre = run_case("triton", "prefill", seq_lens=[40, 61], q_lens=[3, 3], return_lse=True,
                   case=dec.case, query=dec.query)
    assert ra.relative_l2(dec.out, pre.out) <= 5e-3
    assert float((dec.lse - pre.lse).abs().max()) <= 1e-3


def test_registry_routes_to_the_triton_module():
    for op in ("decode", "prefill"):
        fn = get_kernel(op, "triton")
        assert fn.__module__ == "nvfp4compat.kernels.triton.attention"
        assert fn.__name__ == op


def test_choose_num_splits_heuristic():
    from nvfp4compat.kernels.triton.attention import choose_num_splits

    # Few (request, kv head) pairs and a long context: split so one wave (4 programs x 132 SMs) is full.
    assert choose_num_splits(8, 8, 32768, 64, 132) == 8
    # Enough pairs to fill the wave: no split, the merge kernel is skipped.
    assert choose_num_splits(64, 8, 4096, 64, 132) == 1
    assert choose_num_splits(512, 8, 4096, 64, 132) == 1
    # Short context: at least SPLIT_MIN_TILES tiles per split.
    assert choose_num_splits(1, 8, 1024, 64, 132) == 4
    assert choose_num_splits(1, 1, 64, 64, 132) == 1


def _cache(layout="NHD", head_dim=64):
    return ra.make_paged_cache([20], 2, head_dim, 16, layout=layout, device=DEVICE,
                               generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    "mutate,exc,match",
    [
        (lambda a: a.update(query=a["query"].float()), TypeError, "float16 or torch.bfloat16"),
        (lambda a: a.update(query=a["query"][..., :32]), ValueError, "head_dim=64"),
        (lambda a: a.update(query=a["query"][:, :3]), ValueError, "multiple of num_kv_heads"),
        (lambda a: a.update(block_table=a["block_table"].long()), TypeError, "block_table must be an int32"),
        (lambda a: a.update(seq_lens=a["seq_lens"][:0]), ValueError, "seq_lens must be a contiguous"),
        (lambda a: a.update(k_scale=-1.0), ValueError, "finite and > 0"),
        (lambda a: a.update(sliding_window=0), ValueError, "sliding_window"),
        (lambda a: a.update(logits_soft_cap=-2.0), ValueError, "logits_soft_cap"),
        (lambda a: a.update(sinks=torch.zeros(3, device=DEVICE)), ValueError, "sinks must be a float32"),
        (lambda a: a.update(out=torch.empty(1, 4, 64, device=DEVICE)), ValueError, "out must be"),
        (lambda a: a.update(q_len_per_req=2), ValueError, "batch \\* q_len_per_req"),
        (lambda a: a.update(kv_layout="NDH"), ValueError, "kv_layout"),
    ],
)
def test_decode_rejects_bad_arguments(mutate, exc, match):
    case = _cache()
    args = dict(
        query=torch.randn(1, 4, 64, device=DEVICE).to(bf16), paged_kv_cache=case.paged_kv_cache,
        kv_cache_sf=case.kv_cache_sf, block_table=case.block_table, seq_lens=case.seq_lens,
        k_scale=case.k_scale, v_scale=case.v_scale, sm_scale=0.125, kv_layout=case.kv_layout,
    )
    mutate(args)
    with pytest.raises(exc, match=match):
        kernel("decode", "triton")(**args)


def test_prefill_rejects_bad_query_start_loc():
    case = _cache()
    q = torch.randn(5, 4, 64, device=DEVICE).to(bf16)
    with pytest.raises(ValueError, match="query_start_loc must be an int32 tensor"):
        kernel("prefill", "triton")(q, case.paged_kv_cache, case.kv_cache_sf, case.block_table,
                                    case.seq_lens, torch.tensor([0, 5], device=DEVICE), case.k_scale,
                                    case.v_scale, sm_scale=0.125)


def test_decode_padding_entries_with_zero_length():
    """vLLM pads CUDA-graph batches with seq_len 0 requests: their rows come out 0, never NaN."""
    r = run_case("triton", "decode", seq_lens=[0, 50, 0], return_lse=True, use_sinks=True)
    assert torch.isfinite(r.out).all()
    assert (r.out[[0, 2]] == 0).all()
    assert ra.relative_l2(r.out[1], r.ref[1]) <= 1e-2
    assert float((r.lse[1] - r.ref_lse[1]).abs().max()) <= 1e-2
    # with sinks the softmax has one term, so the padded rows' LSE is the sink itself
    assert torch.isfinite(r.lse).all()


def test_unaligned_cache_views():
    """Cache views at odd byte offsets take the byte-load paths (no 32-bit scale words)."""
    from nvfp4compat.kernels.triton import attention as att

    base = run_case("triton", "decode", seq_lens=[70, 9], return_lse=True, seed=3)
    c = base.case

    def shifted(t: torch.Tensor, offset: int) -> torch.Tensor:
        raw = torch.zeros(t.numel() + offset, dtype=torch.uint8, device=t.device)
        view = raw[offset:].view(t.shape)
        view.copy_(t.view(torch.uint8))
        return view.view(t.dtype)

    data = tuple(shifted(t, 8) for t in c.paged_kv_cache)
    sf = tuple(shifted(t, 1) for t in c.kv_cache_sf)
    launch = att._cache_launch(normalize_cache(data, sf, "NHD"))
    assert (launch.data_align, launch.sf_align) == (8, 1)
    out = kernel("decode", "triton")(base.query, data, sf, c.block_table, c.seq_lens, c.k_scale, c.v_scale,
                                      sm_scale=64**-0.5)
    assert ra.relative_l2(out, base.ref) <= 1e-2
