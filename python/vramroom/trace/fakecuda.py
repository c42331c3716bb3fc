"""CUDA, faked: what lets an unmodified program believe it has a GPU while FakeTensorMode runs
its tensors.

Two layers:
- `patch_cuda_hooks()`: one C++ virtual call. The autograd engine, on every backward whose
  graph touches a cuda tensor, asks the CUDA hooks `hasPrimaryContext(i)` for each device the
  (FakeTensorMode-installed, no-op) CUDA guard reports, and PyTorch's answer throws on a
  machine with no device. We point that one slot of the hooks object's vtable at a function
  that answers True (the engine then takes the no-op guard's default stream). Nothing else
  in the C++ runtime is touched; see capture.py's design note for why this route.
- `CudaApi`: the `torch.cuda` Python functions user code calls (is_available, device
  properties, streams, events, memory statistics, empty_cache, ...), answered from the
  target GPU's table and the live trace. Installed for the trace and restored after.
"""

import ctypes
import os
import threading
import weakref

_HOOKS_LOCK = threading.Lock()
_HOOKS_STATE = {}  # keeps the vtable copy and the callback alive for the process


def patch_cuda_hooks():
    """Make `at::detail::getCUDAHooks().hasPrimaryContext(i)` answer True (idempotent)."""
    import torch

    with _HOOKS_LOCK:
        if _HOOKS_STATE.get("done"):
            return
        if torch.version.cuda is None:
            raise RuntimeError(
                "vramroom.trace needs a CUDA build of PyTorch (any machine, no GPU needed); "
                "this torch %s is a CPU-only build" % torch.__version__
            )
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        get = lib._ZN2at6detail12getCUDAHooksEv  # at::detail::getCUDAHooks()
        get.restype = ctypes.c_void_p
        obj = get()
        if not obj:
            raise RuntimeError("vramroom.trace: PyTorch's CUDA hooks are not registered")
        vptr = ctypes.c_void_p.from_address(obj).value
        # Itanium C++ ABI vtable of AcceleratorHooksInterface (PyTorch 2.11):
        # [0] ~dtor, [1] deleting dtor, [2] isBuilt, [3] isAvailable, [4] hasPrimaryContext.
        # The copy keeps the two words before the address point (offset-to-top, RTTI).
        nslots = 256
        table = (ctypes.c_void_p * (nslots + 2))()
        ctypes.memmove(table, vptr - 16, (nslots + 2) * 8)
        proto = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_int8)
        cb = proto(lambda self, idx: True)
        table[2 + 4] = ctypes.cast(cb, ctypes.c_void_p).value
        ctypes.c_void_p.from_address(obj).value = ctypes.addressof(table) + 16
        _HOOKS_STATE.update(done=True, table=table, cb=cb, orig_vptr=vptr, obj=obj)
        # The copy and the callback are Python objects, freed when the interpreter shuts
        # down, before C++'s static destructors run the hooks' (virtual) destructor: put
        # the original vtable back first.
        import atexit

        atexit.register(_unpatch_cuda_hooks)
        # FakeTensor.__new__ "initialises the GPU context" (a real torch.empty on the device)
        # once per device, cached, when torch.cuda.is_available(); it answers True under
        # the trace, so fill that cache now, while it is still False here.
        from torch._subclasses import fake_tensor as ft

        if not torch.cuda.is_available():
            for d in ("cuda", "cuda:0"):
                ft.init_gpu_context(torch.device(d))


def _unpatch_cuda_hooks():
    st = _HOOKS_STATE
    if st.get("done") and st.get("obj"):
        ctypes.c_void_p.from_address(st["obj"]).value = st["orig_vptr"]
        st["done"] = False


class _Props:
    """What `torch.cuda.get_device_properties` returns for the target GPU."""

    def __init__(self, gpu):
        self.name = gpu.name
        self.total_memory = gpu.total_memory
        self.major = gpu.major
        self.minor = gpu.minor
        self.multi_processor_count = gpu.multi_processor_count
        self.is_integrated = False
        self.is_multi_gpu_board = False
        self.L2_cache_size = 50 * (1 << 20)
        self.gcnArchName = ""
        self.uuid = "00000000-0000-0000-0000-000000000000"
        self.warp_size = 32
        self.max_threads_per_multi_processor = 2048
        self.regs_per_multiprocessor = 65536
        self.shared_memory_per_block = 49152
        self.shared_memory_per_block_optin = 232448
        self.shared_memory_per_multiprocessor = 233472

    def __repr__(self):
        return "_CudaDeviceProperties(name='%s', major=%d, minor=%d, total_memory=%dMB, " \
            "multi_processor_count=%d) [traced by vramroom]" % (
                self.name, self.major, self.minor, self.total_memory >> 20,
                self.multi_processor_count)


