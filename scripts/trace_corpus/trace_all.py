"""Traces every corpus program on fake CUDA (no GPU): one fresh process per program
(vramroom.trace.run_script), snapshots into OUT/PROG__default.pickle and the trace times
into OUT/times.json, for compare.py.

    PYTHONPATH=python python scripts/trace_corpus/trace_all.py --out /tmp/traced [--gpu h100]
        [--jobs 2] [--only PROG ...]

A program the tracer refuses (exit 2: an op it cannot model) is listed with the message.
"""
import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = os.path.join(HERE, "programs")


def run(prog, a):
    out = os.path.join(a.out, prog + "__default.pickle")
    code = ("import json, sys, time; import vramroom.trace as vt; t0 = time.perf_counter(); "
            "t = vt.run_script(%r, [], gpu=%r, snapshot_out=%r); "
            "print('\\n' + json.dumps({'trace_seconds': round(time.perf_counter() - t0, 3), "
            "'peak_allocated': t.peak_allocated, 'events': len(t.events), "
            "'warnings': t.warnings, 'hidden': t.hidden_stats})); "
            "import os; sys.stdout.flush(); os._exit(0)"
            % (os.path.join(PROGRAMS, prog + ".py"), a.gpu, out))
    cmd = [sys.executable, "-c", code]
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    # The child runs in PROGRAMS: a relative PYTHONPATH entry (PYTHONPATH=python) would
    # miss there and an installed vramroom would be traced instead of the checkout's.
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")]
        + [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    t0 = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=PROGRAMS, timeout=a.timeout)
    except subprocess.TimeoutExpired:
        return prog, 124, time.time() - t0, None, "timed out after %ds" % a.timeout
    wall = time.time() - t0
    rep = None
    if r.returncode == 0:
        try:
            rep = json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, json.JSONDecodeError):
            rep = None
    return prog, r.returncode, wall, rep, r.stderr[-2000:]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--timeout", type=int, default=600)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    progs = sorted(f[:-3] for f in os.listdir(PROGRAMS) if f.endswith(".py") and not f.startswith("_"))
    if a.only:
        progs = [p for p in progs if p in a.only]
    tp = os.path.join(a.out, "times.json")
    times = json.load(open(tp)) if os.path.exists(tp) else {}
    fails = {}
    with cf.ThreadPoolExecutor(a.jobs) as ex:
        for prog, rc, wall, rep, err in ex.map(lambda p: run(p, a), progs):
            if rc == 0:
                ts = rep.get("trace_seconds") if rep else None
                times[prog] = {"trace_s": ts, "wall_s": round(wall, 2)}
                print("%-36s ok   trace %6.2fs  peak alloc %10.1f MiB  %s" % (
                    prog, ts or -1, (rep or {}).get("peak_allocated", 0) / 2**20,
                    (rep or {}).get("warnings") or ""), flush=True)
            else:
                msg = [l for l in err.strip().splitlines() if l.strip()][-1:] or ["?"]
                fails[prog] = msg[0]
                print("%-36s FAIL rc=%d: %s" % (prog, rc, msg[0]), flush=True)
    with open(tp, "w") as f:
        json.dump(times, f, indent=1, sort_keys=True)
    if fails:
        with open(os.path.join(a.out, "failures.json"), "w") as f:
            json.dump(fails, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
