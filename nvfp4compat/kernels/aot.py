"""Ahead-of-time compilation of every bundled Triton kernel variant, for a list of CUDA targets.

Triton compiles to PTX and cubin without a GPU (``triton.compile(ASTSource(fn, signature, constexprs),
target=GPUTarget("cuda", cc, 32))``), so a CPU-only machine proves that each kernel builds for SM80, 86,
89, 90, 100 and 120 (the trap this catches: ``tl.float8e4nv`` casts do not build for SM80/86).

Kernels come from *providers*: modules that define ``aot_kernels() -> list[AotKernel]``
(:data:`PROVIDERS`; a listed module that does not exist yet is reported, not an error), plus kernels
added with :func:`register`. Each :class:`AotKernel` lists the variants to build: a signature (argument
name -> Triton type, constexprs as ``"constexpr"``), constexpr values and ``num_warps``. List a covering
set of variants (every tile config once, every dtype / head_dim / flag value at least once), not the
full product: each variant is compiled once per target.

Under ``TRITON_INTERPRET=1`` ``@triton.jit`` yields interpreter objects that cannot be compiled;
:func:`compile_all` then runs itself in a subprocess without that variable and returns its report.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_CCS",
    "PROVIDERS",
    "AotVariant",
    "AotKernel",
    "AotResult",
    "AotReport",
    "aligned",
    "build",
    "register",
    "collect_kernels",
    "compile_all",
]

DEFAULT_CCS = (80, 86, 89, 90, 100, 120)
PROVIDERS: list[str] = [
    "nvfp4compat.kernels.triton.write",
    "nvfp4compat.kernels.triton.dequant",
    "nvfp4compat.kernels.triton.attention",
]


@dataclass(frozen=True)
class AotVariant:
    """One compile of a kernel: ``signature`` maps every argument name to a Triton type (``"*bf16"``,
    ``"i32"``, ``"fp32"``, ``"constexpr"``); ``constexprs`` gives the constexpr values; ``attrs`` are
    optional specialization hints (``{(arg_index,): [["tt.divisibility", 16]]}``)."""

    label: str
    signature: dict[str, str]
    constexprs: dict[str, Any]
    num_warps: int = 4
    num_stages: int = 3
    attrs: dict[Any, Any] | None = None
    # constexprs that depend on the target, as the launcher picks them per device (e.g. hardware
    # FP8 conversions from SM89 on): ``by_cc(cc) -> {name: value}``, merged over ``constexprs``
    by_cc: Callable[[int], dict[str, Any]] | None = None
    # a register cap per thread, as the launch passes it (``DecodeConfig.maxnreg``); None: none
    maxnreg: int | None = None

    def constexprs_for(self, cc: int) -> dict[str, Any]:
        return {**self.constexprs, **(self.by_cc(cc) if self.by_cc else {})}


@dataclass(frozen=True)
class AotKernel:
    """A ``@triton.jit`` kernel and the variants to compile."""

    name: str
    fn: Any
    variants: list[AotVariant]


@dataclass(frozen=True)
class AotResult:
    kernel: str
    variant: str
    cc: int
    ok: bool
    seconds: float
    cubin_bytes: int = 0
    error: str = ""
    # with ``resources=True``: what the cubin takes (:func:`cubin_resources`), else None
    resources: dict[str, Any] | None = None


@dataclass
class AotReport:
    """Outcome of :func:`compile_all`: one :class:`AotResult` per (kernel, variant, cc)."""

    ccs: list[int]
    results: list[AotResult] = field(default_factory=list)
    missing_providers: list[str] = field(default_factory=list)
    triton_version: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(r.ok for r in self.results)

    @property
    def failures(self) -> list[AotResult]:
        return [r for r in self.results if not r.ok]

    def matrix(self) -> str:
        """Markdown table: one row per kernel, one column per cc, ``ok/total`` compiled variants."""
        kernels = sorted({r.kernel for r in self.results})
        lines = [
            "| kernel | " + " | ".join(f"sm_{cc}" for cc in self.ccs) + " |",
            "|---|" + "---|" * len(self.ccs),
        ]
        for k in kernels:
            cells = []
            for cc in self.ccs:
                rs = [r for r in self.results if r.kernel == k and r.cc == cc]
                cells.append(f"{sum(r.ok for r in rs)}/{len(rs)}")
            lines.append(f"| {k} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def resource_table(self) -> str:
        """Markdown table of the compiled variants' :func:`cubin_resources`: one row per (kernel, variant, cc)."""
        cols = ("registers", "local_bytes", "static_shared", "dynamic_shared", "instructions", "barriers",
                "global_loads", "async_copies", "shared_loads")
        lines = ["| kernel | variant | sm | " + " | ".join(c.replace("_", " ") for c in cols) + " |",
                 "|---|---|---|" + "---|" * len(cols)]
        for r in self.results:
            if r.resources:
                cells = [str(r.resources.get(c, "")) for c in cols]
                lines.append(f"| {r.kernel} | {r.variant} | {r.cc} | " + " | ".join(cells) + " |")
                if r.resources.get("error"):
                    lines.append(f"|  | ({r.resources['error']}) |" + " |" * (len(cols) + 1))
        return "\n".join(lines)

    def __str__(self) -> str:
        secs = sum(r.seconds for r in self.results)
        targets = ", ".join(f"sm_{c}" for c in self.ccs)
        head = (
            f"AOT compile, triton {self.triton_version}: {sum(r.ok for r in self.results)}/"
            f"{len(self.results)} variants built for [{targets}] in {secs:.1f} s"
        )
        parts = [head, self.matrix()]
        if any(r.resources for r in self.results):
            parts.append(self.resource_table())
        if self.missing_providers:
            parts.append("providers not present (skipped): " + ", ".join(self.missing_providers))
        for r in self.failures:
            parts.append(f"FAILED {r.kernel} [{r.variant}] sm_{r.cc}: {r.error}")
        return "\n".join(parts)

    def to_json(self) -> str:
        return json.dumps(
            {
                "ccs": self.ccs,
                "results": [asdict(r) for r in self.results],
                "missing_providers": self.missing_providers,
                "triton_version": self.triton_version,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> AotReport:
        d = json.loads(text)
        return cls(
            ccs=d["ccs"],
            results=[AotResult(**r) for r in d["results"]],
            missing_providers=d["missing_providers"],
            triton_version=d["triton_version"],
        )


def aligned(signature: dict[str, str], names: list[str] | tuple[str, ...]) -> dict:
    """``attrs`` marking ``names`` as multiples of 16, as a JIT launch does for aligned pointers and
    strides: the AOT build then takes the vectorized paths a GPU launch takes."""
    index = {name: i for i, name in enumerate(signature)}
    unknown = sorted(set(names) - set(index))
    if unknown:
        raise ValueError(f"not in the signature: {unknown}")
    return {(index[n],): [["tt.divisibility", 16]] for n in names}


_registered: list[AotKernel] = []


def register(kernel: AotKernel) -> None:
    """Add a kernel to every later :func:`compile_all` (in addition to :data:`PROVIDERS`)."""
    if any(k.name == kernel.name for k in _registered):
        raise ValueError(f"an AOT kernel named {kernel.name!r} is already registered")
    _registered.append(kernel)


def collect_kernels(providers: list[str] | None = None) -> tuple[list[AotKernel], list[str]]:
    """Import the providers and return ``(kernels, missing provider modules)``."""
    kernels: list[AotKernel] = []
    missing: list[str] = []
    for mod_name in PROVIDERS if providers is None else providers:
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as exc:
            if exc.name == mod_name:
                missing.append(mod_name)
                continue
            raise
        if not hasattr(mod, "aot_kernels"):
            raise TypeError(f"AOT provider {mod_name} defines no aot_kernels() function")
        kernels.extend(mod.aot_kernels())
    kernels.extend(_registered)
    names = [k.name for k in kernels]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"duplicate AOT kernel names: {dupes}")
    return kernels, missing


def _interpreted(kernels: list[AotKernel]) -> bool:
    """Whether this process imported the kernels for Triton's interpreter: a kernel that is no ``JITFunction``, or
    ``TRITON_INTERPRET`` set. The variable counts on its own: under it a Gluon kernel stays a ``GluonJITFunction``
    while the ``@gluon.jit`` helpers it calls become interpreted functions, and compiling it in this process fails
    ("Unsupported function referenced") unless Triton's cache already holds the binary."""
    from triton.runtime.jit import JITFunction

    from nvfp4compat.kernels.checks import interpreting

    return interpreting() or any(not isinstance(k.fn, JITFunction) for k in kernels)


def build(kernel: AotKernel, variant: AotVariant, cc: int) -> Any:
    """Compile one variant for ``sm_<cc>`` as a JIT launch would; returns triton's ``CompiledKernel``
    (``.asm["ptx"]``, ``.asm["cubin"]``). Needs a real ``@triton.jit`` function (no TRITON_INTERPRET)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source: Any = ASTSource
    if type(kernel.fn).__name__ == "GluonJITFunction":  # a Gluon kernel (triton.experimental.gluon)
        from triton.experimental.gluon._runtime import GluonASTSource

        source = GluonASTSource
    src = source(kernel.fn, variant.signature, variant.constexprs_for(cc), variant.attrs)
    return triton.compile(
        src,
        target=GPUTarget("cuda", cc, 32),
        # fp fusion on, as a JIT launch has it by default (triton 3.6; 3.9 warns when unset)
        options={
            "num_warps": variant.num_warps,
            "num_stages": variant.num_stages,
            "enable_fp_fusion": True,
            **({"maxnreg": variant.maxnreg} if variant.maxnreg else {}),
        },
    )


# SASS opcodes whose count :func:`cubin_resources` reports: barriers, global loads, async copies to shared memory
_SASS_COUNTED = {"barriers": ("BAR",), "global_loads": ("LDG",), "async_copies": ("LDGSTS",),
                 "shared_loads": ("LDS", "LDSM")}


def _cuobjdump() -> str | None:
    """The ``cuobjdump`` that Triton's NVIDIA backend carries, else one on PATH, else None."""
    import shutil

    try:
        import triton

        path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        if os.access(path, os.X_OK):
            return path
    except ImportError:
        pass
    return shutil.which("cuobjdump")


def sass_listing(text: str) -> list[tuple[int, str]]:
    """``(address, instruction)`` for every instruction line of ``cuobjdump -sass``'s listing (the text before its
    ``;``, without the encoding comments)."""
    import re

    out = []
    for line in text.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/(.*)", line)
        if m and (instr := m.group(2).split(";")[0].strip()):
            out.append((int(m.group(1), 16), instr))
    return out


def sass_opcode(instr: str) -> str:
    """An instruction's opcode: its first word after the predicate (``@P0``), without its modifiers
    (``@!P0 BAR.SYNC 0x0`` -> ``BAR``)."""
    words = instr.split()
    return (words[1] if words[0].startswith("@") and len(words) > 1 else words[0]).split(".")[0]


def cubin_resources(cubin: bytes, dynamic_shared: int, sass_path: str | None = None) -> dict[str, Any]:
    """What one kernel's cubin takes, read with ``cuobjdump`` (Triton's own, else one on PATH): ``registers`` per
    thread, ``local_bytes`` per thread (spills and stack), ``static_shared`` bytes (``.shared`` the PTX declares,
    e.g. inline asm), ``dynamic_shared`` (Triton's allocation, passed in from the compile's metadata), SASS
    ``instructions`` (NOPs left out) and the counts of :data:`_SASS_COUNTED` (``barriers``: ``BAR.*``; ``async_copies``:
    ``LDGSTS``). ``sass_path``: also write the disassembly there. Without ``cuobjdump`` only ``dynamic_shared``
    and an ``error`` saying so come back."""
    import re
    import tempfile

    out: dict[str, Any] = {"dynamic_shared": int(dynamic_shared)}
    tool = _cuobjdump()
    if tool is None:
        out["error"] = ("no cuobjdump: neither Triton's NVIDIA backend (triton/backends/nvidia/bin) nor PATH has one; "
                        "install triton with its NVIDIA backend or the CUDA toolkit")
        return out
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        usage = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True, timeout=120)
        sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True, timeout=120)
    m = re.search(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)", usage.stdout)
    if m is None or sass.returncode != 0:
        out["error"] = f"cuobjdump ({tool}) gave no resource usage: {(usage.stderr or sass.stderr)[-300:].strip()}"
        return out
    out.update(registers=int(m.group(1)), stack_bytes=int(m.group(2)), static_shared=int(m.group(3)),
               local_bytes=int(m.group(4)))
    ops = [instr for _, instr in sass_listing(sass.stdout) if instr.split()[0] != "NOP"]  # (the padding at the end)
    out["instructions"] = len(ops)
    names = [sass_opcode(instr) for instr in ops]
    for key, opcodes in _SASS_COUNTED.items():
        out[key] = sum(n in opcodes for n in names)
    if sass_path:
        with open(sass_path, "w") as f:
            f.write(sass.stdout)
    return out


