"""What nn.LSTM, nn.GRU and nn.RNN allocate on a real GPU, op by op, for the fake-CUDA tracer.

    python measure_rnn.py OUT.json [--budget 150] [--configs CONFIGS.json]

For each config (mode, dtype, input_size, hidden_size, num_layers, bidirectional, proj_size,
batch, seq, batch_first, dropout, bias, packed, autocast) the module is built on the host and
moved to the GPU, then run:
- "train": module.train(), a forward with grad and a backward of out.float().square().sum()
  (plus h_n's when "use_h"), then a second forward and backward (the flat weight grads are
  then the .grad tensors);
- "nograd_train": module.train() under torch.no_grad() (cuDNN still gets train=True);
- "eval": module.eval() under torch.no_grad().
A TorchDispatchMode brackets every aten op between two markers (an odd-sized allocation
before, its free after), as conv/measure.py does for convolutions, so each op's CUDA
allocations come back as tokens: ["o", size] an output, ["t", size] a transient, ["f", i]
the free of the i-th transient. Each config's entry keeps, per phase, the ops in call order
as [op name, tokens]. cuDNN's workspace and reserve sizes (cudnnGetRNNTempSpaceSizes) are in
them, which the tracer's RNN model is fitted to; the grid sweeps one dimension at a time
around base points, then random configs check the fit. Then F.ctc_loss (doc["ctc"]) on
its native and cuDNN paths, op by op the same way."""
import argparse
import json
import os
import random
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "conv"))
from measure import MARK, window  # noqa: E402

BASE = dict(mode="LSTM", dtype="float32", I=64, H=128, L=1, bi=False, P=0, N=16, T=50,
            bf=True, dp=0.0, bias=True, packed=False, amp=False, use_h=False)


def grid(seed=0):
    out = []
    add = lambda **kw: out.append({**BASE, **kw})
    for mode in ("LSTM", "GRU", "RNN_TANH", "RNN_RELU"):
        for dt in ("float32", "float16"):
            c = dict(mode=mode, dtype=dt)
            add(**c)
            if mode == "RNN_RELU":
                for n in (1, 7, 33, 128):
                    add(**c, N=n)
                continue
            for n in (1, 2, 3, 4, 5, 7, 8, 9, 15, 17, 31, 32, 33, 63, 64, 65, 100, 128, 255,
                      256, 512):
                add(**c, N=n)
            for t in (1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 32, 33, 64, 100, 128, 200, 256,
                      512, 1000):
                add(**c, T=t)
            for h in (8, 16, 17, 32, 33, 64, 100, 127, 200, 256, 384, 512, 768, 1024, 2048):
                add(**c, H=h)
            for i in (1, 3, 7, 8, 16, 32, 100, 128, 300, 512, 1024):
                add(**c, I=i)
            for layers in (2, 3, 4, 6):
                add(**c, L=layers)
            for layers in (1, 2, 3):
                add(**c, bi=True, L=layers)
            add(**c, bf=False)
            add(**c, bias=False)
            add(**c, L=2, dp=0.2)
            add(**c, use_h=True)
            for n, t in ((4, 300), (64, 16), (128, 128), (33, 77)):
                add(**c, N=n, T=t)
            for n in (4, 16, 64):
                add(**c, N=n, packed=True)
                add(**c, N=n, packed=True, bi=True, L=2)
            if mode == "LSTM":
                for p in (16, 32, 64, 100):
                    add(**c, P=p)
                add(**c, P=32, bi=True, L=2)
            if dt == "float32":
                for n in (8, 64):
                    add(**c, N=n, amp=True)
                add(**c, amp=True, L=2, bi=True)
    out.append({**BASE, "dtype": "bfloat16"})  # cuDNN refuses bf16: the native cells
    out.append({**BASE, "dtype": "bfloat16", "mode": "GRU"})
    rng = random.Random(seed)
    for _ in range(160):
        mode = rng.choice(["LSTM", "LSTM", "GRU", "GRU", "RNN_TANH"])
        out.append(dict(
            mode=mode, dtype=rng.choice(["float32", "float16"]),
            I=rng.choice([1, 5, 13, 40, 64, 80, 128, 257, 300, 512, 768]),
            H=rng.choice([10, 24, 50, 64, 96, 128, 150, 256, 320, 512, 1000, 1024]),
            L=rng.choice([1, 1, 2, 2, 3, 4]), bi=rng.random() < 0.35,
            P=rng.choice([0, 0, 0, 16, 48]) if mode == "LSTM" else 0,
            N=rng.choice([1, 3, 6, 10, 16, 24, 32, 48, 64, 96, 128, 200]),
            T=rng.choice([1, 6, 12, 20, 35, 64, 90, 128, 150, 256, 400]),
            bf=rng.random() < 0.6, dp=rng.choice([0.0, 0.0, 0.1]), bias=rng.random() < 0.9,
            packed=rng.random() < 0.15, amp=False, use_h=rng.random() < 0.3))
    for c in out[-160:]:
        if c["P"] >= c["H"]:
            c["P"] = 0
    return out


