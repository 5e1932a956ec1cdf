"""Print a bench_attention JSON as: shape | row | ms | vs the default in % | vs FlashInfer bf16."""
import json, re, sys
d = json.load(open(sys.argv[1])); print(d["env"])
base, fi = {}, {}
for x in d["rows"]:
    c = str(x["config"])
    if c.startswith("default"): base[x["shape"]] = x["ms_graph"]
    if "bf16" in x["impl"] and x["impl"].startswith("Flash"): fi[x["shape"]] = x["ms_graph"]
for x in d["rows"]:
    c, s = str(x["config"]), x["shape"]
    if x["impl"].startswith("Flash"): tag = x["impl"][25:]
    elif c.startswith("default"): tag = "DEFAULT"
    elif c.startswith("knob"): tag = c
    else:
        tag = " ".join(k for k in re.findall(r"(tile_pairs=True|defer_sum=True|ring=[1-9]|num_warps=[12]|min_chunk_tokens=\d+|maxnreg=\d+)", c))
    ms = x["ms_graph"]
    print(f"{s[:24]:24} {tag[:48]:48} {ms:.4f} {100 * (ms / base[s] - 1):+6.1f}% {ms / fi[s]:.3f}x")
