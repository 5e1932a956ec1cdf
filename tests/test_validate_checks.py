"""The end-to-end checks' pure logic (``nvfp4compat.validation.checks``), on the CPU.

The engines run on a GPU; what decides a check's verdict is plain Python over the jobs' JSON results
and is tested here: the job plan per check, the plan check (the plugin's log line against the plan
the preflight job recorded), the divergence analysis between CUDA-graph modes, the capacity and
recall verdicts, and the job environment.
"""

from __future__ import annotations

import pytest

from nvfp4compat.validation import checks as vc
from nvfp4compat.validation.runner import base_job_env

PLAN_LINE = (
    "INFO 12-03 [__init__.py:250] nvfp4compat: vLLM 0.26.0 on sm_90 with FlashInfer 0.6.14: backport "
    "[gate_nvfp4, kv_cache_update, forward_reader]; write=triton, decode=triton, prefill=triton [pid 7]"
)


def _preflight(write="triton", decode="triton", prefill="triton", supported=True):
    bindings = {op: {"op": op, "impl": impl} for op, impl in
                (("write", write), ("dequant", None), ("decode", decode), ("prefill", prefill))}
    plan = {"supported": supported, "reason": None if supported else "SM75 is not supported",
            "json": {"supported": supported, "bindings": bindings}, "text": "plan text"}
    return {"tasks": {"preflight": {"ok": True, "plan": plan}}, "log_lines": {"plugin": []}}


def _gen(tokens, tops):
    return {"ok": True, "token_ids": tokens, "top_logprobs": tops}


def test_divergence_reports_margin_and_drift():
    base = _gen(
        [[1, 2, 3], [4, 5, 6]],
        [
            [[(1, -1.0), (9, -2.0)], [(2, -1.0), (8, -1.05)], [(3, -1.0), (7, -3.0)]],
            [[(4, -1.0), (5, -1.5)], [(5, -1.0), (8, -1.02)], [(6, -1.0), (5, -2.0)]],
        ],
    )
    other = _gen(
        [[1, 2, 3], [4, 8, 6]],
        [
            [[(1, -1.02), (9, -2.0)], [(2, -1.0), (8, -1.05)], [(3, -1.0), (7, -3.0)]],
            [[(4, -1.03), (5, -1.5)], [(8, -1.0), (5, -1.0)], [(6, -1.0), (5, -2.0)]],
        ],
    )
    d = vc.divergence(base, other)
    assert d["prompts_matching"] == "1/2" and not d["matches"]
    assert d["first_divergence"] == [None, 1]
    assert d["base_margin_at_divergence"] == [pytest.approx(0.02)]
    assert d["max_logprob_diff_before_divergence"] == pytest.approx(0.03)


def _engine_result(gen=None, recall=None, plugin_line=PLAN_LINE, start=None):
    tasks = {"start": start or {"ok": True}}
    if gen is not None:
        tasks["generate"] = gen
    if recall is not None:
        tasks["recall"] = {"ok": True, "recall": recall, "table": {}}
    return {"tasks": tasks, "log_lines": {"plugin": [plugin_line], "cudagraph": []}}


def _fill(jobs, preflight=None, **by_name):
    for j in jobs:
        if j.kind == "preflight":
            j.result = preflight or _preflight()
        else:
            j.result = by_name.get(j.name) or _engine_result()


def test_parse_checks_takes_names_and_docs_numbers():
    assert vc.parse_checks("plan,1, capacity,4,6,1") == ["plan", "negative", "capacity", "fidelity", "throughput"]
    with pytest.raises(ValueError, match=r"unknown check '5'.*known checks: plan, negative \(1\)"):
        vc.parse_checks("1,5")
    with pytest.raises(ValueError, match="no check selected"):
        vc.parse_checks(" , ")


def test_default_checks_share_engines_and_run_the_preflight_first():
    jobs = vc.plan_jobs(list(vc.DEFAULT_CHECKS), "0.6.14")
    names = [j.name for j in jobs]
    assert names[0] == "preflight-fi0.6.14-plugin"
    # the plan, capacity and fidelity checks share one NVFP4 eager engine; nothing runs twice
    shared = next(j for j in jobs if j.name == "nvfp4-eager-fi0.6.14-plugin")
    assert shared.checks == ["plan", "capacity", "fidelity"] and shared.tasks == ["start", "logprobs"]
    # 8 engines for the plain formats, 3 NVFP4 variants for fidelity (rotated, 4over6, both)
    assert len(names) == len(set(names)) == 12
    assert [j for j in jobs if not j.plugin and j.kind == "engine"][0].name == "nvfp4-eager-fi0.6.14-noplugin"


def test_plan_check_passes_only_when_the_plugin_binds_what_the_plan_says():
    jobs = vc.plan_jobs(["plan"], "0.6.15")
    _fill(jobs)
    r = vc.evaluate(["plan"], jobs)["plan"]
    assert r["passed"] and r["plugin_bound"] == r["planned"] == {"write": "triton", "decode": "triton", "prefill": "triton"}
    # the plan binds FlashInfer's writer; the plugin's line says Triton: the plugin decided again
    _fill(jobs, preflight=_preflight(write="flashinfer"))
    r = vc.evaluate(["plan"], jobs)["plan"]
    assert not r["passed"] and r["planned"]["write"] == "flashinfer" and r["plugin_bound"]["write"] == "triton"
    # an unsupported plan is no pass, and the reason is in the result
    _fill(jobs, preflight=_preflight(supported=False))
    r = vc.evaluate(["plan"], jobs)["plan"]
    assert not r["passed"] and r["reason"] == "SM75 is not supported"
    # no plugin line (the plugin did not load): no pass
    _fill(jobs, **{"nvfp4-eager-fi0.6.15-plugin": _engine_result(plugin_line="INFO vllm started")})
    assert not vc.evaluate(["plan"], jobs)["plan"]["passed"]


def _real_preflight(arch: str, vllm: str, flashinfer: str | None = None):
    """A preflight result holding what `nvfp4compat doctor --json` prints for these facts."""
    import json

    import nvfp4compat

    plan = json.loads(nvfp4compat.query(arch=arch, flashinfer=flashinfer, vllm=vllm).to_json())
    pre = _preflight()
    pre["tasks"]["preflight"]["plan"] = {"json": plan, "supported": plan["supported"], "reason": plan["reason"]}
    return pre