def _compile_one(kernel: AotKernel, variant: AotVariant, cc: int, resources: bool = False,
                 sass_dir: str | None = None) -> AotResult:
    t0 = time.perf_counter()
    try:
        compiled = build(kernel, variant, cc)
        cubin = compiled.asm["cubin"]
        res = None
        if resources or sass_dir:
            sass_path = (os.path.join(sass_dir, f"{kernel.name}-{variant.label}-sm{cc}.sass".replace("/", "_"))
                         if sass_dir else None)
            res = cubin_resources(cubin, getattr(compiled.metadata, "shared", 0), sass_path)
        return AotResult(kernel.name, variant.label, cc, True, time.perf_counter() - t0, len(cubin), resources=res)
    except Exception as exc:  # report every failure, keep compiling the rest
        msg = f"{type(exc).__name__}: {exc}".strip().splitlines()
        if exc.__cause__ is not None:  # a CompilationError's message is mostly source; its cause says why
            msg = [f"{type(exc.__cause__).__name__}: {exc.__cause__}".strip()[:600], "|", *msg]
        return AotResult(
            kernel.name, variant.label, cc, False, time.perf_counter() - t0, 0, " ".join(msg)[:2000]
        )


def selected(kernel: str, label: str, only: list[str] | None) -> bool:
    """Whether ``--only`` picks variant ``label`` of ``kernel``: no selectors, or one that ``kernel/label`` holds
    (e.g. ``gluon/bf16-d128-sweep39``, ``sweep39``, ``attention_decode_gluon/``); a selector ending in ``$`` must
    end it (``gluon/bf16-d128$``: that variant, not ``bf16-d128-g16``)."""
    name = f"{kernel}/{label}"
    return not only or any(name.endswith(sel[:-1]) if sel.endswith("$") else sel in name for sel in only)


