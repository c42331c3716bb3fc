"""What a real CUDA embedding backward allocates besides its output, measured on the GPU.

    python measure.py OUT.json [--budget 120] [--grid coarse|fine|bag|edge]

For each index count n, vocabulary V, width D, grad dtype, index dtype, padding_idx,
scale_grad_by_freq and index spread (uniform over V, or only 7 distinct rows), one call of
aten.embedding_dense_backward (what autograd runs for nn.Embedding) is recorded between two
markers, as conv/measure.py records a conv: tokens ["o", size] the output, ["t", size] a
transient, ["f", i] the free of the i-th transient, in order. vramroom.trace.hidden fits its
rule for the sort path (n > 3072, or scale_grad_by_freq) to these. --grid fine: vocabularies
of 2 to 2048 (where the kernel changes its accumulation), bag: nn.EmbeddingBag's backward
through autograd (its weight's gradient and temporaries, sum and mean); edge: vocabularies 256 to 4096 at
8k to 256k indices."""
import argparse
import itertools
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "conv"))
from measure import MARK, window  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--budget", type=float, default=120)
    ap.add_argument("--grid", default="coarse", choices=["coarse", "fine", "bag", "edge"])
    a = ap.parse_args()
    t0 = time.time()
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    doc = {"gpu": props.name, "arch": "sm%d%d" % (props.major, props.minor),
           "torch": torch.__version__, "cuda": torch.version.cuda,
           "about": __doc__.split("\n\n")[0], "entries": [], "done": False}
    ns = [1024, 3072, 3073, 4096, 6000, 8192, 16384, 40960, 65536, 131072]
    vs = [50, 1000, 30522, 50257, 128256]
    ds = [64, 768]
    dts = [torch.float32, torch.bfloat16, torch.float16]
    grid = [dict(n=n, V=V, D=D, dtype=dt, idx=torch.int64, pad=-1, freq=False, spread="uniform")
            for n, V, D, dt in itertools.product(ns, vs, ds, dts)]
    for n, V in itertools.product(ns, [1000, 50257]):
        grid += [dict(n=n, V=V, D=768, dtype=torch.float32, idx=torch.int32, pad=-1, freq=False,
                      spread="uniform"),
                 dict(n=n, V=V, D=768, dtype=torch.float32, idx=torch.int64, pad=0, freq=False,
                      spread="uniform"),
                 dict(n=n, V=V, D=768, dtype=torch.float32, idx=torch.int64, pad=-1, freq=True,
                      spread="uniform"),
                 dict(n=n, V=V, D=768, dtype=torch.float32, idx=torch.int64, pad=-1, freq=False,
                      spread="few"),
                 dict(n=n, V=V, D=768, dtype=torch.bfloat16, idx=torch.int64, pad=-1, freq=False,
                      spread="few")]
    if a.grid == "fine":
        grid = [dict(n=n, V=V, D=D, dtype=dt, idx=torch.int64, pad=-1, freq=False,
                     spread="uniform")
                for n, V, D, dt in itertools.product(
                    [4096, 16384], [2, 8, 16, 32, 64, 100, 128, 200, 256, 300, 400, 500, 512,
                                    600, 700, 768, 800, 900, 1024, 2048],
                    [64, 256, 768, 1024], [torch.float32, torch.bfloat16])]
    if a.grid == "edge":  # where the dense accumulation stops, at many indices per row
        grid = [dict(n=n, V=V, D=64, dtype=torch.float32, idx=torch.int64, pad=-1, freq=False,
                     spread="uniform")
                for n, V in itertools.product(
                    [8192, 32768, 65536, 131072, 262144],
                    [256, 257, 384, 511, 512, 513, 600, 700, 768, 800, 900, 1000, 1023, 1024,
                     1025, 2048, 4096])]
    if a.grid == "bag":
        grid = [dict(n=n, V=V, D=D, dtype=dt, idx=torch.int64, pad=-1, freq=False,
                     spread="uniform", mode=mode)
                for n, V, D, dt, mode in itertools.product(
                    [1024, 4096, 16384, 65536], [1000, 100000], [16, 128],
                    [torch.float32, torch.float16], ["sum", "mean"])]
    aten = torch.ops.aten
    chunk = 40
    for start in range(0, len(grid), chunk):
        if time.time() - t0 > a.budget:
            doc["stopped_at"] = start
            break
        part = grid[start:start + chunk]
        torch.cuda.memory._record_memory_history(max_entries=200000, context="alloc",
                                                 stacks="python", clear_history=True)
        done = []
        for c in part:
            hi = c["V"] if c["spread"] == "uniform" else min(c["V"], 7)
            idx = torch.randint(0, hi, (c["n"],), device=dev, dtype=c["idx"])
            g = torch.randn(c["n"], c["D"], device=dev, dtype=c["dtype"])
            torch.cuda.synchronize()
            if "mode" in c:  # through autograd: its weight's grad stays (an output)
                w = torch.randn(c["V"], c["D"], device=dev, dtype=c["dtype"],
                                requires_grad=True)
                offs = torch.arange(0, c["n"], 8, device=dev)
                out = torch.nn.functional.embedding_bag(idx, w, offs, mode=c["mode"])
                g = torch.randn_like(out)
                torch.cuda.synchronize()
                m = torch.empty(MARK, dtype=torch.uint8, device=dev)
                out.backward(g)
                torch.cuda.synchronize()
                del m, out, g, idx, w, offs
                done.append(c)
                continue
            m = torch.empty(MARK, dtype=torch.uint8, device=dev)
            r = aten.embedding_dense_backward(g, idx, c["V"], c["pad"], c["freq"])
            torch.cuda.synchronize()
            del m, r, g, idx
            done.append(c)
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(None)
        wins = window(snap["device_traces"][0])
        if len(wins) != len(done):
            doc.setdefault("mismatch", []).append([start, len(wins), len(done)])
            continue
        for c, toks in zip(done, wins):
            e = dict(c)
            e["dtype"] = str(c["dtype"]).replace("torch.", "")
            e["idx"] = str(c["idx"]).replace("torch.", "")
            e["events"] = toks
            doc["entries"].append(e)
        with open(a.out, "w") as f:
            json.dump(doc, f)
    else:
        doc["done"] = True
    doc["seconds"] = round(time.time() - t0, 1)
    with open(a.out, "w") as f:
        json.dump(doc, f)
    print("embedding backward: %d calls in %.1f s, done %s" % (len(doc["entries"]),
                                                               time.time() - t0, doc["done"]))


if __name__ == "__main__":
    main()
