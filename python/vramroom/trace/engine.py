"""Autograd's CUDA device thread under the trace: when it lets go of a finished backward.

Design note. On the GPU, a backward that reaches CUDA tensors runs on the engine's device
thread, which wakes backward()'s caller as soon as the graph task is done and only then drops
its own reference to the task. The task holds the graph's roots, so a graph nobody else keeps
(torch.func.grad's, one a loop body rebinds) is freed by that drop: its saved tensors go back
to the caching allocator from the device thread. That drop needs no GIL on the GPU, while the
caller has to take the GIL back before it can run the next Python line, so the frees land
before the caller's next allocation (device run 40 recorded ht_func_per_sample_grads so, and
every solo trace matched it).

Under the trace the drop does take the GIL: the task's thread-local state holds the dispatch
modes (the recording mode, FakeTensorMode) as SafePyObjects, whose decref needs it. The caller
and the device thread then race for the GIL, and on a loaded machine the caller often wins:
four concurrent traces of ht_func_per_sample_grads gave four different event orders. So each
backward the trace sees waits for its task's drop before returning (`barrier`), which puts
the frees where the GPU puts them, every time.

How the drop is seen: a marker mode, referenced by nothing else, is pushed on the torch
function mode stack around the engine call itself (below torch.autograd.grad and backward,
which are torch functions and would pop it while handled); the graph task captures that stack
in its thread-local state, and the marker dies only when the device thread has released both copies (its
thread-local guard, the task), the last of its decrefs. A torch function mode is the cheap
marker: the engine's C++ nodes never call it, only a custom Function's Python backward does,
and it passes every call through. The wait sleeps, so the thread can take the GIL.

At exit (`drain`) the same holds for the process: a program that ends right after the trace
can reach interpreter shutdown first; the thread's GIL request then ends it inside C++
("terminate called without an active exception", exit 134, PyTorch issue #38228).
"""
import logging
import threading
import time
import weakref

_LOG = logging.getLogger(__name__)
# How long a drop may take before the trace goes on without it: a drop takes microseconds
# once the thread has the GIL; this bounds a thread that never lets go.
WAIT_S = 5.0
# Kept for the process: released, the drain's own graph could be the last reference again.
_ENGINE_BARRIER = []


def _marker_class():
    from torch.overrides import TorchFunctionMode

    class _Marker(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    return _Marker


def _dispatch_marker_class():
    # The drain's marker: torch.autograd.grad itself is a torch function, and a torch
    # function mode is off its stack while it handles one, so the task would not capture it.
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Marker(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    return _Marker


def _await_release(marker_ref):
    deadline = time.monotonic() + WAIT_S
    while marker_ref() is not None and time.monotonic() < deadline:
        time.sleep(0.0005)
    return marker_ref() is None


def barrier(run_backward):
    """`torch.autograd.graph._engine_run_backward` that returns once the device thread has
    dropped the graph task it ran."""
    marker_class = _marker_class()
    main = threading.main_thread().ident

    def run(*args, **kwargs):
        # A backward called from a backward (reentrant checkpointing) runs on the device
        # thread itself, which must not wait for itself.
        if threading.get_ident() != main:
            return run_backward(*args, **kwargs)
        marker = marker_class()
        with marker:
            out = run_backward(*args, **kwargs)
        gone = weakref.ref(marker)
        del marker
        if not _await_release(gone):
            _LOG.debug("autograd device thread still holds a graph task after %.0f s", WAIT_S)
        return out

    return run


def drain():
    """Wait until autograd's CUDA device thread has let go of the last backward: a tiny
    backward through the same thread (a fresh FakeTensorMode, nothing recorded) is a barrier,
    since the thread runs its tasks one at a time. Returns whether it let go in time."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        with FakeTensorMode():
            x = torch.zeros(1, device="cuda", requires_grad=True)
            y = x * 2
            g = torch.ones_like(y)
            marker = _dispatch_marker_class()()
            with marker:
                grads = torch.autograd.grad(y, x, g)
            _ENGINE_BARRIER.append((x, y, g, grads))
        gone = weakref.ref(marker)
        del marker
        let_go = _await_release(gone)
        if not let_go:
            _LOG.debug("autograd device thread still holds a graph task")
        return let_go
    except Exception as e:  # noqa: BLE001 - the trace is complete; only shutdown is at stake
        _LOG.debug("autograd device thread not drained: %s", e)
        return False
