"""Diff a traced snapshot against a real one, event by event.

    python -m vramroom.trace.diffsnap REAL.pickle TRACED.pickle [--context 6] [--top 15]

Both are sequences of client requests. Prints the first allocation where the sizes differ
(with the neighbours on both sides and the frames each side has there), then the allocations
only one side makes, by size (a sequence alignment of the two size lists, so one missing
allocation does not shift everything after it), with the traced side's innermost user frame.
"""

import argparse
import collections
import difflib
import pickle
import sys


def load(path):
    with open(path, "rb") as f:
        d = pickle.load(f)
    tr = d["device_traces"][0] if isinstance(d, dict) else []
    return [e for e in tr if e.get("action") == "alloc"]


def where(e, n=2):
    fr = e.get("frames") or []
    keep = [f for f in fr if "/torch/" not in f["filename"] and "/vramroom/" not in f["filename"]]
    fr = (keep or fr)[:n]
    return " < ".join("%s:%d %s" % (f["filename"].rsplit("/", 1)[-1], f["line"], f["name"]) for f in fr)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("real")
    ap.add_argument("traced")
    ap.add_argument("--context", type=int, default=6)
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args(argv)
    ra, ta = load(a.real), load(a.traced)
    rs, ts = [e["size"] for e in ra], [e["size"] for e in ta]
    print("allocations: real %d, traced %d; bytes requested: real %d, traced %d"
          % (len(rs), len(ts), sum(rs), sum(ts)))
    i = next((k for k, (x, y) in enumerate(zip(rs, ts)) if x != y), None)
    if i is None:
        print("the size sequences agree on the first %d allocations" % min(len(rs), len(ts)))
    else:
        c = a.context
        print("first divergence at allocation %d" % i)
        print("  real  :", rs[max(0, i - 2):i + c], "  at", where(ra[i]))
        print("  traced:", ts[max(0, i - 2):i + c], "  at", where(ta[i]))
    sm = difflib.SequenceMatcher(a=rs, b=ts, autojunk=False)
    only_r, only_t = collections.Counter(), collections.Counter()
    where_t, where_r = {}, {}
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op in ("delete", "replace"):
            for k in range(i1, i2):
                only_r[rs[k]] += 1
                where_r.setdefault(rs[k], where(ra[k]))
        if op in ("insert", "replace"):
            for k in range(j1, j2):
                only_t[ts[k]] += 1
                where_t.setdefault(ts[k], where(ta[k]))
    common = only_r & only_t
    only_r -= common
    only_t -= common
    print("matched %d allocations in order" % sum(b.size for b in sm.get_matching_blocks()))
    print("only in the real run (size x count, bytes):")
    for s, n in sorted(only_r.items(), key=lambda kv: -kv[0] * kv[1])[:a.top]:
        print("  %12d x %-4d %14d  %s" % (s, n, s * n, where_r.get(s, "")))
    print("only in the trace (size x count, bytes):")
    for s, n in sorted(only_t.items(), key=lambda kv: -kv[0] * kv[1])[:a.top]:
        print("  %12d x %-4d %14d  %s" % (s, n, s * n, where_t.get(s, "")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
