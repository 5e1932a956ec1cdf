"""The offline bundle's host runner (tools/gpu_bundle/run_on_device.py), on the CPU.

What is left of it besides unpacking: the compile-cache chunks that must fit the transport's limits,
the job environment over the unpacked components, and handing the checks to ``nvfp4compat.validation``.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path

import pytest
from _scripts import load_script

RUNNER = Path(__file__).resolve().parents[1] / "tools" / "gpu_bundle" / "run_on_device.py"


@pytest.fixture(scope="module")
def rod():
    return load_script(RUNNER, "run_on_device")


@pytest.mark.parametrize("programs", [True, False], ids=["tar-xz-programs", "python-tarfile"])
def test_compile_caches_come_back_in_chunks_and_restore(rod, tmp_path, monkeypatch, programs):
    if not programs:  # a host without the tar / xz programs: Python's tarfile packs them
        monkeypatch.setattr(rod.shutil, "which", lambda _name: None)
    elif not (shutil.which("tar") and shutil.which("xz")):
        pytest.skip("needs the tar and xz programs")
    home = tmp_path / "home"
    (home / ".cache" / "flashinfer" / "m").mkdir(parents=True)
    blob = bytes(range(256)) * 8192  # 2 MiB
    (home / ".cache" / "flashinfer" / "m" / "a.so").write_bytes(blob)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(rod, "CACHE_CHUNK", 64 << 10)  # small chunks: several files come back
    monkeypatch.setattr(rod, "CACHE_LIMIT", 64 << 20)
    out = tmp_path / "out"
    out.mkdir()
    msg = rod.save_caches(out)
    chunks = sorted(p.name for p in out.iterdir())
    assert chunks and all(n.startswith("caches.tar.xz.") for n in chunks), msg
    assert all((out / n).stat().st_size <= 64 << 10 for n in chunks)
    bundle = tmp_path / "bundle" / "caches"
    bundle.mkdir(parents=True)
    for n in chunks:
        (bundle / n).write_bytes((out / n).read_bytes())
    (home / ".cache" / "flashinfer" / "m" / "a.so").unlink()
    state: dict = {}
    rod.restore_caches(bundle.parent, state)
    assert (home / ".cache" / "flashinfer" / "m" / "a.so").read_bytes() == blob
    assert list(state["cache_archives"]) == ["caches.tar.xz"]


def test_caches_that_cannot_fit_are_left_out_and_the_rest_saved(rod, tmp_path, monkeypatch):
    """Run S: after the GPU suite the Triton cache held 1.4 GiB and packing it outlasted the call, which left a
    half-written archive in the output. Now a cache whose files pass CACHE_RAW_FACTOR x the limit is not packed, one
    that packs too big is dropped while the caches after it still get their turn, and the archive is built outside
    the output folder."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(rod, "CACHE_CHUNK", 64 << 10)
    monkeypatch.setattr(rod, "CACHE_LIMIT", 128 << 10)
    rng = random.Random(1)
    sizes = {".cache/flashinfer": 20_000, ".cache/vllm": 200_000, ".triton/cache": 2 << 20}  # vllm: random, too big
    for d, n in sizes.items():
        (home / d).mkdir(parents=True)
        (home / d / "blob").write_bytes(rng.randbytes(n) if d == ".cache/vllm" else bytes(n))
    packs: list[list[str]] = []
    real = rod._pack_xz
    monkeypatch.setattr(rod, "_pack_xz", lambda root, dirs, packed: (packs.append(list(dirs)), real(root, dirs, packed)))
    out = tmp_path / "out"
    out.mkdir()
    msg = rod.save_caches(out, "fi")
    assert packs == [[".cache/flashinfer"], [".cache/flashinfer", ".cache/vllm"]], packs  # the Triton cache: never
    assert sorted(p.name for p in out.iterdir()) == ["fi.tar.xz.00"], msg
    assert "['.cache/flashinfer']" in msg and ".cache/vllm (the archive would be" in msg
    assert ".triton/cache (2 MiB of files)" in msg
    shutil.rmtree(home / ".cache" / "flashinfer")  # none fits: nothing written, and each one named
    msg = rod.save_caches(out, "none")
    assert "not saved; left out: .cache/vllm" in msg and ".triton/cache" in msg, msg
    assert sorted(p.name for p in out.iterdir()) == ["fi.tar.xz.00"]


