"""The tracer's cuFFT work-area table (python/vramroom/trace/fft_sm90.json) from measured
transforms (measure_fft.py), and a check of vramroom.trace.fft against every measured call.

    PYTHONPATH=python python scripts/trace_corpus/fft/build_table.py RUN.json [RUN.json ...]
        [--out TABLE]

Each measured call is replayed through fft.tokens, once with every work area 0 and once with
a marker size per plan: where the first matches, the plans took none; where the second does,
the measured size at each marker's place is that plan's work area. A call neither explains
is a fault of the port, reported. Then every call is replayed with the table and compared."""
import argparse
import json
import os
import sys

import torch

from vramroom.trace import fft

SENT = 10 ** 15


class NotMeasured(Exception):
    """A plan whose work area the table does not hold."""


def meta_input(r):
    dt = getattr(torch, r["dtype"].split(".")[-1])
    return torch.empty_strided(r["in_shape"], r["in_strides"], dtype=dt, device="meta")


def args_of(r):
    if r["op"] == "r2c":
        return (r["dim"], 0, r["onesided"])
    if r["op"] == "c2r":
        return (r["dim"], 0, r["lastdim"])
    return (r["dim"], 0, r["forward"])


def explain(r):
    """[(key, batch, bytes)] of the call's plans, or None."""
    x = meta_input(r)
    seen = []

    def zero(kind, value, signal, batch, layout):
        seen.append(((kind, str(value).replace("torch.", ""), list(signal), layout), batch))
        return 0
    if fft.tokens(r["op"], x, args_of(r), zero) == r["tokens"]:
        return [(k, b, 0) for k, b in seen]
    seen.clear()

    def mark(kind, value, signal, batch, layout):
        seen.append(((kind, str(value).replace("torch.", ""), list(signal), layout), batch))
        return SENT + len(seen)
    toks = fft.tokens(r["op"], x, args_of(r), mark)
    if len(toks) != len(r["tokens"]):
        return None
    got = {}
    for (k, v), (k2, v2) in zip(toks, r["tokens"]):
        if k != k2:
            return None
        if k == "t" and v >= SENT:
            got[v - SENT - 1] = v2
        elif v != v2:
            return None
    return [(k, b, got.get(i, 0)) for i, (k, b) in enumerate(seen)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", help="measure_fft.py outputs of one GPU and PyTorch")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(fft.__file__),
                                                  "fft_sm90.json"))
    a = ap.parse_args()
    docs = [json.load(open(p)) for p in a.runs]
    for d in docs[1:]:
        assert (d["gpu"], d["torch"], d["cuda"]) == (docs[0]["gpu"], docs[0]["torch"],
                                                     docs[0]["cuda"]), "runs of other setups"
    run = dict(docs[0], rows=[r for d in docs for r in d["rows"]])
    table, bad, conflicts = {}, [], []
    for r in run["rows"]:
        e = explain(r)
        if e is None:
            bad.append(r)
            continue
        for key, batch, ws in e:
            k = json.dumps(key)
            prev = table.setdefault(k, {}).get(batch)
            if prev is not None and prev != ws:
                conflicts.append((key, batch, prev, ws))
            table[k][batch] = ws
    entries = [dict(zip(("kind", "dtype", "signal", "layout"), json.loads(k)),
                    by_batch={str(b): w for b, w in sorted(v.items())})
               for k, v in sorted(table.items())]
    doc = {"gpu": run["gpu"], "arch": run["arch"], "torch": run["torch"], "cuda": run["cuda"],
           "about": "cuFFT's plan work area in bytes per (transform kind, value dtype, signal "
                    "sizes, layout) and batch, as PyTorch takes it from the caching allocator; built "
                    "by scripts/trace_corpus/fft/build_table.py from %s" %
                    ", ".join(os.path.basename(p) for p in a.runs),
           "entries": entries}
    with open(a.out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    fft._TABLES.clear()
    t = fft.table(os.path.basename(a.out)) if os.path.dirname(os.path.abspath(a.out)) == \
        os.path.dirname(fft.__file__) else None
    ok = 0
    if t is not None:
        def look(kind, value, signal, batch, layout):
            pts = t.get((kind, str(value).replace("torch.", ""), tuple(signal), layout))
            if pts is None:
                raise NotMeasured((kind, value, signal, layout))
            return fft.work_area(pts, batch)
        for r in run["rows"]:
            try:
                ok += fft.tokens(r["op"], meta_input(r), args_of(r), look) == r["tokens"]
            except NotMeasured:
                pass
    print("%d calls: %d explained by the port (%d not), %d plans in %d entries, %d conflicting"
          " sizes; with the table: %d of %d calls exact" % (
              len(run["rows"]), len(run["rows"]) - len(bad), len(bad),
              sum(len(v) for v in table.values()), len(entries), len(conflicts), ok,
              len(run["rows"])))
    for r in bad[:8]:
        print("not explained:", r["op"], r["dtype"], r["in_shape"], r["in_strides"], r["dim"],
              r["tokens"], file=sys.stderr)
    for c in conflicts[:8]:
        print("conflict:", c, file=sys.stderr)


if __name__ == "__main__":
    main()
