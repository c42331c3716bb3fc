"""Packs the gentle runs' probe snapshots, so a prediction can be recomputed from them later
without the GPU (crates/vramroom-load/examples/repredict.rs reads them with each service's
gentle results.json).

    python3 pack_gentle.py WORK_DIR OUT.tar.xz

WORK_DIR/<service>/gentle/*.pickle (the probe's snapshot of the gentle run) become
<service>/gentle.pickle and <service>/results.json in the archive. Stack frames are dropped
(the prediction reads actions, addresses, sizes, streams, times and request tags only), which
keeps nine services' traces within the device tool's 16 MiB a file.
"""
import glob
import io
import os
import pickle
import sys
import tarfile


def strip(snap):
    for tr in snap.get("device_traces", []):
        for e in tr:
            e.pop("frames", None)
    for seg in snap.get("segments", []):
        for b in seg.get("blocks", []):
            b.pop("frames", None)
            for h in b.get("history", []) or []:
                h.pop("frames", None)
    return snap


def main():
    work, out = sys.argv[1], sys.argv[2]
    with tarfile.open(out, "w:xz", preset=6) as tar:
        for d in sorted(glob.glob(os.path.join(work, "*", "gentle"))):
            svc = os.path.basename(os.path.dirname(d))
            pickles = sorted(glob.glob(os.path.join(d, "**", "*.pickle"), recursive=True),
                             key=os.path.getsize)
            if not pickles:
                print("%s: no gentle snapshot" % svc)
                continue
            with open(pickles[-1], "rb") as f:
                data = pickle.dumps(strip(pickle.load(f)))
            ti = tarfile.TarInfo("%s/gentle.pickle" % svc)
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
            res = os.path.join(d, "results.json")
            if os.path.exists(res):
                tar.add(res, "%s/results.json" % svc)
            print("%s: %s (%d bytes stripped)" % (svc, os.path.basename(pickles[-1]), len(data)))
    print("%s: %d bytes" % (out, os.path.getsize(out)))


if __name__ == "__main__":
    main()
