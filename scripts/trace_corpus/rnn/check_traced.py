"""Device run 41's RNN measurements against the tracer: each measured config is run again on
fake CUDA (vramroom.trace, H100), the same steps measure_rnn.py took on the GPU (the module
moved to the GPU, two training steps, a forward under no_grad in training mode, one in
eval), and the allocations of each step, in order, are compared with the measured ones (the
sizes of every op's outputs and transients, in the order the GPU allocated them).

    PYTHONPATH=python python check_traced.py [RUN.json] [--limit N] [--shard I/N]
                                             [--out REPORT.md]

The workspace sizes come from the same measurements (the tracer's table), so what this
checks is the rest: the flat weight buffer and the parameters' copies, the input's copies,
the reserve space's formula, the order of every allocation in _cudnn_rnn and its backward,
the dropout state, autocast's reflatten, packed sequences, bfloat16."""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from measure_rnn import MARK, make_module, out_loss  # noqa: E402


def measured(ph):
    """The allocation sizes of a measured step, in order (outputs and transients)."""
    if not isinstance(ph, list):
        return None
    return [v for _, toks in ph for k, v in toks if k in ("o", "t") and v > 0]


def traced_steps(c, lengths):
    import torch

    import vramroom

    dt = getattr(torch, c["dtype"])
    with vramroom.trace(gpu="h100") as t:
        m = make_module(c)
        N, T = c["N"], c["T"]
        ln = torch.tensor(lengths) if lengths else None

        def mark():
            torch.empty(MARK, dtype=torch.uint8, device="cuda")

        mark()
        m.to("cuda")
        mark()
        x = torch.randn((N, T, c["I"]) if c["bf"] else (T, N, c["I"]), device="cuda", dtype=dt)
        if ln is not None:
            x = torch.nn.utils.rnn.pack_padded_sequence(x, ln, batch_first=c["bf"])
        mark()
        m.train()
        for _ in range(2):
            out_loss(m, x, c, ln is not None).backward()
        mark()
        m.zero_grad(set_to_none=True)
        mark()
        with torch.no_grad():
            out_loss(m, x, c, ln is not None)
        mark()
        m.eval()
        with torch.no_grad():
            out_loss(m, x, c, ln is not None)
        mark()
    ev = [(a, s) for a, _, s, _, _ in t.events if a == "alloc"]
    steps, cur = [], None
    for a, s in ev:
        if s == MARK:
            if cur is not None:
                steps.append(cur)
            cur = []
        elif cur is not None:
            cur.append(s)
    # to_cuda, (x), train, (zero_grad), nograd_train, eval
    return {"to_cuda": steps[0], "train": steps[2], "nograd_train": steps[4], "eval": steps[5]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run", nargs="?", default=os.path.join(HERE, "runs", "rnn-h100-run41.json"))
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--out")
    ap.add_argument("--shard", default="0/1", help="i/n: every n-th config from the i-th")
    a = ap.parse_args()
    doc = json.load(open(a.run))
    ents = [e for e in doc["entries"] if "error" not in e]
    if a.limit:
        ents = ents[:a.limit]
    i, n = (int(v) for v in a.shard.split("/"))
    ents = ents[i::n]
    ok, bad, refused = 0, [], []
    for e in ents:
        c = e["config"]
        try:
            got = traced_steps(c, e.get("lengths"))
        except Exception as ex:  # noqa: BLE001 (a refusal is a result)
            refused.append((c, str(ex)[:160]))
            continue
        diffs = []
        for ph in ("to_cuda", "train", "nograd_train", "eval"):
            want = measured(e["phases"].get(ph))
            if want is not None and got[ph] != want:
                diffs.append((ph, want, got[ph]))
        if diffs:
            bad.append((c, diffs))
            print("differs: %s %s" % (json.dumps(c), diffs[0][0]), flush=True)
        else:
            ok += 1
        print("checked %d ok %d" % (ok + len(bad) + len(refused), ok), flush=True)
    lines = ["# cuDNN RNNs: device run 41's measured steps vs the tracer", "",
             "`PYTHONPATH=python python scripts/trace_corpus/rnn/check_traced.py` over %s: "
             "%d configs; every step's allocations (sizes, in order) identical in **%d**, "
             "different in %d, refused in %d." % (os.path.basename(a.run), len(ents), ok,
                                                 len(bad), len(refused)), ""]
    for c, diffs in bad:
        lines.append("- differs: %s" % json.dumps(c))
        for ph, want, got in diffs:
            i = next((j for j, (p, q) in enumerate(zip(want, got)) if p != q),
                     min(len(want), len(got)))
            lines.append("  - %s at allocation %d: GPU %s, trace %s" % (
                ph, i, want[i:i + 6], got[i:i + 6]))
    for c, why in refused:
        lines.append("- refused: %s: %s" % (json.dumps(c), why))
    text = "\n".join(lines) + "\n"
    if a.out:
        open(a.out, "w").write(text)
    print("\n".join(lines[:3]))
    print("\n".join(lines[4:40]))
    sys.exit(0)


if __name__ == "__main__":
    main()
