"""cuDNN's RNN workspace and reserve sizes asked of cuDNN itself, for every shape the tracer
could meet, on the GPU this runs on.

    python query_ws.py OUT.json.xz [--validate RUN.json ...] [--budget SECONDS]

PyTorch 2.11's _cudnn_rnn and its backward size their workspace and reserve space with one
call, cudnnGetRNNTempSpaceSizes, on an RNN descriptor and an input data descriptor
(aten/src/ATen/native/cudnn/RNN.cpp, ATen/cudnn/Descriptors.h). That call needs a GPU but
runs no kernel, so over ctypes it answers in microseconds: far more shapes than
measure_rnn.py can run. This script builds the descriptors as PyTorch does:
- cudnnSetRNNDescriptor_v8: the algorithm from RNN.cpp's get_algo (the forward's and the
  backward's differ: PERSIST_STATIC_SMALL_H up to hidden 192 forward, 128 backward, for
  LSTM/GRU; 384 and 256 for plain RNNs; PERSIST_STATIC for some float16 shapes; STANDARD
  with a projection or packed input), double bias always, data type the input's, math
  precision float for half and bfloat16, math type TENSOR_OP for half, else DEFAULT (cuDNN
  TF32 is on by default), padded IO unless packed;
- the dropout descriptor: restored with a state when training with dropout, else none;
- cudnnSetRNNDataDescriptor: SEQ_MAJOR_UNPACKED with every length T, or SEQ_MAJOR_PACKED
  with the sequences' lengths.
--validate first checks the answers against measure_rnn.py's runs (what the caching
allocator was asked for), so the sweeps after it can be trusted; then one-dimension sweeps
and random shapes, each row [mode, dtype, I, H, L, D, P, N, T, packed, dropout, rows,
algo_fwd, algo_bwd, ws_train, reserve, ws_eval, ws_bwd]."""
import argparse
import ctypes
import json
import lzma
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_table import first_freed  # noqa: E402

MODES = {"RNN_RELU": 0, "RNN_TANH": 1, "LSTM": 2, "GRU": 3}
DT = {"float32": 0, "float16": 2, "bfloat16": 9}
STANDARD, PERSIST_STATIC, SMALL_H = 0, 1, 3


def load_cudnn():
    torch.backends.cudnn.version()
    for line in open("/proc/self/maps"):
        p = line.split()[-1]
        if os.path.basename(p).startswith("libcudnn.so"):
            return ctypes.CDLL(p)
    return ctypes.CDLL("libcudnn.so.9")


class Cudnn:
    def __init__(self):
        torch.zeros(1, device="cuda")
        self.lib = lib = load_cudnn()
        self.h = ctypes.c_void_p()
        self.check(lib.cudnnCreate(ctypes.byref(self.h)), "cudnnCreate")
        self.rnn = ctypes.c_void_p()
        self.check(lib.cudnnCreateRNNDescriptor(ctypes.byref(self.rnn)), "rnn desc")
        self.x = ctypes.c_void_p()
        self.check(lib.cudnnCreateRNNDataDescriptor(ctypes.byref(self.x)), "data desc")
        self.nodrop = ctypes.c_void_p()
        self.check(lib.cudnnCreateDropoutDescriptor(ctypes.byref(self.nodrop)), "dropout")
        self.check(lib.cudnnSetDropoutDescriptor(self.nodrop, self.h, ctypes.c_float(0.0), None,
                                                 ctypes.c_size_t(0), ctypes.c_ulonglong(0)),
                   "no dropout")
        n = ctypes.c_size_t()
        self.check(lib.cudnnDropoutGetStatesSize(self.h, ctypes.byref(n)), "states size")
        self.state = torch.empty(n.value, dtype=torch.uint8, device="cuda")
        self.drop = ctypes.c_void_p()
        self.check(lib.cudnnCreateDropoutDescriptor(ctypes.byref(self.drop)), "dropout")
        self.check(lib.cudnnSetDropoutDescriptor(self.drop, self.h, ctypes.c_float(0.2),
                                                 ctypes.c_void_p(self.state.data_ptr()),
                                                 ctypes.c_size_t(n.value), ctypes.c_ulonglong(1)),
                   "dropout")
        self.version = lib.cudnnGetVersion()
        self.ws, self.rs = ctypes.c_size_t(), ctypes.c_size_t()

    @staticmethod
    def check(st, what):
        if st != 0:
            raise RuntimeError("%s: cudnn status %d" % (what, st))

    def temp(self, mode, dt, I, H, L, D, P, N, T, lengths, dropout, algo, training):
        lib = self.lib
        idt = DT[dt]
        math_prec = 0 if dt in ("float16", "bfloat16") else idt
        math_type = 1 if dt == "float16" else 0
        st = lib.cudnnSetRNNDescriptor_v8(
            self.rnn, ctypes.c_int(algo), ctypes.c_int(MODES[mode]), ctypes.c_int(2),
            ctypes.c_int(D - 1), ctypes.c_int(0), ctypes.c_int(idt), ctypes.c_int(math_prec),
            ctypes.c_int(math_type), ctypes.c_int32(I), ctypes.c_int32(H),
            ctypes.c_int32(P if P else H), ctypes.c_int32(L),
            self.drop if (dropout and training) else self.nodrop,
            ctypes.c_uint32(0 if lengths is not None else 1))
        if st:
            return -st
        lens = lengths if lengths is not None else [T] * N
        arr = (ctypes.c_int * N)(*lens)
        st = lib.cudnnSetRNNDataDescriptor(self.x, ctypes.c_int(idt),
                                           ctypes.c_int(1 if lengths is not None else 0),
                                           ctypes.c_int(T), ctypes.c_int(N), ctypes.c_int(I),
                                           arr, None)
        if st:
            return -1000 - st
        st = lib.cudnnGetRNNTempSpaceSizes(self.h, self.rnn, ctypes.c_int(1 if training else 0),
                                           self.x, ctypes.byref(self.ws),
                                           ctypes.byref(self.rs) if training else None)
        if st:
            return -2000 - st
        return (self.ws.value, self.rs.value) if training else self.ws.value


