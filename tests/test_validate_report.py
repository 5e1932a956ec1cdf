"""The report writers of ``nvfp4compat validate`` (``summary.md``, ``results.json``), fed synthetic
check results: what a reader sees for a pass, a failure and a partial run."""

from __future__ import annotations

import json

from nvfp4compat.validation.checks import Job
from nvfp4compat.validation.report import headline, results_doc, summary_md

RESULTS = {
    "plan": {"check": "", "name": "plan", "passed": True, "supported": True,
             "planned": {"write": "flashinfer", "decode": "triton", "prefill": "triton"},
             "plugin_bound": {"write": "flashinfer", "decode": "triton", "prefill": "triton"},
             "plugin_log": ["nvfp4compat: vLLM 0.26.0 on sm_90 ...; write=flashinfer, decode=triton [pid 3]"]},
    "negative": {"check": "1", "name": "negative", "passed": True, "engine_started": False,
                 "matching_lines": ["Reason: ['kv_cache_dtype not supported']"]},
    "capacity": {"check": "3", "name": "capacity", "passed": False, "nvfp4_tokens": 30_000,
                 "bf16_tokens": 10_000, "ratio": 3.0},
    "fidelity": {"check": "4", "name": "fidelity", "passed": True, "note": "numbers only",
                 "nvfp4_vs_bf16": {"ok": True, "positions": 16376, "mean_abs_diff": 0.0123,
                                   "p99_abs_diff": 0.08, "max_abs_diff": 0.3, "top1_agreement": 0.987,
                                   "kl": 0.072, "kl_spread": [0.07, 0.074]},
                 "fp8_vs_bf16": {"ok": False, "reason": "logprobs missing: other RuntimeError: x"},
                 "variants": {
                     "nvfp4-eager-fi0.6.14-plugin-rot-hadamard": {
                         "ok": True, "positions": 16376, "mean_abs_diff": 0.01, "p99_abs_diff": 0.07,
                         "max_abs_diff": 0.2, "top1_agreement": 0.99, "kl": 0.053, "kl_spread": [0.05, 0.056],
                         "kv_cache_dtype": "nvfp4", "rotation": "hadamard"},
                     "nvfp4_4over6-eager-fi0.6.14-plugin": {
                         "ok": False, "skipped": True, "kv_cache_dtype": "nvfp4_4over6", "rotation": None,
                         "reason": "logprobs missing: other skipped: the plan accepts ['nvfp4']"}},
                 "rotation": {"rotated_below_plain": True, "variants": {
                     "nvfp4-eager-fi0.6.14-plugin-rot-hadamard": {
                         "measured": True, "kl": 0.053, "below_plain": True, "below_plain_every_prompt": True}}}},
    "throughput": {"check": "6", "name": "throughput", "passed": True, "ratio_nvfp4_over_bf16": 0.93,
                   "nvfp4": {"ok": True, "requests": 32, "context": 8192, "decode_tok_s": 930.0,
                             "prefill_only_s": 1.2, "prefill_plus_decode_s": 10.0},
                   "bf16": {"ok": True, "requests": 32, "context": 8192, "decode_tok_s": 1000.0,
                            "prefill_only_s": 1.1, "prefill_plus_decode_s": 9.1}},
    "recall": {"check": "8", "name": "recall", "passed": True, "worst_points_below_bf16": 1.0,
               "note": "target", "table": {
                   "auto-eager-fi0.6.14-plugin-recall": {"kv": "auto", "recall": {"2048": 1.0, "8192": 0.99}, "error": None},
                   "nvfp4-eager-fi0.6.14-plugin-recall": {"kv": "nvfp4", "recall": {"2048": 1.0, "8192": 0.98}, "error": None},
                   "nvfp4-eager-fi0.6.14-plugin-recall-rot-hadamard": {
                       "kv": "nvfp4", "rotation": "hadamard", "recall": {"2048": 1.0, "8192": 0.99}, "error": None}}},
}


def _jobs() -> list[Job]:
    pre = Job("preflight", "0.6.14", True)
    pre.tasks, pre.checks = ["preflight"], ["preflight"]
    pre.result = {"wall_s": 20.0, "tasks": {"preflight": {
        "ok": True, "gpu": "NVIDIA H200", "capability": "9.0", "vllm": "0.26.0 at site", "torch": "2.11.0",
        "plan": {"text": "nvfp4compat plan for sm_90\n  write   flashinfer", "supported": True}}}}
    neg = Job("engine", "0.6.14", False, "nvfp4")
    neg.tasks, neg.checks = ["start"], ["negative"]
    neg.result = {"wall_s": 50.5, "tasks": {"start": {"ok": False, "error": "ValueError: a | b"}}}
    return [pre, neg]


