"""Hadamard-rotated NVFP4 KV cache: fused into the Triton kernels, pre/post operations around the rest.

The cache stores ``K @ H`` and ``V @ H`` instead of ``K`` and ``V``, where ``H`` is the normalized
Sylvester Hadamard matrix over the head dimension (``H = H^T = H^-1``, entries ``+-1/sqrt(D)``). The
rotation spreads each head's outlier channels over all its 16-element blocks, so the per-block E4M3
scales fit the E2M1 grid better. Attention is unchanged without quantization:

* scores: ``(Q H) (K H)^T = Q K^T`` (the readers attend with ``Q @ H``; LSE unchanged);
* output: ``P (V H) H = P V`` (the readers' output is multiplied by ``H`` again);
* dequant: ``(K H) H = K`` (a dequantized rotated cache is the real KV).

:func:`rotated` wraps one implementation of an op (``write``, ``dequant``, ``decode``, ``prefill``;
any of ``triton``, ``flashinfer`` or the reference codec), keeping its signature
(``docs/architecture.md``). :func:`plan_kernel` returns the callable a plan binds, wrapped when the
plan says ``kv_rotation``; it refuses a plan whose writer and readers disagree (a cache written
rotated is never read unrotated).

* An implementation that takes a keyword-only ``kv_rotation`` (the Triton ``append_slot_mapping``,
  ``decode``, ``prefill`` and ``dequantize_paged``) is called with it: the rotation is fused into
  its kernel (the writer rotates each K/V row before quantizing, the readers rotate the query after
  loading it and the output before storing it, dequant un-rotates the rows it decodes; see
  :mod:`nvfp4compat.kernels.triton.hadamard`). No extra launch, no extra pass over Q, O, K or V.
  The dequantize-then-attend prefills (``dequant_fa3``, ``dequant_fa2``) take it too: their dequantizer
  un-rotates the rows it writes into the bf16 scratch (``(K H) H = K``), so FlashInfer attends over the
  real K and V with the query and output as they are (decode rows and requests over the scratch cap
  take the Triton kernels' fused rotation).
* Any other (FlashInfer's helpers, the reference codec) gets pre/post operations: a separate torch
  matmul in float32 (``x.float() @ H``, output in ``x``'s dtype) before and/or after the call.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

import torch

from nvfp4compat.plan import check_rotation_bindings
from nvfp4compat.spec import KV_ROTATIONS

__all__ = [
    "HEAD_DIMS",
    "KV_ROTATIONS",
    "RotationError",
    "fused_rotation",
    "fuses_rotation",
    "hadamard",
    "plan_kernel",
    "rotate",
    "rotated",
]

# Head dimensions the rotation serves: powers of two (Sylvester construction) from 64 to 512.
HEAD_DIMS = (64, 128, 256, 512)
_OPS = ("write", "dequant", "decode", "prefill")


class RotationError(ValueError):
    """A rotation that cannot be applied (head dim, rotation kind, op, or an inconsistent plan)."""


def _check_head_dim(head_dim: int, what: str) -> None:
    if head_dim not in HEAD_DIMS:
        raise RotationError(
            f"{what}: the Hadamard KV rotation needs a power-of-two head_dim in {list(HEAD_DIMS)} "
            f"(Sylvester construction), got {head_dim}. Way out: unset NVFP4COMPAT_KV_ROTATION "
            "(an unrotated NVFP4 cache serves any head_dim the kernels take)"
        )


@functools.lru_cache(maxsize=32)
def _hadamard_cached(n: int, device: torch.device) -> torch.Tensor:
    # Built with device ops only (no host-to-device copy), so a first call inside CUDA-graph
    # capture stays capturable: H[i, j] = (-1)^popcount(i & j) / sqrt(n).
    i = torch.arange(n, device=device)
    both = i[:, None] & i[None, :]
    parity = torch.zeros_like(both)
    for bit in range(n.bit_length()):
        parity ^= (both >> bit) & 1
    return (1 - 2 * parity).to(torch.float32) / math.sqrt(n)


def hadamard(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The normalized Sylvester Hadamard matrix, float32 ``[n, n]`` on ``device`` (cached).

    ``H[i, j] = (-1)^popcount(i & j) / sqrt(n)``: symmetric and orthogonal, so ``H @ H = I``.

    Raises
    ------
    RotationError
        When ``n`` is not one of :data:`HEAD_DIMS`.
    """
    _check_head_dim(int(n), "hadamard")
    return _hadamard_cached(int(n), torch.device(device))


