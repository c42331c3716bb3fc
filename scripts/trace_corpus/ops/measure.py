"""What real CUDA sort, topk, multinomial, cumsum and accumulating index_put_ allocate besides
their outputs, measured on the GPU.

    python measure.py OUT.json [--budget 150] [--set run26|run27|run28|run30|run47]

--set run27 measures instead isin (brute force and sorting paths), sum/prod/mean/nansum of
inputs whose dtype is not the result's, the elementwise losses by reduction (forward, and
backward for mean), and cuDNN attention's forward workspace by query length (device run 27).
--set run28 measures cuDNN attention's split-KV decode workspace (a query of 1 to 4 tokens)
by batch, query and key/value heads, key length, head dim and mask (device run 28).
--set run30 measures the reductions whose partials are not one float: var/std and var_mean/
std_mean (Welford), argmax/argmin and max/min over a dim (a value and an index),
aminmax, amax/amin/max/min of 16-bit inputs, logsumexp (its composite's temporaries), by
dtype, shape, dims and layout (device run 30).
--set run47 measures the ops whose output size depends on the data (nonzero, masked_select,
indexing with a bool mask, unique, repeat_interleave, bincount) on inputs whose count is
known by construction (every q-th element true), each entry with the output's `count`.

Each call is recorded between two markers, as conv/measure.py records a conv: tokens
["o", size] an output, ["t", size] a transient, ["f", i] the free of the i-th transient, in
order. vramroom.trace.hidden fits its sort rules to these (cub's radix-sort scratch and the
index buffers of PyTorch's segmented sorts)."""
import argparse
import itertools
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "conv"))
from measure import MARK, window  # noqa: E402

DT = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
      "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}


def grid():
    g = []
    cols = [64, 2048, 4096, 4097, 10000, 32000, 50257, 128256, 1000000, 3000000]
    for rows, n, dt in itertools.product([1, 2, 8, 127, 128, 300], cols,
                                         ["float32", "bfloat16", "int64"]):
        if rows * n <= 40_000_000:
            g.append(dict(op="sort", rows=rows, cols=n, dtype=dt, stable=False, dim=-1))
    for rows, n in itertools.product([1, 8, 128], [4097, 50257]):
        g.append(dict(op="sort", rows=rows, cols=n, dtype="float16", stable=False, dim=-1))
        g.append(dict(op="sort", rows=rows, cols=n, dtype="float32", stable=True, dim=-1))
        g.append(dict(op="sort", rows=rows, cols=n, dtype="float32", stable=False, dim=0))
    for rows, n, k, dt in itertools.product([1, 4, 8, 64, 1024], [1000, 50257, 128256, 1000000],
                                            [1, 5, 50, 100, 1024, 2000],
                                            ["float32", "bfloat16"]):
        if k <= n and rows * n <= 40_000_000:
            g.append(dict(op="topk", rows=rows, cols=n, k=k, dtype=dt, sorted=True))
    for rows, n, k in itertools.product([1, 8, 1024], [50257, 1000000], [50, 2000]):
        if rows * n <= 40_000_000:
            g.append(dict(op="topk", rows=rows, cols=n, k=k, dtype="float32", sorted=False))
    for rows, n, s, rep in itertools.product([1, 8, 64], [1000, 50257, 128256], [1, 4],
                                             [False, True]):
        g.append(dict(op="multinomial", rows=rows, cols=n, samples=s, replacement=rep,
                      dtype="float32"))
    for rows, n, dt in itertools.product([1, 8, 1024], [1000, 50257, 1000000, 10000000],
                                         ["float32", "int64", "bool"]):
        if rows * n <= 40_000_000:
            g.append(dict(op="cumsum", rows=rows, cols=n, dtype=dt, dim=-1))
            if rows > 1:
                g.append(dict(op="cumsum", rows=rows, cols=n, dtype=dt, dim=0))
    for n, V, D, dt in itertools.product([1000, 5000, 100000], [1000, 50000], [1, 64, 768],
                                         ["float32", "bfloat16"]):
        g.append(dict(op="index_put_acc", n=n, V=V, D=D, dtype=dt))
    return g


