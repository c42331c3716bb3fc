"""The recorder: run PyTorch code on fake CUDA and write down every storage it allocates.

Design note — the route (PyTorch 2.11.0+cu130, measured on a machine with no GPU, 2 cores).
- `FakeTensorMode` (the route taken). Tensors made for "cuda" are FakeTensors whose dispatch
  keys are CUDA's, so autocast("cuda") casts as on the GPU, nn.Module.cuda()/to() and
  `torch.device("cuda")` construction work, and every aten op PyTorch runs reaches us with
  its real overload. The one blocker was the backward: the autograd engine's
  `GraphTask::stash_current_streams()` (called from `Engine::compute_dependencies`) asks the
  CUDA hooks `hasPrimaryContext(0)` for every device the guard reports; FakeTensorMode
  installs a no-op CUDA guard that reports one device, while the real hooks check
  `c10::cuda::device_count()` (0 here) and throw "hasPrimaryContext expects a valid device
  index". gdb located the throw (`_hasPrimaryContext` <- `stash_current_streams` <-
  `compute_dependencies` <- `Engine::execute`). fakecuda.patch_cuda_hooks() replaces that one
  virtual slot (a copy of the hooks object's vtable, slot 4 of AcceleratorHooksInterface)
  with a function answering True; the engine then stashes the no-op guard's default stream.
  With it, forward, backward (on the engine's CUDA device thread, as on a GPU: a second cuBLAS
  handle there), AdamW (foreach and fused), GradScaler and checkpointing all run, with no
  compiler, no LD_PRELOAD and no driver.
- A fake libcudart/libcuda (LD_PRELOAD) was rejected: libtorch_cuda links libcudart.so.13
  dynamically (ldd), so it is possible, but then torch believes in a real device and calls
  dozens of runtime and driver entry points (stream pools, events, properties, the lazy
  NVRTC/driver table `cuDevicePrimaryCtxGetState`); each would need a faithful stub, it
  cannot be done after `import torch` (lazy binding finds libcudart first), and it needs a C
  compiler or a shipped binary.
- A TorchDispatchMode over meta tensors was rejected: meta has no CUDA dispatch keys, so
  autocast("cuda") and module `.cuda()` would have to be re-implemented by the tracer.
- What FakeTensorMode still decides differently from CUDA, and the tracer corrects:
  * SDPA: with no device, PyTorch's `_fused_sdp_choice` falls back to the math path. sdpa.py
    picks the backend the target GPU would (the meta twin's rule, ops/attention.rs) and calls
    that backend's aten op, whose fake kernel allocates what the CUDA one does.
  * nn.MultiheadAttention's inference fast path (`_native_multi_head_attention`): its fake
    kernel makes the output alone; native_mha.py runs the CUDA kernel's parts through the
    mode (the [B, T, 3D] projection, the attention, or the math branch's packed q/k/v and
    scores).
  * Optimizers default to foreach only for exact Tensor/Parameter types; FakeTensor is added.
  * Library workspaces (cuBLAS per thread and stream, cuBLASLt, cuDNN conv and attention,
    cuFFT's plan work areas) happen inside kernels: hidden.py adds them from
    cuda_hidden.json and the tables it names (fft.py for cuFFT's copies and work areas).
  * TorchScript functions run op by op (the GPU fusers are off during a trace: they would
    compile through the driver).
- Storage lifetimes: every new storage of a cuda FakeTensor that an op returns is one
  allocation of `storage.nbytes()` (the replay rounds it as PyTorch's allocator does). A
  `weakref.ref` on the storage (storages keep their PyObject for their whole life) reports
  the free. Views and in-place ops return known storages: nothing. `resize_`/`set_` that
  grow a known storage: a new allocation, then the old block freed.
  * Autograd accumulates a second gradient into the first in place (InputBuffer's
    `old_var.add_(var)`) when it holds the only reference, but never for tensor subclasses,
    so a fake run would allocate a sum the GPU does not: mode.py turns that add (engine
    thread, grad mode off, same shape, sole holder) into the in-place one. With it,
    ResNet-50 training matches the real H200 trace (shared/traces) allocation for allocation
    through the first iteration, cuDNN workspaces included.
  * Only the outermost op allocates: an op with no meta kernel that FakeTensorMode runs as
    a decomposition is one kernel on the GPU, so the decomposition's temporaries are not
    recorded. But an op whose CUDA implementation is itself a C++ composite (no CUDA
    kernel, a CompositeExplicitAutograd one: logsumexp, cdist's _euclidean_dist, isinf) is
    redispatched to that composite, so its parts, which are kernels on the GPU, allocate.
  * What runs in C++ above the fake kernels is PyTorch's own: autocast's casts and cast
    cache (in the compiled argument order), composite ops, checkpointing.
- Host-side values: `.item()`, `.tolist()`, `bool(t)` on a fake tensor have no data.
  values.py tracks uniform values (ones, full, their &, |, ~, max, ==), which answers
  generate()'s stopping checks exactly. Anything else answers 1 (numbers) or False
  (booleans) with a warning counted in Trace.warnings; GradScaler always steps (no inf).
- record_stream: the free is requested when the tensor dies and completes at the next
  allocation on the block's own stream, or at a synchronisation (PyTorch's allocator
  processes stream events at each malloc; the other streams' work has usually not finished
  by the next allocation elsewhere: fixtures/snapshots/side_stream_record_stream).
- Not modelled, refused with the op named (UnsupportedOp): `torch.compile`, ops with no
  fake/meta kernel, data-dependent output shapes (nonzero, unique, masked_select, ...).
"""

