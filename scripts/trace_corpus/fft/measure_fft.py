"""What a real cuFFT transform allocates besides its output, call by call on the GPU: the
ground truth for modelling torch.fft on fake CUDA.

    python measure_fft.py OUT.json [--budget 120]

Each call is one aten op (_fft_r2c, _fft_c2r, _fft_c2c: what torch.fft.* and torch.stft
reach) on a fresh input, between two markers in the caching allocator's history (conv/
measure.py's window: ["o", size] an output, ["t", size] a transient, ["f", i] its free).
PyTorch's _exec_fft (SpectralOps.cpp) may copy the input (a batch reshape that cannot view,
the plan's should_clone_input, which C2R always needs), then takes the plan's work area from
the caching allocator for the call. Rows keep the op, dtype, shape, strides, dims and the
tokens, for a rule or a table. Sizes: 1-d lengths from tiny to 2^20 (powers of two, 2-3-5-7
smooth ones such as stft's 400, primes for Bluestein), batches 1 to 4096; 2-d and 3-d
signals; signal dims not last; stft's overlapping frames."""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "conv"))
from measure import MARK, window  # noqa: E402

DEV = os.environ.get("FFT_DEVICE", "cuda")  # cpu: a dry run of the grid, no history
LENS = [8, 16, 32, 60, 64, 100, 128, 200, 256, 257, 400, 500, 512, 640, 1000, 1024, 1536,
        2000, 2048, 3000, 4096, 8192, 10000, 16384, 32768, 65536, 131072, 1 << 20,
        17, 97, 1009, 4099,
        # device run 46: stft windows and whole clips at common audio rates
        320, 480, 800, 1600, 16000, 22050, 44100, 48000]
BATCHES = [1, 2, 3, 4, 7, 8, 16, 33, 64, 256, 1024, 4096]
SIG2 = [(32, 32), (64, 64), (100, 100), (128, 128), (224, 224), (256, 256), (64, 128),
        (512, 512), (1024, 1024), (97, 64)]
SIG3 = [(16, 16, 16), (32, 32, 32), (64, 64, 64), (20, 30, 40)]
# device run 46: the C2C stages of transforms over more dims (fftn over 4, rfftn over dims
# 0 and 1 first) and small 2-d signals
SIG2 += [(8, 8), (16, 16)]
B2 = [1, 2, 4, 8, 16, 32, 64]


