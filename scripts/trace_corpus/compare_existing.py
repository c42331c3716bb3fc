"""The tracer against the project's existing real GPU recordings (H200, torch 2.11.0+cu130):
every workload of scripts/corpus/workloads.py traced on fake CUDA (no GPU, --gpu h200),
replayed under each allocator config the real corpus was recorded with, and compared with
the real run's memory_stats() (scripts/corpus-results/2026-12-03-h200-a/corpus_results.jsonl).

    PYTHONPATH=python python scripts/trace_corpus/compare_existing.py \\
        [--bin target/release/vramroom] [--out scripts/trace_corpus/results] [--only W ...]

Writes OUT/existing-corpus.jsonl (one row per workload and config) and OUT/existing-corpus.md.
Workloads the tracer must refuse (CUDA graphs, torch.compile) are listed with its message;
multi-threaded and multi-process ones are listed as not traced (see the notes in the report).
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
REAL = os.path.join(REPO, "scripts", "corpus-results", "2026-12-03-h200-a", "corpus_results.jsonl")
CONFS = {"default": "", "expandable": "expandable_segments:True",
         "msplit128": "max_split_size_mb:128", "rp2div4": "roundup_power2_divisions:4"}
NOT_TRACED = {
    "multithread_infer": "worker threads: FakeTensorMode is per thread (not propagated yet)",
    "ddp_gloo_2rank": "two processes with a gloo process group (fake process groups: later)",
    "oom_recover": "the program catches its own OOM and changes course; a trace has no OOM to raise",
}

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, %(corpus)r)
import torch
import workloads
import vramroom.trace as vt
from vramroom.trace import UnsupportedOp
t0 = time.perf_counter()
try:
    with vt.trace(gpu="h200") as t:
        getattr(workloads, %(w)r)("cuda")
except UnsupportedOp as e:
    print("\n" + json.dumps({"refused": str(e), "op": e.op})); sys.stdout.flush(); os._exit(0)
dt = time.perf_counter() - t0
t.snapshot(%(snap)r)
print("\n" + json.dumps({"trace_s": round(dt, 3), "events": len(t.events), "warnings": t.warnings,
                         "hidden": t.hidden_stats}))
sys.stdout.flush()
os._exit(0)
"""