def test_named_cache_archives_from_two_hosts_restore_side_by_side(rod, tmp_path, monkeypatch, capsys):
    """``caches save --name``: the benchmarks' FlashInfer build and the checks' engines' builds come back from
    different calls under their own names; ``caches restore`` extracts every archive in .bundle/caches/ once,
    and a truncated chunk is an error naming the archive and the way out, not a traceback."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(rod, "CACHE_CHUNK", rod.CACHE_CHUNK)  # main() sets them from its options
    monkeypatch.setattr(rod, "CACHE_MAX_CHUNKS", rod.CACHE_MAX_CHUNKS)
    monkeypatch.setattr(rod, "CACHE_LIMIT", rod.CACHE_LIMIT)
    out, bundle, site = tmp_path / "out", tmp_path / "bundle", tmp_path / "site"
    rng = random.Random(0)
    blobs = {"0.7.2.post1": rng.randbytes(1_500_000), "0.6.14": bytes(range(256)) * 1024}
    for name, ver in (("fi072", "0.7.2.post1"), ("engines", "0.6.14")):
        so = home / ".cache" / "flashinfer" / ver / "90a" / "cached_ops" / "m" / "m.so"
        so.parent.mkdir(parents=True)
        so.write_bytes(blobs[ver])
        assert rod.main(["caches", "save", "--name", name, "--out", str(out), "--cache-chunk-mib", "1"]) == 0
        shutil.rmtree(home)
    got = sorted(p.name for p in out.iterdir())
    assert got == ["engines.tar.xz.00", "fi072.tar.xz.00", "fi072.tar.xz.01"], got  # random bytes: 2 chunks
    (bundle / "caches").mkdir(parents=True)
    for n in got:
        shutil.copy(out / n, bundle / "caches" / n)
    args = ["caches", "restore", "--bundle-dir", str(bundle), "--site", str(site)]
    assert rod.main(args) == 0
    for ver, blob in blobs.items():
        assert (home / ".cache" / "flashinfer" / ver / "90a" / "cached_ops" / "m" / "m.so").read_bytes() == blob
    assert rod.main(args) == 0 and "already restored" in capsys.readouterr().out
    (bundle / "caches" / "fi072.tar.xz.01").unlink()  # a chunk left behind by the transfer
    (site / rod.STATE_FILE).unlink()
    assert rod.main(args) == 1
    err = capsys.readouterr().err
    assert "fi072.tar.xz.00" in err and "carry every fi072.tar.xz.NN" in err and "Traceback" not in err
    assert rod.main(["caches", "save", "--name", "../x", "--out", str(out)]) == 1


def test_runner_imports_the_package_with_the_bundles_dependencies(rod, tmp_path):
    # on the H200 the host has no pydantic: the runner process itself must see `common` (where the
    # bundle put pydantic), not only the jobs it starts
    site = tmp_path / "site"
    assert rod.runner_paths(site) == [rod.REPO]  # --dry-run before anything is unpacked
    for d in ("plugin", "common"):
        (site / d).mkdir(parents=True)
    assert rod.runner_paths(site) == [site / "plugin", site / "common"]


def test_job_environment_puts_the_components_on_the_path(rod, tmp_path):
    site = tmp_path / "site"
    for d in ("plugin", "fi-0.6.15", "common"):
        (site / d).mkdir(parents=True)
    env = rod.bundle_env(site, "0.6.15", True, {"VLLM_PLUGINS": ""})
    assert env["PYTHONPATH"].split(":") == [str(site / "plugin"), str(site / "fi-0.6.15"), str(site / "common")]
    assert env["HF_HUB_OFFLINE"] == "1" and env["NCCL_NVLS_ENABLE"] == "0"
    off = rod.bundle_env(site, "0.6.15", False, {})
    assert str(site / "plugin") not in off["PYTHONPATH"]
    with pytest.raises(rod.RunnerError, match=r"fi-0.7.4 is missing: the bundle has components \['common', 'fi-0.6.15', 'plugin'\]"):
        rod.bundle_env(site, "0.7.4", True, {})


def test_dry_run_plans_the_packages_jobs(rod, tmp_path, capsys):
    (tmp_path / "b" / "p01").mkdir(parents=True)
    manifest = {"build_id": "x", "built_at": "t", "parts": [], "flashinfer_default": "0.6.14"}
    (tmp_path / "b" / "p01" / "manifest.json").write_text(json.dumps(manifest))
    argv = ["run", "--bundle-dir", str(tmp_path / "b"), "--site", str(tmp_path / "site"), "--checks", "1,3", "--dry-run"]
    assert rod.main(argv) == 0
    out = capsys.readouterr().out
    assert "nvfp4-eager-fi0.6.14-noplugin" in out and "auto-eager-fi0.6.14-plugin" in out
    assert rod.main([*argv[:-2], "1,5", "--dry-run"]) == 2
    assert "unknown check '5'" in capsys.readouterr().err


def test_plugin_from_checkout_installs_the_package_with_its_matrix(rod, tmp_path):
    """The checkout's code replaces the wheel's in the unpacked plugin component, with matrix/ where the wheel
    puts it (nvfp4compat/matrix): without it the plugin cannot plan and refuses every engine. The wheel's
    dist-info (the entry point) stays."""
    repo = Path(__file__).resolve().parents[1]
    site = tmp_path / "site"
    old = site / "plugin" / "nvfp4compat"
    old.mkdir(parents=True)
    (old / "stale.py").write_text("raise RuntimeError('the wheel code')\n")
    dist = site / "plugin" / "nvfp4compat-0.1.0.dist-info"
    dist.mkdir()
    (dist / "entry_points.txt").write_text("[vllm.general_plugins]\nnvfp4compat = nvfp4compat.vllm_plugin:register\n")
    said = rod.use_checkout_plugin(site, repo)
    new = site / "plugin" / "nvfp4compat"
    assert not (new / "stale.py").exists()
    assert (new / "__init__.py").read_text() == (repo / "nvfp4compat" / "__init__.py").read_text()
    yamls = sorted(p.name for p in (repo / "matrix").glob("*.yaml"))
    assert yamls and sorted(p.name for p in (new / "matrix").glob("*.yaml")) == yamls
    assert not list(new.rglob("__pycache__"))
    assert (dist / "entry_points.txt").exists()
    assert f"matrix {len(yamls)} files" in said and str(new) in said
    # the installed copy plans: its loader finds the matrix as package data
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-c", "import nvfp4compat; from nvfp4compat.loader import load_matrix; "
         "print(nvfp4compat.__file__); print(len(load_matrix().arches))"],
        cwd=tmp_path, env={"PYTHONPATH": str(site / "plugin"), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    where, arches = proc.stdout.split()
    assert Path(where).is_relative_to(new) and int(arches) > 0


def test_plugin_from_checkout_needs_the_unpacked_plugin_and_a_checkout(rod, tmp_path):
    with pytest.raises(rod.RunnerError, match="plugin component is not unpacked yet"):
        rod.use_checkout_plugin(tmp_path / "site")
    (tmp_path / "site" / "plugin" / "nvfp4compat").mkdir(parents=True)
    with pytest.raises(rod.RunnerError, match="is not an nvfp4compat checkout"):
        rod.use_checkout_plugin(tmp_path / "site", tmp_path)


BUNDLE_SH = RUNNER.parents[2] / "scripts" / "gpu" / "bundle.sh"


def test_bundle_script_imports_what_the_runner_would_and_refuses_a_bad_part(rod, tmp_path):
    """scripts/gpu/bundle.sh (the bundle over several device calls): its serve step puts the unpacked components on
    ``PYTHONPATH`` in the order the runner's jobs use (the checkout's plugin first, then the FlashInfer release, then
    the common packages), and an unknown ``PART`` stops it before anything is unpacked, naming the values it takes."""
    import re
    import subprocess

    text = BUNDLE_SH.read_text()
    m = re.search(r"export PYTHONPATH=(\S+)", text)
    assert m, "bundle.sh sets PYTHONPATH for the serve step"
    site = tmp_path / "site"
    for d in ("plugin", "fi-0.6.14", "common"):
        (site / d).mkdir(parents=True)
    got = m.group(1).replace("$S", str(site)).replace("$FI", "0.6.14").split(":")
    assert got == [str(p) for p in rod.component_paths(site, "0.6.14", True)]
    res = subprocess.run(["bash", str(BUNDLE_SH)], env={"PATH": "/usr/bin:/bin", "PART": "x", "OUT": str(tmp_path)},
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "need 1, 2, ... for the first transfers, last for the final one" in res.stdout
    assert not any(p.name.startswith("unpack") for p in tmp_path.iterdir())