def test_plan_check_reads_the_real_plan_and_the_real_plugin_line():
    # the line the plugin logged on an H200 with vLLM 0.26.0 and FlashInfer 0.6.14 (docs/validation.md,
    # check 2), whose plan binds the dequant + FA3 prefill: an implementation name with a digit
    line = (
        "(EngineCore pid=42) INFO 11-29 [__init__.py:250] nvfp4compat: vLLM 0.26.0 on sm_90 with FlashInfer "
        "0.6.14: backport [gate_nvfp4, gate_combination, metadata_builder, kv_cache_update, forward_reader]; "
        "write=triton (fell back to triton (flashinfer: FlashInfer 0.6.14 lacks "
        "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping (probe of the installed package); releases "
        "that have it: 0.6.15..0.7.4)), decode=triton, prefill=dequant_fa3 [pid 42]"
    )
    jobs = vc.plan_jobs(["plan"], "0.6.14")
    _fill(jobs, preflight=_real_preflight("sm_90", "0.26.0", "0.6.14"),
          **{"nvfp4-eager-fi0.6.14-plugin": _engine_result(plugin_line=line)})
    r = vc.evaluate(["plan"], jobs)["plan"]
    assert r["planned"] == {"write": "triton", "decode": "triton", "prefill": "dequant_fa3"}
    assert r["passed"] and r["plugin_bound"] == r["planned"]
    # SM100 with vLLM 0.33: vLLM serves NVFP4 itself; the plugin leaves it untouched and says so
    untouched = "nvfp4compat: vLLM 0.33.0 on sm_100 with FlashInfer 0.7.2.post1: native (...); vLLM left untouched [pid 9]"
    jobs = vc.plan_jobs(["plan", "negative"], "0.7.2.post1")
    _fill(jobs, preflight=_real_preflight("sm_100", "0.33.0"),
          **{"nvfp4-eager-fi0.7.2.post1-plugin": _engine_result(plugin_line=untouched),
             "nvfp4-eager-fi0.7.2.post1-noplugin": _engine_result(plugin_line="INFO vllm")})
    r = vc.evaluate(["plan", "negative"], jobs)
    assert r["plan"]["passed"] and r["plan"]["plugin_left_vllm_untouched"]
    assert r["negative"]["passed"] and r["negative"]["engine_started"]


def test_a_long_plan_line_keeps_its_bindings():
    """The plugin's line for the rotated cache on an H200 (run I, vLLM 0.26.0, FlashInfer 0.6.14): 1,300
    characters that explain two fallbacks. Its bindings are read from "write=..., decode=..., prefill=...",
    not from the warning "write: flashinfer preferred but rejected" further on."""
    line = (
        'INFO 12-03 23:18:13 [__init__.py:209] nvfp4compat: vLLM 0.26.0 on sm_90 with FlashInfer 0.6.14: back'
        'port [gate_nvfp4, gate_combination, metadata_builder, kv_cache_update, forward_reader]; write=triton'
        ', decode=triton, prefill=triton; builder=nvfp4compat, gate accepts nvfp4, head_size 64 and sinks acc'
        'epted, kv_rotation=hadamard, FULL decode graphs; write: fell back to triton (flashinfer: FlashInfer '
        '0.6.14 lacks nvfp4_quantize_append_paged_kv_cache_with_slot_mapping (probe of the installed package)'
        '; releases that have it: 0.6.15..0.7.4); prefill: fell back to triton (dequant_fa3: dequant_fa3 pref'
        'ill does not support the requested feature kv_rotation (Hadamard-rotated cache (NVFP4COMPAT_KV_ROTAT'
        'ION=hadamard) - the writer stores K@H and V@H, the readers attend with Q@H and multiply the output b'
        'y H, dequant returns K and V; pre/post torch ops around the bound implementation (nvfp4compat.kernel'
        's.rotation), head_dim 64/128/256/512); dequant_fa2: dequant_fa2 prefill does not support the request'
        'ed feature kv_rotation (Hadamard-rotated cache (NVFP4COMPAT_KV_ROTATION=hadamard) - the writer store'
        's K@H and V@H, the readers attend with Q@H and multiply the output by H, dequant returns K and V; pr'
        'e/post torch ops around the bound implementation (nvfp4compat.kernels.rotation), head_dim 64/128/256'
        '/512)) [pid 4236]'
    )
    warning = (
        "WARNING 12-03 23:18:13 [__init__.py:215] nvfp4compat: write: flashinfer preferred but rejected "
        "(flashinfer: FlashInfer 0.6.14 lacks nvfp4_quantize_append_paged_kv_cache_with_slot_mapping); using triton"
    )
    lines = vc.scan_log(line + "\n" + warning)["plugin"]
    assert len(line) > 1200 and lines[0].startswith("nvfp4compat: vLLM 0.26.0")
    assert vc._plan_bindings(lines) == {"write": "triton", "decode": "triton", "prefill": "triton"}
    assert vc._plan_bindings([warning]) == {"write": None, "decode": None, "prefill": None}
    assert vc._plan_bindings(["  write    -> flashinfer [matrix] ..."])["write"] == "flashinfer"


def test_an_op_left_to_vllm_counts_as_its_implementation():
    line = "nvfp4compat: vLLM 0.33.0 on sm_100: native; write=vllm(native), decode=vllm(native), prefill=vllm(native)"
    jobs = vc.plan_jobs(["plan"], "0.7.2")
    _fill(jobs, preflight=_preflight("native", "native", "native"),
          **{"nvfp4-eager-fi0.7.2-plugin": _engine_result(plugin_line=line)})
    assert vc.evaluate(["plan"], jobs)["plan"]["passed"]


