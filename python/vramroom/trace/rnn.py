"""cuDNN RNNs (nn.LSTM, nn.GRU, nn.RNN on CUDA) as PyTorch 2.11 runs them, op by op.

Design note. On the GPU these modules reach cuDNN through C++ composites (`at::lstm` &
co., aten/src/ATen/native/cudnn/RNN.cpp) that ask cuDNN for a handle before any op reaches
the fake mode, and whose fake kernels allocate no workspace or reserve space. So three
pieces stand in for them while a trace runs, each doing what the C++ does, in its order,
with the fake mode recording every tensor it makes:

- `RnnVF` replaces torch.nn.modules.rnn's `_VF`: lstm/gru/rnn_tanh/rnn_relu (padded and
  packed) on a fake CUDA input that cuDNN takes (float32, float16, float64) run
  `_cudnn_impl`: the process-wide dropout state on first use with dropout in training
  (an 8-byte seed drawn on the device, then cuDNN's RNG states, kept for good; made again
  after a manual_seed), then `aten._cudnn_rnn`. Under CUDA autocast they run
  `_cudnn_rnn_cast_reflatten` first: the weights copied into a new flat float16 buffer,
  then the input and states cast. bfloat16 runs on cuDNN too (at::cudnn_is_acceptable takes
  it) but RNNBase.flatten_parameters does not flatten it (torch.backends.cudnn's
  is_acceptable does not), so each call copies the weights into a new buffer (device run
  41's hp_lstm_proj_bf16_native). Other dtypes, or cuDNN off, go to PyTorch's own composite
  (its fused cells, which fake mode runs).
- `flatten_parameters` (RNNBase's, which compares data pointers that fake tensors do not
  have) compares storages instead, then calls `_cudnn_rnn_flatten_weight`.
- The recording mode runs these aten ops here (mode.py's fast paths):
  `_cudnn_rnn_flatten_weight` (a zeroed flat buffer, each weight copied in and re-pointed
  at it, its old storage freed), `_cudnn_rnn` and `_cudnn_rnn_backward`, whose workspace and
  reserve sizes are cudnnGetRNNTempSpaceSizes's. The reserve space is a formula
  (reserve_bytes) that all 662,176 shapes device run 42 asked cuDNN for follow. The
  workspace has none found: cuDNN's heuristics size it, by algorithm, hidden size and
  length. So it comes from cuDNN's answers (`workspace`): the shapes measured op by op
  (rnn_events_sm90.json), then cuDNN asked for common shapes at every batch and length
  (rnn_segments_sm90.json, device run 43), then the line through a measured shape's
  points; a shape none has is refused (estimates from other shapes were off by up to 2x).

The weight gradients are tensors over one zeroed flat buffer, as cuDNN writes them, and
autograd keeps them as the parameters' .grad: one block for all of them, not one each
(a module without biases gets its own tensor per weight, copied out of that buffer)."""

import threading

import torch

from .capture import UnsupportedOp
from .refuse import on_fake_cuda

CUDNN_MODE = {"rnn_relu": 0, "rnn_tanh": 1, "lstm": 2, "gru": 3}
GATES = {0: 1, 1: 1, 2: 4, 3: 3}
_CUDNN_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_state = threading.local()


def _cfg(b, x):
    """The RNN's dimensions from a bound `_cudnn_rnn`-style call."""
    mode = int(b["mode"])
    bs = list(b.get("batch_sizes") or [])
    if bs:
        seq, batch = len(bs), int(bs[0])
    elif b["batch_first"]:
        batch, seq = int(x.shape[0]), int(x.shape[1])
    else:
        seq, batch = int(x.shape[0]), int(x.shape[1])
    rows = int(x.shape[0]) if bs else seq * batch
    drop = bool(b["train"]) and float(b["dropout"]) > 0
    P = int(b["proj_size"])
    return dict(drop=drop, mode=mode, gates=GATES[mode], I=int(x.shape[-1]),
                H=int(b["hidden_size"]), P=P, L=int(b["num_layers"]),
                D=2 if b["bidirectional"] else 1, N=batch, T=seq, rows=rows, packed=bool(bs),
                dtype=x.dtype, biases=int(b["weight_stride0"]) == _stride0(True, P))


