"""``python -m nvfp4compat.recall``: needle recall of a recall-model folder per KV mode.

Example::

    python -m nvfp4compat.recall --model tests/data/recall-model --lengths 2048,4096,8192 \\
        --kv bf16,nvfp4 --impl triton

Exit status 0 when every non-bf16 mode is within ``--max-gap`` points of bf16 at every length (or
when bf16 is not among the modes), 1 otherwise. On a machine without CUDA, ``TRITON_INTERPRET=1`` is
set before Triton is imported (small lengths only: the interpreter is slow).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m nvfp4compat.recall", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument(
        "--model",
        type=Path,
        required=True,
        help="recall-model folder (config.json, model.safetensors, tokenizer.json)",
    )
    ap.add_argument("--lengths", default="2048,4096,8192", help="prompt lengths, comma-separated")
    ap.add_argument(
        "--kv", default="bf16,nvfp4", help="KV modes: bf16, nvfp4, nvfp4-fake, fp8-fake"
    )
    ap.add_argument(
        "--impl",
        default="triton",
        choices=["triton", "flashinfer"],
        help="kernels of the nvfp4 mode",
    )
    ap.add_argument(
        "--n-per-depth", type=int, default=1, help="needles per depth (10 depths 0.0..0.9)"
    )
    ap.add_argument(
        "--depths", default=None, help="comma-separated depths (default 0.0,0.1,...,0.9)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--kv-layout", default="NHD", choices=["NHD", "HND"])
    ap.add_argument(
        "--k-scale", type=float, default=1.0, help="global K scale (vLLM's default 1.0)"
    )
    ap.add_argument(
        "--v-scale", type=float, default=1.0, help="global V scale (vLLM's default 1.0)"
    )
    ap.add_argument(
        "--4over6", dest="four_over_six", action="store_true", help="nvfp4_4over6 writer"
    )
    ap.add_argument(
        "--kv-rotation", choices=["hadamard"], default=None,
        help="the nvfp4 mode writes and reads a Hadamard-rotated cache",
    )  # fmt: skip
    ap.add_argument("--device", default=None, help="cuda / cpu (default: cuda when available)")
    ap.add_argument("--max-batch-tokens", type=int, default=65536)
    ap.add_argument("--max-gap", type=float, default=1.0, help="allowed recall gap to bf16, points")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from nvfp4compat.recall import task
    from nvfp4compat.recall.evaluate import evaluate_recall, format_results, recall_gap

    depths = [float(x) for x in args.depths.split(",")] if args.depths else list(task.DEPTHS)
    modes = [m for m in args.kv.split(",") if m]
    results = evaluate_recall(
        args.model,
        [int(x) for x in args.lengths.split(",") if x],
        modes,
        impl=args.impl,
        depths=depths,
        n_per_depth=args.n_per_depth,
        seed=args.seed,
        device=args.device,
        page_size=args.page_size,
        kv_layout=args.kv_layout,
        k_scale=args.k_scale,
        v_scale=args.v_scale,
        nvfp4_4over6=args.four_over_six,
        max_batch_tokens=args.max_batch_tokens,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
        kv_rotation=args.kv_rotation,
    )
    print(format_results(results))
    ok = True
    if "bf16" in results:
        for mode in results:
            if mode == "bf16":
                continue
            gaps = recall_gap(results, mode)
            worst = max(gaps.values())
            verdict = "ok" if worst <= args.max_gap else "FAIL"
            ok &= worst <= args.max_gap
            print(
                f"{mode}: largest recall loss against bf16 {max(worst, 0.0):.1f} pt at one length "
                f"(allowed {args.max_gap}) -> {verdict}"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
