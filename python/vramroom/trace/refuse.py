"""Ops the tracer refuses by name: their CUDA run takes memory from the caching allocator
that no table here models, so a trace would give a wrong number, which is worse than none.

- cuDNN RNNs reached some other way than nn.LSTM, nn.GRU and nn.RNN (rnn.py runs those):
  `_VF.lstm` & co. called directly are C++ composites that ask cuDNN for a handle before any
  op reaches the fake mode; the generic ops are refused in the mode, for code that calls them
  directly (rnn.py's `_VF` stands in for the modules' calls).
- F.one_hot without num_classes: its output's width is the data's max() + 1, read back to
  the host inside the composite (before any op reaches the fake mode's refusal of
  data-dependent shapes), so `one_hot_checked` stands in for F.one_hot during a trace.
"""

import torch

from .capture import UnsupportedOp

RNN_WHY = ("cuDNN's RNN reached other than through nn.LSTM, nn.GRU or nn.RNN (whose calls the "
           "tracer runs) is not modelled")
_RNN_FUNCS = ("lstm", "gru", "rnn_tanh", "rnn_relu")


def not_modelled_ops():
    """{aten overload: why} of the refused ops this PyTorch has."""
    aten = torch.ops.aten
    out = {}
    for names, why in (
        (["%s.%s" % (f, k) for f in _RNN_FUNCS for k in ("input", "data")], RNN_WHY),
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


ONE_HOT_WHY = ("its output shape depends on tensor values (without num_classes it is max() + 1 "
               "of the data); pass num_classes")


def one_hot_checked(orig):
    def one_hot(tensor, num_classes=-1):
        if num_classes == -1 and on_fake_cuda((tensor,), {}):
            raise UnsupportedOp(torch.ops.aten.one_hot.default, ONE_HOT_WHY)
        return orig(tensor, num_classes)

    return one_hot

