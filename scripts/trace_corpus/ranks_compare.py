"""The tracer's ranks against ranks_real.py's one-GPU runs of the same per-rank shapes.

    PYTHONPATH=python python scripts/trace_corpus/ranks_compare.py \
        --real scripts/trace_corpus/ranks_real --out scripts/trace_corpus/results/ranks_h100

For each program and world size recorded for real, `python -m vramroom.trace.ranks
--world-size N --in-process` traces every rank on fake CUDA (no GPU), and `vramroom replay
rankR.pickle --json --capacity TOTAL` gives each traced rank's peaks, set beside the real
rank's memory_stats peaks: the issue's marks, 1% on peak allocated and 2% on peak reserved.
Writes OUT.jsonl and OUT.md.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from compare import mib, pct, rel, replay  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--real", required=True, help="folder with ranks.jsonl")
    ap.add_argument("--out", required=True, help="path prefix for .jsonl and .md")
    ap.add_argument("--traced", default="/tmp/ranks_traced")
    ap.add_argument("--binary", default=os.environ.get("VRAMROOM_BIN", "target/release/vramroom"))
    a = ap.parse_args()
    real = [json.loads(l) for l in open(os.path.join(a.real, "ranks.jsonl")) if l.strip()]
    jobs = sorted({(r["program"], r["world_size"], r.get("prog_args", "")) for r in real})
    rows = []
    for prog, n, args in jobs:
        d = os.path.join(a.traced, "%s_ws%d" % (prog, n))
        cmd = [sys.executable, "-m", "vramroom.trace.ranks", "--world-size", str(n), "--out", d,
               "--in-process", "--json", "--", os.path.join(HERE, "programs", prog + ".py")]
        cmd += args.split()
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            print("%s ws%d: trace failed: %s" % (prog, n, p.stderr[-400:]), file=sys.stderr)
        for r in (x for x in real if x["program"] == prog and x["world_size"] == n):
            snap = os.path.join(d, "rank%d.pickle" % r["rank"])
            t = replay(a.binary, snap, "", r.get("total_memory")) if os.path.exists(snap) else {}
            ra, rv = r.get("peak_allocated_bytes"), r.get("peak_reserved_bytes")
            ta, tv = t.get("peak_allocated_bytes"), t.get("peak_reserved_bytes")
            ea, ev = rel(ta, ra), rel(tv, rv)
            rows.append({
                "program": prog, "world_size": n, "rank": r["rank"], "prog_args": args,
                "real_error": r.get("error"),
                "real_peak_allocated": ra, "real_peak_reserved": rv,
                "traced_peak_allocated": ta, "traced_peak_reserved": tv,
                "rel_err_allocated": ea, "rel_err_reserved": ev,
                "pass": None if r.get("error") or ea is None or ev is None
                else abs(ea) <= 0.01 and abs(ev) <= 0.02,
            })
    with open(a.out + ".jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    L = ["| program | world size | rank | real alloc MiB | traced | err | real reserved MiB | traced | err | within 1%/2% |",
         "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["real_error"]:
            L.append("| %s | %d | %d | real run failed: %s | | | | | | - |" % (
                r["program"], r["world_size"], r["rank"], r["real_error"][:80].replace("|", "/")))
            continue
        L.append("| %s | %d | %d | %s | %s | %s | %s | %s | %s | %s |" % (
            r["program"], r["world_size"], r["rank"], mib(r["real_peak_allocated"]),
            mib(r["traced_peak_allocated"]), pct(r["rel_err_allocated"]),
            mib(r["real_peak_reserved"]), mib(r["traced_peak_reserved"]),
            pct(r["rel_err_reserved"]), "yes" if r["pass"] else "no"))
    ok = [r for r in rows if r["pass"] is not None]
    L.append("")
    L.append("%d of %d ranks within 1%% (allocated) and 2%% (reserved)." % (
        sum(1 for r in ok if r["pass"]), len(ok)))
    open(a.out + ".md", "w").write("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
