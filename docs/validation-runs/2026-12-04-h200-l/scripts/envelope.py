"""Gluon beyond its default envelope vs the plain-Triton kernel: same launches, CUDA-graph replay, one run."""
import torch
from nvfp4compat.kernels import reference_attention as ra
from nvfp4compat.kernels.triton import attention as att

bf16, fp16 = torch.bfloat16, torch.float16


def kernel_name():
    k = att.LAST_KERNELS.get("decode")
    return "gluon" if "gluon" in str(getattr(k, "name", "") or getattr(getattr(k, "src", None), "fn", "")) else "plain"


def timed(fn, iters=50):
    fn(); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        for _ in range(iters):
            g.replay()
        b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / iters)
    return min(ts)


CASES = [  # name, lens, hq, hkv, page, dtype, q_len, window, sinks
    ("bf16 g4 16x8K (in the default)", [8192] * 16, 32, 8, 16, bf16, 1, None, False),
    ("fp16 g4 16x8K", [8192] * 16, 32, 8, 16, fp16, 1, None, False),
    ("fp16 g4 ragged 8", [1024, 30720, 4096, 16384, 2048, 24576, 8192, 12288], 32, 8, 16, fp16, 1, None, False),
    ("bf16 g16 16x8K", [8192] * 16, 64, 4, 16, bf16, 1, None, False),
    ("bf16 g8 q2 32x4K", [4096] * 32, 64, 8, 16, bf16, 2, None, False),
    ("bf16 g4 q4 32x4K", [4096] * 32, 32, 8, 16, bf16, 4, None, False),
    ("bf16 g4 16x8K window 4096", [8192] * 16, 32, 8, 16, bf16, 1, 4096, False),
    ("bf16 g4 16x8K sinks", [8192] * 16, 32, 8, 16, bf16, 1, None, True),
    ("bf16 g4 16x8K page 13", [8192] * 16, 32, 8, 13, bf16, 1, None, False),
    ("bf16 g1 64x2K", [2048] * 64, 8, 8, 16, bf16, 1, None, False),
]
print("| case | plain ms | gluon ms | gluon / plain | rel L2 (gluon vs plain) |")
print("|---|---|---|---|---|")
for name, lens, hq, hkv, page, dt, ql, win, snk in CASES:
    g = torch.Generator().manual_seed(0)
    case = ra.make_paged_cache(lens, hkv, 128, page, dtype=dt, device="cuda", generator=g)
    q = torch.randn(len(lens) * ql, hq, 128, device="cuda").to(dt)
    sinks = torch.randn(hq, device="cuda") if snk else None
    out = torch.empty_like(q)
    res = {}
    for full in (False, True):
        att.GLUON_FULL = full

        def fn():
            att.decode(q, case.paged_kv_cache, case.kv_cache_sf, case.block_table, case.seq_lens, case.k_scale,
                       case.v_scale, sm_scale=128**-0.5, kv_layout=case.kv_layout, q_len_per_req=ql,
                       sliding_window=win, sinks=sinks, out=out)
        fn(); torch.cuda.synchronize()
        kn = kernel_name()
        res[full] = (timed(fn), kn, out.clone())
    (tp, kp, op), (tg, kg, og) = res[False], res[True]
    print(f"| {name} | {tp:.4f} ({kp}) | {tg:.4f} ({kg}) | {tg / tp:.2f} | {ra.relative_l2(og, op):.2e} |", flush=True)