def rotate(x: torch.Tensor) -> torch.Tensor:
    """``x @ H`` over the last dim, float32 accumulation, output in ``x``'s dtype (a new tensor).

    Its own inverse: ``rotate(rotate(x)) == x`` up to float32 rounding (and ``x``'s dtype rounding).

    Parameters
    ----------
    x : torch.Tensor
        ``[..., head_dim]`` float16, bfloat16 or float32, any strides; ``head_dim`` in :data:`HEAD_DIMS`.
    """
    if not x.is_floating_point():
        raise RotationError(f"rotate: expected a float16/bfloat16/float32 tensor, got {x.dtype}")
    h = hadamard(x.shape[-1], x.device)
    return torch.matmul(x.float(), h).to(x.dtype)


def _check_kind(rotation: str) -> None:
    if rotation not in KV_ROTATIONS:
        raise RotationError(f"unknown KV rotation {rotation!r}; accepted: {list(KV_ROTATIONS)}")


def fused_rotation(op: str, kv_rotation: object, head_dim: int) -> bool:
    """Whether a kernel entry point's ``kv_rotation`` argument turns its fused rotation on.

    ``None`` is a plain cache (False); ``"hadamard"`` a rotated one (True), for a ``head_dim`` in
    :data:`HEAD_DIMS`.

    Raises
    ------
    RotationError
        For any other value, or another head_dim.
    """
    if kv_rotation is None:
        return False
    if not isinstance(kv_rotation, str) or kv_rotation not in KV_ROTATIONS:
        raise RotationError(
            f"{op}: kv_rotation must be None (a plain cache) or one of {list(KV_ROTATIONS)}, got "
            f"{kv_rotation!r}. Way out: pass the plan's rotation (plan.kv_rotation), or None for an "
            "unrotated cache"
        )
    _check_head_dim(int(head_dim), op)
    return True


