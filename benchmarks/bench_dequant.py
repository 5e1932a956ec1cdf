#!/usr/bin/env python
"""Benchmark the paged NVFP4 dequantizer: Triton (every tile config) side by side with FlashInfer.

GPU run (prints markdown tables; FlashInfer's version is whatever is installed)::

    python benchmarks/bench_dequant.py

CPU smoke run under the Triton interpreter (tiny shapes, no FlashInfer, wall-clock timing)::

    python benchmarks/bench_dequant.py --quick

Effective bandwidth counts the NVFP4 bytes read (K and V codes and scales) plus the fp16/bf16 bytes
written, as ``h200-baselines.md`` does (262,144 tokens x 8 heads x 128: FlashInfer 2.78 ms, 0.5 TB/s).
Times are ``triton.testing.do_bench`` medians.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--quick", action="store_true", help="CPU smoke run under TRITON_INTERPRET=1 (tiny shapes)"
    )
    p.add_argument(
        "--shapes", nargs="*", default=None,
        help="BATCHxSEQ shapes (default 64x4096 8x1024 1x32768 128x128)",
    )  # fmt: skip
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--layout", default="NHD", choices=["NHD", "HND"])
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--no-sweep", action="store_true", help="only the heuristic config")
    return p.parse_args()


def main() -> int:
    args = parse()
    if args.quick:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from nvfp4compat.kernels.triton import dequant as tdq

    quick = args.quick
    if not quick and not torch.cuda.is_available():
        print(
            "no CUDA GPU: run with --quick for a CPU smoke run under the interpreter",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cpu" if quick else "cuda")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    shapes = args.shapes or (["2x20"] if quick else ["64x4096", "8x1024", "1x32768", "128x128"])
    H, D, P = args.heads, args.head_dim, args.page_size
    configs = [None] if args.no_sweep else [None, *tdq.CONFIGS]

    fi_fn, fi_version = None, "not installed"
    if not quick:
        try:
            from nvfp4compat.kernels.flashinfer import dequant as fid
            from nvfp4compat.kernels.flashinfer import write as fia

            fi_fn, fi_version = fid._helper, fia.flashinfer_version()
        except ImportError as exc:
            fi_version = f"unavailable ({exc})"

    def bench(fn) -> float:
        if quick:
            fn()
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        import triton.testing

        return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")

    print(
        f"# NVFP4 paged dequant, K and V: {H} heads x {D} -> {args.dtype}, {args.layout}, page_size {P}"
    )
    print(
        f"device: {torch.cuda.get_device_name() if not quick else 'cpu (interpreter)'}; flashinfer: {fi_version}; "
        f"torch {torch.__version__}"
    )
    rows_main, rows_sweep = [], []

    def measure(shape_s: str) -> None:
        B, S = (int(v) for v in shape_s.lower().split("x"))
        pages_per_req = -(-S // P)
        num_pages = B * pages_per_req
        shape = (num_pages, P, H, D // 2) if args.layout == "NHD" else (num_pages, H, P, D // 2)
        sshape = shape[:-1] + (D // 16,)
        cache = tuple(
            torch.randint(0, 256, shape, dtype=torch.uint8, device=device) for _ in range(2)
        )
        # scale bytes 0x00..0x7E (no E4M3 NaN): realistic values, not the NaN path
        sf = tuple(
            torch.randint(0, 0x7F, sshape, dtype=torch.uint8, device=device).view(
                torch.float8_e4m3fn
            )
            for _ in range(2)
        )
        bt = torch.randperm(num_pages, device=device).view(B, pages_per_req).int()
        seq_lens = torch.full((B,), S, dtype=torch.int32, device=device)
        ks = torch.tensor([0.01], device=device)
        vs = torch.tensor([0.02], device=device)
        out_k = torch.empty(B, S, H, D, dtype=dtype, device=device)
        out_v = torch.empty_like(out_k)
        nbytes = 2 * B * S * H * (D // 2 + D // 16 + D * out_k.element_size())
        res = {}
        if fi_fn is not None:
            res["fi"] = bench(
                lambda: fi_fn(cache, sf, bt, seq_lens, ks, vs, out_k, out_v, args.layout)
            )
        heur = tdq.INTERPRETER_CONFIG if quick else tdq.pick_config(B * S * H, D)
        for cfg in configs:
            t = bench(
                lambda cfg=cfg: tdq.dequantize_paged(
                    cache, sf, bt, seq_lens, ks, vs, out_k, out_v, args.layout, config=cfg
                )
            )
            if cfg is None:
                res["triton"] = t
            else:
                rows_sweep.append(
                    (shape_s, B * S, cfg.name, t, nbytes / t / 1e6, cfg.name == heur.name)
                )
        best = min((r for r in rows_sweep if r[0] == shape_s), key=lambda r: r[3], default=None)
        rows_main.append((shape_s, B * S, nbytes, res, heur.name, best))

    for shape_s in shapes:
        measure(shape_s)

    def fmt(ms):
        return f"{ms * 1e3:.1f} us" if ms < 0.1 else f"{ms:.3f} ms"

    print(
        "\n| batch x seq | tokens | FlashInfer | FI GB/s | Triton (heuristic cfg) | Triton GB/s | FI / Triton | best cfg |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for shape_s, ntok, nbytes, res, heur, best in rows_main:
        fi, tr = res.get("fi"), res["triton"]
        best_s = f"{best[2]} {fmt(best[3])}" if best else "-"
        fi_s = f"{fmt(fi)} | {nbytes / fi / 1e6:.0f}" if fi else "- | -"
        ratio = f"{fi / tr:.2f}x" if fi else "-"
        print(
            f"| {shape_s} | {ntok} | {fi_s} | {fmt(tr)} ({heur}) | {nbytes / tr / 1e6:.0f} | {ratio} | {best_s} |"
        )
    if rows_sweep:
        print("\n| batch x seq | config | time | GB/s | heuristic pick |")
        print("|---|---|---|---|---|")
        for shape_s, _, name, t, gbs, picked in rows_sweep:
            print(f"| {shape_s} | {name} | {fmt(t)} | {gbs:.0f} | {'*' if picked else ''} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
