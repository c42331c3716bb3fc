"""Records the whole real-snapshot corpus on the GPU machine, several recordings at a time.

    python3 scripts/corpus/record_all.py OUT_DIR [--jobs 10] [--deadline 480] [--only a,b]

Every workload of workloads.py under four allocator configs (default, expandable_segments:True,
max_split_size_mb:128, roundup_power2_divisions:4), recorded with PyTorch's default recording
arguments, plus extra recording arguments on two workloads (probe settings, alloc-only stacks,
no stacks, a wrapping ring buffer). Each recording is its own process with its own inductor and
Triton caches, so runs under different configs make the same requests. Writes
OUT_DIR/results.jsonl (one line a recording, `job` naming it) and OUT_DIR/snapshots/*.pickle.
Jobs not started by --deadline seconds are listed as skipped, so the call ends in time.
"""
import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

CONFIGS = [
    ("default", ""),
    ("expandable", "expandable_segments:True"),
    ("msplit128", "max_split_size_mb:128"),
    ("rp2div4", "roundup_power2_divisions:4"),
]
EXTRA_RECORD = [
    ("probe", {"context": "all", "stacks": "python"}),
    ("alloc", {"context": "alloc", "stacks": "python"}),
    ("nostack", {"context": None}),
    ("ring2000", {"max_entries": 2000}),
]
EXTRA_ON = ["hf_bert_varlen_infer", "graph_manual_resnet18"]


def jobs(only):
    import workloads

    out = []
    for w in workloads.ALL:
        if only and w not in only:
            continue
        for cname, conf in CONFIGS:
            out.append((f"{w}__{cname}", w, conf, {}))
        if w in EXTRA_ON:
            for rname, rec in EXTRA_RECORD:
                out.append((f"{w}__default__{rname}", w, "", rec))
    # the slow ones first, so the deadline cuts cheap jobs
    slow = ("compile_", "hf_", "ddp_")
    out.sort(key=lambda j: (not j[1].startswith(slow),))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--jobs", type=int, default=10)
    ap.add_argument("--deadline", type=float, default=480)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    snaps = os.path.join(a.out, "snapshots")
    os.makedirs(snaps, exist_ok=True)
    results = open(os.path.join(a.out, "results.jsonl"), "a")
    lock = threading.Lock()
    start = time.time()

    def emit(rec):
        with lock:
            results.write(json.dumps(rec) + "\n")
            results.flush()
            print(json.dumps(rec)[:300], flush=True)

    def run(job):
        name, w, conf, rec = job
        if time.time() - start > a.deadline:
            emit({"job": name, "skipped": "deadline"})
            return
        env = dict(os.environ)
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        if not conf:
            env.pop("PYTORCH_CUDA_ALLOC_CONF")
        cache = tempfile.mkdtemp(prefix="ind_")
        env["TORCHINDUCTOR_CACHE_DIR"] = cache
        env["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
        out = os.path.join(snaps, name + ".pickle")
        t0 = time.time()
        try:
            p = subprocess.run([sys.executable, os.path.join(HERE, "record.py"), w, out,
                                "--record", json.dumps(rec)], env=env, capture_output=True,
                               text=True, timeout=300)
        except subprocess.TimeoutExpired:
            emit({"job": name, "error": "timeout after 300 s"})
            return
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if p.returncode != 0 or not lines:
            emit({"job": name, "error": f"exit {p.returncode}", "stderr": p.stderr[-1500:]})
            return
        for ln in lines:
            r = json.loads(ln)
            r["job"] = name if "rank" not in r else f"{name}.rank{r['rank']}"
            r["workload"] = w
            r["seconds_total"] = round(time.time() - t0, 1)
            emit(r)

    with cf.ThreadPoolExecutor(a.jobs) as ex:
        list(ex.map(run, jobs(set(filter(None, a.only.split(","))))))
    print(f"corpus done in {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
