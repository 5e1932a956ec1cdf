#!/usr/bin/env python
"""Benchmark the slot-mapping NVFP4 writer: Triton (every tile config) side by side with FlashInfer.

GPU run (prints markdown tables; FlashInfer's version is whatever is installed)::

    python benchmarks/bench_write.py

CPU smoke run under the Triton interpreter (tiny shapes, no FlashInfer, wall-clock timing)::

    python benchmarks/bench_write.py --quick

Effective bandwidth counts the fp16/bf16 K and V bytes read plus the NVFP4 bytes written (codes and
scales), as ``h200-baselines.md`` does. Times are ``triton.testing.do_bench`` medians (eager: Python
launch overhead included, as a serving loop without CUDA graphs sees it) and, for the small sizes, the
median of a CUDA graph of 20 launches divided by 20 (device time, as vLLM's captured decode sees it).
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
        "--tokens",
        type=int,
        nargs="*",
        default=None,
        help="token counts (default 1 8 64 256 4096 65536)",
    )
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--layout", default="NHD", choices=["NHD", "HND"])
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--no-sweep", action="store_true", help="only the heuristic config")
    p.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph timings")
    return p.parse_args()


def main() -> int:
    args = parse()
    if args.quick:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from nvfp4compat.kernels.triton import write as tap

    quick = args.quick
    if not quick and not torch.cuda.is_available():
        print(
            "no CUDA GPU: run with --quick for a CPU smoke run under the interpreter",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cpu" if quick else "cuda")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    tokens = args.tokens or ([1, 12] if quick else [1, 8, 64, 256, 4096, 65536])
    H, D, P = args.heads, args.head_dim, args.page_size
    configs = [None] if args.no_sweep else [None, *tap.CONFIGS]

    fi_fn, fi_version = None, "not installed"
    if not quick:
        try:
            from nvfp4compat.kernels.flashinfer import write as fia

            fi_fn, fi_version = fia._helper, fia.flashinfer_version()
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

    def bench_graph(fn, reps: int = 20) -> float | None:
        if quick or args.no_graph:
            return None
        import triton.testing

        try:
            fn()
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(reps):
                    fn()
        except Exception as exc:  # report, keep benchmarking the rest
            print(f"CUDA graph capture failed: {type(exc).__name__}: {exc}")
            return None
        return triton.testing.do_bench(g.replay, warmup=10, rep=60, return_mode="median") / reps

    def bench_back_to_back(fn, calls: int = 200) -> float | None:
        """Wall time per call of ``calls`` eager calls in a row: the host launch cost when it dominates."""
        if quick:
            return None
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3 / calls

    print(
        f"# NVFP4 slot-mapping append: {H} heads x {D}, {args.dtype}, {args.layout}, page_size {P}"
    )
    print(
        f"device: {torch.cuda.get_device_name() if not quick else 'cpu (interpreter)'}; flashinfer: {fi_version}; "
        f"torch {torch.__version__}"
    )
    rows_main, rows_sweep = [], []

    def measure(n: int) -> None:
        num_pages = max(64, -(-2 * n // P))
        shape = (num_pages, P, H, D // 2) if args.layout == "NHD" else (num_pages, H, P, D // 2)
        sshape = shape[:-1] + (D // 16,)
        cache = tuple(torch.zeros(shape, dtype=torch.uint8, device=device) for _ in range(2))
        sf = tuple(torch.zeros(sshape, dtype=torch.float8_e4m3fn, device=device) for _ in range(2))
        key = torch.randn(n, H, D, device=device).to(dtype)
        value = torch.randn(n, H, D, device=device).to(dtype)
        slots = torch.randperm(num_pages * P, device=device)[:n]
        ks_f, vs_f = (
            float(key.float().abs().amax()) / 2688,
            float(value.float().abs().amax()) / 2688,
        )
        ks_t = torch.tensor([ks_f], device=device)
        vs_t = torch.tensor([vs_f], device=device)
        nbytes = 2 * n * H * (D * key.element_size() + D // 2 + D // 16)
        res = {}
        if fi_fn is not None:
            res["fi"] = bench(lambda: fi_fn(key, value, slots, cache, sf, ks_f, vs_f, args.layout))
            res["fi_graph"] = bench_graph(
                lambda: fi_fn(key, value, slots, cache, sf, ks_t, vs_t, args.layout)
            )
            if n <= 256:
                res["fi_b2b"] = bench_back_to_back(
                    lambda: fi_fn(key, value, slots, cache, sf, ks_f, vs_f, args.layout)
                )
        heur = tap.INTERPRETER_CONFIG if quick else tap.pick_config(n * H, D)
        for cfg in configs:
            t = bench(
                lambda cfg=cfg: tap.append_slot_mapping(
                    key, value, slots, cache, sf, ks_f, vs_f, args.layout, config=cfg
                )
            )
            name = (cfg or heur).name
            if cfg is None:
                res["triton"] = t
                res["triton_graph"] = bench_graph(
                    lambda: tap.append_slot_mapping(
                        key, value, slots, cache, sf, ks_t, vs_t, args.layout
                    )
                )
                if n <= 256:
                    res["triton_b2b"] = bench_back_to_back(
                        lambda: tap.append_slot_mapping(
                            key, value, slots, cache, sf, ks_f, vs_f, args.layout
                        )
                    )
            else:
                # device time in a CUDA graph where the launch no longer hides it (>= 4096 tokens)
                tg = (
                    bench_graph(
                        lambda cfg=cfg: tap.append_slot_mapping(
                            key, value, slots, cache, sf, ks_t, vs_t, args.layout, config=cfg
                        ),
                        reps=5,
                    )
                    if n >= 4096
                    else None
                )
                gg = nbytes / tg / 1e6 if tg else None
                rows_sweep.append((n, name, t, nbytes / t / 1e6, name == heur.name, tg, gg))
        best = min(
            (r for r in rows_sweep if r[0] == n),
            key=lambda r: r[5] if r[5] is not None else r[2],
            default=None,
        )
        rows_main.append((n, nbytes, res, heur.name, best))

    for n in tokens:
        measure(n)

    def fmt(ms):
        return "-" if ms is None else (f"{ms * 1e3:.1f} us" if ms < 0.1 else f"{ms:.3f} ms")

    print(
        "\n| tokens | FlashInfer | FI GB/s | Triton (heuristic cfg) | Triton GB/s | FI / Triton | best cfg "
        "| FI graph | Triton graph | FI back-to-back | Triton back-to-back |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n, nbytes, res, heur, best in rows_main:
        fi, tr = res.get("fi"), res["triton"]
        ratio = f"{fi / tr:.2f}x" if fi else "-"
        best_s = f"{best[1]} {fmt(best[5] if best[5] is not None else best[2])}" if best else "-"
        fi_s = f"{fmt(fi)} | {nbytes / fi / 1e6:.0f}" if fi else "- | -"
        print(
            f"| {n} | {fi_s} | {fmt(tr)} ({heur}) | {nbytes / tr / 1e6:.0f} | {ratio} | {best_s} "
            f"| {fmt(res.get('fi_graph'))} | {fmt(res.get('triton_graph'))} "
            f"| {fmt(res.get('fi_b2b'))} | {fmt(res.get('triton_b2b'))} |"
        )
    print(
        "\nFI / Triton > 1 means Triton is faster. 'graph': a CUDA graph of 20 launches / 20 (device time); "
        "'back-to-back': wall time per call of 200 eager calls (host launch cost where it dominates)."
    )
    if rows_sweep:
        print("\n| tokens | config | time | GB/s | graph | graph GB/s | heuristic pick |")
        print("|---|---|---|---|---|---|---|")
        for n, name, t, gbs, picked, tg, gg in rows_sweep:
            gg_s = f"{gg:.0f}" if gg else "-"
            print(
                f"| {n} | {name} | {fmt(t)} | {gbs:.0f} | {fmt(tg)} | {gg_s} | {'*' if picked else ''} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
