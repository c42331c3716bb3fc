"""Trace an unmodified PyTorch program on fake CUDA (no GPU needed) and replay its memory on
Vramroom's allocator. See api.py for the API and capture.py for the design note.

    with vramroom.trace(gpu="h100") as t: train_step()     # or vramroom.trace.trace(...)
    t.replay(capacity="24GiB")
    python -m vramroom.trace --gpu h100 --capacity 24GiB -- train.py --bs 16

Importing this package does not import torch; tracing does.
"""

from .api import Trace, TraceError, check_torch, find_binary, replay_snapshot, run_script, trace
from .capture import UnsupportedOp
from .gpus import GPUS, get_gpu

__all__ = ["trace", "Trace", "run_script", "TraceError", "UnsupportedOp", "replay_snapshot",
           "find_binary", "check_torch", "GPUS", "get_gpu"]


# `vramroom.trace(gpu="h100")` as the issue and README write it: the package is also the
# call. A module cannot be called, so this one's class is a ModuleType whose __call__ is
# trace(); `python -m vramroom.trace` and `vramroom.trace.run_script` are unaffected.
import sys as _sys
import types as _types


class _CallableModule(_types.ModuleType):
    def __call__(self, gpu="h100", capacity=None):
        return trace(gpu=gpu, capacity=capacity)


_sys.modules[__name__].__class__ = _CallableModule
