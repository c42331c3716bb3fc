"""A run d's predictions recomputed from its gentle runs' snapshots by the current code, with
the observations left as the GPU saw them (issue 32: a model changed after a run is checked
against that run's ramps without the GPU; a later run checks it live).

    python3 scripts/services/repredict_d.py RUN_DIR OUT_DIR [--binary PATH]

RUN_DIR holds run_d.jsonl, HEADER and gentle.tar.xz (gpu_run_d.sh and pack_gentle.py).
PATH: the repredict example (default target/release/examples/repredict; build it with
`cargo build --release -p vramroom-load --example repredict`). OUT_DIR gets run_d.jsonl (the
same records, each prediction replaced, every ramp's verdict redone, "repredicted" naming the
commit) and a HEADER that names both commits.
"""
import json
import os
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import collect_d  # noqa: E402


def commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=HERE).stdout.strip() or "?"
    except OSError:
        return "?"


def main():
    run, out = sys.argv[1], sys.argv[2]
    binary = (sys.argv[sys.argv.index("--binary") + 1] if "--binary" in sys.argv
              else "target/release/examples/repredict")
    tmp = tempfile.mkdtemp(prefix="repredict_")
    with tarfile.open(os.path.join(run, "gentle.tar.xz")) as t:
        t.extractall(tmp, filter="data")
    c = commit()
    recs = [json.loads(l) for l in open(os.path.join(run, "run_d.jsonl")) if l.strip()]
    for rec in recs:
        name = rec["service"]
        d = os.path.join(tmp, name)
        p = subprocess.run([binary, os.path.join(d, "results.json"),
                            os.path.join(d, "gentle.pickle")], capture_output=True, text=True)
        if p.returncode != 0:
            rec["repredicted"] = {"commit": c, "error": p.stderr[-400:]}
            continue
        pred = json.loads(p.stdout)
        by = {}
        for dev in pred.get("devices") or []:
            for cp in dev.get("configs") or []:
                key = cp.get("alloc_conf") or "default"
                v = cp.get("first_oom_concurrency")
                by[key] = v if key not in by else (
                    v if by[key] is None else by[key] if v is None else min(by[key], v))
        first = pred.get("first_oom_concurrency")
        rec["repredicted"] = {"commit": c, "was": rec.get("predicted_first_oom"),
                              "was_by_config": rec.get("predicted_by_config")}
        rec["predicted_first_oom"] = first
        rec["predicted_by_config"] = by
        rec["prediction_notes"] = pred.get("notes") or []
        for r in rec.get("ramps") or []:
            r["predicted"] = first
        if rec.get("what_if_ramp"):
            rec["what_if_ramp"]["predicted"] = by.get(rec.get("other_config"))
        collect_d.judge(rec)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "run_d.jsonl"), "w") as f:
        for rec in recs:
            f.write(json.dumps(rec) + "\n")
    head = open(os.path.join(run, "HEADER")).read()
    with open(os.path.join(out, "HEADER"), "w") as f:
        f.write("Predictions recomputed at commit %s by scripts/services/repredict_d.py from %s "
                "(its gentle runs' snapshots); observations as that run saw them.\n" % (c, run))
        f.write(head)
    for rec in recs:
        print("%-12s pred %-5s (was %-5s) observed %-12s within %s" % (
            rec["service"], rec.get("predicted_first_oom"),
            (rec.get("repredicted") or {}).get("was"), rec.get("observed_first_ooms"),
            rec.get("within_one_step_count")))


if __name__ == "__main__":
    main()