import sys
import threading
import weakref

_PKG_DIR = __file__.rsplit("/", 1)[0]
# Frames of the dispatch machinery, not the user's program.
_SKIP = (
    _PKG_DIR,
    "/torch/_subclasses/",
    "/torch/utils/_python_dispatch.py",
    "/torch/_ops.py",
    "/torch/_prims_common/",
    "/torch/_decomp/",
    "/torch/_refs/",
    "/torch/_meta_registrations.py",
    "/torch/utils/_stats.py",
    "/torch/_dynamo/eval_frame.py",
    "/torch/_compile.py",
    "<frozen ",
)
MAX_FRAMES = 32  # kept (the user's and the libraries' frames)
MAX_WALK = 80  # looked at
ADDR_BASE = 0x7F0000000000
STREAM_BASE = 0x5A0000000000


class UnsupportedOp(RuntimeError):
    """The traced program ran something the tracer cannot model; the message names it."""

    def __init__(self, op, why):
        self.op = str(op)
        self.where = _where()
        super().__init__(
            "vramroom.trace cannot model `%s`%s: %s. Nothing was predicted (a wrong number is "
            "worse than none)." % (op, " at " + self.where if self.where else "", why)
        )


def _where():
    """Where the refused op was called, as `file:line`: the innermost frame outside torch and
    this package, and, when that is a library's, the user's frame that led there. On
    autograd's device thread the stack is the engine's, so the main thread's is read."""
    from .evidence import _user_file

    f = sys._getframe(2)
    if threading.current_thread() is not threading.main_thread():
        f = sys._current_frames().get(threading.main_thread().ident, f)
    inner = user = None
    while f is not None and user is None:
        fn = f.f_code.co_filename
        if not ("/torch/" in fn or fn.startswith(_PKG_DIR) or fn.startswith("<frozen ")):
            here = "%s:%d" % (fn, f.f_lineno)
            inner = inner or here
            if _user_file(fn):
                user = here
        f = f.f_back
    if inner and user and inner != user:
        return "%s (called from %s)" % (inner, user)
    return user or inner


class Entry:
    # size: the bytes allocated; nbytes: the fake storage's own size, which differs when a
    # CUDA kernel's output keeps a larger block than its shape needs (see_storage's size)
    __slots__ = ("addr", "size", "stream", "recorded", "ref", "nbytes")

    def __init__(self, addr, size, stream):
        self.addr = addr
        self.size = size
        self.nbytes = size
        self.stream = stream
        self.recorded = None
        self.ref = None


def _round(n):
    return 512 if n <= 512 else (n + 511) // 512 * 512


