"""``nvfp4compat validate`` on the CPU: help, the refusals, bad input, the argument plumbing, and the
runner end to end over a stand-in job script. The engines themselves run in the ``gpu`` test below.
"""

from __future__ import annotations

import importlib.machinery
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nvfp4compat.cli import main as cli_main
from nvfp4compat.validation import command, runner
from nvfp4compat.validation.checks import DEFAULT_CHECKS
from nvfp4compat.validation.report import verdict

REPO = Path(__file__).resolve().parents[1]


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


def test_validate_help_works_without_vllm_or_a_gpu(capsys):
    assert cli_main(["validate", "--help"]) == 0
    out = capsys.readouterr().out
    for opt in ("--model", "--recall", "--checks", "--out", "--dry-run"):
        assert opt in out
    with pytest.raises(SystemExit) as exc:  # the top-level parser's own --help
        cli_main(["--help"])
    assert exc.value.code == 0 and "validate   run the end-to-end checks" in capsys.readouterr().out


def test_validate_without_vllm_says_so_in_one_line(capsys, monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(command.importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real(n, *a))
    assert cli_main(["validate", "--model", str(REPO / "tests" / "data" / "recall-model"), "--out", str(tmp_path)]) == 1
    err = _one_line(capsys.readouterr().err)
    assert "vLLM is not installed" in err and "pip install vllm==" in err


def test_validate_without_cuda_says_so_in_one_line(capsys, monkeypatch, tmp_path):
    torch = pytest.importorskip("torch")
    real = importlib.util.find_spec
    fake = importlib.machinery.ModuleSpec("vllm", None)
    monkeypatch.setattr(command.importlib.util, "find_spec", lambda n, *a: fake if n == "vllm" else real(n, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli_main(["validate", "--model", "Qwen/Qwen3-0.6B", "--out", str(tmp_path)]) == 1
    err = _one_line(capsys.readouterr().err)
    assert "no CUDA GPU is visible" in err and "CUDA_VISIBLE_DEVICES" in err
    assert not any(tmp_path.iterdir())  # nothing was started or written


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([], "the following arguments are required: --model"),
        (["--model", "m/x", "--checks", "3,5"], "unknown check '5'"),
        (["--model", "m/x", "--gpu-mem", "1.5"], "--gpu-mem 1.5 is a fraction"),
        (["--model", "m/x", "--gpu-mem", "-1"], "must be greater than 0"),
        (["--model", "m/x", "--max-model-len", "4096"], "throughput check needs --max-model-len >= 8448"),
        (["--model", "m/x", "--checks", "tp", "--tp", "1"], "tp check needs --tp 2 or more"),
        (["--model", "m/x", "--env", "NOVALUE"], "expected KEY=VALUE"),
        (["--model", "./no-such-model"], "no model folder there"),
        (["--model", "tests"], "the folder has no config.json"),
        (["--model", "./no-such-model.gguf"], "no GGUF file there"),
        (["--model", "m/x", "--tokenizer", "./no-such-tokenizer"], "--tokenizer ./no-such-tokenizer: nothing there"),
        (["--model", "m/x", "--recall", "tests"], "tests lacks config.json, model.safetensors, tokenizer.json"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert cli_main(["validate", *argv]) == 2
    err = _one_line(capsys.readouterr().err)
    assert needle in err and err.startswith("nvfp4compat validate: ")


def test_arguments_reach_the_settings(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    argv = ["--model", "tests/data/recall-model", "--out", str(tmp_path / "r"), "--checks", "plan,3",
            "--recall", "--gpu-mem", "0.5", "--max-model-len", "16384", "--env", "NVFP4COMPAT_IMPL=write=triton",
            "--recall-lengths", "1024,2048", "--budget-s", "900"]
    s = command.build_settings(command.parser().parse_args(argv), argv)
    assert s.checks == ["plan", "capacity", "recall"]
    assert s.model == str((REPO / "tests" / "data" / "recall-model").resolve())  # absolute: jobs run elsewhere
    assert s.recall_model == str(command.SHIPPED_RECALL_MODEL.resolve())
    assert s.work == tmp_path / "r" / "jobs" and s.budget_s == 900
    assert s.extra_env == {"NVFP4COMPAT_IMPL": "write=triton"}
    spec = s.spec()
    assert spec["gpu_memory_utilization"] == 0.5 and spec["recall_lengths"] == [1024, 2048]
    assert spec["recall_max_model_len"] == 16384 and spec["max_model_len"] == 16384
    assert s.argv[:2] == ["nvfp4compat", "validate"]
    hub = command.build_settings(command.parser().parse_args(["--model", "Qwen/Qwen3-0.6B"]), [])
    assert hub.model == "Qwen/Qwen3-0.6B" and hub.checks == list(DEFAULT_CHECKS) and hub.recall_model is None


def test_a_gguf_file_is_served_with_its_own_tokenizer_unless_told(tmp_path, monkeypatch):
    gguf = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    s = command.build_settings(command.parser().parse_args(["--model", str(gguf)]), [])
    assert s.model == str(gguf.resolve()) and s.tokenizer is None and s.spec()["tokenizer"] is None
    s = command.build_settings(command.parser().parse_args(["--model", str(gguf), "--tokenizer", "HuggingFaceTB/SmolLM2-135M-Instruct"]), [])
    assert s.spec()["tokenizer"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert s.spec()["prose_path"].endswith("accuracy/data/prose.txt")
    # without the gguf package the command says so in one line, with the way out
    monkeypatch.setattr(command.importlib.util, "find_spec", lambda name: None)
    why = command.gguf_refusal(s.model)
    assert why and "the gguf package is not installed" in why and "pip install gguf" in why
    assert command.gguf_refusal("Qwen/Qwen3-0.6B") is None


def test_dry_run_lists_the_jobs_and_starts_nothing(capsys, tmp_path):
    rc = cli_main(["validate", "--model", "Qwen/Qwen3-0.6B", "--out", str(tmp_path / "o"), "--dry-run"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "checks plan, negative, capacity, fidelity, throughput: 12 jobs" in out
    assert "-noplugin: start (for negative)" in out and not (tmp_path / "o").exists()
    # check 4's NVFP4 variants: the rotated cache, 4over6 (vLLM's dtype name) and both
    for name in ("nvfp4-eager-finone-plugin-rot-hadamard", "nvfp4_4over6-eager-finone-plugin",
                 "nvfp4_4over6-eager-finone-plugin-rot-hadamard", "nvfp4_hadamard-eager-finone-plugin"):
        assert f"  {name}: start, logprobs (for fidelity)" in out


FAKE_JOB = textwrap.dedent(
    '''
    import json, os, sys
    spec = json.load(open(sys.argv[1]))
    res = {"kind": spec["kind"], "tasks": {}, "error": None, "env_plugins": os.environ.get("VLLM_PLUGINS")}
    if spec["kind"] == "preflight":
        b = {op: {"impl": "triton"} for op in ("write", "decode", "prefill")}
        vllm = {"version": "0.26.0", "kv_cache_dtypes": ["nvfp4"]}
        plan = {"supported": True, "text": "plan: write=triton",
                "json": {"supported": True, "bindings": b, "vllm": vllm}}
        res["tasks"]["preflight"] = {"ok": True, "gpu": "Stand-in GPU", "vllm": "0.26.0", "plan": plan}
    elif os.environ.get("VLLM_PLUGINS") == "":
        err = "ValueError: Selected backend ... Reason: ['kv_cache_dtype not supported']"
        print(err)
        res["tasks"]["start"] = {"ok": False, "error": err}
    else:
        print("INFO nvfp4compat: vLLM 0.26.0 on sm_90: backport; write=triton, decode=triton, prefill=triton [pid 1]")
        kv = spec["kv_cache_dtype"]
        res["rotation"] = os.environ.get("NVFP4COMPAT_KV_ROTATION")
        res["tasks"]["start"] = {"ok": True, "kv_cache_tokens": {"nvfp4": 35600, "auto": 10000, "fp8": 20000}[kv]}
        res["spec_model"] = spec["model"]
        if "logprobs" in spec["tasks"]:
            d = {"nvfp4": 0.05, "auto": 0.0, "fp8": 0.01}[kv] * (0.5 if res["rotation"] else 1.0)
            res["tasks"]["logprobs"] = {"ok": True, "prompts": [{"target_logprob": [-1.0 - d, -2.0], "top1": [3, 4]}]}
        if "throughput" in spec["tasks"]:
            rate = {"nvfp4": 900.0, "auto": 1000.0}[kv]
            res["tasks"]["throughput"] = {"ok": True, "requests": 32, "context": 8192, "decode_tok_s": rate,
                                          "prefill_only_s": 1.0, "prefill_plus_decode_s": 9.0}
    json.dump(res, open(spec["result"], "w"))
    '''
)


def test_runner_runs_each_job_in_its_process_and_writes_the_report(tmp_path, monkeypatch):
    script = tmp_path / "fake_job.py"
    script.write_text(FAKE_JOB)
    monkeypatch.setattr(runner, "JOB_SCRIPT", script)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    lines: list[str] = []
    s = runner.Settings(model=str(tmp_path / "model"), checks=list(DEFAULT_CHECKS), out=tmp_path / "out",
                        work=tmp_path / "work", flashinfer="0.6.14", argv=["nvfp4compat", "validate"])
    results = runner.run_checks(s, lines.append)
    assert all(r["passed"] for r in results.values()), json.dumps(results, indent=1, default=str)
    assert results["capacity"]["ratio"] == pytest.approx(3.56)
    assert results["throughput"]["ratio_nvfp4_over_bf16"] == pytest.approx(0.9)
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["complete"] and doc["passed"] and doc["environment"]["gpu"] == "Stand-in GPU"
    assert doc["jobs"]["nvfp4-eager-fi0.6.14-noplugin"]["env_plugins"] == ""
    assert doc["jobs"]["nvfp4-eager-fi0.6.14-plugin"]["env_plugins"] is None
    assert doc["jobs"]["nvfp4-eager-fi0.6.14-plugin"]["spec_model"] == str(tmp_path / "model")
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "**5 of 5 checks pass**" in md and "PARTIAL" not in md
    assert "| 3. capacity | PASS | 35,600 NVFP4 tokens / 10,000 bf16 = 3.56x" in md
    assert "kv_cache_dtype not supported" in (tmp_path / "out" / "jobs.log").read_text()
    assert any(ln.startswith("[1/12] preflight-fi0.6.14-plugin") for ln in lines)
    # the rotated job ran with the rotation on, the plain one without; 4over6 is skipped where the
    # recorded plan (vLLM 0.26.0) accepts only nvfp4, and the check still passes
    assert doc["jobs"]["nvfp4-eager-fi0.6.14-plugin-rot-hadamard"]["rotation"] == "hadamard"
    assert doc["jobs"]["nvfp4-eager-fi0.6.14-plugin"]["rotation"] is None
    skipped = doc["jobs"]["nvfp4_4over6-eager-fi0.6.14-plugin"]
    assert skipped["skipped"] and "not 'nvfp4_4over6'" in skipped["error"]
    fid = results["fidelity"]
    assert fid["variants"]["nvfp4-eager-fi0.6.14-plugin-rot-hadamard"]["mean_abs_diff"] == pytest.approx(0.0125)
    assert fid["variants"]["nvfp4_4over6-eager-fi0.6.14-plugin"]["skipped"]
    assert any("noplugin: " in ln and "did not start without the plugin: ValueError" in ln for ln in lines), lines


def test_runner_reports_a_job_that_never_wrote_its_result(tmp_path, monkeypatch):
    script = tmp_path / "crash.py"
    script.write_text("import sys\nprint('boom: no GPU memory')\nsys.exit(3)\n")
    monkeypatch.setattr(runner, "JOB_SCRIPT", script)
    s = runner.Settings(model="m/x", checks=["capacity"], out=tmp_path / "out", work=tmp_path / "w")
    results = runner.run_checks(s, lambda _: None)
    assert not results["capacity"]["passed"]
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    err = doc["jobs"]["auto-eager-finone-plugin"]["error"]
    assert "no result file (rc 3)" in err and "boom: no GPU memory" in err


def test_a_job_the_budget_stops_leaves_its_check_incomplete_not_failed(tmp_path, monkeypatch):
    """A job stopped by what was left of --budget-s (not by its own --job-timeout) is not measured, and the jobs after
    it are skipped: check 6 reads INCOMPLETE and names both, as on run R's cold H100 (there the skip alone)."""
    script = tmp_path / "slow_job.py"
    script.write_text(
        "import json, sys, time\nspec = json.load(open(sys.argv[1]))\n"
        "if spec['kind'] != 'preflight':\n    time.sleep(30)\n"
        "json.dump({'tasks': {'preflight': {'ok': True}}}, open(spec['result'], 'w'))\n"
    )
    monkeypatch.setattr(runner, "JOB_SCRIPT", script)
    monkeypatch.setattr(runner, "MIN_JOB_S", 0.5)
    lines: list[str] = []
    s = runner.Settings(model="m/x", checks=["throughput"], out=tmp_path / "out", work=tmp_path / "w", budget_s=4.0)
    results = runner.run_checks(s, lines.append)
    r = results["throughput"]
    assert verdict(r) == "INCOMPLETE", json.dumps(r, indent=1, default=str)
    first, *rest = r["incomplete"].items()
    assert first[0] == "nvfp4-default-finone-plugin" and "when the run's budget of 4 s was spent" in first[1]
    assert rest and all("budget of 4 s is spent" in why for _, why in rest), rest
    assert "INCOMPLETE" in (tmp_path / "out" / "summary.md").read_text()


def test_an_unwritable_report_folder_is_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(command, "refusal", lambda: None)  # as on a GPU machine with vLLM
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cli_main(["validate", "--model", "m/x", "--out", str(blocker / "report")]) == 2
    err = _one_line(capsys.readouterr().err)
    assert "cannot create the report folders" in err and "pass --out" in err


@pytest.mark.gpu
def test_validate_on_the_gpu_reproduces_the_negative_control_and_capacity(tmp_path):
    """On a CUDA machine with vLLM: the plan, the negative control and capacity on the tiny model."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("needs vLLM installed (pip install vllm==<release>)")
    model = tmp_path / "tiny"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_tiny_model.py"), "--out", str(model)], check=True)
    out = tmp_path / "report"
    rc = cli_main(["validate", "--model", str(model), "--out", str(out), "--checks", "plan,negative,capacity"])
    doc = json.loads((out / "results.json").read_text())
    assert rc == 0, (out / "summary.md").read_text()
    assert doc["checks"]["capacity"]["ratio"] >= 3.3 and not doc["checks"]["negative"]["engine_started"]
    shutil.rmtree(out / "jobs", ignore_errors=True)


def test_gguf_model_without_a_vllm_gguf_loader_names_the_export_way_out(tmp_path, monkeypatch):
    """vLLM 0.26.0 ships no GGUF loader: the preflight's refusal names both ways out, the GGUF plugin
    and the Hugging Face export of the same weights."""
    import importlib.util

    from nvfp4compat.validation.job import gguf_support

    real_find_spec = importlib.util.find_spec

    def find_spec(name, *a, **k):
        if name.startswith("vllm"):
            return None  # whatever vLLM is installed here: one without a GGUF loader
        return real_find_spec(name, *a, **k)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    out = gguf_support(str(model))
    assert not out["ok"]
    if real_find_spec("gguf") is None:
        assert "pip install gguf" in out["error"]
    else:
        assert out["vllm_gguf"] is None
        assert "vllm-gguf-plugin" in out["error"]
        assert f"--gguf {model} --export-hf DIR" in out["error"] and "--model DIR" in out["error"]


def test_jobs_selects_by_name_and_the_rest_are_reported_not_run(tmp_path, monkeypatch, capsys):
    script = tmp_path / "fake_job.py"
    script.write_text(FAKE_JOB)
    monkeypatch.setattr(runner, "JOB_SCRIPT", script)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    lines: list[str] = []
    s = runner.Settings(model=str(tmp_path / "model"), checks=["capacity"], out=tmp_path / "out",
                        work=tmp_path / "work", flashinfer="0.6.14", jobs=("nvfp4-*",))
    results = runner.run_checks(s, lines.append)
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["jobs"]["preflight-fi0.6.14-plugin"]["error"] is None  # always runs
    assert doc["jobs"]["nvfp4-eager-fi0.6.14-plugin"]["tasks"]["start"]["kv_cache_tokens"] == 35600
    bf16 = doc["jobs"]["auto-eager-fi0.6.14-plugin"]
    assert bf16["skipped"] and "--jobs nvfp4-* does not select it" in bf16["error"]
    assert not results["capacity"]["passed"]  # half a comparison is no verdict
    assert any("auto-eager-fi0.6.14-plugin: not selected (--jobs)" in ln for ln in lines)
    # the command checks the patterns against the planned jobs before anything runs
    argv = ["--model", "m/x", "--checks", "capacity", "--jobs", "nvfp4-*,*recall*"]
    assert cli_main(["validate", *argv]) == 2
    err = _one_line(capsys.readouterr().err)
    assert "--jobs *recall* matches none of the jobs of checks capacity" in err and "auto-eager-" in err
    assert cli_main(["validate", "--model", "m/x", "--checks", "capacity", "--jobs", "auto-*", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1:] == [
        "  preflight-finone-plugin: preflight (for preflight)",
        "  nvfp4-eager-finone-plugin: start (for capacity)  [not selected by --jobs]",
        "  auto-eager-finone-plugin: start (for capacity)",
    ]