def test_negative_control_needs_vllms_own_refusal():
    jobs = vc.plan_jobs(["negative"], "0.6.14")
    refused = _engine_result(start={"ok": False, "error": "ValueError: Selected backend ... Reason: ['kv_cache_dtype not supported']"})
    _fill(jobs, **{"nvfp4-eager-fi0.6.14-noplugin": refused})
    r = vc.evaluate(["negative"], jobs)["negative"]
    assert r["passed"] and not r["engine_started"] and r["check"] == "1"
    # another failure (out of memory) is not the control
    oom = _engine_result(start={"ok": False, "error": "torch.OutOfMemoryError: CUDA out of memory"})
    _fill(jobs, **{"nvfp4-eager-fi0.6.14-noplugin": oom})
    assert not vc.evaluate(["negative"], jobs)["negative"]["passed"]
    # the engine started without the plugin: the control does not hold
    _fill(jobs)
    r = vc.evaluate(["negative"], jobs)["negative"]
    assert not r["passed"] and r["engine_started"]
    # where the plan says vLLM serves NVFP4 itself (SM100), stock vLLM must start instead
    native = _preflight("native", "native", "native")
    native["tasks"]["preflight"]["plan"]["json"]["vllm"] = {"strategy": "native"}
    _fill(jobs, preflight=native)
    r = vc.evaluate(["negative"], jobs)["negative"]
    assert r["passed"] and r["expected"].startswith("starts")
    _fill(jobs, preflight=native, **{"nvfp4-eager-fi0.6.14-noplugin": refused})
    assert not vc.evaluate(["negative"], jobs)["negative"]["passed"]


@pytest.mark.parametrize(("nvfp4", "bf16", "passed"), [(35_600, 10_000, True), (32_900, 10_000, False), (None, 10_000, False)])
def test_capacity_needs_the_ratio(nvfp4, bf16, passed):
    jobs = vc.plan_jobs(["capacity"], "0.6.14")
    _fill(jobs, **{
        "nvfp4-eager-fi0.6.14-plugin": _engine_result(start={"ok": True, "kv_cache_tokens": nvfp4}),
        "auto-eager-fi0.6.14-plugin": _engine_result(start={"ok": True, "kv_cache_tokens": bf16}),
    })
    r = vc.evaluate(["capacity"], jobs)["capacity"]
    assert r["passed"] is passed and r["bf16_tokens"] == bf16
    if nvfp4:
        assert r["ratio"] == pytest.approx(nvfp4 / bf16)


def test_fidelity_compares_target_logprobs_and_top1():
    jobs = vc.plan_jobs(["fidelity"], "0.6.14")

    def lp(target, top1):
        return {"ok": True, "prompts": [{"target_logprob": target, "top1": top1}]}

    by = {
        "auto-eager-fi0.6.14-plugin": lp([-1.0, -2.0, -3.0, -4.0], [1, 2, 3, 4]),
        "nvfp4-eager-fi0.6.14-plugin": lp([-1.1, -2.0, -3.3, -4.0], [1, 2, 9, 4]),
        "fp8-eager-fi0.6.14-plugin": lp([-1.0, -2.0, -3.0, -4.05], [1, 2, 3, 4]),
    }
    for j in jobs:
        if j.kind == "preflight":
            j.result = _preflight()
        elif j.name in by:
            j.result = {"tasks": {"start": {"ok": True}, "logprobs": by[j.name]}}
    r = vc.evaluate(["fidelity"], jobs)["fidelity"]
    assert r["passed"]  # the variants not run yet: nothing failed
    assert r["nvfp4_vs_bf16"]["mean_abs_diff"] == pytest.approx(0.1) and r["nvfp4_vs_bf16"]["max_abs_diff"] == pytest.approx(0.3)
    assert r["nvfp4_vs_bf16"]["top1_agreement"] == 0.75 and r["fp8_vs_bf16"]["top1_agreement"] == 1.0
    by["fp8-eager-fi0.6.14-plugin"] = {"ok": False, "error": "RuntimeError: boom"}
    for j in jobs:
        if j.name in by:
            j.result = {"tasks": {"start": {"ok": True}, "logprobs": by[j.name]}}
    r = vc.evaluate(["fidelity"], jobs)["fidelity"]
    assert not r["passed"] and "boom" in r["fp8_vs_bf16"]["reason"]


def test_plugin_check_judges_graph_modes_against_the_bf16_control():
    jobs = vc.plan_jobs(["plugin"], "0.6.14")
    names = {j.name for j in jobs}
    assert {"nvfp4-full-decode-optin-fi0.6.14-plugin", "auto-piecewise-fi0.6.14-plugin"} <= names
    eager = _gen([[1, 2]], [[[(1, -1.0), (2, -1.01)], [(2, -1.0), (3, -3.0)]]])
    near_tie = _gen([[2, 2]], [[[(2, -1.0), (1, -1.01)], [(2, -1.0), (3, -3.0)]]])
    # parts from eager where eager's margin is 2.0 nats: not rounding noise
    real = _gen([[1, 3]], [[[(1, -1.0), (2, -1.01)], [(3, -1.0), (2, -3.0)]]])
    for j in jobs:
        if j.kind != "engine":
            j.result = _preflight()
        elif j.mode == "piecewise" and j.kv == "nvfp4":
            j.result = _engine_result(near_tie)
        elif j.mode == "full-decode-optin":
            j.result = _engine_result(real)
        elif j.mode == "full":
            j.result = {
                "tasks": {"start": {"ok": False, "error": "FULL not supported"}},
                "log_lines": {},
            }
        else:
            j.result = _engine_result(eager)
    r = vc.evaluate(["plugin"], jobs)["plugin"]
    assert r["passed"] and r["write_binding"] == "triton" == r["expected_write_binding"]
    assert r["modes"]["piecewise"]["consistent_with_eager"] is True
    assert r["modes"]["full-decode-optin"]["consistent_with_eager"] is False
    assert not r["modes"]["full"]["started"]
    # the plan of this environment binds FlashInfer's writer: a Triton line is no pass
    next(j for j in jobs if j.kind == "preflight").result = _preflight(write="flashinfer")
    r = vc.evaluate(["plugin"], jobs)["plugin"]
    assert not r["passed"] and r["expected_write_binding"] == "flashinfer"