def num_weights(c):
    """Elements of cuDNN's flat weight space: per layer and direction the input and hidden
    matrices of every gate, two biases a gate (cuDNN's double bias, there even for a module
    without bias) and the projection."""
    g, H, P, D = c["gates"], c["H"], c["P"], c["D"]
    out = P or H
    n = 0
    for layer in range(c["L"]):
        i = c["I"] if layer == 0 else out * D
        n += D * (g * H * (i + out) + 2 * g * H + (P * H if P else 0))
    return n


def layout(c, has_biases):
    """(offset, numel) in the flat buffer of each module parameter, in the module's order
    (w_ih, w_hh, [b_ih, b_hh], [w_hr] per layer and direction): cuDNN keeps a layer's
    matrices first, then its biases, then the projection."""
    g, H, P, D = c["gates"], c["H"], c["P"], c["D"]
    out = P or H
    res, off = [], 0
    for layer in range(c["L"]):
        i = c["I"] if layer == 0 else out * D
        for _ in range(D):
            w_ih, w_hh = (off, g * H * i), (off + g * H * i, g * H * out)
            off += g * H * (i + out)
            b_ih, b_hh = (off, g * H), (off + g * H, g * H)
            off += 2 * g * H
            w_hr = None
            if P:
                w_hr = (off, P * H)
                off += P * H
            res += [w_ih, w_hh] + ([b_ih, b_hh] if has_biases else []) + \
                ([w_hr] if w_hr else [])
    return res


_TABLES = {}
_MODE_NAME = {0: "RNN_RELU", 1: "RNN_TANH", 2: "LSTM", 3: "GRU"}


def _json(name):
    """A table shipped beside this file, read once."""
    import json
    import os

    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), name)) as f:
        return json.load(f)


def _table(row):
    name = row.get("rnn_events_table")
    if not name:
        return None
    if name not in _TABLES:
        d = _json(name)
        shapes = {}
        for k, pts in d["shapes"].items():
            m, dt, I, H, L, D, P, pk, drop = k.split("|")
            shapes[(m, dt, int(I), int(H), int(L), int(D), int(P), int(pk), int(drop))] = pts
        _TABLES[name] = (d, shapes)
    return _TABLES[name]


