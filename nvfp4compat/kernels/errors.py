"""Device error flags of the Triton kernels: bad metadata is reported without a host sync.

A kernel that meets a value it cannot use (a device global scale that is NaN, a ``query_start_loc``
that decreases) neither traps nor reads out of bounds: it does something safe and documented (NaN block
scales, zeroed output rows) and ORs a bit into a per-device int32 flag. :func:`check_errors` reads the
flag (one host sync, where the caller can afford it: after a step, in tests) and raises
:class:`KernelInputError` naming the operation and the argument. The writer's
:func:`~nvfp4compat.kernels.triton.write.check_scale_errors` reads the same flag (its two bits only).

Errors that need no device read (shapes, dtypes, Python-number scales) are raised before the launch,
and ``NVFP4COMPAT_CHECK_METADATA=1`` checks the device metadata on the host before each launch
(:func:`nvfp4compat.kernels.checks.check_metadata_values`): a debug mode, it syncs.
"""

from __future__ import annotations

import threading

import torch

__all__ = [
    "ERROR_BITS",
    "KernelInputError",
    "error_flag",
    "check_errors",
    "read_errors",
]

# bit -> (operation, argument, what the kernel found, what it did instead).
ERROR_BITS: dict[int, tuple[str, str, str, str]] = {
    1: ("write", "k_scale", "a device scale that is not finite or not > 0",
        "the blocks it wrote hold scale 0x7F (NaN)"),
    2: ("write", "v_scale", "a device scale that is not finite or not > 0",
        "the blocks it wrote hold scale 0x7F (NaN)"),
    4: ("prefill", "query_start_loc", "entries that decrease",
        "every output row was written as 0 (LSE -inf)"),
    8: ("prefill", "query_start_loc", "entries outside [0, num_tokens]",
        "they were clamped into that range"),
    16: ("prefill", "seq_lens", "entries below 0 or beyond what the block-table row covers",
         "they were clamped to [0, max_pages * page_size]"),
}
SCALE_BITS = 1 | 2
QSL_DECREASING = 4
QSL_OUT_OF_RANGE = 8
SEQ_LENS_OUT_OF_RANGE = 16


class KernelInputError(ValueError):
    """A kernel saw device metadata or a device scale it could not use (see :func:`check_errors`)."""


_flags: dict[torch.device, torch.Tensor] = {}
_flags_lock = threading.Lock()


def _key(device: torch.device | str) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def error_flag(device: torch.device | str) -> torch.Tensor:
    """The per-device int32 error flag ``[1]`` (bits: :data:`ERROR_BITS`), zeroed on first use.

    Call it once, or run one eager launch, before capturing a CUDA graph: a flag first allocated
    during capture is zeroed by the graph itself at each replay.
    """
    device = _key(device)
    flag = _flags.get(device)
    if flag is None:
        with _flags_lock:
            flag = _flags.get(device)
            if flag is None:
                flag = torch.zeros(1, dtype=torch.int32, device=device)
                _flags[device] = flag
    return flag


def read_errors(
    device: torch.device | str | None = None, *, bits: int = -1, reset: bool = True
) -> dict[torch.device, int]:
    """The set bits (masked by ``bits``) of every flag on ``device`` (None: every device used so
    far), cleared when ``reset``. One host sync per device."""
    devices = list(_flags) if device is None else [_key(device)]
    found = {}
    for dev in devices:
        flag = _flags.get(dev)
        if flag is None:
            continue
        got = int(flag.item()) & bits
        if got:
            if reset:
                flag.bitwise_and_(~got)
            found[dev] = got
    return found


def describe(got: int) -> list[str]:
    """One phrase per set bit: ``"prefill: query_start_loc had entries that decrease (...)"``."""
    return [
        f"{op}: {arg} had {what} ({did})"
        for bit, (op, arg, what, did) in ERROR_BITS.items()
        if got & bit
    ]


def check_errors(device: torch.device | str | None = None, *, reset: bool = True) -> None:
    """Raise :class:`KernelInputError` naming every bad argument a kernel launch on ``device``
    reported since the last check (None: every device), then clear the flag when ``reset``.

    A host sync: call it where one is acceptable (after a step, in tests).
    """
    found = read_errors(device, reset=reset)
    if found:
        parts = [f"{dev}: {'; '.join(describe(got))}" for dev, got in found.items()]
        raise KernelInputError(
            "NVFP4 kernels were given bad device metadata: " + " | ".join(parts)
            + ". Fix the caller's metadata; NVFP4COMPAT_CHECK_METADATA=1 checks it on the host before "
            "each launch and names the first bad entry"
        )
