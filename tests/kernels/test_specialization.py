"""The kernels' integer arguments that change between serving steps are not specialized on.

Triton compiles a new variant of a ``@triton.jit`` kernel for every integer argument value that is 1 or a
multiple of 16, unless the argument is listed in ``do_not_specialize``. For a batch size or token count
that means compiles in the middle of serving (vLLM's JIT monitor reports them; each costs seconds). On
an H200 (2026-12-04), after this change the decode, merge, writer and dequant kernels compiled once
across batch sizes 1, 7, 16, 17, 32, 33, 48 and 64 (the writer twice: its tile configuration changes
above 32 rows). Triton ignores a name in ``do_not_specialize`` that is not a parameter, so the names are
checked here against the signatures. The compiled (not interpreted) kernel objects are inspected, in
a subprocess without ``TRITON_INTERPRET``; nothing is compiled or launched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

PER_STEP = {
    "nvfp4compat.kernels.triton.write:_write_kernel": ["n_rows"],
    "nvfp4compat.kernels.triton.dequant:_dequant_kernel": ["max_seq_len", "tiles_per_req"],
    "nvfp4compat.kernels.triton.attention:_decode_kernel": ["batch", "programs", "min_tiles", "spread", "max_pages", "num_tokens"],
    "nvfp4compat.kernels.triton.attention:_decode_reduce_kernel": ["batch", "programs", "min_tiles", "spread", "max_pages", "num_tokens"],
    "nvfp4compat.kernels.triton.attention:_prefill_kernel": ["batch", "min_q_len", "max_kv", "num_tokens"],
    "nvfp4compat.kernels.triton.attention:_qsl_guard_kernel": ["batch", "num_tokens", "max_kv"],
    "nvfp4compat.kernels.triton.decode_gluon:gluon_decode_kernel": ["batch", "programs", "min_tiles", "spread", "max_pages", "num_tokens"],
}  # fmt: skip

PROBE = """
import importlib, json, sys
out = {}
for target in json.loads(sys.argv[1]):
    mod, name = target.split(":")
    k = getattr(importlib.import_module(mod), name)
    names = [p.name for p in k.params]
    flagged = [p.name for p in k.params if p.do_not_specialize]
    unknown = [n for n in k.do_not_specialize if not isinstance(n, int) and n not in names]
    out[target] = {"flagged": flagged, "unknown": unknown, "type": type(k).__name__}
print(json.dumps(out))
"""


def test_per_step_arguments_are_not_specialized_on():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(sorted(PER_STEP))], capture_output=True, text=True,
        env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for target, want in PER_STEP.items():
        info = got[target]
        assert info["type"] != "InterpretedFunction", info
        assert info["unknown"] == [], f"{target}: do_not_specialize names no parameter {info['unknown']}"
        missing = [n for n in want if n not in info["flagged"]]
        assert not missing, f"{target}: {missing} would be specialized (a compile per value class)"
