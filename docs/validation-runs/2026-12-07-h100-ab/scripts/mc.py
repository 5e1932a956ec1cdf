# memcheck of the merge plan: a batch of 300 (empty requests among them) and 40 varlen rows, Gluon and plain kernels
import sys
sys.path.insert(0, "tests/kernels")
import torch
from _attention_helpers import random_lens, run_case
from nvfp4compat.kernels.triton import attention as att
lens = random_lens(300, 2000, 6)
lens = list(lens); lens[5] = lens[77] = 0
for name, cfg in (("gluon", None), ("plain", att.DecodeConfig(64, 4, 1))):
    kw = dict(seq_lens=lens, num_qo_heads=32, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16, return_lse=True,
              use_sinks=True, device="cuda", seed=3)
    if cfg is None:
        r = run_case("triton", "decode", **kw)
    else:
        with att.override_configs(decode=cfg):
            r = run_case("triton", "decode", **kw)
    r.check()
    print(name, att.LAST_KERNELS.get("decode"), "ok", flush=True)
q = [1, 2, 0, 1] * 10
r = run_case("triton", "prefill", seq_lens=random_lens(40, 3000, 7), q_lens=q, num_qo_heads=32, num_kv_heads=8,
             head_dim=128, dtype=torch.bfloat16, return_lse=True, use_sinks=True, device="cuda", seed=4)
r.check()
print("varlen ok")
