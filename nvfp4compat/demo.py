"""``nvfp4compat demo``: the NVFP4 KV cache end to end on whatever machine this is.

Resolves the plan for this system, writes a paged NVFP4 KV cache through the writer the plan binds,
runs decode and prefill through the bound reader, and prints:

* the plan (``nvfp4compat.detect`` + ``resolve``; if planning fails the error is printed and the demo
  falls back to the bundled Triton kernels);
* the capacity ratio against a bf16 cache (bytes per token per layer: ``4 * D * Hkv`` for bf16,
  ``2 * (D/2 + D/16) * Hkv`` for NVFP4);
* the output error of NVFP4 attention against bf16 attention (same random K/V, float32 math), and of
  the kernel against the float32 reference on the dequantized cache (the kernel's own error);
* on a GPU, the time of decode and prefill against a bf16 baseline (FlashInfer's bf16 paged
  attention when installed, else ``torch.nn.functional.scaled_dot_product_attention`` on dense bf16
  tensors gathered from the pages beforehand; the demo says which).

On a CPU the Triton kernels run under the interpreter (``TRITON_INTERPRET=1``, set here before
triton is imported) at a small size; the whole run takes well under a minute.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["main", "capacity_ratio"]


@dataclass(frozen=True)
class _Size:
    batch: int
    seq_len: int
    prefill_batch: int
    prefill_len: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int


_SIZES = {
    "small": _Size(batch=2, seq_len=320, prefill_batch=2, prefill_len=96, num_qo_heads=8, num_kv_heads=2, head_dim=128, page_size=16),
    "full": _Size(batch=8, seq_len=32768, prefill_batch=4, prefill_len=4096, num_qo_heads=32, num_kv_heads=8, head_dim=128, page_size=16),
}


def capacity_ratio(head_dim: int) -> float:
    """Tokens an NVFP4 cache holds per bf16 token in the same memory: ``4D / (2 (D/2 + D/16))``."""
    return (4 * head_dim) / (2 * (head_dim // 2 + head_dim // 16))


def _say(text: str = "") -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _plan_bindings() -> tuple[dict[str, Any], str]:
    """``{op: impl}`` from the resolved plan, and the text to print (the plan, or why the demo uses Triton)."""
    try:
        import nvfp4compat

        plan = nvfp4compat.resolve(nvfp4compat.load_matrix(), nvfp4compat.detect())
    except Exception as exc:  # noqa: BLE001 - the demo reports any planning failure and goes on
        return {}, f"planning failed ({type(exc).__name__}: {exc}); using the bundled Triton kernels"
    if plan.facts.arch is None:
        # Nothing to plan without an arch; the demo runs the kernels anyway, interpreted.
        return {}, ("no GPU here: running the Triton kernels in the interpreter "
                    "(`nvfp4compat query --arch sm_90` shows the plan for a GPU)")
    bindings: dict[str, Any] = {op: b.impl for op, b in plan.bindings.items()}
    return bindings, plan.render_text(trace=False)


def _choose(op: str, bindings: dict[str, Any], forced: str | None, notes: list[str]) -> tuple[str, Callable[..., Any]]:
    """The implementation of ``op`` to run: the forced one, the plan's, else Triton (said in notes)."""
    from nvfp4compat.kernels import get_kernel

    want = forced or bindings.get(op)
    if want in ("triton", "flashinfer"):
        try:
            return want, get_kernel(op, want)
        except ImportError as exc:
            if forced:
                raise
            notes.append(f"{op}: the plan binds {want} but it cannot load ({exc}); using triton")
    elif want is not None:
        notes.append(f"{op}: the plan binds {want!r} (vLLM's own path, nothing to call here); using triton")
    elif bindings:
        notes.append(f"{op}: no binding in the plan; using triton")
    try:
        return "triton", get_kernel(op, "triton")
    except ImportError as exc:
        if op != "write":
            raise
        from nvfp4compat.kernels import reference

        notes.append(f"write: the Triton writer cannot load ({exc}); using the torch reference writer")
        return "reference", reference.append_slot_mapping


