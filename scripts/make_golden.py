#!/usr/bin/env python
"""Write NVFP4 conformance vectors produced by the real FlashInfer on a GPU.

Usage (on a CUDA machine with flashinfer-python >= 0.6.15 installed)::

    python scripts/make_golden.py --out tests/data/golden

writes ``tests/data/golden/flashinfer-<version>.pt`` (torch.save, about 250 KB): the inputs, the
global scales, the slot mappings, the cache bytes before and after FlashInfer's
``nvfp4_quantize_append_paged_kv_cache_with_slot_mapping`` (fp16 and bf16, NHD and HND, head_dim 64 to
512, page sizes 16 and 5, edge values; with 0.7.4+ also ``nvfp4_4over6``) and the outputs of
``nvfp4_kv_dequantize_paged`` on two of the written caches, tagged with the FlashInfer, torch and CUDA
versions and the GPU that made them. ``tests/kernels/test_golden.py`` checks the torch reference and the
Triton kernels (under the interpreter, on a CPU) against every file present.

Run it once per FlashInfer release to pin (0.6.15 and 0.7.4), each in its own environment.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "kernels"))

from nvfp4_cases import edge_rows  # noqa: E402

FORMAT = 1


def _cache(
    pages: int, page_size: int, heads: int, head_dim: int, layout: str, gen: torch.Generator
):
    """Random-byte (k_data, v_data, k_sf, v_sf) uint8 tensors, contiguous, in ``layout``."""
    dims = (page_size, heads) if layout == "NHD" else (heads, page_size)
    return [
        torch.randint(0, 256, (pages, *dims, n), dtype=torch.uint8, generator=gen)
        for n in (head_dim // 2, head_dim // 2, head_dim // 16, head_dim // 16)
    ]


def _rows(
    rows: int, heads: int, head_dim: int, dtype: torch.dtype, gen: torch.Generator
) -> torch.Tensor:
    """Model-like rows: gaussian with a few outlier channels and per-block magnitude variation."""
    x = torch.randn(rows, heads, head_dim, generator=gen)
    x[..., torch.randperm(head_dim, generator=gen)[:4]] *= 8.0
    x *= (
        torch.exp2(torch.randint(-3, 4, (rows, heads, head_dim // 16, 1), generator=gen).float())
        .repeat_interleave(16, -1)
        .view(rows, heads, head_dim)
    )
    return x.to(dtype)


def _slots(nnz: int, num_slots: int, gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    s = torch.randperm(num_slots, generator=gen)[:nnz].to(torch.int64)
    s[1] = -1  # padding
    s[nnz // 2] = num_slots + 3  # out of range: skipped
    return s.to(dtype)


def _write(fi, case: dict, device: torch.device, four_over_six) -> dict:
    k_data, v_data, k_sf, v_sf = (t.to(device, copy=True) for t in case["cache_before"])
    f8 = torch.float8_e4m3fn
    kwargs = {"nvfp4_4over6": four_over_six} if four_over_six is not None else {}
    fi.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
        case["key"].to(device),
        case["value"].to(device),
        case["slot_mapping"].to(device),
        (k_data, v_data),
        (k_sf.view(f8), v_sf.view(f8)),
        torch.tensor([case["k_scale"]], dtype=torch.float32, device=device),
        torch.tensor([case["v_scale"]], dtype=torch.float32, device=device),
        case["layout"],
        **kwargs,
    )
    torch.cuda.synchronize()
    case["cache_after"] = [t.cpu() for t in (k_data, v_data, k_sf, v_sf)]
    return case


def _write_case(
    name, dtype, layout, heads, head_dim, page_size, pages, nnz, gen, *, rows=None, four=False
):
    key = _rows(nnz + 3, heads, head_dim, dtype, gen) if rows is None else rows
    value = (
        _rows(key.shape[0], heads, head_dim, dtype, gen)
        if rows is None
        else rows.flip(0).contiguous()
    )
    nnz = min(nnz, key.shape[0])
    k_amax = float(key.float().nan_to_num(0, 0, 0).abs().amax())
    v_amax = float(value.float().nan_to_num(0, 0, 0).abs().amax())
    return {
        "name": name,
        "op": "write",
        "dtype": str(dtype).replace("torch.", ""),
        "layout": layout,
        "heads": heads,
        "head_dim": head_dim,
        "page_size": page_size,
        "num_pages": pages,
        "nvfp4_4over6": four,
        "key": key,
        "value": value,
        "slot_mapping": _slots(
            nnz, pages * page_size, gen, torch.int64 if page_size == 16 else torch.int32
        ),
        # global scales as fp32 values (a natural choice: amax / (6 * 448))
        "k_scale": float(torch.tensor(max(k_amax, 1e-3) / (6 * 448), dtype=torch.float32)),
        "v_scale": float(torch.tensor(max(v_amax, 1e-3) / (6 * 448), dtype=torch.float32)),
        "cache_before": _cache(pages, page_size, heads, head_dim, layout, gen),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "golden")
    parser.add_argument("--seed", type=int, default=20261101)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(
            "make_golden.py needs a CUDA GPU: FlashInfer's NVFP4 helpers have no CPU path",
            file=sys.stderr,
        )
        return 2
    import flashinfer

    for helper in (
        "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping",
        "nvfp4_kv_dequantize_paged",
    ):
        if not hasattr(flashinfer, helper):
            print(
                f"flashinfer {flashinfer.__version__} lacks {helper} (added in 0.6.15)",
                file=sys.stderr,
            )
            return 2
    has_4over6 = (
        "nvfp4_4over6"
        in inspect.signature(
            flashinfer.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping
        ).parameters
    )
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(args.seed)
    cases = []
    # 24 tokens x 2 heads x 128 into 2 pages of 16, NHD and HND sharing the inputs (torch.save stores a
    # shared tensor once): ~12k codes per case, of which ~0.06% land on bf16 rounding midpoints.
    for dtype in (torch.float16, torch.bfloat16):
        base = _write_case(
            f"random-{dtype}-NHD".replace("torch.", ""), dtype, "NHD", 2, 128, 16, 2, 24, gen
        )
        cases.append(base)
        hnd = dict(base, name=base["name"].replace("NHD", "HND"), layout="HND")
        hnd["cache_before"] = _cache(2, 16, 2, 128, "HND", gen)
        cases.append(hnd)
    for head_dim, layout, page_size, heads in (
        (64, "HND", 16, 2),
        (256, "HND", 5, 1),
        (512, "NHD", 5, 1),
    ):
        cases.append(
            _write_case(
                f"random-bfloat16-{layout}-d{head_dim}-p{page_size}",
                torch.bfloat16,
                layout,
                heads,
                head_dim,
                page_size,
                2,
                8,
                gen,
            )
        )
    for dtype in (torch.float16, torch.bfloat16):
        rows = edge_rows(dtype, 128, 2.0**-7)
        case = _write_case(
            f"edge-{dtype}".replace("torch.", ""),
            dtype,
            "NHD",
            1,
            128,
            16,
            1,
            rows.shape[0],
            gen,
            rows=rows,
        )
        case["k_scale"] = case["v_scale"] = 2.0**-7
        case["slot_mapping"] = torch.arange(rows.shape[0], dtype=torch.int64)
        cases.append(case)
    if has_4over6:
        for src in (cases[2], cases[1]):  # bf16 NHD, fp16 HND inputs
            c = dict(src, name=f"4over6-{src['dtype']}-{src['layout']}", nvfp4_4over6=True)
            c["cache_before"] = _cache(2, 16, 2, 128, src["layout"], gen)
            cases.append(c)
    for case in cases:
        four = None
        if case["nvfp4_4over6"]:
            from flashinfer.quantization import NVFP44Over6Config

            four = NVFP44Over6Config(err_mode="MSE")
        _write(flashinfer, case, device, four)

    # Paged dequant of two written caches: two requests over the pages, one shorter than max_seq_len.
    for src in (cases[1], cases[2]):  # fp16 HND, bf16 NHD (2 pages of 16)
        ps, pages = src["page_size"], src["num_pages"]
        max_seq_len = 24
        block_tables = torch.tensor(
            [[1, 0], [-1, 1]], dtype=torch.int32
        )  # -1: positions 0..15 untouched
        seq_lens = torch.tensor([max_seq_len, max_seq_len - 5], dtype=torch.int32)
        dtype = getattr(torch, src["dtype"])
        shape = (2, max_seq_len, src["heads"], src["head_dim"])
        out_k = torch.full(shape, -7.25, dtype=dtype, device=device)
        out_v = torch.full(shape, -7.25, dtype=dtype, device=device)
        k_data, v_data, k_sf, v_sf = (t.to(device) for t in src["cache_after"])
        f8 = torch.float8_e4m3fn
        flashinfer.nvfp4_kv_dequantize_paged(
            (k_data, v_data),
            (k_sf.view(f8), v_sf.view(f8)),
            block_tables.to(device),
            seq_lens.to(device),
            torch.tensor([src["k_scale"]], dtype=torch.float32, device=device),
            torch.tensor([src["v_scale"]], dtype=torch.float32, device=device),
            out_k,
            out_v,
            src["layout"],
        )
        torch.cuda.synchronize()
        cases.append(
            {
                "name": f"dequant-{src['name']}",
                "op": "dequant",
                "source": src["name"],
                "dtype": src["dtype"],
                "layout": src["layout"],
                "heads": src["heads"],
                "head_dim": src["head_dim"],
                "page_size": ps,
                "num_pages": pages,
                "cache": src["cache_after"],
                "block_tables": block_tables,
                "seq_lens": seq_lens,
                "k_scale": src["k_scale"],
                "v_scale": src["v_scale"],
                "fill": -7.25,
                "output_k": out_k.cpu(),
                "output_v": out_v.cpu(),
            }
        )

    meta = {
        "format": FORMAT,
        "flashinfer_version": str(flashinfer.__version__),
        "torch_version": str(torch.__version__),
        "cuda_version": torch.version.cuda,
        "device": torch.cuda.get_device_name(),
        "capability": "{}.{}".format(*torch.cuda.get_device_capability()),
        "seed": args.seed,
        "nvfp4_4over6": has_4over6,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"flashinfer-{meta['flashinfer_version']}.pt"
    torch.save({"meta": meta, "cases": cases}, path)
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB): {len(cases)} cases, {meta}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
