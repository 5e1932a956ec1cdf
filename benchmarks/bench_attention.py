"""Benchmark the fused Triton NVFP4 paged attention against FlashInfer, side by side in one run.

One GPU run (H200: ``python benchmarks/bench_attention.py --json bench_attention.json``) does, per shape
(head_dim 128, 32 query / 8 KV heads, page 16, NHD, bf16 query/output):

* decode B=8 L=32768, B=64 L=4096, B=1 L=1024; prefill B=4 q=kv=4096 causal; a vLLM-style mixed batch
  (4 chunks of 512 queries + 60 decodes, all at 8K context);
* the Triton kernels over a compact sweep of tile configs (BLOCK_N, num_warps, num_stages), of the
  split count around the heuristic, and of the E2M1 decoder (inline PTX vs portable);
* FlashInfer side by side: bf16 tensor-core decode, fp8 e4m3 tensor-core decode, NVFP4 FA2 decode
  (``kv_cache_sf``); bf16 FA3 and FA2 prefill, NVFP4 FA2 prefill. The NVFP4 cache is written by
  FlashInfer's own writer when it has one (0.6.15+), else by ours.

It prints markdown tables: milliseconds (CUDA-graph replay, the way vLLM runs decode, and eager
``do_bench``), the ratio to FlashInfer's bf16 baseline (TC decode / FA3 prefill), GB/s of NVFP4 bytes
read against the 4.3 TB/s device copy ceiling, and the relative L2 error of each output against a
float32 reference (on the dequantized cache for NVFP4, on the bf16/fp8 values otherwise). A last
table names the fastest Triton config per shape and the lines of
``nvfp4compat/kernels/triton/attention.py`` (``_DECODE_CONFIGS``, ``_PREFILL_CONFIGS``,
``DECODE_WIDE_WARPS``, ``SPLIT_TARGET_PROGRAMS_PER_SM``, ``SPLIT_MIN_TILES``) that would pick it.

``--quick`` is a CPU smoke run (tiny shapes, Triton interpreter, no FlashInfer) that CI can afford: it
checks every error against 1e-2 and exits 1 otherwise (timings under the interpreter mean nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import faulthandler
import importlib.util
import json
import math
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

COPY_CEILING_GBS = 4300.0
TOL = 1e-2
_T0 = time.perf_counter()
_WATCHDOG_S = 0.0  # --watchdog-s: seconds one step may take before every thread's stack is printed (0: off)


def progress(msg: str) -> None:
    """One timestamped line on stderr as each step (a shape's set-up, a row) starts, so that a run cut off by a
    time limit says where it was; re-arms the watchdog (``--watchdog-s``), which prints every thread's Python
    stack to stderr, and again each such period, while one step runs longer than that."""
    sys.stderr.write(f"[bench_attention t={time.perf_counter() - _T0:7.1f}s] {msg}\n")
    sys.stderr.flush()
    if _WATCHDOG_S > 0:
        faulthandler.cancel_dump_traceback_later()
        faulthandler.dump_traceback_later(_WATCHDOG_S, repeat=True, file=sys.stderr)


@dataclass(frozen=True)
class Shape:
    name: str
    kind: str  # "decode" | "prefill"
    seq_lens: tuple[int, ...]
    q_lens: tuple[int, ...]
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    target: str = ""


# the issue's decode goals by kind of batch (the catalogue's and --shape's targets)
_DECODE_GOALS = {"uniform": "<= 0.40x FlashInfer bf16 TC decode", "ragged": "<= 0.45x FlashInfer bf16 TC decode",
                 "single": "<= 1.0x FlashInfer bf16 TC decode"}


def _full_shapes() -> list[Shape]:
    # The decode and prefill tables of the performance issues: uniform, ragged and single-request
    # decode batches, GQA 4/5/8, pages of 16 and 32; prompt prefill, chunked prefill, a mixed batch.
    ragged = (1024, 30720, 4096, 16384, 2048, 24576, 8192, 12288)
    ragged40 = tuple(512 + (i * 7919) % 15873 for i in range(40))  # spread 0.5K-16K, fixed
    # spread 0.1K-32K, fixed: a mix whose shares round down badly (on 132 SMs the floor split's longest chunk is 90 tiles, twice the
    # mean; SPLIT_BALANCE_STEPS's 50)
    ragged24 = tuple(128 + (i * 104729) % 32640 for i in range(24))
    dec, rag, one = _DECODE_GOALS["uniform"], _DECODE_GOALS["ragged"], _DECODE_GOALS["single"]
    return [
        Shape("decode 16 x 16K", "decode", (16384,) * 16, (1,) * 16, target=dec),
        Shape("decode 128 x 2K", "decode", (2048,) * 128, (1,) * 128, target=dec),
        Shape("decode ragged 8 x 1K-30K", "decode", ragged, (1,) * 8, target=rag),
        Shape("decode 1 x 8K", "decode", (8192,), (1,), target=one),
        Shape("decode 4 x 32K 40/8 heads page 32", "decode", (32768,) * 4, (1,) * 4, num_qo_heads=40,
              page_size=32, target=dec),
        Shape("decode 32 x 8K 64/8 heads", "decode", (8192,) * 32, (1,) * 32, num_qo_heads=64, target=dec),
        # batches whose length-proportional shares round onto one wave with idle programs
        Shape("decode 64 x 8K", "decode", (8192,) * 64, (1,) * 64, target=dec),
        Shape("decode 48 x 4K 64/8 heads", "decode", (4096,) * 48, (1,) * 48, num_qo_heads=64, target=dec),
        Shape("decode ragged 40 x 0.5K-16K", "decode", ragged40, (1,) * 40, target=dec),
        Shape("decode ragged 24 x 0.1K-32K", "decode", ragged24, (1,) * 24, target=rag),
        Shape("prefill 2 x 8K causal", "prefill", (8192,) * 2, (8192,) * 2, target="<= 0.90x FlashInfer bf16 FA3"),
        Shape("prefill 6 x 1K chunks on 16K", "prefill", (17408,) * 6, (1024,) * 6,
              target="<= 0.90x FlashInfer bf16 FA3"),
        Shape("mixed 2 x 2K chunks + 100 decodes @4K", "prefill", (4096,) * 102, (2048,) * 2 + (1,) * 100,
              target="no regression"),
    ]


_SPEC_HELP = ("'decode [ragged] B x L' with L in tokens (e.g. 300, 2K, 0.5K) or, for ragged, LO-HI (B lengths spread "
              "over [LO, HI], fixed), then optionally 'Q/KV heads', 'page P', 'hd D' (one query token a request: "
              "FlashInfer's decode wrapper); e.g. 'decode 1 x 2K', 'decode ragged 64 x 0.1K-8K 32/4 heads page 32'")


def _tokens(text: str, spec: str) -> int:
    """'2K' -> 2048, '0.5K' -> 512, '0.1K' -> 102 (rounded), '300' -> 300 (a length of ``spec``)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kK]?)", text)
    if not m:
        raise ValueError(f"--shape {spec!r}: length {text!r} is not a number of tokens such as 300, 2K or 0.5K")
    n = round(float(m.group(1)) * (1024 if m.group(2) else 1))
    if n < 1:
        raise ValueError(f"--shape {spec!r}: length {text!r} is {n} tokens; it needs at least 1")
    return n