def _up(x, a):
    return -(-x // a) * a


def reserve_bytes(c, dropout):
    """cuDNN's training reserve space (cudnnGetRNNTempSpaceSizes): 256 bytes, then regions,
    each aligned to 32 bytes: per gate kind the activations of every layer and direction
    (LSTM two regions, 4 x hidden and 1 x hidden a row; GRU one of 6 x hidden; RNN one of
    hidden); with a projection two more (hidden, then proj_size, a row); the outputs of every
    layer but the last (hidden x directions a row); with dropout, per layer but the last and
    per direction, a bit mask over the next layer's input at the padded batch x steps (a
    packed input's too), each aligned to 32. Device run 42 asked cuDNN itself (query_ws.py)
    for 662,176 shapes: every one matches."""
    e = c["dtype"].itemsize
    gates = {0: (1,), 1: (1,), 2: (4, 1), 3: (6,)}[c["mode"]]
    H, P, D, L, rows = c["H"], c["P"], c["D"], c["L"], c["rows"]
    run = L * rows * e * D
    total = sum(_up(g * H * run, 32) for g in gates)
    if P:
        total += _up(H * run, 32) + _up(P * run, 32)
    total += _up((L - 1) * rows * D * H * e, 32)
    if dropout > 0:
        total += (L - 1) * D * _up(-(-c["N"] * c["T"] * D * (P or H) // 8), 32)
    return 256 + total


def workspace(c, kind, rec, row):
    """cuDNN's workspace for a training forward ("train"), an inference one ("eval") or the
    backward ("backward"): the measured shape's own at a measured batch and length, else
    the segments table's (cuDNN's answers for common shapes), else the measured shape's line
    in rows and batch (device run 41's sweeps fit it to the byte); else refused."""
    tab = _table(row)
    if tab is None:
        raise UnsupportedOp(torch.ops.aten._cudnn_rnn.default,
                            "cuDNN's RNN workspace was not measured on this GPU's "
                            "architecture")
    col = {"train": 3, "eval": 4, "backward": 5}[kind]
    dt = str(c["dtype"]).replace("torch.", "")
    key = (_MODE_NAME[c["mode"]], dt, c["I"], c["H"], c["L"], c["D"], c["P"], int(c["packed"]),
           int(c["drop"]))
    # an inference forward sets no dropout: a shape measured with dropout has its eval too
    cands = [key] + ([key[:-1] + (1 - key[-1],)] if kind == "eval" else [])
    stats = rec.hidden.stats
    for k in cands:
        for p in tab[1].get(k, ()):
            if (p[0], p[1], p[2]) == (c["N"], c["T"], c["rows"]):
                stats["rnn_measured"] = stats.get("rnn_measured", 0) + 1
                return p[col]
    seg = _segments(row, c, kind, getattr(rec.hidden, "gpu", None))
    if seg is not None:
        stats["rnn_measured"] = stats.get("rnn_measured", 0) + 1
        return seg
    for k in cands:
        fit = _line(tab[1].get(k, ()), col)
        if fit is not None:
            stats["rnn_measured"] = stats.get("rnn_measured", 0) + 1
            a, b, n = fit
            return int(a + b * c["rows"] + n * c["N"] + 32 * -(-c["N"] // 4))
    raise UnsupportedOp(torch.ops.aten._cudnn_rnn.default, unmeasured_why(c, key))


def persistent(c, gpu):
    """Whether RNN.cpp's get_algo picks CUDNN_RNN_ALGO_PERSIST_STATIC (float16, one
    unidirectional layer, hidden and input multiples of 128, hidden <= 1024, and a batch its
    device heuristics take: on sm80+ with 98+ SMs, LSTM and plain RNNs at batches that are
    multiples of 8 up to 128, plain RNNs not at 96+ with hidden 896+; GRU never). The only
    choice of algorithm that turns on the batch; the rest turn on hidden size alone."""
    if c["dtype"] != torch.float16 or c["P"] or c["packed"] or c["mode"] == 3:
        return False
    if not (c["L"] == 1 and c["D"] == 1 and c["H"] <= 1024 and c["H"] % 128 == 0 and
            c["I"] % 128 == 0) or gpu is None:
        return False
    if gpu.major < 8 or gpu.multi_processor_count < 98 or (gpu.major, gpu.minor) == (8, 6):
        return False
    N = c["N"]
    ok = N % 8 == 0 and N <= 128
    return ok and (c["mode"] == 2 or N < 96 or c["H"] < 896)


def _segments(row, c, kind, gpu):
    """The workspace from the architecture's segments table (rnn_segments_sm90.json, device
    run 43: cuDNN asked for common shapes at every length up to its tmax): on a segment,
    A(T0) + dA (T - T0) + (B(T0) + dB (T - T0)) x batch + 32 x ceil(batch / 4); None for a
    shape it lacks (a projection, a packed input, a longer input, a phase its checks
    dropped). RNN_RELU's workspaces are RNN_TANH's; an inference forward has no dropout.
    The segments come from batches 1 and 2, so a batch that switches cuDNN to its persistent
    kernel (`persistent`: float16 LSTMs at batches 8, 16, ...) is not on them: None."""
    name = row.get("rnn_segments_table")
    if not name or c["P"] or c["packed"] or persistent(c, gpu):
        return None
    if name not in _TABLES:
        _TABLES[name] = _json(name)
    doc = _TABLES[name]
    N, T = c["N"], c["T"]
    if T > doc["tmax"]:
        return None
    mode = {0: "RNN_TANH", 1: "RNN_TANH", 2: "LSTM", 3: "GRU"}[c["mode"]]
    dt = str(c["dtype"]).replace("torch.", "")
    drops = (0, 1) if kind == "eval" else (int(c["drop"]),)
    for d in drops:
        segs = doc["shapes"].get("|".join(str(v) for v in (mode, dt, c["I"], c["H"], c["L"],
                                                            c["D"], d)), {}).get(kind)
        for T0, T1, A0, dA, B0, dB in segs or ():
            if T0 <= T <= T1:
                return A0 + dA * (T - T0) + (B0 + dB * (T - T0)) * N + 32 * -(-N // 4)
    return None


def unmeasured_why(c, key):
    return ("cuDNN's RNN workspace for %s %s(input %d, hidden %d, %d layers%s%s%s) at batch %d x "
            "%d steps%s was not measured on this GPU's architecture; cuDNN's heuristics size it "
            "(estimates from the nearest measured shapes were off by up to 2x on device run "
            "41's random shapes), so it is not guessed: on a GPU, ask cuDNN for the shape with "
            "scripts/trace_corpus/rnn/segments.py, or measure it with "
            "scripts/trace_corpus/rnn/measure_rnn.py --configs" % (
                key[1], key[0], c["I"], c["H"], c["L"], ", bidirectional" if c["D"] == 2 else "",
                ", proj_size %d" % c["P"] if c["P"] else "", ", packed" if c["packed"] else "",
                c["N"], c["T"], " with dropout" if c["drop"] else ""))


_FITS = {}


def _line(pts, col):
    """(a, b, n): workspace = a + b x rows + n x batch + 32 x ceil(batch / 4), through a
    shape's measured points, where three or more fix it and all lie on it (else None).
    Solved once per shape and column (a training loop asks at every step)."""
    key = (id(pts), col)
    if key not in _FITS:
        _FITS[key] = _solve_line(pts, col)
    return _FITS[key]


def _solve_line(pts, col):
    if len({(p[2], p[0]) for p in pts}) < 3:
        return None
    from fractions import Fraction as Fr

    ys = [(Fr(p[2]), Fr(p[0]), Fr(p[col] - 32 * -(-p[0] // 4))) for p in pts]
    # least squares by the normal equations, exactly (three unknowns)
    cols = [[Fr(1)] * len(ys), [y[0] for y in ys], [y[1] for y in ys]]
    m = [[sum(a * b for a, b in zip(u, v)) for v in cols] +
         [sum(a * y[2] for a, y in zip(u, ys))] for u in cols]
    for i in range(3):
        piv = next((r for r in range(i, 3) if m[r][i] != 0), None)
        if piv is None:
            return None
        m[i], m[piv] = m[piv], m[i]
        for r in range(3):
            if r != i and m[r][i] != 0:
                f = m[r][i] / m[i][i]
                m[r] = [x - f * y for x, y in zip(m[r], m[i])]
    a, b, n = (m[i][3] / m[i][i] for i in range(3))
    if any(abs(a + b * y[0] + n * y[1] - y[2]) > 64 for y in ys):
        return None
    return a, b, n


def _aliases(buf, shapes_offsets):
    """Tensors over buf's storage, as RNN.cpp's get_parameters makes them (set_, not views:
    autograd sees no base). Made by set_ from a view (set_ from a storage keeps that
    storage alive for good under fake mode)."""
    out = []
    for shape, off in shapes_offsets:
        n = 1
        for d in shape:
            n *= int(d)
        t = buf.new_empty(0)
        t.set_(buf.narrow(0, off, n).view(shape))
        out.append(t)
    return out


def _param_aliases(buf, weights, c, has_biases):
    """Tensors over buf at the places cuDNN keeps the module's weights (layout)."""
    return _aliases(buf, [(w.shape, off) for w, (off, _) in zip(weights, layout(c, has_biases))])


def _stride0(has_biases, proj):
    return (4 if has_biases else 2) + (1 if proj else 0)


# -- the aten ops, run inside the recording mode (mode.py's fast paths) -----------------
def flatten_weight(row, rec, args, kwargs):
    """aten._cudnn_rnn_flatten_weight: a zeroed flat buffer; each weight copied into its
    place, then re-pointed at it (its own storage freed as it lets go)."""
    from .hidden import _bind

    b = _bind(torch.ops.aten._cudnn_rnn_flatten_weight.default, args, kwargs)
    ws = list(b["weight_arr"])
    proj = int(b["proj_size"])
    c = dict(mode=int(b["mode"]), gates=GATES[int(b["mode"])], I=int(b["input_size"]),
             H=int(b["hidden_size"]), P=proj, L=int(b["num_layers"]),
             D=2 if b["bidirectional"] else 1)
    has_biases = int(b["weight_stride0"]) == _stride0(True, proj)
    with torch.no_grad():
        buf = torch.zeros(num_weights(c), dtype=ws[0].dtype, device=ws[0].device)
        params = _param_aliases(buf, ws, c, has_biases)
        for w, p in zip(ws, params):
            p.copy_(w)
        for w, p in zip(ws, params):
            w.set_(p)
    return buf


def cudnn_rnn(row, rec, args, kwargs):
    """aten._cudnn_rnn (RNN.cpp): the input's contiguous copy (sequence-major), output, h_n,
    c_n, a flat weight buffer when the weights are not one, then workspace and reserve
    space; the workspace and the copy freed as it returns."""
    from .hidden import _bind

    b = _bind(torch.ops.aten._cudnn_rnn.default, args, kwargs)
    inp, hx, cx = b["input"], b["hx"], b.get("cx")
    c = _cfg(b, inp)
    packed = c["packed"]
    with torch.no_grad():
        x = inp.transpose(0, 1) if b["batch_first"] and not packed else inp
        x = x.contiguous()
        out_sz = _out_size(c) * c["D"]
        shape = [inp.shape[0], out_sz] if packed else [c["T"], c["N"], out_sz]
        output = inp.new_empty(shape)
        hy = hx.new_empty([c["L"] * c["D"], c["N"], _out_size(c)])
        cy = cx.new_empty([c["L"] * c["D"], c["N"], c["H"]]) if cx is not None else \
            hx.new_empty(0)
        wbuf = b.get("weight_buf")
        if wbuf is None:
            rec.warn("RNN module weights are not part of single contiguous chunk of memory: "
                     "cuDNN's RNN copies them into a new buffer at every call "
                     "(call flatten_parameters())")
            wbuf = inp.new_empty(num_weights(c))
            wbuf.zero_()
            for w, p in zip(b["weight"], _param_aliases(wbuf, b["weight"], c, c["biases"])):
                p.copy_(w)
        train = bool(b["train"])
        ws = torch.empty(workspace(c, "train" if train else "eval", rec, row),
                         dtype=torch.uint8, device=inp.device)
        reserve = torch.empty(reserve_bytes(c, float(b["dropout"])) if train else 0,
                              dtype=torch.uint8, device=inp.device)
        del ws, x
        if b["batch_first"] and not packed:
            output = output.transpose(0, 1)
    return output, hy, cy, reserve, wbuf


def _out_size(c):
    return c["P"] or c["H"]


def cudnn_rnn_backward(row, rec, args, kwargs):
    """aten._cudnn_rnn_backward (RNN.cpp): zeros for the gradients autograd did not give;
    _cudnn_rnn_backward_input (contiguous copies of the input and output gradient, dx, dhx,
    dcx, a workspace), then _cudnn_rnn_backward_weight (the input's copy again, the zeroed
    flat dw, a workspace). The weight gradients are tensors over dw (with biases; see
    _backward_weight)."""
    from .hidden import _bind

    b = _bind(torch.ops.aten._cudnn_rnn_backward.default, args, kwargs)
    inp, hx, cx, output = b["input"], b["hx"], b.get("cx"), b["output"]
    c = _cfg(b, inp)
    bf = b["batch_first"] and not c["packed"]
    mask = list(b["output_mask"])
    weight = list(b["weight"])
    with torch.no_grad():
        go, ghy, gcy = b.get("grad_output"), b.get("grad_hy"), b.get("grad_cy")
        if go is None and ghy is None and gcy is None:
            return None, None, None, [None] * len(weight)
        if go is None:
            go = torch.zeros_like(output, memory_format=torch.contiguous_format)
        if ghy is None:
            ghy = torch.zeros_like(hx, memory_format=torch.contiguous_format)
        if cx is not None and gcy is None:
            gcy = torch.zeros_like(cx, memory_format=torch.contiguous_format)
        ws_n = workspace(c, "backward", rec, row)
        dx, dhx, dcx = _backward_input(inp, go, ghy, gcy, hx, cx, bf, ws_n)
        dw = [None] * len(weight)
        if mask[3]:
            dw = _backward_weight(inp, bf, b["weight_buf"], ws_n, weight, c)
        del go, ghy, gcy
    return dx, dhx, dcx, dw


def _backward_weight(inp, bf, wbuf, ws_n, weight, c):
    """_cudnn_rnn_backward_weight: the gradients are tensors over the flat dw where the
    module's weights line up with cuDNN's parameters (with biases); without biases they do
    not, and each weight's gradient is a new tensor, copied out before the workspace, dw
    and the input's copy are freed (device run 41's bias=False shapes)."""
    x = (inp.transpose(0, 1) if bf else inp).contiguous()
    flat = torch.zeros(wbuf.shape, dtype=wbuf.dtype, device=wbuf.device)
    ws = torch.empty(ws_n, dtype=torch.uint8, device=inp.device)
    if c["biases"]:
        del ws, x
        return _param_aliases(flat, weight, c, True)
    grads = [torch.empty(w.shape, dtype=w.dtype, device=w.device) for w in weight]
    del ws, flat, x
    return grads


def _backward_input(inp, go, ghy, gcy, hx, cx, bf, ws_n):
    x = (inp.transpose(0, 1) if bf else inp).contiguous()
    dy = (go.transpose(0, 1) if bf else go).contiguous()
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    dhy = ghy.contiguous()
    dcy = gcy.contiguous() if gcy is not None else None
    dhx = torch.empty(hx.shape, dtype=hx.dtype, device=hx.device)
    dcx = torch.empty(cx.shape, dtype=cx.dtype, device=cx.device) if cx is not None else None
    ws = torch.empty(ws_n, dtype=torch.uint8, device=inp.device)
    del ws, dcy, dhy, dy, x
    if bf:
        dx = dx.transpose(0, 1)
    return dx, dhx, dcx


# -- the module side: _VF and flatten_parameters ---------------------------------------
def _weight_buf(params, c, has_biases):
    """RNN.cpp's try_get_weight_buf: the parameters' own flat storage where they all lie in
    it at cuDNN's offsets, else None (then _cudnn_rnn copies them at every call)."""
    if len({p.untyped_storage()._cdata for p in params}) != 1:
        return None
    st = params[0].untyped_storage()
    n = num_weights(c)
    if st.nbytes() < n * params[0].element_size():
        return None
    for p, (off, _) in zip(params, layout(c, has_biases)):
        if p.storage_offset() != off or not p.is_contiguous():
            return None
    with torch.no_grad():
        buf = params[0].new_empty(0)
        buf.set_(params[0].detach().as_strided((n,), (1,), 0))
    return buf


class RnnVF:
    """Stands in for torch.nn.modules.rnn's `_VF` during a trace (see the module's note)."""

    def __init__(self, vf, rec):
        self._vf = vf
        self._rec = rec
        self._dropout_state = None
        self._reseeded = False

    def __getattr__(self, name):
        fn = getattr(self._vf, name)
        if name not in CUDNN_MODE:
            return fn

        def rnn(*args):
            x = args[0]
            if not on_fake_cuda((x,), {}):
                return fn(*args)
            if not (torch.backends.cudnn.enabled and x.dtype in _CUDNN_DTYPES and
                    x.numel() > 0):
                return fn(*args)  # PyTorch's own cells: composites fake mode runs
            return self._cudnn(name, args)

        return rnn

    def reseed(self):
        """torch.manual_seed: the CUDA generator asks for new RNN dropout states."""
        self._reseeded = True

    def _dropout(self, p, train, x):
        if not (train and p > 0):
            return self._dropout_state
        if self._dropout_state is None or self._reseeded:
            self._reseeded = False
            seed = torch.empty((), dtype=torch.long, device=x.device)
            seed.random_()
            del seed
            tab = _table(self._rec.hidden.row)
            if tab is None or not tab[0].get("dropout_state_bytes"):
                raise UnsupportedOp(torch.ops.aten._cudnn_init_dropout_state.default,
                                    "cuDNN's dropout state was not measured on this GPU's "
                                    "architecture")
            n = tab[0]["dropout_state_bytes"]
            self._dropout_state = torch.empty(n, dtype=torch.uint8, device=x.device)
        return self._dropout_state

    def _cudnn(self, name, args):
        packed = isinstance(args[1], torch.Tensor) and args[1].device.type == "cpu"
        if packed:
            x, batch_sizes, hidden, params = args[0], args[1], args[2], list(args[3])
            has_biases, layers, p, train, bidir = args[4:9]
            batch_first = False
            bs = [int(v) for v in batch_sizes.tolist()]
        else:
            x, hidden, params = args[0], args[1], list(args[2])
            has_biases, layers, p, train, bidir, batch_first = args[3:9]
            bs = []
        mode = CUDNN_MODE[name]
        if mode == 2:
            hx, cx = hidden[0], hidden[1]
        else:
            hx, cx = hidden, None
        H, proj = int(hx.shape[2]), 0
        if cx is not None and cx.shape[2] != hx.shape[2]:
            H, proj = int(cx.shape[2]), int(hx.shape[2])
        c = dict(mode=mode, gates=GATES[mode], I=int(x.shape[-1]), H=H, P=proj, L=int(layers),
                 D=2 if bidir else 1)
        buf = _weight_buf(params, c, has_biases)
        state = self._dropout(p, train, x)
        stride0 = _stride0(has_biases, proj)
        amp = torch.is_autocast_enabled("cuda")
        with torch.autocast("cuda", enabled=False):
            if amp:
                params, buf, x, hx, cx = self._cast_reflatten(params, buf, x, hx, cx, c,
                                                              has_biases)
            out = list(torch.ops.aten._cudnn_rnn(x, params, stride0, buf, hx, cx, mode, H,
                                                 proj, int(layers), bool(batch_first),
                                                 float(p), bool(train), bool(bidir), bs,
                                                 state))
        ret = tuple(out[:3]) if mode == 2 else tuple(out[:2])
        # RNN.cpp's _cudnn_impl returns some of _cudnn_rnn's std::tuple and lets the rest go
        # first to last: under no_grad the reserve is freed before the weights' copy
        # (hg_lstm_bf16_tagger's real snapshot). A Python tuple would let go last to first.
        while out:
            del out[0]
        return ret

    def _cast_reflatten(self, params, buf, x, hx, cx, c, has_biases):
        """autocast's _cudnn_rnn_cast_reflatten (AutocastRNN.cpp): weights autocast may cast
        (floating, not double: is_eligible) and not float16 already are copied into a new
        flat float16 buffer (autograd sees the copies), then the input, h_0 and c_0 cast
        by the same test (cached_cast)."""
        half = torch.float16

        def eligible(t):  # autocast's is_eligible, and not already float16
            return t is not None and t.is_floating_point() and \
                t.dtype not in (torch.float64, half)

        if eligible(buf if buf is not None else params[0]):
            nbuf = torch.zeros(num_weights(c), dtype=half, device=x.device)
            nparams = _param_aliases(nbuf, params, c, has_biases)
            for w, q in zip(params, nparams):
                q.copy_(w)
            params, buf = nparams, nbuf

        def cast(t):
            return t.to(half) if eligible(t) else t
        # the call's arguments, evaluated right to left as GCC does: c_0, h_0, input
        cx = cast(cx)
        hx = cast(hx)
        x = cast(x)
        return params, buf, x, hx, cx

    @classmethod
    def install(cls, rec):
        import torch.nn.modules.rnn as rnn

        if not isinstance(rnn._VF, cls):
            rnn._VF = cls(rnn._VF, rec)
        _state.saved = (rnn.RNNBase.flatten_parameters, torch.manual_seed)
        rnn.RNNBase.flatten_parameters = flatten_parameters
        vf = rnn._VF

        def manual_seed(seed, _orig=torch.manual_seed):
            vf.reseed()
            return _orig(seed)

        torch.manual_seed = manual_seed
        return vf

    @classmethod
    def uninstall(cls):
        import torch.nn.modules.rnn as rnn

        if isinstance(rnn._VF, cls):
            rnn._VF = rnn._VF._vf
        saved = getattr(_state, "saved", None)
        if saved:
            rnn.RNNBase.flatten_parameters, torch.manual_seed = saved
            _state.saved = None


def flatten_parameters(self):
    """RNNBase.flatten_parameters with storages compared instead of data pointers (fake
    tensors have none); the rest as PyTorch 2.11 has it."""
    if len(self._flat_weights) != len(self._flat_weights_names):
        return
    for w in self._flat_weights:
        if not isinstance(w, torch.Tensor):
            return
    first = self._flat_weights[0]
    if not on_fake_cuda((first,), {}):
        return _state.saved[0](self)
    dtype = first.dtype
    for fw in self._flat_weights:
        if fw.dtype != dtype or not fw.is_cuda or not torch.backends.cudnn.is_acceptable(fw):
            return
    if len({w.untyped_storage()._cdata for w in self._flat_weights}) != \
            len(self._flat_weights):
        return
    import torch.backends.cudnn.rnn as cudnn_rnn

    with torch.no_grad():
        if torch._use_cudnn_rnn_flatten_weight():
            n = 4 if self.bias else 2
            if self.proj_size > 0:
                n += 1
            torch._cudnn_rnn_flatten_weight(
                self._flat_weights, n, self.input_size, cudnn_rnn.get_cudnn_mode(self.mode),
                self.hidden_size, self.proj_size, self.num_layers, self.batch_first,
                bool(self.bidirectional))



# -- packed sequences: torch.nn.utils.rnn's _VF ----------------------------------------
def _runs(lengths):
    """PackedSequence.cpp's walk over lengths sorted longest first: (start step, end step,
    batch) for each run of steps that the same number of sequences reach."""
    out, prev, B = [], 0, len(lengths)
    for i in range(B):
        n = lengths[B - 1 - i]
        if n > prev:
            out.append((prev, n, B - i))
            prev = n
    return out


def _batch_sizes(lengths):
    return [cur for prev, n, cur in _runs(lengths) for _ in range(n - prev)]


class _PackPadded(torch.autograd.Function):
    """PackedSequence.cpp's _pack_padded_sequence and its backward, on the lengths' values
    (host data the trace has): each run of equal lengths a contiguous copy of its slice,
    then their cat; the backward a zeroed input-shaped gradient filled step by step."""

    @staticmethod
    def forward(ctx, x, lengths, batch_first):
        inp = x.transpose(0, 1) if batch_first else x
        steps = [inp[prev:n, :cur].contiguous().view((-1,) + tuple(inp.shape[2:]))
                 for prev, n, cur in _runs(lengths)]
        data = torch.cat(steps)
        del steps
        ctx.sizes = _batch_sizes(lengths)
        ctx.shape, ctx.batch_first = tuple(x.shape), batch_first
        return data

    @staticmethod
    def backward(ctx, grad):
        shape = list(ctx.shape)
        if ctx.batch_first:
            shape[0], shape[1] = shape[1], shape[0]
        gi = grad.new_zeros(shape)
        off = 0
        for i, n in enumerate(ctx.sizes):
            gi[i][:n].copy_(grad[off:off + n])
            off += n
        if ctx.batch_first:
            gi = gi.transpose(0, 1)
        return gi, None, None


class PackVF:
    """Stands in for torch.nn.utils.rnn's `_VF` during a trace: pack_padded_sequence and
    pad_packed_sequence on fake CUDA data, whose output shapes the lengths decide (host
    values the trace has, where the fake kernels refuse a data-dependent shape)."""

    def __init__(self, vf):
        self._vf = vf

    def __getattr__(self, name):
        return getattr(self._vf, name)

    def _pack_padded_sequence(self, x, lengths, batch_first):
        if not on_fake_cuda((x,), {}):
            return self._vf._pack_padded_sequence(x, lengths, batch_first)
        ls = [int(v) for v in lengths.tolist()]
        data = _PackPadded.apply(x, ls, batch_first)
        return data, torch.tensor(_batch_sizes(ls), dtype=torch.int64)

    def _pad_packed_sequence(self, data, batch_sizes, batch_first, padding_value,
                             total_length):
        if not on_fake_cuda((data,), {}):
            return self._vf._pad_packed_sequence(data, batch_sizes, batch_first,
                                                 padding_value, total_length)
        bs = [int(v) for v in batch_sizes.tolist()]
        T = max(len(bs), total_length) if total_length > 0 else len(bs)
        out = torch.full((T, bs[0]) + tuple(data.shape[1:]), padding_value,
                         dtype=data.dtype, device=data.device)
        lengths = [0] * bs[0]
        off, prev_b, prev_i = 0, bs[0], 0
        for i in range(len(bs) + 1):
            b = bs[i] if i < len(bs) else 0
            if b != prev_b:
                n = prev_b * (i - prev_i)
                out[prev_i:i, :prev_b].copy_(
                    data[off:off + n].view((i - prev_i, prev_b) + tuple(data.shape[1:])))
                off += n
                for j in range(b, prev_b):
                    lengths[j] = i
                prev_b, prev_i = b, i
        if batch_first:
            out = out.transpose(0, 1)
        return out, torch.tensor(lengths, dtype=torch.int64)

    @classmethod
    def install(cls):
        import torch.nn.utils.rnn as utils

        if not isinstance(utils._VF, cls):
            utils._VF = cls(utils._VF)

    @classmethod
    def uninstall(cls):
        import torch.nn.utils.rnn as utils

        if isinstance(utils._VF, cls):
            utils._VF = utils._VF._vf