def grid27():
    g = []
    for ne, nt, inv in itertools.product([1, 100, 32000, 1000000], [1, 3, 10, 44, 45, 100, 5000],
                                         [False, True]):
        g.append(dict(op="isin", n=ne, t=nt, invert=inv, dtype="int64"))
    g.append(dict(op="isin", n=32000, t=1, invert=False, dtype="int32"))
    for op, dt, shape, dim, out in itertools.product(
            ["sum", "prod", "mean", "nansum"],
            ["bool", "int32", "int64", "uint8", "float16", "bfloat16", "float32"],
            [(16, 256), (2048, 4096)], [None, -1, 0], [None, "float32", "float64"]):
        if op == "mean" and (dt in ("bool", "int32", "int64", "uint8") and out is None):
            continue
        if op == "nansum" and dt in ("bool",):
            continue
        g.append(dict(op=op, dtype=dt, rows=shape[0], cols=shape[1], dim=dim, out=out))
    for loss, red, dt, n in itertools.product(
            ["mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
             "binary_cross_entropy_with_logits", "soft_margin_loss", "kl_div"],
            ["mean", "sum", "none"], ["float32", "bfloat16"], [4096, 2097152]):
        g.append(dict(op="loss", loss=loss, reduction=red, dtype=dt, n=n, grad=False))
        if red == "mean":
            g.append(dict(op="loss", loss=loss, reduction=red, dtype=dt, n=n, grad=True))
    for T, S, D, grad, gqa in itertools.product([1, 2, 4, 16, 64, 256], [64, 300, 2048],
                                                [64, 128], [False, True], [False, True]):
        g.append(dict(op="sdpa", T=T, S=S, D=D, grad=grad, gqa=gqa, dtype="bfloat16"))
    return g


def grid28():
    g = []
    heads = [(8, 8), (8, 2), (16, 4), (32, 8), (12, 12), (32, 32), (16, 1)]
    for T, S, B, (hq, hk), D, mask in itertools.product(
            [1], [128, 256, 512, 640, 768, 1024, 1030, 1536, 2048, 4096], [1, 2, 4, 8, 16, 64],
            heads, [128], [False]):
        g.append(dict(op="sdpa", T=T, S=S, D=D, grad=False, gqa=hq != hk, B=B, Hq=hq, Hk=hk,
                      mask=mask, dtype="bfloat16"))
    for T, S, B, (hq, hk), D, mask in itertools.product(
            [1, 2, 4], [512, 1030, 2048], [1, 4, 16], [(8, 8), (16, 4)], [64, 128], [False, True]):
        g.append(dict(op="sdpa", T=T, S=S, D=D, grad=False, gqa=hq != hk, B=B, Hq=hq, Hk=hk,
                      mask=mask, dtype="bfloat16"))
    return g


RED30 = ["var", "std", "var_mean", "std_mean", "argmax", "argmin", "max_dim", "min_dim",
         "aminmax", "amax", "amin", "max", "min", "logsumexp", "norm", "sum", "mean"]
# ops that take a tuple of dims; those that take none (full reductions only) or one dim
TUPLE30 = {"var", "std", "var_mean", "std_mean", "amax", "amin", "logsumexp", "norm", "sum",
           "mean"}
NODIM30 = {"max", "min"}
NEEDDIM30 = {"max_dim", "min_dim", "logsumexp"}


def grid30():
    g = []
    cases = [((16, 256), None, False), ((16, 256), -1, False), ((2048, 4096), None, False),
             ((2048, 4096), -1, False), ((2048, 4096), 0, False), ((8192, 1024), 0, False),
             ((1, 1000000), -1, False), ((1, 1000000), None, False), ((4, 151936), -1, False),
             ((8, 512, 768), [0, 1], False), ((32, 3, 224, 224), [0, 2, 3], False),
             ((4096, 2048), None, True), ((4096, 2048), 0, True), ((4096, 2048), -1, True)]
    for op, dt, (shape, dim, tr) in itertools.product(
            RED30, ["float32", "bfloat16", "float16", "float64"], cases):
        if isinstance(dim, list) and op not in TUPLE30:
            continue
        if dim is not None and op in NODIM30:
            continue
        if dim is None and op in NEEDDIM30:
            continue
        g.append(dict(op=op, dtype=dt, shape=list(shape), dim=dim, t=tr))
    return g


def run30(c, dev):
    x = torch.rand(c["shape"], device=dev, dtype=DT[c["dtype"]])
    if c["t"]:
        x = x.t()
    torch.cuda.synchronize()
    op, dim = c["op"], c["dim"]
    kw = {} if dim is None else {"dim": dim}
    m = torch.empty(MARK, dtype=torch.uint8, device=dev)
    if op in ("max_dim", "min_dim"):
        out = getattr(torch, op[:3])(x, dim)
    elif op == "aminmax":
        out = torch.aminmax(x, **kw)
    elif op == "norm":
        out = torch.linalg.vector_norm(x, **kw)
    else:
        out = getattr(torch, op)(x, **kw)
    return m, x, out


