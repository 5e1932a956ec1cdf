"""A negative control for the AOT tests: a kernel that casts to ``tl.float8e4nv``.

That cast does not compile for SM80/SM86 (the trap the bundled kernels avoid with integer E4M3
arithmetic), so :func:`nvfp4compat.kernels.aot.compile_all` must report it as failed there and built
for SM89 and newer: proof that the AOT check can fail.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _fp8_cast_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(y_ptr + offs, x.to(tl.float8e4nv).to(tl.int8, bitcast=True))


def aot_kernels() -> list:
    from nvfp4compat.kernels.aot import AotKernel, AotVariant

    sig = {"x_ptr": "*fp32", "y_ptr": "*i8", "BLOCK": "constexpr"}
    return [
        AotKernel("fp8_cast_probe", _fp8_cast_kernel, [AotVariant("b256", sig, {"BLOCK": 256}, 4)])
    ]
