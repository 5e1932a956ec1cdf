"""Recall task, torch model and the shipped recall model through the paged NVFP4 kernels (CPU tier).

The task tests are pure Python. The model test runs the shipped model (``tests/data/recall-model/``,
trained by ``scripts/train_recall_model.py``) at a short context: dense bf16 against the paged NVFP4
cache written and read by the Triton kernels (under ``TRITON_INTERPRET=1`` here) and against the
reference codec. The equivalence of :class:`~nvfp4compat.recall.model.RecallLM` with transformers'
``Qwen3ForCausalLM`` is checked by ``scripts/train_recall_model.py --check-hf DIR`` (transformers is
not a test dependency).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from nvfp4compat.recall import task

MODEL_DIR = Path(__file__).parent / "data" / "recall-model"  # issue 7's model (H200-trained, 2K-8K)
CPU_MODEL_DIR = Path(__file__).parent / "data" / "recall-model-cpu"  # CPU-trained CI fixture (<= 320)
LAYOUT = task.VocabLayout()


# ----------------------------------------------------------------------------------------------
# task


def test_layout_ids_and_round_trip():
    lay = LAYOUT
    toks = lay.tokens()
    assert len(toks) == lay.vocab_size and lay.vocab_size % 64 == 0
    assert toks[:3] == list(task.SPECIAL_TOKENS)
    assert toks[lay.key_id(0)] == "k0000" and toks[lay.key_id(lay.n_keys - 1)] == "k4095"
    assert toks[lay.value_id(0)] == "v0000" and toks[lay.value_id(lay.n_values - 1)] == "v4095"
    assert task.VocabLayout.from_vocab({t: i for i, t in enumerate(toks)}) == lay
    small = task.VocabLayout(n_keys=100, n_values=30)
    assert task.VocabLayout.from_vocab({t: i for i, t in enumerate(small.tokens())}) == small


def test_layout_rejects_foreign_vocab():
    vocab = {t: i for i, t in enumerate(LAYOUT.tokens())}
    vocab["k0001"], vocab["k0002"] = vocab["k0002"], vocab["k0001"]
    with pytest.raises(ValueError, match="k0001"):
        task.VocabLayout.from_vocab(vocab)


@pytest.mark.parametrize("context_len", [64, 65, 66, 512, 2048])
def test_needle_prompts_valid(context_len):
    lay = task.VocabLayout(n_keys=512, n_values=512)
    prompts = task.make_needle_prompts(lay, context_len, task.DEPTHS, 2, seed=3)
    assert len(prompts) == 20
    for p in prompts:
        ids, ans, meta = p
        assert len(ids) == context_len
        assert ids[0] == lay.bos_id and ids[-2] == lay.query_id
        key = ids[-1]
        n_triples, n_filler = task.n_context_triples(context_len)
        start = 1 + n_filler
        assert all(lay.is_value_id(t) for t in ids[1:start])
        triples = [ids[start + 3 * i : start + 3 * i + 3] for i in range(n_triples)]
        assert start + 3 * n_triples == context_len - 2
        keys = [t[0] for t in triples]
        firsts = [t[1] for t in triples]
        # the needle key and its first value occur exactly once; the answer is what follows the key
        assert keys.count(key) == 1 and firsts.count(ans[0]) == 1
        at = keys.index(key)
        assert at == meta["needle_triple"] == task.needle_index(meta["depth"], n_triples)
        assert triples[at][1:] == ans and ids[meta["needle_pos"]] == key
        assert meta["distance"] == context_len - 1 - meta["needle_pos"]
        assert all(lay.key_base <= k < lay.value_base for k in keys)
        assert all(lay.is_value_id(t) for tr in triples for t in tr[1:])
        if n_triples <= lay.n_keys:
            assert len(set(keys)) == n_triples and len(set(firsts)) == n_triples


def test_needle_prompts_deterministic_and_independent():
    a = task.make_needle_prompts(LAYOUT, 300, task.DEPTHS, 2, seed=11)
    b = task.make_needle_prompts(LAYOUT, 300, task.DEPTHS, 2, seed=11)
    c = task.make_needle_prompts(LAYOUT, 300, task.DEPTHS, 2, seed=12)
    assert a == b and [p.token_ids for p in a] != [p.token_ids for p in c]
    # a prompt does not depend on which other depths or counts were asked for
    only = task.make_needle_prompts(LAYOUT, 300, [0.7], 1, seed=11)[0]
    assert only == a[2 * 7]


def test_needle_depth_definition():
    assert task.needle_index(0.0, 681) == 0
    assert task.needle_index(0.5, 681) == 340
    assert task.needle_index(0.9, 681) == 612
    with pytest.raises(ValueError, match="depth"):
        task.needle_index(1.5, 10)
    with pytest.raises(ValueError, match="too short"):
        task.n_context_triples(5)


def test_needle_prompts_beyond_key_count():
    """More triples than keys: fillers repeat, the needle's key and first value stay unique."""
    lay = task.VocabLayout(n_keys=16, n_values=16)
    for p in task.make_needle_prompts(lay, 200, [0.0, 0.5], 3, seed=1):
        n_triples, n_filler = task.n_context_triples(200)
        start = 1 + n_filler
        keys = [p.token_ids[start + 3 * i] for i in range(n_triples)]
        firsts = [p.token_ids[start + 3 * i + 1] for i in range(n_triples)]
        assert keys.count(p.token_ids[-1]) == 1 and firsts.count(p.answer_ids[0]) == 1


