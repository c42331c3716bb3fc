"""How far the driver-address model (crates/vramroom-alloc/src/driver_va.rs) moves peak reserved,
checked on every default-config real snapshot of the device runs (what driver_va.rs's design
note quotes).

    python va_replay.py [DIR ...] [--bin PATH] [--work /tmp/va] [--save F.json] [--against F.json]

DIR: folders of device runs (results.jsonl + snaps.tar.xz, record_real.py's output); default
every real*/ beside this script. Each snapshot is replayed twice with `vramroom replay --json`:
with its recorded addresses (the replay must then match the GPU's peak reserved exactly) and
with `--ignore-recorded-addresses` (every cudaMalloc placed by the driver model, as for a
traced snapshot of the same program: the fake-CUDA tracer's sequences are the GPU's on most
programs, so this isolates the error the model adds). A row is "within" when the model's
peak reserved is within 2% of the GPU's. --save writes the rows; --against F.json prints
which rows moved across the 2% line since a saved run (a model change must not push one out).
"""
import argparse
import json
import os
import subprocess
import sys
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
WITHIN = 0.02


def extracted(folder, work):
    """The folder's snapshots unpacked under WORK/NAME (once)."""
    out = os.path.join(work, os.path.basename(os.path.normpath(folder)))
    mark = os.path.join(out, ".extracted")
    if not os.path.exists(mark):
        os.makedirs(out, exist_ok=True)
        with tarfile.open(os.path.join(folder, "snaps.tar.xz")) as t:
            t.extractall(out, filter="data")
        open(mark, "w").close()
    return out


def peak(binary, snap, *extra):
    """Peak reserved of the replay; several ranks (one file, several devices): their sum."""
    p = subprocess.run([binary, "replay", snap, "--json", *extra],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("%s: %s" % (snap, p.stderr.strip()[-300:]))
    obj = json.loads(p.stdout)[0]
    if "rows" in obj:
        return sum(r["peak_reserved_bytes"] for r in obj["rows"])
    return obj["peak_reserved_bytes"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="*")
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "release", "vramroom"))
    ap.add_argument("--work", default="/tmp/va")
    ap.add_argument("--save")
    ap.add_argument("--against")
    ap.add_argument("--quiet", action="store_true", help="the summary only")
    a = ap.parse_args()
    dirs = a.dirs or sorted(
        os.path.join(HERE, d) for d in os.listdir(HERE)
        if d.startswith("real") and os.path.exists(os.path.join(HERE, d, "results.jsonl")))
    rows = []
    for d in dirs:
        name = os.path.basename(os.path.normpath(d))
        root = extracted(d, a.work)
        for line in open(os.path.join(d, "results.jsonl")):
            r = json.loads(line)
            if r.get("conf") != "default" or r.get("error") or not r.get("snapshot"):
                continue
            snap = os.path.join(root, r["snapshot"])
            if not os.path.exists(snap):
                continue
            real = r["peak_reserved_bytes"]
            hinted = peak(a.bin, snap)
            model = peak(a.bin, snap, "--ignore-recorded-addresses")
            rows.append({"folder": name, "program": r["program"], "real": real,
                         "hinted": hinted, "model": model})
    old = {}
    if a.against:
        old = {(r["folder"], r["program"]): r for r in json.load(open(a.against))}
    mib = lambda b: b / (1 << 20)
    rel = lambda r: (r["model"] - r["real"]) / r["real"]
    if not a.quiet:
        print("%-8s %-44s %9s %9s %9s %8s %s" % (
            "folder", "program", "real MiB", "hinted", "model", "model%", "was"))
        for r in rows:
            o = old.get((r["folder"], r["program"]))
            was = "" if o is None else "%+.2f%%" % (100 * rel(o))
            print("%-8s %-44s %9.0f %9.0f %9.0f %+7.2f%% %s%s" % (
                r["folder"], r["program"][:44], mib(r["real"]), mib(r["hinted"]),
                mib(r["model"]), 100 * rel(r), was,
                "" if r["hinted"] == r["real"] else "  (hinted replay not exact)"))
    print()
    print("%-8s %5s %13s %15s" % ("folder", "rows", "hinted exact", "model within 2%"))
    for f in sorted({r["folder"] for r in rows}) + ["all"]:
        sel = [r for r in rows if f in ("all", r["folder"])]
        print("%-8s %5d %13d %15d" % (
            f, len(sel), sum(r["hinted"] == r["real"] for r in sel),
            sum(abs(rel(r)) <= WITHIN for r in sel)))
    if old:
        for r in rows:
            o = old.get((r["folder"], r["program"]))
            if o is None:
                continue
            was, now = abs(rel(o)) <= WITHIN, abs(rel(r)) <= WITHIN
            if was != now:
                print("%s: %s/%s %+.2f%% -> %+.2f%%" % (
                    "GAINED" if now else "LOST", r["folder"], r["program"],
                    100 * rel(o), 100 * rel(r)))
    if a.save:
        with open(a.save, "w") as fh:
            json.dump(rows, fh, indent=0)


if __name__ == "__main__":
    sys.exit(main())
