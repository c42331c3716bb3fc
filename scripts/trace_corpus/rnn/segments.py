"""cuDNN's RNN workspaces for common shapes at every batch and length, as a few numbers a shape,
asked of cuDNN itself (query_ws.py's descriptors, which matched all 725 configs device run 41
measured), for the tracer's table.

    python segments.py OUT.json [--budget SECONDS] [--tmax 512] [--shapes KEY ...]

KEY is mode|dtype|input_size|hidden_size|num_layers|directions|dropout, e.g.
LSTM|float32|300|256|2|2|1 (a two-layer bidirectional LSTM with dropout); without --shapes, the
common shapes below. The tracer reads OUT's "shapes" merged into its rnn_segments_sm90.json.

For a shape (mode, dtype, input, hidden, layers, directions, dropout; no projection, padded
input) cuDNN's workspace at batch N and length T is, in device run 42's sweeps,
A(T) + B(T) x N + 32 x ceil(N / 4), with A and B piecewise linear in T. For every T up to
--tmax this script asks for N = 1 and N = 2 (train forward, eval forward, backward), derives
A and B, and keeps them as segments [T0, T1, A(T0), dA, B(T0), dB] over which both are linear.
Then it checks the segments against cuDNN at 64 random (N <= 1024, T <= tmax) per shape and
phase, and keeps a shape's phase only if every check is exact: the tracer uses nothing that
was not checked. Shapes whose algorithm depends on the batch (float16 persistent kernels:
RNN.cpp's use_persist_device_heuristics) are checked like the others and dropped when the
line does not hold. Plain RNNs: RNN_RELU's workspaces equal RNN_TANH's (77,472 sweep shapes)."""
import argparse
import json
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from query_ws import Cudnn, get_algo  # noqa: E402

IS = (16, 32, 64, 100, 128, 256, 300, 512, 768)
HS = (32, 64, 100, 128, 256, 512, 768, 1024)
LD = ((1, 1, 0), (2, 1, 0), (1, 2, 0), (2, 2, 0), (3, 1, 0), (2, 1, 1), (2, 2, 1))


def shapes():
    out = []
    for mode in ("LSTM", "GRU", "RNN_TANH"):
        for dt in ("float32", "float16", "bfloat16"):
            for L, D, dp in LD:
                for H in HS:
                    for I in IS:
                        out.append((mode, dt, I, H, L, D, dp))
    # the likeliest first, so that a budget cut keeps them: LSTM/GRU, float32, one or two
    # layers, no dropout
    rank = lambda s: ({"LSTM": 0, "GRU": 1, "RNN_TANH": 2}[s[0]] + 3 * (s[1] != "float32")
                      + 2 * s[6] + (s[4] > 2))
    return sorted(out, key=rank)


class Shape:
    def __init__(self, cu, s, sms, major):
        self.cu, self.s, self.sms, self.major = cu, s, sms, major

    def ws(self, N, T):
        """[train, eval, backward] workspaces at batch N and length T."""
        mode, dt, I, H, L, D, dp = self.s
        af = get_algo(mode, dt, I, H, L, D, 0, N, T, False, True, self.sms, self.major)
        ab = get_algo(mode, dt, I, H, L, D, 0, N, T, False, False, self.sms, self.major)
        tr = self.cu.temp(mode, dt, I, H, L, D, 0, N, T, None, dp, af, True)
        ev = self.cu.temp(mode, dt, I, H, L, D, 0, N, T, None, dp, af, False)
        bw = self.cu.temp(mode, dt, I, H, L, D, 0, N, T, None, dp, ab, True) if ab != af else tr
        if not all(isinstance(x, tuple) for x in (tr, bw)) or isinstance(ev, tuple) or ev < 0:
            return None
        return [tr[0], ev, bw[0]]


def segments(ab):
    """ab: [(A(T), B(T)) for T = 1..tmax] -> [[T0, T1, A0, dA, B0, dB], ...]."""
    segs = []
    T = 1
    n = len(ab)
    while T <= n:
        A0, B0 = ab[T - 1]
        if T == n:
            segs.append([T, T, A0, 0, B0, 0])
            break
        dA, dB = ab[T][0] - A0, ab[T][1] - B0
        U = T + 1
        while U < n and ab[U][0] - ab[U - 1][0] == dA and ab[U][1] - ab[U - 1][1] == dB:
            U += 1
        segs.append([T, U, A0, dA, B0, dB])
        T = U + 1
    return segs


def predict(segs, N, T):
    for T0, T1, A0, dA, B0, dB in segs:
        if T0 <= T <= T1:
            return A0 + dA * (T - T0) + (B0 + dB * (T - T0)) * N + 32 * -(-N // 4)
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--budget", type=float, default=240)
    ap.add_argument("--tmax", type=int, default=512)
    ap.add_argument("--shapes", nargs="*", default=None)
    a = ap.parse_args()
    cu = Cudnn()
    p = torch.cuda.get_device_properties(0)
    sms, major = p.multi_processor_count, p.major
    rng = random.Random(11)
    doc = {"gpu": p.name, "sms": sms, "cc": "%d.%d" % (p.major, p.minor),
           "torch": torch.__version__, "cudnn": cu.version, "tmax": a.tmax,
           "about": __doc__.split("\n\n")[0], "shapes": {}, "dropped": {}}
    t0 = time.time()
    todo = shapes() if a.shapes is None else [
        (k[0], k[1]) + tuple(int(v) for v in k[2:]) for k in (x.split("|") for x in a.shapes)]
    done = 0
    for s in todo:
        if time.time() - t0 > a.budget:
            break
        sh = Shape(cu, s, sms, major)
        w1 = [sh.ws(1, T) for T in range(1, a.tmax + 1)]
        w2 = [sh.ws(2, T) for T in range(1, a.tmax + 1)]
        key = "|".join(str(v) for v in s)
        if any(w is None for w in w1 + w2):
            doc["dropped"][key] = "cuDNN refused a shape"
            continue
        entry = {}
        for ph, name in enumerate(("train", "eval", "backward")):
            ab = []
            for x1, x2 in zip(w1, w2):
                B = x2[ph] - x1[ph]
                ab.append((x1[ph] - B - 32, B))
            segs = segments(ab)
            bad = 0
            for _ in range(64):
                N, T = rng.randint(1, 1024), rng.randint(1, a.tmax)
                got = sh.ws(N, T)
                if got is None or predict(segs, N, T) != got[ph]:
                    bad += 1
            if bad:
                doc["dropped"][key + "|" + name] = "%d of 64 checks off" % bad
            else:
                entry[name] = segs
        if entry:
            doc["shapes"][key] = entry
        done += 1
    doc["done"], doc["of"], doc["elapsed_s"] = done, len(todo), round(time.time() - t0, 1)
    with open(a.out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    nseg = [len(v) for e in doc["shapes"].values() for v in e.values()]
    print("segments: %d of %d shapes in %.0f s, %d phases kept, %d dropped, segments a phase: "
          "max %d, mean %.1f, %d bytes" % (done, len(todo), time.time() - t0, len(nseg),
                                            len(doc["dropped"]), max(nseg or [0]),
                                            sum(nseg) / max(1, len(nseg)), os.path.getsize(a.out)))


if __name__ == "__main__":
    sys.exit(main())
