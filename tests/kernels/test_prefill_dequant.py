"""The dequantize-then-attend prefills (``dequant_fa3``, ``dequant_fa2``) on the CPU.

FlashInfer's FA3/FA2 kernels cannot run here: the attention step is replaced by the float32 reference
through the module's documented test hook (:func:`attend_backend`). Everything else is real: the host
plan (decode-row routing, groups under the scratch cap, oversize requests), the Triton paged dequantizer
(under ``TRITON_INTERPRET=1``) writing the scratch, the Triton decode kernel for decode rows and the fused
Triton prefill for requests larger than the cap. The GPU tier (``test_gpu_prefill_dequant.py``) runs
the real FA3 and FA2.
"""

from __future__ import annotations

import pytest
import torch
from _attention_helpers import DEVICE, HAS_CUDA, run_case

from nvfp4compat.kernels import get_kernel
from nvfp4compat.kernels import reference_attention as ra
from nvfp4compat.kernels.composite import prefill_dequant as mod

bf16, fp16 = torch.bfloat16, torch.float16
pytestmark = pytest.mark.skipif(HAS_CUDA, reason="the CPU tier of dequant_fa3/fa2 (GPU tier: test_gpu_prefill_dequant.py)")
IMPLS = ["dequant_fa3", "dequant_fa2"]
ENTRY = {"dequant_fa3": mod.prefill_fa3, "dequant_fa2": mod.prefill_fa2}


