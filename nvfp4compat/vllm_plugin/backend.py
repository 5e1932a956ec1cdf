"""FLASHINFER backend subclasses that serve an NVFP4 KV cache where the installed vLLM cannot.

vLLM imports this module itself, through the class path the plugin registers over
``AttentionBackendEnum.FLASHINFER`` (``register_backend``); the name stays ``"FLASHINFER"``, so
automatic selection, priorities and ``isinstance`` checks are unchanged. Every override consults the
process's :class:`~nvfp4compat.plan.VllmRoute` (``plan.vllm.route``) and delegates to vLLM's own code for every
layer it does not handle: non-NVFP4 KV-cache dtypes always take the stock path unchanged.

What the NVFP4 path does (per patch id, see ``docs/patches.md``):

* gates (``gate_nvfp4``, ``gate_nvfp4_4over6``, ``gate_combination``): accept the dtypes the plan
  serves; head_size 64 and sinks when the Triton readers serve both phases.
* ``metadata_builder``: :class:`Nvfp4KVMetadata` with vLLM's block table, ``seq_lens`` and
  ``query_start_loc`` and the decode/prefill split (vLLM orders decodes first); no FlashInfer wrapper
  is planned, the query stays in the model dtype and no FP8 output buffer exists.
* ``kv_cache_update``: the KV write goes to the bound writer (``get_kernel("write", impl)``) through
  the views of vLLM's combined page ``[K data | K scales | V data | V scales]`` (:func:`page_views`,
  the semantics of vLLM 0.32+'s ``_nvfp4_kv_views``); vLLM's C++
  ``reshape_and_cache_flash(..., "nvfp4")`` never runs.
* ``forward_reader``: decode and prefill go to the bound readers (``get_kernel("decode", impl)``,
  ``get_kernel("prefill", impl)``); a phase the plan leaves on vLLM's reader runs vLLM's code.
* a rotated plan (``NVFP4COMPAT_KV_ROTATION=hadamard``, ``VllmRoute.kv_rotation``): the routed writer
  and readers are wrapped by :func:`nvfp4compat.kernels.rotation.rotated`.
* ``register_kv_cache_dtypes`` (vLLM 0.33+): the rotated cache's own ``--kv-cache-dtype`` names
  (``nvfp4_hadamard``, ...) are registered with vLLM; layers of such a name take the plan's route for it
  (``plan.vllm.dtype_routes``), every other NVFP4 layer the process route.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionCGSupport,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
)
from vllm.v1.attention.backends import flashinfer as _fi
from vllm.v1.attention.backends.utils import split_decodes_and_prefills

from nvfp4compat.kernels import get_kernel
from nvfp4compat.kernels.layout import split_combined_page
from nvfp4compat.plan import VllmRoute
from nvfp4compat.vllm_plugin import state

__all__ = [
    "Nvfp4KVMetadata",
    "Nvfp4CompatFlashInferBackend",
    "Nvfp4CompatMetadataBuilder",
    "Nvfp4CompatFlashInferImpl",
    "MAX_DECODE_Q_LEN",
    "page_views",
]

logger = logging.getLogger("vllm.nvfp4compat")

# Query tokens per request the Triton decode kernel serves (speculative decoding): 1..8.
MAX_DECODE_Q_LEN = 8


def _current_cache_dtype() -> str | None:
    """``--kv-cache-dtype`` of the vLLM config being built or run, when one is set."""
    try:
        from vllm.config import get_current_vllm_config_or_none
    except ImportError:  # pragma: no cover - every supported release has it
        return None
    config = get_current_vllm_config_or_none()
    cache_config = getattr(config, "cache_config", None)
    return getattr(cache_config, "cache_dtype", None)


def _layer_cache_dtype(
    kv_cache_spec: Any, vllm_config: Any, layer_names: Sequence[str] | None = None
) -> str:
    """The KV-cache dtype of the layers behind ``kv_cache_spec`` (``"auto"`` for skipped layers).

    ``cache_config.cache_dtype`` when it names one. vLLM 0.34+ resolves the dtype per layer
    (``FlashInferMetadataBuilder._resolve_cache_dtype``, FI:1137 [0.34.0]): a layer can be NVFP4
    while ``cache_config.cache_dtype`` is ``"auto"``; then the layers' own ``kv_cache_dtype``
    decides, as in vLLM (``"nvfp4"`` for an NVFP4 spec when no layer names are given).
    """
    mode = getattr(kv_cache_spec, "kv_quant_mode", None)
    if mode is not None and not getattr(mode, "is_nvfp4", False):
        return "auto"
    configured = str(vllm_config.cache_config.cache_dtype)
    if configured != "auto" or mode is None:
        return configured
    own = _layers_cache_dtype(vllm_config, layer_names or ())
    return own if own is not None else "nvfp4"


def _layers_cache_dtype(vllm_config: Any, layer_names: Sequence[str]) -> str | None:
    """The ``kv_cache_dtype`` the layers ``layer_names`` were built with (None when unknown)."""
    context = getattr(getattr(vllm_config, "compilation_config", None), "static_forward_context", None) or {}
    dtypes = {
        str(context[name].kv_cache_dtype)
        for name in layer_names
        if name in context and getattr(context[name], "kv_cache_dtype", None) not in (None, "auto")
    }
    if len(dtypes) > 1:
        raise ValueError(
            f"nvfp4compat: the layers of one attention group have different KV-cache dtypes {sorted(dtypes)} "
            f"({list(layer_names)}); vLLM groups layers by KV-cache spec, so this group is inconsistent. "
            "Way out: one --kv-cache-dtype for these layers"
        )
    return dtypes.pop() if dtypes else None


def page_views(
    kv_cache: torch.Tensor, num_kv_heads: int
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor], str]:
    """Views of the NVFP4 page ``[K data | K scales | V data | V scales]`` the impl receives.

    Parameters
    ----------
    kv_cache : torch.Tensor
        uint8, the per-layer cache as vLLM hands it to the impl, with ``F = D/2 + D/16``:
        vLLM 0.26+ ``[num_blocks, 2*num_kv_heads, block_size, F]``; vLLM 0.25.1
        ``[num_blocks, 2, block_size, num_kv_heads, F]``. Either way each page is dense, its K half
        first, and the interior is token-major (NHD) or head-major (HND) per the physical layout.
    num_kv_heads : int
        KV heads of the layer.

    Returns
    -------
    ((k_data, v_data), (k_sf, v_sf), layout)
        uint8 ``[blocks, *dims, D/2]`` and float8_e4m3fn ``[blocks, *dims, D/16]`` views,
        ``dims = (block_size, heads)`` for ``"NHD"``, ``(heads, block_size)`` for ``"HND"``: the
        semantics of vLLM 0.32+'s ``_nvfp4_kv_views`` (:func:`split_combined_page`), which equal
        0.25.1's ``nvfp4_kv_cache_split_views`` and 0.26-0.31's HND split byte for byte.
    """
    if kv_cache.dim() == 5:
        blocks, two, block_size, heads, full = kv_cache.shape
        stride = kv_cache.stride()
        if two != 2 or heads != num_kv_heads:
            raise ValueError(
                f"expected an NVFP4 cache [blocks, 2, block_size, {num_kv_heads}, full_dim], got "
                f"{tuple(kv_cache.shape)}"
            )
        if stride[1:] == (block_size * heads * full, heads * full, full, 1):
            flat = (stride[0], full, 2 * heads * full, 1)  # NHD
        elif stride[1:] == (heads * block_size * full, full, block_size * full, 1):
            flat = (stride[0], block_size * full, full, 1)  # HND
        else:
            raise ValueError(f"NVFP4 KV pages must be dense (NHD or HND), got strides {stride}")
        # The same page bytes in the 4-D form; only the layout its strides name matters.
        kv_cache = kv_cache.as_strided(
            (blocks, 2 * heads, block_size, full), flat, kv_cache.storage_offset()
        )
    return split_combined_page(kv_cache, num_kv_heads)


def _handled(kv_cache_dtype: str | None) -> VllmRoute | None:
    """The active route acting on layers of ``kv_cache_dtype`` (a registered name's own route first)."""
    return state.route_for(kv_cache_dtype)


@dataclass
class Nvfp4KVMetadata:
    """Per-batch metadata of nvfp4compat's NVFP4 builder (decodes first, then prefills).

    Attributes
    ----------
    num_actual_tokens : int
        Query rows of the batch (excluding CUDA-graph padding).
    slot_mapping : torch.Tensor
        int64 ``[num_actual_tokens]``: flat cache slot ``page * block_size + offset`` of each new token.
    num_decodes, num_decode_tokens, num_prefills, num_prefill_tokens : int
        The split: requests ``[0, num_decodes)`` are decodes with ``decode_q_len`` query tokens each.
    decode_q_len : int
        Query tokens per decode request (1, or 1 + speculative tokens; uniform).
    block_table : torch.Tensor
        int32 ``[num_reqs, max_pages]``: vLLM's block table, rows in batch order.
    seq_lens : torch.Tensor
        int32 ``[num_reqs]``: KV length of each request including this step's tokens.
    query_start_loc : torch.Tensor
        int32 ``[num_reqs + 1]``: query row offsets of the whole batch.
    prefill_query_start_loc : torch.Tensor or None
        int32 ``[num_prefills + 1]``: query offsets of the prefill requests, relative to the first
        prefill row (``query_start_loc[num_decodes:] - num_decode_tokens``); None without prefills.
    max_query_len, max_seq_len : int
        Host upper bounds from vLLM.
    causal : bool
        False only for non-causal (DFlash drafting) batches, which run entirely as prefill.
    seq_lens_cpu, query_start_loc_cpu : torch.Tensor or None
        Host copies of ``seq_lens`` / ``query_start_loc`` from vLLM's metadata (exact for prefill
        rows), passed to a prefill reader that plans on the host (``dequant_fa3``/``dequant_fa2``); None if absent.
    """

    num_actual_tokens: int
    slot_mapping: torch.Tensor
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    num_prefill_tokens: int
    decode_q_len: int
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    prefill_query_start_loc: torch.Tensor | None
    max_query_len: int
    max_seq_len: int
    causal: bool = True
    use_cascade: bool = False
    seq_lens_cpu: torch.Tensor | None = None
    query_start_loc_cpu: torch.Tensor | None = None


def _batch_causal(common_attn_metadata: CommonAttentionMetadata) -> bool:
    causal = common_attn_metadata.causal
    if isinstance(causal, torch.Tensor):
        num_reqs = common_attn_metadata.num_reqs
        flags = causal[:num_reqs]
        if bool(flags.all()):
            return True
        if not bool(flags.any()):
            return False
        raise NotImplementedError(
            "nvfp4compat's NVFP4 reader runs a batch either causal or non-causal; this batch mixes "
            "causal and non-causal requests. Way out: --kv-cache-dtype auto/fp8 for this model"
        )
    return bool(causal)


class Nvfp4CompatMetadataBuilder(_fi.FlashInferMetadataBuilder):
    """vLLM's FlashInfer builder, with nvfp4compat's NVFP4 builder for the layers the route serves.

    For a layer the route does not handle, or when the plan leaves the builder to vLLM, this is
    vLLM's ``FlashInferMetadataBuilder`` unchanged (with ``block_table``, ``seq_lens`` and
    ``query_start_loc`` attached to its metadata when a phase is routed to nvfp4compat's reader).
    """

    def __init__(
        self,
        kv_cache_spec: Any,
        layer_names: list[str],
        vllm_config: Any,
        device: torch.device,
    ) -> None:
        self._nvfp4_route: VllmRoute | None = None
        self._nvfp4_attach = False
        cache_dtype = _layer_cache_dtype(kv_cache_spec, vllm_config, layer_names)
        route = _handled(cache_dtype)
        if route is None:
            super().__init__(kv_cache_spec, layer_names, vllm_config, device)
            return
        if route.refusal is not None:
            raise ValueError(route.refusal)
        if not route.own_builder:
            super().__init__(kv_cache_spec, layer_names, vllm_config, device)
            self._nvfp4_attach = bool(route.read)
            return
        AttentionMetadataBuilder.__init__(self, kv_cache_spec, layer_names, vllm_config, device)
        parallel = vllm_config.parallel_config
        if getattr(parallel, "decode_context_parallel_size", 1) > 1:
            raise NotImplementedError(
                "nvfp4compat's NVFP4 reader does not implement decode context parallelism "
                f"(decode_context_parallel_size={parallel.decode_context_parallel_size}). "
                "Way out: run without DCP, or use --kv-cache-dtype fp8"
            )
        self._nvfp4_route = route
        self.cache_config = vllm_config.cache_config
        self.model_config = vllm_config.model_config
        self.cache_dtype = cache_dtype
        self.is_kvcache_nvfp4 = True
        self.kv_cache_dtype = torch.uint8
        self.num_kv_heads = kv_cache_spec.num_kv_heads
        self.head_dim = kv_cache_spec.head_size
        self.page_size = kv_cache_spec.block_size
        # The query stays in the model dtype (no FP8 query, no FP8 output buffer).
        model_dtype = getattr(self.model_config, "dtype", None)
        self.q_data_type_prefill = model_dtype
        self.q_data_type_decode = model_dtype
        self._workspace_buffer = None
        self._init_reorder_batch_threshold(
            1, supports_spec_as_decode=True, supports_dcp_with_varlen=False
        )
        threshold: int | None = getattr(self, "reorder_batch_threshold", None)
        if threshold is not None and threshold > MAX_DECODE_Q_LEN:
            # More speculative tokens than the decode kernel serves per request: verify them as
            # prefill (causal varlen), which is exact, instead of as uniform decode.
            self.reorder_batch_threshold = 1
        logger.debug(
            "nvfp4compat: NVFP4 metadata builder for %d layer(s), head_size %d, %d KV heads, "
            "block_size %d: decode=%s, prefill=%s, query in %s",
            len(layer_names),
            self.head_dim,
            self.num_kv_heads,
            self.page_size,
            route.read.get("decode"),
            route.read.get("prefill"),
            model_dtype or "the model dtype",
        )

    @classmethod
    def get_cudagraph_support(cls, vllm_config: Any, kv_cache_spec: Any) -> AttentionCGSupport:
        """Where nvfp4compat builds or reads NVFP4: ``UNIFORM_SINGLE_TOKEN_DECODE`` when the route
        says FULL decode graphs (:attr:`VllmRoute.full_decode_graphs`: the matrix verified them for
        this vLLM release and arch, or ``NVFP4COMPAT_CUDAGRAPH_DECODE=1``), so that they capture the
        Triton decode reader; else ``NEVER``: attention runs eagerly between the piecewise graphs.
        """
        route = _handled(_layer_cache_dtype(kv_cache_spec, vllm_config))
        if route is not None and (route.own_builder or route.read or route.refusal is not None):
            if route.refusal is None and route.full_decode_graphs:
                return AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
            return AttentionCGSupport.NEVER
        return super().get_cudagraph_support(vllm_config, kv_cache_spec)

    def _get_workspace_buffer(self) -> torch.Tensor | None:
        if self._nvfp4_route is not None:
            return None  # no FlashInfer wrapper is planned: no workspace to share
        return super()._get_workspace_buffer()

    def use_cascade_attention(self, *args: Any, **kwargs: Any) -> bool:
        if self._nvfp4_route is not None:
            return False
        return super().use_cascade_attention(*args, **kwargs)

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> Any:
        if self._nvfp4_route is None:
            metadata = super().build(common_prefix_len, common_attn_metadata, fast_build)
            if self._nvfp4_attach:
                cm = common_attn_metadata
                metadata.block_table = cm.block_table_tensor
                metadata.seq_lens = cm.seq_lens
                metadata.query_start_loc = cm.query_start_loc
                # host copies for a prefill reader that plans on the host (dequant_fa2 on SM12x
                # beside vLLM's own decode): without them it would read the device tensors per layer
                metadata.seq_lens_cpu = _host_seq_lens(cm)
                metadata.query_start_loc_cpu = _host_tensor(
                    vars(cm).get("query_start_loc_cpu"), cm.num_reqs + 1
                )
            return metadata
        cm = common_attn_metadata
        causal = _batch_causal(cm)
        if causal:
            num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens = (
                split_decodes_and_prefills(
                    cm, decode_threshold=self.reorder_batch_threshold or 1, require_uniform=True
                )
            )
        else:
            num_decodes, num_decode_tokens = 0, 0
            num_prefills, num_prefill_tokens = cm.num_reqs, cm.num_actual_tokens
        decode_q_len = num_decode_tokens // num_decodes if num_decodes else 1
        prefill_qsl = None
        if num_prefills:
            prefill_qsl = cm.query_start_loc[num_decodes : cm.num_reqs + 1] - num_decode_tokens
        return Nvfp4KVMetadata(
            num_actual_tokens=cm.num_actual_tokens,
            slot_mapping=cm.slot_mapping,
            num_decodes=num_decodes,
            num_decode_tokens=num_decode_tokens,
            num_prefills=num_prefills,
            num_prefill_tokens=num_prefill_tokens,
            decode_q_len=decode_q_len,
            block_table=cm.block_table_tensor[: cm.num_reqs],
            seq_lens=cm.seq_lens[: cm.num_reqs],
            query_start_loc=cm.query_start_loc[: cm.num_reqs + 1],
            prefill_query_start_loc=prefill_qsl,
            max_query_len=cm.max_query_len,
            max_seq_len=cm.max_seq_len,
            causal=causal,
            seq_lens_cpu=_host_seq_lens(cm),
            query_start_loc_cpu=_host_tensor(vars(cm).get("query_start_loc_cpu"), cm.num_reqs + 1),
        )


class Nvfp4CompatFlashInferImpl(_fi.FlashInferImpl):
    """vLLM's FlashInfer impl, with the NVFP4 write and read routed to the bound kernels.

    For layers the route does not handle this is vLLM's ``FlashInferImpl`` unchanged.
    """

    _nvfp4_route: VllmRoute | None
    _nvfp4_write: Callable[..., None] | None
    _nvfp4_read: dict[str, Callable[..., Any]]
    _nvfp4_host_lens: bool = False
    _nvfp4_dequant_checked: bool = False
    _nvfp4_dequant_impl: str = "dequant_fa3"  # the bound dequantize-then-attend prefill

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        self._nvfp4_route = None
        self._nvfp4_write = None
        self._nvfp4_read = {}
        route = _handled(kv_cache_dtype)
        if route is None:
            super().__init__(
                num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window,
                kv_cache_dtype, *args, **kwargs,
            )  # fmt: skip
            return
        if route.refusal is not None:
            raise ValueError(route.refusal)
        if alibi_slopes is not None and route.read:
            raise NotImplementedError(
                "nvfp4compat's NVFP4 reader does not implement ALiBi; this layer has alibi_slopes. "
                "Way out: --kv-cache-dtype fp8 for this model"
            )
        # vLLM >= 0.32 (extend) builds its own FA2 NVFP4 impl; the phases the plan leaves to it
        # (its writer, or a reader) need that state. vLLM <= 0.31's constructor sets up the
        # trtllm-gen path instead (FP8 query, FP8 output buffer on "cuda"): for the backport, build
        # the impl as for a bf16/fp16 cache and mark it NVFP4 afterwards.
        stock_nvfp4 = route.strategy == "extend"
        super().__init__(
            num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window,
            kv_cache_dtype if stock_nvfp4 else "auto", *args, **kwargs,
        )  # fmt: skip
        self._nvfp4_route = route
        self._nvfp4_dtype = kv_cache_dtype
        if not stock_nvfp4:
            self.kv_cache_dtype = kv_cache_dtype
            self.cache_dtype = kv_cache_dtype
            self.is_kvcache_nvfp4 = True
            self.nvfp4_fa2 = False
            self.nvfp4_trtllm = False
            self.fp4_data_dim = head_size // 2
            self.supports_quant_query_input = False
            self._nvfp4_fp8_out = None
        window_left = self.sliding_window[0] if self.sliding_window is not None else -1
        self._nvfp4_window = window_left + 1 if window_left >= 0 else None
        if route.write is not None:
            self._nvfp4_write = get_kernel("write", route.write)
        self._nvfp4_host_lens = False
        for op, bound in route.read.items():
            impl: str = bound
            if op == "prefill" and impl in _DEQUANT_PREFILLS:
                impl = self._nvfp4_dequant_or_triton(impl, head_size)
                self._nvfp4_host_lens = impl in _DEQUANT_PREFILLS
                self._nvfp4_dequant_impl = impl
            self._nvfp4_read[op] = get_kernel(op, impl)
        if route.kv_rotation is not None:  # VllmRoute's validator checked that all three are routed
            from nvfp4compat.kernels.rotation import rotated

            if self._nvfp4_write is None or set(self._nvfp4_read) != {"decode", "prefill"}:
                raise ValueError(
                    f"the plan rotates the KV cache ({route.kv_rotation}) but this route leaves the "
                    f"writer or a reader to vLLM (write={route.write}, read={route.read})"
                )
            self._nvfp4_write = rotated("write", self._nvfp4_write, route.kv_rotation)
            for op in self._nvfp4_read:
                self._nvfp4_read[op] = rotated(op, self._nvfp4_read[op], route.kv_rotation)

    def _nvfp4_dequant_or_triton(self, impl: str, head_size: int) -> str:
        """The plan binds ``impl`` (dequant_fa3 or dequant_fa2) for prefill; a layer it cannot serve
        (sinks, or a head size its FlashInfer backend does not serve) keeps the fused Triton prefill,
        logged once per layer kind."""
        from nvfp4compat.kernels.composite.prefill_dequant import BACKEND_HEAD_DIMS

        backend = _DEQUANT_PREFILLS[impl]
        dims, name = BACKEND_HEAD_DIMS[backend], backend.upper()
        why = None
        if getattr(self, "sinks", None) is not None:
            why = f"the layer has attention sinks, which FlashInfer's {name} ragged prefill does not take"
        elif head_size not in dims:
            why = f"head_size {head_size} is not one {impl} serves ({list(dims)})"
        if why is None:
            return impl
        logger.info("nvfp4compat: prefill stays on the fused Triton reader for this layer: %s", why)
        return "triton"

    def fused_output_quant_supported(self, quant_key: Any) -> bool:
        if self._nvfp4_route is not None and self._nvfp4_read:
            return False
        return super().fused_output_quant_supported(quant_key)

    def do_kv_cache_update(
        self,
        layer: torch.nn.Module,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Quantize and append this step's K/V into the NVFP4 page with the bound writer.

        Parameters
        ----------
        key, value : torch.Tensor
            fp16/bf16 ``[rows, num_kv_heads, head_size]``, ``rows >= len(slot_mapping)`` (padded).
        kv_cache : torch.Tensor
            uint8, the layer's cache as vLLM hands it over (``[num_blocks, 2*num_kv_heads,
            block_size, D/2 + D/16]``; 0.25.1: ``[num_blocks, 2, block_size, num_kv_heads,
            D/2 + D/16]``), dense per page in HND or NHD order (:func:`page_views`).
        slot_mapping : torch.Tensor
            int32/int64 ``[num_tokens]``; negative slots are skipped.
        """
        if self._nvfp4_write is None:
            super().do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)
            return
        if self.kv_sharing_target_layer_name is not None:
            return
        data, scales, layout = page_views(kv_cache, self.num_kv_heads)
        self._nvfp4_write(
            key,
            value,
            slot_mapping,
            data,
            scales,
            layer._k_scale,
            layer._v_scale,
            kv_layout=layout,
            nvfp4_4over6=self._nvfp4_route is not None and self._nvfp4_route.is_4over6(self._nvfp4_dtype),
        )

    def forward(
        self,
        layer: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: Any,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Attention over the NVFP4 cache with the bound readers.

        ``query`` is ``[tokens, num_heads, head_size]`` in the model dtype, ``output`` the same shape
        and dtype; rows ``[0, num_decode_tokens)`` are decodes, the rest prefills. Only
        ``output[:num_actual_tokens]`` is written. ``attn_metadata is None`` is vLLM's profiling run.
        """
        if not self._nvfp4_read:
            return super().forward(
                layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale, output_block_scale, **kwargs,
            )  # fmt: skip
        if attn_metadata is None:
            return output.fill_(0)
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError(
                "nvfp4compat's NVFP4 reader does not fuse output quantization "
                "(fused_output_quant_supported() is False for this layer)"
            )
        md = attn_metadata
        if isinstance(md, Nvfp4KVMetadata):
            self._nvfp4_phases(layer, query, kv_cache, md, output, ("decode", "prefill"), None)
            return output
        # vLLM's own builder planned its wrappers; nvfp4compat serves the routed phases and vLLM's
        # reader the others (vLLM >= 0.32 reads NVFP4 natively on these GPUs).
        if getattr(md, "use_cascade", False):
            return super().forward(
                layer, query, key, value, kv_cache, md, output, output_scale, output_block_scale,
                **kwargs,
            )  # fmt: skip
        routed = tuple(op for op in ("decode", "prefill") if op in self._nvfp4_read)
        prefill_qsl = None
        if "prefill" in routed and md.num_prefills:
            prefill_qsl = (
                md.query_start_loc[md.num_decodes : md.num_decodes + md.num_prefills + 1]
                - md.num_decode_tokens
            )
        self._nvfp4_phases(layer, query, kv_cache, md, output, routed, prefill_qsl)
        ndt, npt = md.num_decode_tokens, md.num_prefill_tokens
        if "decode" in routed and "prefill" not in routed and npt:
            rest = dataclasses.replace(
                md, decode=None, num_decodes=0, num_decode_tokens=0, num_actual_tokens=npt
            )
            super().forward(
                layer, query[ndt : ndt + npt], key, value, kv_cache, rest, output[ndt : ndt + npt],
                output_scale, output_block_scale, **kwargs,
            )  # fmt: skip
        elif "prefill" in routed and "decode" not in routed and ndt:
            rest = dataclasses.replace(
                md, prefill=None, num_prefills=0, num_prefill_tokens=0, num_actual_tokens=ndt
            )
            super().forward(
                layer, query, key, value, kv_cache, rest, output, output_scale,
                output_block_scale, **kwargs,
            )  # fmt: skip
        return output

    def _nvfp4_phases(
        self,
        layer: torch.nn.Module,
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        md: Any,
        output: torch.Tensor,
        phases: tuple[str, ...],
        prefill_qsl: torch.Tensor | None,
    ) -> None:
        data, scales, layout = page_views(kv_cache, self.num_kv_heads)
        common = dict(
            sm_scale=self.scale,
            kv_layout=layout,
            sliding_window=self._nvfp4_window,
            logits_soft_cap=self.logits_soft_cap or None,
            sinks=self.sinks,
        )
        nd, ndt = md.num_decodes, md.num_decode_tokens
        npf, npt = md.num_prefills, md.num_prefill_tokens
        k_scale, v_scale = layer._k_scale, layer._v_scale
        if "decode" in phases and ndt:
            q_len = getattr(md, "decode_q_len", None) or ndt // nd
            self._nvfp4_read["decode"](
                query[:ndt],
                data,
                scales,
                md.block_table[:nd],
                md.seq_lens[:nd],
                k_scale,
                v_scale,
                q_len_per_req=q_len,
                out=output[:ndt],
                **common,
            )
        if "prefill" in phases and npt:
            if self._nvfp4_host_lens and not self._nvfp4_dequant_checked:
                self._nvfp4_check_dequant_device(query.device)
            qsl = prefill_qsl if prefill_qsl is not None else md.prefill_query_start_loc
            self._nvfp4_read["prefill"](
                query[ndt : ndt + npt],
                data,
                scales,
                md.block_table[nd : nd + npf],
                md.seq_lens[nd : nd + npf],
                qsl,
                k_scale,
                v_scale,
                causal=getattr(md, "causal", True),
                out=output[ndt : ndt + npt],
                **common,
                **self._nvfp4_lens_kwargs(md, nd, npf, ndt),
            )

    def _nvfp4_check_dequant_device(self, device: torch.device) -> None:
        """First prefill of a layer bound to dequant_fa3/dequant_fa2: the plan may come from a
        pretended arch (``NVFP4COMPAT_ARCH``) while the tensors live elsewhere; if the FlashInfer
        backend cannot run on ``device`` the layer keeps the fused Triton prefill (warned once), as
        the plugin never raises for "unsupported here"."""
        from nvfp4compat.kernels.composite.prefill_dequant import backend_problem

        self._nvfp4_dequant_checked = True
        impl = self._nvfp4_dequant_impl
        backend = _DEQUANT_PREFILLS[impl]
        problem = backend_problem(device, backend)
        if problem is None:
            return
        if problem not in _DEQUANT_WARNED:
            _DEQUANT_WARNED.add(problem)
            logger.warning(
                "nvfp4compat: the plan binds prefill=%s but %s cannot run here (%s); prefill uses the "
                "fused Triton reader (NVFP4COMPAT_IMPL=prefill=triton silences this)",
                impl, backend.upper(), problem,
            )  # fmt: skip
        self._nvfp4_read["prefill"] = get_kernel("prefill", "triton")
        self._nvfp4_host_lens = False

    def _nvfp4_lens_kwargs(self, md: Any, nd: int, npf: int, ndt: int) -> dict[str, torch.Tensor]:
        """``seq_lens_cpu`` / ``query_start_loc_cpu`` of the prefill rows for a reader that plans on
        the host (dequant_fa3, dequant_fa2); empty otherwise or when vLLM's metadata lacks them (it
        then reads the device tensors once)."""
        if not getattr(self, "_nvfp4_host_lens", False):
            return {}
        out: dict[str, torch.Tensor] = {}
        sl = getattr(md, "seq_lens_cpu", None)
        qs = getattr(md, "query_start_loc_cpu", None)
        if sl is not None and qs is not None:
            out["seq_lens_cpu"] = sl[nd : nd + npf]
            out["query_start_loc_cpu"] = qs[nd : nd + npf + 1] - ndt
        return out