def fuses_rotation(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` rotates inside its kernel: it takes a keyword-only ``kv_rotation``."""
    try:
        param = inspect.signature(fn).parameters.get("kv_rotation")
    except (TypeError, ValueError):  # no signature (a builtin): not fused
        return False
    return param is not None and param.kind is inspect.Parameter.KEYWORD_ONLY


def _unrotate_output(
    result: Any, out: torch.Tensor | None, return_lse: bool
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    o, lse = result if return_lse else (result, None)
    back = rotate(o)
    if out is not None:
        out.copy_(back)
        back = out
    if return_lse:
        assert lse is not None
        return back, lse
    return back


def rotated(
    op: str, fn: Callable[..., Any], rotation: str = "hadamard", *, fuse: bool = True
) -> Callable[..., Any]:
    """Wrap one implementation of ``op`` so that it works on a rotated cache; same signature.

    When ``fn`` takes a keyword-only ``kv_rotation`` (:func:`fuses_rotation`: the Triton kernels) and
    ``fuse`` is true, the wrapper calls it with ``kv_rotation=rotation``: the rotation is fused into
    its kernel, with the semantics below. Otherwise the wrapper adds pre/post torch operations:

    * ``write``: rotates ``key`` and ``value`` (``[rows, num_kv_heads, head_dim]``) before ``fn``
      quantizes them.
    * ``decode`` / ``prefill``: calls ``fn`` with ``query @ H`` and returns the output times ``H``
      (written into ``out`` when given); the LSE is returned unchanged.
    * ``dequant``: un-rotates ``output_k``/``output_v`` after ``fn`` fills them: positions
      ``t < seq_lens[b]`` of request ``b`` (the ones ``fn`` writes) become the real K/V, the
      others are left as they were. No host sync.

    Parameters
    ----------
    op : {"write", "dequant", "decode", "prefill"}
    fn : callable
        An implementation with the op's signature (``nvfp4compat.kernels.get_kernel(op, impl)``
        or the reference codec).
    rotation : str
        One of :data:`KV_ROTATIONS`.
    fuse : bool
        False forces the pre/post operations around a kernel that could fuse the rotation (tests,
        ``benchmarks/bench_rotation.py``).

    Returns
    -------
    callable
        The wrapper; ``wrapper.kv_rotation`` is ``rotation``, ``wrapper.kv_rotation_fused`` whether
        the kernel rotates, and ``wrapper.__wrapped__`` is ``fn``.
    """
    _check_kind(rotation)
    if op not in _OPS:
        raise RotationError(f"unknown op {op!r}; the rotation wraps {list(_OPS)}")
    already = getattr(fn, "kv_rotation", None)
    if already is not None:
        raise RotationError(f"{op}: {fn!r} is already rotated ({already}); rotating twice would undo it")
    sig = inspect.signature(fn)
    can_fuse = fuses_rotation(fn)
    fused = fuse and can_fuse
    call: Callable[..., Any] = fn
    if can_fuse:
        # kv_rotation is the wrapper's business: callers see the op's signature without it
        sig = sig.replace(parameters=[p for p in sig.parameters.values() if p.name != "kv_rotation"])
        kernel_rotation = rotation if fused else None
        name = op

        def call(*args: Any, **kwargs: Any) -> Any:
            if "kv_rotation" in kwargs:
                raise RotationError(
                    f"{name}: this {rotation}-rotated wrapper passes kv_rotation itself, got "
                    f"kv_rotation={kwargs['kv_rotation']!r}; call the unwrapped kernel to choose"
                )
            return fn(*args, kv_rotation=kernel_rotation, **kwargs)

    wrapper: Callable[..., Any]
    if fused:
        wrapper = call
    elif op == "write":

        def write(
            key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor, *args: Any, **kwargs: Any
        ) -> Any:
            _check_head_dim(key.shape[-1], "write")
            return call(rotate(key), rotate(value), slot_mapping, *args, **kwargs)

        wrapper = write
    elif op in ("decode", "prefill"):

        def read(
            query: torch.Tensor,
            *args: Any,
            out: torch.Tensor | None = None,
            return_lse: bool = False,
            **kwargs: Any,
        ) -> Any:
            _check_head_dim(query.shape[-1], op)
            result = call(rotate(query), *args, out=out, return_lse=return_lse, **kwargs)
            return _unrotate_output(result, out, return_lse)

        wrapper = read
    else:

        def dequant(*args: Any, **kwargs: Any) -> Any:
            bound = sig.bind(*args, **kwargs)
            out_k, out_v = bound.arguments["output_k"], bound.arguments["output_v"]
            seq_lens = bound.arguments["seq_lens"]
            _check_head_dim(out_k.shape[-1], "dequant")
            result = call(*args, **kwargs)
            pos = torch.arange(out_k.shape[1], device=out_k.device)
            written = (pos[None, :] < seq_lens.to(out_k.device).long()[:, None])[..., None, None]
            for t in (out_k, out_v):
                t.copy_(torch.where(written, rotate(t), t))
            return result

        wrapper = dequant

    functools.update_wrapper(wrapper, fn)
    setattr(wrapper, "__signature__", sig)  # noqa: B010
    setattr(wrapper, "kv_rotation", rotation)  # noqa: B010
    setattr(wrapper, "kv_rotation_fused", fused)  # noqa: B010
    return wrapper


def plan_kernel(plan: Any, op: str) -> Callable[..., Any]:
    """The callable ``plan`` binds for ``op``: ``get_kernel(op, impl)``, rotated when the plan says so.

    Parameters
    ----------
    plan : nvfp4compat.plan.Plan
        A resolved plan (``plan.bindings[op].options["kv_rotation"]`` names the rotation).
    op : {"write", "dequant", "decode", "prefill"}

    Raises
    ------
    RotationError
        When ``op`` is unbound, or when the plan's bindings disagree on the rotation (a cache
        written rotated would be read unrotated, or the reverse).
    """
    from nvfp4compat.kernels import get_kernel

    bindings = getattr(plan, "bindings", None) or {}
    try:
        rotation = check_rotation_bindings(bindings)
    except ValueError as exc:
        raise RotationError(str(exc)) from None
    binding = bindings.get(op)
    impl = getattr(binding, "impl", None)
    if impl is None:
        why = getattr(binding, "reason", "no binding")
        raise RotationError(f"the plan binds no implementation for {op}: {why}")
    fn = get_kernel(op, impl)
    return rotated(op, fn, rotation) if rotation is not None else fn