def get_algo(mode, dt, I, H, L, D, P, N, T, packed, forward, sms, major):
    """RNN.cpp's get_algo for a device of compute capability `major`.x and `sms` SMs."""
    if P:
        return STANDARD
    if not packed:
        if major >= 6:
            if mode in ("RNN_RELU", "RNN_TANH"):
                small = H <= (384 if forward else 256)
            else:
                small = H <= (192 if forward else 128)
            if small:
                return SMALL_H
        if dt == "float16":
            common = L == 1 and H <= 1024 and D == 1 and H % 128 == 0 and I % 128 == 0
            if major >= 8 and sms >= 98:
                if mode == "GRU":
                    dev = False
                elif mode == "LSTM":
                    dev = N % 8 == 0 and N <= 128
                else:
                    dev = N % 8 == 0 and N <= 128 and (N < 96 or H < 896)
            else:
                dev = False
            if common and dev:
                return PERSIST_STATIC
    return STANDARD


def query(cu, c, sms, major):
    """[algo_fwd, algo_bwd, ws_train, reserve, ws_eval, ws_bwd] for config c."""
    mode, dt, I, H, L, D, P, N, T = (c[k] for k in ("mode", "dtype", "I", "H", "L", "D", "P",
                                                      "N", "T"))
    lengths = c.get("lengths")
    dp = c.get("dp", 0)
    af = get_algo(mode, dt, I, H, L, D, P, N, T, lengths is not None, True, sms, major)
    ab = get_algo(mode, dt, I, H, L, D, P, N, T, lengths is not None, False, sms, major)
    tr = cu.temp(mode, dt, I, H, L, D, P, N, T, lengths, dp, af, True)
    ev = cu.temp(mode, dt, I, H, L, D, P, N, T, lengths, dp, af, False)
    bw = cu.temp(mode, dt, I, H, L, D, P, N, T, lengths, dp, ab, True) if ab != af else tr
    ws_t, rs = tr if isinstance(tr, tuple) else (tr, tr)
    ws_b = bw[0] if isinstance(bw, tuple) else bw
    return [af, ab, ws_t, rs, ev, ws_b]


def validate(cu, paths, sms, major):
    """Every measured config of measure_rnn.py's runs: cuDNN's answer here against what the
    caching allocator was asked for there (train forward, eval forward, backward)."""
    rows, bad = [], []
    for path in paths:
        for e in json.load(open(path))["entries"]:
            c, ph = e["config"], e.get("phases") or {}
            if "error" in e or c["dtype"] not in DT or not all(
                    isinstance(ph.get(p), list) for p in ("train", "eval")):
                continue
            fwd = [t for n, t in ph["train"] if n.startswith("_cudnn_rnn.")]
            ev = [t for n, t in ph["eval"] if n.startswith("_cudnn_rnn.")]
            bwd = [t for n, t in ph["train"] if n.startswith("_cudnn_rnn_backward")]
            if not (fwd and ev and bwd):
                continue
            q = dict(c, D=2 if c["bi"] else 1, dtype="float16" if c["amp"] else c["dtype"])
            if c["packed"]:
                q["lengths"] = e["lengths"]
                q["T"] = max(e["lengths"])
            got = query(cu, q, sms, major)
            meas = [first_freed(fwd[0]), first_freed(ev[0]), first_freed(bwd[0])]
            # the reserve: _cudnn_rnn's outputs are output, hy, cy, reserve (the last "o")
            res = [v for k, v in fwd[0] if k == "o"][-1]
            ok = [got[2], got[4], got[5], got[3]] == meas + [res]
            rows.append(ok)
            if not ok:
                bad.append({"config": c, "measured": meas + [res], "cudnn": got})
    return {"checked": len(rows), "identical": sum(rows), "different": bad[:60]}


