"""Dequantize-then-attend prefill over an NVFP4 KV cache: the Triton dequantizer, then FlashInfer's FA3 or FA2.

Two implementations of the ``prefill`` contract (:class:`nvfp4compat.kernels.contract.PrefillArgs`), one
code path with the FlashInfer backend as its parameter: ``dequant_fa3`` (:func:`prefill_fa3`, SM90 /
Hopper, FlashInfer's FA3) and ``dequant_fa2`` (:func:`prefill_fa2`, SM80 and newer, FlashInfer's FA2):

1. Requests with at most ``16 // G`` query tokens (``G = num_qo_heads // num_kv_heads``; the decode
   rows of a mixed batch) go through the Triton split-KV decode path, in the same call.
2. Every other request's KV, positions ``[0, seq_len_b)``, is dequantized once by the Triton paged
   dequantizer into a contiguous per-device scratch (K and V, each ``[total_kv, num_kv_heads,
   head_dim]``, the query's dtype): V as ``e2m1 * sf * v_scale``, K as ``e2m1 * sf`` (exact in
   fp16/bf16) with ``k_scale`` folded into the softmax scale, as the fused kernels do. Rounding
   ``e2m1 * sf * k_scale`` to bf16 instead moves every logit by up to 2^-9 relative and the LSE by
   up to 3e-2 on the test caches (outlier key channels), against 1e-2 for the other implementations.
   Then FlashInfer's ``BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend=...)``
   attends over it (causal bottom-right, ``window_left = sliding_window - 1``, soft-cap; its base-2
   LSE is returned in natural-log units like every other implementation).

The scratch is bounded by ``NVFP4COMPAT_PREFILL_SCRATCH_MB`` (default 1024 MiB, K and V together;
``docs/attention.md``): consecutive prefill requests are processed in groups whose KV fits, and a
single request whose KV alone exceeds the cap runs through the fused Triton prefill (debug log).

Host metadata: the grouping is planned on the host from ``seq_lens_cpu`` / ``query_start_loc_cpu``
(vLLM's metadata builder has both); without them the device tensors are read once (a sync). vLLM never
captures prefill in CUDA graphs; a call under graph capture is refused.

Non-causal calls with a sliding window never reach FA2: FlashInfer's FA2 ragged run returned wrong rows
there (relative L2 0.61/0.93 on an H200, FlashInfer 0.6.14), so ``dequant_fa2`` hands such a call whole
to the fused Triton prefill (FA3 is right and keeps it). vLLM's decoder prefill is always causal.

Not supported (a clear error naming the feature and the way out, ``NVFP4COMPAT_IMPL=prefill=triton``):
attention sinks (neither ragged run takes them: FlashInfer's FA3 ragged run, and the FA2 ragged run's
stock module, ``flashinfer/prefill.py`` BatchPrefillWithRaggedKVCacheWrapper.run [0.6.10..0.7.4]) and
head_dim other than 64/128/256 (FA3's kernel instantiations,
``include/flashinfer/attention/hopper/prefill_sm90.cuh`` [0.7.2.post1]; for FA2 the head dims the
matrix records, ``fa2_ragged`` in ``matrix/flashinfer.yaml``: 512 is not claimed there).

Tests replace the attention step with the float32 reference through :func:`attend_backend` (FlashInfer's
kernels do not run on the CPU); nothing else uses that hook.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any

import torch

from nvfp4compat.kernels.checks import check_query_start_loc
from nvfp4compat.kernels.contract import AttentionResult, PrefillArgs, implements
from nvfp4compat.kernels.layout import normalize_cache
from nvfp4compat.kernels.rotation import fused_rotation
from nvfp4compat.kernels.triton import attention as tri
from nvfp4compat.kernels.triton.dequant import dequantize_paged

__all__ = [
    "prefill_fa3",
    "prefill_fa2",
    "BACKEND_HEAD_DIMS",
    "backend_problem",
    "SCRATCH_ENV",
    "DEFAULT_SCRATCH_MB",
    "scratch_cap_bytes",
    "plan_groups",
    "PrefillGroup",
    "attend_backend",
    "AttendArgs",
    "reference_attend",
    "flashinfer_attend",
    "clear_cache",
]

logger = logging.getLogger("nvfp4compat.kernels.prefill_dequant")

SCRATCH_ENV = "NVFP4COMPAT_PREFILL_SCRATCH_MB"
DEFAULT_SCRATCH_MB = 1024
# The head dims each ragged backend serves here, as matrix/flashinfer.yaml records them (fa3_ragged,
# fa2_ragged): FlashInfer's SM90 prefill instantiates head_dim_vo 64, 128 and 256 (prefill_sm90.cuh
# static_asserts); its FA2 prefill is JIT-built for multiples of 64 (prefill.cuh NUM_MMA_D_QK % 4), of
# which 64/128/256 are claimed (512 is not: the fused Triton prefill keeps it).
BACKEND_HEAD_DIMS: dict[str, tuple[int, ...]] = {"fa3": (64, 128, 256), "fa2": (64, 128, 256)}
_LN2 = 0.6931471805599453
_WORKSPACE_BYTES = 128 * 1024 * 1024
_WAY_OUT = "use the fused Triton prefill: get_kernel('prefill', 'triton'), or NVFP4COMPAT_IMPL=prefill=triton"


@dataclass(slots=True)
class AttendArgs:
    """One attention step over a group's dequantized scratch (FlashInfer's ragged prefill arguments).

    ``q`` ``[q_tokens, num_qo_heads, head_dim]`` (the group's query rows), ``k``/``v`` contiguous
    ``[kv_tokens, num_kv_heads, head_dim]``, host ``qo_indptr``/``kv_indptr`` (``[requests + 1]``);
    the step writes ``out`` (like ``q``) and, when given, the natural-log ``lse``
    ``[q_tokens, num_qo_heads]``.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    qo_indptr: list[int]
    kv_indptr: list[int]
    _: KW_ONLY
    sm_scale: float
    causal: bool
    window_left: int
    logits_soft_cap: float | None
    out: torch.Tensor
    lse: torch.Tensor | None


AttendFn = Callable[[AttendArgs], None]


# ------------------------------------------------------------------------------------------------
# Host planning: which requests go where, and the scratch layout
# ------------------------------------------------------------------------------------------------


def scratch_cap_bytes() -> int:
    """The scratch cap in bytes, K and V together (``NVFP4COMPAT_PREFILL_SCRATCH_MB``, default 1024)."""
    raw = os.environ.get(SCRATCH_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_SCRATCH_MB << 20
    try:
        mb = int(raw)
    except ValueError:
        mb = -1
    if mb < 1:
        raise ValueError(
            f"{SCRATCH_ENV}={raw!r}: expected a positive integer number of MiB (default "
            f"{DEFAULT_SCRATCH_MB}); unset it or set e.g. {SCRATCH_ENV}=512"
        )
    return mb << 20


@dataclass(frozen=True)
class PrefillGroup:
    """Consecutive prefill requests ``[first, last]`` attended in one FlashInfer call over one scratch fill.

    ``runs``: ``(first_request, count, seq_len)`` of the dequantizer launches (consecutive requests of
    equal ``seq_len`` share one launch: its padded ``[count, seq_len, H, D]`` output is then exactly the
    ragged layout). ``kv_indptr``/``qo_indptr`` are relative to the group (host lists, ``len = n + 1``).
    """

    first: int
    last: int
    runs: tuple[tuple[int, int, int], ...]
    qo_indptr: tuple[int, ...]
    kv_indptr: tuple[int, ...]

    @property
    def kv_tokens(self) -> int:
        return self.kv_indptr[-1]


@dataclass(frozen=True)
class Plan:
    """The host plan of one call: decode rows, attention groups, and requests too large for the scratch."""

    has_decode_rows: bool
    groups: tuple[PrefillGroup, ...]
    oversize: tuple[int, ...]


def plan_groups(seq_lens: Sequence[int], qsl: Sequence[int], qmax: int, cap_tokens: int) -> Plan:
    """Split a batch: requests with ``0 < q_len <= qmax`` are decode rows; the others with queries
    form groups of consecutive requests whose KV (``sum seq_len``) fits ``cap_tokens``; a request
    whose ``seq_len`` alone exceeds ``cap_tokens`` is listed in ``oversize``. Requests without
    queries, decode rows and oversize requests end a group (a group's query rows stay contiguous)."""
    groups: list[PrefillGroup] = []
    oversize: list[int] = []
    has_decode = False
    cur: list[int] = []

    def close() -> None:
        if not cur:
            return
        runs: list[tuple[int, int, int]] = []
        kv = [0]
        for b in cur:
            n = seq_lens[b]
            if runs and runs[-1][2] == n:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1, n)
            else:
                runs.append((b, 1, n))
            kv.append(kv[-1] + n)
        q0 = qsl[cur[0]]
        groups.append(
            PrefillGroup(
                first=cur[0],
                last=cur[-1],
                runs=tuple(runs),
                qo_indptr=tuple(qsl[b] - q0 for b in [*cur, cur[-1] + 1]),
                kv_indptr=tuple(kv),
            )  # fmt: skip
        )
        cur.clear()

    total = 0
    for b, n in enumerate(seq_lens):
        q_len = qsl[b + 1] - qsl[b]
        if q_len <= qmax:
            has_decode |= q_len > 0
            close()
            continue
        if n > cap_tokens:
            close()
            oversize.append(b)
            continue
        if cur and total + n > cap_tokens:
            close()
        if not cur:
            total = 0
        cur.append(b)
        total += n
    close()
    return Plan(has_decode_rows=has_decode, groups=tuple(groups), oversize=tuple(oversize))


# ------------------------------------------------------------------------------------------------
# Per-device state: scratch, FlashInfer workspace and wrappers
# ------------------------------------------------------------------------------------------------

_lock = threading.Lock()
_scratch: dict[torch.device, torch.Tensor] = {}
_workspaces: dict[torch.device, torch.Tensor] = {}
_wrappers: dict[tuple[Any, ...], list[Any]] = {}  # (device, backend) -> [wrapper, last plan key]
_attend_override: AttendFn | None = None
# id(tensor) -> (weak reference, version counter, value): device scales read on the host once per value
_host_scales: dict[int, tuple[Any, int, float]] = {}


def clear_cache() -> None:
    """Free the scratch, the FlashInfer workspaces and the cached wrappers of every device."""
    with _lock:
        _scratch.clear()
        _workspaces.clear()
        _wrappers.clear()
        _host_scales.clear()


def _host_scale(t: torch.Tensor) -> float:
    """A one-element scale tensor's value on the host, read (a device sync) once per value.

    FlashInfer takes the softmax scale on the host, and vLLM's ``k_scale`` is a device tensor. Reading
    it with ``.item()`` on every call syncs the stream once per layer and prefill step. A tensor changed
    in place moves its version counter, and a replaced one is another object (checked by a weak
    reference, so a new tensor at a dead one's ``id`` is read afresh): either is read again."""
    key, ver = id(t), t._version
    with _lock:
        hit = _host_scales.get(key)
        if hit is not None and hit[0]() is t and hit[1] == ver:
            return hit[2]
    value = float(t.reshape(()).item())
    with _lock:
        if len(_host_scales) > 4096:  # engines hold one per layer; drop the dead
            for k in [k for k, v in _host_scales.items() if v[0]() is None]:
                del _host_scales[k]
        _host_scales[key] = (weakref.ref(t), ver, value)
    return value


def _scratch_bytes(device: torch.device, nbytes: int, cap: int) -> torch.Tensor:
    """The device's scratch, grown (never shrunk) to at least ``nbytes``: to twice its size, at most
    ``cap``, so contexts that grow chunk by chunk do not reallocate every step. Work queued on the
    stream over a replaced buffer stays valid (the caching allocator reuses memory in stream order)."""
    with _lock:
        buf = _scratch.get(device)
        if buf is None or buf.numel() < nbytes:
            size = max(nbytes, min(cap, 2 * buf.numel())) if buf is not None else nbytes
            _scratch.pop(device, None)
            buf = torch.empty(size, dtype=torch.uint8, device=device)
            _scratch[device] = buf
        return buf


@contextlib.contextmanager
def attend_backend(fn: AttendFn) -> Iterator[None]:
    """Tests and benchmarks only: run ``fn`` instead of FlashInfer's FA3/FA2 for the attention step (the
    dequantizer, grouping and decode routing stay real; the GPU/backend check is skipped). ``fn``
    receives the step's :class:`AttendArgs` (the ragged query, the scratch K/V views, host
    ``qo_indptr``/``kv_indptr`` and the options) and writes ``out`` and the natural-log ``lse``."""
    global _attend_override
    prev = _attend_override
    _attend_override = fn
    try:
        yield
    finally:
        _attend_override = prev


def flashinfer_attend(backend: str = "fa3") -> AttendFn:
    """The attention step through FlashInfer's ``BatchPrefillWithRaggedKVCacheWrapper(backend=...)``.

    ``"fa3"`` is what :func:`prefill_fa3` runs, ``"fa2"`` what :func:`prefill_fa2` runs. One wrapper
    per (device, backend) serves every layer; it is re-planned only when the plan's inputs change.
    """

    def attend(a: AttendArgs) -> None:
        import flashinfer

        q, k, v, out, lse = a.q.contiguous(), a.k, a.v, a.out, a.lse  # a strided query (e.g. a view of vLLM's fused QKV) is copied once
        device = q.device
        with _lock:
            planned = _wrappers.get((device, backend))
            if planned is None:
                ws = _workspaces.get(device)
                if ws is None:
                    ws = _workspaces[device] = torch.empty(
                        _WORKSPACE_BYTES, dtype=torch.uint8, device=device
                    )
                wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=backend)
                planned = _wrappers[(device, backend)] = [wrapper, None]
        key = (tuple(a.qo_indptr), tuple(a.kv_indptr), q.dtype, q.shape[1], k.shape[1], q.shape[2],
               a.causal, a.window_left, a.logits_soft_cap, float(a.sm_scale))  # fmt: skip
        wrapper = planned[0]
        if planned[1] != key:
            wrapper.plan(
                torch.tensor(a.qo_indptr, dtype=torch.int32), torch.tensor(a.kv_indptr, dtype=torch.int32),
                q.shape[1], k.shape[1], q.shape[2], causal=a.causal, window_left=a.window_left,
                logits_soft_cap=a.logits_soft_cap, sm_scale=float(a.sm_scale), q_data_type=q.dtype,
                kv_data_type=k.dtype, o_data_type=q.dtype,
            )  # fmt: skip
            planned[1] = key
        direct = out.is_contiguous()
        res = wrapper.run(q, k, v, out=out if direct else None, return_lse=lse is not None)
        o, fl = (res[0], res[1]) if lse is not None else (res, None)
        if not direct:
            out.copy_(o)
        if lse is not None:
            assert fl is not None
            lse.copy_(fl * _LN2)

    return attend


