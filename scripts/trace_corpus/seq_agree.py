"""How many programs the tracer reproduces allocation for allocation.

    python seq_agree.py --real REAL_DIR [REAL_DIR ...] --traced TRACED_DIR

For each real default-config snapshot (REAL_DIR/snaps/PROG__default.pickle, record_real.py) and
its traced twin (TRACED_DIR/PROG__default.pickle, trace_all.py): the two sequences of request
sizes (allocations, in program order), whether they are identical, and otherwise how many
allocations a sequence alignment matches in order (difflib, as vramroom.trace.diffsnap does)
and where the first difference is. Peaks can agree while the sequences differ (a transient
missed beside a larger peak), and sequences can agree while reserved bytes differ (where the
driver put the segments): this separates the tracer's events from the allocator's layout.
"""
import argparse
import difflib
import os
import pickle


def sizes(path):
    with open(path, "rb") as f:
        d = pickle.load(f)
    tr = d["device_traces"][0] if isinstance(d, dict) else []
    return [e["size"] for e in tr if e.get("action") == "alloc"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--real", nargs="+", required=True)
    ap.add_argument("--traced", required=True)
    a = ap.parse_args()
    rows, same = [], 0
    for rd in a.real:
        snaps = os.path.join(rd, "snaps")
        for name in sorted(os.listdir(snaps)):
            if not name.endswith("__default.pickle"):
                continue
            t = os.path.join(a.traced, name)
            if not os.path.exists(t):
                rows.append((name[:-16], "no trace", "", ""))
                continue
            r, s = sizes(os.path.join(snaps, name)), sizes(t)
            if r == s:
                same += 1
                rows.append((name[:-16], "identical", len(r), ""))
                continue
            m = difflib.SequenceMatcher(None, r, s, autojunk=False)
            matched = sum(b.size for b in m.get_matching_blocks())
            first = next((i for i, (x, y) in enumerate(zip(r, s)) if x != y), min(len(r), len(s)))
            rows.append((name[:-16], "differs", "%d of %d real (%d traced)" % (matched, len(r), len(s)),
                         "first at allocation %d" % first))
    print("| program | sequence | allocations | |\n|---|---|---|---|")
    for row in rows:
        print("| %s | %s | %s | %s |" % row)
    print("\nidentical: %d of %d programs" % (same, len(rows)))


if __name__ == "__main__":
    main()