def _bench(fn: Callable[[], Any]) -> float:
    """Median milliseconds of ``fn`` (``triton.testing.do_bench`` on CUDA)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; returns 0 when every kernel result is within 1e-2 of its reference."""
    ap = argparse.ArgumentParser(prog="nvfp4compat demo", description=__doc__.splitlines()[0].replace("``", ""))
    ap.add_argument("--size", choices=sorted(_SIZES), default=None, help="problem size (default: full on a GPU, small on a CPU)")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--impl", choices=("triton", "flashinfer"), default=None, help="force the reader and writer implementation")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(list(argv) if argv is not None else None)

    try:
        import torch
    except ImportError as exc:
        sys.stderr.write(f"nvfp4compat demo: torch is not installed ({exc}); install the torch you run vLLM with "
                         "(or `pip install torch` for the CPU demo) and run it again\n")
        return 1

    use_cuda = torch.cuda.is_available() if args.device == "auto" else args.device == "cuda"
    if use_cuda and not torch.cuda.is_available():
        _say("nvfp4compat demo: --device cuda but no CUDA GPU is available")
        return 2
    if not use_cuda:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            _say("nvfp4compat demo: triton was imported before TRITON_INTERPRET=1 could be set; run "
                 "`TRITON_INTERPRET=1 nvfp4compat demo` for the CPU demo")
            return 2
        os.environ["TRITON_INTERPRET"] = "1"
    device = torch.device("cuda" if use_cuda else "cpu")
    size = _SIZES[args.size or ("full" if use_cuda else "small")]
    t_start = time.perf_counter()

    from nvfp4compat.kernels import reference_attention as ra
    from nvfp4compat.kernels.layout import nvfp4_full_dim

    _say("== nvfp4compat demo: NVFP4 KV cache, write -> decode -> prefill")
    gpu = torch.cuda.get_device_name(device) if use_cuda else "none (CPU, Triton interpreter)"
    _say(f"device: {device} ({gpu}); torch {torch.__version__}")

    _say("\n== plan")
    bindings, plan_text = _plan_bindings()
    _say(plan_text.rstrip())
    notes: list[str] = []
    try:
        impl_w, write = _choose("write", bindings, args.impl, notes)
        impl_d, decode = _choose("decode", bindings, args.impl, notes)
        impl_p, prefill = _choose("prefill", bindings, args.impl, notes)
    except ImportError as exc:
        why = (str(exc).splitlines() or [type(exc).__name__])[0]
        sys.stderr.write(f"nvfp4compat demo: --impl {args.impl or 'triton'} cannot load here ({why}); "
                         "install it or run without --impl\n")
        return 1
    for note in notes:
        _say(f"note: {note}")
    _say(f"running: write={impl_w}, decode={impl_d}, prefill={impl_p}")

    s = size
    d, hkv, hq = s.head_dim, s.num_kv_heads, s.num_qo_heads
    bf16_bytes = 4 * d * hkv
    fp4_bytes = 2 * nvfp4_full_dim(d) * hkv
    _say("\n== capacity (bytes per token per layer)")
    _say(f"head_dim {d}, {hkv} KV heads: bf16 {bf16_bytes} B, NVFP4 {fp4_bytes} B (data + E4M3 scales) "
         f"-> {capacity_ratio(d):.2f}x the tokens in the same memory")

    # ---- write: random K/V (4 outlier channels in K, as real keys have) through the bound writer
    g = torch.Generator().manual_seed(args.seed)

    def written_case(lens: list[int]) -> tuple[ra.PagedCase, float]:
        """A paged cache of random bf16 K/V for ``lens``, its pages written by the bound writer, and
        the seconds the writer took."""
        keys, values = [], []
        for n in lens:
            k = torch.randn(n, hkv, d, generator=g)
            k[..., :4] *= 8.0
            keys.append(k.to(torch.bfloat16))
            values.append(torch.randn(n, hkv, d, generator=g).to(torch.bfloat16))
        c = ra.make_paged_cache(lens, hkv, d, s.page_size, layout="NHD", device=device, generator=g,
                                keys=keys, values=values)
        # Rewrite the pages through the bound writer (make_paged_cache wrote them with the reference).
        for t in (*c.paged_kv_cache, *c.kv_cache_sf):
            t.view(torch.uint8).zero_()
        slots = c.slot_mapping()
        t0 = time.perf_counter()
        write(torch.cat(c.keys), torch.cat(c.values), slots, c.paged_kv_cache,
              c.kv_cache_sf, c.k_scale, c.v_scale, "NHD")
        if use_cuda:
            torch.cuda.synchronize()
        return c, time.perf_counter() - t0

    lens = [s.seq_len] * s.batch
    case, write_s = written_case(lens)
    _say(f"\n== write: {sum(lens)} tokens x {hkv} heads through {impl_w} in {write_s:.2f} s")

    ok = True
    sm_scale = d**-0.5
    q = torch.randn(s.batch, hq, d, generator=g).to(torch.bfloat16).to(device)
    qsl = ra.decode_query_start_loc(s.batch, 1, device)

    def checked(c: ra.PagedCase, out: torch.Tensor, qq: torch.Tensor, qsl_: torch.Tensor, first: str) -> bool:
        """Print the kernel's error against the reference on the dequantized cache (the check), its
        error against bf16 attention and the reference's, and the first call's time; the check's verdict."""
        ref, _ = ra.paged_attention_reference(qq, c.paged_kv_cache, c.kv_cache_sf, c.block_table, c.seq_lens,
                                              qsl_, c.k_scale, c.v_scale, sm_scale=sm_scale)
        bf, _ = ra.attention_reference(qq, [k.float() for k in c.keys], [v.float() for v in c.values],
                                       qsl_, sm_scale=sm_scale)
        e_kernel, e_bf16, e_quant = ra.relative_l2(out, ref), ra.relative_l2(out, bf), ra.relative_l2(ref, bf)
        _say(f"kernel vs float32 reference on the dequantized cache: relative L2 {e_kernel:.2e} (limit 1e-2)")
        _say(f"NVFP4 attention vs bf16 attention (quantization error): relative L2 {e_bf16:.2e} "
             f"(reference alone: {e_quant:.2e})")
        _say(first)
        return e_kernel <= 1e-2

    # ---- decode
    _say(f"\n== decode: batch {s.batch}, context {s.seq_len}, {hq} query / {hkv} KV heads, head_dim {d}, page {s.page_size}")
    t0 = time.perf_counter()
    out = decode(q, case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens, case.k_scale,
                 case.v_scale, sm_scale=sm_scale, kv_layout="NHD")
    if use_cuda:
        torch.cuda.synchronize()
    first = time.perf_counter() - t0
    ok &= checked(case, out, q, qsl,
                  f"first call (includes compile{'' if use_cuda else ' / interpretation'}): {first:.2f} s")
    if use_cuda:
        _time_decode(decode, q, case, sm_scale, s)

    # ---- prefill: fresh requests of prefill_len tokens, causal
    pl = [s.prefill_len] * s.prefill_batch
    pcase, _ = written_case(pl)
    pq = torch.randn(sum(pl), hq, d, generator=g).to(torch.bfloat16).to(device)
    pqsl = torch.tensor([0, *[sum(pl[: i + 1]) for i in range(len(pl))]], dtype=torch.int32, device=device)
    _say(f"\n== prefill: batch {s.prefill_batch}, {s.prefill_len} queries over {s.prefill_len} keys each, causal")
    t0 = time.perf_counter()
    pout = prefill(pq, pcase.paged_kv_cache, pcase.kv_cache_sf, pcase.block_table, pcase.seq_lens, pqsl,
                   pcase.k_scale, pcase.v_scale, sm_scale=sm_scale, kv_layout="NHD")
    if use_cuda:
        torch.cuda.synchronize()
    first = time.perf_counter() - t0
    ok &= checked(pcase, pout, pq, pqsl, f"first call: {first:.2f} s")
    if use_cuda:
        _time_prefill(prefill, pq, pqsl, pcase, sm_scale, s)

    _say(f"\n== {'OK' if ok else 'FAILED'}: every kernel within 1e-2 of its reference"
         if ok else "\n== FAILED: a kernel result is off its reference by more than 1e-2")
    _say(f"total {time.perf_counter() - t_start:.1f} s")
    return 0 if ok else 1


