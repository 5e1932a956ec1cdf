#!/usr/bin/env python3
"""Unpack an offline bundle (``build.py``) on a GPU host without internet access, and run
``nvfp4compat validate``'s checks from it.

Standard library only until the checks start. Four subcommands:

``unpack``
    For every part folder present so far (``.bundle/pNN/``), verify the part's sha256 against the
    newest ``manifest.json`` found there and extract it into ``--site``. Parts already extracted
    with the same sha256 are skipped, so parts can arrive over several transfers. When every part
    is in, join chunked files and check each component's tree sha256. Exit 0 when complete, 3
    while parts are missing (the message names them).
``status``
    What is unpacked, what is missing.
``run --checks plan,negative,...``
    ``unpack``, the tiny model (``scripts/make_tiny_model.py``, made once) unless ``--model`` names
    another, then the checks, run by ``nvfp4compat.validation`` from the unpacked plugin wheel.
    The only bundle knowledge here is where the components are: each job's ``PYTHONPATH`` is the
    plugin (unless the job runs without it), the ``--flashinfer`` release's folder and the
    shared dependencies. The checks, their verdicts and the report (``summary.md``,
    ``results.json``, ``jobs.log``) are the package's; ``docs/validation.md`` has the checks.

``caches save --name NAME`` / ``caches restore``
    Pack FlashInfer's JIT modules and vLLM's and Triton's compile caches under $HOME into
    ``$OUT/NAME.tar.xz.NN`` (``run --save-caches`` does it after the checks, as ``caches``); restore every
    archive carried in ``.bundle/caches/`` (``unpack`` restores them too), so a fresh host skips the
    builds an earlier one did (FlashInfer: minutes of nvcc per module, also for the benchmarks' release).

``--plugin-from-checkout`` (``unpack``, ``run``): once the bundle is complete, the checkout's
``nvfp4compat/`` and ``matrix/`` replace the plugin wheel's code (the working tree, tested without
rebuilding the bundle).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
STATE_FILE = ".bundle-state.json"

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
            f"no manifest.json under {bundle_dir}/p*/: bring the part folders (e.g. .bundle/p01/) "
            "built by `python tools/gpu_bundle/build.py build`"
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
# defaults of --cache-chunk-mib / --cache-max-chunks: size them to what the transport brings back
CACHE_CHUNK = 15 << 20
CACHE_MAX_CHUNKS = 3
CACHE_LIMIT = CACHE_CHUNK * CACHE_MAX_CHUNKS


# a cache whose files pass this many times the archive limit is not packed at all: compiled modules shrink about
# 4.5x under xz (run S: 44 MiB of FlashInfer modules in 9.4 MiB), and packing the 1.4 GiB Triton cache that a GPU
# test run leaves took longer than the call had left
CACHE_RAW_FACTOR = 8


def _tree_bytes(root: Path) -> int:
    """The size of the files under ``root``."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def save_caches(out: Path, name: str = "caches") -> str:
    """Pack the compile caches into ``out/<name>.tar.xz.NN`` chunks of at most ``CACHE_CHUNK`` bytes.

    The caches of ``CACHE_DIRS`` are taken in order, most valuable first (FlashInfer's JIT modules: minutes
    of nvcc per release the first time a bf16/fp8 engine starts): each joins the archive when the archive
    still fits ``CACHE_MAX_CHUNKS`` chunks with it, and one whose files pass ``CACHE_RAW_FACTOR`` times that
    limit is left out without packing. The archive is built in a temporary folder, so a save stopped part
    way leaves nothing in ``out``. Bring the chunks back as ``.bundle/caches/`` to a later host: ``unpack``
    (and ``caches restore``) joins and restores them; archives of other names beside them are restored too.
    """
    if not name or not all(c.isalnum() or c in "-_" for c in name):
        raise RunnerError(f"cache archive name {name!r}: need letters, digits, '-' or '_' (the transport's file names)")
    home = Path.home()
    present = [d for d in CACHE_DIRS if (home / d).is_dir()]
    if not present:
        return f"no compile caches under {home} ({list(CACHE_DIRS)}); nothing saved"
    chosen: list[str] = []
    left_out: list[str] = []
    data = b""
    with tempfile.TemporaryDirectory(prefix="nvfp4compat-caches-") as tmp:
        packed = Path(tmp) / f"{name}.tar.xz"
        for d in present:
            raw = _tree_bytes(home / d)
            if raw > CACHE_RAW_FACTOR * CACHE_LIMIT:
                left_out.append(f"{d} ({raw / (1 << 20):.0f} MiB of files)")
                continue
            _pack_xz(home, [*chosen, d], packed)
            size = packed.stat().st_size
            if size <= CACHE_LIMIT:
                chosen.append(d)
                data = packed.read_bytes()
            else:
                left_out.append(f"{d} (the archive would be {size / (1 << 20):.1f} MiB)")
    skipped = f"; left out: {', '.join(left_out)}" if left_out else ""
    if not chosen:
        return f"compile caches {present} do not fit in {CACHE_LIMIT >> 20} MiB even alone; not saved{skipped}"
    names = []
    for i in range(0, len(data), CACHE_CHUNK):
        chunk = out / f"{name}.tar.xz.{i // CACHE_CHUNK:02d}"
        chunk.write_bytes(data[i : i + CACHE_CHUNK])
        names.append(chunk.name)
    return f"{len(data) / (1 << 20):.1f} MiB of compile caches {chosen} in {names}{skipped}"