def compile_all(
    ccs: list[int] | tuple[int, ...] = DEFAULT_CCS,
    *,
    kernels: list[str] | None = None,
    providers: list[str] | None = None,
    jobs: int = 1,
    only: list[str] | None = None,
    resources: bool = False,
    sass_dir: str | None = None,
) -> AotReport:
    """Compile every variant of every AOT kernel for each compute capability in ``ccs``.

    Parameters
    ----------
    ccs : list of int
        Targets as ``major*10 + minor`` (80, 86, 89, 90, 100, 120, ...).
    kernels : list of str, optional
        Only these kernel names (default: all).
    providers : list of str, optional
        Provider modules to import instead of :data:`PROVIDERS`.
    jobs : int
        Compile in this many child processes at once (the targets are split between them).
    only : list of str, optional
        Only the variants whose ``kernel/label`` holds one of these substrings (:func:`selected`).
    resources : bool
        Also read each cubin's registers, local memory, shared memory and SASS counts (:func:`cubin_resources`)
        into ``AotResult.resources``.
    sass_dir : str, optional
        Write each variant's SASS there (``<kernel>-<label>-sm<cc>.sass``); implies reading its resources.

    Returns
    -------
    AotReport
        Per (kernel, variant, cc) success, time and cubin size; ``report.ok`` is True when everything
        built. Never raises for a failed compile (the failure is in the report).
    """
    import triton

    ccs = [int(c) for c in ccs]
    if jobs > 1 and len(ccs) > 1:
        groups = [ccs[i::jobs] for i in range(min(jobs, len(ccs)))]
        procs = [_spawn(g, kernels, providers, only, resources, sass_dir) for g in groups]
        reports = [_collect(p) for p in procs]
        merged = AotReport(
            ccs=ccs,
            missing_providers=reports[0].missing_providers,
            triton_version=reports[0].triton_version,
        )
        for cc in ccs:  # keep the order of a serial run
            for rep in reports:
                merged.results.extend(r for r in rep.results if r.cc == cc)
        return merged
    found, missing = collect_kernels(providers)
    if kernels is not None:
        unknown = sorted(set(kernels) - {k.name for k in found})
        if unknown:
            raise ValueError(
                f"unknown AOT kernels {unknown}; known: {sorted(k.name for k in found)}"
            )
        found = [k for k in found if k.name in kernels]
    if _interpreted(found):
        return _collect(_spawn(ccs, kernels, providers, only, resources, sass_dir))
    if sass_dir:
        os.makedirs(sass_dir, exist_ok=True)
    report = AotReport(ccs=ccs, missing_providers=missing, triton_version=triton.__version__)
    for cc in ccs:
        for kernel in found:
            for variant in kernel.variants:
                if selected(kernel.name, variant.label, only):
                    report.results.append(_compile_one(kernel, variant, cc, resources, sass_dir))
    return report