class Recorder:
    """State of one trace: live storages, events in program order, streams."""

    def __init__(self, gpu, hidden):
        self.gpu = gpu
        self.hidden = hidden
        self.events = []  # (action, addr, size, stream, frames)
        self.live = {}  # storage key -> Entry
        self.next_addr = ADDR_BASE
        self.pending = []  # addrs whose free_completed waits (record_stream)
        # event index -> the snapshot entry's user_metadata: a cuDNN conv workspace is
        # tagged WORKSPACE_TAG + its plan's key, so a replay under a capacity can do what
        # cuDNN does when that allocation fails (snapshot.py's note)
        self.meta = {}
        self.main_ident = threading.get_ident()
        self.warnings = {}
        self.capacity = None
        self.fraction = None
        self.alloc_now = 0
        self.alloc_peak = 0
        self.alloc_peak_since_reset = 0
        self.n_streams = 0
        self.cur_stream = None
        self._Stream = None
        self._default_stream = None
        self._frames_cache = {}
        self._lock = threading.RLock()
        self.active = True
        self.engine_thread_used = False  # autograd's device thread ran our code (api.py)
        self.linear_bias_add = False  # at::linear's bias add to make in place (api.py)

    # ---- streams -------------------------------------------------------------------
    def _new_stream_id(self):
        self.n_streams += 1
        return self.n_streams

    def _stream_ident(self, s):
        sid = getattr(s, "stream_id", 0) if s is not None else 0
        return 0 if sid == 0 else STREAM_BASE + sid * 0x200

    def _current_stream_obj(self):
        return self.cur_stream if self.cur_stream is not None else self._default_stream

    def _set_stream(self, s):
        self.cur_stream = None if s is None or getattr(s, "stream_id", 0) == 0 else s

    def current_stream_ident(self):
        return self._stream_ident(self.cur_stream) if self.cur_stream is not None else 0

    def _stream_synced(self, waiter, waited):
        pass

    def _synchronize(self):
        self._complete_pending()

    # ---- host-side API answers -------------------------------------------------------
    def allocated_bytes(self):
        return self.alloc_now

    def peak_allocated_bytes(self, since_reset=False):
        return self.alloc_peak_since_reset if since_reset else self.alloc_peak

    def reserved_bytes(self):
        # Approximate during the trace (the replay computes it exactly afterwards): a
        # caching allocator holds at least its peak since the last empty_cache.
        return self._reserved_floor()

    def peak_reserved_bytes(self):
        return self._reserved_floor()

    def _reserved_floor(self):
        n = getattr(self, "_since_empty_peak", 0)
        return (n + (2 << 20) - 1) // (2 << 20) * (2 << 20)

    def _reset_peak(self):
        self.alloc_peak_since_reset = self.alloc_now

    def _empty_cache(self):
        self._complete_pending()
        self.events.append(("empty_cache", 0, 0, 0, self._frames()))
        self._since_empty_peak = self.alloc_now

    def _set_fraction(self, f):
        self.fraction = float(f)
        self.capacity = int(self.gpu.total_memory * self.fraction)

    def warn(self, what):
        self.warnings[what] = self.warnings.get(what, 0) + 1

    # ---- frames ---------------------------------------------------------------------
    def _frames(self):
        f = sys._getframe(2)
        out = []
        cache = self._frames_cache
        walked = 0
        while f is not None and len(out) < MAX_FRAMES and walked < MAX_WALK:
            walked += 1
            co = f.f_code
            key = (co, f.f_lineno)
            fr = cache.get(key)
            if fr is None:
                fn = co.co_filename
                if any(s in fn for s in _SKIP):
                    fr = False
                else:
                    fr = (fn, f.f_lineno, co.co_name)
                cache[key] = fr
            if fr:
                out.append(fr)
            f = f.f_back
        if threading.get_ident() != self.main_ident:
            self.engine_thread_used = True
            # Autograd's device thread: the user's frames are where backward() was called.
            mf = sys._current_frames().get(self.main_ident)
            while mf is not None and len(out) < MAX_FRAMES:
                co = mf.f_code
                fn = co.co_filename
                if not any(s in fn for s in _SKIP):
                    out.append((fn, mf.f_lineno, co.co_name))
                mf = mf.f_back
        return tuple(out)

    # ---- allocation events ----------------------------------------------------------
    def alloc(self, size, stream=None, frames=None, meta=None):
        """A client allocation of `size` requested bytes; returns its address."""
        st = self.current_stream_ident() if stream is None else stream
        if self.pending:
            self._complete_pending(st)
        if meta:
            self.meta[len(self.events)] = meta
        addr = self.next_addr
        self.next_addr += _round(size) + 512
        self.events.append(("alloc", addr, size, st, frames if frames is not None else self._frames()))
        self.alloc_now += _round(size)
        if self.alloc_now > self.alloc_peak:
            self.alloc_peak = self.alloc_now
        if self.alloc_now > self.alloc_peak_since_reset:
            self.alloc_peak_since_reset = self.alloc_now
        if self.alloc_now > getattr(self, "_since_empty_peak", 0):
            self._since_empty_peak = self.alloc_now
        return addr

    def free(self, addr, size, stream, recorded=None):
        if not self.active:
            return
        fr = self._frames()
        self.events.append(("free_requested", addr, size, stream, fr))
        self.alloc_now -= _round(size)
        if recorded:
            self.pending.append((addr, size, stream))
        else:
            self.events.append(("free_completed", addr, size, stream, fr))

    def _complete_pending(self, stream=None):
        """Deferred (record_stream) frees complete at a synchronisation, or at the next
        allocation on the block's own stream (stream None: all of them)."""
        keep = []
        for p in self.pending:
            if stream is None or p[2] == stream:
                self.events.append(("free_completed", p[0], p[1], p[2], ()))
            else:
                keep.append(p)
        self.pending = keep

    def hidden_alloc(self, size, frames=None):
        """A library allocation that stays (cuBLAS workspaces)."""
        if size > 0:
            self.alloc(size, frames=frames)

    def hidden_temp(self, size, frames=None, meta=None):
        """A workspace allocated and freed inside one kernel."""
        if size > 0:
            st = self.current_stream_ident()
            addr = self.alloc(size, stream=st, frames=frames, meta=meta)
            self.free(addr, size, st)

    # ---- storages -------------------------------------------------------------------
    def _on_storage_dead(self, key):
        def cb(_ref, key=key):
            e = self.live.pop(key, None)
            if e is not None and e.size > 0 and e.addr != -1:
                self.free(e.addr, e.size, e.stream, e.recorded)

        return cb

    def see_storage(self, st, frames=None, size=None):
        """Register the storage of a cuda fake tensor; an allocation if it is new (of `size`
        bytes when given: a structured loss's 0-dim result keeps the block its meta function
        first sized for the whole broadcast input, then resized to a scalar)."""
        key = st._cdata
        e = self.live.get(key)
        if e is not None:
            if e.addr == -1:
                return False
            n = st.nbytes()
            if n != e.nbytes:
                # resize_/set_ grew (or shrank) a storage in place: PyTorch allocates the new
                # block, copies, frees the old one.
                old_addr, old_size = e.addr, e.size
                e.size = e.nbytes = n
                e.addr = self.alloc(n, frames=frames) if n > 0 else 0
                if old_size > 0:
                    self.free(old_addr, old_size, e.stream)
            return False
        n = st.nbytes()
        e = Entry(0, n if size is None else size, self.current_stream_ident())
        e.nbytes = n
        n = e.size
        if n > 0:
            e.addr = self.alloc(n, stream=e.stream, frames=frames)
        e.ref = weakref.ref(st, self._on_storage_dead(key))
        self.live[key] = e
        return n > 0

    def ignore_storage(self, st):
        """A fake kernel's output that the CUDA kernel keeps on the host or never makes."""
        key = st._cdata
        if key in self.live:
            return
        e = Entry(-1, st.nbytes(), 0)
        e.ref = weakref.ref(st, self._on_storage_dead(key))
        self.live[key] = e

    def record_stream(self, st, stream):
        e = self.live.get(st._cdata)
        if e is None:
            return
        sid = self._stream_ident(stream)
        if sid != e.stream:
            e.recorded = True

    def close(self):
        """End of the trace: storages still alive stay allocated (as in a snapshot taken
        mid-program); pending frees complete."""
        self._complete_pending()
        self.active = False