def grid47():
    g = []
    shapes = [[8], [1000], [4096], [65536], [1000000], [10000000], [64, 512], [4096, 1024],
              [8, 256, 256], [2, 3000000]]
    for shape, dt, q in itertools.product(shapes, ["bool", "float32", "int64"], [0, 1, 4]):
        g.append(dict(op="nonzero", shape=shape, dtype=dt, q=q))
    for shape, q in itertools.product([[1000], [65536], [1000000], [4096, 1024]], [1, 4]):
        g.append(dict(op="masked_select", shape=shape, dtype="float32", q=q))
        g.append(dict(op="boolidx", shape=shape, dtype="float32", q=q, rows=False))
    for rows, q in itertools.product([8, 1000, 100000], [1, 4]):
        g.append(dict(op="boolidx", shape=[rows, 768], dtype="float32", q=q, rows=True))
    for n, inv, cnt in itertools.product([100, 10000, 1000000], [False, True], [False, True]):
        g.append(dict(op="unique", shape=[n], dtype="int64", q=1000, inverse=inv, counts=cnt))
    for n in [100, 10000, 1000000]:
        g.append(dict(op="unique", shape=[n], dtype="float32", q=1000, inverse=False,
                      counts=False))
        g.append(dict(op="unique_consecutive", shape=[n], dtype="int64", q=1000))
        g.append(dict(op="repeat_interleave", shape=[n], dtype="int64", q=4))
        g.append(dict(op="bincount", shape=[n], dtype="int64", q=100))
        g.append(dict(op="bincount", shape=[n], dtype="int64", q=100000))
    return g


def run47(c, dev):
    """Inputs whose result size is known: every q-th element true (q 0: none), values
    i mod q for unique/bincount, repeats i mod q for repeat_interleave."""
    n = 1
    for d in c["shape"]:
        n *= d
    i = torch.arange(n, device=dev)
    q = c["q"]
    if c["op"] in ("nonzero", "masked_select", "boolidx"):
        if c["op"] == "boolidx" and c["rows"]:
            mask = (torch.arange(c["shape"][0], device=dev) % q) == 0
            x = torch.rand(c["shape"], device=dev)
        else:
            mask = ((i % q) == 0 if q else torch.zeros(n, dtype=torch.bool, device=dev))
            mask = mask.view(c["shape"])
            x = mask.to(DT[c["dtype"]]) if c["op"] == "nonzero" else torch.rand(c["shape"], device=dev)
        del i
        torch.cuda.synchronize()
        m = torch.empty(MARK, dtype=torch.uint8, device=dev)
        if c["op"] == "nonzero":
            out = x.nonzero()
        elif c["op"] == "masked_select":
            out = x.masked_select(mask)
        else:
            out = x[mask]
        c["count"] = int(out.shape[0])
        return m, (x, mask), out
    x = (i % q).to(DT[c["dtype"]])
    del i
    torch.cuda.synchronize()
    m = torch.empty(MARK, dtype=torch.uint8, device=dev)
    if c["op"] == "unique":
        out = torch.unique(x, sorted=True, return_inverse=c["inverse"],
                           return_counts=c["counts"])
    elif c["op"] == "unique_consecutive":
        out = torch.unique_consecutive(x)
    elif c["op"] == "repeat_interleave":
        out = torch.repeat_interleave(x)
    else:
        out = torch.bincount(x)
    o = out[0] if isinstance(out, tuple) else out
    c["count"] = int(o.shape[0])
    return m, x, out


DT["uint8"] = torch.uint8
DT["float64"] = torch.float64


def filled(shape, dt, dev, high):
    """Random values of dtype dt: bools half true, floats in [0, 1), integers below high."""
    if dt == torch.bool:
        return torch.rand(shape, device=dev) > 0.5
    if dt.is_floating_point:
        return torch.rand(shape, device=dev, dtype=dt)
    return torch.randint(0, high, shape, device=dev, dtype=dt)