def test_recall_check_needs_every_nvfp4_binding_within_one_point():
    jobs = vc.plan_jobs(["recall"], "0.6.14")
    engines = [j for j in jobs if j.kind == "engine"]
    # bf16 and fp8 references, the plan's NVFP4 bindings in eager and with FULL decode graphs
    assert sorted((j.kv, j.mode, j.rotation) for j in engines) == [
        ("auto", "eager", ""), ("fp8", "eager", ""), ("nvfp4", "eager", ""),
        ("nvfp4", "eager", "hadamard"), ("nvfp4", "full-decode-optin", ""),
    ]
    assert all(not j.impl and j.model == "recall" for j in engines)
    # run order under a budget: the verdict's NVFP4, bf16 and rotated jobs before fp8 and FULL graphs
    assert [(j.kv, j.rotation, j.mode) for j in engines] == [
        ("nvfp4", "", "eager"), ("auto", "", "eager"), ("nvfp4", "hadamard", "eager"), ("fp8", "", "eager"),
        ("nvfp4", "", "full-decode-optin"),
    ]

    def verdict(graphs_8k):
        for j in jobs:
            rec = {"2048": 1.0, "4096": 0.99, "8192": 0.98}
            if j.kv == "auto":
                rec = {"2048": 1.0, "4096": 1.0, "8192": 0.99}
            elif j.mode == "full-decode-optin":
                rec["8192"] = graphs_8k
            j.result = _engine_result(recall=rec)
        return vc.evaluate(["recall"], jobs)["recall"]

    ok = verdict(0.98)  # one miss in 100 below bf16 at 4K and 8K: exactly the 1-point target
    assert ok["passed"] and ok["worst_points_below_bf16"] == pytest.approx(1.0)
    bad = verdict(0.97)
    assert not bad["passed"] and bad["worst_points_below_bf16"] == pytest.approx(2.0)

    # lengths past the trained range are reported but stay out of the verdict
    for j in jobs:
        rec = {"2048": 1.0, "8192": 1.0, "16384": 0.9 if j.kv == "auto" else 0.7}
        j.result = _engine_result(recall=rec)
    past = vc.evaluate(["recall"], jobs, recall_beyond=(16384,))["recall"]
    assert past["passed"] and past["worst_points_below_bf16"] == 0.0
    entry = past["table"]["nvfp4-eager-fi0.6.14-plugin-recall"]
    assert entry["points_below_bf16"] == {"2048": 0.0, "8192": 0.0}
    assert entry["points_below_bf16_beyond_training"] == {"16384": 20.0}
    counted = vc.evaluate(["recall"], jobs)["recall"]
    assert not counted["passed"] and counted["worst_points_below_bf16"] == pytest.approx(20.0)

    # a failed reference job (fp8) leaves the table incomplete: no pass, and the check names it
    for j in jobs:
        j.result = _engine_result(recall={"2048": 1.0, "4096": 1.0, "8192": 1.0})
        if j.kv == "fp8":
            j.result["tasks"]["recall"] = {"ok": False, "error": "FileNotFoundError: tokenizer.json"}
    failed = vc.evaluate(["recall"], jobs)["recall"]
    assert failed["worst_points_below_bf16"] == 0.0 and not failed["passed"]
    assert failed["jobs_failed"] == ["fp8-eager-fi0.6.14-plugin-recall"]
    assert "tokenizer.json" in failed["table"]["fp8-eager-fi0.6.14-plugin-recall"]["error"]


def test_kv_reservation_only_where_no_check_measures_memory_or_speed():
    spec = {"kv_cache_gib": 4}
    jobs = {j.name: j for j in vc.plan_jobs(["plugin", "capacity", "recall", "throughput", "tp"], "0.6.14")}
    # the (nvfp4, eager) job serves check 2 and check 3: check 3 measures capacity, so vLLM profiles
    assert vc.kv_reservation(jobs["nvfp4-eager-fi0.6.14-plugin"], spec) is None
    assert vc.kv_reservation(jobs["nvfp4-default-fi0.6.14-plugin"], spec) is None
    assert vc.kv_reservation(jobs["nvfp4-eager-fi0.6.14-plugin-tp2"], spec) is None
    assert vc.kv_reservation(jobs["nvfp4-piecewise-fi0.6.14-plugin"], spec) == 4 << 30
    assert vc.kv_reservation(jobs["fp8-eager-fi0.6.14-plugin-recall"], spec) == 4 << 30
    assert vc.kv_reservation(jobs["preflight-fi0.6.14-plugin"], spec) is None
    assert vc.kv_reservation(jobs["nvfp4-piecewise-fi0.6.14-plugin"], {"kv_cache_gib": None}) is None


def test_job_environment_turns_the_plugin_off_and_on():
    jobs = {j.name: j for j in vc.plan_jobs(["negative", "plugin"], "0.6.14")}
    off = base_job_env(jobs["nvfp4-eager-fi0.6.14-noplugin"], {"VLLM_PLUGINS": "nvfp4compat,other", "A": "1"}, {})
    assert off["VLLM_PLUGINS"] == "" and off["A"] == "1"
    on = jobs["nvfp4-eager-fi0.6.14-plugin"]
    assert "VLLM_PLUGINS" not in base_job_env(on, {}, {})  # unset: vLLM loads every plugin
    assert base_job_env(on, {"VLLM_PLUGINS": "other"}, {})["VLLM_PLUGINS"] == "other,nvfp4compat"
    optin = base_job_env(jobs["nvfp4-full-decode-optin-fi0.6.14-plugin"], {}, {"NVFP4COMPAT_IMPL": "write=triton"})
    assert optin["NVFP4COMPAT_CUDAGRAPH_DECODE"] == "1" and optin["NVFP4COMPAT_IMPL"] == "write=triton"


