"""Shared helpers of the attention tests (test_attention, test_gpu_attention, test_needle).

Every case builds a fresh random NVFP4 cache with the torch reference writer, poisons the output
buffer with NaN, runs one implementation and compares with the float32 reference computed on the
dequantized cache (relative L2 of the output, max abs difference of the LSE).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from nvfp4compat.kernels import get_kernel
from nvfp4compat.kernels import reference_attention as ra

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
REL_L2_TOL = 1e-2
LSE_TOL = 1e-2

IMPLS = [
    pytest.param("triton", id="triton"),
    pytest.param(
        "flashinfer",
        id="flashinfer",
        marks=pytest.mark.skipif(not HAS_CUDA, reason="FlashInfer's FA2 kernels need a CUDA GPU; this machine has none"),
    ),
]


class Recorder:
    """Stands in for a kernel: records that it was launched (``kernel[grid](...)``), runs nothing."""

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def __getitem__(self, grid):
        return lambda *a, **k: self.calls.append(grid)


def random_lens(batch: int, max_len: int, seed: int) -> list[int]:
    """``batch`` random lengths in ``[1, max_len]``, the first one ``max_len`` (seeded)."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, max_len + 1, (batch,), generator=g).tolist()
    lens[0] = max_len
    return lens


def fi_refuses_head_dim_64(impl: str, op: str, head_dim: int, q_len_per_req: int = 1) -> bool:
    """The flashinfer implementation refuses head_dim 64 wherever FlashInfer's FA2 prefill wrapper would
    run (``prefill``, multi-token ``decode``): it misread an NVFP4 cache there on an H200."""
    return impl == "flashinfer" and head_dim == 64 and (op == "prefill" or q_len_per_req > 1)


FI_D64_REFUSAL = "head_dim 64.*triton"


def kernel(op: str, impl: str):
    """The implementation, or a skip naming what is missing (FlashInfer not installed)."""
    try:
        return get_kernel(op, impl)
    except ImportError as exc:
        pytest.skip(f"{impl} implementation unavailable: {exc}")


@dataclass
class Result:
    out: torch.Tensor
    lse: torch.Tensor | None
    ref: torch.Tensor
    ref_lse: torch.Tensor
    case: ra.PagedCase
    query: torch.Tensor
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rel_l2(self) -> float:
        return ra.relative_l2(self.out, self.ref)

    @property
    def lse_err(self) -> float:
        assert self.lse is not None
        return float((self.lse.double() - self.ref_lse.double()).abs().max())

    def check(self, tol: float = REL_L2_TOL) -> None:
        assert torch.isfinite(self.out).all(), "output has NaN/inf (unwritten rows keep the NaN poison)"
        assert self.rel_l2 <= tol, f"relative L2 {self.rel_l2:.3e} > {tol}"
        if self.lse is not None:
            assert torch.isfinite(self.lse).all()
            assert self.lse_err <= LSE_TOL, f"LSE max abs error {self.lse_err:.3e} > {LSE_TOL}"


def run_case(
    impl: str,
    op: str,
    *,
    seq_lens: list[int],
    q_lens: list[int] | None = None,
    q_len_per_req: int = 1,
    num_qo_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 64,
    page_size: int = 16,
    layout: str = "NHD",
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    device: str = DEVICE,
    causal: bool = True,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    use_sinks: bool = False,
    return_lse: bool = False,
    scale_as_tensor: bool = False,
    out_buffer: bool = True,
    strided_query: bool = False,
    case: ra.PagedCase | None = None,
    query: torch.Tensor | None = None,
) -> Result:
    """Build a random case, run ``impl``'s ``op`` and the reference; returns both."""
    g = torch.Generator().manual_seed(seed)
    if case is None:
        case = ra.make_paged_cache(
            seq_lens, num_kv_heads, head_dim, page_size, layout=layout, dtype=dtype, device=device,
            generator=g, scale_as_tensor=scale_as_tensor,
        )
    batch = len(seq_lens)
    if op == "decode":
        qsl = ra.decode_query_start_loc(batch, q_len_per_req, device)
    else:
        assert q_lens is not None
        qsl = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32, device=device)
    num_tokens = int(qsl[-1])
    if query is None:
        if strided_query:
            big = torch.randn(num_tokens, num_qo_heads + 3, head_dim + 8, generator=g).to(dtype).to(device)
            query = big[:, 1 : num_qo_heads + 1, :head_dim]
        else:
            query = torch.randn(num_tokens, num_qo_heads, head_dim, generator=g).to(dtype).to(device)
    sinks = (torch.randn(num_qo_heads, generator=g) * 2).to(device) if use_sinks else None
    sm_scale = head_dim**-0.5
    out = torch.full(query.shape, float("nan"), dtype=dtype, device=device) if out_buffer else None
    fn = kernel(op, impl)
    kwargs: dict[str, Any] = dict(
        sm_scale=sm_scale, kv_layout=case.kv_layout, sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap, sinks=sinks, out=out, return_lse=return_lse,
    )
    if op == "decode":
        res = fn(query, case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens,
                 case.k_scale, case.v_scale, q_len_per_req=q_len_per_req, **kwargs)
    else:
        res = fn(query, case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens, qsl,
                 case.k_scale, case.v_scale, causal=causal, **kwargs)
    o, lse = (res[0], res[1]) if return_lse else (res, None)
    if out is not None:
        assert o.data_ptr() == out.data_ptr(), "the result must be the caller's out buffer"
    ref, ref_lse = ra.paged_attention_reference(
        query, case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens, qsl,
        case.k_scale, case.v_scale, sm_scale=sm_scale, kv_layout=case.kv_layout, causal=causal,
        sliding_window=sliding_window, logits_soft_cap=logits_soft_cap, sinks=sinks,
    )
    return Result(o, lse, ref, ref_lse, case, query)