class Marks(TorchDispatchMode):
    """Brackets each aten op with the marker allocation; names kept in call order."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        m = torch.empty(MARK, dtype=torch.uint8, device="cuda")
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.names.append(str(func.overloadpacket.__name__) + "." + func._overloadname)
            del m


def windowed(fn):
    """Runs fn with every aten op bracketed by markers and the allocator's history on:
    [[op name, tokens], ...] for the ops that allocated, or {"mismatch": [windows, ops]}."""
    mk = Marks()
    torch.cuda.memory._record_memory_history(max_entries=400000, context="alloc",
                                             stacks="python", clear_history=True)
    with mk:
        fn()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(None)
    wins = window(snap["device_traces"][0])
    if len(wins) != len(mk.names):
        return {"mismatch": [len(wins), len(mk.names)]}
    return [[n, t] for n, t in zip(mk.names, wins) if t]


def make_module(c):
    """The config's module on the host, in its dtype, after torch.manual_seed(0) (which
    also asks cuDNN for new dropout states at the next RNN call)."""
    cls = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU}.get(c["mode"], torch.nn.RNN)
    kw = dict(num_layers=c["L"], bias=c["bias"], batch_first=c["bf"], dropout=c["dp"],
              bidirectional=c["bi"])
    if cls is torch.nn.RNN:
        kw["nonlinearity"] = "relu" if c["mode"] == "RNN_RELU" else "tanh"
    if c["P"]:
        kw["proj_size"] = c["P"]
    torch.manual_seed(0)
    return cls(c["I"], c["H"], **kw).to(getattr(torch, c["dtype"]))


def out_loss(m, x, c, packed):
    """The forward (under fp16 autocast for "amp") and the loss each step backpropagates:
    out.float().square().sum(), plus h_n's sum for "use_h"."""
    with torch.autocast("cuda", dtype=torch.float16, enabled=c["amp"]):
        y, h = m(x)
    y = y.data if packed else y
    loss = y.float().square().sum()
    if c["use_h"]:
        hh = h[0] if isinstance(h, tuple) else h
        loss = loss + hh.float().sum()
    return loss


def run_config(c, dev):
    m = make_module(c)
    dt = getattr(torch, c["dtype"])
    N, T = c["N"], c["T"]
    lengths = None
    if c["packed"]:
        g = torch.Generator().manual_seed(N * 1000 + T)
        lengths = torch.randint(1, T + 1, (N,), generator=g)
        lengths[0] = T
        lengths = lengths.sort(descending=True).values

    def inp():
        x = torch.randn((N, T, c["I"]) if c["bf"] else (T, N, c["I"]), device=dev, dtype=dt)
        if lengths is not None:
            x = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=c["bf"])
        return x

    phases = {}

    def phase(name, fn):
        phases[name] = windowed(fn)

    phase("to_cuda", lambda: m.to(dev))
    x = inp()

    def train():
        m.train()
        for _ in range(2):
            out_loss(m, x, c, lengths is not None).backward()

    phase("train", train)
    m.zero_grad(set_to_none=True)

    def nograd_train():
        m.train()
        with torch.no_grad():
            out_loss(m, x, c, lengths is not None)

    phase("nograd_train", nograd_train)

    def ev():
        m.eval()
        with torch.no_grad():
            out_loss(m, x, c, lengths is not None)

    phase("eval", ev)
    sizes = {"params": [list(p.shape) for p in m.parameters()],
             "flat": len({p.untyped_storage().data_ptr() for p in m.parameters()}) == 1}
    if lengths is not None:
        sizes["lengths"] = lengths.tolist()
    return phases, sizes