def test_worker_processes_are_told_apart_by_the_plan_lines_pid():
    log = "\n".join(
        [
            "INFO 11-29 23:11:39 [__init__.py:250] nvfp4compat: vLLM 0.26.0 on sm_90 ...; decode=triton [pid 10]",
            "(EngineCore pid=997) INFO 11-29 [__init__.py:250] nvfp4compat: vLLM 0.26.0 on sm_90 ... [pid 997]",
            "INFO 11-29 23:12:19 [__init__.py:250] nvfp4compat: vLLM 0.26.0 on sm_90 ... [pid 1109]",
            "INFO 11-29 23:12:21 [__init__.py:250] nvfp4compat: vLLM 0.26.0 on sm_90 ... [pid 1112]",
            "(Worker pid=1112) INFO 11-29 [parallel_state.py:1615] world_size=2 rank=1",
            "(Worker_TP0 pid=1109) INFO 11-29 [model_runner.py:284] Loading model from scratch...",
        ]
    )
    logs = vc.scan_log(log)
    assert logs["plugin_pids"] == [10, 997, 1109, 1112]
    assert logs["worker_pids"] == [1109, 1112]


def test_engine_kwargs_keep_tp_graphs_off_flashinfer_multicast_allreduce():
    from nvfp4compat.validation import job as ej

    base = {"model": "/m", "kv_cache_dtype": "nvfp4", "gpu_memory_utilization": 0.3, "max_model_len": 4096}
    for mode in ("piecewise", "full", "full-decode-optin", "default"):
        kw = ej.engine_kwargs({**base, "mode": mode, "tensor_parallel_size": 2})
        assert kw["compilation_config"]["pass_config"] == {"fuse_allreduce_rms": False}, mode
        kw1 = ej.engine_kwargs({**base, "mode": mode, "tensor_parallel_size": 1})
        assert "pass_config" not in kw1["compilation_config"], mode
    kw = ej.engine_kwargs({**base, "mode": "eager", "tensor_parallel_size": 2, "kv_cache_memory_bytes": 1 << 30})
    assert kw["enforce_eager"] and kw["kv_cache_memory_bytes"] == 1 << 30


@pytest.mark.parametrize(
    ("arch", "vllm", "flashinfer"),
    [("sm_90", "0.26.0", "0.6.15"), ("sm_90", "0.33.0", "0.7.2.post1"), ("sm_86", "0.34.0", "0.7.4"),
     ("sm_120", "0.31.0", "0.7.0.post1")],
)
def test_plan_check_passes_on_the_line_the_plugin_writes_for_its_plan(arch, vllm, flashinfer):
    """The plan check against the plugin's own summary line for the same plan (an ``extend`` route
    logs ``write=vllm``: vLLM's own code calls the planned FlashInfer writer)."""
    import nvfp4compat
    from nvfp4compat.vllm_plugin import summary_line

    plan = nvfp4compat.query(arch=arch, flashinfer=flashinfer, vllm=vllm)
    line = f"(EngineCore pid=7) INFO {summary_line(plan)} [pid 7]"
    jobs = vc.plan_jobs(["plan"], flashinfer)
    _fill(jobs, preflight=_real_preflight(arch, vllm, flashinfer),
          **{f"nvfp4-eager-fi{flashinfer}-plugin": _engine_result(plugin_line=line)})
    r = vc.evaluate(["plan"], jobs)["plan"]
    assert r["passed"], (line, r["planned"], r["plugin_bound"])
    # the same line with another reader is caught
    bad = line.replace("decode=triton", "decode=flashinfer")
    if bad != line:
        _fill(jobs, preflight=_real_preflight(arch, vllm, flashinfer),
              **{f"nvfp4-eager-fi{flashinfer}-plugin": _engine_result(plugin_line=bad)})
        assert not vc.evaluate(["plan"], jobs)["plan"]["passed"]


# ------------------------------------------------------------------------------------------------
# check 4's NVFP4 variants (rotation, 4over6) and its KL over bf16's top-K


def test_fidelity_plans_the_rotated_and_4over6_variants_after_the_plain_formats():
    jobs = [j for j in vc.plan_jobs(["fidelity"], "0.6.14") if j.kind == "engine"]
    names = [j.name for j in jobs]
    assert names == [
        "nvfp4-eager-fi0.6.14-plugin", "auto-eager-fi0.6.14-plugin", "fp8-eager-fi0.6.14-plugin",
        "nvfp4-eager-fi0.6.14-plugin-rot-hadamard", "nvfp4_4over6-eager-fi0.6.14-plugin",
        "nvfp4_hadamard-eager-fi0.6.14-plugin", "nvfp4_4over6-eager-fi0.6.14-plugin-rot-hadamard",
    ]
    by = {j.name: j for j in jobs}
    # the rotated cache's own dtype name (registered by the plugin on vLLM >= 0.33): no environment switch
    assert "NVFP4COMPAT_KV_ROTATION" not in base_job_env(by["nvfp4_hadamard-eager-fi0.6.14-plugin"], {}, {})
    env = base_job_env(by["nvfp4_4over6-eager-fi0.6.14-plugin-rot-hadamard"], {}, {})
    assert env["NVFP4COMPAT_KV_ROTATION"] == "hadamard"
    # a plain job stays plain even where the caller's environment asks for the rotation
    plain = base_job_env(by["nvfp4-eager-fi0.6.14-plugin"], {"NVFP4COMPAT_KV_ROTATION": "hadamard"}, {})
    assert "NVFP4COMPAT_KV_ROTATION" not in plain
    assert by["nvfp4_4over6-eager-fi0.6.14-plugin"].kv == "nvfp4_4over6"  # vLLM's dtype name


def test_kl_top_k_is_exact_when_both_engines_return_the_whole_support():
    import math

    p = [(1, math.log(0.5)), (2, math.log(0.3)), (3, math.log(0.2))]
    q = [(1, math.log(0.4)), (2, math.log(0.4)), (3, math.log(0.2))]
    want = 0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.4)
    assert vc.kl_top_k(p, q) == pytest.approx(want)
    assert vc.kl_top_k(p, p) == pytest.approx(0.0, abs=1e-12)


