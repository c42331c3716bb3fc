"""Replays every recording of the corpus with `vramroom replay` and compares with PyTorch.

    python3 scripts/corpus/check.py VRAMROOM_BIN SNAPSHOT_DIR [RESULTS.jsonl ...] [--only SUBSTR]

For each recording: the replay under the recording's own config against PyTorch's own figures
(peak allocated, peak reserved, OOM count) and the trace's own sequence of device allocations
(segment_alloc / segment_map sizes); for each deterministic workload, the default recording
replayed under every other config against that config's recording. Prints one line a
comparison, then a summary; exit 1 when anything differs.
"""
import json
import os
import pickle
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# Runs whose client requests depend on more than the program: thread interleaving, GPU
# timing of record_stream frees, OOMs the program reacts to, inductor's choices per config.
NONDET = {"multithread_infer", "ddp_gloo_2rank", "side_stream_record_stream", "oom_recover",
          "compile_reduce_overhead"}
CONFS = {"default": "", "expandable": "expandable_segments:True",
         "msplit128": "max_split_size_mb:128", "rp2div4": "roundup_power2_divisions:4"}


def recorded_segments(path):
    d = pickle.load(open(path, "rb"))
    tr = next((t for t in d["device_traces"] if t), [])
    return [e["size"] for e in tr if e["action"] in ("segment_alloc", "segment_map")]


def replay(hr, path, conf=None, capacity=None):
    cmd = [hr, "replay", path, "--json"]
    if conf is not None:
        cmd += ["--alloc-conf", conf or "default"]
    if capacity:
        cmd += ["--capacity", str(capacity)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        return {"error": p.stderr.strip()[-300:]}
    return json.loads(p.stdout)[0]


def main():
    args = [a for a in sys.argv[1:]]
    only = None
    if "--only" in args:
        i = args.index("--only")
        only = args[i + 1]
        del args[i:i + 2]
    hr, snaps = args[0], args[1]
    files = args[2:] or [os.path.join(os.path.dirname(HERE), "corpus-results", "2026-12-03-h200-a",
                                      "corpus_results.jsonl")]
    recs = {}
    for f in files:
        for ln in open(f):
            r = json.loads(ln)
            if "stats" in r:
                recs[r["job"]] = r
    bad = total = 0

    def cmp(label, got, want_pa, want_pr, want_segs, want_ooms):
        nonlocal bad, total
        total += 1
        if "error" in got:
            bad += 1
            print(f"ERROR {label}: {got['error']}")
            return
        segs = got.get("segment_sizes")
        ok_pa = got["peak_allocated_bytes"] == want_pa
        ok_pr = got["peak_reserved_bytes"] == want_pr
        ok_sg = want_segs is None or segs == want_segs
        ok_oo = want_ooms is None or got.get("num_ooms") == want_ooms
        ok = ok_pa and ok_pr and ok_sg and ok_oo
        bad += not ok
        d = lambda a, b: f"{(a - b) / max(b, 1) * 100:+.2f}%"
        parts = [f"alloc {'=' if ok_pa else d(got['peak_allocated_bytes'], want_pa)}",
                 f"reserved {'=' if ok_pr else d(got['peak_reserved_bytes'], want_pr)}",
                 "segments " + ("=" if ok_sg else f"{len(segs)} vs {len(want_segs)}")]
        if not ok_oo:
            parts.append(f"ooms {got.get('num_ooms')} vs {want_ooms}")
        print(("ok    " if ok else "DIFF  ") + f"{label:60s} " + " ".join(parts))

    for job, r in sorted(recs.items()):
        if only and only not in job:
            continue
        path = os.path.join(snaps, r["snapshot"])
        if not os.path.exists(path):
            continue
        st = r["stats"]
        cap = None
        cmp(f"{job} (own config)", replay(hr, path, capacity=cap), st["allocated_bytes.all.peak"],
            st["reserved_bytes.all.peak"], recorded_segments(path), st["num_ooms"])
        w = r.get("workload")
        if job.endswith("__default") and w not in NONDET and "rank" not in job:
            for cname, conf in CONFS.items():
                if cname == "default":
                    continue
                other = recs.get(f"{w}__{cname}")
                if not other:
                    continue
                opath = os.path.join(snaps, other["snapshot"])
                ost = other["stats"]
                cmp(f"{w} default -> {cname}", replay(hr, path, conf, capacity=cap),
                    ost["allocated_bytes.all.peak"], ost["reserved_bytes.all.peak"],
                    recorded_segments(opath) if os.path.exists(opath) else None, ost["num_ooms"])
    print(f"{total - bad} of {total} comparisons exact")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
