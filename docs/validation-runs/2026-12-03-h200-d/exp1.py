"""Device experiment: new decode/prefill (page scan, blocked merge) vs HEAD 8c0e169, config variants."""
import dataclasses, importlib.util, json, os, sys, time
import torch, triton.testing
sys.path.insert(0, "benchmarks")
import bench_attention as ba
from nvfp4compat.kernels.triton import attention as att

def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec); sys.modules[name] = m; spec.loader.exec_module(m); return m

head = load("att_head", ".gpu/att_head.py")
old = load("att_73fa462", ".gpu/att_base_73fa462.py")
sel = sys.argv[1].split(",") if len(sys.argv) > 1 else ["decode", "prefill", "mixed"]
out_json = os.environ.get("OUTJ", "exp1.json")
rows = []

def timeit(fn):
    return float(triton.testing.do_bench_cudagraph(fn, rep=60, return_mode="median"))

def knob(mod, **kv):
    class K:
        def __enter__(s):
            s.saved = {k: getattr(mod, k) for k in kv}
            for k, v in kv.items(): setattr(mod, k, v)
        def __exit__(s, *a):
            for k, v in s.saved.items(): setattr(mod, k, v)
    return K()

for s in ba._full_shapes():
    if not any(x in s.name for x in sel):
        continue
    case = ba.Case(s, torch.device("cuda"), 0, fp8=False)
    ref = case.reference("nvfp4")
    args = (case.nv_data, case.nv_sf, case.block_table, case.seq_lens)
    ks, vs = case.nv_scales
    if s.kind == "decode":
        call = lambda m: (lambda: m.decode(case.q, *args, ks, vs, sm_scale=case.sm_scale))
        D = att.DecodeConfig
        variants = [("head", head, None, {}), ("new", att, None, {}),
                    ("new pps2", att, dict(decode=D(128, 4, 2, programs_per_sm=2)), {}),
                    ("new st3 pps2", att, dict(decode=D(128, 4, 3, programs_per_sm=2)), {}),
                    ("new min256", att, None, {"SPLIT_MIN_CHUNK_TOKENS": 256}),
                    ("new min128", att, None, {"SPLIT_MIN_CHUNK_TOKENS": 128}),
                    ("new bn64 w4 st3 pps3", att, dict(decode=D(64, 4, 3, programs_per_sm=3)), {})]
    else:
        call = lambda m: (lambda: m.prefill(case.q, *args, case.qsl, ks, vs, sm_scale=case.sm_scale))
        variants = [("73fa462", old, None, {}), ("head", head, None, {}), ("new", att, None, {})]
    for label, m, over, knobs in variants:
        try:
            with knob(m, **knobs), (m.override_configs(**over) if over else knob(m)):
                fn = call(m)
                o = fn(); torch.cuda.synchronize()
                err = ba._err(o, ref)
                ms = timeit(fn)
        except Exception as exc:
            print(f"{s.name:40s} {label:22s} FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        gbs = case.nvfp4_bytes / ms / 1e6
        print(f"{s.name:40s} {label:22s} {ms:8.4f} ms  {gbs:7.0f} GB/s  err {err:.2e}", flush=True)
        rows.append(dict(shape=s.name, variant=label, ms=ms, gbs=gbs, err=err))
    del case
    torch.cuda.empty_cache()
json.dump(rows, open(out_json, "w"), indent=1)