def test_kl_top_k_estimates_a_missing_entry_from_the_others_leftover_mass():
    import math

    # bf16's top-2 is {1, 2} (0.9 of the mass, 0.1 elsewhere); the other returned {1, 3} only,
    # holding 0.7: token 2 gets the 0.3 left over, capped at the other's smallest returned 0.2
    p = [(1, math.log(0.6)), (2, math.log(0.3))]
    q = [(1, math.log(0.5)), (3, math.log(0.2))]
    q2 = 0.2
    want = 0.6 * math.log(0.6 / 0.5) + 0.3 * math.log(0.3 / q2) + 0.1 * math.log(0.1 / (1 - 0.5 - q2))
    assert vc.kl_top_k(p, q) == pytest.approx(want)
    # the prompt token vLLM adds outside the top-K is used when it is one of bf16's top-K
    got = vc.kl_top_k(p, q, [(2, math.log(0.05))])
    assert got == pytest.approx(0.6 * math.log(0.6 / 0.5) + 0.3 * math.log(0.3 / 0.05) + 0.1 * math.log(0.1 / 0.45))
    # fewer entries than K (vLLM may return fewer), even a single one, still give a finite KL
    assert math.isfinite(vc.kl_top_k(p, [(3, 0.0)]))
    with pytest.raises(ValueError, match="no logprob"):
        vc.kl_top_k([], q)


def _topk_prompt(tops, targets):
    """A logprobs prompt from per-position top lists ``[(token, prob), ...]`` and target ids."""
    import math

    probs = {t: pr for top in tops for t, pr in top}
    return {
        "target": targets,
        "target_logprob": [math.log(dict(top).get(t, probs.get(t, 1e-3))) for top, t in zip(tops, targets, strict=True)],
        "top1": [top[0][0] for top in tops],
        "top_ids": [[t for t, _ in top] for top in tops],
        "top_logprobs": [[math.log(pr) for _, pr in top] for top in tops],
    }


def _logprobs(*prompts):
    return {"ok": True, "source": "prose", "top_k": 2, "prompts": list(prompts)}


def test_fidelity_reports_kl_per_prompt_and_the_rotation_verdict():
    jobs = vc.plan_jobs(["fidelity"], "0.6.14")
    ref = [[(1, 0.7), (2, 0.2)], [(3, 0.6), (4, 0.3)]]
    plain = [[(1, 0.5), (2, 0.3)], [(4, 0.5), (3, 0.4)]]  # flips the second position's top-1
    better = [[(1, 0.65), (2, 0.25)], [(3, 0.55), (4, 0.35)]]
    worse = [[(1, 0.5), (2, 0.3)], [(4, 0.55), (3, 0.35)]]  # above plain's KL
    tg = [2, 3]

    def result(tops_a, tops_b):
        return {"tasks": {"start": {"ok": True}, "logprobs": _logprobs(_topk_prompt(tops_a, tg), _topk_prompt(tops_b, tg))}}

    by = {
        "auto-eager-fi0.6.14-plugin": result(ref, ref),
        "nvfp4-eager-fi0.6.14-plugin": result(plain, plain),
        "fp8-eager-fi0.6.14-plugin": result(ref, ref),
        "nvfp4-eager-fi0.6.14-plugin-rot-hadamard": result(better, better),
        "nvfp4_4over6-eager-fi0.6.14-plugin": result(plain, better),
        # below plain on average, not in every prompt
        "nvfp4_4over6-eager-fi0.6.14-plugin-rot-hadamard": result(better, worse),
        "nvfp4_hadamard-eager-fi0.6.14-plugin": result(better, better),
    }
    for j in jobs:
        j.result = _preflight() if j.kind == "preflight" else by[j.name]
    r = vc.evaluate(["fidelity"], jobs)["fidelity"]
    assert r["passed"] and r["fp8_vs_bf16"]["kl"] == pytest.approx(0.0, abs=1e-9)
    # the dtype-name job counts as rotated (matrix: rotated_kv_cache_dtypes)
    named = r["rotation"]["variants"].pop("nvfp4_hadamard-eager-fi0.6.14-plugin")
    assert named["kv_cache_dtype"] == "nvfp4_hadamard" and named["below_plain_every_prompt"]
    assert r["variants"]["nvfp4_hadamard-eager-fi0.6.14-plugin"]["rotation"] == "hadamard"
    n = r["nvfp4_vs_bf16"]
    assert n["kl"] > 0 and len(n["prompt_kl"]) == 2 and n["kl_spread"] == [min(n["prompt_kl"]), max(n["prompt_kl"])]
    assert n["top1_agreement"] == 0.5 and n["prompt_source"] == "prose"
    rot = r["rotation"]
    assert rot["rotated_below_plain"] is True and set(rot["variants"]) == {
        "nvfp4-eager-fi0.6.14-plugin-rot-hadamard", "nvfp4_4over6-eager-fi0.6.14-plugin-rot-hadamard"
    }
    assert rot["variants"]["nvfp4-eager-fi0.6.14-plugin-rot-hadamard"]["below_plain_every_prompt"]
    assert not rot["variants"]["nvfp4_4over6-eager-fi0.6.14-plugin-rot-hadamard"]["below_plain_every_prompt"]
    assert "nvfp4_4over6-eager-fi0.6.14-plugin" in r["variants"]  # reported, outside the rotation verdict
    # a rotated cache worse than plain: the verdict says so (the check still reports numbers)
    by["nvfp4-eager-fi0.6.14-plugin-rot-hadamard"] = result(plain, [[(2, 0.9), (1, 0.05)], [(4, 0.9), (3, 0.05)]])
    for j in jobs:
        if j.name in by:
            j.result = by[j.name]
    r = vc.evaluate(["fidelity"], jobs)["fidelity"]
    assert r["rotation"]["rotated_below_plain"] is False and r["passed"]
    # a rotated engine that failed to start fails the check and is named
    by["nvfp4-eager-fi0.6.14-plugin-rot-hadamard"] = {"tasks": {"start": {"ok": False, "error": "ValueError: rot"}}}
    for j in jobs:
        if j.name in by:
            j.result = by[j.name]
    r = vc.evaluate(["fidelity"], jobs)["fidelity"]
    assert not r["passed"] and r["variant_jobs_failed"] == ["nvfp4-eager-fi0.6.14-plugin-rot-hadamard"]
    assert "engine did not start: ValueError: rot" in r["variants"]["nvfp4-eager-fi0.6.14-plugin-rot-hadamard"]["reason"]


