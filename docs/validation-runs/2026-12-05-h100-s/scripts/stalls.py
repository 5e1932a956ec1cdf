"""Where a Gluon decode kernel's warps stall, per SASS line, from `ncu --import R.ncu-rep --page source --csv
--print-source sass` (calls 12 and 13 of run S). For each file: stall samples per reason; the long-scoreboard samples
grouped by the global load that the stalled instruction waits on (found by scanning back for the load that wrote one
of its source registers); the instructions with the most long-scoreboard, barrier and short-scoreboard samples; and
how many BAR / LDGSTS instructions ran. Usage: python3 stalls.py FILE.csv[.xz] ..."""
import csv
import lzma
import re
import sys

LINE = re.compile(r"(@!?U?P\w+\s+)?(\S+)\s*(.*)")


def num(v):
    return float(v) if v not in ("", "-") else 0.0


def load(path):
    f = lzma.open(path, "rt") if path.endswith(".xz") else open(path)
    rows = list(csv.reader(f))
    hdr = rows[1]
    idx = {h: i for i, h in enumerate(hdr)}
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    ins = []
    for r in rows[2:]:
        if len(r) < len(hdr):
            continue
        ins.append({"src": r[1].strip(), "ex": num(r[idx["Instructions Executed"]]),
                    **{k[6:]: num(r[idx[k]]) for k in reasons}})
    return ins, [k[6:] for k in reasons]


def producer(ins, i):
    m = LINE.match(ins[i]["src"])
    op, parts = m.group(2), [p.strip() for p in m.group(3).split(",")]
    srcs = parts if op.startswith(("ST", "BAR", "BRA", "LDGSTS")) else parts[1:]
    want = {int(r) for p in srcs for r in re.findall(r"\bR(\d+)", p)}
    for j in range(i - 1, max(i - 600, -1), -1):
        m2 = LINE.match(ins[j]["src"])
        if m2 and m2.group(2).startswith(("LDG", "LDS", "LDL", "LDC", "S2R")):
            d = re.match(r"R(\d+)", m2.group(3).split(",")[0].strip())
            if d:
                width = 4 if ".128" in m2.group(2) else 2 if ".64" in m2.group(2) else 1
                if want & set(range(int(d.group(1)), int(d.group(1)) + width)):
                    return m2.group(2)
    return "(no load found: another producer)"


for path in sys.argv[1:]:
    ins, reasons = load(path)
    tot = {k: sum(x[k] for x in ins) for k in reasons}
    n = sum(tot.values())
    print(f"== {path}: {len(ins)} SASS lines, {n:.0f} stall samples")
    print("   " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(tot.items(), key=lambda kv: -kv[1]) if v >= 100))
    by = {}
    for i, x in enumerate(ins):
        if x["long_sb"] > 0:
            k = producer(ins, i)
            by[k] = by.get(k, 0) + x["long_sb"]
    for k, v in sorted(by.items(), key=lambda kv: -kv[1])[:5]:
        print(f"   long_sb {v:6.0f} ({v / tot['long_sb']:.1%}) waiting on {k}")
    for k in ("long_sb", "barrier", "short_sb"):
        top = sorted(ins, key=lambda x: -x[k])[:3]
        print(f"   top {k}: " + "; ".join(f"{x['src'][:44]} ({x[k]:.0f})" for x in top))
    print(f"   executed: BAR {sum(x['ex'] for x in ins if x['src'].startswith('BAR')):.0f}, LDGSTS "
          f"{sum(x['ex'] for x in ins if 'LDGSTS' in x['src']):.0f}, all {sum(x['ex'] for x in ins):.0f}")