_flashinfer_attends: dict[str, AttendFn] = {b: flashinfer_attend(b) for b in BACKEND_HEAD_DIMS}


def reference_attend(a: AttendArgs) -> None:
    """The float32 reference in FlashInfer's place (:func:`attend_backend` in tests)."""
    from nvfp4compat.kernels.reference_attention import attention_reference

    kv = a.kv_indptr
    keys = [a.k[kv[i] : kv[i + 1]] for i in range(len(kv) - 1)]
    values = [a.v[kv[i] : kv[i + 1]] for i in range(len(kv) - 1)]
    o, lse_ref = attention_reference(
        a.q, keys, values, torch.tensor(a.qo_indptr, dtype=torch.int32), sm_scale=a.sm_scale,
        causal=a.causal, sliding_window=a.window_left + 1 if a.window_left >= 0 else None,
        logits_soft_cap=a.logits_soft_cap,
    )  # fmt: skip
    a.out.copy_(o.to(a.out.dtype))
    if a.lse is not None:
        a.lse.copy_(lse_ref)


# ------------------------------------------------------------------------------------------------
# The operation
# ------------------------------------------------------------------------------------------------


def _unsupported(backend: str, feature: str) -> NotImplementedError:
    return NotImplementedError(f"prefill (dequant_{backend}): {feature}; {_WAY_OUT}")