def test_4over6_is_skipped_where_the_plan_has_no_such_dtype():
    jobs = vc.plan_jobs(["fidelity"], "0.6.14")
    pre = next(j for j in jobs if j.kind == "preflight")
    pre.result = _preflight()
    four = next(j for j in jobs if j.kv == "nvfp4_4over6" and not j.rotation)
    plain = next(j for j in jobs if j.kv == "nvfp4" and not j.rotation)
    assert vc.unavailable(four, jobs) is None  # no vLLM plan recorded: run it and see
    pre.result["tasks"]["preflight"]["plan"]["json"]["vllm"] = {"version": "0.26.0", "kv_cache_dtypes": ["nvfp4"]}
    why = vc.unavailable(four, jobs)
    assert why and "nvfp4_4over6" in why and "0.26.0" in why and ">= 0.28" in why
    assert vc.unavailable(plain, jobs) is None
    pre.result["tasks"]["preflight"]["plan"]["json"]["vllm"]["kv_cache_dtypes"] = ["nvfp4", "nvfp4_4over6"]
    assert vc.unavailable(four, jobs) is None
    named = next(j for j in jobs if j.kv == "nvfp4_hadamard")
    why = vc.unavailable(named, jobs)  # a release without the dtype registry: skipped, with the release that has it
    assert why and "nvfp4_hadamard" in why and ">= 0.33" in why
    pre.result["tasks"]["preflight"]["plan"]["json"]["vllm"]["kv_cache_dtypes"] += ["nvfp4_hadamard"]
    assert vc.unavailable(named, jobs) is None


def test_recall_counts_the_rotated_cache_against_the_same_target():
    jobs = vc.plan_jobs(["recall"], "0.6.14")
    for j in jobs:
        rec = {"2048": 1.0, "4096": 1.0, "8192": 1.0}
        if j.rotation:
            rec["8192"] = 0.97
        j.result = _engine_result(recall=rec)
    r = vc.evaluate(["recall"], jobs)["recall"]
    row = r["table"]["nvfp4-eager-fi0.6.14-plugin-recall-rot-hadamard"]
    assert row["rotation"] == "hadamard" and row["points_below_bf16"]["8192"] == pytest.approx(3.0)
    assert not r["passed"] and r["worst_points_below_bf16"] == pytest.approx(3.0)


def test_recall_rows_say_why_a_job_has_no_figures():
    """A job the run did not start (--jobs, the budget) shows its reason in the table, not "None"."""
    from nvfp4compat.validation.report import _recall_rows

    jobs = vc.plan_jobs(["recall"], "0.6.14")
    for j in jobs:
        if j.rotation or j.kind == "preflight":
            j.result = _engine_result(recall={"2048": 1.0, "4096": 0.99})
        else:
            j.result = {"error": "not run: --jobs *-rot-* does not select it", "skipped": True, "tasks": {}}
    r = vc.evaluate(["recall"], jobs)["recall"]
    assert r["table"]["auto-eager-fi0.6.14-plugin-recall"]["error"] == "not run: --jobs *-rot-* does not select it"
    assert not r["passed"] and "auto-eager-fi0.6.14-plugin-recall" in r["jobs_failed"]
    rows = _recall_rows(r)
    assert rows[0] == "| job | cache | 2048 | 4096 | not measured |"
    assert "| nvfp4-eager-fi0.6.14-plugin-recall-rot-hadamard | nvfp4, hadamard rotation | 100% | 99% |  |" in rows
    assert "| auto-eager-fi0.6.14-plugin-recall | auto | - | - | not run: --jobs *-rot-* does not select it |" in rows


class _FakeTokenizer:
    """Whitespace tokens -> ids: enough to cut windows the way the job cuts them."""

    def encode(self, text, add_special_tokens=True):
        assert add_special_tokens is False  # windows of plain text, no BOS in the middle of prose
        return [len(w) for w in text.split()]


def test_prose_windows_cut_consecutive_windows_with_the_engines_tokenizer():
    from nvfp4compat.validation import job

    tok = _FakeTokenizer()
    text = " ".join("a" * (i % 7 + 1) for i in range(25))
    wins = job.prose_windows(lambda t: tok.encode(t, add_special_tokens=False), text, 8, 10)
    assert len(wins) == 2 and wins[0] == [i % 7 + 1 for i in range(10)]
    assert wins[1] == [i % 7 + 1 for i in range(10, 20)]
    with pytest.raises(ValueError, match="fewer than one --logprob-prompt-len window of 30"):
        job.prose_windows(lambda t: tok.encode(t, add_special_tokens=False), text, 8, 30)
    # the bundled prose holds several 2K windows even at ~4 characters a token
    prose = job.Path(vc.__file__).resolve().parents[1] / "accuracy" / "data" / "prose.txt"
    from nvfp4compat.validation.runner import PROSE

    assert prose == PROSE and len(PROSE.read_text(encoding="utf-8")) // 4 >= 2 * 2048


def test_real_models_score_prose_and_the_tiny_model_random_ids(tmp_path):
    from nvfp4compat.validation import job

    class FakeLLM:
        def get_tokenizer(self):
            return _FakeTokenizer()

    prose = tmp_path / "prose.txt"
    prose.write_text("one two three four five six seven eight nine ten eleven twelve")
    real = tmp_path / "real"
    real.mkdir()
    spec = {"model": str(real), "logprob_prompts": 3, "logprob_prompt_len": 4, "prose_path": str(prose)}
    source, prompts = job.logprob_prompts(FakeLLM(), spec)
    assert source == "prose" and prompts == [[3, 3, 5, 4], [4, 3, 5, 5], [4, 3, 6, 6]]
    (real / "tiny_model.json").write_text('{"regular_token_range": [10, 20]}')
    source, prompts = job.logprob_prompts(FakeLLM(), {**spec, "logprob_prompt_len": 256})
    assert source == "random" and len(prompts) == 3 and all(10 <= t < 20 for p in prompts for t in p)


def test_ranked_keeps_the_top_k_and_drops_the_prompt_token_outside_it():
    from types import SimpleNamespace as NS

    from nvfp4compat.validation import job

    entries = {5: NS(logprob=-0.1, rank=1), 9: NS(logprob=-2.0, rank=2), 7: NS(logprob=-6.0, rank=40)}
    assert job.ranked(entries, 2) == [(5, -0.1), (9, -2.0)]
    assert job.ranked({5: NS(logprob=-0.1, rank=1)}, 20) == [(5, -0.1)]  # fewer than K


