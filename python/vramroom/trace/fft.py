"""torch.fft on CUDA: what cuFFT's path allocates around a transform's output, for the three
aten ops every torch.fft function and torch.stft reach (_fft_r2c, _fft_c2r, _fft_c2c).

PyTorch 2.11's SpectralOps.cpp, ported over shapes and strides (meta tensors carry them):
- _fft_r2c: the output; one _exec_fft over all dims when cuFFT takes them in one plan (at
  most three, not starting with dims 0 and 1); else an R2C over the last dim, then C2C over
  the rest (at most three at a time) between the output and a second buffer, the one not
  returned freed at the end; two-sided (torch.fft.fft of a real tensor) over several dims
  resizes that buffer to the full size (a new block) and copies the half into it.
- _fft_c2r: the output, then the input cloned (C2R overwrites its input), or a C2C over all
  dims but the last first; the C2R; the clone freed.
- _fft_c2c: the output; C2C at most three dims at a time, a second buffer after the first
  stage when more remain.
- _exec_fft: batch dims first in stride order, signal dims last, reshaped to one batch dim
  (a copy where the batch dims do not collapse, e.g. stft's overlapping frames at batch > 1);
  then the plan's clone of the input where cuFFT's embedded strides cannot describe it (or a
  half-precision signal whose last stride is not 1), the copy freed as the clone replaces it;
  then the plan's work area, `at::empty({workspace_size})`, freed first when it returns, then
  the copy or the clone.

The work area is cuFFT's own choice per plan; no formula gives it (0 for most lengths, a
multiple of the batch for some, irregular for Bluestein's primes). It comes from a table
measured on the GPU (fft_sm90.json, device runs 45 and 46's 9,894 transforms: exact at a measured
batch, on the line between two, scaled past the largest); a signal size the table lacks is
refused by name, with the command that measures it.
"""

import json
import os

from .hidden import value_at

_HERE = os.path.dirname(os.path.abspath(__file__))
MAX_NDIM = 3  # cufft_max_ndim
_TABLES = {}


def table(name):
    """{(kind, dtype, signal sizes, layout): [(batch, work area bytes), ...]} of a measured
    table."""
    if name not in _TABLES:
        p = os.path.join(_HERE, name)
        t = {}
        if os.path.exists(p):
            with open(p) as f:
                for e in json.load(f)["entries"]:
                    t[(e["kind"], e["dtype"], tuple(e["signal"]), e["layout"])] = sorted(
                        (int(b), int(w)) for b, w in e["by_batch"].items())
        _TABLES[name] = t
    return _TABLES[name]


# The work area at a batch from the measured (batch, bytes) points: exact at a measured
# batch, on the line between two, scaled past the largest (hidden.value_at, which reads the
# meta twin's conv points too).
work_area = value_at


