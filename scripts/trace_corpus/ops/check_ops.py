"""Traces the calls of a measured ops/measure.py set on fake CUDA and compares each call's
allocation tokens with the GPU's, call by call.

    PYTHONPATH=python python scripts/trace_corpus/ops/check_ops.py MEASURED.json [--json]

Each measured entry is run again under vramroom.trace (the GPU the file names: h100 for an
H100) between the same markers, and conv/measure.py's `window` turns both histories into
tokens. Prints one line per call that differs and a count; exits 1 when any differs.
The reduction set (--set run30) and the data-dependent set (--set run47, entries with a "q")
are replayed here; the other sets have their own checks (test_trace_conv.py). A run47 input
over the tracer's known-value limit (values.SHADOW_LIMIT: an arange of 10M) is not known to
it, so the op is refused: those calls are counted apart."""
import argparse
import importlib.util
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _measure():
    spec = importlib.util.spec_from_file_location("ops_measure", os.path.join(HERE, "measure.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def traced_windows(entries, gpu):
    """The tracer's tokens for each entry, in order."""
    import torch

    import vramroom.trace as vt

    m = _measure()
    with vt.trace(gpu=gpu) as t:
        dev = torch.device("cuda")
        for c in entries:
            mark, keep, out = m.run(c, dev)
            del mark, out, keep
    return m.window(t.snapshot_dict()["device_traces"][0])


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("measured")
    ap.add_argument("--json", action="store_true", help="one JSON summary line at the end")
    a = ap.parse_args()
    with open(a.measured) as f:
        doc = json.load(f)
    from vramroom.trace.values import SHADOW_LIMIT

    entries, over = [], []
    for e in doc["entries"]:
        if "shape" in e:
            big = "q" in e and math.prod(e["shape"]) > SHADOW_LIMIT
            (over if big else entries).append(e)
    if over:
        print("%d calls over the known-value limit (refused by the tracer), not replayed"
              % len(over))
    gpu = "h200" if "H200" in doc.get("gpu", "") else "h100"
    got = traced_windows(entries, gpu)
    if len(got) != len(entries):
        print("traced %d windows for %d calls" % (len(got), len(entries)))
        return 1
    bad = 0
    for e, toks in zip(entries, got):
        if toks != e["events"]:
            bad += 1
            call = {k: v for k, v in e.items() if k != "events"}
            print("differs: %s\n  gpu    %s\n  traced %s" % (json.dumps(call), e["events"], toks))
    print("%d of %d calls as the GPU allocated them" % (len(entries) - bad, len(entries)))
    if a.json:
        summary = {"calls": len(entries), "differ": bad}
        if over:
            summary["over_limit"] = len(over)
        print(json.dumps(summary))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
