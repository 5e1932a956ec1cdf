"""One compile per kernel variant across serving-step sizes: decode (Gluon and plain), reduce, writer, dequant
at batch / token counts 1, 7, 16, 17, 32, 33 (values Triton would specialize: 1 and multiples of 16)."""
import torch
from nvfp4compat.kernels import get_kernel
from nvfp4compat.kernels.triton import attention as att, dequant as dq, write as wr
from nvfp4compat.kernels.triton import decode_gluon as dg

dev = torch.device("cuda")
H, HKV, D, PS, PAGES = 32, 8, 128, 16, 4096
data = [torch.randint(0, 255, (PAGES, PS, HKV, D // 2), dtype=torch.uint8, device=dev) for _ in range(2)]
sf = [torch.full((PAGES, PS, HKV, D // 16), 0x38, dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn) for _ in range(2)]
write = get_kernel("write", "triton")
deq = get_kernel("dequant", "triton")


def count(k):
    return sum(len(c[0]) for c in k.device_caches.values())


def step(n):
    g = torch.Generator(device="cpu").manual_seed(n)
    lens = torch.randint(1, 2048, (n,), generator=g).to(torch.int32).to(dev)
    bt = torch.randint(0, PAGES, (n, 128), generator=g).to(torch.int32).to(dev)
    q = torch.randn(n, H, D, dtype=torch.bfloat16, device=dev)
    att.decode(q, tuple(data), tuple(sf), bt, lens, 1.0, 1.0, sm_scale=D ** -0.5)
    k = torch.randn(n, HKV, D, dtype=torch.bfloat16, device=dev)
    slots = torch.full((n,), -1, dtype=torch.int64, device=dev)  # padding rows: nothing written
    write(k, k, slots, tuple(data), tuple(sf), 1.0, 1.0, "NHD")
    ok = torch.empty(n, 64, HKV, D, dtype=torch.bfloat16, device=dev)
    deq(tuple(data), tuple(sf), bt, torch.clamp(lens, max=64), 1.0, 1.0, ok, torch.empty_like(ok))


kernels = {"gluon_decode": dg.gluon_decode_kernel, "plain_decode": att._decode_kernel,
           "reduce": att._decode_reduce_kernel, "write": wr._write_kernel, "dequant": dq._dequant_kernel}
for n in (1, 7, 16, 17, 32, 33, 48, 64):
    step(n)
    torch.cuda.synchronize()
    print(n, {name: count(k) for name, k in kernels.items()}, flush=True)