def test_training_batch_supervision():
    np = pytest.importorskip("numpy")
    lay = task.VocabLayout(n_keys=512, n_values=512)
    b = task.make_training_batch(lay, 6, 700, np.random.default_rng(0), query_prob=0.3)
    again = task.make_training_batch(lay, 6, 700, np.random.default_rng(0), query_prob=0.3)
    assert (b.tokens == again.tokens).all() and (b.sup_index == again.sup_index).all()
    assert b.tokens.shape == (6, 700) and len(b.sup_index) == 2 * len(b.sup_distance) > 100
    flat = b.tokens.reshape(-1)
    assert (flat[b.sup_index + 1] == b.sup_target).all()  # the target is the next token
    for (i, j), d in zip(b.sup_index.reshape(-1, 2), b.sup_distance, strict=True):
        seq, t = divmod(int(i), 700)
        row = b.tokens[seq]
        assert j == i + 1 and row[t - 1] == lay.query_id  # "<q> key" -> v1, then v1 -> v2
        src = t - int(d)
        assert src > 0 and row[src - 1] != lay.query_id  # the stored triple, not an earlier query
        assert (row[src : src + 3] == row[t : t + 3]).all()
    # every query's stored key and first value are unique among the triples of its sequence
    for seq in range(6):
        row = b.tokens[seq]
        queried = {int(row[int(i) % 700]) for i in b.sup_index[::2] if int(i) // 700 == seq}
        stored = [
            int(row[k])
            for k in range(1, 700)
            if lay.key_base <= row[k] < lay.value_base and row[k - 1] != lay.query_id
        ]
        assert all(stored.count(k) == 1 for k in queried)


def test_score_and_exact_match():
    prompts = task.make_needle_prompts(LAYOUT, 64, [0.0, 0.5], 2, seed=0)
    gen = [list(p.answer_ids) for p in prompts]
    gen[1] = [gen[1][0], gen[1][0]]  # second token wrong
    gen[3] = gen[3][:1]  # too short
    sc = task.score(prompts, gen)
    assert sc["table"] == {64: {0.0: 1, 0.5: 1}} and sc["counts"] == {64: {0.0: 2, 0.5: 2}}
    assert sc["recall"][64] == 0.5 and len(sc["misses"]) == 2
    assert task.exact_match([5, 6, 7], [5, 6]) and not task.exact_match([5], [5, 6])


# ----------------------------------------------------------------------------------------------
# torch model


def test_model_parameter_names_are_qwen3():
    torch = pytest.importorskip("torch")
    from nvfp4compat.recall.model import ModelConfig, RecallLM

    cfg = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2)
    names = {k: tuple(v.shape) for k, v in RecallLM(cfg).state_dict().items()}
    want = {"model.embed_tokens.weight": (128, 64), "model.norm.weight": (64,)}
    for i in range(2):
        p = f"model.layers.{i}."
        want |= {
            p + "input_layernorm.weight": (64,),
            p + "post_attention_layernorm.weight": (64,),
            p + "self_attn.q_proj.weight": (8 * 128, 64),
            p + "self_attn.k_proj.weight": (2 * 128, 64),
            p + "self_attn.v_proj.weight": (2 * 128, 64),
            p + "self_attn.o_proj.weight": (64, 8 * 128),
            p + "self_attn.q_norm.weight": (128,),
            p + "self_attn.k_norm.weight": (128,),
            p + "mlp.gate_proj.weight": (96, 64),
            p + "mlp.up_proj.weight": (96, 64),
            p + "mlp.down_proj.weight": (64, 96),
        }
    assert names == want
    assert cfg.n_params() == sum(int(torch.tensor(s).prod()) for s in want.values())
    hf = cfg.to_hf()
    assert hf["architectures"] == ["Qwen3ForCausalLM"] and hf["tie_word_embeddings"] is True
    assert ModelConfig.from_hf(hf) == cfg


