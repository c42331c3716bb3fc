"""How well a model of the CUDA driver's cudaMalloc placement orders segments, checked on real
snapshots (what crates/vramroom-alloc/src/driver_va.rs's design note quotes).

    python va_order.py DIR [DIR ...]     # folders of real *.pickle snapshots (record_real.py)

The caching allocator breaks best-fit ties by address, so what matters is the relative order
of equal-size segments. For every pair of segment_allocs of the same size in a snapshot's
trace, each model's addresses are compared with the recorded ones; the share of pairs whose
order a model gets right is printed for large (> 2 MiB) and small (2 MiB) segments. Models:
  grow  - addresses that grow with time (SimDevice's placement without the driver model);
  down  - each segment below the previous one;
  chunk - driver_va.rs: a 416 MiB zone below the top is held from the start; each segment
          takes the lowest free gap in the zone or a chunk held, else a new chunk, its size
          rounded up to 32 MiB, below all others; freed segments leave gaps;
  chunk_nozone - the same without the zone (driver_va.rs's earlier model: the first chunk
          is the top one).
"""
import glob
import os
import pickle
import sys

MIB2 = 2 << 20
CHUNK = 32 << 20
ZONE = 416 << 20


def seq_of(trace):
    """[(kind, arg)]: ("A", size) per segment_alloc, ("F", index of its alloc) per free."""
    seq, real, open_ = [], {}, {}
    for e in trace:
        if e["action"] == "segment_alloc":
            open_[e["addr"]] = len(seq)
            real[len(seq)] = e["addr"]
            seq.append(("A", e["size"]))
        elif e["action"] == "segment_free" and e["addr"] in open_:
            seq.append(("F", open_.pop(e["addr"])))
    return seq, real


def grow(seq):
    at, out = 0, {}
    for k, (kind, s) in enumerate(seq):
        if kind == "A":
            out[k] = at
            at += -(-s // MIB2) * MIB2
    return out


def down(seq):
    at, out = 1 << 46, {}
    for k, (kind, s) in enumerate(seq):
        if kind == "A":
            at -= -(-s // MIB2) * MIB2
            out[k] = at
    return out


def chunk(seq, zone=ZONE):
    top = 1 << 46
    chunks, live, out = ({top - zone: top} if zone else {}), {}, {}
    for k, (kind, s) in enumerate(seq):
        if kind == "F":
            live.pop(out[s], None)
            continue
        step = -(-s // MIB2) * MIB2
        got = None
        for cs in sorted(chunks):
            at = cs
            for ls in sorted(x for x in live if cs <= x < chunks[cs]):
                if ls - at >= step:
                    got = at
                    break
                at = max(at, live[ls])
            if got is None and chunks[cs] - at >= step:
                got = at
            if got is not None:
                break
        if got is None:
            size = -(-step // CHUNK) * CHUNK
            got = min(chunks, default=top) - size
            chunks[got] = got + size
        live[got] = got + step
        out[k] = got
    return out


def chunk_nozone(seq):
    return chunk(seq, zone=0)


MODELS = {"grow": grow, "down": down, "chunk": chunk, "chunk_nozone": chunk_nozone}


def main():
    files = {}
    for d in sys.argv[1:]:
        for f in glob.glob(os.path.join(d, "**", "*.pickle"), recursive=True):
            files.setdefault(os.path.basename(f), f)  # one copy of each snapshot
    tot = {(m, cls): [0, 0] for m in MODELS for cls in ("large", "small")}
    counted = 0
    for name in sorted(files):
        with open(files[name], "rb") as fh:
            snap = pickle.load(fh)
        for trace in snap.get("device_traces", []):
            seq, real = seq_of(trace)
            counted += bool(real)
            allocs = [k for k, (kind, _) in enumerate(seq) if kind == "A"]
            outs = {m: fn(seq) for m, fn in MODELS.items()}
            for ii, i in enumerate(allocs):
                for j in allocs[ii + 1:]:
                    if seq[i][1] != seq[j][1]:
                        continue
                    cls = "small" if seq[i][1] <= MIB2 else "large"
                    for m, out in outs.items():
                        t = tot[(m, cls)]
                        t[0] += (out[i] < out[j]) == (real[i] < real[j])
                        t[1] += 1
    print("%d snapshots (%d with cudaMalloc'd segments: the rest are expandable)" % (
        len(files), counted))
    for cls in ("large", "small"):
        print("%s segments: " % cls + ", ".join(
            "%s %.1f%% (%d/%d)" % (m, 100.0 * tot[(m, cls)][0] / max(1, tot[(m, cls)][1]),
                                    tot[(m, cls)][0], tot[(m, cls)][1]) for m in MODELS))


if __name__ == "__main__":
    main()
