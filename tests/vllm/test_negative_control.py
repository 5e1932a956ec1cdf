"""No KV writer can be bound: NVFP4 fails at engine start with the no-writer error.

FlashInfer without ``nvfp4_quantize_append_paged_kv_cache_with_slot_mapping`` (0.6.13/0.6.14, the pins
of vLLM 0.25.1/0.26.0) and Triton disabled (``NVFP4COMPAT_DISABLE_TRITON=1``). The error must come
from the objects vLLM builds at engine start (backend validation in the selector, the builder and
impl constructors), never from the first KV write.
"""

from __future__ import annotations

import dataclasses

import pytest
from vllm_cpu_support import HAVE_VLLM, NO_VLLM_REASON  # noqa: E402

if not HAVE_VLLM:
    pytest.skip(NO_VLLM_REASON, allow_module_level=True)

import torch  # noqa: E402
from vllm_cpu_support import (  # noqa: E402
    load_plugin_through_entry_point,
    make_layer,
    validate,
    vllm_config,
)

from nvfp4compat import vllm_plugin  # noqa: E402
from nvfp4compat.vllm_plugin import WRITER_REQUIRED  # noqa: E402

HELPER = "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping"


@pytest.fixture
def no_writer(cpu_vllm, clean_plugin, monkeypatch):
    import flashinfer

    if hasattr(flashinfer, HELPER):
        pytest.skip(
            f"flashinfer-python {cpu_vllm.flashinfer_version} has {HELPER}; the negative control needs "
            "0.6.13/0.6.14 (the vLLM 0.25.1/0.26.0 venvs)"
        )
    monkeypatch.setenv("NVFP4COMPAT_DISABLE_TRITON", "1")
    cpu_vllm.set_arch("sm_90")
    load_plugin_through_entry_point()
    route = vllm_plugin.active_route()
    assert route is not None and route.refusal is not None, route
    return route


def _check_message(text: str, cpu_vllm) -> None:
    assert WRITER_REQUIRED in text
    assert cpu_vllm.flashinfer_version in text  # what was found
    assert "0.6.15" in text  # which FlashInfer releases have the helper
    assert "NVFP4COMPAT_DISABLE_TRITON" in text  # the way to the Triton fallback


def test_validation_and_selector_fail_with_the_no_writer_error(cpu_vllm, no_writer):
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.selector import get_attn_backend

    backend = cpu_vllm.registry.AttentionBackendEnum.FLASHINFER.get_class()
    cap = cpu_vllm.capability[0]
    reasons = validate(backend, "nvfp4", cap)
    assert len(reasons) == 1
    _check_message(reasons[0], cpu_vllm)
    assert validate(backend, "fp8", cap) == []  # other dtypes are unaffected
    with set_current_vllm_config(vllm_config("nvfp4")), pytest.raises(ValueError) as err:
        get_attn_backend(128, torch.bfloat16, "nvfp4")
    _check_message(str(err.value), cpu_vllm)


def test_builder_and_impl_constructors_raise(cpu_vllm, no_writer):
    from vllm.config import set_current_vllm_config
    from vllm.v1.kv_cache_interface import KVQuantMode

    backend = cpu_vllm.registry.AttentionBackendEnum.FLASHINFER.get_class()
    with pytest.raises(ValueError) as err:
        backend.get_impl_cls()(4, 128, 128**-0.5, 2, None, None, "nvfp4")
    _check_message(str(err.value), cpu_vllm)
    # The builder gets the NVFP4 spec the runner would give it (the bf16 spec of a real layer, with
    # the NVFP4 storage dtype and quant mode).
    auto = make_layer(cpu_vllm, "auto")
    spec = dataclasses.replace(auto.spec, dtype=torch.uint8, kv_quant_mode=KVQuantMode.NVFP4)
    config = vllm_config("nvfp4")
    with set_current_vllm_config(config), pytest.raises(ValueError) as err:
        backend.get_builder_cls()(
            spec, ["model.layers.0.self_attn.attn"], config, torch.device("cpu")
        )
    _check_message(str(err.value), cpu_vllm)