def run27(c, dev):
    dt = DT[c["dtype"]]
    if c["op"] == "isin":
        x = torch.randint(0, 1000, (c["n"],), device=dev, dtype=dt)
        t = torch.randint(0, 1000, (c["t"],), device=dev, dtype=dt)
        torch.cuda.synchronize()
        m = torch.empty(MARK, dtype=torch.uint8, device=dev)
        return m, (x, t), torch.isin(x, t, invert=c["invert"])
    if c["op"] == "loss":
        x = torch.rand(c["n"], device=dev, dtype=dt).clamp(0.01, 0.99).requires_grad_(c["grad"])
        y = torch.rand(c["n"], device=dev, dtype=dt).clamp(0.01, 0.99)
        torch.cuda.synchronize()
        f = getattr(torch.nn.functional, c["loss"])
        m = torch.empty(MARK, dtype=torch.uint8, device=dev)
        out = f(x, y, reduction=c["reduction"])
        if c["grad"]:
            out.backward()
        return m, (x, y), out
    if c["op"] == "sdpa":
        B, Hq = c.get("B", 4), c.get("Hq", 8)
        Hk = c.get("Hk", 2 if c["gqa"] else Hq)
        q = torch.randn(B, Hq, c["T"], c["D"], device=dev, dtype=dt, requires_grad=c["grad"])
        k = torch.randn(B, Hk, c["S"], c["D"], device=dev, dtype=dt, requires_grad=c["grad"])
        v = torch.randn(B, Hk, c["S"], c["D"], device=dev, dtype=dt, requires_grad=c["grad"])
        # a padding mask as transformers passes it: [B, 1, T, S] in the query's dtype
        am = torch.zeros(B, 1, c["T"], c["S"], device=dev, dtype=dt) if c.get("mask") else None
        torch.cuda.synchronize()
        m = torch.empty(MARK, dtype=torch.uint8, device=dev)
        with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.CUDNN_ATTENTION]):
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=am,
                                                                 enable_gqa=c["gqa"])
        return m, (q, k, v, am), o
    x = filled((c["rows"], c["cols"]), dt, dev, 3)
    torch.cuda.synchronize()
    kw = {"dtype": DT[c["out"]]} if c["out"] else {}
    f = getattr(torch, c["op"])
    m = torch.empty(MARK, dtype=torch.uint8, device=dev)
    out = f(x, **kw) if c["dim"] is None else f(x, c["dim"], **kw)
    return m, x, out


def run(c, dev):
    if "q" in c:
        return run47(c, dev)
    if "shape" in c:
        return run30(c, dev)
    if c["op"] in ("isin", "sdpa", "sum", "prod", "mean", "nansum", "loss"):
        return run27(c, dev)
    dt = DT[c["dtype"]]
    if c["op"] == "index_put_acc":
        x = torch.zeros(c["V"], c["D"], device=dev, dtype=dt).squeeze(-1)
        idx = torch.randint(0, c["V"], (c["n"],), device=dev)
        v = torch.randn((c["n"], c["D"]), device=dev, dtype=dt).squeeze(-1)
        keep = (x, idx, v)
        torch.cuda.synchronize()
        m = torch.empty(MARK, dtype=torch.uint8, device=dev)
        x.index_put_((idx,), v, accumulate=True)
        return m, keep, None
    x = filled((c["rows"], c["cols"]), dt, dev, 1 << 30)
    torch.cuda.synchronize()
    m = torch.empty(MARK, dtype=torch.uint8, device=dev)
    if c["op"] == "sort":
        out = torch.sort(x, dim=c["dim"], stable=c["stable"])
    elif c["op"] == "topk":
        out = torch.topk(x, c["k"], dim=-1, sorted=c["sorted"])
    elif c["op"] == "multinomial":
        out = torch.multinomial(x, c["samples"], replacement=c["replacement"])
    else:
        out = torch.cumsum(x, dim=c["dim"])
    return m, x, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--budget", type=float, default=150)
    ap.add_argument("--set", default="run26", choices=["run26", "run27", "run28", "run30", "run47"])
    a = ap.parse_args()
    t0 = time.time()
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    doc = {"gpu": props.name, "arch": "sm%d%d" % (props.major, props.minor),
           "sms": props.multi_processor_count, "torch": torch.__version__,
           "cuda": torch.version.cuda, "about": __doc__.split("\n\n")[0], "entries": [],
           "done": False}
    g = {"run26": grid, "run27": grid27, "run28": grid28, "run30": grid30, "run47": grid47}[a.set]()
    chunk = 40
    for start in range(0, len(g), chunk):
        if time.time() - t0 > a.budget:
            doc["stopped_at"] = start
            break
        part = g[start:start + chunk]
        torch.cuda.memory._record_memory_history(max_entries=200000, context="alloc",
                                                 stacks="python", clear_history=True)
        done = []
        for c in part:
            try:
                m, keep, out = run(c, dev)
                torch.cuda.synchronize()
                del m, out, keep
                done.append(c)
            except Exception as e:  # noqa: BLE001 - recorded, the grid goes on
                doc.setdefault("errors", []).append([c, repr(e)[:300]])
                torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(None)
        torch.cuda.empty_cache()
        wins = window(snap["device_traces"][0])
        if len(wins) != len(done):
            doc.setdefault("mismatch", []).append([start, len(wins), len(done)])
            continue
        for c, toks in zip(done, wins):
            e = dict(c)
            e["events"] = toks
            doc["entries"].append(e)
        with open(a.out, "w") as f:
            json.dump(doc, f)
    else:
        doc["done"] = True
    doc["seconds"] = round(time.time() - t0, 1)
    with open(a.out, "w") as f:
        json.dump(doc, f)
    print("ops: %d calls in %.1f s, done %s, errors %d" % (
        len(doc["entries"]), time.time() - t0, doc["done"], len(doc.get("errors", []))))


if __name__ == "__main__":
    main()