def _pack_xz(root: Path, dirs: Sequence[str], packed: Path) -> None:
    """``tar`` of ``dirs`` (relative to ``root``) into ``packed``, xz-compressed on every core where the ``tar`` and
    ``xz`` programs exist (a FlashInfer JIT cache is hundreds of MB of objects: one core takes minutes), else by
    Python's ``tarfile`` on one."""
    tar, xz = shutil.which("tar"), shutil.which("xz")
    if tar and xz:
        with packed.open("wb") as f:
            t = subprocess.Popen([tar, "-C", str(root), "-cf", "-", *dirs], stdout=subprocess.PIPE)
            assert t.stdout is not None
            z = subprocess.run([xz, "-T0", "-6", "-c"], stdin=t.stdout, stdout=f)
            t.stdout.close()
            # GNU tar exits 1 when a file changed while it was read (a cache still being written): the archive
            # holds the rest, and a cache entry is only ever used whole
            if t.wait() not in (0, 1) or z.returncode != 0:
                raise RunnerError(
                    f"packing {list(dirs)} under {root} into {packed}: tar exit {t.returncode}, xz exit "
                    f"{z.returncode}; is the disk full? (the caches are optional: run without saving them)"
                )
        return
    with tarfile.open(packed, "w:xz", preset=6) as tf:
        for d in dirs:
            tf.add(root / d, arcname=d)


def _cache_archives(folder: Path) -> dict[str, list[Path]]:
    """The archives in ``folder``: ``<name>.tar.xz`` whole, or its chunks ``<name>.tar.xz.NN`` in order."""
    found: dict[str, list[Path]] = {}
    if not folder.is_dir():
        return found
    for p in sorted(folder.iterdir()):
        stem, dot, num = p.name.rpartition(".")
        if p.name.endswith(".tar.xz"):
            found.setdefault(p.name, []).insert(0, p)
        elif dot and stem.endswith(".tar.xz") and len(num) == 2 and num.isdigit():
            found.setdefault(stem, []).append(p)
    for arc, paths in found.items():
        if paths[0].name == arc:  # a whole archive wins over stray chunks of the same name
            found[arc] = paths[:1]
    return found