def parse_shape(spec: str) -> Shape:
    """A decode shape from its description (``--shape``): :data:`_SPEC_HELP`. Its name is the description, and its
    target the issue's goal for its kind (one request, ragged or uniform)."""
    words = spec.split()
    m = re.fullmatch(r"decode (ragged )?(\d+) x (\S+)((?: \S+)*)", " ".join(words))
    if not m:
        raise ValueError(f"--shape {spec!r}: not a shape description; it needs {_SPEC_HELP}")
    ragged, batch = bool(m.group(1)), int(m.group(2))
    if batch < 1:
        raise ValueError(f"--shape {spec!r}: batch {batch}; it needs at least 1 request")
    if ragged:
        lo_hi = m.group(3).split("-")
        if len(lo_hi) != 2:
            raise ValueError(f"--shape {spec!r}: a ragged batch needs its lengths as LO-HI (e.g. 0.1K-32K), got "
                             f"{m.group(3)!r}")
        lo, hi = (_tokens(x, spec) for x in lo_hi)
        if lo > hi:
            raise ValueError(f"--shape {spec!r}: LO {lo} is above HI {hi}; write the shorter length first")
        # spread by a large prime step over [lo, hi], both ends included where batch >= 2 (fixed: no seed)
        lens = tuple(lo if i == 0 else hi if i == batch - 1 else lo + (i * 104729) % (hi - lo + 1)
                     for i in range(batch))
    else:
        lens = (_tokens(m.group(3), spec),) * batch
    opts: dict[str, int] = {}
    rest = m.group(4).split()
    i = 0
    while i < len(rest):
        hm = re.fullmatch(r"(\d+)/(\d+)", rest[i])
        if hm and i + 1 < len(rest) and rest[i + 1] == "heads":
            opts["num_qo_heads"], opts["num_kv_heads"] = int(hm.group(1)), int(hm.group(2))
            i += 2
        elif rest[i] in ("page", "hd") and i + 1 < len(rest) and rest[i + 1].isdigit():
            opts[{"page": "page_size", "hd": "head_dim"}[rest[i]]] = int(rest[i + 1])
            i += 2
        else:
            raise ValueError(f"--shape {spec!r}: cannot read {' '.join(rest[i:])!r}; the options are 'Q/KV heads', "
                             "'page P' and 'hd D'")
    kind = "single" if batch == 1 else "ragged" if ragged else "uniform"
    shape = Shape(" ".join(words), "decode", lens, (1,) * batch, target=_DECODE_GOALS[kind], **opts)
    if (shape.num_kv_heads < 1 or shape.num_qo_heads < 1 or shape.num_qo_heads % shape.num_kv_heads
            or shape.page_size < 1 or shape.head_dim < 1):
        raise ValueError(f"--shape {spec!r}: {shape.num_qo_heads}/{shape.num_kv_heads} heads, page {shape.page_size}, "
                         f"head_dim {shape.head_dim}: the query heads must be a multiple of the KV heads, and the page "
                         "and head_dim at least 1")
    return shape


