#!/usr/bin/env python3
"""Run the four Triton kernels with valid and hostile metadata, for compute-sanitizer (issue 16).

Writer, dequant, decode (single pass and split-KV) and prefill (prefill tiles, decode rows of a mixed
batch, the query_start_loc guard) on small shapes, each with valid metadata and with the hostile
values of issue 16: page ids -1 / num_pages / num_pages + 100000 / 2**31 - 1, seq_lens past the
block-table row and negative, query_start_loc past num_tokens or decreasing, out-of-range slots,
NaN device scales, and bad host values (which must be refused before any launch). Every case states
what it expects: a documented exception, or a launch whose outputs stay finite, whose guard rows
(outside ``out``) keep their bytes, and which sets exactly the expected error-flag bits. The script
exits 1 on anything else (an unexpected exception included), 2 when it cannot run here, 0 when every
case behaved. Takes a few seconds on a GPU (plus Triton's first compiles).

Run it under the sanitizer with the caching allocator off, so that every tensor is its own
allocation and an access past one is seen (docs/validation.md, "Memory safety")::

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 3 \\
        python3 scripts/sanitize.py
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool racecheck --error-exitcode 3 \\
        python3 scripts/sanitize.py --ops decode,prefill

``--device cpu`` runs the same cases under ``TRITON_INTERPRET=1`` (a smoke test of the script). ``--knob NAME=V``
sets an integer constant of the attention module for every case, so that the hostile metadata also takes a path its
small batches do not reach by default, e.g. ``--knob MERGE_PLAN_MIN_BATCH=1 --knob DECODE_TABLE_MIN_BATCH=1`` (the
merge kernel's plan and the decode's chunk table).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

OPS = ("write", "dequant", "decode", "prefill")


@dataclass
class Case:
    op: str
    name: str
    run: Callable[[], object]
    expect_exc: type[BaseException] | tuple[type[BaseException], ...] | None = None
    expect_bits: int = 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    ap.add_argument("--dtype", default="both", choices=("bf16", "fp16", "both"))
    ap.add_argument("--match", default="", metavar="WORDS",
                    help="comma-separated words; run only the cases whose name holds one (e.g. 'rotated,byte "
                         "scales,fused merge' for the newest paths, when a tool's time limit will not cover all)")
    ap.add_argument("--knob", action="append", default=[], metavar="NAME=V",
                    help="set the attention module's integer constant NAME to V for every case (repeatable)")
    args = ap.parse_args(argv)
    knobs = []
    for spec in args.knob:
        name, sep, val = spec.partition("=")
        try:
            knobs.append((name.strip(), int(val)))
        except ValueError:
            sep = ""
        if not sep or not name.strip().isupper():
            ap.error(f"--knob {spec!r}: need NAME=V, NAME an upper-case constant of "
                     "nvfp4compat.kernels.triton.attention and V an integer (e.g. MERGE_PLAN_MIN_BATCH=1)")
    args.knob = knobs
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = [o for o in ops if o not in OPS]
    if bad:
        ap.error(f"unknown op(s) {bad}; known: {list(OPS)}")
    args.ops = ops
    args.match = [w.strip() for w in args.match.split(",") if w.strip()]
    return args


def build_cases(device: str, dtype_names: list[str]) -> list[Case]:
    import numpy as np
    import torch

    from nvfp4compat.kernels import reference_attention as ra
    from nvfp4compat.kernels.triton import attention as att
    from nvfp4compat.kernels.triton import dequant as tdq
    from nvfp4compat.kernels.triton import write as tap

    hq, hkv, d, page = 8, 2, 128, 16
    pad = 2
    cases: list[Case] = []

    def guarded_out(like: torch.Tensor) -> tuple[torch.Tensor, Callable[[], bool]]:
        big = torch.empty((like.shape[0] + 2 * pad, *like.shape[1:]), dtype=like.dtype, device=device)
        big.view(torch.uint8).fill_(0xA5)
        snap = big.view(torch.uint8).clone()
        n = like.shape[0]

        def intact() -> bool:
            raw = big.view(torch.uint8)
            return torch.equal(raw[:pad], snap[:pad]) and torch.equal(raw[pad + n :], snap[pad + n :])

        return big[pad : pad + n], intact

    def checked(fn: Callable[[], torch.Tensor | tuple], out_like: torch.Tensor | None = None):
        """Run ``fn(out)``; require finite outputs and intact guard rows."""

        def run() -> None:
            if out_like is None:
                res = fn(None)
                intact = None
            else:
                out, intact = guarded_out(out_like)
                res = fn(out)
            for t in res if isinstance(res, tuple) else (res,):
                if t is not None and t.is_floating_point():
                    finite = torch.isfinite(t) | torch.isneginf(t)  # LSE of an empty row is -inf
                    if not bool(finite.all()):
                        raise AssertionError("non-finite output")
            if intact is not None and not intact():
                raise AssertionError("bytes outside out changed")

        return run

    def per_dtype(dname: str) -> None:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dname]
        gen = torch.Generator().manual_seed(0)
        case = ra.make_paged_cache([40, 17, 70], hkv, d, page, dtype=dtype, device=device, generator=gen)
        tcase = ra.make_paged_cache([40, 17, 70], hkv, d, page, dtype=dtype, device=device,
                                    generator=torch.Generator().manual_seed(0), scale_as_tensor=True)
        n = case.num_pages
        bt, sl = case.block_table, case.seq_lens
        cache, sf = case.paged_kv_cache, case.kv_cache_sf
        ks, vs = case.k_scale, case.v_scale
        sm = d**-0.5

        def table(**edits: int) -> torch.Tensor:
            t = bt.clone()
            for key, val in edits.items():
                b, j = (int(x) for x in key[1:].split("_"))
                t[b, j] = val
            return t

        def lens(*vals: int) -> torch.Tensor:
            return torch.tensor(vals, dtype=torch.int32, device=device)

        # -- write
        rows = torch.randn(6, hkv, d, generator=gen).to(dtype).to(device)
        for sname, slots, kw, exc, bits in (
            ("valid", [0, 1, 2, 17, 33, 50], {}, None, 0),
            ("hostile slots", [-1, n * page, n * page + 100000, 2**31 - 1, -(2**31), 5], {}, None, 0),
            ("int64 huge slots", [2**40, -(2**40), 3, 4, 5, 6], {}, None, 0),
            ("nan device v_scale", [0, 1, 2, 3, 4, 5], {"v_scale": torch.tensor([float("nan")], device=device)},
             None, 2),
            ("k_scale 1e300", [0, 1, 2, 3, 4, 5], {"k_scale": 1e300}, ValueError, 0),
            ("k_scale 1e-45", [0, 1, 2, 3, 4, 5], {"k_scale": 1e-45}, ValueError, 0),
            ("4over6 'no'", [0, 1, 2, 3, 4, 5], {"nvfp4_4over6": "no"}, TypeError, 0),
            ("numpy scales", [7, 8, 9, 10, 11, 12], {"k_scale": np.float32(0.01)}, None, 0),
            ("rotated", [0, 1, 2, 17, 33, 50], {"kv_rotation": "hadamard"}, None, 0),
            ("rotated hostile slots", [-1, n * page, n * page + 100000, 2**31 - 1, -(2**31), 5],
             {"kv_rotation": "hadamard"}, None, 0),
            ("rotated 4over6", [0, 1, 2, 17, 33, 50], {"kv_rotation": "hadamard", "nvfp4_4over6": True}, None, 0),
        ):
            dt = torch.int64 if "int64" in sname else torch.int32
            slot_t = torch.tensor(slots, dtype=torch.int64).clamp(-(2**31), 2**31 - 1) if dt == torch.int32 \
                else torch.tensor(slots, dtype=torch.int64)
            slot_t = slot_t.to(dt).to(device)
            wc = tuple(t.clone() for t in cache)
            wsf = tuple(t.clone() for t in sf)
            args = dict(k_scale=0.01, v_scale=0.02)
            args.update(kw)
            four = args.pop("nvfp4_4over6", False)
            wrot = args.pop("kv_rotation", None)
            cases.append(Case(
                "write", f"{dname} {sname}",
                lambda s=slot_t, c=wc, f=wsf, a=args, fo=four, r=wrot: tap.append_slot_mapping(
                    rows, rows.flip(0), s, c, f, a["k_scale"], a["v_scale"], nvfp4_4over6=fo, kv_rotation=r),
                exc, bits,
            ))

        # -- dequant
        msl = bt.shape[1] * page
        for sname, t, s, exc in (
            ("valid", bt, sl, None),
            ("page -1 / num_pages / +100000 / int32 max", table(b0_1=-1, b1_0=n, b2_2=n + 100000, b2_4=2**31 - 1),
             sl, None),
            ("seq_lens huge and negative", bt, lens(10_000_000, -5, 2**31 - 1), None),
            ("k_scale 3.5e38", bt, sl, ValueError),
            ("rotated page -1 / num_pages", table(b0_1=-1, b1_0=n), sl, None),
            ("rotated seq_lens huge and negative", bt, lens(10_000_000, -5, 2**31 - 1), None),
        ):
            outk = torch.zeros(3, msl, hkv, d, dtype=dtype, device=device)
            kscale = 3.5e38 if exc else ks
            drot = "hadamard" if sname.startswith("rotated") else None
            cases.append(Case(
                "dequant", f"{dname} {sname}",
                lambda t=t, s=s, o=outk, k=kscale, r=drot: tdq.dequantize_paged(
                    cache, sf, t, s, k, vs, o, o.clone(), kv_rotation=r),
                exc,
            ))

        # -- decode
        for q_len in (1, 4):
            q = torch.randn(3 * q_len, hq, d, generator=gen).to(dtype).to(device)
            for splits, cfg, rot in ((1, None, None), (3, None, None), (3, att.PREFETCH_DECODE_CONFIG, None),
                                     (3, att.BYTE_SCALE_DECODE_CONFIGS[0], None), (3, None, "hadamard"),
                                     (3, "fused merge", None), (3, "merge pdl", None), (3, "merge pdl late", None),
                                     (3, "balanced split", None), (None, "spread split", None),
                                     (1, att.GLUON_DECODE_CONFIGS[2], None),
                                     (3, next(c for c in att.GLUON_DECODE_CONFIGS if c.kt_logits), None),
                                     (3, att.GLUON_FP32_SCALES_CONFIG, None),
                                     (3, next(c for c in att.GLUON_DECODE_CONFIGS if c.lean and c.kt_logits), None),
                                     (3, next(c for c in att.GLUON_DECODE_CONFIGS if c.skew_logits), None),
                                     *((sp, c, None) for sp, c in zip((3, 1, 3, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1,
                                                                       3, 1, 3, 1, 3, 1, 3, 3, 1, 3, 1, 3, 1, 3, 1, 3, 3, 1, 3, 1, 3, 3, 1, 3, 1, 3, 1, 1, 3), [
                                         c for c in att.GLUON_DECODE_CONFIGS if c.page_tile], strict=True))):
                for sname, t, s, kw, exc in (
                    ("valid", bt, sl, {}, None),
                    ("bad pages", table(b0_1=-1, b1_0=n, b2_2=n + 100000, b2_3=2**31 - 1), sl, {}, None),
                    ("seq_lens 1e7 / -5 / 0", bt, lens(10_000_000, -5, 0), {}, None),
                    ("tensor scales", tcase.block_table, tcase.seq_lens,
                     {"k_scale": tcase.k_scale, "v_scale": tcase.v_scale}, None),
                    ("sm_scale 0", bt, sl, {"sm_scale": 0.0}, ValueError),
                ):
                    a = dict(k_scale=ks, v_scale=vs, sm_scale=sm)
                    a.update(kw)

                    def dec(out, t=t, s=s, a=a, q=q, q_len=q_len, splits=splits, cfg=cfg, rot=rot):
                        # "fused merge" / "merge pdl" (late) / "balanced split" / "spread split": the module constants
                        # set for the call, the default config ("spread split": the device's own split, chunks of 4
                        # tiles at least, so that these requests of up to 2 tiles take the spread's 1-tile chunks)
                        knobs = {"fused merge": {"FUSED_MERGE": True}, "merge pdl": {"MERGE_PDL": 1},
                                 "merge pdl late": {"MERGE_PDL": 2}, "balanced split": {"SPLIT_BALANCE_STEPS": 4},
                                 "spread split": {"SPLIT_MIN_CHUNK_TOKENS": 256, "SPLIT_SPREAD_PROGRAMS_PER_SM": 1}}.get(
                            cfg if isinstance(cfg, str) else "", {})
                        before = {k: getattr(att, k) for k in knobs}
                        for k, v in knobs.items():
                            setattr(att, k, v)
                        try:
                            with att.override_configs(num_splits=splits, decode=None if knobs else cfg):
                                return att.decode(q, cache, sf, t, s, a["k_scale"], a["v_scale"],
                                                  sm_scale=a["sm_scale"], q_len_per_req=q_len, out=out,
                                                  return_lse=True, kv_rotation=rot)
                        finally:
                            for k, v in before.items():
                                setattr(att, k, v)

                    pf = ("" if cfg is None else f" {cfg}" if isinstance(cfg, str)
                          else " prefetch" if cfg.prefetch
                          else " gluon page tile" + (" skewed" if cfg.skew_logits else "")
                          + (" lean transposed" if cfg.kt_logits else "")
                          + (" imad shift" if cfg.imad_shr else "")
                          + (" one warp" if cfg.num_warps == 1 else " two warps" if cfg.num_warps == 2 else "")
                          + (" lazy" if cfg.lazy_rescale else "")
                          + (f" chunks of {cfg.min_chunk_tokens}" if cfg.min_chunk_tokens else "")
                          + (f" ring {cfg.ring}" if cfg.ring else "")
                          + (" deferred sums" if cfg.defer_sum else "")
                          + (" tile pairs" if cfg.tile_pairs else "")
                          + (" tma loader" if cfg.tma_loader else "")
                          + (" scales 2 ahead" if cfg.scales_ahead == 2 else "")
                          + (" ptx ring" if cfg.ptx_ring else "")
                          + (f" l2 fetch {cfg.l2_fetch}" if cfg.l2_fetch else "")
                          + (" l2 scales" if cfg.l2_scales else "")
                          + (f" l2 ahead {cfg.l2_ahead}" if cfg.l2_ahead else "")
                          + (f" l2 bulk {cfg.l2_bulk}" if cfg.l2_bulk else "")
                          + (" early check" if cfg.early_check else "")
                          + (" smem merge" if cfg.smem_merge else "")
                          + (f" cap {cfg.maxnreg}" if cfg.maxnreg and cfg.maxnreg < 104 and not cfg.tma_loader else "")
                          if cfg.page_tile
                          else " gluon skewed logits" if cfg.skew_logits
                          else " gluon lean transposed logits" if cfg.kt_logits and cfg.lean
                          else " gluon transposed logits" if cfg.kt_logits
                          else " gluon fp32 scales" if cfg == att.GLUON_FP32_SCALES_CONFIG
                          else " gluon 32-key" if cfg.gluon else " byte scales")
                    pf += " rotated" if rot else ""
                    cases.append(Case("decode", f"{dname} q{q_len} splits{splits}{pf} {sname}",
                                      checked(dec, q) if exc is None else (lambda f=dec: f(None)), exc))

        # -- prefill (a mixed batch: request 1 has 2 rows, the decode kernel serves it)
        qn = 40
        q = torch.randn(qn, hq, d, generator=gen).to(dtype).to(device)
        for sname, t, s, qsl, bits in (
            ("valid mixed batch", bt, sl, [0, 30, 32, 40], 0),
            ("rotated valid mixed batch", bt, sl, [0, 30, 32, 40], 0),
            ("rotated bad pages", table(b0_1=-1, b1_0=n, b2_2=n + 100000, b2_4=2**31 - 1), sl, [0, 30, 32, 40], 0),
            ("padded tail", bt, sl, [0, 20, 22, 30], 0),
            ("qsl past num_tokens", bt, sl, [0, 30, 32, 400], 8),
            ("qsl decreasing", bt, sl, [0, 30, 10, 40], 4),
            ("qsl negative", bt, sl, [-5, 30, 32, 40], 8),
            ("bad pages", table(b0_1=-1, b1_0=n, b2_2=n + 100000, b2_4=2**31 - 1), sl, [0, 30, 32, 40], 0),
            ("seq_lens 1e7 / -5", bt, lens(10_000_000, -5, 70), [0, 30, 32, 40], 16),
        ):
            qsl_t = torch.tensor(qsl, dtype=torch.int32, device=device)
            prot = "hadamard" if sname.startswith("rotated") else None

            def pre(out, t=t, s=s, qsl_t=qsl_t, rot=prot):
                return att.prefill(q, cache, sf, t, s, qsl_t, ks, vs, sm_scale=sm, out=out, return_lse=True,
                                   kv_rotation=rot)

            cases.append(Case("prefill", f"{dname} {sname}", checked(pre, q), None, bits))
        cases.append(Case(
            "prefill", f"{dname} sm_scale inf",
            lambda: att.prefill(q, cache, sf, bt, sl, torch.tensor([0, 30, 32, 40], dtype=torch.int32, device=device),
                                ks, vs, sm_scale=float("inf")),
            ValueError,
        ))

    for dname in dtype_names:
        per_dtype(dname)
    return cases


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        import torch
    except ImportError:
        print("sanitize: torch is not installed; install torch and triton", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("sanitize: no CUDA device here; run it on a GPU machine, or pass --device cpu", file=sys.stderr)
        return 2
    from nvfp4compat.kernels import errors
    from nvfp4compat.kernels.triton import attention as att

    for name, val in args.knob:
        old = getattr(att, name, None)
        if type(old) is not int:
            print(f"sanitize: --knob {name}={val}: nvfp4compat.kernels.triton.attention has no integer constant {name} "
                  "(it is " + ("missing" if old is None else f"a {type(old).__name__}") + "); name one such as "
                  "MERGE_PLAN_MIN_BATCH or DECODE_TABLE_MIN_BATCH", file=sys.stderr)
            return 2
        setattr(att, name, val)
        print(f"knob  {name} = {val} (default {old})")
    dtypes = ["bf16", "fp16"] if args.dtype == "both" else [args.dtype]
    t0 = time.perf_counter()
    cases = [c for c in build_cases(args.device, dtypes) if c.op in args.ops]
    if args.match:
        cases = [c for c in cases if any(w in c.name for w in args.match)]
        if not cases:
            print(f"sanitize: --match {','.join(args.match)} selects no case of ops {args.ops}", file=sys.stderr)
            return 2
    errors.read_errors(args.device)
    failures = []
    for c in cases:
        label = f"{c.op}: {c.name}"
        try:
            c.run()
            if args.device == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 (every exception is judged here)
            if c.expect_exc is not None and isinstance(exc, c.expect_exc):
                print(f"ok    {label}: refused ({type(exc).__name__})")
                continue
            failures.append(f"{label}: unexpected {type(exc).__name__}: {exc}")
            print(f"FAIL  {label}: unexpected {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            continue
        if c.expect_exc is not None:
            failures.append(f"{label}: expected {c.expect_exc}, the call returned")
            print(f"FAIL  {label}: expected an exception, none was raised")
            continue
        bits = sum(errors.read_errors(args.device).values())
        if bits != c.expect_bits:
            failures.append(f"{label}: error flag {bits:#x}, expected {c.expect_bits:#x}")
            print(f"FAIL  {label}: error flag {bits:#x}, expected {c.expect_bits:#x}")
            continue
        print(f"ok    {label}")
    dt = time.perf_counter() - t0
    print(f"sanitize: {len(cases) - len(failures)}/{len(cases)} cases as expected in {dt:.1f} s")
    for f in failures:
        print(f"  {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
