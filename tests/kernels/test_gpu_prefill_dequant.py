"""GPU tier of the dequantize-then-attend prefills: ``dequant_fa3`` (the real FlashInfer FA3, SM90) and
``dequant_fa2`` (the real FlashInfer FA2, SM80 and newer).

Run on a GPU with FlashInfer installed: ``pytest -m gpu tests/kernels/test_gpu_prefill_dequant.py``
(each distinct (backend, dtype, head_dim, causal, window, soft-cap) combination JIT-compiles one
FlashInfer module the first time; the FA3 cases skip off SM90). Every case compares against the float32 reference on the dequantized cache:
relative L2 of the output <= 1e-2 and LSE max abs error <= 1e-2 (natural log).
"""

from __future__ import annotations

import pytest
import torch
from _attention_helpers import HAS_CUDA, run_case

from nvfp4compat.kernels.composite import prefill_dequant as mod

bf16, fp16 = torch.bfloat16, torch.float16


def _skip_reason(backend: str) -> str | None:
    if not HAS_CUDA:
        return "needs a CUDA GPU"
    return mod.backend_problem(torch.device("cuda"), backend)


pytestmark = pytest.mark.gpu
IMPLS = [
    pytest.param(
        impl, marks=pytest.mark.skipif(_skip_reason(b) is not None, reason=f"{impl}: {_skip_reason(b)}"), id=impl
    )
    for impl, b in (("dequant_fa3", "fa3"), ("dequant_fa2", "fa2"))
]
ENTRY = {"dequant_fa3": mod.prefill_fa3, "dequant_fa2": mod.prefill_fa2}


# (dtype, head_dim, layout, hq, hkv, seq_lens, q_lens)
SHAPES = [
    pytest.param(bf16, 128, "NHD", 32, 8, [4096, 4096], [4096, 4096], id="bf16-d128-2x4k-prompt"),
    pytest.param(bf16, 128, "NHD", 32, 8, [17408] * 3, [1024] * 3, id="bf16-d128-3x1k-chunks-on-16k"),
    pytest.param(fp16, 64, "HND", 16, 4, [3000, 4096, 37, 2048], [3000, 3, 37, 1], id="fp16-d64-mixed"),
    pytest.param(bf16, 256, "combined-NHD", 16, 2, [1500, 999], [700, 999], id="bf16-d256-combined"),
    pytest.param(fp16, 128, "combined-HND", 8, 8, [2049, 5, 1025], [2049, 5, 100], id="fp16-d128-g1-mixed"),
]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("dtype", "head_dim", "layout", "hq", "hkv", "seq_lens", "q_lens"), SHAPES)
@pytest.mark.parametrize("impl", IMPLS)
def test_matches_reference(impl, causal, dtype, head_dim, layout, hq, hkv, seq_lens, q_lens):
    run_case(
        impl, "prefill", seq_lens=seq_lens, q_lens=q_lens, num_qo_heads=hq, num_kv_heads=hkv,
        head_dim=head_dim, page_size=16, layout=layout, dtype=dtype, causal=causal, return_lse=True,
    ).check()  # fmt: skip


@pytest.mark.parametrize(
    "features",
    [
        pytest.param(dict(sliding_window=500), id="window"),
        pytest.param(dict(logits_soft_cap=30.0), id="softcap"),
        pytest.param(dict(sliding_window=129, logits_soft_cap=30.0, scale_as_tensor=True), id="all-tensor-scales"),
    ],
)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("impl", IMPLS)
def test_features_match_reference(impl, features, causal):
    run_case(
        impl, "prefill", seq_lens=[2100, 60, 900], q_lens=[1000, 4, 900], num_qo_heads=16,
        num_kv_heads=4, head_dim=128, dtype=bf16, causal=causal, return_lse=True, **features,
    ).check()  # fmt: skip