def make_stream_classes(tracer):
    """torch.cuda.Stream / Event stand-ins bound to one trace."""
    import torch

    class Stream(torch.Stream):
        """A side stream of the traced program (no CUDA stream behind it)."""

        def __new__(cls, device=None, priority=0, **kwargs):
            sid = kwargs.pop("stream_id", None)
            if sid is None:
                sid = tracer._new_stream_id()
            self = torch.Stream.__new__(cls, stream_id=sid, device_index=0, device_type=1)
            return self

        def __init__(self, *a, **k):
            pass

        @property
        def cuda_stream(self):
            return tracer._stream_ident(self)

        def wait_event(self, event):
            pass

        def wait_stream(self, stream):
            tracer._stream_synced(self, stream)

        def record_event(self, event=None):
            if event is None:
                event = Event()
            event.record(self)
            return event

        def query(self):
            return True

        def synchronize(self):
            tracer._synchronize()

        def __eq__(self, o):
            return isinstance(o, torch.Stream) and o.stream_id == self.stream_id

        def __hash__(self):
            return hash(("vramroom-stream", self.stream_id))

        def __repr__(self):
            return "<torch.cuda.Stream device=cuda:0 cuda_stream=%#x [traced]>" % self.cuda_stream

    class Event:
        def __init__(self, enable_timing=False, blocking=False, interprocess=False, **k):
            self.stream = None

        def record(self, stream=None):
            self.stream = stream if stream is not None else tracer._current_stream_obj()

        def wait(self, stream=None):
            s = stream if stream is not None else tracer._current_stream_obj()
            if self.stream is not None:
                tracer._stream_synced(s, self.stream)

        def query(self):
            return True

        def synchronize(self):
            tracer._synchronize()

        def elapsed_time(self, other):
            return 0.0

        def ipc_handle(self):
            raise RuntimeError("vramroom.trace: CUDA IPC events cannot be traced")

    return Stream, Event