def test_summary_shows_each_verdict_with_its_figure():
    md = summary_md(RESULTS, _jobs(), ["nvfp4compat", "validate", "--model", "m"], 1234.0)
    assert md.startswith("# nvfp4compat validate\n")
    assert "**5 of 6 checks pass**" in md and "wall time 1234 s" in md
    assert "| 3. capacity | FAIL | 30,000 NVFP4 tokens / 10,000 bf16 = 3.00x (needs >= 3.3) |" in md
    assert "| 6. throughput | PASS | NVFP4 930.0 tok/s, bf16 1,000.0 tok/s (0.93x) |" in md
    assert "| NVFP4 | 16,376 | 0.0720 (0.0700-0.0740) | 0.0123 | 0.0800 | 0.3000 | 98.70% |" in md
    assert "| fp8 | logprobs missing: other RuntimeError: x |" in md
    assert "| nvfp4, hadamard rotation | 16,376 | 0.0530 (0.0500-0.0560) | 0.0100 |" in md
    assert "| nvfp4_4over6 | logprobs missing: other skipped: the plan accepts ['nvfp4'] |" in md
    assert "Rotated KL below plain NVFP4's: **yes**" in md
    assert "| nvfp4-eager-fi0.6.14-plugin-rot-hadamard | 0.0530 | yes | yes |" in md
    assert "| nvfp4-eager-fi0.6.14-plugin-recall | nvfp4 | 100% | 98% |" in md
    assert "| nvfp4-eager-fi0.6.14-plugin-recall-rot-hadamard | nvfp4, hadamard rotation | 100% | 99% |" in md
    assert "## Plan (`nvfp4compat doctor`)\n\n```text\nnvfp4compat plan for sm_90" in md
    assert "| gpu | NVIDIA H200 |" in md
    # a cell never breaks the table: '|' in an error becomes '/'
    assert "| nvfp4-eager-fi0.6.14-noplugin | negative | 50.5 | error: ValueError: a / b |" in md


def test_partial_summary_says_how_many_jobs_ran():
    md = summary_md({"capacity": RESULTS["capacity"]}, _jobs(), ["x"], 5.0, total_jobs=9)
    assert md.startswith("# nvfp4compat validate (PARTIAL: 2 of 9 jobs)")


def test_headlines_name_what_went_wrong():
    assert headline("negative", {"engine_started": True}).startswith("the engine started without the plugin")
    assert "not supported here (SM75 is not supported)" in headline("plan", {"supported": False, "reason": "SM75 is not supported"})
    assert headline("fidelity", RESULTS["fidelity"]).endswith(
        "fp8: logprobs missing: other RuntimeError: x; rotated KL below plain NVFP4's"
    )
    assert headline("fidelity", RESULTS["fidelity"]).startswith("NVFP4: KL 0.0720, mean abs")
    # a recall job cut by the budget fails the check at any gap: the figure says which
    cut = {"worst_points_below_bf16": 1.0, "points_per_needle": 1.0, "jobs_failed": ["fp8-eager", "rot-eager"]}
    assert headline("recall", cut) == (
        "worst NVFP4 gap 1.0 points below bf16 (target <= 1.0; one needle = 1 points); no result from fp8-eager, rot-eager"
    )
    assert "no result" not in headline("recall", {"worst_points_below_bf16": 0.0, "jobs_failed": []})


def test_results_json_holds_everything_and_round_trips():
    doc = results_doc(RESULTS, _jobs(), ["nvfp4compat", "validate"], 12.34, complete=True,
                      settings={"model": "m", "max_model_len": 8704})
    back = json.loads(json.dumps(doc))
    assert back["passed"] is False  # capacity failed
    assert back["complete"] is True and back["wall_s"] == 12.3
    assert back["environment"] == {"gpu": "NVIDIA H200", "capability": "9.0", "torch": "2.11.0", "vllm": "0.26.0 at site"}
    assert set(back["checks"]) == set(RESULTS) and set(back["jobs"]) == {"preflight-fi0.6.14-plugin", "nvfp4-eager-fi0.6.14-noplugin"}
    assert back["settings"]["max_model_len"] == 8704
    assert results_doc({}, [], [], 0.0, complete=False, settings={})["passed"] is False


def test_results_json_leaves_the_top_k_lists_in_the_jobs_own_files():
    job = Job("engine", "0.6.14", True, "nvfp4")
    job.tasks, job.checks = ["start", "logprobs"], ["fidelity"]
    prompt = {"target": [5], "target_logprob": [-1.0], "top1": [5], "top_ids": [[5, 6]], "top_logprobs": [[-1.0, -2.0]]}
    job.result = {"wall_s": 1.0, "tasks": {"start": {"ok": True}, "logprobs": {"ok": True, "prompts": [prompt]}}}
    doc = results_doc({}, [job], ["x"], 1.0, complete=True, settings={})
    lp = doc["jobs"][job.name]["tasks"]["logprobs"]
    assert lp["prompts"] == [{"target_logprob": [-1.0], "top1": [5]}]
    assert f"{job.name}.result.json" in lp["top_k_lists"]
    assert job.result["tasks"]["logprobs"]["prompts"][0]["top_ids"] == [[5, 6]]  # the job's own result is kept
