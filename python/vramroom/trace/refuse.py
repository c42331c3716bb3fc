"""Ops the tracer refuses by name: their CUDA run takes memory from the caching allocator
that no table here models, so a trace would give a wrong number, which is worse than none.

- cuDNN RNNs (nn.LSTM, nn.GRU, nn.RNN on CUDA): cuDNN sizes their workspace and reserve space
  at run time. The module calls `_VF.lstm` & co., C++ composites that ask cuDNN for a handle
  before any op reaches the fake mode (a CUDA runtime error on a machine with no GPU), so
  `RnnRefusal` stands in for torch.nn.modules.rnn's `_VF` while a trace runs and refuses
  them there; the aten ops are refused in the mode too, for code that calls them directly.
- cuFFT (torch.fft on CUDA): its plan's work area comes from the caching allocator.
- F.one_hot without num_classes: its output's width is the data's max() + 1, read back to
  the host inside the composite (before any op reaches the fake mode's refusal of
  data-dependent shapes), so `one_hot_checked` stands in for F.one_hot during a trace.
"""

import torch

from .capture import UnsupportedOp

RNN_WHY = ("cuDNN's RNN workspace and reserve space (nn.LSTM, nn.GRU, nn.RNN on CUDA) are "
           "not modelled")
FFT_WHY = "cuFFT's plan work area, which it takes from the caching allocator, is not modelled"
_RNN_FUNCS = ("lstm", "gru", "rnn_tanh", "rnn_relu")


def not_modelled_ops():
    """{aten overload: why} of the refused ops this PyTorch has."""
    aten = torch.ops.aten
    out = {}
    for names, why in (
        (["%s.%s" % (f, k) for f in _RNN_FUNCS for k in ("input", "data")] +
         ["_cudnn_rnn.default", "_cudnn_rnn_flatten_weight.default",
          "_cudnn_rnn_backward.default"], RNN_WHY),
        (("_fft_r2c.default", "_fft_c2r.default", "_fft_c2c.default"), FFT_WHY),
    ):
        for n in names:
            op = aten
            try:
                for part in n.split("."):
                    op = getattr(op, part)
            except AttributeError:
                continue
            out[op] = why
    return out


def on_fake_cuda(args, kwargs):
    """Whether a call's arguments hold a fake CUDA tensor (the trace's), at any depth."""
    import torch.utils._pytree as pytree
    from torch._subclasses.fake_tensor import FakeTensor

    return any(isinstance(a, FakeTensor) and a.device.type == "cuda"
               for a in pytree.tree_leaves((args, kwargs)))


class RnnRefusal:
    """Stands in for torch.nn.modules.rnn's `_VF` during a trace (see the module's notes)."""

    def __init__(self, vf):
        self._vf = vf

    def __getattr__(self, name):
        fn = getattr(self._vf, name)
        if name not in _RNN_FUNCS:
            return fn

        def refuse_on_cuda(*args, **kwargs):
            if on_fake_cuda(args, kwargs):
                raise UnsupportedOp(getattr(torch.ops.aten, name), RNN_WHY)
            return fn(*args, **kwargs)

        return refuse_on_cuda

    @classmethod
    def install(cls):
        import torch.nn.modules.rnn as rnn

        if not isinstance(rnn._VF, cls):
            rnn._VF = cls(rnn._VF)

    @classmethod
    def uninstall(cls):
        import torch.nn.modules.rnn as rnn

        if isinstance(rnn._VF, cls):
            rnn._VF = rnn._VF._vf


ONE_HOT_WHY = ("its output shape depends on tensor values (without num_classes it is max() + 1 "
               "of the data); pass num_classes")


def one_hot_checked(orig):
    def one_hot(tensor, num_classes=-1):
        if num_classes == -1 and on_fake_cuda((tensor,), {}):
            raise UnsupportedOp(torch.ops.aten.one_hot.default, ONE_HOT_WHY)
        return orig(tensor, num_classes)

    return one_hot

