import sys, time, torch
sys.path.insert(0, "tests/kernels")
from _attention_helpers import run_case
from nvfp4compat.kernels import reference_attention as ra
from nvfp4compat.kernels.triton import attention as att
bf16 = torch.bfloat16
cases = [dict(seq_lens=[3000, 17, 1, 900], num_qo_heads=32, num_kv_heads=8),
         dict(seq_lens=[20000, 5000], num_qo_heads=40, num_kv_heads=8, page_size=32),
         dict(seq_lens=[4000, 333], num_qo_heads=32, num_kv_heads=8, q_len_per_req=3, sliding_window=1000, logits_soft_cap=30.0, use_sinks=True)]
for cfg in att.GLUON_DECODE_CONFIGS:
    for c in cases:
        kw = dict(head_dim=128, dtype=bf16, return_lse=True, device="cuda"); kw.update(c)
        t = time.time()
        try:
            with att.override_configs(decode=cfg):
                r = run_case("triton", "decode", **kw)
                name = getattr(att.LAST_KERNELS.get("decode"), "name", "?")
            p = run_case("triton", "decode", **kw)
            print(f"{cfg.block_n}/{cfg.num_warps}/{cfg.maxnreg} {name} rel_l2 {r.rel_l2:.3e} lse {r.lse_err:.3e} vs plain {ra.relative_l2(r.out, p.out):.3e} plain {p.rel_l2:.3e} finite {bool(torch.isfinite(r.out).all())} {time.time()-t:.1f}s", flush=True)
        except Exception as e:
            print(f"{cfg} FAILED {type(e).__name__}: {str(e)[:1500]}", flush=True)