def calls(dtypes):
    """(label, make_input, op, args) over the grid."""
    a = torch.ops.aten
    for dt in dtypes:
        cdt = {torch.float32: torch.complex64, torch.float64: torch.complex128,
               torch.float16: torch.complex32}[dt]
        lens = [n for n in LENS if dt != torch.float16 or n & (n - 1) == 0]
        for n in lens:
            for b in BATCHES:
                if b * n > 1 << 26:
                    continue
                yield dict(op="r2c", dtype=str(dt), shape=[b, n], dim=[1], onesided=True)
                yield dict(op="c2c", dtype=str(cdt), shape=[b, n], dim=[1], forward=True)
                yield dict(op="c2r", dtype=str(cdt), shape=[b, n // 2 + 1], dim=[1],
                           lastdim=n)
            for b in (3, 64):
                if b * n <= 1 << 24:
                    # the signal dim not last: a permute, then a batch reshape
                    yield dict(op="r2c", dtype=str(dt), shape=[n, b], dim=[0], onesided=True)
                    yield dict(op="c2c", dtype=str(cdt), shape=[n, b], dim=[0], forward=False)
                    yield dict(op="r2c", dtype=str(dt), shape=[b, n], dim=[1], onesided=False)
                    # [batch, channels, n]: two batch dims
                    yield dict(op="r2c", dtype=str(dt), shape=[b, 5, n], dim=[2],
                               onesided=True)
                    yield dict(op="c2r", dtype=str(cdt), shape=[b, 5, n // 2 + 1], dim=[2],
                               lastdim=n)
        for hop_div in (4, 2):  # stft frames: overlapping windows of one signal
            for n in (256, 400, 512, 1024, 2048):
                if dt == torch.float16 and n & (n - 1):
                    continue
                for b, t in ((1, 16000), (8, 16000), (4, 160000), (32, 48000)):
                    yield dict(op="r2c", dtype=str(dt), frames=[b, t, n, n // hop_div],
                               dim=[2], onesided=True)
                    yield dict(op="c2c", dtype=str(cdt), frames=[b, t, n, n // hop_div],
                               dim=[2], forward=True)
        for sig in SIG2:
            if dt == torch.float16 and any(s & (s - 1) for s in sig):
                continue
            for b in B2:
                if b * sig[0] * sig[1] > 1 << 26:
                    continue
                yield dict(op="r2c", dtype=str(dt), shape=[b, 3, *sig], dim=[2, 3],
                           onesided=True)
                yield dict(op="c2r", dtype=str(cdt), shape=[b, 3, sig[0], sig[1] // 2 + 1],
                           dim=[2, 3], lastdim=sig[1])
                yield dict(op="c2c", dtype=str(cdt), shape=[b, 3, *sig], dim=[2, 3],
                           forward=True)
        for sig in SIG3:
            if dt == torch.float16 and any(s & (s - 1) for s in sig):
                continue
            for b in (1, 2, 8):
                yield dict(op="r2c", dtype=str(dt), shape=[b, *sig], dim=[1, 2, 3],
                           onesided=True)
                yield dict(op="c2r", dtype=str(cdt), shape=[b, sig[0], sig[1],
                                                             sig[2] // 2 + 1],
                           dim=[1, 2, 3], lastdim=sig[2])
                # dims (0, 1, ...) skip the one-plan path
                yield dict(op="r2c", dtype=str(dt), shape=[*sig, b], dim=[0, 1, 2],
                           onesided=True)
                yield dict(op="c2c", dtype=str(cdt), shape=[b, *sig], dim=[1, 2, 3],
                           forward=True)
                yield dict(op="c2c", dtype=str(cdt), shape=[b, 2, *sig], dim=[1, 2, 3, 4],
                           forward=True)
    del a


def make(c):
    dt = getattr(torch, c["dtype"].split(".")[-1])
    dev = torch.device(DEV)
    if "frames" in c:
        b, t, n, hop = c["frames"]
        real = dt if not dt.is_complex else {torch.complex64: torch.float32,
                                              torch.complex32: torch.float16,
                                              torch.complex128: torch.float64}[dt]
        sig = torch.randn(b, t, device=dev, dtype=real)
        if dt.is_complex:
            sig = torch.randn(b, t, device=dev, dtype=dt)
        x = sig.unfold(-1, n, hop)  # [b, frames, n], strides (t, hop, 1)
        return x, sig
    if dt.is_complex and dt == torch.complex32:
        x = torch.randn(c["shape"], device=dev, dtype=torch.complex64).to(dt)
    else:
        x = torch.randn(c["shape"], device=dev, dtype=dt)
    return x, None


def run(c):
    """One call between the markers; False when its input could not be made (no window)."""
    a = torch.ops.aten
    try:
        x, keep = make(c)
    except Exception as e:  # noqa: BLE001 (too big for this GPU: a row that says so)
        c["error"] = repr(e)[:300]
        return False
    m = torch.empty(MARK, dtype=torch.uint8, device=DEV)
    y = None
    try:
        if c["op"] == "r2c":
            y = a._fft_r2c(x, c["dim"], 0, c["onesided"])
        elif c["op"] == "c2r":
            y = a._fft_c2r(x, c["dim"], 0, c["lastdim"])
        else:
            y = a._fft_c2c(x, c["dim"], 0, c["forward"])
        if DEV == "cuda":
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 (a shape cuFFT refuses: its window says so)
        c["error"] = repr(e)[:300]
    del m
    c["in_shape"], c["in_strides"] = list(x.shape), list(x.stride())
    if y is not None:
        c["out_shape"], c["out_strides"] = list(y.shape), list(y.stride())
    del y, x, keep
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--budget", type=float, default=120)
    ap.add_argument("--dtypes", default="float32,float64,float16")
    a = ap.parse_args()
    t0 = time.time()
    props = torch.cuda.get_device_properties(0) if DEV == "cuda" else None
    doc = {"gpu": props and props.name,
           "arch": props and "sm%d%d" % (props.major, props.minor),
           "torch": torch.__version__, "cuda": torch.version.cuda,
           "about": __doc__.split("\n\n")[0], "rows": [], "errors": [], "done": False}
    dtypes = [getattr(torch, d) for d in a.dtypes.split(",")]
    todo = list(calls(dtypes))
    i = 0
    while i < len(todo) and time.time() - t0 < a.budget:
        chunk = todo[i:i + 100]
        i += len(chunk)
        if DEV == "cuda":
            torch.cuda.memory._record_memory_history(max_entries=200000, context="alloc",
                                                     stacks="python", clear_history=True)
        done = []
        for c in chunk:
            if run(c):
                done.append(c)
            else:
                doc["errors"].append(c)
        if DEV != "cuda":
            doc["rows"] += done
            continue
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        wins = window(snap["device_traces"][0])
        if len(wins) != len(done):
            doc["errors"].append(["window count", len(wins), len(done)])
            continue
        for c, w in zip(done, wins):
            c["tokens"] = w
            doc["rows"].append(c)
    doc["done"] = i >= len(todo)
    doc["calls"], doc["elapsed_s"] = len(todo), round(time.time() - t0, 1)
    with open(a.out, "w") as f:
        json.dump(doc, f)
    print("fft: %d rows of %d calls, %d errors, %.1fs" % (len(doc["rows"]), len(todo),
                                                          len(doc["errors"]), time.time() - t0))


if __name__ == "__main__":
    main()
