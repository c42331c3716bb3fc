"""The tracer's cuDNN RNN table from measure_rnn.py's runs: per shape, the workspaces cuDNN
asked for (cudnnGetRNNTempSpaceSizes) in a training forward, an inference forward and the
backward, and the dropout state's size.

    python build_table.py OUT.json RUN.json [RUN.json ...]

A shape is mode|dtype|input_size|hidden_size|num_layers|directions|proj_size|packed|dropout
(cuDNN's dropout descriptor changes the training workspace); each of
its points is [batch, max steps, rows (batch x steps, or the packed rows), train, eval,
backward]. Each workspace is the transient its op frees first (measure_rnn.py's tokens: the
input's contiguous copy, where there is one, outlives it). The reserve space is a formula
(rnn.py's reserve_bytes), checked against every run by the tests, so it is not kept here."""
import json
import sys


def first_freed(toks, start=0):
    """Size of the transient freed first at or after token `start`."""
    ts = [i for i, (k, _) in enumerate(toks) if k == "t"]
    for k, v in toks[start:]:
        if k == "f":
            return toks[ts[v]][1]
    return 0


def main():
    out, runs = sys.argv[1], sys.argv[2:]
    table, drop = {}, None
    for path in runs:
        doc = json.load(open(path))
        for e in doc["entries"]:
            c, ph = e["config"], e.get("phases")
            if "error" in e or c["amp"] or c["dtype"] not in ("float32", "float16", "bfloat16") or \
                    not all(isinstance(ph.get(p), list) for p in ("train", "eval")):
                continue
            fwd = [t for n, t in ph["train"] if n.startswith("_cudnn_rnn.")]
            ev = [t for n, t in ph["eval"] if n.startswith("_cudnn_rnn.")]
            bwd = [t for n, t in ph["train"] if n.startswith("_cudnn_rnn_backward")]
            for n, t in ph["train"]:
                if n.startswith("_cudnn_init_dropout_state"):
                    drop = t[0][1]
            if not (fwd and ev and bwd):
                continue
            rows = sum(e["lengths"]) if c["packed"] else c["N"] * c["T"]
            T = max(e["lengths"]) if c["packed"] else c["T"]
            key = "|".join(str(v) for v in (c["mode"], c["dtype"], c["I"], c["H"], c["L"],
                                            2 if c["bi"] else 1, c["P"], int(c["packed"]),
                                            int(c["dp"] > 0)))
            pt = [c["N"], T, rows, first_freed(fwd[0]), first_freed(ev[0]),
                  first_freed(bwd[0])]
            pts = table.setdefault(key, [])
            if pt not in pts:
                pts.append(pt)
    doc = {"about": __doc__.split("\n\n")[0] + " Built from: " + ", ".join(
        p.split("/")[-1] for p in runs), "dropout_state_bytes": drop,
           "shapes": {k: sorted(v) for k, v in sorted(table.items())}}
    with open(out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    print("%d shapes, %d points, dropout state %s bytes" % (
        len(table), sum(len(v) for v in table.values()), drop))


if __name__ == "__main__":
    main()