def restore_caches(bundle_dir: Path, state: dict[str, Any]) -> None:
    """Extract each carried ``.bundle/caches/<name>.tar.xz[.NN]`` into $HOME once per content."""
    done = state.setdefault("cache_archives", {})
    for arc, paths in _cache_archives(bundle_dir / "caches").items():
        data = b"".join(p.read_bytes() for p in paths)
        digest = hashlib.sha256(data).hexdigest()
        if done.get(arc) == digest:
            say(f"compile caches {arc} ({digest[:16]}) already restored")
            continue
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as tf:
                members = [
                    m
                    for m in tf.getmembers()
                    if m.name.split("/")[0] in (".cache", ".triton") and ".." not in m.name.split("/")
                ]
                kwargs: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
                tf.extractall(Path.home(), members=members, **kwargs)
        except (tarfile.TarError, EOFError, lzma.LZMAError) as exc:
            raise RunnerError(
                f"compile caches {[p.name for p in paths]}: {type(exc).__name__}: {exc}; a chunk is missing or "
                f"truncated: carry every {arc}.NN that came back, or remove them from {bundle_dir / 'caches'}"
            ) from None
        done[arc] = digest
        say(f"restored compile caches from {[p.name for p in paths]} ({len(members)} entries) into {Path.home()}")


# --------------------------------------------------------------------------------------------
# running the checks from the unpacked bundle

# NVLink multicast stays off in every job (hosts that share GPUs between tenants may forbid it;
# vLLM's compiled TP graphs otherwise auto-select FlashInfer's multicast all-reduce)
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "VLLM_FLASHINFER_ALLREDUCE_BACKEND": "trtllm",
}
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def component_paths(site: Path, flashinfer: str, plugin: bool) -> list[Path]:
    """The unpacked components one job imports from, in ``PYTHONPATH`` order."""
    paths = ([site / "plugin"] if plugin else []) + [site / f"fi-{flashinfer}", site / "common"]
    for p in paths:
        if not p.is_dir():
            have = sorted(d.name for d in site.iterdir()) if site.is_dir() else []
            raise RunnerError(
                f"{p} is missing: the bundle has components {have}; build one with "
                f"`build.py build --flashinfer {flashinfer}` or pick a release it has (--flashinfer)"
            )
    return paths


def runner_paths(site: Path) -> list[Path]:
    """What this process imports the package's runner from, first on ``sys.path``: the plugin wheel
    the bundle carries (else the checkout, for ``--dry-run``), then the bundle's ``common``
    component, which has the dependencies the host may lack (pydantic: the H200 image has none)."""
    plugin_dir, common = site / "plugin", site / "common"
    return [plugin_dir if plugin_dir.is_dir() else REPO] + ([common] if common.is_dir() else [])


def bundle_env(site: Path, flashinfer: str, plugin: bool, base: dict[str, str]) -> dict[str, str]:
    """``base`` with the bundle's components on ``PYTHONPATH``, the host's CUDA on ``PATH``."""
    env = dict(base)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in component_paths(site, flashinfer, plugin))
    for k, v in {**MULTICAST_OFF, **OFFLINE}.items():
        env.setdefault(k, v)
    bindir = str(Path(sys.executable).parent)
    # FlashInfer's JIT needs nvcc: CUDA_HOME, else CUDA's standard install location
    std = Path("/usr/local/cuda")
    cuda_home = env.get("CUDA_HOME") or (str(std) if (std / "bin" / "nvcc").exists() else "")
    if cuda_home:
        env["CUDA_HOME"] = cuda_home
    path = [bindir] + ([f"{cuda_home}/bin"] if cuda_home else []) + env.get("PATH", "").split(os.pathsep)
    env["PATH"] = os.pathsep.join(dict.fromkeys(p for p in path if p))
    return env


