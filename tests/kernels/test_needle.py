"""Needle retrieval at the attention level, through the NVFP4 cache and through bf16.

One key per request is planted at a random position among ``L`` random keys, aligned with the query
(its logit stands ``MARGIN`` above the log of the context length); its value is a random vector.
Retrieval succeeds when the attention output has cosine >= 0.99 with the planted value. The NVFP4
path (write with the reference codec, read with an implementation) must succeed exactly as often as
float32 attention over the bf16 keys and values, and here that is always. A negative control reads
the cache through a shuffled block table (pages of other requests): retrieval must then fail.

CPU: L = 2K and 8K under the Triton interpreter. GPU tier (``-m gpu``): L = 2K, 8K, 32K and 128K with
every implementation.
"""

from __future__ import annotations

import math

import pytest
import torch
from _attention_helpers import DEVICE, HAS_CUDA, IMPLS, kernel

from nvfp4compat.kernels import reference_attention as ra

HEAD_DIM = 128
NUM_KV_HEADS = 2
GROUP = 4
PAGE = 16
COSINE = 0.99
# Logit of the needle above log(L): the needle holds > 99.9% of the softmax mass in bf16.
MARGIN = 9.0


def _needle_batch(seq_len: int, trials: int, seed: int, device: str):
    """Random keys/values per request with one planted (key, value) per KV head, and aligned queries."""
    g = torch.Generator().manual_seed(seed)
    hq = NUM_KV_HEADS * GROUP
    keys, values, queries, needles, positions = [], [], [], [], []
    for _ in range(trials):
        k = torch.randn(seq_len, NUM_KV_HEADS, HEAD_DIM, generator=g)
        v = torch.randn(seq_len, NUM_KV_HEADS, HEAD_DIM, generator=g)
        pos = int(torch.randint(0, seq_len, (1,), generator=g))
        q = torch.randn(hq, HEAD_DIM, generator=g)
        q = q / q.norm(dim=-1, keepdim=True) * math.sqrt(HEAD_DIM)
        # sm_scale = D^-1/2, |q| = sqrt(D): a key alpha * q_dir has logit alpha. Align the needle with
        # the mean query direction of each KV head's group.
        for h in range(NUM_KV_HEADS):
            qd = q[h * GROUP : (h + 1) * GROUP].mean(0)
            qd = qd / qd.norm()
            # the group's queries are random, so each sees about alpha / sqrt(GROUP) of the needle;
            # plant the same needle query for the whole group instead.
            q[h * GROUP : (h + 1) * GROUP] = qd * math.sqrt(HEAD_DIM)
            k[pos, h] = qd * (math.log(seq_len) + MARGIN)
        keys.append(k.to(torch.bfloat16))
        values.append(v.to(torch.bfloat16))
        queries.append(q)
        needles.append(v[pos].to(torch.bfloat16).float())
        positions.append(pos)
    query = torch.stack(queries).to(torch.bfloat16).to(device)  # [trials, hq, d]
    return keys, values, query, torch.stack(needles).to(device), positions


def _retrieved(out: torch.Tensor, needles: torch.Tensor) -> torch.Tensor:
    """Per (trial, q head): cosine(out, planted value of its KV head) >= COSINE."""
    o = out.float().view(out.shape[0], NUM_KV_HEADS, GROUP, HEAD_DIM)
    n = needles[:, :, None, :].expand_as(o)
    return torch.nn.functional.cosine_similarity(o, n, dim=-1) >= COSINE


def _run_needle(impl: str, seq_len: int, trials: int, seed: int, device: str) -> None:
    keys, values, query, needles, _ = _needle_batch(seq_len, trials, seed, device)
    case = ra.make_paged_cache(
        [seq_len] * trials, NUM_KV_HEADS, HEAD_DIM, PAGE, layout="NHD", dtype=torch.bfloat16,
        device=device, keys=keys, values=values, generator=torch.Generator().manual_seed(seed + 1),
    )
    sm_scale = HEAD_DIM**-0.5
    decode = kernel("decode", impl)
    out = decode(query, case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens,
                 case.k_scale, case.v_scale, sm_scale=sm_scale, kv_layout=case.kv_layout)
    qsl = ra.decode_query_start_loc(trials, 1, device)
    bf16_out, _ = ra.attention_reference(
        query, [k.to(device).float() for k in keys], [v.to(device).float() for v in values], qsl,
        sm_scale=sm_scale,
    )
    got_fp4 = _retrieved(out, needles)
    got_bf16 = _retrieved(bf16_out, needles)
    assert got_bf16.all(), f"bf16 attention missed {int((~got_bf16).sum())} needles: the margin is too small"
    assert torch.equal(got_fp4, got_bf16), (
        f"NVFP4 retrieved {int(got_fp4.sum())}/{got_fp4.numel()} needles, bf16 {int(got_bf16.sum())}"
    )

    # Negative control: a block table pointing at other requests' pages must lose the needle.
    shuffled = torch.roll(case.block_table, shifts=1, dims=0)
    wrong = decode(query, case.paged_kv_cache, case.kv_cache_sf, shuffled, case.seq_lens,
                   case.k_scale, case.v_scale, sm_scale=sm_scale, kv_layout=case.kv_layout)
    assert not _retrieved(wrong, needles).any(), "needles retrieved through the wrong pages"


@pytest.mark.parametrize("seq_len", [2048, 8192])
def test_needle_cpu(seq_len):
    from nvfp4compat.kernels.triton import attention as att

    # Under the interpreter the cost is per tile: larger tiles keep the 8K case to seconds.
    cfg = att.DecodeConfig(block_n=256, num_warps=4, num_stages=1) if DEVICE == "cpu" else None
    with att.override_configs(decode=cfg):
        _run_needle("triton", seq_len, trials=3, seed=seq_len, device=DEVICE)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("seq_len", [2048, 8192, 32768, 131072])
def test_needle_gpu(impl, seq_len):
    _run_needle(impl, seq_len, trials=8, seed=seq_len + 7, device="cuda")