class CudaApi:
    """Installs the fake `torch.cuda` surface for one trace; `restore()` undoes it."""

    def __init__(self, tracer, gpu):
        self.tracer = tracer
        self.gpu = gpu
        self._saved = []

    def _set(self, obj, name, value):
        had = name in vars(obj) if hasattr(obj, "__dict__") else hasattr(obj, name)
        self._saved.append((obj, name, getattr(obj, name, None), had))
        setattr(obj, name, value)

    def install(self):
        import torch
        import torch.cuda
        import torch.cuda.memory as cmem
        import torch.utils

        t = self.tracer
        gpu = self.gpu
        props = _Props(gpu)
        Stream, Event = make_stream_classes(t)
        t._Stream = Stream
        t._default_stream = Stream(stream_id=0)

        def _dev(device=None):
            return 0

        class _StreamCtx:
            def __init__(self, stream):
                self.stream = stream
                self.prev = None

            def __enter__(self):
                self.prev = t._current_stream_obj()
                if self.stream is not None:
                    t._set_stream(self.stream)
                return self.stream

            def __exit__(self, *exc):
                if self.stream is not None:
                    t._set_stream(self.prev)
                return False

        class _DeviceCtx:
            def __init__(self, device=None):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        from . import snapshot

        def memory_stats(device=None):
            cur = t.allocated_bytes()
            return {
                "allocated_bytes.all.current": cur,
                "allocated_bytes.all.peak": t.peak_allocated_bytes(since_reset=True),
                "reserved_bytes.all.current": t.reserved_bytes(),
                "reserved_bytes.all.peak": t.peak_reserved_bytes(),
                "active_bytes.all.current": cur,
                "num_alloc_retries": 0,
                "num_ooms": 0,
            }

        def memory_summary():
            # torch.cuda.memory_summary's table, for the rows a trace knows
            def fmt(n):
                for unit in ("B  ", "KiB", "MiB", "GiB"):
                    if abs(n) < 1024 or unit == "GiB":
                        return ("%d %s" % (n, unit)) if unit == "B  " else "%.2f %s" % (n, unit)
                    n /= 1024.0
            line = "|" + "-" * 75 + "|"
            rows = [("Allocated memory", t.allocated_bytes(), t.peak_allocated_bytes(True)),
                    ("Reserved memory", t.reserved_bytes(), t.peak_reserved_bytes())]
            out = ["|" + "=" * 75 + "|",
                   "|" + "PyTorch CUDA memory summary, device ID 0 (vramroom.trace)".center(75) + "|",
                   line, "|" + "Metric".center(23) + "|" + "Cur Usage".center(25) + "|" +
                   "Peak Usage".center(25) + "|", line]
            for name, cur, peak in rows:
                out.append("| " + name.ljust(22) + "|" + fmt(cur).rjust(24) + " |" +
                           fmt(peak).rjust(24) + " |")
            out.append("|" + "=" * 75 + "|")
            return "\n".join(out) + "\n"

        def mem_get_info(device=None):
            total = t.capacity or gpu.total_memory
            return (max(0, total - t.reserved_bytes()), total)

        def set_fraction(fraction, device=None):
            t._set_fraction(fraction)

        def no_record_history(*a, **k):
            return None

        fns = {
            "is_available": lambda: True,
            "is_initialized": lambda: True,
            "_lazy_init": lambda: None,
            "init": lambda: None,
            "device_count": lambda: 1,
            "current_device": lambda: 0,
            "set_device": lambda device: None,
            "get_device_name": lambda device=None: gpu.name,
            "get_device_capability": lambda device=None: gpu.capability,
            "get_device_properties": lambda device=None: props,
            "get_arch_list": lambda: ["sm_%d%d" % gpu.capability],
            "is_bf16_supported": lambda including_emulation=True: gpu.major >= 8,
            "synchronize": lambda device=None: t._synchronize(),
            "current_stream": lambda device=None: t._current_stream_obj(),
            "default_stream": lambda device=None: t._default_stream,
            "set_stream": lambda stream: t._set_stream(stream),
            "stream": _StreamCtx,
            "device": _DeviceCtx,
            "Stream": Stream,
            "Event": Event,
            "manual_seed": lambda seed: None,
            "manual_seed_all": lambda seed: None,
            "seed": lambda: None,
            "seed_all": lambda: None,
            "initial_seed": lambda: 0,
            "empty_cache": lambda: t._empty_cache(),
            "memory_allocated": lambda device=None: t.allocated_bytes(),
            "max_memory_allocated": lambda device=None: t.peak_allocated_bytes(since_reset=True),
            "memory_reserved": lambda device=None: t.reserved_bytes(),
            "max_memory_reserved": lambda device=None: t.peak_reserved_bytes(),
            "memory_cached": lambda device=None: t.reserved_bytes(),
            "max_memory_cached": lambda device=None: t.peak_reserved_bytes(),
            "reset_peak_memory_stats": lambda device=None: t._reset_peak(),
            "reset_max_memory_allocated": lambda device=None: t._reset_peak(),
            "reset_max_memory_cached": lambda device=None: t._reset_peak(),
            "reset_accumulated_memory_stats": lambda device=None: None,
            "memory_stats": memory_stats,
            "mem_get_info": mem_get_info,
            "set_per_process_memory_fraction": set_fraction,
            "get_per_process_memory_fraction": lambda device=None: t.fraction or 1.0,
            "memory_summary": lambda device=None, abbreviated=False: memory_summary(),
            "_record_memory_history": no_record_history,
            "_snapshot": lambda device=None: snapshot.build(t.events, meta=t.meta),
            "_dump_snapshot": lambda filename="dump_snapshot.pickle": snapshot.write(
                t.events, filename, meta=t.meta),
        }
        fns["is_current_stream_capturing"] = lambda: False

        def _refuse_graphs(*a, **k):
            from .capture import UnsupportedOp

            raise UnsupportedOp("torch.cuda.graph", "CUDA graph capture replays kernels from "
                                "a private memory pool that a fake run cannot capture")

        class _RefusedGraph:
            """Stands for torch.cuda.CUDAGraph / torch.cuda.graph (type annotations keep
            working); making one refuses the trace."""

            def __init__(self, *a, **k):
                _refuse_graphs()

        fns["CUDAGraph"] = type("CUDAGraph", (_RefusedGraph,), {})
        fns["graph"] = type("graph", (_RefusedGraph,), {})
        for name in ("make_graphed_callables", "graph_pool_handle"):
            fns[name] = _refuse_graphs
        import torch.cuda.graphs as cgraphs

        for name, fn in fns.items():
            for mod in (torch.cuda, cmem, cgraphs):
                if hasattr(mod, name) or mod is torch.cuda:
                    self._set(mod, name, fn)
        # nn.Module.cuda()/.to() on params made under the fake mode: swap_tensors refuses a
        # tensor that FakeTensorMode's converter memo holds a weakref to. The swap is sound
        # here (the memo maps real tensors to fakes; nothing reads it back), so the check is
        # lifted for the trace.
        self._set(torch.utils.swap_tensors.__globals__["weakref"], "getweakrefs", _no_weakrefs)
        # Optimizers pick foreach (the CUDA default) only for exact Tensor/Parameter types,
        # and so does clip_grad_norm_ (torch.utils._foreach_utils has a list of its own): on
        # the GPU it is one _foreach_norm, with its per-chunk partial sums.
        from torch._subclasses.fake_tensor import FakeTensor
        import torch.optim.optimizer as oo
        import torch.utils._foreach_utils as fu

        for mod in (oo, fu):
            if FakeTensor not in mod._foreach_supported_types:
                self._saved.append((mod, "_foreach_supported_types",
                                    list(mod._foreach_supported_types), True))
                mod._foreach_supported_types.append(FakeTensor)
        # GradScaler.step skips the optimizer when found_inf.item() is nonzero; a fake run
        # has no infs: always step.
        import torch.amp.grad_scaler as gs

        def _maybe_opt_step(scaler, optimizer, optimizer_state, *args, **kwargs):
            return optimizer.step(*args, **kwargs)

        self._set(gs.GradScaler, "_maybe_opt_step", _maybe_opt_step)
        return self

    def restore(self):
        for obj, name, old, had in reversed(self._saved):
            if name == "_foreach_supported_types":
                obj._foreach_supported_types[:] = old
                continue
            if had:
                setattr(obj, name, old)
            else:
                try:
                    delattr(obj, name)
                except AttributeError:
                    pass
        self._saved.clear()


_real_getweakrefs = weakref.getweakrefs


def _no_weakrefs(obj):
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(obj, FakeTensor):
        return []
    return _real_getweakrefs(obj)
