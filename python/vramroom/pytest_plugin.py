"""A CUDA memory budget per test, for CI: the pytest plugin of the vramroom wheel.

    @pytest.mark.max_cuda_memory("2GiB")
    def test_forward(model):
        model(torch.randn(8, 3, 224, 224, device="cuda"))

    def test_train(cuda_memory):             # the fixture: figures, and a budget set inside
        cuda_memory.budget("6GiB")
        ...
        assert cuda_memory.peak_allocated < 5 << 30

A test over its budget fails with its peak, the budget, and a snapshot of the test's
allocations (`torch.cuda.memory._snapshot()`, pickled) that `vramroom replay`, `vramroom diff`
and pytorch.org/memory_viz open. Options: `--max-cuda-memory-dir DIR` (where snapshots go;
default .vramroom-pytest/), `--max-cuda-memory-scale F` (multiply every budget, e.g. for a
smaller CI GPU), `--max-cuda-memory-no-history` (no allocation history: cheaper, no snapshot).

Design note: the figures are PyTorch's own, read as the probe (vramroom.probe) reads them:
`torch.cuda.reset_peak_memory_stats(device)` before the test, `max_memory_allocated(device)`
(and `max_memory_reserved`) after it, with `torch.cuda.memory._record_memory_history` on
during the test so a failure can leave a snapshot. When `vramroom.torch` has installed
Vramroom's allocator, its functions of the same names are used (PyTorch's raise for a
pluggable allocator). The budget is on the peak allocated bytes: what the test's tensors
needed (reserved bytes depend on the cache left by earlier tests); the failure message gives
both. The peak counts everything live on the device during the test, including tensors made
before it (a module-level model), as `max_memory_allocated` does; `increase=True` on the marker
measures above the bytes allocated when the test started.

Without CUDA (CI), the test runs on fake CUDA under Vramroom's tracer (vramroom.trace: PyTorch's
fake tensors, no GPU and no data), which records every allocation the GPU run would make for
the target GPU (`--max-cuda-memory-gpu`, default h100) and replays them on Vramroom's allocator:
the budget is checked against that *predicted* peak, the failure message says so, and the
snapshot is the traced one. The test's own assertions on tensor values cannot hold there
(fake tensors have no data: `.item()` answers a placeholder, 1 or False), so a traced test passes or fails on its
memory alone. Where the tracer cannot run (no torch, a PyTorch version it does not support,
`--max-cuda-memory-no-trace`), the budget is not checked and a warning says why, so one suite
runs on CPU and GPU machines.
torch is imported only when a test asks for a budget: the plugin costs nothing otherwise.
"""

import os
import pickle
import re
import time
import warnings

import pytest

MARKER = "max_cuda_memory"

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}


def parse_size(value):
    """Bytes from an int or a size string ("2GiB", "512 MiB", "1.5GB"), as Vramroom's flags
    read them."""
    if isinstance(value, bool):
        raise ValueError("a memory budget must be bytes or a size string, not %r" % (value,))
    if isinstance(value, int):
        if value <= 0:
            raise ValueError("a memory budget must be more than 0 bytes, got %d" % value)
        return value
    if not isinstance(value, str):
        raise ValueError("a memory budget must be bytes or a size string, not %r" % (value,))
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+|[0-9]+\.)\s*([A-Za-z]*)\s*", value)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError("bad memory budget %r (expected e.g. 2GiB, 512MiB, 1.5GB)" % value)
    n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise ValueError("a memory budget must be more than 0 bytes, got %r" % value)
    return n


