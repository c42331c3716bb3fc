"""What a real CUDA convolution allocates besides its outputs, measured per shape on the GPU.

    python measure.py CONVS.json OUT.json [--budget 150] [--batches 1,2,4,8,16,32,64]

CONVS.json: the conv configs (harvest.py: every aten.convolution of torchvision's models at
224x224, batch 1, run on meta). For each config, dtype (float32, bfloat16, float16) and
batch, on the GPU under PyTorch's defaults (cudnn.benchmark off, TF32 on for cuDNN):
- forward: aten.convolution;
- backward: aten.convolution_backward with output_mask (True, True, bias), and for a stem
  (input channels <= 4) also (False, True, bias), else (True, False, False) (frozen
  weights), as autograd calls them.
The caching allocator's history records each call between two markers (an odd-sized
allocation before, its free after); the events between them are the op's: its outputs
(allocations not freed inside) and its transients (allocated and freed inside), in order.
Each entry keeps that order as tokens: ["o", size] an output, ["t", size] a transient
allocation, ["f", i] the free of the i-th transient. vramroom.trace.hidden replays them
after the fake op's outputs. Configs are taken most-used first, so a short --budget keeps
the common shapes; entries are written as they finish."""
import argparse
import json
import time

import torch

MARK = 12345  # an odd size no conv allocates