def _spawn(
    ccs: list[int], kernels: list[str] | None, providers: list[str] | None, only: list[str] | None = None,
    resources: bool = False, sass_dir: str | None = None,
) -> subprocess.Popen:
    """Start ``compile_all(ccs)`` in a child without TRITON_INTERPRET, seeing this process's sys.path."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    code = (
        "import json, sys; from nvfp4compat.kernels.aot import compile_all; "
        "a = json.loads(sys.argv[1]); "
        "print('AOT-REPORT ' + compile_all(a['ccs'], kernels=a['kernels'], providers=a['providers'], only=a['only'], "
        "resources=a['resources'], sass_dir=a['sass_dir']).to_json())"
    )
    arg = json.dumps({"ccs": ccs, "kernels": kernels, "providers": providers, "only": only, "resources": resources,
                      "sass_dir": sass_dir})
    return subprocess.Popen(
        [sys.executable, "-c", code, arg],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _collect(proc: subprocess.Popen) -> AotReport:
    out, err = proc.communicate()
    for line in out.splitlines():
        if line.startswith("AOT-REPORT "):
            return AotReport.from_json(line[len("AOT-REPORT ") :])
    raise RuntimeError(
        "the AOT compile subprocess (run without TRITON_INTERPRET) produced no report; exit code "
        f"{proc.returncode}; stderr tail:\n{err[-4000:]}"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m nvfp4compat.kernels.aot [CC ...] [--jobs N] [--only SUBSTR,...] [--resources] [--sass DIR]``:
    compile every provider's variants (or those ``--only`` picks) for each target (default: :data:`DEFAULT_CCS`);
    exit 1 when one fails, 2 on bad arguments."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m nvfp4compat.kernels.aot",
        description="Compile every shipped Triton kernel variant ahead of time for the given SM targets "
                    "(no GPU needed).",
    )
    ap.add_argument("ccs", nargs="*", metavar="CC",
                    help=f"compute capabilities as major*10+minor, e.g. 80 90 120 (default: {' '.join(map(str, DEFAULT_CCS))})")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compile processes (default: the CPU count)")
    ap.add_argument("--only", default=None, metavar="SUBSTR,...",
                    help="only the variants whose 'kernel/label' holds one of these comma-separated substrings ('$' at "
                         "the end: ends with it), e.g. 'gluon/bf16-d128-sweep39,attention_decode_gluon/bf16-d128$'")
    ap.add_argument("--resources", action="store_true",
                    help="also print each cubin's registers, local and shared memory and SASS counts "
                         "(instructions, BAR, LDG, LDGSTS, LDS), read with cuobjdump")
    ap.add_argument("--sass", default=None, metavar="DIR", help="write each variant's SASS into DIR (implies --resources)")
    args = ap.parse_args(argv)
    ccs: list[int] = []
    for text in args.ccs:
        if not text.isdigit() or not 50 <= int(text) <= 199:
            ap.error(f"{text!r} is not a compute capability; give major*10+minor, e.g. 90 for sm_90")
        ccs.append(int(text))
    if args.jobs < 1:
        ap.error(f"--jobs must be at least 1, got {args.jobs}")
    only = [x.strip() for x in args.only.split(",") if x.strip()] if args.only is not None else None
    if only is not None and not only:
        ap.error("--only needs at least one substring, e.g. --only attention_decode_gluon/bf16-d128-sweep39")
    if only:
        found, _missing = collect_kernels()
        if not any(selected(k.name, v.label, only) for k in found for v in k.variants):
            labels = [f"{k.name}/{v.label}" for k in found for v in k.variants]
            ap.error(f"--only {args.only} selects no variant; the kernels are "
                     f"{sorted({k.name for k in found})} ({len(labels)} variants, e.g. {labels[0]})")
    rep = compile_all(ccs or DEFAULT_CCS, jobs=args.jobs, only=only, resources=args.resources or bool(args.sass),
                      sass_dir=args.sass)
    print(rep)
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