def _quick_shapes() -> list[Shape]:
    return [
        Shape("quick decode B=2 L=200", "decode", (200, 77), (1, 1), num_qo_heads=8, num_kv_heads=2),
        Shape("quick prefill B=2 q=48", "prefill", (48, 100), (48, 30), num_qo_heads=8, num_kv_heads=2),
        Shape("quick mixed", "prefill", (64, 90, 33), (40, 1, 1), num_qo_heads=8, num_kv_heads=2),
    ]


@dataclass
class Row:
    shape: str
    impl: str
    config: str
    ms_graph: float | None
    ms_eager: float | None
    rel_l2: float | None
    gbs: float | None = None
    vs_bf16: float | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ms(self) -> float | None:
        return self.ms_graph if self.ms_graph is not None else self.ms_eager


# ------------------------------------------------------------------------------------------ setup


class Case:
    """Random K/V (bf16, 4 outlier K channels) in paged caches: bf16, fp8 e4m3 and NVFP4."""

    def __init__(self, shape: Shape, device: Any, seed: int, fp8: bool) -> None:
        import torch

        from nvfp4compat.kernels.layout import nvfp4_full_dim

        self.shape = shape
        s = shape
        g = torch.Generator(device=device).manual_seed(seed)
        hkv, d, ps = s.num_kv_heads, s.head_dim, s.page_size
        pages_per = [math.ceil(n / ps) for n in s.seq_lens]
        self.num_pages = sum(pages_per) + 1
        perm = torch.randperm(self.num_pages, device=device, generator=g)
        self.block_table = torch.zeros(len(s.seq_lens), max(pages_per), dtype=torch.int32, device=device)
        slots, c = [], 0
        for b, n in enumerate(s.seq_lens):
            pages = perm[c : c + pages_per[b]]
            c += pages_per[b]
            self.block_table[b, : pages_per[b]] = pages.int()
            pos = torch.arange(n, device=device)
            slots.append(pages[pos // ps].long() * ps + pos % ps)
        self.slots = torch.cat(slots)
        self.seq_lens = torch.tensor(s.seq_lens, dtype=torch.int32, device=device)
        total = sum(s.seq_lens)
        self.k = torch.randn(total, hkv, d, device=device, generator=g, dtype=torch.float32)
        self.k[..., :4] *= 8.0
        self.k = self.k.to(torch.bfloat16)
        self.v = torch.randn(total, hkv, d, device=device, generator=g, dtype=torch.float32).to(torch.bfloat16)
        qsl = [0]
        for q in s.q_lens:
            qsl.append(qsl[-1] + q)
        self.qsl = torch.tensor(qsl, dtype=torch.int32, device=device)
        self.q = torch.randn(qsl[-1], s.num_qo_heads, d, device=device, generator=g).to(torch.bfloat16)
        self.sm_scale = d**-0.5
        self.device = device
        # bf16 paged cache
        self.bf16 = tuple(torch.zeros(self.num_pages, ps, hkv, d, dtype=torch.bfloat16, device=device) for _ in range(2))
        self.bf16[0].view(-1, hkv, d)[self.slots] = self.k
        self.bf16[1].view(-1, hkv, d)[self.slots] = self.v
        # fp8 e4m3 paged cache, per-tensor scales
        self.fp8 = None
        if fp8:
            self.fp8_scales = (float(self.k.float().abs().max()) / 448.0, float(self.v.float().abs().max()) / 448.0)
            self.fp8 = tuple(
                (t.float() / sc).to(torch.float8_e4m3fn) for t, sc in zip(self.bf16, self.fp8_scales, strict=True)
            )
        # NVFP4 paged cache (data + linear E4M3 scales), global scales amax / (6 * 448)
        self.nv_scales = (float(self.k.float().abs().max()) / (6 * 448), float(self.v.float().abs().max()) / (6 * 448))
        self.nv_data = tuple(torch.zeros(self.num_pages, ps, hkv, d // 2, dtype=torch.uint8, device=device) for _ in range(2))
        self.nv_sf = tuple(
            torch.zeros(self.num_pages, ps, hkv, d // 16, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
            for _ in range(2)
        )
        self.writer = self._write()
        self.nvfp4_bytes = sum(s.seq_lens) * hkv * 2 * nvfp4_full_dim(d)

    def _write(self) -> str:
        try:
            import flashinfer

            fn = flashinfer.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping
            fn(self.k, self.v, self.slots, self.nv_data, self.nv_sf, self.nv_scales[0], self.nv_scales[1], "NHD")
            return f"FlashInfer {flashinfer.__version__} nvfp4_quantize_append_paged_kv_cache_with_slot_mapping"
        except Exception as exc:  # noqa: BLE001 - fall back to our writer and say why
            why = f"{type(exc).__name__}"
        from nvfp4compat.kernels import get_kernel

        try:
            get_kernel("write", "triton")(self.k, self.v, self.slots, self.nv_data, self.nv_sf,
                                          self.nv_scales[0], self.nv_scales[1], "NHD")
            return f"nvfp4compat Triton writer (FlashInfer writer unavailable: {why})"
        except ImportError:
            from nvfp4compat.kernels import reference

            reference.append_slot_mapping(self.k, self.v, self.slots, self.nv_data, self.nv_sf,
                                          self.nv_scales[0], self.nv_scales[1], "NHD")
            return f"nvfp4compat torch reference writer (FlashInfer writer unavailable: {why})"

    # references ------------------------------------------------------------------------------
    def reference(self, which: str):
        """float32 reference output for the ``which`` cache ('nvfp4', 'bf16', 'fp8')."""
        import torch

        from nvfp4compat.kernels import reference as codec
        from nvfp4compat.kernels import reference_attention as ra

        s = self.shape
        keys, values = [], []
        off = 0
        for b, n in enumerate(s.seq_lens):
            if which == "nvfp4":
                k, v = codec.gather_dequantized(self.nv_data, self.nv_sf, self.block_table[b], n,
                                                self.nv_scales[0], self.nv_scales[1], "NHD")
            elif which == "fp8":
                assert self.fp8 is not None, "the fp8 cache was not built (Case(..., fp8=False))"
                pos = torch.arange(n, device=self.device)
                slot = self.block_table[b].long()[pos // s.page_size] * s.page_size + pos % s.page_size
                k = self.fp8[0].view(-1, s.num_kv_heads, s.head_dim)[slot].float() * self.fp8_scales[0]
                v = self.fp8[1].view(-1, s.num_kv_heads, s.head_dim)[slot].float() * self.fp8_scales[1]
            else:
                k, v = self.k[off : off + n].float(), self.v[off : off + n].float()
            off += n
            keys.append(k)
            values.append(v)
        out, _ = ra.attention_reference(self.q, keys, values, self.qsl, sm_scale=self.sm_scale)
        return out

    def fi_paged_meta(self):
        import torch

        s = self.shape
        pages_per = [math.ceil(n / s.page_size) for n in s.seq_lens]
        indptr = torch.tensor([0, *[sum(pages_per[: i + 1]) for i in range(len(pages_per))]], dtype=torch.int32, device=self.device)
        indices = torch.cat([self.block_table[b, :p] for b, p in enumerate(pages_per)]).int()
        last = torch.tensor([n - (p - 1) * s.page_size for n, p in zip(s.seq_lens, pages_per, strict=True)],
                            dtype=torch.int32, device=self.device)
        return indptr, indices, last


# ------------------------------------------------------------------------------------------ timing


def _time(fn: Callable[[], Any], quick: bool) -> tuple[float | None, float | None, str]:
    """(ms under CUDA-graph replay, ms eager, note). Under --quick: one wall-clock call."""
    if quick:
        t0 = time.perf_counter()
        fn()
        return None, (time.perf_counter() - t0) * 1e3, "interpreter wall clock"
    import torch
    import triton.testing

    eager = float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            graph = float(triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median"))
        note = ""
        if empty_graph_capture(caught):
            # the call launched its kernels off the capturing stream: the replay times an empty
            # graph (and a FULL CUDA graph in vLLM would drop that work). Report eager only.
            graph, note = None, "CUDA graph empty: the call launches off the capture stream (eager only)"
    except Exception as exc:  # noqa: BLE001 - some paths cannot be captured; report eager only
        torch.cuda.synchronize()
        graph, note = None, f"no CUDA graph ({type(exc).__name__})"
    return graph, eager, note


def empty_graph_capture(caught: Sequence[warnings.WarningMessage]) -> bool:
    """Whether torch warned, while capturing, that a CUDA graph came out empty (its kernels went
    to another stream)."""
    return any("CUDA Graph is empty" in str(w.message) for w in caught)


def _err(out, ref) -> float:
    from nvfp4compat.kernels.reference_attention import relative_l2

    return relative_l2(out, ref)


# ------------------------------------------------------------------------------------------ runs


@contextlib.contextmanager
def _overrides(att: Any, over: dict[str, Any]):
    """``override_configs`` for the config keys, plus ``knobs``: module constants of the attention
    module (e.g. ``SPLIT_TARGET_PROGRAMS_PER_SM``) set for the block and restored after it."""
    over = dict(over)
    knobs = over.pop("knobs", {})
    saved = {k: getattr(att, k) for k in knobs}
    try:
        for k, v in knobs.items():
            setattr(att, k, v)
        with att.override_configs(**over):
            yield
    finally:
        for k, v in saved.items():
            setattr(att, k, v)


def _triton_rows(case: Case, quick: bool, sweep: bool, ref_nv, att: Any = None,
                 impl: str = "triton NVFP4", knobs: Sequence[tuple[str, Any]] = (),
                 only: Sequence[str] = ()) -> list[Row]:
    import torch

    if att is None:
        from nvfp4compat.kernels.triton import attention as att

    s = case.shape
    rows: list[Row] = []
    args = (case.nv_data, case.nv_sf, case.block_table, case.seq_lens)
    ks, vs = case.nv_scales

    if s.kind == "decode":
        def run():
            return att.decode(case.q, *args, ks, vs, sm_scale=case.sm_scale)
        if hasattr(att, "decode_split"):
            sms = att._sm_count(case.q.device)
            # the config decode() launches (BLOCK_M 16 for GQA <= 16 and one query token; the Gluon kernel's
            # where decode() would take it)
            n_rows = s.num_qo_heads // s.num_kv_heads
            try:
                cl = att._cache_launch(att.normalize_cache(case.nv_data, case.nv_sf, "NHD"))
                gluon = att._gluon_eligible(case.q, s.head_dim, 16, False, cl)
                cfg0 = att.decode_config(s.head_dim, 16, gluon=gluon, rows=n_rows)
                split = att.decode_split(len(s.seq_lens), s.num_kv_heads, s.head_dim, s.page_size,
                                         case.block_table.shape[1], sms, cfg0)
                base = att.decode_config(s.head_dim, 16, split.chunks * s.num_kv_heads, sms, gluon=gluon, rows=n_rows)
            except (AttributeError, TypeError):  # an attention.py from before the Gluon kernel (--baseline)
                split = att.decode_split(len(s.seq_lens), s.num_kv_heads, s.head_dim, s.page_size,
                                         case.block_table.shape[1], sms)
                base = att.decode_config(s.head_dim, 16, split.chunks * s.num_kv_heads, sms)
            default_label = (f"default {base} programs/head={split.programs} waves={split.waves}"
                             + (f" spread={split.spread}" if getattr(split, "spread", 0) else ""))
        else:  # a baseline module (--baseline): its own heuristics, not swept
            base, default_label, sweep = None, "default", False
        variants: list[tuple[str, dict[str, Any]]] = [(default_label, {})]
        if sweep:
            # (4 programs/SM and the 128-key prefetch loop, slower on every shape of runs E and G,
            # left the sweep; --knob and profile_attention.py still reach them)
            variants.append(("default tiles, 2 programs/SM", {"decode": dataclasses.replace(base, programs_per_sm=2)}))
            # the opt-in register double-buffered loop (docs/attention.md), not the default until timed
            pf = att.PREFETCH_DECODE_CONFIG
            variants.append((f"prefetch {pf}", {"decode": pf}))
            # byte-loaded block scales: the decoded tiles skip the shared-memory round trip
            # (DecodeConfig.scale_words, docs/attention.md); not the default until timed
            for bcfg in getattr(att, "BYTE_SCALE_DECODE_CONFIGS", ()):
                variants.append((f"byte scales {bcfg}", {"decode": bcfg}))
            # K as the first operand of the logits' MMA (DecodeConfig.swap_ab): a wgmma with the decoded K in
            # registers, no decoded plane in shared memory (docs/attention.md); not the default until timed
            for scfg in getattr(att, "SWAP_DECODE_CONFIGS", ()):
                variants.append((f"swapped QK {scfg}", {"decode": scfg}))
            # the Gluon kernel (DecodeConfig.gluon, decode_gluon.py): warps own keys, operands decoded in registers
            # (labelled with the config's index, so that --variants "#11:" picks config 11 alone)
            for i, gcfg in enumerate(getattr(att, "GLUON_DECODE_CONFIGS", ())):
                variants.append((f"gluon #{i}: {gcfg}", {"decode": gcfg}))
    else:
        def run():
            return att.prefill(case.q, *args, case.qsl, ks, vs, sm_scale=case.sm_scale)
        base_p = att.prefill_config(s.head_dim)
        variants = [(f"default {base_p}", {})]
        if sweep:
            # block_m 256 (64 query tokens x GQA 4) decodes each K/V tile for twice the rows: the
            # prefill lever docs/attention.md names (the E2M1 decode repeats per query tile)
            for pcfg in (att.PrefillConfig(128, 64, 8, 3), att.PrefillConfig(128, 32, 8, 2),
                         att.PrefillConfig(64, 64, 4, 2), att.PrefillConfig(64, 64, 4, 3),
                         att.PrefillConfig(256, 64, 8, 2), att.PrefillConfig(256, 32, 8, 2)):
                if pcfg != base_p:
                    variants.append((f"{pcfg}", {"prefill": pcfg}))
            variants.append(("portable E2M1 decoder", {"decoder": "portable"}))
            # the opt-in bf16 bit-placement decoder (docs/attention.md), not the default until timed
            variants.append(("bitwise bf16 E2M1 decoder", {"decoder": "bitwise"}))

    if quick:  # CPU smoke: the default and one override, to exercise the sweep path
        if s.kind == "decode":
            variants = variants[:1] + [("default tiles, 3 programs/head", {"num_splits": 3}),
                                       ("2 programs/SM", {"knobs": {"SPLIT_TARGET_PROGRAMS_PER_SM": 2}}),
                                       ("prefetch", {"decode": att.PREFETCH_DECODE_CONFIG}),
                                       ("byte scales", {"decode": att.BYTE_SCALE_DECODE_CONFIGS[0]}),
                                       ("swapped QK", {"decode": att.SWAP_DECODE_CONFIGS[0]})]
        else:
            variants = variants[:1] + [(f"{att.PrefillConfig(64, 32, 4, 2)}", {"prefill": att.PrefillConfig(64, 32, 4, 2)})]
    if only:  # --variants: the default row and the sweep rows that one of the selectors picks
        variants = variants[:1] + [v for v in variants[1:] if selected(v[0], only)]
    # --knob NAME=V: one row per value, the module constant set for that row (any sweep mode)
    variants += [(f"knob {name}={val}", {"knobs": {name: val}}) for name, val in knobs]
    max_smem = _max_shared_mem(case.q.device)
    for label, over in variants:
        progress(f"{s.name}: {impl} [{label[:160]}]")
        try:
            with _overrides(att, over):
                getattr(att, "LAST_KERNELS", {}).clear()
                out = run()
                torch.cuda.synchronize() if case.q.is_cuda else None
                err = _err(out, ref_nv)
                res = _resources(att, s.kind, max_smem)
                graph, eager, note = _time(run, quick)
        except Exception as exc:  # noqa: BLE001 - a config that fails to build is reported, not fatal
            rows.append(Row(s.name, impl, label, None, None, None, note=f"FAILED: {type(exc).__name__}: {str(exc)[:200]}"))
            continue
        if res:  # the compiled kernel's registers, spills, shared memory and resident programs per SM
            note = "; ".join(x for x in (
                f"{res['registers']} regs, {res['spills']} B spilled, {res['shared_bytes'] / 1024:.1f} KB smem, "
                f"{res['programs_per_sm']}/SM", note) if x)  # fmt: skip
        extra = {"override": {k: str(v) for k, v in over.items()}} | ({"resources": res} if res else {})
        rows.append(Row(s.name, impl, label, graph, eager, err, note=note, extra=extra))
    return rows


def selected(label: str, only: Sequence[str]) -> bool:
    """Whether ``--variants`` picks the sweep row ``label``: one of the selectors ``only`` matches it, a selector
    being substrings joined by ``&``, all of which the label must hold (config reprs hold commas, so ``a&b`` picks
    e.g. ``page_tile=True`` configs without ``imad_shr``)."""
    return any(all(part.strip() in label for part in sel.split("&") if part.strip()) for sel in only)


def _max_shared_mem(device: Any) -> int | None:
    """The device's opt-in shared memory per block (bytes), as Triton reads it; None off CUDA."""
    if getattr(device, "type", None) != "cuda":
        return None
    try:
        import triton

        props = triton.runtime.driver.active.utils.get_device_properties(device.index or 0)
        return int(props["max_shared_mem"])
    except Exception:  # noqa: BLE001 - a driver without the query: programs per SM by registers only
        return None


def _resources(att: Any, kind: str, max_smem: int | None) -> dict[str, int] | None:
    """Resources of the compiled kernel the last call launched (decode, or the prefill kernel)."""
    compiled = getattr(att, "LAST_KERNELS", {}).get("decode" if kind == "decode" else "prefill")
    fn = getattr(att, "kernel_resources", None)
    return fn(compiled, max_smem) if fn is not None and compiled is not None else None


def _flashinfer_rows(case: Case, refs: dict[str, Any]) -> list[Row]:
    import torch

    try:
        import flashinfer
    except Exception as exc:  # noqa: BLE001
        return [Row(case.shape.name, "flashinfer", "-", None, None, None, note=f"not available: {type(exc).__name__}: {exc}")]
    s = case.shape
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=case.device)
    indptr, indices, last = case.fi_paged_meta()
    rows: list[Row] = []
    ver = flashinfer.__version__

    def add(name: str, build: Callable[[], Callable[[], Any]], ref_key: str) -> None:
        progress(f"{s.name}: FlashInfer {ver} {name}")
        try:
            run = build()
            out = run()
            torch.cuda.synchronize()
            err = _err(out, refs[ref_key])
            graph, eager, note = _time(run, False)
            rows.append(Row(s.name, f"FlashInfer {ver} {name}", "-", graph, eager, err, note=note))
        except Exception as exc:  # noqa: BLE001 - record the failure, keep going
            rows.append(Row(s.name, f"FlashInfer {ver} {name}", "-", None, None, None, note=f"FAILED: {type(exc).__name__}: {str(exc)[:200]}"))

    if s.kind == "decode":
        def decode_wrapper(kv_dtype, cache, scales=(None, None), sf=None):
            def build():
                w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
                w.plan(indptr, indices, last, s.num_qo_heads, s.num_kv_heads, s.head_dim, s.page_size,
                       q_data_type=torch.bfloat16, kv_data_type=kv_dtype, o_data_type=torch.bfloat16,
                       sm_scale=case.sm_scale)
                kw: dict[str, Any] = {"k_scale": scales[0], "v_scale": scales[1]}
                if sf is not None:
                    kw["kv_cache_sf"] = sf
                return lambda: w.run(case.q, cache, **kw)
            return build

        add("bf16 TC decode", decode_wrapper(torch.bfloat16, case.bf16), "bf16")
        if case.fp8 is not None:
            add("fp8 e4m3 TC decode", decode_wrapper(torch.float8_e4m3fn, case.fp8, case.fp8_scales), "fp8")
        add("NVFP4 FA2 decode", decode_wrapper(torch.uint8, case.nv_data, case.nv_scales, case.nv_sf), "nvfp4")
    else:
        def prefill_wrapper(backend, kv_dtype, cache, scales=(None, None), sf=None):
            def build():
                w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend)
                w.plan(case.qsl, indptr, indices, last, s.num_qo_heads, s.num_kv_heads, s.head_dim, s.page_size,
                       causal=True, sm_scale=case.sm_scale, q_data_type=torch.bfloat16, kv_data_type=kv_dtype,
                       o_data_type=torch.bfloat16)
                kw: dict[str, Any] = {"k_scale": scales[0], "v_scale": scales[1]}
                if sf is not None:
                    kw["kv_cache_sf"] = sf
                return lambda: w.run(case.q, cache, **kw)
            return build

        add("bf16 FA3 prefill", prefill_wrapper("fa3", torch.bfloat16, case.bf16), "bf16")
        add("bf16 FA2 prefill", prefill_wrapper("fa2", torch.bfloat16, case.bf16), "bf16")
        add("NVFP4 FA2 prefill", prefill_wrapper("fa2", torch.uint8, case.nv_data, case.nv_scales, case.nv_sf), "nvfp4")
    return rows


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _table(rows: list[Row], case: Case) -> str:
    base = next((r for r in rows if r.impl.endswith("bf16 TC decode") or r.impl.endswith("bf16 FA3 prefill")), None)
    fp8 = next((r for r in rows if r.impl.endswith("fp8 e4m3 TC decode")), None)
    lines = [
        "| impl | config | ms (graph) | ms (eager) | x FlashInfer bf16 | x FlashInfer fp8 | NVFP4 GB/s | % of 4.3 TB/s | rel L2 | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.ms is not None and base is not None and base.ms is not None and r is not base:
            r.vs_bf16 = r.ms / base.ms
        elif r is base:
            r.vs_bf16 = 1.0
        if r.ms is not None and "NVFP4" in r.impl:
            r.gbs = case.nvfp4_bytes / (r.ms * 1e-3) / 1e9
        pct = None if r.gbs is None else 100 * r.gbs / COPY_CEILING_GBS
        vs_fp8 = None if (fp8 is None or fp8.ms is None or r.ms is None) else r.ms / fp8.ms
        r.extra["vs_fp8"] = vs_fp8
        lines.append(
            f"| {r.impl} | {r.config} | {_fmt(r.ms_graph, '.4f')} | {_fmt(r.ms_eager, '.4f')} | "
            f"{_fmt(r.vs_bf16, '.2f')} | {_fmt(vs_fp8, '.2f')} | {_fmt(r.gbs, '.0f')} | {_fmt(pct, '.0f')} | "
            f"{_fmt(r.rel_l2, '.2e')} | {r.note} |"
        )
    return "\n".join(lines)


def _parse_knobs(specs: Sequence[str]) -> list[tuple[str, int]]:
    """``["SPLIT_WAVES=2,3"]`` -> ``[("SPLIT_WAVES", 2), ("SPLIT_WAVES", 3)]``, each name checked
    against the attention module's integer constants."""
    from nvfp4compat.kernels.triton import attention as att

    out: list[tuple[str, int]] = []
    for spec in specs:
        name, sep, vals = spec.partition("=")
        name = name.strip()
        if not sep or not name.isupper() or not isinstance(getattr(att, name, None), int):
            known = sorted(k for k, v in vars(att).items() if k.isupper() and type(v) is int)
            raise SystemExit(f"bench_attention: --knob {spec!r}: need NAME=V1,V2 with NAME one of {known}")
        try:
            out += [(name, int(v)) for v in vals.split(",") if v.strip()]
        except ValueError:
            raise SystemExit(f"bench_attention: --knob {spec!r}: values must be integers") from None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CPU smoke run: tiny shapes, Triton interpreter, no FlashInfer")
    ap.add_argument("--no-sweep", action="store_true", help="only the default Triton config per shape")
    ap.add_argument("--no-flashinfer", action="store_true", help="skip the FlashInfer baselines")
    ap.add_argument("--shapes", default=None, help="comma-separated substrings selecting shapes (e.g. 'B=8,prefill')")
    ap.add_argument("--shape", action="append", default=[], metavar="SPEC",
                    help="also time a decode shape described as " + _SPEC_HELP + " (repeatable; with --shapes, the "
                         "selected catalogue shapes and these)")
    ap.add_argument("--json", default=None,
                    help="also write every row to this JSON file, rewritten after each shape ('complete' is false "
                         "until the last shape is done, so a run cut off by a time limit keeps its finished shapes)")
    ap.add_argument("--watchdog-s", type=float, default=None, metavar="S",
                    help="print every thread's Python stack to stderr when one step (a shape's set-up or one row) "
                         "runs longer than S seconds, and again every S seconds (default 300 on a GPU, off under "
                         "--quick; 0: off). Each step's start is logged on stderr with the seconds since launch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--baseline", default=None,
                    help="path of an earlier attention.py (e.g. `git show <rev>:nvfp4compat/kernels/triton/attention.py`) "
                         "timed in the same run as 'triton NVFP4 baseline'")
    ap.add_argument("--knob", action="append", default=[], metavar="NAME=V1,V2",
                    help="also time the Triton kernels with the attention module's constant NAME set to each "
                         "value (integers), one row per value, e.g. --knob SPLIT_WAVES=2,3")
    ap.add_argument("--variants", default=None, metavar="SUBSTRINGS",
                    help="comma-separated selectors: time only the sweep rows whose label holds one; a selector "
                         "of '&'-joined substrings needs all of them (e.g. 'swapped QK,byte scales' or "
                         "'page_tile=True&imad_shr=False'); '#I:' picks GLUON_DECODE_CONFIGS[I] alone (e.g. '#11:,#44:'); "
                         "the default row always runs")
    args = ap.parse_args(argv)
    only = [k.strip() for k in (args.variants or "").split(",") if k.strip()]
    global _WATCHDOG_S
    _WATCHDOG_S = args.watchdog_s if args.watchdog_s is not None else (0.0 if args.quick else 300.0)
    if _WATCHDOG_S < 0:
        raise SystemExit(f"bench_attention: --watchdog-s {args.watchdog_s}: need seconds >= 0 (0 turns it off)")

    if args.quick:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    knobs = _parse_knobs(args.knob)  # imports the kernels: after TRITON_INTERPRET is set
    import torch
    import triton

    device = torch.device("cpu" if args.quick else "cuda")
    if not args.quick and not torch.cuda.is_available():
        sys.stderr.write("bench_attention: no CUDA GPU; use --quick for the CPU smoke run\n")
        return 2
    shapes = _quick_shapes() if args.quick else _full_shapes()
    baseline = None
    if args.baseline:
        spec = importlib.util.spec_from_file_location("nvfp4compat.kernels.triton._bench_baseline", args.baseline)
        assert spec is not None and spec.loader is not None, args.baseline
        baseline = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = baseline  # dataclasses look their module up there
        spec.loader.exec_module(baseline)
    if args.shapes:
        keys = [k.strip() for k in args.shapes.split(",") if k.strip()]
        shapes = [s for s in shapes if any(k in s.name for k in keys)]
    try:
        extra = [parse_shape(spec) for spec in args.shape]
    except ValueError as err:
        raise SystemExit(f"bench_attention: {err}") from None
    if extra:
        if not args.shapes:  # only the described shapes
            shapes = []
        shapes += extra
    env = f"torch {torch.__version__}, triton {triton.__version__}"
    if device.type == "cuda":
        env = f"{torch.cuda.get_device_name(device)} ({torch.cuda.get_device_properties(device).multi_processor_count} SMs), " + env
    try:
        import flashinfer

        env += f", flashinfer {flashinfer.__version__}"
    except Exception:  # noqa: BLE001
        env += ", flashinfer not importable"
    print(f"# bench_attention: {env}\n")
    all_rows: list[Row] = []
    ok = True
    for shape in shapes:
        t0 = time.perf_counter()
        progress(f"{shape.name}: building the caches and the float32 references")
        case = Case(shape, device, args.seed, fp8=not args.quick)
        refs = {"nvfp4": case.reference("nvfp4")}
        if not args.quick and not args.no_flashinfer:
            refs["bf16"] = case.reference("bf16")
            refs["fp8"] = case.reference("fp8")
        rows = _triton_rows(case, args.quick, sweep=not args.no_sweep, ref_nv=refs["nvfp4"], knobs=knobs,
                            only=only)
        if baseline is not None:
            rows += _triton_rows(case, args.quick, False, refs["nvfp4"], att=baseline, impl="triton NVFP4 baseline")
        if not args.quick and not args.no_flashinfer:
            rows += _flashinfer_rows(case, refs)
        print(f"## {shape.name} ({shape.num_qo_heads} q / {shape.num_kv_heads} kv heads, head_dim {shape.head_dim}, "
              f"page {shape.page_size}; NVFP4 bytes {case.nvfp4_bytes / 1e6:.1f} MB; target {shape.target or '-'})")
        print(f"cache written by: {case.writer}\n")
        print(_table(rows, case))
        print(f"\n({time.perf_counter() - t0:.1f} s)\n")
        for r in rows:
            if r.impl == "triton NVFP4" and (r.rel_l2 is None or r.rel_l2 > TOL):
                ok = False
                print(f"ERROR: {r.impl} [{r.config}] relative L2 {r.rel_l2} exceeds {TOL} or failed: {r.note}")
        all_rows += rows
        if args.json:
            _write_json(args.json, env, all_rows, complete=False)
        del case
        if device.type == "cuda":
            torch.cuda.empty_cache()
    progress("all shapes done")
    faulthandler.cancel_dump_traceback_later()

    # best Triton config per shape
    print("## fastest Triton config per shape\n")
    print("| shape | best config | ms | x FlashInfer bf16 | default config ms |")
    print("|---|---|---|---|---|")
    for shape in shapes:
        tri = [r for r in all_rows if r.shape == shape.name and r.impl == "triton NVFP4" and r.ms is not None]
        if not tri:
            continue
        best = min(tri, key=lambda r: r.ms if r.ms is not None else math.inf)
        print(f"| {shape.name} | {best.config} | {best.ms:.4f} | {_fmt(best.vs_bf16, '.2f')} | {tri[0].ms:.4f} |")
    print("\nTo adopt a winner: edit _DECODE_CONFIGS / _PREFILL_CONFIGS (tile configs per head_dim), "
          "DECODE_WIDE_WARPS (warps of latency-bound or BLOCK_M > 16 decode launches) and "
          "SPLIT_TARGET_PROGRAMS_PER_SM / SPLIT_MIN_TILES (work split) in nvfp4compat/kernels/triton/attention.py.")
    if args.json:
        _write_json(args.json, env, all_rows, complete=True)
    return 0 if ok else 1


def _write_json(path: str, env: str, rows: Sequence[Row], complete: bool) -> None:
    """Every row so far to ``path`` (through a temporary file and a rename, so a run killed while writing leaves
    the previous shape's file whole); ``complete`` is false until the last shape is done."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"env": env, "complete": complete, "rows": [asdict(r) for r in rows]}, f, indent=1)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