def ctc_grid():
    out = []
    for T, B, C, S in ((50, 16, 20, 30), (50, 16, 20, 10), (100, 16, 20, 30), (50, 64, 20, 30),
                       (50, 16, 80, 30), (200, 8, 32, 60), (64, 32, 37, 24), (400, 4, 29, 100),
                       (50, 1, 20, 30), (50, 16, 20, 64), (50, 16, 20, 65), (300, 32, 100, 80),
                       (1, 4, 5, 1), (128, 3, 1000, 50)):
        for kind in ("native", "native_int32", "cudnn", "mean_sum", "zero_inf"):
            out.append(dict(T=T, B=B, C=C, S=S, kind=kind))
    return out


def run_ctc(c, dev):
    """F.ctc_loss forward and backward: "native" (int64 padded targets on the GPU),
    "native_int32", "cudnn" (int32 concatenated targets on the host, equal input lengths:
    cuDNN's CTC where it applies), "mean_sum" (reduction sum), "zero_inf"."""
    T, B, C, S = c["T"], c["B"], c["C"], c["S"]
    g = torch.Generator().manual_seed(T * 7 + B)
    tl = torch.randint(max(1, S // 2), S + 1, (B,), generator=g)
    il = torch.full((B,), T, dtype=torch.long)
    x = torch.randn(T, B, C, device=dev, requires_grad=True)
    kw = {"reduction": "sum" if c["kind"] == "mean_sum" else "mean",
          "zero_infinity": c["kind"] == "zero_inf"}
    if c["kind"] == "cudnn":
        tg = torch.cat([torch.randint(1, C, (int(n),), generator=g) for n in tl]).int()
        il, tl = il.int(), tl.int()
    else:
        tg = torch.randint(1, max(2, C), (B, S), generator=g).to(dev)
        if c["kind"] == "native_int32":
            tg = tg.int()
    def step():
        lp = x.log_softmax(2)
        torch.nn.functional.ctc_loss(lp, tg, il, tl, **kw).backward()

    return windowed(step)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--budget", type=float, default=150)
    ap.add_argument("--configs", help="a JSON list of configs to measure instead of the grid "
                                      "(harvest_prog.py's); no CTC then")
    a = ap.parse_args()
    t0 = time.time()
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    doc = {"gpu": props.name, "arch": "sm%d%d" % (props.major, props.minor),
           "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
           "cuda": torch.version.cuda, "about": __doc__.split("\n\n")[0],
           "tf32_cudnn": torch.backends.cudnn.allow_tf32, "entries": [], "done": False}
    cfgs = json.load(open(a.configs)) if a.configs else grid()

    def flush():
        with open(a.out, "w") as f:
            json.dump(doc, f, separators=(",", ":"))

    for ci, c in enumerate(cfgs):
        if time.time() - t0 > a.budget:
            doc["stopped_at"] = ci
            break
        try:
            phases, sizes = run_config(c, dev)
            doc["entries"].append({"config": c, "phases": phases, **sizes})
        except Exception as e:  # noqa: BLE001 (a config cuDNN rejects is data too)
            torch.cuda.memory._record_memory_history(None)
            doc["entries"].append({"config": c, "error": "%s: %s" % (type(e).__name__,
                                                                     str(e)[:300])})
        if ci % 25 == 0:
            doc["elapsed_s"] = round(time.time() - t0, 1)
            flush()
    else:
        doc["done"] = True
    doc["ctc"] = []
    for c in ([] if a.configs else ctc_grid()):
        try:
            doc["ctc"].append({"config": c, "ops": run_ctc(c, dev)})
        except Exception as e:  # noqa: BLE001
            torch.cuda.memory._record_memory_history(None)
            doc["ctc"].append({"config": c, "error": "%s: %s" % (type(e).__name__,
                                                                 str(e)[:300])})
    doc["elapsed_s"] = round(time.time() - t0, 1)
    flush()
    print("rnn measure: %d of %d configs, %.0f s, done=%s" % (
        len(doc["entries"]), len(cfgs), doc["elapsed_s"], doc["done"]))


if __name__ == "__main__":
    main()