def _dense(case: Any, lens: list[int], device: Any):
    import torch

    k = torch.stack([x[:n] for x, n in zip(case.keys, lens, strict=True)]).to(device)  # [B, L, Hkv, D] bf16
    v = torch.stack([x[:n] for x, n in zip(case.values, lens, strict=True)]).to(device)
    return k, v


def _bf16_paged(case: Any, lens: list[int], page_size: int, device: Any):
    """A bf16 paged cache (NHD) with the same block table, for FlashInfer's bf16 baseline."""
    import torch

    hkv, d = case.keys[0].shape[1], case.keys[0].shape[2]
    k_cache = torch.zeros(case.num_pages, page_size, hkv, d, dtype=torch.bfloat16, device=device)
    v_cache = torch.zeros_like(k_cache)
    for b, n in enumerate(lens):
        pos = torch.arange(n, device=device)
        pages = case.block_table[b].long()[pos // page_size]
        k_cache[pages, pos % page_size] = case.keys[b].to(device)
        v_cache[pages, pos % page_size] = case.values[b].to(device)
    pages_per = [math.ceil(n / page_size) for n in lens]
    indptr = torch.tensor([0, *[sum(pages_per[: i + 1]) for i in range(len(lens))]], dtype=torch.int32, device=device)
    indices = torch.cat([case.block_table[b, :p] for b, p in enumerate(pages_per)]).to(torch.int32)
    last = torch.tensor([n - (p - 1) * page_size for n, p in zip(lens, pages_per, strict=True)], dtype=torch.int32, device=device)
    return (k_cache, v_cache), indptr, indices, last


def _time_decode(decode: Callable[..., Any], q: Any, case: Any, sm_scale: float, s: _Size) -> None:
    import torch

    device = q.device

    t_fp4 = _bench(lambda: decode(q, case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens,
                                  case.k_scale, case.v_scale, sm_scale=sm_scale, kv_layout="NHD"))
    lens = [s.seq_len] * s.batch
    try:
        import flashinfer

        cache, indptr, indices, last = _bf16_paged(case, lens, s.page_size, device)
        ws = torch.empty(128 << 20, dtype=torch.uint8, device=device)
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
        w.plan(indptr, indices, last, s.num_qo_heads, s.num_kv_heads, s.head_dim, s.page_size,
               q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, sm_scale=sm_scale)
        name = f"FlashInfer {flashinfer.__version__} bf16 tensor-core paged decode"
        t_bf = _bench(lambda: w.run(q, cache))
    except Exception as exc:  # noqa: BLE001 - fall back to SDPA and say why
        k, v = _dense(case, lens, device)
        kk = k.transpose(1, 2).repeat_interleave(s.num_qo_heads // s.num_kv_heads, 1)
        vv = v.transpose(1, 2).repeat_interleave(s.num_qo_heads // s.num_kv_heads, 1)
        qq = q[:, :, None, :]
        name = f"torch SDPA on dense bf16 K/V gathered beforehand (FlashInfer unavailable: {type(exc).__name__})"
        t_bf = _bench(lambda: torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, scale=sm_scale))
    nbytes = s.batch * s.seq_len * 2 * 2 * s.num_kv_heads * (s.head_dim // 2 + s.head_dim // 16)
    _say(f"time: NVFP4 {t_fp4 * 1e3:.1f} us ({nbytes / t_fp4 / 1e6:.0f} GB/s of NVFP4 bytes) vs bf16 "
         f"{t_bf * 1e3:.1f} us [{name}] -> {t_fp4 / t_bf:.2f}x the bf16 time")


def _time_prefill(prefill: Callable[..., Any], q: Any, qsl: Any, case: Any, sm_scale: float, s: _Size) -> None:
    import torch

    device = q.device

    t_fp4 = _bench(lambda: prefill(q, case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens, qsl,
                                   case.k_scale, case.v_scale, sm_scale=sm_scale, kv_layout="NHD"))
    lens = [s.prefill_len] * s.prefill_batch
    try:
        import flashinfer

        cache, indptr, indices, last = _bf16_paged(case, lens, s.page_size, device)
        ws = torch.empty(128 << 20, dtype=torch.uint8, device=device)
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend="fa2")
        w.plan(qsl, indptr, indices, last, s.num_qo_heads, s.num_kv_heads, s.head_dim, s.page_size,
               causal=True, sm_scale=sm_scale, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
        name = f"FlashInfer {flashinfer.__version__} bf16 FA2 paged prefill"
        t_bf = _bench(lambda: w.run(q, cache))
    except Exception as exc:  # noqa: BLE001 - fall back to SDPA and say why
        k, v = _dense(case, lens, device)
        g = s.num_qo_heads // s.num_kv_heads
        kk = k.transpose(1, 2).repeat_interleave(g, 1)
        vv = v.transpose(1, 2).repeat_interleave(g, 1)
        qq = q.view(s.prefill_batch, s.prefill_len, s.num_qo_heads, s.head_dim).transpose(1, 2)
        name = f"torch SDPA causal on dense bf16 K/V (FlashInfer unavailable: {type(exc).__name__})"
        t_bf = _bench(lambda: torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=sm_scale))
    _say(f"time: NVFP4 {t_fp4:.3f} ms vs bf16 {t_bf:.3f} ms [{name}] -> {t_fp4 / t_bf:.2f}x the bf16 time")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
