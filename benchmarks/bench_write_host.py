#!/usr/bin/env python
"""Host cost of one eager decode-sized NVFP4 append: where the wall time of a call goes.

vLLM's PIECEWISE CUDA graphs leave the per-layer KV write outside the graph, so each decode step pays
the writer's host path once per layer. This prints wall time per call over back-to-back eager calls
(one token, 8 KV heads x 128, bf16, NHD, page 16) for:

* the Triton writer through its public function (``append_slot_mapping``: signature cache + launch),
* the same Triton kernel launched directly through ``JITFunction.__getitem__`` with the same arguments
  (Triton's own launch path: the floor for any wrapper),
* FlashInfer's ``nvfp4_quantize_append_paged_kv_cache_with_slot_mapping`` (if installed),
* two tiny torch kernels (the machine's eager-launch floor),

then a cProfile of the Triton calls. GPU only::

    python benchmarks/bench_write_host.py [--calls 500]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--tokens", type=int, default=1)
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU: this benchmark measures the eager launch path", file=sys.stderr)
        return 2
    from nvfp4compat.kernels.triton import write as tap

    dev = torch.device("cuda")
    heads, dim, page, n = 8, 128, 16, args.tokens
    pages = max(64, -(-2 * n // page))
    cache = tuple(
        torch.zeros(pages, page, heads, dim // 2, dtype=torch.uint8, device=dev) for _ in range(2)
    )
    sf = tuple(
        torch.zeros(pages, page, heads, dim // 16, dtype=torch.float8_e4m3fn, device=dev)
        for _ in range(2)
    )
    key = torch.randn(n, heads, dim, device=dev, dtype=torch.bfloat16)
    value = torch.randn(n, heads, dim, device=dev, dtype=torch.bfloat16)
    slots = torch.arange(n, device=dev)
    ks = torch.tensor([0.01], device=dev)

    def per_call(fn) -> float:
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e6 / args.calls

    def triton_api(scale):
        return lambda: tap.append_slot_mapping(key, value, slots, cache, sf, scale, scale, "NHD")

    rows: list[tuple[str, float]] = []
    per_call(triton_api(ks))  # warm the GPU clocks and the JIT caches first
    rows.append(("triton append_slot_mapping, device scales", per_call(triton_api(ks))))
    rows.append(("triton append_slot_mapping, float scales", per_call(triton_api(0.01))))

    # the kernel launch the public function makes, replayed through Triton's JIT launch path
    kernel = tap._write_kernel
    seen: dict = {}

    class _Capture:
        def __getitem__(self, grid):
            def call(*a, **kw):
                seen.update(grid=grid, a=a, kw=kw)
                return kernel[grid](*a, **kw)

            return call

    tap._write_kernel = _Capture()
    try:
        tap.append_slot_mapping(key, value, slots, cache, sf, ks, ks, "NHD")
    finally:
        tap._write_kernel = kernel
    rows.append(
        (
            "triton JIT launch alone, same arguments",
            per_call(lambda: kernel[seen["grid"]](*seen["a"], **seen["kw"])),
        )
    )
    try:
        import flashinfer

        fi = flashinfer.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping
        rows.append(
            (
                f"flashinfer {flashinfer.__version__}, float scales",
                per_call(lambda: fi(key, value, slots, cache, sf, 0.01, 0.01, "NHD")),
            )
        )
        rows.append(
            (
                f"flashinfer {flashinfer.__version__}, device scales",
                per_call(lambda: fi(key, value, slots, cache, sf, ks, ks, "NHD")),
            )
        )
    except (ImportError, AttributeError) as exc:
        print(f"flashinfer writer unavailable: {exc}")
    rows.append(
        ("two tiny torch kernels (eager floor)", per_call(lambda: (key.add_(0), value.add_(0))))
    )

    print(f"# eager append host cost: {n} token(s) x {heads} heads x {dim}, {args.calls} calls")
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}")
    print("\n| path | us per call |\n|---|---|")
    for name, us in rows:
        print(f"| {name} | {us:.1f} |")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        tap.append_slot_mapping(key, value, slots, cache, sf, ks, ks, "NHD")
    torch.cuda.synchronize()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
    print("\n" + out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