def window(trace):
    """Splits the history at the markers: one token list per marked call. An allocation
    freed inside its window is a transient ("t"); one that outlives it is an output ("o");
    ["f", i] frees the i-th transient."""
    res, cur, mark_addr = [], None, None
    for e in trace:
        act = e["action"]
        if act not in ("alloc", "free_requested"):
            continue
        if cur is None:
            if act == "alloc" and e["size"] == MARK:
                cur, mark_addr, live = [], e["addr"], {}
            continue
        if act == "free_requested" and e["addr"] == mark_addr:
            freed = {v for k, v in cur if k == "f"}
            tid, toks = {}, []
            for j, (k, v) in enumerate(cur):
                if k == "a":
                    if j in freed:
                        tid[j] = len(tid)
                    toks.append(["t" if j in freed else "o", v])
                else:
                    toks.append(["f", tid[v]])
            res.append(toks)
            cur = None
            continue
        if act == "alloc":
            cur.append(("a", e["size"]))
            live[e["addr"]] = len(cur) - 1
        else:
            i = live.pop(e["addr"], None)
            if i is not None:
                cur.append(("f", i))
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("convs")
    ap.add_argument("out")
    ap.add_argument("--budget", type=float, default=150)
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--skip", type=int, default=0, help="start at this config (a second call)")
    ap.add_argument("--max-bytes", type=float, default=3e9, help="skip a call whose input is bigger")
    ap.add_argument("--channels-last-input", action="store_true",
                    help="the input in channels_last, the weight contiguous (ConvNeXt's "
                         "downsampling after its channels-last LayerNorm); entries say "
                         "\"layout\": \"channels_last_input\"")
    ap.add_argument("--channels-last", action="store_true",
                    help="input and weight in channels_last (model.to(memory_format=...)), 2-d "
                         "convs only; entries say \"layout\": \"channels_last\"")
    ap.add_argument("--dtypes", default="float32,bfloat16,float16")
    ap.add_argument("--models", default="", help="only configs used by these models (a,b)")
    a = ap.parse_args()
    t0 = time.time()
    batches = [int(x) for x in a.batches.split(",")]
    convs = json.load(open(a.convs))
    convs.sort(key=lambda c: -len(c["models"]))
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    doc = {"gpu": props.name, "arch": "sm%d%d" % (props.major, props.minor),
           "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
           "cuda": torch.version.cuda, "batches": batches,
           "about": __doc__.split("\n\n")[0], "entries": [], "done": False}
    dtypes = [getattr(torch, d) for d in a.dtypes.split(",")]
    cl = torch.channels_last if a.channels_last or a.channels_last_input else \
        torch.contiguous_format
    if a.channels_last or a.channels_last_input:
        convs = [c for c in convs if len(c["input"]) == 3 and not c["transposed"]]
    if a.models:
        want = set(a.models.split(","))
        convs = [c for c in convs if any(m.split("@")[0] in want for m in c["models"])]

    def flush():
        with open(a.out, "w") as f:
            json.dump(doc, f)

    aten = torch.ops.aten
    for ci, c in enumerate(convs):
        if ci < a.skip:
            continue
        if time.time() - t0 > a.budget:
            doc["stopped_at"] = ci
            break
        calls = []  # (dtype, pass, n)
        torch.cuda.memory._record_memory_history(max_entries=200000, context="alloc",
                                                 stacks="python", clear_history=True)
        for dt in dtypes:
            w = torch.randn(c["weight"], device=dev, dtype=dt).to(
                memory_format=torch.contiguous_format if a.channels_last_input else cl)
            b = torch.randn(c["weight"][1 if c["transposed"] else 0] * (c["groups"] if c["transposed"] else 1), device=dev, dtype=dt) if c["bias"] else None
            for n in c.get("batches") or batches:  # harvest_prog.py --beyond's own
                shape = [n] + c["input"]
                if torch.Size(shape).numel() * torch.finfo(dt).bits // 8 > a.max_bytes:
                    continue
                x = torch.randn(shape, device=dev, dtype=dt).to(memory_format=cl)
                args = (c["stride"], c["padding"], c["dilation"], c["transposed"],
                        c["output_padding"], c["groups"])
                try:
                    m = torch.empty(MARK, dtype=torch.uint8, device=dev)
                    y = aten.convolution(x, w, b, *args)
                    torch.cuda.synchronize()
                    del m
                    calls.append((dt, "forward", n))
                    go = torch.randn_like(y)
                    del y
                    masks = [("backward", [True, True, c["bias"]])]
                    if c["input"][0] <= 4 or c.get("weight_only"):
                        # a stem, or a first layer on data ("weight_only": its input needs
                        # no grad)
                        masks.append(("backward_weight_only", [False, True, c["bias"]]))
                    else:  # frozen weights (fine-tuning a head on a fixed backbone)
                        masks.append(("backward_input_only", [True, False, False]))
                    for pas, mask in masks:
                        m = torch.empty(MARK, dtype=torch.uint8, device=dev)
                        r = aten.convolution_backward(go, x, w, [b.shape[0]] if b is not None else [0],
                                                      *args, mask)
                        torch.cuda.synchronize()
                        del m
                        del r
                        calls.append((dt, pas, n))
                    del go, x
                except torch.OutOfMemoryError:
                    break
            del w, b
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(None)
        wins = window(snap["device_traces"][0])
        if len(wins) != len(calls):
            doc.setdefault("mismatch", []).append([ci, len(wins), len(calls)])
            continue
        by = {}
        for (dt, pas, n), toks in zip(calls, wins):
            by.setdefault((str(dt).replace("torch.", ""), pas), {})[n] = toks
        for (dt, pas), d in by.items():
            e = {k: c[k] for k in ("input", "weight", "bias", "stride", "padding", "dilation",
                                   "transposed", "output_padding", "groups")}
            e.update({"dtype": dt, "pass": pas, "by_batch": d})
            if a.channels_last or a.channels_last_input:
                e["layout"] = "channels_last_input" if a.channels_last_input else "channels_last"
            doc["entries"].append(e)
        doc["configs_done"] = ci + 1
        doc["elapsed_s"] = round(time.time() - t0, 1)
        if ci % 20 == 0:
            flush()
    else:
        doc["done"] = True
    doc["elapsed_s"] = round(time.time() - t0, 1)
    flush()
    print("conv measure: %d configs, %d entries, %.0f s, done=%s" % (
        doc.get("configs_done", 0), len(doc["entries"]), doc["elapsed_s"], doc["done"]))


if __name__ == "__main__":
    main()