def human(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return "%.2f %s" % (n / div, unit)
    return "%d B" % n


class _Funcs:
    """PyTorch's memory functions, or vramroom.torch's when Vramroom's allocator is in."""

    def __init__(self, torch):
        self.torch = torch
        self.ht = None
        try:
            from vramroom import torch as ht

            if ht.enabled():
                self.ht = ht
        except Exception:  # vramroom.torch not usable here: PyTorch's own functions
            self.ht = None
        src = self.ht or torch.cuda
        self.reset_peak = src.reset_peak_memory_stats
        self.allocated = src.memory_allocated
        self.max_allocated = src.max_memory_allocated
        self.max_reserved = src.max_memory_reserved

    def record_history(self, on, max_entries):
        src = self.ht or self.torch.cuda.memory
        if on:
            # Python stacks only: C++ frames cost seconds to symbolize at snapshot time, and
            # the allocation sites a reviewer acts on are Python lines.
            src._record_memory_history(max_entries=max_entries, stacks="python")
        else:
            src._record_memory_history(enabled=None)

    def snapshot(self):
        if self.ht is not None:
            return self.ht.snapshot()
        return self.torch.cuda.memory._snapshot()

    def synchronize(self, device):
        sync = getattr(self.torch.cuda, "synchronize", None)
        if sync is not None:
            sync(device)


class CudaMemory:
    """One test's CUDA memory: the `cuda_memory` fixture, and what the marker checks.

    After the test (or at any point inside it): `peak_allocated`, `peak_reserved` (bytes,
    since the test started), `start_allocated`, `increase` (peak above the start).
    `budget(limit, increase=False)` sets or tightens the test's budget.
    """

    def __init__(self, device=None, gpu="h100", trace=True):
        self.device = device
        self.gpu = gpu
        self.allow_trace = trace
        self.predicted = False  # the figures come from a fake-CUDA trace, not a GPU
        self.not_checked = None  # why a budget could not be checked
        self._trace = None  # the trace while the test runs
        self._traced = None  # the finished trace, for the failure's snapshot
        self.limit = None
        self.measure_increase = False
        self.available = False
        self.start_allocated = 0
        self._final = None
        self._funcs = None
        self.snapshot_path = None

    # --- the measurement -------------------------------------------------------------
    def _begin(self, history, max_entries):
        try:
            import torch
        except ImportError:
            return
        if not torch.cuda.is_available():
            self._begin_trace()
            return
        self.available = True
        self._funcs = _Funcs(torch)
        if self.device is None:
            self.device = torch.cuda.current_device()
        self._funcs.synchronize(self.device)
        self._history = history
        if history:
            self._funcs.record_history(True, max_entries)
        self._funcs.reset_peak(self.device)
        self.start_allocated = self._funcs.allocated(self.device)

    def _begin_trace(self):
        if not self.allow_trace:
            self.not_checked = "no CUDA device, and tracing is off (--max-cuda-memory-no-trace)"
            return
        try:
            from .trace import Trace

            t = Trace(gpu=self.gpu)
            t.__enter__()
        except Exception as e:  # an unsupported torch, an unknown GPU: say why, run anyway
            self.not_checked = "no CUDA device, and the fake-CUDA tracer cannot run: %s" % e
            return
        self._trace = t
        self.available = True
        self.predicted = True
        self.device = 0

    def _end_trace(self):
        t, self._trace = self._trace, None
        t.__exit__(None, None, None)
        try:
            row = t.replay()[0]
            self._final = (int(row["peak_allocated_bytes"]), int(row["peak_reserved_bytes"]))
        except Exception as e:  # no CLI to replay with: the trace's own allocated peak
            self._final = (t.peak_allocated, 0)
            warnings.warn(pytest.PytestWarning("vramroom: no replay of the trace (%s); "
                                               "peak reserved unknown" % e))
        self._traced = t

    def _end(self):
        if not self.available or self._final is not None:
            return
        if self.predicted:
            self._end_trace()
            return
        self._funcs.synchronize(self.device)
        self._final = (
            self._funcs.max_allocated(self.device),
            self._funcs.max_reserved(self.device),
        )

    def _stop_history(self):
        if self._trace is not None:  # the test failed before its report: close the trace
            self._trace.__exit__(None, None, None)
            self._trace = None
        if self.available and not self.predicted and self._history:
            self._funcs.record_history(False, 0)

    @property
    def peak_allocated(self):
        if self._final is not None:
            return self._final[0]
        return self._funcs.max_allocated(self.device) if self.available else 0

    @property
    def peak_reserved(self):
        if self._final is not None:
            return self._final[1]
        return self._funcs.max_reserved(self.device) if self.available else 0

    @property
    def increase(self):
        return max(0, self.peak_allocated - self.start_allocated)

    # --- the budget ------------------------------------------------------------------
    def budget(self, limit, increase=False):
        """Fail the test if its peak allocated bytes (above the start with increase=True)
        exceed `limit` (bytes or "2GiB"). A second call keeps the tighter budget."""
        n = parse_size(limit)
        if self.limit is None or n < self.limit:
            self.limit = n
            self.measure_increase = bool(increase)

    def measured(self):
        return self.increase if self.measure_increase else self.peak_allocated

    def over_budget(self):
        return self.available and self.limit is not None and self.measured() > self.limit

    def _dump(self, directory, nodeid):
        snap = self._traced.snapshot_dict() if self.predicted else self._funcs.snapshot()
        os.makedirs(directory, exist_ok=True)
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")[:150] or "test"
        path = os.path.join(directory, "%s.%d.pickle" % (name, int(time.time())))
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            pickle.dump(snap, f)
        os.replace(tmp, path)  # never a partial snapshot under the final name
        self.snapshot_path = path
        return path


def pytest_addoption(parser):
    g = parser.getgroup("vramroom", "CUDA memory budgets (vramroom)")
    g.addoption("--max-cuda-memory-dir", default=".vramroom-pytest", metavar="DIR",
                help="where snapshots of tests over their CUDA memory budget go "
                     "(default: .vramroom-pytest)")
    g.addoption("--max-cuda-memory-scale", type=float, default=1.0, metavar="F",
                help="multiply every max_cuda_memory budget by F (e.g. 0.5 on a smaller GPU)")
    g.addoption("--max-cuda-memory-no-history", action="store_true",
                help="do not record allocation history during budgeted tests "
                     "(cheaper; no snapshot on failure)")
    g.addoption("--max-cuda-memory-entries", type=int, default=100000, metavar="N",
                help="allocation history entries kept for the failure snapshot (default 100000)")
    g.addoption("--max-cuda-memory-gpu", default="h100", metavar="NAME",
                help="without CUDA, budgets are checked on a fake-CUDA trace for this GPU "
                     "(h100, h200, a100, a100-40gb, l4; default h100)")
    g.addoption("--max-cuda-memory-no-trace", action="store_true",
                help="without CUDA, do not trace: run budgeted tests unchecked (a warning says so)")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "max_cuda_memory(limit, increase=False, device=None): fail the test if its CUDA peak "
        "allocated bytes (torch.cuda.max_memory_allocated) exceed limit ('2GiB' or bytes); "
        "writes a snapshot of the test's allocations when it does",
    )


