"""The capacity sweep alone, from an earlier --all run's results (its default peaks R):

    python sweep_only.py RESULTS.jsonl OUT_DIR [--jobs 6] [--budget 300] [--caps cap0.95,cap1.10]

Same runs as record_real.py's phase 2 (a fresh child per program and capacity, no history);
OUT_DIR/results.jsonl gets one row per run."""
import argparse
import concurrent.futures as cf
import json
import os
import time

import record_real as rr

ap = argparse.ArgumentParser()
ap.add_argument("results")
ap.add_argument("out")
ap.add_argument("--jobs", type=int, default=6)
ap.add_argument("--budget", type=float, default=300)
ap.add_argument("--caps", default="cap0.95,cap1.00p2m,cap1.10,cap0.80")
a = ap.parse_args()
os.makedirs(a.out, exist_ok=True)
base = {}
for line in open(a.results):
    r = json.loads(line)
    if r["conf"] == "default" and r.get("oom") is False and r.get("peak_reserved_bytes"):
        base[r["program"]] = r["peak_reserved_bytes"]
done = set()
for line in open(a.results):
    r = json.loads(line)
    if r.get("oom") is not None and r["conf"].startswith("cap"):
        done.add((r["program"], r["conf"]))
sweep = {n: (f, plus) for n, f, plus in rr.SWEEP}
tasks = [(p, n) for n in a.caps.split(",") for p in sorted(base) if (p, n) not in done]
ns = argparse.Namespace(out=a.out, stacks="none", context="alloc", timeout=120, jobs=a.jobs)
deadline = time.time() + a.budget
out = open(os.path.join(a.out, "results.jsonl"), "w")


def one(t):
    p, n = t
    if time.time() > deadline:
        return None
    f, plus = sweep[n]
    return rr.spawn(ns, p, n, capacity=int(base[p] * f) + plus, no_snapshot=True)


with cf.ThreadPoolExecutor(a.jobs) as ex:
    for r in ex.map(one, tasks):
        if r is not None:
            out.write(json.dumps(r) + "\n")
            out.flush()
            print(r["program"], r["conf"], r.get("oom"), r.get("error"), flush=True)
print("sweep_only: %d tasks" % len(tasks))
