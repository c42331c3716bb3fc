"""cuDNN RNN shapes a program runs that the tracer's table lacks: the program is traced on fake
CUDA (vramroom.trace, H100) with the workspace lookup answering 0 where it would refuse, and
each unmeasured shape is written as measure_rnn.py configs: at the program's batch and
length, and at half of each (so the shape's line in rows and batch is fixed for other
batches and lengths too).

    PYTHONPATH=python python harvest_prog.py OUT.json PROGRAM.py [PROGRAM.py ...]
"""
import json
import os
import runpy
import sys

import vramroom
from vramroom.trace import rnn
from vramroom.trace.capture import UnsupportedOp

out, progs = sys.argv[1], sys.argv[2:]
seen = []
orig = rnn.workspace


def record(c, kind, rec, row):
    try:
        return orig(c, kind, rec, row)
    except UnsupportedOp:
        mode = {0: "RNN_RELU", 1: "RNN_TANH", 2: "LSTM", 3: "GRU"}[c["mode"]]
        base = dict(mode=mode, dtype=str(c["dtype"]).replace("torch.", ""), I=c["I"],
                    H=c["H"], L=c["L"], bi=c["D"] == 2, P=c["P"], bf=False,
                    dp=0.1 if c["drop"] else 0.0,
                    bias=True, packed=c["packed"], amp=False, use_h=False)
        for n, t in ((c["N"], c["T"]), (max(1, c["N"] // 2), c["T"]),
                     (c["N"], max(1, c["T"] // 2))):
            cfg = dict(base, N=n, T=t)
            if cfg not in seen:
                seen.append(cfg)
        return 0


rnn.workspace = record
for prog in progs:
    saved = sys.argv
    sys.argv = [prog]
    try:
        with vramroom.trace(gpu="h100"):
            runpy.run_path(prog, run_name="__main__")
    except BaseException as e:  # noqa: BLE001 (a later refusal: the shapes seen so far count)
        print("%s: %s" % (os.path.basename(prog), str(e)[:120]), file=sys.stderr)
    finally:
        sys.argv = saved
json.dump(seen, open(out, "w"), indent=0)
print("%d configs from %d programs" % (len(seen), len(progs)))