# The dequantize-then-attend prefills and their FlashInfer ragged backend
_DEQUANT_PREFILLS: dict[str, str] = {"dequant_fa3": "fa3", "dequant_fa2": "fa2"}
# dequant_fa3/fa2 device problems already warned about (one warning per process, not per layer)
_DEQUANT_WARNED: set[str] = set()


def _host_tensor(t: Any, n: int) -> torch.Tensor | None:
    """``t[:n]`` when ``t`` is a CPU tensor of at least ``n`` entries, else None."""
    if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dim() == 1 and t.shape[0] >= n:
        return t[:n]
    return None


def _host_seq_lens(cm: Any) -> torch.Tensor | None:
    """vLLM's host ``seq_lens`` without a device sync: ``seq_lens_cpu_upper_bound`` (0.33: exact for
    prefill rows, the only rows a host-planned prefill reads), else the dataclass field
    ``seq_lens_cpu`` / ``_seq_lens_cpu`` of older releases (read from ``vars``, never through a
    property that would copy from the device)."""
    fields = vars(cm)
    for name in ("seq_lens_cpu_upper_bound", "seq_lens_cpu", "_seq_lens_cpu"):
        t = _host_tensor(fields.get(name), cm.num_reqs)
        if t is not None:
            return t
    return None


def _bound_args(
    func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    try:
        return dict(inspect.signature(func).bind(*args, **kwargs).arguments)
    except TypeError:
        return dict(kwargs)


class Nvfp4CompatFlashInferBackend(_fi.FlashInferBackend):
    """``FLASHINFER`` with the gates of the active route (the registered override)."""

    nvfp4compat: ClassVar[bool] = True

    @staticmethod
    def get_impl_cls() -> type[Nvfp4CompatFlashInferImpl]:
        return Nvfp4CompatFlashInferImpl

    @staticmethod
    def get_builder_cls() -> type[Nvfp4CompatMetadataBuilder]:
        return Nvfp4CompatMetadataBuilder

    @classmethod
    def supports_kv_cache_dtype(cls, kv_cache_dtype: Any) -> bool:
        route = _handled(kv_cache_dtype)
        if route is not None and kv_cache_dtype in route.accept:
            return True
        return bool(super().supports_kv_cache_dtype(kv_cache_dtype))

    @classmethod
    def supports_combination(cls, *args: Any, **kwargs: Any) -> str | None:
        parent = super().supports_combination
        reason = parent(*args, **kwargs)
        bound = _bound_args(parent, args, kwargs)
        route = _handled(bound.get("kv_cache_dtype"))
        if route is None:
            return reason
        if route.refusal is not None:
            return route.refusal
        if route.combination and reason is not None:
            # Re-ask vLLM without the two cases the Triton readers lift: if it then has no
            # objection, its only objections were its FA2 path's NVFP4 limits (head_size 64, sinks).
            neutral = dict(bound)
            if neutral.get("head_size") == 64:
                neutral["head_size"] = 128
            if "has_sink" in neutral:
                neutral["has_sink"] = False
            if parent(**neutral) is None:
                return None
        return reason

    @classmethod
    def supports_sink(cls) -> bool:
        route = _handled(_current_cache_dtype())
        if route is not None and route.combination:
            return True
        return bool(super().supports_sink())