def _host_ints(t: torch.Tensor | None, device_t: torch.Tensor, name: str, n: int) -> list[int]:
    """A host copy of a length tensor: ``t`` when given (checked), else ``device_t`` read once."""
    if t is None:
        return [int(x) for x in device_t.to("cpu").tolist()]
    if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.dim() != 1 or t.shape[0] != n:
        raise ValueError(
            f"prefill (dequant): {name} must be a 1-D CPU tensor of {n} entries (vLLM's host copy), "
            f"got {getattr(t, 'device', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}"
        )
    return [int(x) for x in t.tolist()]


@dataclass(slots=True)
class DequantPrefillArgs(PrefillArgs):
    """The ``prefill`` op's arguments (:class:`~nvfp4compat.kernels.contract.PrefillArgs`) with the
    composite's own options, ``seq_lens_cpu``, ``query_start_loc_cpu`` and ``kv_rotation``
    (:func:`prefill_fa3`)."""

    _: KW_ONLY
    seq_lens_cpu: torch.Tensor | None = None
    query_start_loc_cpu: torch.Tensor | None = None
    kv_rotation: str | None = None


@implements(DequantPrefillArgs)
def prefill_fa3(a: DequantPrefillArgs) -> AttentionResult:
    """The ``prefill`` op (:class:`~nvfp4compat.kernels.contract.PrefillArgs`) as ``dequant_fa3``: each
    prefill request's KV dequantized once into a bf16/fp16 scratch, then FlashInfer's FA3 (SM90)
    over it (module docstring).

    Not CUDA-graph safe (vLLM never captures prefill): the host plan needs the lengths, and a call
    under stream capture raises :class:`RuntimeError`. A device-tensor ``k_scale`` is read to the host
    once per call (FA3 takes the softmax scale as a host float).

    Parameters
    ----------
    sinks : None
        Not supported by FA3's ragged run: anything but None raises :class:`NotImplementedError`.
    seq_lens_cpu, query_start_loc_cpu : torch.Tensor, optional
        Host copies of ``seq_lens`` ([batch]) and ``query_start_loc`` ([batch + 1]) with the same
        values (vLLM's metadata has both); without them the device tensors are read once (a sync).
    kv_rotation : str, optional
        ``"hadamard"``: the cache holds ``K H`` and ``V H`` (:mod:`nvfp4compat.kernels.rotation`).
        The rotation is fused: the dequantizer un-rotates the rows it writes into the scratch
        (``(K H) H = K``), so FA3 attends over the real K and V with the query and output as they
        are, with no pass over Q or O; decode rows and oversize requests take the Triton kernels'
        fused rotation. ``None``: a plain cache. The un-rotated K is rounded to the query's dtype in
        the scratch (``K H`` is exact there, ``K`` is not), which moves the logits by about 2^-9
        relative, as rounding ``Q H`` does in the pre/post wrapper: on the GPU test's cache (outlier key
        channels, LSE up to 15) the LSE is within 2.6e-2 of the exact one (pre/post: 1.6e-2) and the
        output within 5e-3 relative L2 (pre/post: 3.5e-3).

    Raises
    ------
    NotImplementedError
        For sinks, a head_dim outside [64, 128, 256], or a GPU FA3 does not run on here;
        the message names ``NVFP4COMPAT_IMPL=prefill=triton``.
    RuntimeError
        Under CUDA graph capture.
    """
    return _prefill("fa3", a)