def use_checkout_plugin(site: Path, repo: Path = REPO) -> str:
    """Replace the bundle's plugin code (``<site>/plugin/nvfp4compat``, from the wheel) by the checkout's
    package, with ``matrix/`` where the wheel puts it (``nvfp4compat/matrix``, package data): testing the
    working tree without rebuilding the bundle. The wheel's ``dist-info`` (the entry point vLLM loads the
    plugin by) stays. Returns what was installed."""
    plugin = site / "plugin"
    src, matrix = repo / "nvfp4compat", repo / "matrix"
    if not (plugin / "nvfp4compat").is_dir():
        raise RunnerError(
            f"{plugin / 'nvfp4compat'} is missing: the bundle's plugin component is not unpacked yet; "
            "run `unpack` with every part first (or drop --plugin-from-checkout)"
        )
    yamls = sorted(matrix.glob("*.yaml"))
    if not (src / "__init__.py").is_file() or not yamls:
        raise RunnerError(
            f"{repo} is not an nvfp4compat checkout (it needs nvfp4compat/__init__.py and matrix/*.yaml); "
            "run from the repository root or drop --plugin-from-checkout"
        )
    dst = plugin / "nvfp4compat"
    shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.rmtree(dst / "matrix", ignore_errors=True)
    shutil.copytree(matrix, dst / "matrix")
    rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", "nvfp4compat", "matrix"],
                           capture_output=True, text=True)  # fmt: skip
    where = rev.stdout.strip() if rev.returncode == 0 else "unknown commit"
    if dirty.returncode == 0 and dirty.stdout.strip():
        where += " + uncommitted changes"
    return f"plugin code from the checkout ({where}), matrix {len(yamls)} files, in {dst}"


def make_tiny_model(model: Path, site: Path, flashinfer: str) -> None:
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_tiny_model.py"), "--out", str(model)],
        env=bundle_env(site, flashinfer, False, dict(os.environ)),
        capture_output=True,
        text=True,
    )
    say(proc.stdout[-1500:] + proc.stderr[-1500:])
    if proc.returncode != 0:
        raise RunnerError(f"make_tiny_model.py failed (rc {proc.returncode}); see above")
    say(f"tiny model made in {model} in {time.time() - t0:.1f} s")


def cmd_run(args: argparse.Namespace) -> int:
    if args.dry_run:
        manifest = find_manifest(args.bundle_dir, args.manifest, args.site)[1]
    else:
        complete, manifest = unpack(args.bundle_dir, args.site, args.manifest)
        if not complete:
            return 3
        if args.plugin_from_checkout:
            say(use_checkout_plugin(args.site))
    fi = args.flashinfer or manifest.get("flashinfer_default")
    if not fi:
        raise RunnerError("the manifest names no default FlashInfer release: pass --flashinfer")
    # the package's runner, from the plugin wheel the bundle carries (or the checkout for --dry-run)
    sys.path[:0] = [str(p) for p in runner_paths(args.site)]
    from nvfp4compat.validation.checks import parse_checks, plan_jobs
    from nvfp4compat.validation.report import verdict_lines
    from nvfp4compat.validation.runner import (
        Settings,
        base_job_env,
        job_patterns,
        run_checks,
        selected,
        unmatched,
    )

    try:
        checks = parse_checks(args.checks)
    except ValueError as exc:
        print(f"run_on_device.py: {exc}", file=sys.stderr)
        return 2
    model: Path = args.model.resolve()
    work: Path = (args.work or args.site.parent / "nvfp4-jobs").resolve()
    out: Path = args.out.resolve()
    recall_model = None
    if "recall" in checks:
        if not args.dry_run and not (args.recall_model / "model.safetensors").exists():
            raise RunnerError(
                f"--recall-model {args.recall_model} has no model.safetensors: train it first "
                "(scripts/train_recall_model.py, docs/recall.md) or point --recall-model at one"
            )
        # jobs may outlive the call that started them while the checkout is re-copied under them:
        # serve a private copy from the work folder
        recall_model = work / "recall-model"
    extra = dict(kv.split("=", 1) for kv in args.env)
    patterns = job_patterns(args.jobs)
    settings = Settings(
        model=str(model),
        tokenizer=args.tokenizer,
        checks=checks,
        out=out,
        work=work,
        flashinfer=fi,
        gpu_memory_utilization=args.gpu_mem,
        max_model_len=args.max_model_len,
        logprob_prompts=args.logprob_prompts,
        logprob_prompt_len=args.logprob_prompt_len,
        throughput_context=args.throughput_context,
        throughput_new_tokens=args.throughput_new_tokens,
        recall_model=str(recall_model) if recall_model else None,
        recall_lengths=[int(x) for x in args.recall_lengths.split(",") if x.strip()],
        recall_beyond=[int(x) for x in args.recall_beyond.split(",") if x.strip()],
        recall_per_depth=args.recall_per_depth,
        tp=args.tp,
        kv_cache_gib=args.kv_cache_gib,
        job_timeout_s=args.job_timeout,
        budget_s=args.budget_s,
        jobs=tuple(patterns),
        extra_env=extra,
        argv=sys.argv,
    )
    jobs = plan_jobs(checks, fi, args.tp)
    missing = unmatched(jobs, patterns)
    if missing:
        print(f"run_on_device.py: --jobs {','.join(missing)} matches none of the jobs: "
              f"{', '.join(j.name for j in jobs)}", file=sys.stderr)  # fmt: skip
        return 2
    say(f"checks {checks}: {len(jobs)} jobs (FlashInfer {fi})")
    for j in jobs:
        say(f"  job {j.name}: tasks {j.tasks} (checks {j.checks})" + ("" if selected(j, patterns) else " [not selected]"))
    if args.dry_run:
        return 0
    if model.suffix == ".gguf":
        if not model.is_file():
            raise RunnerError(f"--model {model}: no GGUF file there")
    elif not (model / "config.json").exists():
        make_tiny_model(model, args.site, fi)
    if recall_model is not None:
        shutil.copytree(args.recall_model.resolve(), recall_model, dirs_exist_ok=True)
        say(f"recall model {args.recall_model} served from {recall_model}")
    results = run_checks(
        settings,
        say,
        job_env=lambda j: bundle_env(args.site, fi, j.plugin, base_job_env(j, os.environ, extra)),
    )
    if args.save_caches:
        try:
            say(save_caches(out))
        except RunnerError as exc:  # the caches are optional: the checks' verdicts still follow
            say(f"compile caches not saved: {exc}")
    for line in verdict_lines(results):
        say(line)
    return 0 if all(r.get("passed") for r in results.values()) else 1


