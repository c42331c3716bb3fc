"""Trace an unmodified PyTorch program on fake CUDA (no GPU needed) and replay its memory on
Vramroom's allocator. See api.py for the API and capture.py for the design note.

    with vramroom.trace.trace(gpu="h100") as t: train_step()
    t.replay(capacity="24GiB")
    python -m vramroom.trace --gpu h100 --capacity 24GiB -- train.py --bs 16

Importing this package does not import torch; tracing does.
"""

from .api import Trace, TraceError, check_torch, find_binary, replay_snapshot, run_script, trace
from .capture import UnsupportedOp
from .gpus import GPUS, get_gpu

__all__ = ["trace", "Trace", "run_script", "TraceError", "UnsupportedOp", "replay_snapshot",
           "find_binary", "check_torch", "GPUS", "get_gpu"]