def sweeps(cu, sms, major, budget, out):
    t0 = time.time()
    combos = [(1, 1), (2, 1), (1, 2), (3, 2)]
    for mode in ("LSTM", "GRU", "RNN_TANH", "RNN_RELU"):
        for dt in ("float32", "float16", "bfloat16"):
            for L, D in combos:
                base = dict(mode=mode, dtype=dt, L=L, D=D, P=0, dp=0)
                plan = [dict(base, I=64, H=h, N=16, T=50) for h in range(1, 1101)]
                for H in (128, 512):
                    plan += [dict(base, I=i, H=H, N=16, T=50) for i in range(1, 1101)]
                for I, H in ((64, 128), (256, 512), (300, 100)):
                    plan += [dict(base, I=I, H=H, N=n, T=50) for n in range(1, 521)]
                    plan += [dict(base, I=I, H=H, N=16, T=t) for t in range(1, 521)]
                if L > 1:
                    plan += [dict(base, I=64, H=h, N=16, T=50, dp=0.2) for h in range(1, 600, 7)]
                for c in plan:
                    if time.time() - t0 > budget:
                        return "budget"
                    out.append(row(c, query(cu, c, sms, major)))
    return "done"


def row(c, got):
    lengths = c.get("lengths")
    rows = sum(lengths) if lengths is not None else c["N"] * c["T"]
    return [c["mode"], c["dtype"], c["I"], c["H"], c["L"], c["D"], c["P"], c["N"], c["T"],
            int(lengths is not None), int(bool(c.get("dp"))), rows] + got + (
        [lengths] if lengths is not None else [])


def logu(rng, lo, hi):
    import math
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def randoms(cu, sms, major, budget, out, seed=7):
    rng = random.Random(seed)
    t0 = time.time()
    while time.time() - t0 < budget:
        mode = rng.choice(["LSTM", "LSTM", "GRU", "GRU", "RNN_TANH", "RNN_RELU"])
        dt = rng.choice(["float32", "float32", "float16", "bfloat16"])
        H = logu(rng, 1, 4096)
        c = dict(mode=mode, dtype=dt, I=logu(rng, 1, 4096), H=H, L=rng.choice([1, 1, 1, 2, 2, 3, 4, 6]),
                 D=rng.choice([1, 1, 2]), P=0, N=logu(rng, 1, 1024), T=logu(rng, 1, 2048), dp=0)
        if mode == "LSTM" and H > 1 and rng.random() < 0.15:
            c["P"] = rng.randint(1, H - 1)
        if c["L"] > 1 and rng.random() < 0.3:
            c["dp"] = 0.2
        if rng.random() < 0.15 and c["N"] * c["T"] < 200000:
            ls = sorted((rng.randint(1, c["T"]) for _ in range(c["N"])), reverse=True)
            ls[0] = c["T"]
            c["lengths"] = ls
        if c["N"] * c["T"] * max(c["I"], c["H"]) > 2 ** 31:
            continue
        out.append(row(c, query(cu, c, sms, major)))
    return "budget"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--validate", nargs="*", default=[])
    ap.add_argument("--budget", type=float, default=240)
    a = ap.parse_args()
    cu = Cudnn()
    p = torch.cuda.get_device_properties(0)
    sms, major = p.multi_processor_count, p.major
    doc = {"gpu": p.name, "sms": sms, "cc": "%d.%d" % (p.major, p.minor), "torch": torch.__version__,
           "cudnn": cu.version, "dropout_state_bytes": cu.state.numel(), "about": __doc__.split("\n\n")[0]}
    t = time.time()
    doc["validation"] = validate(cu, a.validate, sms, major)
    v = doc["validation"]
    print("validation: %d of %d identical (%.1f s)" % (v["identical"], v["checked"], time.time() - t),
          flush=True)
    for d in v["different"][:10]:
        print("  ", json.dumps(d), flush=True)
    t = time.time()
    doc["sweeps"] = []
    doc["sweeps_end"] = sweeps(cu, sms, major, a.budget * 0.6, doc["sweeps"])
    print("sweeps: %d rows (%s, %.1f s)" % (len(doc["sweeps"]), doc["sweeps_end"], time.time() - t),
          flush=True)
    t = time.time()
    doc["random"] = []
    randoms(cu, sms, major, a.budget * 0.3, doc["random"])
    print("random: %d rows (%.1f s)" % (len(doc["random"]), time.time() - t), flush=True)
    # two files, each under the device tool's 16 MiB a file
    rand = doc.pop("random")
    for path, d in ((a.out, doc), (a.out.replace(".json.xz", "-random.json.xz"),
                                   {"random": rand})):
        with lzma.open(path, "wt") as f:
            json.dump(d, f, separators=(",", ":"))
        print("wrote", path, os.path.getsize(path), "bytes", flush=True)


if __name__ == "__main__":
    sys.exit(main())