class Spy:
    """The reference attention in FlashInfer's place, recording each call's group (host indptrs)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[int], list[int], int]] = []

    def __call__(self, a: mod.AttendArgs) -> None:
        assert a.k.is_contiguous() and a.v.is_contiguous() and a.k.shape[0] == a.kv_indptr[-1]
        assert a.q.shape[0] == a.qo_indptr[-1]
        self.calls.append((list(a.qo_indptr), list(a.kv_indptr), a.q.shape[0]))
        mod.reference_attend(a)


# ------------------------------------------------------------------------------------ host plan


def test_plan_routes_decode_rows_groups_and_oversize():
    # qmax 8: q_len 2, 5 and 3 are decode rows; 0 is skipped; 90 > cap 60 is oversize
    lens = [50, 7, 30, 20, 9, 90, 33]
    q_lens = [20, 2, 30, 12, 0, 21, 3]
    qsl = [0]
    for n in q_lens:
        qsl.append(qsl[-1] + n)
    plan = mod.plan_groups(lens, qsl, 8, 60)
    assert plan.has_decode_rows
    assert plan.oversize == (5,)
    assert [(g.first, g.last) for g in plan.groups] == [(0, 0), (2, 3)]
    g = plan.groups[1]
    assert g.kv_indptr == (0, 30, 50) and g.qo_indptr == (0, 30, 42)
    assert g.runs == ((2, 1, 30), (3, 1, 20))


def test_plan_splits_groups_at_the_cap_and_merges_equal_lengths():
    lens = [16, 16, 16, 16, 8]
    qsl = [0, 16, 32, 48, 64, 72]
    plan = mod.plan_groups(lens, qsl, 1, 40)
    # 16 + 16 + 16 > 40 closes the first group; 16 + 16 + 8 == 40 still fits the second
    assert [(g.first, g.last, g.kv_tokens) for g in plan.groups] == [(0, 1, 32), (2, 4, 40)]
    assert plan.groups[0].runs == ((0, 2, 16),)  # one dequantizer launch for equal lengths
    assert plan.groups[1].runs == ((2, 2, 16), (4, 1, 8))
    assert plan.groups[1].qo_indptr == (0, 16, 32, 40)
    assert not plan.has_decode_rows and plan.oversize == ()
    assert all(g.kv_tokens <= 40 for g in plan.groups)


def test_plan_only_decode_rows():
    plan = mod.plan_groups([40, 41], [0, 1, 2], 4, 100)
    assert plan.has_decode_rows and plan.groups == () and plan.oversize == ()


def test_scratch_cap_env(monkeypatch):
    monkeypatch.delenv(mod.SCRATCH_ENV, raising=False)
    assert mod.scratch_cap_bytes() == mod.DEFAULT_SCRATCH_MB << 20
    monkeypatch.setenv(mod.SCRATCH_ENV, "3")
    assert mod.scratch_cap_bytes() == 3 << 20
    for bad in ("0", "-4", "lots"):
        monkeypatch.setenv(mod.SCRATCH_ENV, bad)
        with pytest.raises(ValueError, match=f"{mod.SCRATCH_ENV}=.*positive integer"):
            mod.scratch_cap_bytes()


# ------------------------------------------------------------------------------- the operation


@pytest.mark.parametrize("impl, name", [("dequant_fa3", "prefill_fa3"), ("dequant_fa2", "prefill_fa2")])
def test_registry_routes_to_the_composite_module(impl, name):
    fn = get_kernel("prefill", impl)
    assert fn.__module__ == "nvfp4compat.kernels.composite.prefill_dequant" and fn.__name__ == name
    with pytest.raises(ValueError, match=f"no '{impl}' implementation"):
        get_kernel("decode", impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_mixed_batch_groups_and_oversize_match_reference(monkeypatch, impl):
    """Decode rows on the decode kernel, two attention groups (one of two requests), one request over the cap on
    the fused Triton prefill: one call, every row written, reference accuracy."""
    per_token = 2 * 2 * 64 * 2  # K+V, 2 KV heads, head_dim 64, bf16
    monkeypatch.setattr(mod, "scratch_cap_bytes", lambda: 60 * per_token)
    fused = []
    real_fused = mod.tri.prefill

    def spy_fused(*args, **kwargs):
        fused.append(args[0].shape[0])
        return real_fused(*args, **kwargs)

    monkeypatch.setattr(mod.tri, "prefill", spy_fused)
    spy = Spy()
    with mod.attend_backend(spy):
        res = run_case(
            impl, "prefill", seq_lens=[50, 7, 30, 20, 90, 33], q_lens=[20, 2, 30, 12, 21, 3],
            num_qo_heads=4, num_kv_heads=2, head_dim=64, return_lse=True, seed=3,
        )  # fmt: skip
    res.check()
    assert [c[1] for c in spy.calls] == [[0, 50], [0, 30, 50]]
    assert fused == [21]


@pytest.mark.parametrize(
    "dtype, features",
    [
        pytest.param(bf16, dict(causal=False, logits_soft_cap=20.0), id="bf16-noncausal-softcap"),
        pytest.param(fp16, dict(causal=True, sliding_window=9), id="fp16-causal-window"),
        pytest.param(bf16, dict(causal=True, scale_as_tensor=True), id="bf16-tensor-scales"),
    ],
)
@pytest.mark.parametrize("impl", IMPLS)
def test_features_match_reference(impl, dtype, features):
    with mod.attend_backend(Spy()):
        run_case(
            impl, "prefill", seq_lens=[40, 6, 25], q_lens=[17, 2, 25], num_qo_heads=4,
            num_kv_heads=2, head_dim=64, dtype=dtype, layout="HND", return_lse=True, **features,
        ).check()  # fmt: skip


@pytest.mark.parametrize("impl", IMPLS)
def test_noncausal_window_keeps_fa2_out(monkeypatch, impl):
    """A sliding window without the causal mask: FA3 attends (the scratch path), FA2 never does (its
    ragged run was wrong there on an H200): the whole call, decode rows included, takes the fused Triton
    prefill, and every row matches the reference."""
    fused = []
    real_fused = mod.tri.prefill

    def spy_fused(*args, **kwargs):
        fused.append((args[0].shape[0], kwargs["causal"], kwargs["sliding_window"]))
        return real_fused(*args, **kwargs)

    monkeypatch.setattr(mod.tri, "prefill", spy_fused)
    spy = Spy()
    with mod.attend_backend(spy):
        run_case(
            impl, "prefill", seq_lens=[40, 6, 25], q_lens=[17, 2, 25], num_qo_heads=4, num_kv_heads=2,
            head_dim=64, layout="HND", return_lse=True, causal=False, sliding_window=9,
        ).check()  # fmt: skip
        if impl == "dequant_fa2":
            assert spy.calls == [] and fused == [(44, False, 9)]
        else:
            assert [c[1] for c in spy.calls] == [[0, 40], [0, 25]] and fused == []
        # the causal window keeps FA2
        fused.clear()
        run_case(
            impl, "prefill", seq_lens=[40], q_lens=[17], num_qo_heads=4, num_kv_heads=2, head_dim=64,
            return_lse=True, causal=True, sliding_window=9,
        ).check()  # fmt: skip
        assert fused == [] and spy.calls[-1][1] == [0, 40]


@pytest.mark.parametrize("impl", IMPLS)
def test_host_lengths_are_used_and_checked(impl):
    prefill = ENTRY[impl]
    case = ra.make_paged_cache([30, 12], 2, 64, 16, device=DEVICE, generator=torch.Generator().manual_seed(1))
    qsl = torch.tensor([0, 20, 32], dtype=torch.int32)
    query = torch.randn(32, 4, 64, generator=torch.Generator().manual_seed(2)).to(bf16)
    args = (query, case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens, qsl,
            case.k_scale, case.v_scale)  # fmt: skip
    spy = Spy()
    with mod.attend_backend(spy):
        # host lengths that differ from the device tensors decide the plan (they are trusted, not re-read)
        prefill(*args, sm_scale=0.125, seq_lens_cpu=torch.tensor([30, 12]),
                    query_start_loc_cpu=torch.tensor([0, 20, 32]))  # fmt: skip
        assert [c[1] for c in spy.calls] == [[0, 30, 42]]
        with pytest.raises(ValueError, match="seq_lens_cpu must be a 1-D CPU tensor of 2"):
            prefill(*args, sm_scale=0.125, seq_lens_cpu=torch.tensor([30]))
        with pytest.raises(ValueError, match="request 1 has seq_len 10, needs q_len 12"):
            prefill(*args, sm_scale=0.125, seq_lens_cpu=torch.tensor([30, 10]))


def _small_args(head_dim: int = 64):
    case = ra.make_paged_cache([20], 2, head_dim, 16, device=DEVICE, generator=torch.Generator().manual_seed(0))
    query = torch.randn(20, 4, head_dim).to(bf16)
    qsl = torch.tensor([0, 20], dtype=torch.int32)
    return (query, case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens, qsl,
            case.k_scale, case.v_scale)  # fmt: skip


def test_refuses_what_fa3_cannot_do_with_the_way_out():
    args = _small_args()
    with pytest.raises(NotImplementedError, match=r"dequant_fa3\): attention sinks.*FA3.*NVFP4COMPAT_IMPL=prefill=triton"):
        mod.prefill_fa3(*args, sm_scale=0.125, sinks=torch.zeros(4))
    with pytest.raises(NotImplementedError, match="head_dim 512.*FA3.*NVFP4COMPAT_IMPL=prefill=triton"):
        mod.prefill_fa3(*_small_args(512), sm_scale=0.125)
    # without the test hook the FA3 step needs a CUDA SM90 GPU
    with pytest.raises(NotImplementedError, match="cpu; FA3 needs a CUDA SM90 GPU.*prefill=triton"):
        mod.prefill_fa3(*args, sm_scale=0.125)


def test_refuses_what_fa2_cannot_do_with_the_way_out():
    args = _small_args()
    with pytest.raises(NotImplementedError, match=r"dequant_fa2\): attention sinks.*FA2.*NVFP4COMPAT_IMPL=prefill=triton"):
        mod.prefill_fa2(*args, sm_scale=0.125, sinks=torch.zeros(4))
    with pytest.raises(NotImplementedError, match=r"head_dim 512.*FA2.*\[64, 128, 256\].*prefill=triton"):
        mod.prefill_fa2(*_small_args(512), sm_scale=0.125)
    # without the test hook the FA2 step needs a CUDA GPU of SM80 or newer
    with pytest.raises(NotImplementedError, match="cpu; FA2 needs a CUDA SM80 or newer GPU.*prefill=triton"):
        mod.prefill_fa2(*args, sm_scale=0.125)


@pytest.mark.parametrize(
    "backend, cc, bad",
    [("fa3", (8, 9), "built for SM90 only"), ("fa3", (12, 0), "built for SM90 only"), ("fa2", (7, 5), "SM80 or newer")],
)
def test_backend_problem_names_the_gpu(monkeypatch, backend, cc, bad):
    """The device check without a GPU: the capability decides before FlashInfer is looked for."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cc)
    problem = mod.backend_problem(torch.device("cuda"), backend)
    assert problem is not None and f"SM{cc[0]}{cc[1]}" in problem and bad in problem
    # an SM the backend runs on gets past the capability check (then FlashInfer's import decides)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0) if backend == "fa3" else (8, 6))
    ok = mod.backend_problem(torch.device("cuda"), backend)
    assert ok is None or "flashinfer" in ok