def test_engine_kwargs_serve_a_gguf_file_as_its_own_tokenizer():
    from nvfp4compat.validation import job

    spec = {"model": "/m/SmolLM2.gguf", "kv_cache_dtype": "nvfp4", "gpu_memory_utilization": 0.3,
            "max_model_len": 4096, "mode": "eager"}
    assert job.engine_kwargs(spec)["tokenizer"] == "/m/SmolLM2.gguf"
    assert job.engine_kwargs({**spec, "tokenizer": "/hf/SmolLM2"})["tokenizer"] == "/hf/SmolLM2"


def test_throughput_runs_its_default_engines_before_the_forced_one():
    # the verdict needs NVFP4 and bf16 at vLLM's default settings; the forced FULL-decode engine is a
    # comparison that --budget-s may skip (on 2026-12-03 the bf16 engine, sorted after it, was cut)
    names = [j.name for j in vc.plan_jobs(["throughput"], "0.6.14") if j.kind == "engine"]
    assert names == [
        "nvfp4-default-fi0.6.14-plugin",
        "auto-default-fi0.6.14-plugin",
        "nvfp4-full-decode-optin-fi0.6.14-plugin",
    ]


def test_a_check_whose_jobs_the_budget_skipped_is_incomplete_not_failed():
    """Run R (2026-12-05, H100): a cold machine's NVFP4 engine took 376 s, so the 420 s budget skipped bf16's; check 6
    had only one side. It reads INCOMPLETE with the job and why, not FAIL; a job that ran and failed still fails it."""
    from nvfp4compat.validation.report import summary_md, verdict, verdict_lines

    def jobs_with(nvfp4):
        jobs = vc.plan_jobs(["throughput"], "0.6.14")
        by = {j.name: j for j in jobs}
        by["preflight-fi0.6.14-plugin"].result = _preflight()
        by["nvfp4-default-fi0.6.14-plugin"].result = nvfp4
        skip = {"error": "skipped: the run's budget of 420 s is spent", "skipped": True, "tasks": {}}
        by["auto-default-fi0.6.14-plugin"].result = dict(skip)
        by["nvfp4-full-decode-optin-fi0.6.14-plugin"].result = dict(skip)
        return jobs

    measured = {"tasks": {"start": {"ok": True}, "throughput": {
        "ok": True, "requests": 32, "context": 8192, "decode_tok_s": 8721.3, "prefill_only_s": 0.175,
        "prefill_plus_decode_s": 1.11}}}  # run R's NVFP4 figures
    jobs = jobs_with(measured)
    r = vc.evaluate(["throughput"], jobs)["throughput"]
    assert not r["passed"] and verdict(r) == "INCOMPLETE"
    assert r["incomplete"] == {
        "auto-default-fi0.6.14-plugin": "skipped: the run's budget of 420 s is spent",
        "nvfp4-full-decode-optin-fi0.6.14-plugin": "skipped: the run's budget of 420 s is spent",
    }
    md = summary_md({"throughput": r}, jobs, ["nvfp4compat", "validate"], 418.0)
    assert "**0 of 1 checks pass**; 1 incomplete" in md and "| 6. throughput | INCOMPLETE |" in md
    assert "- not measured: `auto-default-fi0.6.14-plugin`: skipped: the run's budget of 420 s is spent" in md
    # the console's lines (nvfp4compat validate and the bundle's runner print the same)
    lines = verdict_lines({"throughput": r})
    assert lines[0].startswith("INCOMPLETE  throughput: NVFP4 8,721.3 tok/s")
    assert lines[1:] == [f"    not measured: {job}: {why}" for job, why in r["incomplete"].items()]
    # jobs not yet run (a partial report) count as unmeasured too
    pending = vc.plan_jobs(["throughput"], "0.6.14")
    assert verdict(vc.evaluate(["throughput"], pending)["throughput"]) == "INCOMPLETE"
    # the NVFP4 engine ran and failed: FAIL, whatever else was skipped
    for broken in ({"error": "no result file (rc 1)", "tasks": {}},
                   {"tasks": {"start": {"ok": False, "error": "CUDA error"}}},
                   {"timed_out": True, "tasks": {"start": {"ok": True}}}):
        r = vc.evaluate(["throughput"], jobs_with(broken))["throughput"]
        assert verdict(r) == "FAIL" and "incomplete" not in r, broken
    # every job ran: a verdict, never incomplete
    for j in jobs:
        if j.result and j.result.get("skipped"):
            j.result = measured
    r = vc.evaluate(["throughput"], jobs)["throughput"]
    assert r["passed"] and verdict(r) == "PASS"


def test_recall_check_states_the_resolution_of_its_verdict():
    """At 5 needles a depth (50 a length) one needle is 2 points: the check says so, in its note and
    in the summary figure, so a single miss reads as what it is; at 100 a length it says nothing."""
    from nvfp4compat.validation.report import headline

    jobs = vc.plan_jobs(["recall"], "0.6.14")

    def run(per_length, nv_8k):
        for j in jobs:
            rec = {"2048": 1.0, "4096": 1.0, "8192": 1.0 if j.kv in ("auto", "fp8") else nv_8k}
            j.result = _engine_result(recall=rec)
            j.result["tasks"]["recall"]["prompts"] = 3 * per_length
        return vc.evaluate(["recall"], jobs)["recall"]

    coarse = run(50, 0.98)
    assert not coarse["passed"] and coarse["worst_points_below_bf16"] == pytest.approx(2.0)
    assert coarse["needles_per_length"] == 50 and coarse["points_per_needle"] == pytest.approx(2.0)
    assert "one needle is 2 points" in coarse["note"] and "--recall-per-depth 10" in coarse["note"]
    assert "one needle = 2 points" in headline("recall", coarse)
    fine = run(100, 0.99)
    assert fine["passed"] and fine["points_per_needle"] == pytest.approx(1.0)
    assert "one needle is" not in fine["note"]
