"""The user-facing entry points that read the environment and load the matrix.

:func:`query` resolves a plan for hand-written facts: it fills in what a vLLM release pins, reads
``NVFP4COMPAT_IMPL`` / ``NVFP4COMPAT_KV_ROTATION`` unless told otherwise, loads the bundled matrix,
and calls the pure :func:`nvfp4compat.resolver.resolve`. ``nvfp4compat.query`` is this function.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from nvfp4compat.facts import ENV_CUDAGRAPH_DECODE, ENV_IMPL, ENV_KV_ROTATION, SystemFacts
from nvfp4compat.plan import Plan
from nvfp4compat.resolver import resolve
from nvfp4compat.spec import Matrix

__all__ = ["query"]

_FROM_ENV = object()


def query(
    arch: str | None,
    flashinfer: str | None = None,
    vllm: str | None = None,
    *,
    triton: bool | str = True,
    torch: str | None = None,
    cuda: str | None = None,
    flashinfer_cubin: str | None = None,
    flashinfer_jit_cache: str | None = None,
    trtllm_gen_usable: bool | None = None,
    helpers: Mapping[str, bool] | None = None,
    gpu_name: str | None = None,
    triton_disabled: bool = False,
    impl_env: str | None | object = _FROM_ENV,
    kv_rotation: str | None | object = _FROM_ENV,
    cudagraph_decode: str | None | object = _FROM_ENV,
    overrides: str | Mapping[str, str] | None = None,
    features: Iterable[str] = (),
    matrix: Matrix | None = None,
) -> Plan:
    """Resolve a plan for hand-written facts (no detection, nothing imported).

    Parameters
    ----------
    arch : str or None
        ``"sm_90"`` (also ``sm90``, ``9.0``); an unknown but well-formed arch is planned
        conservatively and listed in ``plan.unverified``.
    flashinfer, vllm : str, optional
        Release versions. Without ``flashinfer`` but with ``vllm``, vLLM's pin is assumed.
    triton : bool or str, default True
        True: installed (version not given); False: absent; a string: that version.
    flashinfer_cubin : str, optional
        Installed flashinfer-cubin; defaults to vLLM's cubin pin when vLLM pins one.
    helpers : mapping, optional
        Helper presence as a probe would report it; default: from the matrix entry.
    impl_env : str or None, optional
        Value of ``NVFP4COMPAT_IMPL`` to apply; by default it is read from ``os.environ`` (the
        environment beats the matrix, an explicit ``overrides`` beats both); None ignores it.
    kv_rotation : str or None, optional
        Value of ``NVFP4COMPAT_KV_ROTATION`` (``"hadamard"`` or ``"none"``); by default it is read
        from ``os.environ``; None means no rotation.
    cudagraph_decode : str or None, optional
        Value of ``NVFP4COMPAT_CUDAGRAPH_DECODE`` (``"1"``/``"0"``); by default it is read from
        ``os.environ``; None lets the matrix decide whether FULL decode graphs capture the plugin's
        decode reader.

    Raises
    ------
    ValueError
        For a malformed arch or version (the message names the accepted forms).
    """
    from nvfp4compat.loader import load_matrix

    m = matrix if matrix is not None else load_matrix()
    if impl_env is _FROM_ENV:
        impl_env = os.environ.get(ENV_IMPL) or None
    if kv_rotation is _FROM_ENV:
        kv_rotation = os.environ.get(ENV_KV_ROTATION) or None
    if cudagraph_decode is _FROM_ENV:
        cudagraph_decode = os.environ.get(ENV_CUDAGRAPH_DECODE) or None
    notes: list[str] = []
    if vllm is not None:
        # Pins come from the release asked about only: a release not in the matrix has unknown pins.
        rel = m.vllm_release(vllm)  # a local build (0.34.0+cu130) has its release's pins
        if rel is None and flashinfer is None:
            notes.append(
                f"flashinfer not given, and vLLM {vllm} is not in the matrix, so its flashinfer-python pin is unknown: "
                "planning without FlashInfer (pass --flashinfer)"
            )
        if rel is not None:
            unpublished = rel.pins.unpublished_pin("flashinfer_python")
            if flashinfer is None and unpublished is not None:
                flashinfer = unpublished.install_instead
                notes.append(
                    f"flashinfer not given: vLLM {vllm} pins flashinfer-python=={rel.pins.flashinfer_python}, which is not "
                    f"on the package index; assuming {flashinfer}, the release the matrix installs instead "
                    f"(nvfp4compat constraints --vllm {vllm})"
                )
            elif flashinfer is None:
                flashinfer = rel.pins.flashinfer_python
                notes.append(f"flashinfer not given: assuming vLLM {vllm}'s pin flashinfer-python=={flashinfer}")
            if flashinfer_cubin is None and rel.pins.flashinfer_cubin is not None:
                flashinfer_cubin = rel.pins.flashinfer_cubin
                notes.append(f"flashinfer-cubin not given: assuming vLLM {vllm}'s pin flashinfer-cubin=={flashinfer_cubin}")
            if torch is None and rel.pins.torch is not None:
                torch = rel.pins.torch
                notes.append(f"torch not given: vLLM {vllm} pins torch {torch}")
    tri: str | None
    if triton is True:
        tri = "any"
    elif triton is False:
        tri = None
    else:
        tri = str(triton)
    facts = SystemFacts(
        arch=arch,
        arch_source="argument" if arch else None,
        gpu_name=gpu_name,
        cuda=cuda,
        torch=torch,
        triton=tri,
        flashinfer=flashinfer,
        flashinfer_helpers=dict(helpers) if helpers is not None else None,
        flashinfer_probe="argument" if helpers is not None else None,
        flashinfer_cubin=flashinfer_cubin,
        flashinfer_jit_cache=flashinfer_jit_cache,
        vllm=vllm,
        trtllm_gen_usable=trtllm_gen_usable,
        triton_disabled=triton_disabled,
        impl_env=impl_env,  # type: ignore[arg-type]
        kv_rotation_env=kv_rotation,  # type: ignore[arg-type]
        cudagraph_decode_env=cudagraph_decode,  # type: ignore[arg-type]
        source="query",
        notes=notes,
    )
    return resolve(m, facts, overrides, features=features)
