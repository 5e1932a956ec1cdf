#!/usr/bin/env python3
"""Unpack the GPU bundle on the H200 host and run issue 6's end-to-end checks.

Standard library only until the checks start (the host's ``python3`` is 3.12 with torch 2.11.0+cu130;
nothing is installed from a network). Three subcommands:

``unpack``
    For every part folder carried so far (``.bundle/pNN/``), verify the part's sha256 against the
    newest ``manifest.json`` found there and extract it into ``--site`` (default ``/tmp/site``).
    Parts already extracted with the same sha256 are skipped, so each device call only pays for
    what it carried. When every part is in, join chunked files and check each component's tree
    sha256. Exit 0 when complete, 3 while parts are missing (the message names them).
``status``
    What is unpacked, what is missing.
``run --checks 1,2,...``
    ``unpack``, then a preflight (versions, imports, the compiled extension), the tiny model
    (``scripts/make_tiny_model.py``, made once per machine), then the selected checks. Each vLLM
    engine runs in its own subprocess (``engine_job.py``), engines shared by several checks run
    once. Writes ``results.json``, ``summary.md``, ``jobs.log`` and ``runner.log`` under ``--out``.

Checks (issue 6; ``docs/validation.md`` has the acceptance rule of each):

====  ==========  =============================================================================
1     negative    vLLM 0.26.0 + FlashInfer 0.6.14, no plugin (VLLM_PLUGINS=""), nvfp4, FLASHINFER:
                  must fail with "kv_cache_dtype not supported"
2     plugin      with the plugin: starts, the plugin's log line, greedy generation with
                  enforce_eager, PIECEWISE and FULL CUDA graphs; graph outputs against eager
3     capacity    reported KV cache tokens, nvfp4 against bf16 (same memory settings): >= 3.3x
4     fidelity    teacher-forced prompt logprobs over 8 x 2048 tokens: nvfp4 and fp8 against bf16
5     fi015       2 and 4 with FlashInfer 0.6.15 (its slot-mapping writer), plus ``writer``
6     throughput  decode tokens/s, 32 concurrent requests with 8K contexts, nvfp4 against bf16
7     tp          2 and 3 with tensor parallelism ``--tp`` (2; the nvidia-h200-x2 machine): the plugin
                  must load and bind in every worker process
writer            kernel-level bytes of nvfp4compat's Triton writer against FlashInfer's writer
preflight         versions, imports and requirement checks only
====  ==========  =============================================================================
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
STATE_FILE = ".bundle-state.json"

CHECKS = {
    "1": "negative",
    "2": "plugin",
    "3": "capacity",
    "4": "fidelity",
    "5": "fi015",
    "6": "throughput",
    "7": "tp",
    "recall": "recall",  # issue 7: needle recall through vLLM with the trained model
    "writer": "writer",
    "preflight": "preflight",
}
CHECK_IDS = {v: k for k, v in CHECKS.items()}


class RunnerError(RuntimeError):
    """What was found, what is needed and the way out."""


def say(msg: str) -> None:
    print(msg, flush=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# unpacking


SITE_MANIFEST = ".bundle-manifest.json"


def find_manifest(
    bundle_dir: Path, explicit: Path | None, site: Path | None = None
) -> tuple[Path, dict[str, Any]]:
    """The manifest to follow: ``explicit``, else the newest ``manifest.json`` among the carried
    folders, else the copy kept in ``site`` when a bundle was completed there."""
    if explicit:
        return explicit, json.loads(explicit.read_text())
    found = []
    if site is not None and (site / SITE_MANIFEST).is_file():
        data = json.loads((site / SITE_MANIFEST).read_text())
        found.append((str(data.get("built_at", "")), str(site / SITE_MANIFEST), data))
    for path in list(bundle_dir.glob("p*/manifest.json")) + [bundle_dir / "manifest.json"]:
        if path.is_file():
            data = json.loads(path.read_text())
            found.append((str(data.get("built_at", "")), str(path), data))
    if not found:
        raise RunnerError(
            f"no manifest.json under {bundle_dir}/p*/: carry the part folders (e.g. carry=['.bundle/p01']) "
            "built by `python scripts/gpu_bundle/build.py build`"
        )
    found.sort(key=lambda t: (t[0], t[1]))
    built_at, where, data = found[-1]
    ids = sorted({d.get("build_id") for _, _, d in found})
    if len(ids) > 1:
        say(
            f"note: part folders of {len(ids)} builds are present ({ids}); following the newest, {data['build_id']} ({built_at})"
        )
    return Path(where), data


def load_state(site: Path) -> dict[str, Any]:
    path = site / STATE_FILE
    if path.exists():
        return json.loads(path.read_text())
    return {"parts": {}, "files": {}, "complete": None}


def save_state(site: Path, state: dict[str, Any]) -> None:
    site.mkdir(parents=True, exist_ok=True)
    tmp = site / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(site / STATE_FILE)


def tree_sha256(root: Path) -> tuple[str, int]:
    """sha256 over sorted ``relpath\\0sha256\\n`` lines of every file, skipping __pycache__ (as build.py)."""
    lines = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for fn in filenames:
            if fn.endswith(".pyc"):
                continue
            p = os.path.join(dirpath, fn)
            lines.append((os.path.relpath(p, root).replace(os.sep, "/"), sha256_file(Path(p))))
    lines.sort()
    h = hashlib.sha256()
    for rel, digest in lines:
        h.update(f"{rel}\0{digest}\n".encode())
    return h.hexdigest(), len(lines)


def _extract(part_path: Path, site: Path) -> list[str]:
    names = []
    with tarfile.open(part_path, "r:xz") as tf:
        members = tf.getmembers()
        for m in members:
            if not m.isfile() or m.name.startswith("/") or ".." in m.name.split("/"):
                raise RunnerError(
                    f"{part_path}: unexpected member {m.name!r} (only plain relative files are bundled)"
                )
            names.append(m.name)
        kwargs: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tf.extractall(site, members=members, **kwargs)
    return names


def unpack(
    bundle_dir: Path, site: Path, manifest_path: Path | None = None, clean: bool = False
) -> tuple[bool, dict[str, Any]]:
    """Extract the parts present under ``bundle_dir``; finish the bundle once all are in.

    Returns
    -------
    (complete, manifest)
    """
    if clean and site.exists():
        say(f"removing {site}")
        shutil.rmtree(site)
    mpath, manifest = find_manifest(bundle_dir, manifest_path, site)
    state = load_state(site)
    restore_caches(bundle_dir, state)
    save_state(site, state)
    if state.get("complete") and state["complete"] != manifest["build_id"]:
        state["complete"] = None
    wanted = {p["name"]: p for p in manifest["parts"]}
    current = {n for n, sha in state["parts"].items() if n in wanted and wanted[n]["sha256"] == sha}
    say(
        f"bundle {manifest['build_id']} ({manifest['built_at']}), manifest {mpath}: {len(wanted)} parts"
    )
    for name, part in wanted.items():
        path = bundle_dir / part["folder"] / part["file"]
        if name in current:
            say(f"  {name}: already unpacked (sha256 {part['sha256'][:16]})")
            continue
        if not path.exists():
            say(f"  {name}: missing (carry .bundle/{part['folder']})")
            continue
        t0 = time.time()
        size = path.stat().st_size
        digest = sha256_file(path)
        if size != part["bytes"] or digest != part["sha256"]:
            raise RunnerError(
                f"{path}: {size} bytes, sha256 {digest[:16]}; the manifest says {part['bytes']} bytes, "
                f"sha256 {part['sha256'][:16]}: a truncated or stale copy; rebuild or re-carry .bundle/{part['folder']}"
            )
        # A part name reused by a newer build: remove the files the old one put there first
        # (unless a part of this build that is already unpacked owns them).
        owned = {f for n in current for f in state["files"].get(n, [])}
        for rel in state["files"].get(name, []):
            if rel not in owned:
                (site / rel).unlink(missing_ok=True)
        site.mkdir(parents=True, exist_ok=True)
        names = _extract(path, site)
        state["parts"][name] = digest
        state["files"][name] = names
        state["complete"] = None
        current.add(name)
        save_state(site, state)
        say(
            f"  {name}: unpacked {len(names)} files, {size / (1 << 20):.1f} MiB in {time.time() - t0:.1f} s"
        )
    missing = [n for n in wanted if n not in current]
    if missing:
        folders = [f".bundle/{wanted[n]['folder']}" for n in missing]
        say(f"missing parts: {missing}; carry {folders} in the next call (then run unpack again)")
        return False, manifest
    if state.get("complete") == manifest["build_id"]:
        say(f"bundle {manifest['build_id']} complete in {site} (verified earlier)")
        return True, manifest
    t0 = time.time()
    for entry in manifest["chunked"]:
        target = site / entry["path"]
        with target.open("wb") as out:
            for chunk in entry["chunks"]:
                cpath = site / chunk["arcname"]
                if not cpath.exists():
                    raise RunnerError(
                        f"chunk {cpath} is missing although its part is recorded as unpacked; run unpack --clean and carry every part again"
                    )
                with cpath.open("rb") as f:
                    shutil.copyfileobj(f, out, 1 << 20)
        if sha256_file(target) != entry["sha256"]:
            raise RunnerError(
                f"{target}: joined chunks do not match sha256 {entry['sha256'][:16]}; run unpack --clean"
            )
        target.chmod(0o755)
        for chunk in entry["chunks"]:
            (site / chunk["arcname"]).unlink()
        say(f"  joined {entry['path']} from {len(entry['chunks'])} chunks")
    for comp, info in manifest["components"].items():
        digest, count = tree_sha256(site / comp)
        if digest != info["tree_sha256"]:
            raise RunnerError(
                f"{site / comp}: tree sha256 {digest[:16]} over {count} files, the manifest says "
                f"{info['tree_sha256'][:16]} over {info['files']}: stale or extra files; run unpack --clean and carry every part"
            )
    state["complete"] = manifest["build_id"]
    save_state(site, state)
    (site / SITE_MANIFEST).write_text(json.dumps(manifest))
    say(
        f"bundle {manifest['build_id']} complete in {site}: components {sorted(manifest['components'])} verified in {time.time() - t0:.1f} s"
    )
    return True, manifest


# --------------------------------------------------------------------------------------------
# compile caches (optional): FlashInfer's JIT modules, vLLM's torch.compile cache, Triton's cache

CACHE_DIRS = (
    ".cache/flashinfer",
    ".cache/vllm",
    ".triton/cache",
)  # under $HOME, most valuable first
CACHE_FILE = "caches.tar.xz"
CACHE_CHUNK = 15 << 20  # what comes back from the device: at most 8 files of 16 MiB, 64 MiB in all
CACHE_MAX_CHUNKS = 3  # the run's own results.json, summary.md, jobs.log, runner.log take 4 of the 8
CACHE_LIMIT = CACHE_CHUNK * CACHE_MAX_CHUNKS


def save_caches(out: Path) -> str:
    """Pack the compile caches into ``out/caches.tar.xz.NN`` chunks of at most 15 MiB each.

    FlashInfer's JIT modules (minutes of nvcc per release the first time a bf16/fp8 engine starts)
    come first; caches are dropped from the end of ``CACHE_DIRS`` until the archive fits
    ``CACHE_MAX_CHUNKS`` chunks. Carry the chunks back as ``.bundle/caches/`` in a later session's
    first call: ``unpack`` joins and restores them.
    """
    home = Path.home()
    present = [d for d in CACHE_DIRS if (home / d).is_dir()]
    packed = out / CACHE_FILE
    for n in range(len(present), 0, -1):
        with tarfile.open(packed, "w:xz", preset=6) as tf:
            for d in present[:n]:
                tf.add(home / d, arcname=d)
        size = packed.stat().st_size
        if size <= CACHE_LIMIT:
            data = packed.read_bytes()
            packed.unlink()
            names = []
            for i in range(0, len(data), CACHE_CHUNK):
                chunk = out / f"{CACHE_FILE}.{i // CACHE_CHUNK:02d}"
                chunk.write_bytes(data[i : i + CACHE_CHUNK])
                names.append(chunk.name)
            return f"{size / (1 << 20):.1f} MiB of compile caches {present[:n]} in {names}"
    packed.unlink(missing_ok=True)
    return f"compile caches {present} do not fit in {CACHE_LIMIT >> 20} MiB even alone; not saved"


def restore_caches(bundle_dir: Path, state: dict[str, Any]) -> None:
    """Extract carried ``.bundle/caches/caches.tar.xz[.NN]`` into $HOME once per content."""
    folder = bundle_dir / "caches"
    whole = folder / CACHE_FILE
    chunks = sorted(folder.glob(f"{CACHE_FILE}.[0-9][0-9]")) if folder.is_dir() else []
    if not whole.exists() and not chunks:
        return
    data = whole.read_bytes() if whole.exists() else b"".join(c.read_bytes() for c in chunks)
    digest = hashlib.sha256(data).hexdigest()
    if state.get("caches") == digest:
        say(f"compile caches {digest[:16]} already restored")
        return
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as tf:
        members = [
            m
            for m in tf.getmembers()
            if m.name.split("/")[0] in (".cache", ".triton") and ".." not in m.name.split("/")
        ]
        kwargs: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tf.extractall(Path.home(), members=members, **kwargs)
    state["caches"] = digest
    src = whole if whole.exists() else [c.name for c in chunks]
    say(f"restored compile caches from {src} ({len(members)} entries) into {Path.home()}")


# --------------------------------------------------------------------------------------------
# jobs


class Job:
    """One engine (or kernel) subprocess; tasks from several checks are merged into one job."""

    def __init__(
        self,
        kind: str,
        fi: str,
        plugin: bool,
        kv: str = "auto",
        mode: str = "eager",
        tp: int = 1,
        model: str = "tiny",
        impl: str = "",
    ) -> None:
        self.kind = kind  # "engine", "writer", "preflight"
        self.fi = fi
        self.plugin = plugin
        self.kv = kv
        self.mode = mode
        self.tp = tp
        self.model = model  # "tiny" (random weights, --model) or "recall" (--recall-model)
        self.impl = impl  # NVFP4COMPAT_IMPL for this engine ("" = the plan's own choice)
        self.tasks: list[str] = []
        self.checks: list[str] = []
        self.result: dict[str, Any] | None = None

    @property
    def key(self) -> tuple[str, str, bool, str, str, int, str, str]:
        return (self.kind, self.fi, self.plugin, self.kv, self.mode, self.tp, self.model, self.impl)

    @property
    def name(self) -> str:
        if self.kind != "engine":
            return f"{self.kind}-fi{self.fi}" + ("-plugin" if self.plugin else "")
        return (
            f"{self.kv}-{self.mode}-fi{self.fi}"
            + ("-plugin" if self.plugin else "-noplugin")
            + (f"-tp{self.tp}" if self.tp > 1 else "")
            + ("-recall" if self.model == "recall" else "")
            + (f"-impl-{self.impl.replace('=', '-').replace(',', '-')}" if self.impl else "")
        )




def plan_jobs(checks: Sequence[str], fi_default: str, fi_helper: str, tp: int = 2) -> list[Job]:
    jobs: dict[tuple[str, str, bool, str, str, int, str, str], Job] = {}

    def add(
        check: str,
        kind: str,
        fi: str,
        plugin: bool,
        kv: str = "auto",
        mode: str = "eager",
        tasks: Sequence[str] = (),
        tp: int = 1,
        model: str = "tiny",
        impl: str = "",
    ) -> None:
        new = Job(kind, fi, plugin, kv, mode, tp, model, impl)
        job = jobs.setdefault(new.key, new)
        for t in tasks:
            if t not in job.tasks:
                job.tasks.append(t)
        if check not in job.checks:
            job.checks.append(check)

    add("preflight", "preflight", fi_default, True, tasks=["preflight"])
    for c in checks:
        if c == "negative":
            add(c, "engine", fi_default, False, "nvfp4", "eager", ["start"])
        elif c == "plugin":
            for mode in ("eager", "piecewise", "full", "full-decode-optin"):
                add(c, "engine", fi_default, True, "nvfp4", mode, ["start", "generate"])
            # control: the same modes with a bf16 cache, so that a divergence from eager under
            # CUDA graphs can be told apart from the bf16 noise every compiled mode has
            for mode in ("eager", "piecewise"):
                add(c, "engine", fi_default, True, "auto", mode, ["start", "generate"])
        elif c == "capacity":
            add(c, "engine", fi_default, True, "nvfp4", "eager", ["start"])
            add(c, "engine", fi_default, True, "auto", "eager", ["start"])
        elif c == "fidelity":
            for kv in ("auto", "fp8", "nvfp4"):
                add(c, "engine", fi_default, True, kv, "eager", ["start", "logprobs"])
        elif c == "fi015":
            add(c, "engine", fi_helper, True, "nvfp4", "eager", ["start", "generate", "logprobs"])
            add(c, "engine", fi_helper, True, "auto", "eager", ["start", "logprobs"])
            add(c, "writer", fi_helper, True, tasks=["writer"])
        elif c == "throughput":
            for kv in ("nvfp4", "auto"):
                add(c, "engine", fi_default, True, kv, "default", ["start", "throughput"])
            # the same NVFP4 engine with FULL decode graphs over the Triton readers (the plugin's
            # NVFP4COMPAT_CUDAGRAPH_DECODE=1 switch): on 2026-11-29 the default (PIECEWISE, attention
            # eager between graphs) decoded at 0.48x of bf16 with its FULL_AND_PIECEWISE graphs
            add(c, "engine", fi_default, True, "nvfp4", "full-decode-optin", ["start", "throughput"])
        elif c == "writer":
            add(c, "writer", fi_helper, True, tasks=["writer"])
        elif c == "recall":
            # every writer/reader binding the plan can choose on SM90, and the bf16/fp8 references
            for kv in ("nvfp4", "auto", "fp8"):
                add(c, "engine", fi_default, True, kv, "eager", ["start", "recall"], model="recall")
            add(c, "engine", fi_helper, True, "nvfp4", "eager", ["start", "recall"], model="recall")
            # the answer's second token is a decode step: with NVFP4COMPAT_CUDAGRAPH_DECODE=1 the
            # steps that form pure decode batches replay FULL graphs over the Triton readers, so this
            # job's recall also tests FULL capture
            add(
                c, "engine", fi_default, True, "nvfp4", "full-decode-optin", ["start", "recall"],
                model="recall",
            )  # fmt: skip
            # no FlashInfer-reader job: inside vLLM 0.26 the plan binds only the Triton readers (the
            # FA2 NVFP4 read needs vLLM >= 0.32's wrapper planning; the plugin refuses
            # NVFP4COMPAT_IMPL=decode=flashinfer there, seen on the H200 on 2026-11-29). FlashInfer's
            # FA2 read is measured without vLLM in tests/test_gpu_recall.py.
        elif c == "tp":
            for mode in ("eager", "piecewise", "full"):
                add(c, "engine", fi_default, True, "nvfp4", mode, ["start", "generate"], tp=tp)
            add(c, "engine", fi_default, True, "auto", "eager", ["start"], tp=tp)
    # cheap, decisive jobs first: the writer comparison takes seconds; an NVFP4 engine needs no
    # FlashInfer JIT build (the Triton readers), a bf16/fp8 one builds FA2 modules (minutes, cold)
    order = {"preflight": 0, "writer": 1, "engine": 2}
    modes = {"eager": 0, "piecewise": 1, "full": 2, "full-decode-optin": 3, "default": 4}
    kvs = {"nvfp4": 0, "auto": 1, "fp8": 2}
    return sorted(
        jobs.values(),
        # eager engines first within a release: they decide the capacity ratios (checks 3, 7) and are
        # the reference every graph mode is compared with
        key=lambda j: (
            order[j.kind], j.tp, j.plugin, j.fi, j.mode != "eager", kvs.get(j.kv, 3), modes[j.mode]
        ),
    )


def job_env(site: Path, job: Job, extra: dict[str, str]) -> dict[str, str]:
    paths = ([site / "plugin"] if job.plugin else []) + [site / f"fi-{job.fi}", site / "common"]
    for p in paths:
        if not p.is_dir():
            raise RunnerError(
                f"{p} is missing: the bundle lacks this component (built with other --flashinfer versions?)"
            )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    env["VLLM_PLUGINS"] = "nvfp4compat" if job.plugin else ""
    if job.impl:
        env["NVFP4COMPAT_IMPL"] = job.impl
    if job.mode == "full-decode-optin":
        env["NVFP4COMPAT_CUDAGRAPH_DECODE"] = "1"  # the plugin's FULL-decode experiment switch
    # NVLink multicast stays off (the device host's rule: it can take shared GPUs out of service),
    # also in vLLM's compiled TP graphs, whose allreduce+RMSNorm fusion auto-selects FlashInfer's
    # multicast ("mnnvl") all-reduce; engine_job.py turns that fusion off for tensor parallelism
    for k, v in MULTICAST_OFF.items():
        env.setdefault(k, v)
    env["PYTHONUNBUFFERED"] = "1"
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env["VLLM_NO_USAGE_STATS"] = "1"
    env["DO_NOT_TRACK"] = "1"
    env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    bindir = str(Path(sys.executable).parent)
    cuda_home = env.get("CUDA_HOME") or (
        "/usr/local/cuda" if Path("/usr/local/cuda/bin/nvcc").exists() else ""
    )
    path = (
        [bindir]
        + ([f"{cuda_home}/bin"] if cuda_home else [])
        + env.get("PATH", "").split(os.pathsep)
    )
    env["PATH"] = os.pathsep.join(dict.fromkeys(p for p in path if p))
    if cuda_home:
        env["CUDA_HOME"] = cuda_home
    env.update(extra)
    return env


MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "VLLM_FLASHINFER_ALLREDUCE_BACKEND": "trtllm",
}

MEASURES_MEMORY = frozenset({"capacity", "throughput", "tp"})


def kv_reservation(job: Job, spec: dict[str, Any]) -> int | None:
    """``kv_cache_memory_bytes`` for a job under ``--kv-cache-gib``, else None (vLLM profiles).

    A fixed reservation lets runs share one GPU (each engine's memory profiling would otherwise
    count the other runs' allocations); jobs whose checks measure capacity or speed always profile.
    """
    gib = spec.get("kv_cache_gib")
    if not gib or job.kind != "engine" or MEASURES_MEMORY.intersection(job.checks):
        return None
    return int(float(gib) * (1 << 30))


def run_job(
    job: Job,
    spec: dict[str, Any],
    env: dict[str, str],
    workdir: Path,
    timeout: float,
    log_sink: Any,
) -> dict[str, Any]:
    """Run ``engine_job.py`` for one job in its own process group; return its result."""
    spec_path = workdir / f"{job.name}.spec.json"
    result_path = workdir / f"{job.name}.result.json"
    log_path = workdir / f"{job.name}.log"
    result_path.unlink(missing_ok=True)
    spec_path.write_text(
        json.dumps(
            {
                **spec,
                **(
                    {"model": spec["recall_model"], "max_model_len": spec["recall_max_model_len"]}
                    if job.model == "recall"
                    else {}
                ),
                "kind": job.kind,
                "kv_cache_dtype": job.kv,
                "mode": job.mode,
                "tasks": job.tasks,
                "flashinfer": job.fi,
                "plugin": job.plugin,
                "tensor_parallel_size": job.tp,
                "kv_cache_memory_bytes": kv_reservation(job, spec),
                "result": str(result_path),
            }
        )
    )
    say(f"[job {job.name}] start: tasks {job.tasks} for checks {job.checks}")
    t0 = time.time()
    with log_path.open("w") as logf:
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "engine_job.py"), str(spec_path)],
            stdout=logf,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(workdir),
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            rc = -1
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    wall = time.time() - t0
    text = log_path.read_text(errors="replace")
    log_sink.write(
        f"\n===== job {job.name} (rc {rc}, {wall:.1f} s{', TIMED OUT' if timed_out else ''}) =====\n"
    )
    log_sink.write(text)
    log_sink.flush()
    if result_path.exists():
        result = json.loads(result_path.read_text())
    else:
        late = f", timed out after {timeout:.0f} s" if timed_out else ""
        result = {"error": f"no result file (rc {rc}{late}); log tail: " + text[-1500:]}
    result["rc"] = rc
    result["wall_s"] = round(wall, 1)
    result["timed_out"] = timed_out
    result["log_lines"] = scan_log(text)
    status = (
        "ok"
        if not result.get("error") and not timed_out
        else f"ERROR {str(result.get('error'))[:300]}"
    )
    say(f"[job {job.name}] {wall:.1f} s: {status}")
    for line in result["log_lines"]["plugin"][:3]:
        say(f"    plugin: {line}")
    return result


_PID_RE = re.compile(r"\[pid (\d+)\]\s*$")  # the end of the plugin's plan line
# vLLM's per-process log prefix, e.g. "(Worker_TP1 pid=4242)": group 1 the process, group 2 the pid
_PROC_RE = re.compile(r"\(((?:Worker|EngineCore|VllmWorker)[^ )]*)\s+pid=(\d+)\)")


def scan_log(text: str) -> dict[str, Any]:
    """Pick the lines the checks need out of a job's log."""
    lines = text.splitlines()
    pick = lambda *keys: [ln.strip()[-400:] for ln in lines if any(k in ln for k in keys)]  # noqa: E731
    kv_tokens = []
    for ln in lines:
        if "GPU KV cache size:" in ln:
            num = ln.split("GPU KV cache size:")[1].split("tokens")[0].strip().replace(",", "")
            if num.isdigit():
                kv_tokens.append(int(num))
    return {
        "plugin": [ln.strip()[-600:] for ln in lines if "nvfp4compat" in ln.lower()][:20],
        # pids of the plan lines ("... [pid N]") and of vLLM's worker processes ("(Worker_TP1 pid=N)")
        "plugin_pids": sorted(
            {int(m.group(1)) for m in (_PID_RE.search(ln) for ln in lines if "nvfp4compat: vLLM" in ln) if m}
        ),
        "worker_pids": sorted(
            {int(m.group(2)) for ln in lines for m in _PROC_RE.finditer(ln) if "Worker" in m.group(1)}
        ),
        "kv_cache_tokens": kv_tokens,
        "not_supported": pick("kv_cache_dtype not supported"),
        "cudagraph": pick(
            "cudagraph_mode", "CUDAGraphMode", "cudagraph mode", "Capturing CUDA graph"
        )[:20],
        "backend": pick(
            "Using AttentionBackendEnum", "attention backend", "Using FlashInfer", "FLASHINFER"
        )[:10],
        "errors": [
            ln.strip()[-600:]
            for ln in lines
            if ("Error" in ln or "ERROR" in ln) and "Traceback" not in ln
        ][-15:],
        "jit": pick("Loading JIT", "Compiling", "jit")[:10],
    }


# --------------------------------------------------------------------------------------------
# evaluation


def _first(jobs: Iterable[Job], **match: Any) -> Job | None:
    match.setdefault("tp", 1)
    match.setdefault("model", "tiny")
    match.setdefault("impl", "")
    for j in jobs:
        if all(getattr(j, k) == v for k, v in match.items()):
            return j
    return None


def _started(j: Job | None) -> bool:
    return bool(j and j.result and j.result.get("tasks", {}).get("start", {}).get("ok"))


def _task(j: Job | None, name: str) -> dict[str, Any]:
    if not j or not j.result:
        return {}
    return j.result.get("tasks", {}).get(name, {})


def fidelity(base: Job | None, other: Job | None) -> dict[str, Any]:
    """mean/max |logprob diff| of the teacher-forced target tokens, and top-1 agreement."""
    a, b = _task(base, "logprobs"), _task(other, "logprobs")
    if not (a.get("ok") and b.get("ok")):
        return {
            "ok": False,
            "reason": f"logprobs missing: base {a.get('error') or 'ok' if a else 'not run'}, other {b.get('error') or 'ok' if b else 'not run'}",
        }
    diffs: list[float] = []
    agree = total = 0
    for pa, pb in zip(a["prompts"], b["prompts"], strict=True):
        for x, y in zip(pa["target_logprob"], pb["target_logprob"], strict=True):
            diffs.append(abs(x - y))
        for x, y in zip(pa["top1"], pb["top1"], strict=True):
            agree += int(x == y)
            total += 1
    diffs.sort()
    n = len(diffs)
    return {
        "ok": True,
        "positions": n,
        "mean_abs_diff": sum(diffs) / n,
        "p99_abs_diff": diffs[min(n - 1, int(0.99 * n))],
        "max_abs_diff": diffs[-1],
        "top1_agreement": agree / total,
    }


def _plan_line_binding(lines: Sequence[str], op: str) -> str | None:
    """What the plugin's log line binds ``op`` to: ``triton``, ``flashinfer``, ``native`` or, for
    an op left to vLLM's own code, ``vllm(<impl>)`` (the plugin's summary reads ``write=triton``)."""
    import re

    for ln in lines:
        m = re.search(rf"\b{op}=([A-Za-z_]+(?:\([A-Za-z_]+\))?)", ln)
        if m:
            return m.group(1).lower()
    for ln in lines:
        m = re.search(rf"\b{op}\b\W{{0,3}}(triton|flashinfer|native)", ln, re.IGNORECASE)
        if m:
            return m.group(1).lower()
    return None


def _plan_bindings(lines: Sequence[str]) -> dict[str, str | None]:
    """``{op: binding}`` for write/decode/prefill from the plugin's plan line."""
    return {op: _plan_line_binding(lines, op) for op in ("write", "decode", "prefill")}


def _process_tags(lines: Sequence[str]) -> list[str]:
    """vLLM's per-process log prefixes, e.g. ``(Worker_TP1 pid=4242)``, found in ``lines``."""
    return sorted({m.group(0) for ln in lines for m in _PROC_RE.finditer(ln)})


NEAR_TIE = 0.1  # nats: a greedy divergence where eager's top-2 margin is below this is a near-tie


def divergence(base: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Where two greedy generations of the same prompts part, and whether it looks like noise.

    ``base``/``other`` are ``generate`` task results (``token_ids`` and, from engines run with
    ``logprobs``, ``top_logprobs``: per prompt, per step, the top-2 ``(token, logprob)`` pairs).
    Per prompt: the first differing step, ``base``'s top-1/top-2 margin there (a near-tie when
    small: the two runs then differ by rounding, not by what attention read), and the largest
    absolute difference of the chosen token's logprob over the steps before it.
    """
    first: list[int | None] = []
    margins: list[float] = []
    pre_diff = 0.0
    have_lp = bool(base.get("top_logprobs")) and bool(other.get("top_logprobs"))
    for p, (x, y) in enumerate(zip(other["token_ids"], base["token_ids"], strict=True)):
        i = next((k for k, (a, b) in enumerate(zip(x, y, strict=False)) if a != b), None)
        first.append(i)
        if not have_lp:
            continue
        bt, ot = base["top_logprobs"][p], other["top_logprobs"][p]
        stop = len(x) if i is None else i
        for k in range(min(stop, len(bt), len(ot))):
            pre_diff = max(pre_diff, abs(bt[k][0][1] - ot[k][0][1]))
        if i is not None and i < len(bt) and len(bt[i]) > 1:
            margins.append(round(bt[i][0][1] - bt[i][1][1], 6))
    same = [i is None for i in first]
    out: dict[str, Any] = {
        "prompts_matching": f"{sum(same)}/{len(same)}",
        "first_divergence": first,
        "matches": all(same),
    }
    if have_lp:
        out["base_margin_at_divergence"] = margins
        out["max_logprob_diff_before_divergence"] = round(pre_diff, 6)
    return out


def evaluate(
    checks: Sequence[str],
    jobs: list[Job],
    fi_default: str,
    fi_helper: str,
    tp: int = 2,
    recall_beyond: Sequence[int] = (),
) -> dict[str, Any]:
    """Each check's verdict from its jobs' results.

    ``recall_beyond``: recall lengths past the trained range (measured and reported, outside the
    1-point verdict: issue 7 asks for them only "if the model extrapolates").
    """
    out: dict[str, Any] = {}
    E = lambda **m: _first(jobs, kind="engine", **m)  # noqa: E731
    for c in checks:
        r: dict[str, Any] = {"check": CHECK_IDS[c], "name": c}
        if c == "negative":
            j = E(fi=fi_default, plugin=False, kv="nvfp4", mode="eager")
            st = _task(j, "start")
            lines = (j.result or {}).get("log_lines", {}).get("not_supported", []) if j else []
            found = any(
                "kv_cache_dtype not supported" in s for s in lines
            ) or "kv_cache_dtype not supported" in str(st.get("error", ""))
            r.update(
                passed=bool(j and not st.get("ok") and found),
                engine_started=bool(st.get("ok")),
                error=str(st.get("error", ""))[-600:],
                matching_lines=lines[:5],
            )
        elif c in ("plugin", "fi015"):
            fi = fi_default if c == "plugin" else fi_helper
            modes = (
                ("eager", "piecewise", "full", "full-decode-optin") if c == "plugin" else ("eager",)
            )
            eager = E(fi=fi, plugin=True, kv="nvfp4", mode="eager")
            base_tokens = _task(eager, "generate").get("token_ids")
            r["modes"] = {}
            for mode in modes:
                j = E(fi=fi, plugin=True, kv="nvfp4", mode=mode)
                g = _task(j, "generate")
                entry = {
                    "started": _started(j),
                    "generated": bool(g.get("ok")),
                    "error": (str(_task(j, "start").get("error") or g.get("error") or ""))[-500:],
                    "cudagraph_log": (j.result or {}).get("log_lines", {}).get("cudagraph", [])[:6]
                    if j
                    else [],
                }
                if g.get("ok") and base_tokens is not None:
                    d = divergence(_task(eager, "generate"), g)
                    entry["prompts_matching_eager"] = d.pop("prompts_matching")
                    entry["matches_eager"] = d.pop("matches")
                    entry.update(d)  # first_divergence (None: same), margins, logprob diffs
                r["modes"][mode] = entry
            if c == "plugin":
                # bf16 control: how far the same compiled mode moves a bf16-cache engine from eager
                ce, cp = (
                    _task(E(fi=fi, plugin=True, kv="auto", mode=m), "generate")
                    for m in ("eager", "piecewise")
                )
                ctl = divergence(ce, cp) if ce.get("ok") and cp.get("ok") else None
                r["bf16_control_piecewise_vs_eager"] = ctl
                tol_diff = tol_margin = NEAR_TIE
                if ctl and "max_logprob_diff_before_divergence" in ctl:
                    tol_diff = max(tol_diff, 2 * ctl["max_logprob_diff_before_divergence"])
                    tol_margin = max(
                        [tol_margin, *(2 * m for m in ctl["base_margin_at_divergence"])]
                    )
                rule = (
                    f"consistent = chosen-token logprobs before the first divergence within "
                    f"{tol_diff:.3f} nats of eager and every divergence at an eager top-2 margin "
                    f"<= {tol_margin:.3f} (max of {NEAR_TIE} and twice the bf16 control's)"
                )
                for pw in (
                    r["modes"].get(m, {}) for m in ("piecewise", "full", "full-decode-optin")
                ):
                    if not (pw.get("generated") and "max_logprob_diff_before_divergence" in pw):
                        continue
                    pw["consistent_with_eager"] = bool(
                        pw["max_logprob_diff_before_divergence"] <= tol_diff
                        and all(m <= tol_margin for m in pw["base_margin_at_divergence"])
                    )
                    pw["rule"] = rule
            lines = (eager.result or {}).get("log_lines", {}).get("plugin", []) if eager else []
            r["plugin_log"] = lines[:6]
            r["write_binding"] = _plan_line_binding(lines, "write")
            expect = "triton" if fi == "0.6.14" else "flashinfer"
            r["expected_write_binding"] = expect
            r["passed"] = bool(
                r["modes"]["eager"]["generated"] and lines and r["write_binding"] == expect
            )
            if c == "fi015":
                r["fidelity_nvfp4_vs_bf16"] = fidelity(
                    E(fi=fi, plugin=True, kv="auto", mode="eager"), eager
                )
                r["fidelity_vs_fi_default_nvfp4"] = (
                    fidelity(E(fi=fi_default, plugin=True, kv="nvfp4", mode="eager"), eager)
                    if E(fi=fi_default, plugin=True, kv="nvfp4", mode="eager")
                    else {"ok": False, "reason": "check 4 not in this run"}
                )
                w = _first(jobs, kind="writer")
                wt = _task(w, "writer")
                r["writer_bytes"] = wt
                r["passed"] = r["passed"] and bool(wt.get("ok") and wt.get("identical"))
        elif c == "capacity":
            n, b = (
                E(fi=fi_default, plugin=True, kv="nvfp4", mode="eager"),
                E(fi=fi_default, plugin=True, kv="auto", mode="eager"),
            )
            tn, tb = (
                _task(n, "start").get("kv_cache_tokens"),
                _task(b, "start").get("kv_cache_tokens"),
            )
            r.update(
                nvfp4_tokens=tn,
                bf16_tokens=tb,
                nvfp4_log=(n.result or {}).get("log_lines", {}).get("kv_cache_tokens")
                if n
                else None,
                bf16_log=(b.result or {}).get("log_lines", {}).get("kv_cache_tokens")
                if b
                else None,
            )
            r["ratio"] = (tn / tb) if tn and tb else None
            r["passed"] = bool(r["ratio"] and r["ratio"] >= 3.3)
        elif c == "fidelity":
            base = E(fi=fi_default, plugin=True, kv="auto", mode="eager")
            r["nvfp4_vs_bf16"] = fidelity(
                base, E(fi=fi_default, plugin=True, kv="nvfp4", mode="eager")
            )
            r["fp8_vs_bf16"] = fidelity(base, E(fi=fi_default, plugin=True, kv="fp8", mode="eager"))
            r["passed"] = bool(r["nvfp4_vs_bf16"].get("ok") and r["fp8_vs_bf16"].get("ok"))
            r["note"] = (
                "no numeric threshold in issue 6: numbers are reported; passed = both measured"
            )
        elif c == "throughput":
            n, b = (
                E(fi=fi_default, plugin=True, kv="nvfp4", mode="default"),
                E(fi=fi_default, plugin=True, kv="auto", mode="default"),
            )
            r["nvfp4"], r["bf16"] = _task(n, "throughput"), _task(b, "throughput")
            dn, db = r["nvfp4"].get("decode_tok_s"), r["bf16"].get("decode_tok_s")
            r["ratio_nvfp4_over_bf16"] = dn / db if dn and db else None
            o = E(fi=fi_default, plugin=True, kv="nvfp4", mode="full-decode-optin")
            if o is not None:
                r["nvfp4_full_decode_optin"] = _task(o, "throughput")
                do = r["nvfp4_full_decode_optin"].get("decode_tok_s")
                r["ratio_nvfp4_full_decode_optin_over_bf16"] = do / db if do and db else None
            r["passed"] = bool(dn and db)
            r["note"] = "no numeric threshold in issue 6: passed = both measured"
        elif c == "writer":
            w = _first(jobs, kind="writer")
            r["writer_bytes"] = _task(w, "writer")
            r["passed"] = bool(r["writer_bytes"].get("ok") and r["writer_bytes"].get("identical"))
        elif c == "recall":
            base = _task(
                E(fi=fi_default, plugin=True, kv="auto", mode="eager", model="recall"), "recall"
            )
            r["bf16"] = base.get("recall")
            r["table"] = {}
            gaps_all: list[float] = []
            beyond = {str(L) for L in recall_beyond}
            for j in jobs:
                if j.kind != "engine" or j.model != "recall":
                    continue
                t = _task(j, "recall")
                entry: dict[str, Any] = {
                    "kv": j.kv,
                    "flashinfer": j.fi,
                    "impl": j.impl or "plan",
                    "bindings": _plan_bindings(
                        (j.result or {}).get("log_lines", {}).get("plugin", [])
                    ),
                    "recall": t.get("recall"),
                    "table": t.get("table"),
                    "error": None
                    if t.get("ok")
                    else str(t.get("error") or _task(j, "start").get("error"))[-400:],
                }
                if t.get("ok") and base.get("ok") and j.kv in ("nvfp4", "fp8"):
                    gaps = {
                        L: round(100 * (base["recall"][L] - t["recall"][L]), 2)
                        for L in base["recall"]
                        if L in t["recall"]
                    }
                    entry["points_below_bf16"] = {L: g for L, g in gaps.items() if L not in beyond}
                    if beyond & gaps.keys():
                        entry["points_below_bf16_beyond_training"] = {
                            L: g for L, g in gaps.items() if L in beyond
                        }
                    if j.kv == "nvfp4":
                        gaps_all.extend(entry["points_below_bf16"].values())
                r["table"][j.name] = entry
            nv = [e for e in r["table"].values() if e["kv"] == "nvfp4"]
            worst = max(gaps_all) if gaps_all else None
            r["worst_points_below_bf16"] = worst
            # a reference (fp8) or binding job that failed leaves the table incomplete: not a pass
            r["jobs_failed"] = sorted(n for n, e in r["table"].items() if e["error"] is not None)
            r["passed"] = bool(
                base.get("ok")
                and not r["jobs_failed"]
                and nv
                and all("points_below_bf16" in e for e in nv)
                and worst is not None
                and worst <= 1.0
            )
            r["note"] = (
                "target (issue 7): NVFP4 exact-match recall within 1 point of bf16 at every trained length, "
                "every binding"
                + (
                    f"; {sorted(recall_beyond)} reported, outside the verdict (past the trained 8192)"
                    if recall_beyond
                    else ""
                )
            )
        elif c == "tp":
            r["tensor_parallel_size"] = tp
            eager = E(fi=fi_default, plugin=True, kv="nvfp4", mode="eager", tp=tp)
            base_tokens = _task(eager, "generate").get("token_ids")
            r["modes"] = {}
            for mode in ("eager", "piecewise", "full"):
                j = E(fi=fi_default, plugin=True, kv="nvfp4", mode=mode, tp=tp)
                g = _task(j, "generate")
                entry = {
                    "started": _started(j),
                    "generated": bool(g.get("ok")),
                    "error": (str(_task(j, "start").get("error") or g.get("error") or ""))[-500:],
                }
                if g.get("ok") and base_tokens is not None:
                    entry["matches_eager"] = g["token_ids"] == base_tokens
                r["modes"][mode] = entry
            logs = (eager.result or {}).get("log_lines", {}) if eager else {}
            lines = logs.get("plugin", [])
            tags = _process_tags(lines)
            r["plugin_log"] = lines[:8]
            r["plugin_processes"] = tags
            # a worker counts when a plan line carries its pid (it logs before vLLM prefixes its
            # lines) or carries its "(Worker... pid=N)" prefix
            worker_pids = set(logs.get("worker_pids", []))
            workers = sorted(
                {f"pid {p}" for p in set(logs.get("plugin_pids", [])) & worker_pids}
                | {t for t in tags if "Worker" in t}
            )
            r["plugin_workers"] = workers
            bf = E(fi=fi_default, plugin=True, kv="auto", mode="eager", tp=tp)
            tn, tb = (
                _task(eager, "start").get("kv_cache_tokens"),
                _task(bf, "start").get("kv_cache_tokens"),
            )
            r.update(nvfp4_tokens=tn, bf16_tokens=tb, ratio=(tn / tb) if tn and tb else None)
            r["passed"] = bool(
                r["modes"]["eager"]["generated"]
                and len(workers) >= tp
                and r["ratio"]
                and r["ratio"] >= 3.3
            )
            r["note"] = (
                "passed = eager generates, the plugin logged from >= tp worker processes, capacity ratio >= 3.3"
            )
        out[c] = r
    return out


def summary_md(
    results: dict[str, Any],
    preflight: dict[str, Any],
    jobs: list[Job],
    argv: Sequence[str],
    wall: float,
) -> str:
    lines = [
        "# nvfp4compat on-device run",
        "",
        f"command: `{' '.join(argv)}`  ",
        f"wall time: {wall:.0f} s",
        "",
    ]
    pf = preflight.get("tasks", {}).get("preflight", {})
    if pf:
        lines += [
            "## Environment",
            "",
            "```",
            json.dumps(
                {
                    k: pf.get(k)
                    for k in (
                        "python",
                        "torch",
                        "cuda",
                        "gpu",
                        "capability",
                        "triton",
                        "vllm",
                        "flashinfer",
                        "nvfp4compat",
                        "nvcc",
                    )
                },
                indent=1,
            ),
            "```",
            "",
        ]
    lines += ["## Jobs", "", "| job | checks | wall s | result |", "|---|---|---|---|"]
    for j in jobs:
        res = j.result or {}
        err = res.get("error") or next(
            (t.get("error") for t in res.get("tasks", {}).values() if t.get("error")), ""
        )
        lines.append(
            f"| {j.name} | {','.join(j.checks)} | {res.get('wall_s', '')} | {'ok' if not err else 'error: ' + str(err)[:160].replace('|', '/')} |"
        )
    lines += ["", "## Checks", ""]
    for c, r in results.items():
        lines.append(f"### {r['check']} {c}: {'PASS' if r.get('passed') else 'FAIL'}")
        lines += [
            "",
            "```",
            json.dumps(
                {k: v for k, v in r.items() if k not in ("check", "name")}, indent=1, default=str
            )[:6000],
            "```",
            "",
        ]
    return "\n".join(lines)


def cmd_run(args: argparse.Namespace) -> int:
    t_run = time.time()
    wanted = []
    for tok in args.checks.split(","):
        tok = tok.strip()
        if not tok:
            continue
        name = CHECKS.get(tok) or (tok if tok in CHECK_IDS else None)
        if not name:
            print(
                f"unknown check {tok!r}; known: {', '.join(f'{k}={v}' for k, v in CHECKS.items())}",
                file=sys.stderr,
            )
            return 2
        if name not in wanted:
            wanted.append(name)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    tee = (out / "runner.log").open("a")
    orig_say = globals()["say"]

    def tee_say(msg: str) -> None:
        orig_say(msg)
        tee.write(msg + "\n")
        tee.flush()

    globals()["say"] = tee_say
    try:
        if args.dry_run:
            manifest = find_manifest(args.bundle_dir, args.manifest, args.site)[1]
        else:
            complete, manifest = unpack(args.bundle_dir, args.site, args.manifest)
            if not complete:
                return 3
        fi_default = args.flashinfer or manifest.get("flashinfer_default", "0.6.14")
        fi_helper = args.flashinfer_helper
        jobs = plan_jobs(wanted, fi_default, fi_helper, args.tp)
        spec = {
            "model": str(args.model),
            "gpu_memory_utilization": args.gpu_mem,
            "max_model_len": args.max_model_len,
            "max_cudagraph_capture_size": 64,
            "logprob_prompts": args.logprob_prompts,
            "logprob_prompt_len": args.logprob_prompt_len,
            "throughput_requests": 32,
            "throughput_context": args.throughput_context,
            "throughput_new_tokens": args.throughput_new_tokens,
            "seed": 0,
            "recall_model": str(args.recall_model),
            "recall_lengths": [
                int(x)
                for x in f"{args.recall_lengths},{args.recall_beyond}".split(",")
                if x.strip()
            ],
            "recall_beyond": [int(x) for x in args.recall_beyond.split(",") if x.strip()],
            "recall_per_depth": args.recall_per_depth,
            "kv_cache_gib": args.kv_cache_gib,
        }
        spec["recall_max_model_len"] = max(args.max_model_len, max(spec["recall_lengths"]) + 64)
        if (
            "recall" in wanted
            and not args.dry_run
            and not (args.recall_model / "model.safetensors").exists()
        ):
            raise RunnerError(
                f"--recall-model {args.recall_model} has no model.safetensors: train it first "
                "(scripts/train_recall_model.py, docs/recall.md) or point --recall-model at one"
            )
        extra_env = dict(kv.split("=", 1) for kv in args.env)
        say(
            f"checks {wanted}: {len(jobs)} jobs (FlashInfer {fi_default}; helper-path checks on {fi_helper})"
        )
        for j in jobs:
            say(f"  job {j.name}: tasks {j.tasks} (checks {j.checks})")
        if args.dry_run:
            return 0
        if not (args.model / "config.json").exists():
            t0 = time.time()
            env = job_env(args.site, Job("model", fi_default, False), {})
            proc = subprocess.run(
                [
                    sys.executable,
                    str(REPO / "scripts" / "make_tiny_model.py"),
                    "--out",
                    str(args.model),
                ],
                env=env,
                capture_output=True,
                text=True,
            )
            say(proc.stdout[-1500:] + proc.stderr[-1500:])
            if proc.returncode != 0:
                raise RunnerError(f"make_tiny_model.py failed (rc {proc.returncode}); see above")
            say(f"tiny model made in {args.model} in {time.time() - t0:.1f} s")
        work = args.work or args.site.parent / "nvfp4-jobs"
        work.mkdir(parents=True, exist_ok=True)
        if "recall" in wanted and not args.dry_run:
            # Jobs run with their own working directories and may outlive the device call that started
            # them, while every later call re-copies the checkout (seen on 2026-12-02: a relative path
            # made vLLM look up a hub repo id; a background job lost tokenizer.json mid-run when the next
            # call re-synced tests/data). Serve a private copy under the work folder.
            snap = work / "recall-model"
            shutil.copytree(args.recall_model.resolve(), snap, dirs_exist_ok=True)
            spec["recall_model"] = str(snap)
            say(f"recall model {args.recall_model} served from {snap}")
        results_path = out / "results.json"
        checks_only = [c for c in wanted if c != "preflight"]

        def write_outputs(final: bool) -> dict[str, Any]:
            results = evaluate(
                checks_only, jobs, fi_default, fi_helper, args.tp, spec["recall_beyond"]
            )
            pre = next((j.result for j in jobs if j.kind == "preflight"), None) or {}
            wall = time.time() - t_run
            doc = {
                "argv": sys.argv,
                "complete": final,
                "bundle": {
                    "build_id": manifest["build_id"],
                    "built_at": manifest["built_at"],
                    "plugin": manifest.get("plugin"),
                },
                "wall_s": round(wall, 1),
                "checks": results,
                "jobs": {j.name: j.result for j in jobs if j.result is not None},
            }
            results_path.write_text(json.dumps(doc, indent=1, default=str))
            md = summary_md(results, pre, [j for j in jobs if j.result is not None], sys.argv, wall)
            if not final:
                md = md.replace(
                    "# nvfp4compat on-device run",
                    f"# nvfp4compat on-device run (PARTIAL: {sum(j.result is not None for j in jobs)} of {len(jobs)} jobs)",
                    1,
                )
            (out / "summary.md").write_text(md)
            return results

        with (out / "jobs.log").open("w") as sink:
            for j in jobs:
                left = args.budget_s - (time.time() - t_run)
                if left < 30:
                    j.result = {
                        "error": f"skipped: the run's budget of {args.budget_s:.0f} s is spent (run this check in another call)",
                        "skipped": True,
                        "tasks": {},
                        "log_lines": scan_log(""),
                    }
                    say(f"[job {j.name}] skipped: budget spent")
                else:
                    env = job_env(args.site, j, extra_env)
                    j.result = run_job(j, spec, env, work, min(args.job_timeout, left), sink)
                write_outputs(final=False)
        results = write_outputs(final=True)
        wall = time.time() - t_run
        log_path = out / "jobs.log"
        if log_path.stat().st_size > 15 << 20:
            data = log_path.read_bytes()
            log_path.write_bytes(b"[truncated to the last 15 MiB]\n" + data[-(15 << 20) :])
        if args.save_caches:
            say(save_caches(out))
        say("")
        for c, r in results.items():
            say(f"check {r['check']} {c}: {'PASS' if r.get('passed') else 'FAIL'}")
        say(f"total {wall:.0f} s; results in {out}/results.json, summary.md, jobs.log")
        return 0 if all(r.get("passed") for r in results.values()) else 1
    finally:
        globals()["say"] = orig_say
        tee.close()


def cmd_unpack(args: argparse.Namespace) -> int:
    complete, _ = unpack(args.bundle_dir, args.site, args.manifest, args.clean)
    return 0 if complete or args.partial_ok else 3


def cmd_status(args: argparse.Namespace) -> int:
    _, manifest = find_manifest(args.bundle_dir, args.manifest, args.site)
    state = load_state(args.site)
    for p in manifest["parts"]:
        have = state["parts"].get(p["name"]) == p["sha256"]
        say(
            f"{p['name']}: {'unpacked' if have else 'missing'} ({p['bytes'] / (1 << 20):.1f} MiB, .bundle/{p['folder']})"
        )
    say(f"complete: {state.get('complete') == manifest['build_id']}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--bundle-dir",
        type=Path,
        default=REPO / ".bundle",
        help="where the carried part folders pNN/ are (default: <repo>/.bundle)",
    )
    common.add_argument(
        "--site",
        type=Path,
        default=Path("/tmp/site"),
        help="where the bundle is unpacked (default: /tmp/site)",
    )
    common.add_argument(
        "--manifest",
        type=Path,
        default=None,
        help="follow this manifest instead of the newest carried one",
    )
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("unpack", parents=[common], help="verify and extract the carried parts")
    u.add_argument("--clean", action="store_true", help="remove --site first")
    u.add_argument(
        "--partial-ok",
        action="store_true",
        help="exit 0 although parts are still missing (a first call)",
    )
    sub.add_parser("status", parents=[common], help="what is unpacked, what is missing")
    r = sub.add_parser("run", parents=[common], help="unpack, then run the selected checks")
    r.add_argument(
        "--checks", required=True, help="comma list of 1..6, writer, preflight (or their names)"
    )
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/nvfp4-out")))
    r.add_argument("--model", type=Path, default=Path("/tmp/tiny-qwen3"))
    r.add_argument(
        "--recall-model",
        type=Path,
        default=REPO / "tests" / "data" / "recall-model",
        help="the trained recall model the 'recall' check serves (default: tests/data/recall-model)",
    )
    r.add_argument(
        "--recall-lengths",
        default="2048,4096,8192",
        help="context lengths of the 'recall' check (comma-separated; default 2048,4096,8192)",
    )
    r.add_argument(
        "--recall-beyond",
        default="16384",
        help="recall lengths past the model's trained 8192, measured and reported outside the verdict "
        "(comma-separated; default 16384, where the shipped model's dense bf16 recall is 90%%; '' for none)",
    )
    r.add_argument(
        "--recall-per-depth",
        type=int,
        default=10,
        help="needles per depth (10 depths) and length in the 'recall' check (default 10: 100 per "
        "length, so that one miss is exactly the 1-point target)",
    )
    r.add_argument(
        "--flashinfer",
        default=None,
        help="FlashInfer release for checks 1-4 and 6 (default: the manifest's, vLLM's pin 0.6.14)",
    )
    r.add_argument(
        "--flashinfer-helper",
        default="0.6.15",
        help="release with the slot-mapping writer, for check 5 and writer",
    )
    r.add_argument(
        "--gpu-mem", type=float, default=0.30, help="gpu_memory_utilization of every engine"
    )
    r.add_argument("--max-model-len", type=int, default=8192 + 512)
    r.add_argument("--logprob-prompts", type=int, default=8)
    r.add_argument("--logprob-prompt-len", type=int, default=2048)
    r.add_argument("--throughput-context", type=int, default=8192)
    r.add_argument("--throughput-new-tokens", type=int, default=256)
    r.add_argument("--job-timeout", type=float, default=420.0, help="seconds one job may take")
    r.add_argument(
        "--budget-s",
        type=float,
        default=560.0,
        help="start no job after this many seconds of the run (the device allows 600 s a command); skipped jobs are reported",
    )
    r.add_argument("--tp", type=int, default=2, help="tensor_parallel_size for check 7")
    r.add_argument(
        "--env",
        action="append",
        default=[],
        help="KEY=VALUE for every job (e.g. NVFP4COMPAT_IMPL=write=triton)",
    )
    r.add_argument(
        "--kv-cache-gib",
        type=float,
        default=None,
        help="reserve this many GiB of KV cache (kv_cache_memory_bytes) in engines whose checks do not "
        "measure memory or speed, so that several runs can share the GPU side by side",
    )
    r.add_argument(
        "--work",
        type=Path,
        default=None,
        help="folder for the jobs' specs, logs and results (default: <site>/../nvfp4-jobs; give each "
        "side-by-side run its own)",
    )
    r.add_argument("--dry-run", action="store_true", help="plan the jobs, run nothing")
    r.add_argument(
        "--save-caches",
        action="store_true",
        help=f"pack FlashInfer's JIT, vLLM's and Triton's compile caches into OUT/{CACHE_FILE}.NN (15 MiB chunks, <= {CACHE_MAX_CHUNKS}); "
        f"carry them back later in .bundle/caches/ and unpack restores them",
    )
    args = ap.parse_args(argv)
    try:
        return {"unpack": cmd_unpack, "status": cmd_status, "run": cmd_run}[args.cmd](args)
    except RunnerError as exc:
        print(f"run_on_device.py: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
