"""The shared Triton NVFP4 primitives agree with the torch reference on every input class.

On a CPU the kernels run under the Triton interpreter; on a CUDA machine they are compiled and run on
the GPU, where the hardware E4M3 conversions (SM89+) are checked too.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from nvfp4compat.kernels import reference as ref
from nvfp4compat.kernels.triton import nvfp4

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@triton.jit
def _roundtrip_kernel(x_ptr, b_ptr, e4_ptr, e4dec_ptr, e2_ptr, e2dec_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    byte = tl.load(b_ptr + offs, mask=mask, other=0).to(tl.int32)
    tl.store(e4_ptr + offs, nvfp4.e4m3_encode(tl.abs(x)).to(tl.uint8), mask=mask)
    tl.store(e4dec_ptr + offs, nvfp4.e4m3_decode(byte), mask=mask)
    tl.store(e2_ptr + offs, nvfp4.e2m1_encode(nvfp4.flush_denormal(x)).to(tl.uint8), mask=mask)
    tl.store(e2dec_ptr + offs, nvfp4.e2m1_decode(byte & 15), mask=mask)


def _special_values() -> torch.Tensor:
    e4 = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (e4[1:] + e4[:-1]) / 2  # e4m3 midpoints: ties
    e2 = torch.tensor([0.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 1e30])
    near = torch.cat(
        [
            e2,
            torch.nextafter(e2, torch.tensor(float("inf"))),
            torch.nextafter(e2, torch.tensor(0.0)),
        ]
    )
    specials = torch.tensor(
        [
            float("inf"),
            float("nan"),
            -0.0,
            1e-40,
            -1e-40,
            448.0,
            464.0,
            463.9,
            500.0,
            2.0**-10,
            2.0**-10 * 1.5,
        ]
    )
    rand = torch.randn(4096) * torch.exp2(torch.randint(-14, 10, (4096,)).float())
    # every bf16 value (both NaN signs, infinities, denormals) and random fp32 bit patterns around the
    # E2M1 range: the encoder's bit-level rounding sees every exponent and mantissa pattern
    all_bf16 = (
        torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    )
    bits = torch.randint(0x3D000000, 0x41000000, (1 << 16,), dtype=torch.int32)
    around = bits.view(torch.float32) * torch.where(torch.rand(1 << 16) < 0.5, -1.0, 1.0)
    x = torch.cat([e4, mids, near, -near, specials, rand, all_bf16, around]).float()
    return x


def test_primitives_match_reference():
    torch.manual_seed(0)
    x = _special_values()
    n = x.numel()
    b = torch.randint(0, 256, (n,), dtype=torch.uint8)
    b[:256] = torch.arange(256, dtype=torch.uint8)
    e4 = torch.empty(n, dtype=torch.uint8)
    e4d = torch.empty(n, dtype=torch.float32)
    e2 = torch.empty(n, dtype=torch.uint8)
    e2d = torch.empty(n, dtype=torch.float32)
    outs = [t.to(DEVICE) for t in (e4, e4d, e2, e2d)]
    _roundtrip_kernel[(triton.cdiv(n, 1024),)](x.to(DEVICE), b.to(DEVICE), *outs, n, BLOCK=1024)
    e4, e4d, e2, e2d = (t.cpu() for t in outs)
    xa = torch.where(torch.isnan(x), torch.zeros_like(x), x.abs())
    assert torch.equal(e4[~torch.isnan(x)], ref.e4m3_encode(xa)[~torch.isnan(x)])
    finite_byte = (b & 0x7F) != 0x7F
    assert torch.equal(e4d[finite_byte], ref.e4m3_decode(b)[finite_byte])
    flushed = torch.where(x.abs() < ref.FLT_MIN_NORMAL, x * 0.0, x)
    assert torch.equal(e2, ref.e2m1_encode(flushed))
    exp = ref.e2m1_decode(b & 15)
    assert torch.equal(e2d, exp) and torch.equal(torch.signbit(e2d), torch.signbit(exp))


@pytest.mark.parametrize(
    "value,byte",
    [
        (448.0, 0x7E),
        (float("inf"), 0x7E),
        (1e6, 0x7E),
        (0.0, 0),
        (2.0**-9, 1),
        (2.0**-10, 0),
        (2.0**-10 * 1.5, 1),
        (2.0**-6, 8),
    ],
)
def test_e4m3_encode_edges(value, byte):
    assert int(ref.e4m3_encode(torch.tensor([value]))[0]) == byte


@triton.jit
def _cvt_kernel(x_ptr, b_ptr, e4_ptr, e4dec_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    byte = tl.load(b_ptr + offs, mask=mask, other=0).to(tl.int32)
    tl.store(e4_ptr + offs, nvfp4.e4m3_encode_cvt(x).to(tl.uint8), mask=mask)
    tl.store(e4dec_ptr + offs, nvfp4.e4m3_decode_cvt(byte), mask=mask)


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="the hardware E4M3 conversions need an SM89+ GPU (the interpreter's fp8 casts differ)",
)
def test_hardware_e4m3_conversions_match_reference():
    """What the writer uses from SM89 on: every non-negative input class it can pass (scales, +inf,
    saturation, subnormal scales, ties) and every non-NaN scale byte."""
    torch.manual_seed(0)
    x = _special_values()
    x = torch.where(torch.isnan(x), torch.zeros_like(x), x.abs())
    n = x.numel()
    b = torch.randint(0, 127, (n,), dtype=torch.uint8)
    b[:127] = torch.arange(127, dtype=torch.uint8)
    e4 = torch.empty(n, dtype=torch.uint8, device=DEVICE)
    e4d = torch.empty(n, dtype=torch.float32, device=DEVICE)
    _cvt_kernel[(triton.cdiv(n, 1024),)](x.to(DEVICE), b.to(DEVICE), e4, e4d, n, BLOCK=1024)
    assert torch.equal(e4.cpu(), ref.e4m3_encode(x))
    assert torch.equal(e4d.cpu(), ref.e4m3_decode(b))
