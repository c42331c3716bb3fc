"""Match a recorded transformers snapshot (scripts/hf_memory.py) allocation by allocation
against Vramroom's meta device.

    python3 scripts/hf_trace_diff.py SNAPSHOT.pickle [--context N] [--max N] [--limit N]

Runs the `hf_trace` example (build it first: cargo build --release -p vramroom-tensor
--example hf_trace; found under $CARGO_TARGET_DIR or target/) for the scenario the file name
encodes, with the cuBLAS workspaces the snapshot shows alive at its start, and prints both
peaks above the start and every stretch where the two sequences of `+bytes` / `-bytes`
differ (difflib alignment over the first --limit events). `-0` is a block that was alive
before the recording (in PyTorch: what the recording process still held).
"""
import difflib
import os
import pickle
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def binary():
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    return os.path.join(target, "release", "examples", "hf_trace")


def rnd(s):
    return max(512, (s + 511) // 512 * 512)


def torch_events(snap):
    tr = [e for e in snap["device_traces"][0] if e["action"] in ("alloc", "free_completed")]
    live, out, n = {}, [], 0
    for e in tr:
        if e["action"] == "alloc":
            n += 1
            live[e["addr"]] = (n, e["size"])
            out.append(("+", n, e["size"]))
        else:
            i, sz = live.pop(e["addr"], (0, e["size"]))
            out.append(("-", i, sz))
    return out


def parse(name):
    m = re.match(r"(.+?)__(forward|generate|train)_(float32|bfloat16)_(.*)\.pickle", os.path.basename(name))
    if not m:
        sys.exit(f"not a scripts/hf_memory.py snapshot name: {name}")
    model, kind, dt, rest = m.groups()
    p = rest.split("_")
    if kind == "forward":
        args = p[:2] + ([p[2].lower()] if len(p) > 2 else [])
    elif kind == "generate":
        args = p[:4]
    else:
        args = p[:2] + ["3"]
    return model, kind, dt, args


def warmth(snap):
    """cold/forward/full: how many 32 MiB cuBLAS handle workspaces lived before the trace."""
    allocated = {e["addr"] for e in snap["device_traces"][0] if e["action"] == "alloc"}
    n = sum(1 for seg in snap["segments"] for b in seg["blocks"]
            if b["state"] == "active_allocated" and b["size"] == 32 << 20 and b["address"] not in allocated)
    return ["cold", "forward", "full"][min(n, 2)]


def ours(model, kind, dt, args, warm):
    cmd = [binary(), os.path.join(ROOT, "fixtures", "hf", model), kind, dt] + args + ["--warmth", warm]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(r.stderr or f"{cmd[0]} failed")
    lines = r.stdout.splitlines()
    ev = []
    for l in lines[3:]:
        i, n = l[1:].split()
        ev.append((l[0], int(i), int(n)))
    return ev


def peak(ev):
    cur = p = 0
    for op, _, sz in ev:
        cur += rnd(sz) if op == "+" else -rnd(sz)
        p = max(p, cur)
    return p


def opt(name, default):
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    ctx, mx, lim = opt("--context", 2), opt("--max", 40), opt("--limit", 4000)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    model, kind, dt, args = parse(path)
    w = warmth(snap)
    tev, mev = torch_events(snap), ours(model, kind, dt, args, w)
    print(f"{os.path.basename(path)} ({w}): PyTorch {len(tev)} events, peak above start {peak(tev)}; "
          f"Vramroom {len(mev)} events, peak above start {peak(mev)}")
    a = [f"{op}{sz}" for op, _, sz in tev][:lim]
    b = [f"{op}{sz}" for op, _, sz in mev][:lim]
    shown = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        shown += 1
        if shown > mx:
            print("...")
            break
        print(f"--- {tag} PyTorch[{i1}:{i2}] Vramroom[{j1}:{j2}]")
        for k in range(max(0, i1 - ctx), min(len(a), i2 + ctx)):
            op, i, sz = tev[k]
            print(f"   P{k:6d} {op}{i} {sz}" + ("" if i1 <= k < i2 else "   (context)"))
        for k in range(j1, j2):
            op, i, sz = mev[k]
            print(f"   H{k:6d} {op}{i} {sz}")


if __name__ == "__main__":
    main()
