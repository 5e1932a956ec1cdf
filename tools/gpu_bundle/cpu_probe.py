#!/usr/bin/env python3
"""CPU-side probe of the unpacked bundle, run by ``build.py verify`` in the venv that mimics the host.

Imports vLLM modules from the pruned tree and reports, as one ``PROBE {json}`` line, which import
and which failed. Options:

``--cuda``
    Import as the CUDA platform does on an SM90 GPU: ``current_platform`` is vLLM's ``CudaPlatform``
    (capability 9.0), so CUDA-only imports run. The compiled modules the bundle keeps cannot load
    without a GPU; each one named in ``--stand-in`` becomes an empty module, and the torch.ops
    namespaces they register (``--namespaces``) answer any op name. Nothing else is replaced: an
    import of anything the bundle pruned fails here as it would on the device.
``--block a,b``
    Make these top-level modules unimportable (leave-one-out proof that a dependency is needed).
``--engine-config MODEL``
    After the imports, build vLLM's engine config (``EngineArgs.create_engine_config``) for MODEL
    with the settings ``nvfp4compat/validation/job.py`` uses, for bf16/fp8/nvfp4 KV and each cudagraph mode, and
    load its tokenizer through vLLM (needs ``--cuda``).

Diagnostic only: nothing here is shipped to or run on the device.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback
import types
from typing import Any


def _where(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    return " <- ".join(f"{f.filename.split('/vllm/')[-1]}:{f.lineno}" for f in tb[-4:][::-1])


def install_cuda_stand_ins(stand_in: list[str], namespaces: set[str]) -> None:
    for name in stand_in:
        sys.modules[name] = types.ModuleType(name)
    import torch._ops as ops
    import torch.library as lib

    class _Op:
        def __init__(self, name: str) -> None:
            self._name = name

        def __call__(self, *args: Any, **kwargs: Any) -> None:
            return None

        def __getattr__(self, attr: str) -> _Op:
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _Op(f"{self._name}.{attr}")

    orig_getattr = ops._OpNamespace.__getattr__

    def getattr_(self: Any, name: str) -> Any:
        try:
            return orig_getattr(self, name)
        except AttributeError:
            if getattr(self, "name", None) in namespaces and not name.startswith("__"):
                return _Op(f"{self.name}.{name}")
            raise

    ops._OpNamespace.__getattr__ = getattr_  # type: ignore[method-assign]
    orig_fake = lib.register_fake

    def register_fake(op: Any, func: Any = None, /, **kw: Any) -> Any:
        if isinstance(op, str) and op.split("::")[0] in namespaces:

            def deco(f: Any) -> Any:
                try:
                    return orig_fake(op, **kw)(f)
                except Exception:  # the op lives in a stand-in module: no schema to attach to
                    return f

            return deco(func) if func is not None else deco
        return orig_fake(op, func, **kw) if func is not None else orig_fake(op, **kw)

    lib.register_fake = register_fake
    import vllm.platforms as platforms
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability

    CudaPlatform.get_device_capability = classmethod(
        lambda cls, device_id=0: DeviceCapability(9, 0)
    )
    platforms._current_platform = CudaPlatform()


def block(names: set[str]) -> None:
    class _Block:
        def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
            if name.split(".")[0] in names:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, _Block())


def engine_configs(model: str) -> dict[str, str]:
    from vllm.engine.arg_utils import EngineArgs

    out = {}
    for kv, mode in (
        ("auto", "eager"),
        ("fp8", "eager"),
        ("nvfp4", "eager"),
        ("nvfp4", "piecewise"),
        ("nvfp4", "full"),
        ("nvfp4", "default"),
    ):
        comp: dict[str, Any] = {"max_cudagraph_capture_size": 64}
        if mode in ("piecewise", "full"):
            comp["cudagraph_mode"] = mode.upper()
        kwargs: dict[str, Any] = dict(
            model=model,
            tokenizer=model,
            dtype="bfloat16",
            kv_cache_dtype=kv,
            attention_backend="FLASHINFER",
            gpu_memory_utilization=0.3,
            max_model_len=8704,
            max_num_seqs=64,
            enable_prefix_caching=False,
            seed=0,
            generation_config="vllm",
            enforce_eager=mode == "eager",
        )
        if mode != "eager":
            kwargs["compilation_config"] = comp
        try:
            cfg = EngineArgs(**kwargs).create_engine_config()
            mc = cfg.model_config
            out[f"{kv}/{mode}"] = (
                f"ok: {mc.architectures[0]}, max_model_len {mc.max_model_len}, cache {cfg.cache_config.cache_dtype}, "
                f"cudagraph {cfg.compilation_config.cudagraph_mode.name}, backend {cfg.attention_config.backend.name}, "
                f"vocab {mc.get_vocab_size()}, kv heads {mc.get_num_kv_heads(cfg.parallel_config)}, head {mc.get_head_size()}"
            )
        except Exception as exc:  # noqa: BLE001 - reported
            out[f"{kv}/{mode}"] = f"{type(exc).__name__}: {str(exc)[:400]} @ {_where(exc)}"
    try:
        from vllm.tokenizers import get_tokenizer

        tok = get_tokenizer(model)
        text = "The quick brown fox"
        out["tokenizer"] = (
            f"ok: {type(tok).__name__}, {len(tok)} tokens, eos {tok.eos_token_id}, round trip {tok.decode(tok.encode(text)) == text}"
        )
    except Exception as exc:  # noqa: BLE001
        out["tokenizer"] = f"{type(exc).__name__}: {exc} @ {_where(exc)}"
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("modules", help="comma list of modules to import")
    ap.add_argument("--cuda", action="store_true")
    ap.add_argument(
        "--stand-in", default="", help="comma list of compiled modules to replace by empty modules"
    )
    ap.add_argument(
        "--namespaces", default="", help="comma list of torch.ops namespaces those modules register"
    )
    ap.add_argument("--block", default="")
    ap.add_argument("--engine-config", default=None)
    args = ap.parse_args()
    if args.block:
        block(set(args.block.split(",")))
    res: dict[str, Any] = {}
    if args.cuda:
        install_cuda_stand_ins(
            [s for s in args.stand_in.split(",") if s], {n for n in args.namespaces.split(",") if n}
        )
    for m in args.modules.split(","):
        try:
            importlib.import_module(m)
            res[m] = "ok"
        except BaseException as exc:  # noqa: BLE001
            res[m] = f"{type(exc).__name__}: {exc} @ {_where(exc)}"
    import importlib.metadata as md

    import vllm

    res["_vllm_file"] = vllm.__file__
    res["_vllm_version"] = md.version("vllm")
    try:
        import flashinfer

        res["_flashinfer"] = f"{flashinfer.__file__} {md.version('flashinfer-python')}"
    except Exception as exc:  # noqa: BLE001
        res["_flashinfer"] = f"{type(exc).__name__}: {exc}"
    if args.engine_config:
        res["_engine_config"] = engine_configs(args.engine_config)
    print("PROBE " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