def test_model_forward_matches_naive_attention():
    """The dense forward with SDPA equals one with an explicit softmax(QK^T)V (GQA, causal)."""
    torch = pytest.importorskip("torch")
    from nvfp4compat.recall.model import ModelConfig, RecallLM

    cfg = ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=64, num_hidden_layers=2)
    model = RecallLM(cfg)
    model.init_weights(torch.Generator().manual_seed(0), std=0.1)

    def naive(layer, q, k, v, positions):
        rep = q.shape[2] // k.shape[2]
        k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
        T = q.shape[1]
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v)

    ids = torch.randint(0, 96, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = model(ids), model(ids, attn=naive)
    assert (a - b).abs().max() < 1e-4
    # RoPE is relative: shifting every position leaves the logits unchanged, stretching them does not
    with torch.no_grad():
        shifted = model(ids, positions=torch.arange(24) + 7)
        stretched = model(ids, positions=torch.arange(24) * 3)
    assert (a - shifted).abs().max() < 1e-4 and (a - stretched).abs().max() > 1e-3


def test_read_weights_round_trip_and_bad_file(tmp_path):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    from nvfp4compat.recall.model import read_weights

    tensors = {
        "a": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "b": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
    }
    st.save_file(tensors, str(tmp_path / "m.safetensors"))
    back = read_weights(tmp_path / "m.safetensors")
    assert all(
        torch.equal(back[k], tensors[k]) and back[k].dtype == tensors[k].dtype for k in tensors
    )
    raw = (tmp_path / "m.safetensors").read_bytes()
    (tmp_path / "bad.safetensors").write_bytes(raw[:-2])
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        read_weights(tmp_path / "bad.safetensors")


# ----------------------------------------------------------------------------------------------
# the shipped model through the paged NVFP4 kernels (Triton interpreter on the CPU)

CPU_LENGTH = 256
CPU_DEPTHS = (0.0, 0.5, 0.9)
CPU_PER_DEPTH = 2


@pytest.fixture(scope="module", params=[CPU_MODEL_DIR, MODEL_DIR], ids=["cpu-fixture", "issue7"])
def shipped(request):
    model_dir = request.param
    if not (model_dir / "model.safetensors").is_file():
        pytest.skip(
            f"{model_dir} holds no model.safetensors: train it with scripts/train_recall_model.py "
            "(docs/recall.md) and copy the output folder there"
        )
    pytest.importorskip("triton")
    from nvfp4compat.recall.evaluate import load_recall_model

    model, layout = load_recall_model(model_dir, device="cpu")
    return model, layout, model_dir


def test_cpu_fixture_is_shipped():
    """The CI tier always has a model that recalls: the CPU-trained fixture is part of the repo."""
    assert (CPU_MODEL_DIR / "model.safetensors").is_file(), f"{CPU_MODEL_DIR} lost its weights"


def test_shipped_model_card_and_tokenizer(shipped):
    model, layout, model_dir = shipped
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["head_dim"] == 128
    assert cfg["num_attention_heads"] % cfg["num_key_value_heads"] == 0
    assert layout.vocab_size == cfg["vocab_size"]
    assert (model_dir / "model.safetensors").stat().st_size <= 30 * 2**20
    card = (model_dir / "README.md").read_text()
    for needle in ("What it is", "What it is not", "train_recall_model.py", "sha256"):
        assert needle in card


def test_shipped_model_recall_nvfp4_triton(shipped):
    """bf16 dense recall is high at a short context, and the paged NVFP4 path (Triton write, prefill,
    decode) generates exactly what the reference-codec NVFP4 path generates, within one miss of bf16."""
    from nvfp4compat.recall.evaluate import evaluate_recall

    model, layout, _ = shipped
    res = evaluate_recall(
        model,
        [CPU_LENGTH],
        ("bf16", "nvfp4", "nvfp4-fake"),
        impl="triton",
        layout=layout,
        depths=CPU_DEPTHS,
        n_per_depth=CPU_PER_DEPTH,
        seed=5,
        page_size=16,
    )
    n = len(CPU_DEPTHS) * CPU_PER_DEPTH
    bf16 = res["bf16"]["recall"][CPU_LENGTH]
    nv = res["nvfp4"]["recall"][CPU_LENGTH]
    fake = res["nvfp4-fake"]["recall"][CPU_LENGTH]
    print(
        f"recall at {CPU_LENGTH}: bf16 {bf16:.3f}, nvfp4 (triton) {nv:.3f}, nvfp4 (reference codec) {fake:.3f}"
    )
    assert bf16 >= 5 / 6, (
        f"the shipped model recalls only {bf16:.0%} at {CPU_LENGTH} tokens in bf16"
    )
    assert nv >= bf16 - 1 / n - 1e-9
    assert abs(nv - fake) <= 1 / n + 1e-9


def test_shipped_model_recall_rotated_cache(shipped):
    """A Hadamard-rotated NVFP4 cache (kv_rotation, Triton write/prefill/decode wrapped) recalls
    within one miss of bf16."""
    from nvfp4compat.recall.evaluate import evaluate_recall

    model, layout, _ = shipped
    res = evaluate_recall(
        model, [CPU_LENGTH], ("bf16", "nvfp4"), impl="triton", layout=layout, depths=(0.0, 0.9),
        n_per_depth=2, seed=5, kv_rotation="hadamard",
    )
    n = 4
    assert res["nvfp4"]["config"]["kv_rotation"] == "hadamard"
    assert res["nvfp4"]["recall"][CPU_LENGTH] >= res["bf16"]["recall"][CPU_LENGTH] - 1 / n - 1e-9


def test_shipped_model_paged_logits_match_reference_codec(shipped):
    """Prefill + one decode step through the Triton kernels (HND, page 32) against dense attention on
    the reference codec's decoded K/V: the same cache contents, so the logits agree closely."""
    import torch

    from nvfp4compat.recall.evaluate import PagedNvfp4Cache, _fake_quant_attn

    model, layout, _ = shipped
    prompts = task.make_needle_prompts(layout, 96, [0.2, 0.7], 1, seed=9)
    ids = torch.tensor([p.token_ids for p in prompts])
    cache = PagedNvfp4Cache.for_model(
        model,
        batch=2,
        max_len=97,
        device=torch.device("cpu"),
        impl="triton",
        page_size=32,
        kv_layout="HND",
        seed=1,
    )
    fake = _fake_quant_attn("nvfp4-fake", 1.0, 1.0, None)
    with torch.no_grad():
        a = model.logits(model.hidden(ids, attn=cache)[:, -1]).float()
        b = model.logits(model.hidden(ids, attn=fake)[:, -1]).float()
        nxt = a.argmax(-1)
        full = torch.cat([ids, nxt[:, None]], 1)
        a2 = model.logits(model.hidden(nxt[:, None], torch.tensor([96]), attn=cache)[:, -1]).float()
        b2 = model.logits(model.hidden(full, attn=fake)[:, -1]).float()
    for x, y in ((a, b), (a2, b2)):
        rel = float((x - y).norm() / y.norm())
        # per layer the kernels' attention output is within ~0.5% of float32 attention on the same
        # decoded cache (bf16 P and output); two layers and the LM head amplify that a few times
        assert rel < 3e-2, f"paged vs reference-codec logits: relative L2 {rel:.3e}"
        assert torch.equal(x.argmax(-1), y.argmax(-1))


def test_random_prompts_are_not_answered_by_chance(shipped):
    """Negative control: with the needle removed from the context the model cannot answer."""
    from nvfp4compat.recall.model import greedy_generate_dense

    model, layout, _ = shipped
    prompts = task.make_needle_prompts(layout, 128, [0.3], 6, seed=2)
    rng = random.Random(0)
    broken = []
    for p in prompts:
        ids = list(p.token_ids)
        k = p.meta["needle_pos"]
        ids[k] = layout.key_id(rng.randrange(layout.n_keys))
        while ids[k] == ids[-1]:
            ids[k] = layout.key_id(rng.randrange(layout.n_keys))
        broken.append(ids)
    gen = greedy_generate_dense(model, broken, 2)
    hits = sum(task.exact_match(g, p.answer_ids) for g, p in zip(gen, prompts, strict=True))
    assert hits == 0


def test_shipped_model_paged_attention_per_layer(shipped):
    """Each layer's prefill through the Triton kernels (NHD, page 16) against float32 attention on the
    reference codec's decoded K/V, with that layer's real q/k/v: relative L2 below 1e-2 (measured on
    the CPU development model: 0.004; a 10% softmax-scale error gives 0.018-0.026, a 5% v_scale error
    0.047)."""
    import torch

    from nvfp4compat.kernels import reference
    from nvfp4compat.recall.evaluate import PagedNvfp4Cache, _fake_quant_attn
    from nvfp4compat.recall.model import sdpa_attention

    model, layout, _ = shipped
    ids = torch.tensor(
        [p.token_ids for p in task.make_needle_prompts(layout, 80, [0.1, 0.6], 1, seed=4)]
    )
    fake = _fake_quant_attn("nvfp4-fake", 1.0, 1.0, None)
    seen = []

    def record(layer, q, k, v, positions):
        seen.append((layer, q, k, v, positions))
        return fake(layer, q, k, v, positions)

    def decoded(x):
        return reference.dequantize_rows(*reference.quantize_rows(x, 1.0), 1.0)

    with torch.no_grad():
        model.hidden(ids, attn=record)
        cache = PagedNvfp4Cache.for_model(
            model,
            batch=2,
            max_len=80,
            device=torch.device("cpu"),
            impl="triton",
            page_size=16,
            kv_layout="NHD",
            seed=3,
        )
        for layer, q, k, v, positions in seen:
            ref = sdpa_attention(layer, q.float(), decoded(k), decoded(v), positions)
            out = cache(layer, q, k, v, positions).float()
            rel = float((out - ref).norm() / ref.norm())
            assert rel < 1e-2, f"layer {layer}: paged NVFP4 attention off by relative L2 {rel:.3e}"


def test_recall_gap_is_exact_in_points():
    from nvfp4compat.recall.evaluate import recall_gap

    res = {"bf16": {"recall": {8192: 1.0, 2048: 0.98}}, "nvfp4": {"recall": {8192: 0.99, 2048: 0.98}}}
    gaps = recall_gap(res, "nvfp4")
    # one miss in 100 is exactly the 1-point target (unrounded float arithmetic gives 1.0000000000000009)
    assert gaps == {8192: 1.0, 2048: 0.0}
    assert gaps[8192] <= 1.0


def test_recall_reports_progress_per_length(shipped):
    """A long recall run says where it is: one line per (mode, length) as it finishes."""
    from nvfp4compat.recall.evaluate import evaluate_recall

    model, layout, _ = shipped
    lines: list[str] = []
    evaluate_recall(model, [64, CPU_LENGTH], ("bf16",), layout=layout, depths=CPU_DEPTHS[:1], n_per_depth=1,
                    seed=5, progress=lines.append)
    assert len(lines) == 2 and lines[0].startswith("bf16: 64 tokens") and f"{CPU_LENGTH} tokens" in lines[1], lines
