"""Kernels by GPU time from Nsight Compute's CSV (`ncu --metrics gpu__time_duration.sum --csv`),
for scripts/profile_gpu.sh and scripts/profile_hf.sh.

    python3 scripts/ncu_summary.py RUN.csv                 # every kernel of one run
    python3 scripts/ncu_summary.py ONE.csv THREE.csv       # (THREE - ONE) / 2: two iterations
"""
import collections
import csv
import sys

SCALE = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}


def load(path):
    """{kernel name: [launches, microseconds]}."""
    hdr, tot = None, collections.defaultdict(lambda: [0, 0.0])
    for r in csv.reader(open(path, errors="replace")):
        if "Kernel Name" in r and "Metric Value" in r:
            hdr = r
            continue
        if hdr is None or len(r) != len(hdr):
            continue
        d = dict(zip(hdr, r))
        if d.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(d["Metric Value"].replace(",", ""))
        k = d["Kernel Name"][:100]
        tot[k][0] += 1
        tot[k][1] += v * SCALE.get(d.get("Metric Unit", "ns"), 1e-3)
    return tot


def main():
    if len(sys.argv) == 3:
        one, three = load(sys.argv[1]), load(sys.argv[2])
        per = {k: ((c - one.get(k, [0, 0.0])[0]) / 2, (t - one.get(k, [0, 0.0])[1]) / 2)
               for k, (c, t) in three.items()}
        per = {k: v for k, v in per.items() if v[0] > 0}
        head = "per forward: %.1f us of kernels, %d launches"
    else:
        per = load(sys.argv[1])
        head = "total %.1f us in %d kernels"
    print("   " + head % (sum(t for _, t in per.values()), sum(c for c, _ in per.values())))
    for k, (c, t) in sorted(per.items(), key=lambda x: -x[1][1])[:16]:
        print("   %9.1f us %5d  %s" % (t, c, k))


main()
