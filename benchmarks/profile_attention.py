"""Run one attention shape of ``bench_attention.py`` a few times, for a profiler to attach to.

On a GPU, under Nsight Compute (the hardware counters behind BENCHMARKS.md's occupancy, register
and DRAM figures)::

    ncu --clock-control none --kernel-name regex:_decode_kernel --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section Occupancy --section LaunchStats \\
        python3 benchmarks/profile_attention.py --shape "decode 16 x 16K"

``--shape`` is a catalogue name (a substring of one) or a description of ``bench_attention.py --shape`` (e.g.
``"decode 1 x 1K"``). ``--decode-config BLOCK_N,WARPS,STAGES[,MAXNREG]``, ``--byte-scales I`` (config I of
``BYTE_SCALE_DECODE_CONFIGS``), ``--programs-per-sm W`` and ``--knob NAME=V`` (a module constant, as the bench's
``--knob`` with one value) select a variant of the Triton decode; ``--baseline FILE`` runs an earlier attention.py
instead.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_attention as ba  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", required=True,
                    help="a shape name of bench_attention.py (substring), or a description (decode 1 x 1K)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--decode-config", default=None)
    ap.add_argument("--byte-scales", type=int, default=None, metavar="I",
                    help="run config I of BYTE_SCALE_DECODE_CONFIGS (block scales loaded as bytes)")
    ap.add_argument("--swap", type=int, default=None, metavar="I",
                    help="run config I of SWAP_DECODE_CONFIGS (K as the first operand of the logits' MMA)")
    ap.add_argument("--gluon", type=int, default=None, metavar="I",
                    help="run config I of GLUON_DECODE_CONFIGS (the Gluon decode kernel)")
    ap.add_argument("--programs-per-sm", type=int, default=None)
    ap.add_argument("--knob", action="append", default=[], metavar="NAME=V",
                    help="set an integer constant of the attention module for the run (repeatable)")
    ap.add_argument("--baseline", default=None, help="an earlier attention.py to run instead")
    args = ap.parse_args(argv)
    import torch

    shapes = [s for s in ba._full_shapes() if args.shape in s.name]
    if not shapes and args.shape.startswith("decode "):
        try:
            shapes = [ba.parse_shape(args.shape)]
        except ValueError as exc:
            sys.stderr.write(f"profile_attention: {exc}\n")
            return 2
    if len(shapes) != 1:
        sys.stderr.write(f"profile_attention: {args.shape!r} matches {[s.name for s in shapes]}; need exactly one\n")
        return 2
    shape = shapes[0]
    if args.baseline:
        spec = importlib.util.spec_from_file_location("nvfp4compat.kernels.triton._bench_baseline", args.baseline)
        assert spec is not None and spec.loader is not None
        att = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = att
        spec.loader.exec_module(att)
    else:
        from nvfp4compat.kernels.triton import attention as att
    over: dict = {}
    if args.decode_config:
        parts = [int(x) for x in args.decode_config.split(",")]
        over["decode"] = att.DecodeConfig(*parts)
    for flag, index, name in (("--byte-scales", args.byte_scales, "BYTE_SCALE_DECODE_CONFIGS"),
                              ("--swap", args.swap, "SWAP_DECODE_CONFIGS"),
                              ("--gluon", args.gluon, "GLUON_DECODE_CONFIGS")):
        if index is None:
            continue
        configs = getattr(att, name, ())
        if not 0 <= index < len(configs) or "decode" in over:
            sys.stderr.write(f"profile_attention: {flag} {index}: need an index below {len(configs)} ({name}) "
                             "and no other decode config\n")
            return 2
        over["decode"] = configs[index]
    knobs = dict(ba._parse_knobs(args.knob))
    if args.programs_per_sm:
        knobs["SPLIT_TARGET_PROGRAMS_PER_SM"] = args.programs_per_sm
    if knobs:
        over["knobs"] = knobs
    case = ba.Case(shape, torch.device("cuda"), 0, fp8=False)
    args_ = (case.nv_data, case.nv_sf, case.block_table, case.seq_lens)
    ks, vs = case.nv_scales
    with ba._overrides(att, over):
        for _ in range(args.iters):
            if shape.kind == "decode":
                att.decode(case.q, *args_, ks, vs, sm_scale=case.sm_scale)
            else:
                att.prefill(case.q, *args_, case.qsl, ks, vs, sm_scale=case.sm_scale)
        torch.cuda.synchronize()
    print(f"profile_attention: {shape.name} x {args.iters} done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
