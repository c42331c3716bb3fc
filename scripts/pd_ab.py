#!/usr/bin/env python3
"""A/B of pair_driver builds on this host: `pair_driver bench quick` of each build in turn,
ROUNDS rounds, then per case the minimum and the median over rounds.

    python3 scripts/pd_ab.py BUILD_A BUILD_B [...] ROUNDS

The builds alternate within each round, so a noisy VM's slow phases hit all of them alike;
the minimum is the steadiest figure on such a host.
"""
import collections
import statistics
import subprocess
import sys


def main():
    if len(sys.argv) < 3 or not sys.argv[-1].isdigit():
        sys.exit(__doc__)
    builds, rounds = sys.argv[1:-1], int(sys.argv[-1])
    res = {b: collections.defaultdict(list) for b in builds}
    for _ in range(rounds):
        for b in builds:
            out = subprocess.run([b, "bench", "quick"], capture_output=True, text=True, check=True)
            for line in out.stdout.splitlines():
                if line.strip():
                    case, ns = line.split()
                    res[b][case].append(float(ns))
    names = [f"B{i}" for i in range(len(builds))]
    for n, b in zip(names, builds):
        print(f"{n} = {b}")
    print("case".ljust(16) + "".join(f"{n} min".rjust(10) for n in names)
          + "".join(f"{n} med".rjust(10) for n in names))
    for case in res[builds[0]]:
        mins = "".join(f"{min(res[b][case]):10.1f}" for b in builds)
        meds = "".join(f"{statistics.median(res[b][case]):10.1f}" for b in builds)
        print(case.ljust(16) + mins + meds)


if __name__ == "__main__":
    main()
