"""Real vLLM on a CPU-only machine: the shims that let its CUDA platform code run, and helpers.

Imported by ``conftest.py`` and the test modules of ``tests/vllm`` (``from vllm_cpu_support import``).

Nothing of vLLM is mocked. What is faked is the machine: the device capability (the CUDA platform
*class* answers the faked SM, as ``vllm-on-cpu.md`` describes), the compiled extension modules that
cannot load without ``libcuda`` (stubbed only when their import fails), the artifactory probe (no
network), and on vLLM 0.33 the two CUDA device queries its FlashInfer impl constructor makes. The
order matters: the attention layer module is imported while vLLM still sees the CPU platform (its
FlashAttention helpers import CUDA-only extensions under the CUDA platform), then the CUDA platform
becomes ``current_platform`` before the FlashInfer backend module binds it at import.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


def _have_vllm() -> bool:
    # Not find_spec alone: with tests/ on sys.path (pytest's rootdir conftest), this directory is a
    # namespace package named "vllm" wherever the real one is not installed.
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return False
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


HAVE_VLLM = _have_vllm()
NO_VLLM_REASON = "needs a real vLLM release (make a venv with scripts/vllm_cpu_env.sh <release>)"

ARCHES = {"sm_90": (9, 0), "sm_86": (8, 6), "sm_75": (7, 5), "sm_100": (10, 0), "sm_120": (12, 0)}


@dataclass
class CpuVllm:
    """Handles to the real vLLM modules, set up for faked-capability use on this machine."""

    version: str
    flashinfer_version: str
    platform: Any
    capability: list[Any]  # one-element holder read by the patched classmethod
    fi: types.ModuleType  # vllm.v1.attention.backends.flashinfer
    registry: types.ModuleType
    Attention: type

    def set_arch(self, arch: str) -> None:
        """Make every vLLM capability query answer ``arch`` and clear what was memoised."""
        from vllm.platforms.interface import DeviceCapability

        self.capability[0] = DeviceCapability(*ARCHES[arch])
        os.environ["NVFP4COMPAT_ARCH"] = arch
        clear_vllm_caches()


def clear_vllm_caches() -> None:
    """Clear every ``functools`` cache in the vLLM modules whose answers depend on the GPU."""
    for name in (
        "vllm.utils.flashinfer",
        "vllm.v1.attention.backends.flashinfer",
        "vllm.v1.attention.selector",
        "vllm.platforms.cuda",
        "vllm.v1.attention.backends.utils",
    ):
        module = sys.modules.get(name)
        if module is None:
            continue
        for obj in list(vars(module).values()):
            if isinstance(obj, functools._lru_cache_wrapper):
                obj.cache_clear()


def _plugin_env_before_flashinfer() -> None:
    import vllm.plugins

    from nvfp4compat import vllm_plugin

    saved = os.environ.get("NVFP4COMPAT_ARCH")
    os.environ["NVFP4COMPAT_ARCH"] = "sm_90"
    try:
        load_plugin_through_entry_point()
    finally:
        vllm_plugin.unpatch()
        vllm.plugins.plugins_loaded = False
        if saved is None:
            os.environ.pop("NVFP4COMPAT_ARCH", None)
        else:
            os.environ["NVFP4COMPAT_ARCH"] = saved


@functools.cache
def setup_cpu_vllm() -> CpuVllm:
    os.environ.setdefault("VLLM_PLUGINS", "nvfp4compat")
    try:
        importlib.import_module("vllm._C_stable_libtorch")
    except ImportError:  # no libcuda here: vllm/platforms/cuda.py imports this module
        sys.modules["vllm._C_stable_libtorch"] = types.ModuleType("vllm._C_stable_libtorch")
    import torch
    import vllm
    import vllm.platforms as platforms
    import vllm.triton_utils

    # vLLM 0.34's CpuPlatform.check_and_update_config (which VllmConfig still calls: vllm/config
    # bound the CPU platform at import) raises "vLLM on x86 CPUs requires Triton (triton-cpu)" when
    # Triton has no active driver, as on this GPU-less machine; here Triton runs interpreted
    # (TRITON_INTERPRET=1), which is what the tests need.
    vllm.triton_utils.HAS_TRITON = True
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability

    holder = [DeviceCapability(9, 0)]
    faked = classmethod(lambda cls, device_id=0: holder[0])
    CudaPlatform.get_device_capability = faked
    type(platforms.current_platform).get_device_capability = faked
    # Imported under the CPU platform: its FlashAttention helpers need CUDA-only extensions under
    # the CUDA platform (and nothing here runs them).
    from vllm.model_executor.layers.attention.attention import Attention

    platforms.current_platform = CudaPlatform()
    import vllm.utils.flashinfer as uf

    uf.has_nvidia_artifactory = lambda: True  # else an HTTP GET with a 5 s timeout
    # As in a real process, the plugin runs before FlashInfer is first imported, so the plan's
    # environment (FLASHINFER_DISABLE_VERSION_CHECK for a mismatched flashinfer-cubin) is in place.
    _plugin_env_before_flashinfer()
    from vllm.v1.attention.backends import flashinfer as fi
    from vllm.v1.attention.backends import registry

    if not torch.cuda.is_available() and hasattr(fi, "get_device_sm_count"):
        # vLLM 0.33's FlashInferImpl constructor sizes a trtllm-gen counter buffer from the SM count
        # of "cuda"; give it an SM count and a preallocated CPU buffer.
        fi.get_device_sm_count = lambda device: 132
        if hasattr(fi, "_fi_multi_ctas_kv_counter"):
            fi._fi_multi_ctas_kv_counter = torch.zeros(1 << 22, dtype=torch.uint8)
    return CpuVllm(
        version=vllm.__version__,
        flashinfer_version=importlib.metadata.version("flashinfer-python"),
        platform=platforms.current_platform,
        capability=holder,
        fi=fi,
        registry=registry,
        Attention=Attention,
    )


def load_plugin_through_entry_point() -> None:
    """Run vLLM's own plugin loader with ``VLLM_PLUGINS=nvfp4compat`` (the real entry point)."""
    import vllm.plugins

    eps = importlib.metadata.entry_points(group="vllm.general_plugins")
    assert any(
        ep.name == "nvfp4compat" and ep.value == "nvfp4compat.vllm_plugin:register" for ep in eps
    ), (
        "nvfp4compat's vllm.general_plugins entry point is not installed in this venv "
        "(pip install --no-deps --no-build-isolation -e <repo>)"
    )
    os.environ["VLLM_PLUGINS"] = "nvfp4compat"
    vllm.plugins.plugins_loaded = False
    vllm.plugins.load_general_plugins()


