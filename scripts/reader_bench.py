#!/usr/bin/env python3
"""Vramroom's snapshot reader beside Python's pickle.load, file by file.

For each pickle, runs each reader in its own process three times (alternating) and keeps
the best wall time and the smallest peak RSS of each:

  vramroom: crates/vramroom-trace/examples/read_snapshot FILE  (reads, prints counts)
  python:   python3 -c "import pickle,sys; pickle.load(open(sys.argv[1],'rb'))" FILE

Both times include process start (about 1 ms for ours, 15-20 ms for the interpreter);
peak RSS is what /usr/bin/time reports (the bare interpreter is about 13 MiB, our
binary about 2 MiB).
Prints a table with the ratios (python / vramroom: above 1 means vramroom is faster or
smaller) and a summary line. A file vramroom refuses is reported, not skipped.

    cargo build --release -p vramroom-trace --example read_snapshot
    python3 scripts/reader_bench.py [--bin PATH] [--rounds 3] FILE_OR_DIR...
"""

import argparse
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY_READ = "import pickle,sys; pickle.load(open(sys.argv[1],'rb'))"


def default_bin():
    target = os.environ.get("CARGO_TARGET_DIR") or str(Path(__file__).resolve().parent.parent / "target")
    return str(Path(target) / "release" / "examples" / "read_snapshot")


def run(cmd):
    """(seconds, peak RSS in KiB, exit code, stderr) of one run.

    Peak RSS comes from /usr/bin/time, not from our own wait4: Linux keeps the forking
    parent's high-water mark across exec, so a child of this Python process would
    report at least this interpreter's RSS."""
    with tempfile.NamedTemporaryFile("r") as rss:
        start = time.perf_counter()
        p = subprocess.run(["/usr/bin/time", "-q", "-f", "%M", "-o", rss.name, *cmd],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        secs = time.perf_counter() - start
        kib = int(rss.read().split()[-1])
    return secs, kib, p.returncode, p.stderr.decode(errors="replace").strip()


def files_of(args):
    out = []
    for a in args:
        p = Path(a)
        out.extend(sorted(p.glob("*.pickle")) if p.is_dir() else [p])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--bin", default=default_bin())
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    files = files_of(a.paths)
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    print(f"# {len(files)} files, best of {a.rounds}; {cpu}, {os.cpu_count()} cores; "
          f"Python {platform.python_version()}")
    print(f"{'file':58} {'MB':>7} | {'hr s':>7} {'py s':>7} {'py/hr':>6} | "
          f"{'hr MiB':>7} {'py MiB':>7} {'py/hr':>6}")
    t_ratios, m_ratios, failures = [], [], 0
    tot = {"hr_s": 0.0, "py_s": 0.0}
    for f in files:
        hr, py = [], []
        for _ in range(a.rounds):
            hr.append(run([a.bin, str(f)]))
            py.append(run([sys.executable, "-c", PY_READ, str(f)]))
        size = f.stat().st_size / 1e6
        name = f.name if len(f.name) <= 58 else f.name[:55] + "..."
        if any(r[2] != 0 for r in hr):
            failures += 1
            msg = next(r[3] for r in hr if r[2] != 0)
            print(f"{name:58} {size:7.2f} | vramroom REFUSED: {msg}")
            continue
        hs, hm = min(r[0] for r in hr), min(r[1] for r in hr) / 1024
        ps, pm = min(r[0] for r in py), min(r[1] for r in py) / 1024
        if any(r[2] != 0 for r in py):
            print(f"{name:58} {size:7.2f} | python failed: {py[0][3][-200:]}")
            continue
        t_ratios.append(ps / hs)
        m_ratios.append(pm / hm)
        tot["hr_s"] += hs
        tot["py_s"] += ps
        print(f"{name:58} {size:7.2f} | {hs:7.3f} {ps:7.3f} {ps / hs:6.2f} | "
              f"{hm:7.1f} {pm:7.1f} {pm / hm:6.2f}")
    if t_ratios:
        gm = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))
        print(f"# {len(t_ratios)} files read by both: time python/vramroom geomean {gm(t_ratios):.2f}x "
              f"(min {min(t_ratios):.2f}x), total {tot['py_s']:.2f} s vs {tot['hr_s']:.2f} s; "
              f"peak RSS python/vramroom geomean {gm(m_ratios):.2f}x (min {min(m_ratios):.2f}x); "
              f"{failures} refused by vramroom")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