@pytest.fixture
def cuda_memory(request):
    """The test's CUDA memory (see vramroom.pytest_plugin.CudaMemory): peak_allocated,
    peak_reserved, increase, and budget(limit) to fail the test over a budget."""
    rec = request.node.stash.get(_KEY, None)
    if rec is None:
        rec = _start(request.node, None)
    return rec


_KEY = pytest.StashKey()


def _start(item, marker):
    device = marker.kwargs.get("device") if marker is not None else None
    opt = item.config.getoption
    rec = CudaMemory(device, gpu=opt("--max-cuda-memory-gpu"),
                     trace=not opt("--max-cuda-memory-no-trace"))
    if marker is not None:
        if not marker.args and "limit" not in marker.kwargs:
            raise pytest.UsageError("%s: max_cuda_memory needs a limit, e.g. "
                                    "@pytest.mark.max_cuda_memory('2GiB')" % item.nodeid)
        limit = marker.args[0] if marker.args else marker.kwargs["limit"]
        try:
            n = parse_size(limit)
        except ValueError as e:
            raise pytest.UsageError("%s: %s" % (item.nodeid, e))
        scale = item.config.getoption("--max-cuda-memory-scale")
        rec.budget(max(1, int(n * scale)), marker.kwargs.get("increase", False))
    rec._begin(not opt("--max-cuda-memory-no-history"), opt("--max-cuda-memory-entries"))
    item.stash[_KEY] = rec
    return rec


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    marker = item.get_closest_marker(MARKER)
    if marker is not None or "cuda_memory" in getattr(item, "fixturenames", ()):
        _start(item, marker)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when != "call":
        return
    rec = item.stash.get(_KEY, None)
    if rec is None:
        return
    report = outcome.get_result()
    rec._end()
    if not rec.available:
        if rec.limit is not None:
            warnings.warn(pytest.PytestWarning(
                "%s: max_cuda_memory budget %s not checked: %s"
                % (item.nodeid, human(rec.limit), rec.not_checked or "no CUDA device")))
        return
    what = "increase of allocated" if rec.measure_increase else "peak allocated"
    if rec.predicted:
        what = "predicted " + what
        where = "%s (fake-CUDA trace, no GPU used)" % rec.gpu
    else:
        where = "cuda:%s" % rec.device
    line = "CUDA %s %s (peak reserved %s) on %s" % (
        what, human(rec.measured()), human(rec.peak_reserved), where)
    if rec.limit is not None:
        line += ", budget %s" % human(rec.limit)
    report.sections.append(("vramroom", line))
    item.user_properties.append(("cuda_peak_allocated_bytes", rec.peak_allocated))
    item.user_properties.append(("cuda_peak_reserved_bytes", rec.peak_reserved))
    if report.passed and rec.over_budget():
        try:
            path = rec._dump(item.config.getoption("--max-cuda-memory-dir"), item.nodeid)
            hint = ("\nsnapshot of the test's allocations: %s\n"
                    "  see it: vramroom replay %s   (or open it in pytorch.org/memory_viz)"
                    % (path, path))
        except Exception as e:  # the verdict stands without a snapshot
            hint = "\n(no snapshot: %s: %s)" % (type(e).__name__, e)
        report.outcome = "failed"
        report.longrepr = (
            "%s: CUDA memory over budget: %s %s (%d bytes) > budget %s (%d bytes); "
            "peak reserved %s, on %s%s"
            % (item.nodeid, what, human(rec.measured()), rec.measured(), human(rec.limit),
               rec.limit, human(rec.peak_reserved), where, hint)
        )


def pytest_runtest_teardown(item):
    rec = item.stash.get(_KEY, None)
    if rec is not None:
        rec._stop_history()