def test_a_device_scale_is_read_on_the_host_once_per_value(monkeypatch):
    """FlashInfer takes the softmax scale on the host and vLLM's k_scale is a device tensor: each read is a
    stream sync, so it is read once per value, not per layer and step; changed in place (its version moves)
    or replaced by another tensor, it is read again."""
    reads = []
    real_item = torch.Tensor.item

    def counting_item(self):
        reads.append(self.data_ptr())
        return real_item(self)

    monkeypatch.setattr(torch.Tensor, "item", counting_item)
    mod.clear_cache()
    ks = torch.tensor([0.5])
    assert [mod._host_scale(ks) for _ in range(5)] == [0.5] * 5
    assert len(reads) == 1
    ks.fill_(0.25)  # vLLM's calculate_kv_scales writes in place
    assert mod._host_scale(ks) == 0.25 and len(reads) == 2
    other = torch.tensor(2.0)  # another layer's scale
    assert mod._host_scale(other) == 2.0 and mod._host_scale(ks) == 0.25 and len(reads) == 3
    del other  # a new tensor may take a dead one's id: the weak reference tells them apart
    again = torch.tensor(3.0)
    assert mod._host_scale(again) == 3.0 and len(reads) == 4


def test_prefill_scale_read_once_across_calls(monkeypatch):
    """The same k_scale tensor over several prefill calls (layers and steps): one host read."""
    reads = []
    real = mod._host_scale

    def spy(t):
        reads.append(t)
        return real(t)

    item_calls = []
    real_item = torch.Tensor.item

    def counting_item(self):
        item_calls.append(1)
        return real_item(self)

    monkeypatch.setattr(mod, "_host_scale", spy)
    mod.clear_cache()
    with mod.attend_backend(Spy()):
        for _ in range(3):
            run_case(
                "dequant_fa3", "prefill", seq_lens=[40, 25], q_lens=[17, 25], num_qo_heads=4, num_kv_heads=2,
                head_dim=64, scale_as_tensor=True,
            ).check()  # fmt: skip
    assert len(reads) == 3  # every call asked for the host value
    monkeypatch.setattr(torch.Tensor, "item", counting_item)
    ks = reads[-1]
    for _ in range(4):
        real(ks)
    assert item_calls == []  # ... which was already read
