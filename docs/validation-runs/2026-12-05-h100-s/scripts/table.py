"""Print a bench_attention JSON (complete or cut off) as: shape | row | ms | vs the default in % | vs FlashInfer bf16."""
import json, re, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    sys.exit(f"table.py: {sys.argv[1]}: {e}")
print(d["env"], "" if d.get("complete", True) else "(CUT OFF: the shapes done so far)")
base, fi = {}, {}
for x in d["rows"]:
    c = str(x["config"])
    if c.startswith("default"): base[x["shape"]] = x["ms_graph"]
    if "bf16" in x["impl"] and x["impl"].startswith("Flash"): fi[x["shape"]] = x["ms_graph"]
for x in d["rows"]:
    c, s, ms = str(x["config"]), x["shape"], x["ms_graph"]
    if x["impl"].startswith("Flash"): tag = x["impl"][25:]
    elif c.startswith("default"): tag = "DEFAULT"
    elif c.startswith("knob"): tag = c
    else:
        tag = " ".join(re.findall(r"(tma_loader=True|tile_pairs=True|defer_sum=True|ring=[1-9]|num_warps=[12]|min_chunk_tokens=\d+|maxnreg=\d+)", c))
    if ms is None:
        print(f"{s[:24]:24} {tag[:48]:48} -- {x.get('note', '')[:80]}"); continue
    vs_d = f"{100 * (ms / base[s] - 1):+6.1f}%" if base.get(s) else "   -  "
    vs_f = f"{ms / fi[s]:.3f}x" if fi.get(s) else "-"
    print(f"{s[:24]:24} {tag[:48]:48} {ms:.4f} {vs_d} {vs_f}")