def real_rows():
    rows = {}
    for line in open(REAL):
        r = json.loads(line)
        snap = r["snapshot"][:-len(".pickle")]
        parts = snap.split("__")
        if len(parts) != 2 or parts[1] not in CONFS:
            continue  # the recording-mode variants (alloc, ring, probe, nostack) and ranks
        rows[(parts[0], parts[1])] = r
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("VRAMROOM_BIN", os.path.join(REPO, "target", "release", "vramroom")))
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--traced", default="/tmp/vramroom-existing-traced")
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.traced, exist_ok=True)
    real = real_rows()
    workloads = sorted({w for w, _ in real})
    if a.only:
        workloads = [w for w in workloads if w in a.only]
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    out_rows = []
    for w in workloads:
        if w in NOT_TRACED:
            out_rows.append({"workload": w, "status": "not traced", "why": NOT_TRACED[w]})
            print("%-28s not traced: %s" % (w, NOT_TRACED[w]), flush=True)
            continue
        snap = os.path.join(a.traced, w + ".pickle")
        code = CHILD % {"corpus": os.path.join(REPO, "scripts", "corpus"), "w": w, "snap": snap}
        t0 = time.time()
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
        try:
            info = json.loads(p.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            msg = (p.stderr.strip().splitlines() or ["?"])[-1]
            out_rows.append({"workload": w, "status": "error", "why": msg})
            print("%-28s ERROR %s" % (w, msg), flush=True)
            continue
        if "refused" in info:
            out_rows.append({"workload": w, "status": "refused", "why": info["refused"], "op": info["op"]})
            print("%-28s refused (%s)" % (w, info["op"]), flush=True)
            continue
        for conf, ac in CONFS.items():
            r = real.get((w, conf))
            if r is None:
                continue
            cap = int(r["total_memory"] * (r.get("fraction") or 1.0))
            q = subprocess.run([a.bin, "replay", "--json", snap, "--alloc-conf", ac or "default",
                                "--capacity", str(cap)], capture_output=True, text=True, env=env)
            if q.returncode != 0:
                out_rows.append({"workload": w, "conf": conf, "status": "replay error", "why": q.stderr.strip()[-300:]})
                continue
            rep = json.loads(q.stdout)[0]
            ra, rr = r["stats"]["allocated_bytes.all.peak"], r["stats"]["reserved_bytes.all.peak"]
            pa, pr = rep["peak_allocated_bytes"], rep["peak_reserved_bytes"]
            row = {"workload": w, "conf": conf, "status": "ok", "real_alloc": ra, "real_reserved": rr,
                   "traced_alloc": pa, "traced_reserved": pr,
                   "err_alloc": (pa - ra) / ra, "err_reserved": (pr - rr) / rr,
                   "pass_alloc_1pct": abs(pa - ra) <= 0.01 * ra, "pass_reserved_2pct": abs(pr - rr) <= 0.02 * rr,
                   "trace_s": info["trace_s"], "real_s": r.get("seconds_workload"),
                   "warnings": info["warnings"], "hidden": info["hidden"]}
            out_rows.append(row)
            print("%-28s %-10s alloc %+7.2f%%  reserved %+7.2f%%  (trace %.1fs, real %.1fs)" % (
                w, conf, 100 * row["err_alloc"], 100 * row["err_reserved"], info["trace_s"],
                r.get("seconds_workload") or 0), flush=True)
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    with open(os.path.join(a.out, "existing-corpus.jsonl"), "w") as f:
        for r in out_rows:
            f.write(json.dumps(dict(r, commit=commit)) + "\n")
    ok = [r for r in out_rows if r["status"] == "ok"]
    mib = lambda n: "%.1f" % (n / 2**20)
    md = ["# Tracer vs the existing real H200 recordings", "",
          "Generated by `scripts/trace_corpus/compare_existing.py` at commit %s: each workload of "
          "`scripts/corpus/workloads.py` traced on fake CUDA with no GPU (`--gpu h200`), replayed "
          "by `vramroom replay` under the config it was recorded with, against the real run's "
          "`memory_stats()` peaks (`scripts/corpus-results/2026-12-03-h200-a/corpus_results.jsonl`, "
          "H200, torch 2.11.0+cu130). Pass: allocated within 1%%, reserved within 2%%." % commit, "",
          "| workload | config | real alloc MiB | traced alloc MiB | err | real reserved MiB | traced reserved MiB | err | pass | trace s | real s |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in ok:
        md.append("| %s | %s | %s | %s | %+.2f%% | %s | %s | %+.2f%% | %s | %.1f | %s |" % (
            r["workload"], r["conf"], mib(r["real_alloc"]), mib(r["traced_alloc"]), 100 * r["err_alloc"],
            mib(r["real_reserved"]), mib(r["traced_reserved"]), 100 * r["err_reserved"],
            "yes" if r["pass_alloc_1pct"] and r["pass_reserved_2pct"] else "no", r["trace_s"],
            r["real_s"] if r["real_s"] is not None else "-"))
    md += ["", "%d of %d rows pass both bounds." % (
        sum(1 for r in ok if r["pass_alloc_1pct"] and r["pass_reserved_2pct"]), len(ok)), ""]
    md += ["Not compared:", ""]
    for r in out_rows:
        if r["status"] != "ok":
            md.append("- %s%s: %s — %s" % (r["workload"], (" " + r["conf"]) if r.get("conf") else "", r["status"], r["why"]))
    with open(os.path.join(a.out, "existing-corpus.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md[-(len(out_rows) - len(ok) + 4):]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