def validate(
    backend: type,
    kv_cache_dtype: str,
    capability: Any,
    *,
    head_size: int = 128,
    has_sink: bool = False,
) -> list[str]:
    """``backend.validate_configuration`` with the 11 positional parameters every release shares."""
    import torch
    from vllm.v1.attention.backend import AttentionType

    return backend.validate_configuration(
        head_size=head_size,
        dtype=torch.bfloat16,
        kv_cache_dtype=kv_cache_dtype,
        block_size=16,
        use_mla=False,
        has_sink=has_sink,
        use_sparse=False,
        use_mm_prefix=False,
        use_per_head_quant_scales=False,
        device_capability=capability,
        attn_type=AttentionType.DECODER,
    )


def vllm_config(cache_dtype: str, block_size: int = 16) -> Any:
    """A real ``VllmConfig`` for the CPU device (no model): enough for selection and builders."""
    from vllm.config import CacheConfig, DeviceConfig, VllmConfig

    return VllmConfig(
        device_config=DeviceConfig(device="cpu"),
        cache_config=CacheConfig(cache_dtype=cache_dtype, block_size=block_size),
    )


@dataclass
class LayerSetup:
    """A real vLLM ``Attention`` layer, its KV-cache spec and its builder, under one config."""

    config: Any
    layer: Any
    spec: Any
    backend: type

    def builder(self) -> Any:
        import torch
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(self.config):
            return self.backend.get_builder_cls()(
                self.spec, [self.layer.layer_name], self.config, torch.device("cpu")
            )