class _Plan:
    """The allocations of one op, in order: ("a", buf) and ("f", buf); buf = [bytes]."""

    def __init__(self, torch, lookup):
        self.torch = torch
        self.lookup = lookup  # (kind, value dtype, signal sizes, batch, layout) -> bytes
        self.ev = []

    def alloc(self, nbytes):
        b = [nbytes]
        self.ev.append(("a", b))
        return b

    def free(self, b):
        if b is not None:
            self.ev.append(("f", b))

    def meta(self, shape, strides, dtype):
        return self.torch.empty_strided(shape, strides, dtype=dtype, device="meta")

    def new(self, sizes, dtype):
        """A new contiguous tensor: (its block, its meta twin)."""
        t = self.torch.empty(sizes, dtype=dtype, device="meta")
        return self.alloc(t.numel() * t.element_size()), t

    def exec_fft(self, out, x, out_sizes, dims, kind):
        """_exec_fft into out (a meta tensor, re-strided as cuFFT writes it; returned) from
        x; the input copies and the work area are allocated and freed here."""
        torch = self.torch
        ndim, sig_nd = x.dim(), len(dims)
        nb = ndim - sig_nd
        batch = sorted((d for d in range(ndim) if d not in dims), key=lambda d: -x.stride(d))
        perm = batch + list(dims)
        inp = x.permute(perm)
        shaped = [-1] + list(inp.shape[nb:])
        r = inp.reshape(shaped)
        # a view shares the storage (_is_view() would not say: below autograd's keys, as in
        # a dispatch, views carry no view metadata)
        same = r.untyped_storage()._cdata == x.untyped_storage()._cdata
        copy = None if same else self.alloc(r.numel() * r.element_size())
        bsz = r.shape[0]
        signal = [max(r.shape[1 + i], out_sizes[d]) for i, d in enumerate(dims)]
        strides = list(r.stride())
        clone = False
        if x.dtype in (torch.float16, torch.complex32):
            clone = strides[-1] != 1
        if not clone:  # NOTE [ cuFFT Embedded Strides ]
            last = strides[sig_nd]
            clone = last <= 0
            for i in range(sig_nd - 1, 0, -1):
                if clone:
                    break
                if strides[i] > 0 and strides[i] % last == 0:
                    last = strides[i]
                else:
                    clone = True
        held = copy
        if clone:
            held = self.alloc(r.numel() * r.element_size())
            self.free(copy)
        value = x.dtype.to_real() if x.dtype.is_complex else x.dtype
        # cuFFT plans another way (another work area) for strided data: the input as the
        # plan sees it (after a clone: contiguous), the output as written (a two-sided R2C
        # writes rows longer than its half spectrum)
        nat_out = [n // 2 + 1 if kind == "r2c" and i == sig_nd - 1 else n
                   for i, n in enumerate(signal)]
        layout = ("simple" if (clone or r.is_contiguous()) else "strided") + \
            ("" if [out_sizes[d] for d in dims] == nat_out or kind == "c2r" else "+wide")
        ws = self.lookup(kind, value, tuple(signal), bsz, layout)
        wb = self.alloc(ws) if ws else None
        self.free(wb)
        self.free(held)
        bo = [bsz] + [out_sizes[d] for d in dims]
        cont = [1] * len(bo)
        for i in range(len(bo) - 2, -1, -1):
            cont[i] = cont[i + 1] * bo[i + 1]
        ost = [0] * ndim
        n = 1
        for i in range(nb - 1, -1, -1):
            ost[perm[i]] = n * cont[0]
            n *= out_sizes[perm[i]]
        for i in range(nb, ndim):
            ost[perm[i]] = cont[1 + i - nb]
        return self.meta(list(out_sizes), ost, out.dtype)

    # -- the three ops ----------------------------------------------------------------
    def r2c(self, x, dims, onesided):
        sizes = list(x.shape)
        last = dims[-1]
        half = list(sizes)
        half[last] = sizes[last] // 2 + 1
        out_sizes = half if onesided else sizes
        cdt = x.dtype.to_complex()
        obuf, out = self.new(out_sizes, cdt)
        work, wbuf = x, None
        if x.storage_offset() % 2:  # real input must be aligned as if complex
            wbuf = self.alloc(x.numel() * x.element_size())
            work = x.movedim(last, -1).contiguous().movedim(-1, last)
        if _one_plan(dims):
            self.exec_fft(out, work, out_sizes, dims, "r2c")
            self.free(wbuf)
            return obuf
        # more than one dim here (one always takes one plan): R2C over the last into the
        # half spectrum, then the C2C stages between two buffers
        out = self.exec_fft(out, work, half, [last], "r2c")
        self.free(wbuf)
        wbuf, work = self.new(out_sizes, cdt)
        rest = list(dims[:-1])
        while rest:
            obuf, wbuf = wbuf, obuf
            out, work = work, out
            rest.sort(key=lambda d: -work.stride(d))
            take = rest[-min(MAX_NDIM, len(rest)):]
            out = self.exec_fft(out, work, half, take, "c2c")
            rest = rest[:-len(take)]
        if not onesided and out.shape[last] != out_sizes[last]:
            # the half is copied into the other buffer (made full-sized), which is returned
            obuf, wbuf = wbuf, obuf
        self.free(wbuf)
        return obuf

    def c2r(self, x, dims, lastdim):
        out_sizes = list(x.shape)
        out_sizes[dims[-1]] = lastdim
        obuf, out = self.new(out_sizes, x.dtype.to_real())
        if _one_plan(dims):
            tbuf = self.alloc(x.numel() * x.element_size())
            self.exec_fft(out, x.contiguous(), out_sizes, dims, "c2r")
        else:  # several dims: C2C over all but the last first, its result the C2R's input
            tbuf, temp = self.c2c(x, dims[:-1])
            self.exec_fft(out, temp, out_sizes, [dims[-1]], "c2r")
        self.free(tbuf)
        return obuf

    def c2c(self, x, dims):
        """The op's blocks; returns (the returned block, its meta twin)."""
        out_sizes = list(x.shape)
        if not dims:
            return self.new(out_sizes, x.dtype)
        obuf, out = self.new(out_sizes, x.dtype)
        work, wbuf = x, None
        rest = list(dims)
        while True:
            rest.sort(key=lambda d: -work.stride(d))
            take = rest[-min(MAX_NDIM, len(rest)):]
            out = self.exec_fft(out, work, out_sizes, take, "c2c")
            rest = rest[:-len(take)]
            if not rest:
                break
            if wbuf is None:
                work, wbuf = out, obuf
                obuf, out = self.new(out_sizes, x.dtype)
            else:
                obuf, wbuf = wbuf, obuf
                out, work = work, out
        self.free(wbuf)
        return obuf, out


def _one_plan(dims):
    """use_optimized_cufft_path: one cuFFT plan takes them all."""
    return not (len(dims) > MAX_NDIM or (len(dims) >= 2 and dims[0] == 0 and dims[1] == 1))


def tokens(op, x, args, lookup):
    """The event tokens (hidden.py's: ["o", n] the returned block, ["t", n] another, ["f",
    i] the free of the i-th "t") of _fft_r2c(x, dim, normalization, onesided),
    _fft_c2r(x, dim, normalization, last_dim_size) or _fft_c2c(x, dim, normalization,
    forward) on a tensor like x. lookup(kind, value dtype, signal sizes, batch, layout) gives
    a work area (or raises, for a plan it does not know)."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # plain meta tensors, whatever mode is on
        return _tokens(torch, op, x, args, lookup)


def _tokens(torch, op, x, args, lookup):
    dims = [d % x.dim() for d in args[0]]
    m = torch.empty_strided(list(x.shape), list(x.stride()), dtype=x.dtype, device="meta")
    if x.storage_offset():
        m = torch.empty_strided([x.storage_offset() + 1 + max(
            ((s - 1) * st for s, st in zip(x.shape, x.stride())), default=0)], [1],
            dtype=x.dtype, device="meta").as_strided(list(x.shape), list(x.stride()),
                                                     x.storage_offset())
    p = _Plan(torch, lookup)
    if op == "r2c":
        ret = p.r2c(m, dims, bool(args[2]))
    elif op == "c2r":
        ret = p.c2r(m, dims, int(args[2]))
    else:
        ret = p.c2c(m, dims)[0]
    toks, tid = [], {}
    for k, b in p.ev:
        if k == "a":
            if b is ret:
                toks.append(["o", b[0]])
            else:
                tid[id(b)] = len(tid)
                toks.append(["t", b[0]])
        elif b is not ret:
            toks.append(["f", tid[id(b)]])
    return toks