@pytest.mark.parametrize("impl", IMPLS)
def test_groups_under_a_small_cap_and_oversize_requests(monkeypatch, impl):
    """1 MiB of scratch = 1024 tokens at 2 KV heads x 128 x bf16 x K+V: the 3000-token request takes
    the fused Triton prefill, the others are split into several FlashInfer groups; all rows match."""
    monkeypatch.setenv(mod.SCRATCH_ENV, "1")
    res = run_case(
        impl, "prefill", seq_lens=[600, 3000, 500, 400, 300, 20], q_lens=[600, 100, 250, 400, 3, 20],
        num_qo_heads=8, num_kv_heads=2, head_dim=128, dtype=bf16, return_lse=True,
    )  # fmt: skip
    res.check()


@pytest.mark.parametrize("impl", IMPLS)
def test_refused_under_cuda_graph_capture(impl):
    res = run_case(impl, "prefill", seq_lens=[64], q_lens=[64], head_dim=128, return_lse=False)
    case, query = res.case, res.query
    qsl = torch.tensor([0, 64], dtype=torch.int32, device="cuda")
    prefill = ENTRY[impl]
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="CUDA graph capture.*prefill=triton"):  # noqa: SIM117
        with torch.cuda.graph(g):
            prefill(query, case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens, qsl,
                    case.k_scale, case.v_scale, sm_scale=0.1)  # fmt: skip


@pytest.mark.parametrize("impl", IMPLS)
def test_rotated_cache_fused_rotation(impl):
    """A Hadamard-rotated cache (written by the fused Triton writer): the composite's fused rotation
    (the dequantizer un-rotates the scratch, FlashInfer attends over the real K/V), the pre/post wrapper
    and the fused Triton prefill all match the exact attention (float32 query, float32 un-rotated K/V),
    with decode rows in the batch; an unrotated read is far off.

    The LSE bound is wider than the plain tests' 1e-2: a rotated read rounds to bf16 either ``Q H`` (pre/post)
    or the un-rotated K (the fused composite), which moves logits by about 2^-9 relative; with this cache's
    outlier key channels (LSE up to 15) that is 1.6e-2 (pre/post) and 2.6e-2 (fused) against the exact LSE
    in a CPU emulation of this very case. The outputs stay within the usual 1e-2."""
    from nvfp4compat.kernels import reference_attention as ra
    from nvfp4compat.kernels.rotation import hadamard, rotated
    from nvfp4compat.kernels.triton import attention as tri
    from nvfp4compat.kernels.triton import write as trw

    fn = ENTRY[impl]
    g = torch.Generator().manual_seed(11)
    seq_lens, q_lens, hq, hkv, d = [3000, 700, 5, 1500], [1000, 700, 1, 2], 32, 8, 128
    case = ra.make_paged_cache(seq_lens, hkv, d, 16, dtype=bf16, device="cuda", generator=g)
    rotated("write", trw.append_slot_mapping)(
        torch.cat(case.keys), torch.cat(case.values), case.slot_mapping(), case.paged_kv_cache, case.kv_cache_sf,
        case.k_scale, case.v_scale, case.kv_layout,
    )  # fmt: skip
    query = torch.randn(sum(q_lens), hq, d, generator=g).to(bf16).cuda()
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    h = hadamard(d, "cuda").float()
    exact_o, exact_lse = ra.paged_attention_reference(
        query.float() @ h, case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens, qsl,
        case.k_scale, case.v_scale, sm_scale=d**-0.5, kv_layout=case.kv_layout, causal=True,
    )  # fmt: skip
    exact_o = exact_o @ h

    def run(reader):
        return reader(query, case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens, qsl,
                      case.k_scale, case.v_scale, sm_scale=d**-0.5, kv_layout=case.kv_layout, return_lse=True)  # fmt: skip

    for name, reader in (
        ("fused", rotated("prefill", fn)),
        ("pre/post", rotated("prefill", fn, fuse=False)),
        ("fused Triton", rotated("prefill", tri.prefill)),
    ):
        o, lse = run(reader)
        err, lse_err = ra.relative_l2(o, exact_o), float((lse - exact_lse).abs().max())
        print(f"{impl} rotated, {name}: rel L2 {err:.2e}, LSE max abs error {lse_err:.2e} (vs exact)")
        assert err < 1e-2 and lse_err < 4e-2, name
    plain_o, _ = run(fn)
    assert ra.relative_l2(plain_o, exact_o) > 0.1, "an unrotated read of the rotated cache is far off"