@implements(DequantPrefillArgs)
def prefill_fa2(a: DequantPrefillArgs) -> AttentionResult:
    """The ``prefill`` op (:class:`~nvfp4compat.kernels.contract.PrefillArgs`) as ``dequant_fa2``: each
    prefill request's KV dequantized once into a bf16/fp16 scratch, then FlashInfer's FA2 (SM80 and
    newer) over it: :func:`prefill_fa3`'s composite for the archs without FA3 (module docstring).

    Graph safety, the host copies ``seq_lens_cpu``/``query_start_loc_cpu``, the device ``k_scale``
    read and the refusals (sinks, head_dim outside [64, 128, 256], a GPU the backend does not run on,
    stream capture) are :func:`prefill_fa3`'s, with FA2 in place of FA3.
    """
    return _prefill("fa2", a)


def _prefill(backend: str, call: DequantPrefillArgs) -> AttentionResult:
    """The shared body of :func:`prefill_fa3` and :func:`prefill_fa2` (``backend``: "fa3" or "fa2")."""
    impl = f"dequant_{backend}"
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"prefill ({impl}): called during CUDA graph capture; this implementation plans on the "
            f"host and cannot be captured (vLLM never captures prefill); {_WAY_OUT}"
        )
    name = backend.upper()
    if call.sinks is not None:
        raise _unsupported(
            backend, f"attention sinks are not supported by FlashInfer's {name} ragged prefill"
        )
    views = normalize_cache(call.paged_kv_cache, call.kv_cache_sf, call.kv_layout)
    rotation = call.kv_rotation if fused_rotation("prefill", call.kv_rotation, views.head_dim) else None
    dims = BACKEND_HEAD_DIMS[backend]
    if views.head_dim not in dims:
        raise _unsupported(
            backend,
            f"head_dim {views.head_dim} is not served by FlashInfer's {name} ragged prefill here "
            f"(supported: {list(dims)})",
        )
    query, block_table, seq_lens, causal = call.query, call.block_table, call.seq_lens, call.causal
    sm_scale, sliding_window, logits_soft_cap = call.sm_scale, call.sliding_window, call.logits_soft_cap
    a = tri._check_common(
        "prefill", query, views, block_table, seq_lens, call.k_scale, call.v_scale, sm_scale,
        sliding_window, logits_soft_cap, None, call.out, call.return_lse,
    )  # fmt: skip
    if rotation is not None:  # decode rows and oversize requests stage the rotated query in out
        tri._check_rotation_out("prefill", query, call.out)
    batch = block_table.shape[0]
    qsl = check_query_start_loc("prefill", call.query_start_loc, batch, views.device)
    num_tokens = query.shape[0]
    if batch == 0 or num_tokens == 0:
        return tri._result(a)
    lens = _host_ints(call.seq_lens_cpu, seq_lens, "seq_lens_cpu", batch)
    starts = _host_ints(call.query_start_loc_cpu, qsl, "query_start_loc_cpu", batch + 1)
    if (
        starts[0] != 0
        or starts[-1] != num_tokens
        or any(starts[i + 1] < starts[i] for i in range(batch))
    ):
        raise ValueError(
            f"prefill: query_start_loc must start at 0, be non-decreasing and end at num_tokens "
            f"{num_tokens}, got {starts if batch <= 16 else starts[:8] + ['...'] + starts[-8:]}"
        )
    max_pages = block_table.shape[1]
    for b in range(batch):
        q_len = starts[b + 1] - starts[b]
        if lens[b] < q_len or lens[b] > max_pages * views.page_size:
            raise ValueError(
                f"prefill: request {b} has seq_len {lens[b]}, needs q_len {q_len} <= seq_len <= "
                f"block_table columns x page_size = {max_pages * views.page_size}"
            )

    def fused(rows: slice, reqs: slice, rows_qsl: torch.Tensor) -> None:
        """Query rows ``rows`` (requests ``reqs``, whose ``query_start_loc`` is ``rows_qsl``) through the
        fused Triton prefill, into ``a.out`` and ``a.lse``."""
        res = tri.prefill(
            query[rows], (views.k_data, views.v_data), (views.k_sf, views.v_sf), block_table[reqs],
            seq_lens[reqs], rows_qsl, a.k_scale, a.v_scale, sm_scale=sm_scale, kv_layout=views.layout,
            causal=causal, sliding_window=sliding_window, logits_soft_cap=logits_soft_cap, out=a.out[rows],
            return_lse=a.lse is not None, kv_rotation=rotation,
        )  # fmt: skip
        if a.lse is not None:
            assert isinstance(res, tuple)
            a.lse[rows].copy_(res[1])

    if backend == "fa2" and not causal and a.window > 0:
        # FlashInfer's FA2 ragged prefill attends wrongly with a sliding window and no causal mask:
        # relative L2 0.61 and 0.93 against the float32 reference (window 500, and window 129 with a
        # soft-cap) on an H200 with FlashInfer 0.6.14 (tests/kernels/test_gpu_prefill_dequant.py, run I
        # in docs/validation.md); FA3 is right there. The whole call takes the fused Triton prefill.
        logger.debug("prefill (%s): a sliding window without the causal mask runs through the fused "
                     "Triton prefill (FA2's ragged run is wrong there)", impl)  # fmt: skip
        fused(slice(None), slice(None), qsl)
        return tri._result(a)
    el = query.element_size()
    per_token = 2 * views.num_kv_heads * views.head_dim * el
    cap_bytes = scratch_cap_bytes()
    plan = plan_groups(lens, starts, max(1, 16 // a.group), cap_bytes // per_token)
    attend: AttendFn = _attend_override or _flashinfer_attends[backend]
    if plan.groups and _attend_override is None:
        problem = backend_problem(views.device, backend)
        if problem is not None:
            raise _unsupported(backend, problem)

    if plan.has_decode_rows:
        tri._launch_decode_path(
            a, query, block_table, seq_lens, qsl, max(1, 16 // a.group), bool(causal),
            rotate=rotation is not None,
        )
    window_left = a.window - 1 if a.window > 0 else -1
    cap = a.softcap if a.softcap > 0 else None
    if plan.groups:
        ks = a.k_scale  # FlashInfer takes the softmax scale on the host: a device k_scale is read once per value
        attend_scale = float(sm_scale) * (_host_scale(ks) if isinstance(ks, torch.Tensor) else ks)
        need = max(g.kv_tokens for g in plan.groups) * per_token
        buf = _scratch_bytes(views.device, need, cap_bytes)
        h, d = views.num_kv_heads, views.head_dim
    for g in plan.groups:
        n_tok = g.kv_tokens
        flat = buf[: n_tok * per_token].view(query.dtype).view(2, n_tok, h, d)
        k_s, v_s = flat[0], flat[1]
        off = 0
        for first, count, n in g.runs:
            dequantize_paged(
                (views.k_data, views.v_data), (views.k_sf, views.v_sf),
                block_table[first : first + count], seq_lens[first : first + count],
                1.0, a.v_scale, k_s[off : off + count * n].view(count, n, h, d),
                v_s[off : off + count * n].view(count, n, h, d), views.layout, kv_rotation=rotation,
            )  # fmt: skip
            off += count * n
        q0, q1 = starts[g.first], starts[g.last + 1]
        attend(AttendArgs(
            query[q0:q1], k_s, v_s, list(g.qo_indptr), list(g.kv_indptr), sm_scale=attend_scale,
            causal=bool(causal), window_left=window_left, logits_soft_cap=cap, out=a.out[q0:q1],
            lse=a.lse[q0:q1] if a.lse is not None else None,
        ))  # fmt: skip
    for b in plan.oversize:
        logger.debug(
            "prefill (%s): request %d's KV (%d tokens, %.1f MiB) exceeds %s=%d MiB; it runs "
            "through the fused Triton prefill",
            impl, b, lens[b], lens[b] * per_token / 2**20, SCRATCH_ENV, cap_bytes >> 20,
        )  # fmt: skip
        q0, q1 = starts[b], starts[b + 1]
        fused(slice(q0, q1), slice(b, b + 1), torch.tensor([0, q1 - q0], dtype=torch.int32, device=views.device))
    return tri._result(a)


def backend_problem(device: torch.device, backend: str) -> str | None:
    """Why FlashInfer's ragged prefill with ``backend`` ("fa3": SM90 only; "fa2": SM80 and newer, the
    project floor and bf16's) cannot run on ``device``; None when it can."""
    name = backend.upper()
    if device.type != "cuda":
        want = "SM90" if backend == "fa3" else "SM80 or newer"
        return f"the cache is on {device}; {name} needs a CUDA {want} GPU"
    major, minor = torch.cuda.get_device_capability(device)
    if backend == "fa3" and major != 9:
        return f"the GPU is SM{major}{minor}; FlashInfer's FA3 kernels are built for SM90 only"
    if backend == "fa2" and major < 8:
        return f"the GPU is SM{major}{minor}; the FA2 ragged prefill needs SM80 or newer here"
    try:
        import flashinfer
    except ImportError as exc:
        return f"flashinfer cannot be imported ({exc})"
    if not hasattr(flashinfer, "BatchPrefillWithRaggedKVCacheWrapper"):
        return "the installed flashinfer has no BatchPrefillWithRaggedKVCacheWrapper"
    return None
