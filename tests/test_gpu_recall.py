"""GPU tier: needle recall of the shipped recall model through the paged NVFP4 kernels, 2K-8K.

For each implementation (Triton kernels; FlashInfer's writer + FA2 readers) the model runs with its K/V
written into a paged NVFP4 cache and read back by prefill (the prompt) and decode (the second answer
token), at 2048, 4096 and 8192 tokens x 10 depths x ``N_PER_DEPTH`` needles, against dense bf16 on
the same prompts. Target (issue 7): NVFP4 recall within 1 point of bf16 at every length. Global scales
are vLLM's defaults (1.0). Run: ``pytest -m gpu tests/test_gpu_recall.py -s`` (prints the tables).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

MODEL_DIR = Path(__file__).parent / "data" / "recall-model"
LENGTHS = (2048, 4096, 8192)
N_PER_DEPTH = 10  # 100 needles per length: one extra miss is exactly one point
MAX_GAP_POINTS = 1.0
MIN_BF16_RECALL = 0.95
SEED = 7  # the vLLM recall check (nvfp4compat/validation/job.py) uses seed 7 too: same needles


@pytest.fixture(scope="module")
def shipped():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if not (MODEL_DIR / "model.safetensors").is_file():
        pytest.skip(f"{MODEL_DIR} holds no model.safetensors (train it: docs/recall.md)")
    from nvfp4compat.recall.evaluate import load_recall_model

    return load_recall_model(MODEL_DIR, device="cuda")


@pytest.fixture(scope="module")
def bf16_results(shipped):
    from nvfp4compat.recall.evaluate import evaluate_recall

    model, layout = shipped
    res = evaluate_recall(
        model, LENGTHS, ("bf16",), layout=layout, n_per_depth=N_PER_DEPTH, seed=SEED
    )
    return res["bf16"]


@pytest.mark.parametrize(
    "impl, kv_layout, page_size, four_over_six",
    [
        pytest.param("triton", "NHD", 16, False, id="triton-NHD-p16"),
        pytest.param("triton", "HND", 32, True, id="triton-HND-p32-4over6"),
        pytest.param("flashinfer", "NHD", 16, False, id="flashinfer-NHD-p16"),
        pytest.param("flashinfer", "HND", 16, False, id="flashinfer-HND-p16"),
    ],
)
def test_gpu_recall_nvfp4_within_one_point(
    shipped, bf16_results, impl, kv_layout, page_size, four_over_six
):
    from nvfp4compat.kernels import get_kernel
    from nvfp4compat.recall.evaluate import evaluate_recall, format_results, recall_gap

    try:
        for op in ("write", "prefill", "decode"):
            get_kernel(op, impl)
    except ImportError as exc:
        pytest.skip(f"impl {impl!r} unavailable here: {exc}")
    model, layout = shipped
    try:
        res = evaluate_recall(
            model,
            LENGTHS,
            ("nvfp4",),
            impl=impl,
            layout=layout,
            n_per_depth=N_PER_DEPTH,
            seed=SEED,
            page_size=page_size,
            kv_layout=kv_layout,
            nvfp4_4over6=four_over_six,
        )
    except NotImplementedError as exc:  # e.g. 4over6 on a FlashInfer without it
        pytest.skip(str(exc))
    res = {"bf16": bf16_results, **res}
    print("\n" + format_results(res))
    for L, r in bf16_results["recall"].items():
        assert r >= MIN_BF16_RECALL, (
            f"bf16 recall {r:.2%} at {L}: is tests/data/recall-model the trained model?"
        )
    gaps = recall_gap(res, "nvfp4")
    bad = {L: g for L, g in gaps.items() if g > MAX_GAP_POINTS}
    assert not bad, (
        f"NVFP4 ({impl}, {kv_layout}, page {page_size}) loses more than {MAX_GAP_POINTS} pt: {bad}"
    )


def test_gpu_recall_fp8_and_fake_nvfp4(shipped, bf16_results):
    """The kernel-free references on the same prompts: fp8 (e4m3, scale 1) and the NVFP4 reference codec."""
    from nvfp4compat.recall.evaluate import evaluate_recall, format_results, recall_gap

    model, layout = shipped
    res = evaluate_recall(
        model,
        LENGTHS,
        ("fp8-fake", "nvfp4-fake"),
        layout=layout,
        n_per_depth=N_PER_DEPTH,
        seed=SEED,
    )
    res = {"bf16": bf16_results, **res}
    print("\n" + format_results(res))
    for mode in ("fp8-fake", "nvfp4-fake"):
        gaps = recall_gap(res, mode)
        assert max(gaps.values()) <= MAX_GAP_POINTS, f"{mode}: {gaps}"