def make_layer(
    cpu_vllm: CpuVllm,
    cache_dtype: str,
    *,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_size: int = 128,
    prefix: str = "model.layers.0.self_attn.attn",
    block_size: int = 16,
    **layer_kwargs: Any,
) -> LayerSetup:
    """Build a real ``Attention`` layer (vLLM selects its backend) and its customized spec.

    The spec is what the model runner gets: ``layer.get_kv_cache_spec`` then, where the release has
    it, ``backend.customize_spec`` (vLLM 0.28+ packs NVFP4 pages there).
    """
    import torch
    from vllm.config import set_current_vllm_config

    config = vllm_config(cache_dtype, block_size)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # the model dtype when no model config is set
    try:
        with set_current_vllm_config(config):
            layer = cpu_vllm.Attention(
                num_heads=num_heads,
                head_size=head_size,
                scale=head_size**-0.5,
                num_kv_heads=num_kv_heads,
                cache_config=config.cache_config,
                prefix=prefix,
                **layer_kwargs,
            )
            try:
                spec = layer.get_kv_cache_spec(config)
            except AttributeError:
                # vLLM 0.25.1 reads model_config.use_mla for a sliding-window spec; without a model
                # config take the full-attention spec of the same layer (same page geometry, which
                # is all the builder and the allocation use). The window still reaches the impl.
                if (
                    config.model_config is not None
                    or getattr(layer, "sliding_window", None) is None
                ):
                    raise
                window, layer.sliding_window = layer.sliding_window, None
                try:
                    spec = layer.get_kv_cache_spec(config)
                finally:
                    layer.sliding_window = window
            customize = getattr(layer.attn_backend, "customize_spec", None)
            if customize is not None:
                spec = customize(spec)
    finally:
        torch.set_default_dtype(default)
    return LayerSetup(config=config, layer=layer, spec=spec, backend=layer.attn_backend)


def allocate_kv_cache(setup: LayerSetup, num_blocks: int, layout: str) -> tuple[Any, Any]:
    """The layer's KV cache as this release's model runner allocates and views it.

    Returns ``(raw, kv_cache)``: the flat backing buffer and the per-layer view the impl receives.
    vLLM 0.28+: ``create_kv_cache_views`` with ``KVCacheLayout.LBNHC`` (NHD) or ``LBHNC`` (HND).
    vLLM <= 0.27: ``get_kv_cache_shape`` + ``get_kv_cache_stride_order`` (``set_kv_cache_layout``),
    permuted back to the logical shape as the runner does.
    """
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.v1 import kv_cache_interface as kvi

    spec = setup.spec
    page = spec.page_size_bytes
    if hasattr(kvi, "create_kv_cache_views"):
        from vllm.v1.kv_cache_layout import KVCacheLayout

        kv_layout = KVCacheLayout.LBNHC if layout == "NHD" else KVCacheLayout.LBHNC
        raw = torch.zeros(page * num_blocks, dtype=torch.int8)
        tensor = kvi.KVCacheTensor(
            size=page * num_blocks,
            layers=[setup.layer.layer_name],
            layer_stride=page * num_blocks,
            block_stride=page,
        )
        view = kvi.create_kv_cache_views(raw, spec, num_blocks, kv_layout, tensor)[0]
        return raw.view(torch.uint8), view
    with set_current_vllm_config(setup.config):
        shape = setup.backend.get_kv_cache_shape(
            num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size,
            cache_dtype_str=setup.config.cache_config.cache_dtype,
        )  # fmt: skip
    order = stride_order(setup, layout)
    physical = tuple(shape[i] for i in order)
    inverse = [order.index(i) for i in range(len(order))]
    raw = torch.zeros(page * num_blocks, dtype=torch.uint8)
    return raw, raw.view(physical).permute(*inverse)


def stride_order(setup: LayerSetup, layout: str) -> tuple[int, ...]:
    """vLLM <= 0.27: the backend's ``get_kv_cache_stride_order()`` under KV-cache layout ``layout``."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backends import utils as backend_utils

    backend_utils.set_kv_cache_layout(layout)
    backend_utils.get_kv_cache_layout.cache_clear()
    try:
        with set_current_vllm_config(setup.config):
            return tuple(setup.backend.get_kv_cache_stride_order())
    finally:
        backend_utils.set_kv_cache_layout(None)
        backend_utils.get_kv_cache_layout.cache_clear()


def view_order(setup: LayerSetup, layout: str) -> tuple[int, ...]:
    """The permutation the release's FlashInfer forward applies to the per-layer cache view:
    ``KVCacheLayout.layer_view_order`` where the release has ``vllm.v1.kv_cache_layout`` (0.29+),
    else the backend's stride order."""
    try:
        from vllm.v1.kv_cache_layout import KVCacheLayout
    except ImportError:
        return stride_order(setup, layout)
    return tuple((KVCacheLayout.LBNHC if layout == "NHD" else KVCacheLayout.LBHNC).layer_view_order)


class RecordingHandler(logging.Handler):
    """Collects records of one logger (vLLM's ``vllm`` logger does not propagate to root)."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def recording(logger_name: str = "vllm.nvfp4compat") -> Iterator[RecordingHandler]:
    handler = RecordingHandler()
    log = logging.getLogger(logger_name)
    old_level = log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)