def cmd_unpack(args: argparse.Namespace) -> int:
    complete, _ = unpack(args.bundle_dir, args.site, args.manifest, args.clean)
    if complete and args.plugin_from_checkout:
        say(use_checkout_plugin(args.site))
    return 0 if complete or args.partial_ok else 3


def cmd_caches(args: argparse.Namespace) -> int:
    if args.action == "save":
        args.out.mkdir(parents=True, exist_ok=True)
        say(save_caches(args.out, args.name))
    else:
        state = load_state(args.site)
        restore_caches(args.bundle_dir, state)
        save_state(args.site, state)
    return 0


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
    global CACHE_CHUNK, CACHE_MAX_CHUNKS, CACHE_LIMIT
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--bundle-dir",
        type=Path,
        default=REPO / ".bundle",
        help="where the part folders pNN/ are (default: <repo>/.bundle)",
    )
    common.add_argument(
        "--site",
        type=Path,
        default=REPO / ".bundle" / "site",
        help="where the bundle is unpacked (default: <repo>/.bundle/site)",
    )
    common.add_argument(
        "--manifest", type=Path, default=None, help="follow this manifest instead of the newest one"
    )
    common.add_argument(
        "--plugin-from-checkout", action="store_true",
        help="once the bundle is complete, replace its plugin code by this checkout's nvfp4compat/ and matrix/ "
             "(test the working tree without rebuilding the bundle)",
    )  # fmt: skip
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("unpack", parents=[common], help="verify and extract the parts present")
    u.add_argument("--clean", action="store_true", help="remove --site first")
    u.add_argument("--partial-ok", action="store_true", help="exit 0 although parts are still missing")
    sub.add_parser("status", parents=[common], help="what is unpacked, what is missing")
    r = sub.add_parser("run", parents=[common], help="unpack, then run the selected checks")
    r.add_argument("--checks", required=True, help="comma list of check names or docs/validation.md numbers")
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "nvfp4-out")),
                   help="report folder (default: $OUT, else ./nvfp4-out)")
    r.add_argument("--model", type=Path, default=REPO / ".bundle" / "tiny-qwen3",
                   help="model folder or .gguf file; a folder is made with scripts/make_tiny_model.py "
                        "when it has no config.json (default: <repo>/.bundle/tiny-qwen3)")
    r.add_argument("--tokenizer", default=None,
                   help="vLLM's tokenizer (default: the model's own; a .gguf file's embedded one)")
    r.add_argument("--recall-model", type=Path, default=REPO / "tests" / "data" / "recall-model",
                   help="the trained recall model the recall check serves (default: tests/data/recall-model)")
    r.add_argument("--recall-lengths", default="2048,4096,8192", help="recall context lengths (default 2048,4096,8192)")
    r.add_argument("--recall-beyond", default="16384",
                   help="recall lengths past the model's trained 8192, reported outside the verdict ('' for none)")
    r.add_argument("--recall-per-depth", type=int, default=10, help="needles per depth and length (default 10)")
    r.add_argument("--flashinfer", default=None,
                   help="the bundled FlashInfer release every job imports (default: the manifest's)")
    r.add_argument("--gpu-mem", type=float, default=0.30, help="gpu_memory_utilization of every engine")
    r.add_argument("--max-model-len", type=int, default=8192 + 512)
    r.add_argument("--logprob-prompts", type=int, default=8)
    r.add_argument("--logprob-prompt-len", type=int, default=2048)
    r.add_argument("--throughput-context", type=int, default=8192)
    r.add_argument("--throughput-new-tokens", type=int, default=256)
    r.add_argument("--job-timeout", type=float, default=1200.0, help="seconds one job may take")
    r.add_argument("--budget-s", type=float, default=None,
                   help="start no job after this many seconds of the run; skipped jobs are reported")
    r.add_argument("--tp", type=int, default=2, help="tensor_parallel_size of the tp check")
    r.add_argument("--env", action="append", default=[], help="KEY=VALUE for every job")
    r.add_argument("--jobs", default="",
                   help="comma-separated shell patterns of the job names to run (default: all; the preflight always runs)")
    r.add_argument("--kv-cache-gib", type=float, default=None,
                   help="fixed KV reservation for engines whose checks measure neither memory nor speed")
    r.add_argument("--work", type=Path, default=None,
                   help="folder for the jobs' specs, logs and results (default: <site>/../nvfp4-jobs)")
    r.add_argument("--dry-run", action="store_true", help="plan the jobs, run nothing")
    r.add_argument("--save-caches", action="store_true",
                   help="pack FlashInfer's JIT, vLLM's and Triton's compile caches into OUT/caches.tar.xz.NN")
    c = sub.add_parser("caches", parents=[common],
                       help="save the compile caches to OUT, or restore those carried in <bundle-dir>/caches/")
    c.add_argument("action", choices=("save", "restore"))
    c.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "nvfp4-out")),
                   help="where save writes <name>.tar.xz.NN (default: $OUT, else ./nvfp4-out)")
    c.add_argument("--name", default="caches", help="archive name (default: caches); restore takes every name")
    for p in (r, c):
        p.add_argument("--cache-chunk-mib", type=int, default=CACHE_CHUNK >> 20, help="size of one cache chunk")
        p.add_argument("--cache-max-chunks", type=int, default=CACHE_MAX_CHUNKS,
                       help="caches join the archive, most valuable first, while it fits this many chunks")
    args = ap.parse_args(argv)
    if args.cmd in ("run", "caches"):
        CACHE_CHUNK, CACHE_MAX_CHUNKS = args.cache_chunk_mib << 20, args.cache_max_chunks
        CACHE_LIMIT = CACHE_CHUNK * CACHE_MAX_CHUNKS
    try:
        return {"unpack": cmd_unpack, "status": cmd_status, "run": cmd_run, "caches": cmd_caches}[args.cmd](args)
    except RunnerError as exc:
        print(f"run_on_device.py: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
