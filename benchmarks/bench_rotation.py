"""What the Hadamard-rotated NVFP4 cache costs and buys: plain vs rotated in one run, same caches.

One GPU run (``python benchmarks/bench_rotation.py --json bench_rotation.json``) takes the shapes of
``bench_attention.py`` (head_dim 128, 32 query / 8 KV heads, page 16, NHD, bf16) and, per shape,
writes one NVFP4 cache plainly and one rotated (``nvfp4compat.kernels.rotation.rotated``: K and V
times the normalized Hadamard matrix before quantizing), then times with the same helpers
(``_time``: CUDA-graph replay and eager ``do_bench``):

* ``write``: the step's new tokens (one per decode request, the chunk of a prefill request),
  plain writer vs rotated writer;
* ``decode`` / ``prefill``: the bound reader vs the same reader wrapped (``Q @ H`` before, output
  times ``H`` after).

Readers and writer are the ones the plan binds here (``resolve(load_matrix(), detect())``;
``NVFP4COMPAT_IMPL`` overrides as usual). The error columns are the relative L2 of each output
against float32 attention on the real (unquantized) K/V: the plain and rotated NVFP4 errors side by
side on this synthetic data (4 outlier K channels). The rotation is pre/post torch ops (float32
matmul), not fused into the kernels: the overhead column is what the issue's 3% budget is checked
against.

``--quick`` is a CPU smoke run (tiny shapes, Triton interpreter): it checks that rotated and plain
errors agree (rotated at most 1.25x plain + 1e-3) and exits 1 otherwise (timings mean nothing there).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_attention import Case, Shape, _err, _full_shapes, _quick_shapes, _time  # noqa: E402


@dataclass
class Row:
    shape: str
    op: str
    impl: str
    plain_ms: float | None
    rotated_ms: float | None
    plain_err: float | None = None
    rotated_err: float | None = None
    note: str = ""

    @property
    def overhead(self) -> float | None:
        if self.plain_ms is None or self.rotated_ms is None:
            return None
        return self.rotated_ms / self.plain_ms - 1.0


def _ms(graph: float | None, eager: float | None) -> float | None:
    return graph if graph is not None else eager


def _bound(op: str) -> tuple[str, Any]:
    from nvfp4compat import detect, load_matrix, resolve
    from nvfp4compat.kernels import get_kernel

    plan = resolve(load_matrix(), detect())
    impl = plan.bindings[op].impl
    if impl is None or impl == "native":
        impl = "triton"
    return impl, get_kernel(op, impl)


def _rows(shape: Shape, device: Any, quick: bool) -> list[Row]:
    import torch

    from nvfp4compat.kernels.rotation import rotated

    case = Case(shape, device, seed=0, fp8=False)
    s = shape
    ks, vs = case.nv_scales
    w_impl, write = _bound("write")
    r_op = "decode" if s.kind == "decode" else "prefill"
    r_impl, read = _bound(r_op)
    write_r, read_r = rotated("write", write), rotated(r_op, read)

    rot_data = tuple(torch.zeros_like(t) for t in case.nv_data)
    rot_sf = tuple(torch.zeros_like(t) for t in case.nv_sf)
    plain_data = tuple(torch.zeros_like(t) for t in case.nv_data)
    plain_sf = tuple(torch.zeros_like(t) for t in case.nv_sf)
    write(case.k, case.v, case.slots, plain_data, plain_sf, ks, vs, "NHD")
    write_r(case.k, case.v, case.slots, rot_data, rot_sf, ks, vs, "NHD")

    # the step's new tokens: the last q_len positions of every request
    offs, new = 0, []
    for n, q in zip(s.seq_lens, s.q_lens, strict=True):
        new.extend(range(offs + n - q, offs + n))
        offs += n
    idx = torch.tensor(new, device=device)
    nk, nv, nslots = case.k[idx], case.v[idx], case.slots[idx]
    scratch = (tuple(torch.zeros_like(t) for t in case.nv_data), tuple(torch.zeros_like(t) for t in case.nv_sf))
    rows: list[Row] = []
    pg, pe, pnote = _time(lambda: write(nk, nv, nslots, *scratch, ks, vs, "NHD"), quick)
    rg, re_, rnote = _time(lambda: write_r(nk, nv, nslots, *scratch, ks, vs, "NHD"), quick)
    rows.append(Row(s.name, f"write ({len(new)} new tokens)", w_impl, _ms(pg, pe), _ms(rg, re_), note=pnote or rnote))

    exact = case.reference("bf16")
    if s.kind == "decode":
        def run(fn, data, sf):
            return fn(case.q, data, sf, case.block_table, case.seq_lens, ks, vs, sm_scale=case.sm_scale)
    else:
        def run(fn, data, sf):
            return fn(case.q, data, sf, case.block_table, case.seq_lens, case.qsl, ks, vs, sm_scale=case.sm_scale)
    out_p, out_r = run(read, plain_data, plain_sf), run(read_r, rot_data, rot_sf)
    if case.q.is_cuda:
        torch.cuda.synchronize()
    pg, pe, pnote = _time(lambda: run(read, plain_data, plain_sf), quick)
    rg, re_, rnote = _time(lambda: run(read_r, rot_data, rot_sf), quick)
    rows.append(Row(s.name, r_op, r_impl, _ms(pg, pe), _ms(rg, re_), _err(out_p, exact), _err(out_r, exact), note=pnote or rnote))
    return rows


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _table(rows: list[Row]) -> str:
    lines = [
        "| shape | op | impl | plain ms | rotated ms | overhead | rel L2 plain | rel L2 rotated | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ov = None if r.overhead is None else 100 * r.overhead
        lines.append(
            f"| {r.shape} | {r.op} | {r.impl} | {_fmt(r.plain_ms, '.4f')} | {_fmt(r.rotated_ms, '.4f')} | "
            f"{_fmt(ov, '+.1f')}% | {_fmt(r.plain_err, '.4f')} | {_fmt(r.rotated_err, '.4f')} | {r.note} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="CPU smoke run under the Triton interpreter")
    p.add_argument("--json", type=Path, help="write the rows as JSON here")
    args = p.parse_args(argv)
    import torch

    if args.quick:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        device, shapes = torch.device("cpu"), _quick_shapes()
    else:
        if not torch.cuda.is_available():
            print("error: no CUDA GPU; run with --quick for the CPU smoke run", file=sys.stderr)
            return 2
        device, shapes = torch.device("cuda"), _full_shapes()
    rows: list[Row] = []
    for shape in shapes:
        rows.extend(_rows(shape, device, args.quick))
    dev = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (Triton interpreter)"
    print(f"device: {dev}; torch {torch.__version__}")
    print(_table(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) | {"overhead": r.overhead} for r in rows], indent=2))
    if args.quick:
        bad = [r for r in rows if r.plain_err is not None and r.rotated_err is not None
               and r.rotated_err > 1.25 * r.plain_err + 1e-3]
        for r in bad:
            print(f"FAIL {r.shape} {r.op}: rotated rel L2 {r.rotated_err:.4f} vs plain {r.plain_err:.4f}", file=sys.stderr)
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
