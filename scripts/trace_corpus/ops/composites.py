"""What PyTorch allocates inside composite and copy ops the tracer models from the source,
measured call by call on the GPU and checked against the trace.

    python composites.py --out OUT.json          # on a GPU (device run 31)
    PYTHONPATH=python python composites.py --check MEASURED.json   # here, on fake CUDA

The calls: cdist (p=2 over 25 rows runs _euclidean_dist's C++ composite; p=1 a kernel of its
own), isinf (abs() == inf), logsumexp of an integer tensor, advanced indexing with an int32
index beside two int64 ones, host-GPU copies into another layout or dtype and back from a
non-dense view, a custom autograd Function whose backward adds two of its temporaries, and
repeat / masked_fill (composites that allocate their output alone). Each call is recorded
between two markers as conv/measure.py records a conv (its `window` tokens). A matmul runs
before all of them, so cuBLAS's workspace is not inside any window. --check traces the same
calls and prints the ones that differ; it exits 1 when any does."""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "conv"))
from measure import MARK, window  # noqa: E402


class _Sum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        a = g * 3
        b = g * 4
        return a + b


def cases(dev):
    """[(name, setup, call)]: setup() makes the inputs (outside the window), call(inputs)
    the op (inside it); what call returns is kept until the window closes."""
    cpu = torch.device("cpu")
    return [
        ("cdist_p2", lambda: (torch.rand(512, 256, device=dev), torch.rand(1024, 256, device=dev)),
         lambda a: torch.cdist(a[0], a[1])),
        ("cdist_p1", lambda: (torch.rand(512, 256, device=dev), torch.rand(1024, 256, device=dev)),
         lambda a: torch.cdist(a[0], a[1], p=1.0)),
        ("isinf_f32", lambda: torch.rand(512, 256, device=dev), lambda a: torch.isinf(a)),
        ("isinf_bf16", lambda: torch.rand(512, 256, device=dev, dtype=torch.bfloat16),
         lambda a: torch.isinf(a)),
        ("isinf_int", lambda: torch.randint(0, 5, (512, 256), device=dev),
         lambda a: torch.isinf(a)),
        ("logsumexp_int", lambda: torch.randint(0, 5, (2048, 1024), device=dev),
         lambda a: a.logsumexp(0)),
        ("index_int32", lambda: (torch.randn(8, 192, 1000, device=dev),
                                 torch.arange(8, device=dev)[:, None],
                                 torch.arange(192, device=dev)[None, :],
                                 torch.randint(0, 1000, (8, 192), device=dev, dtype=torch.int32)),
         lambda a: a[0][a[1], a[2], a[3]]),
        ("index_int32_alone", lambda: (torch.randn(4096, 64, device=dev),
                                       torch.randint(0, 4096, (3000,), device=dev,
                                                     dtype=torch.int32)),
         lambda a: a[0][a[1]]),
        ("h2d_channels_last", lambda: torch.randn(64, 32, 7, 7, device=cpu),
         lambda a: a.to(dev, memory_format=torch.channels_last)),
        ("h2d_half_nonblocking", lambda: torch.randn(64, 32, 7, 7, device=cpu),
         lambda a: a.to(dev, dtype=torch.half, non_blocking=True)),
        ("h2d_half_blocking", lambda: torch.randn(64, 32, 7, 7, device=cpu),
         lambda a: a.to(dev, dtype=torch.half)),
        ("h2d_copy_into_transposed", lambda: (torch.empty(256, 512, device=dev),
                                              torch.randn(512, 256, device=cpu)),
         lambda a: a[0].t().copy_(a[1])),
        ("d2h_transposed", lambda: torch.randn(512, 256, device=dev), lambda a: a.t().cpu()),
        ("d2h_strided", lambda: torch.randn(512, 256, device=dev), lambda a: a[:, ::2].cpu()),
        ("custom_backward_sum",
         lambda: (lambda x: (x, _Sum.apply(x), torch.ones(1000, 1000, device=dev)))(
             torch.randn(1000, 1000, device=dev, requires_grad=True)),
         lambda a: a[1].backward(a[2])),
        ("repeat_0dim", lambda: torch.tensor(3.0, device=dev), lambda a: a.repeat(64)),
        ("masked_fill_broadcast", lambda: (torch.randn(64, 128, 128, device=dev),
                                           torch.rand(128, 128, device=dev) > 0.5),
         lambda a: a[0].masked_fill(a[1], 0.0)),
    ]


def run_all(dev):
    """Runs every case between markers; returns the names in order."""
    w = torch.randn(64, 64, device=dev)
    warm = w @ w  # cuBLAS's handle and workspace, before any window
    names = []
    for name, setup, call in cases(dev):
        inputs = setup()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        m = torch.empty(MARK, dtype=torch.uint8, device=dev)
        out = call(inputs)
        del m
        del out, inputs
        names.append(name)
    del warm
    return names


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--out")
    g.add_argument("--check")
    a = ap.parse_args()
    dev = torch.device("cuda")
    if a.out:
        props = torch.cuda.get_device_properties(0)
        torch.cuda.memory._record_memory_history(max_entries=200000)
        names = run_all(dev)
        snap = torch.cuda.memory._snapshot()
        wins = window(snap["device_traces"][0])
        doc = {"gpu": props.name, "torch": torch.__version__, "about": __doc__.split("\n\n")[0],
               "calls": dict(zip(names, wins)), "windows": len(wins)}
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
        print("composites: %d calls, %d windows" % (len(names), len(wins)))
        return 0
    import vramroom.trace as vt

    with open(a.check) as f:
        doc = json.load(f)
    with vt.trace(gpu="h200" if "H200" in doc["gpu"] else "h100") as t:
        names = run_all(dev)
    got = dict(zip(names, window(t.snapshot_dict()["device_traces"][0])))
    bad = 0
    for name, want in doc["calls"].items():
        if got.get(name) != want:
            bad += 1
            print("differs: %s\n  gpu    %s\n  traced %s" % (name, want, got.get(name)))
    print("%d of %d calls as the GPU allocated them" % (len(doc["calls"]) - bad, len(doc["calls"])))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
