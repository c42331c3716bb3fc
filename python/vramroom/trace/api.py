"""`vramroom.trace`: run PyTorch code on fake CUDA, write its memory snapshot, replay it.

    with vramroom.trace.trace(gpu="h100") as t:
        train_step()                      # unmodified code; tensors on "cuda" are fake
    t.snapshot("step.pickle")             # PyTorch-format snapshot (memory_viz, vramroom replay)
    t.peak_allocated                      # bytes, from the trace itself
    t.replay(capacity="24GiB", alloc_conf="expandable_segments:True")   # `vramroom replay --json`

    vramroom.trace.run_script("train.py", ["--bs", "16"], gpu="h100", snapshot_out="s.pickle")

Design note: what the trace stands in for while it runs (each restored on exit). Where
PyTorch takes another path for tensor subclasses than for plain CUDA tensors, a wrapper takes
the plain one: F.scaled_dot_product_attention (sdpa.py), F.linear's in-place bias,
binary_cross_entropy_with_logits' in-place backward. Where a program touches data a fake run
does not have, the trace answers without it and counts that in the warnings: Tensor.numpy()
(known values or zeros), torch.save/save_pretrained (nothing written; a later torch.load of the
path gets the tensors back), DataLoader workers (loaded in the main process), deepcopy of a
kept host value (copied with fake mode off). torch.compile is refused by name. The autograd
engine's entry returns only once its device thread has let go of the graph (engine.py), and
Python's and NumPy's global generators start seeded, so a trace does not vary run to run.
"""

import json
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
import warnings

SUPPORTED = "2.11"


class TraceError(RuntimeError):
    """Bad input to the tracer (unsupported PyTorch, unknown GPU, ...)."""


def check_torch():
    try:
        import torch
    except ImportError as e:
        raise TraceError("vramroom.trace needs PyTorch %s.x installed (%s)" % (SUPPORTED, e))
    v = torch.__version__.split("+")[0]
    if not (v == SUPPORTED or v.startswith(SUPPORTED + ".")):
        raise TraceError(
            "vramroom.trace supports PyTorch %s.x only (the version its hidden-allocation "
            "table and fake-CUDA patch were measured on); this is PyTorch %s"
            % (SUPPORTED, torch.__version__)
        )
    if torch.version.cuda is None:
        raise TraceError(
            "vramroom.trace needs a CUDA build of PyTorch %s (it runs on any machine, no GPU "
            "needed); this is the CPU-only build %s" % (SUPPORTED, torch.__version__)
        )
    return torch


def find_binary():
    """The vramroom CLI: $VRAMROOM_BIN, the package's _bin/vramroom, then PATH."""
    env = os.environ.get("VRAMROOM_BIN")
    if env:
        return env
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_bin", "vramroom")
    if os.path.exists(here):
        return here
    p = shutil.which("vramroom")
    if p:
        return p
    raise TraceError(
        "the vramroom command is needed to replay a trace: set VRAMROOM_BIN, install the "
        "wheel, or put it on PATH (cargo build --release -p vramroom)"
    )


def replay_snapshot(path, capacity=None, alloc_conf=None, what_if=(), min_capacity=False,
                    evidence=None):
    """Run `vramroom replay --json` on a snapshot; a list with one dict per config (with
    `evidence`, a tracer's evidence file, the first has the diagnosis's `findings`)."""
    cmd = [find_binary(), "replay", "--json", path]
    if evidence and os.path.exists(evidence):
        cmd += ["--evidence", evidence]
    confs = []
    if alloc_conf is not None:
        confs.append(alloc_conf)
    if what_if:
        if not confs:
            confs.append("")
        confs.extend(what_if)
    for c in confs:
        cmd += ["--alloc-conf", c if c else "default"]
    if capacity is not None:
        cmd += ["--capacity", str(capacity)]
    if min_capacity:
        cmd.append("--min-capacity")
    return run_cli(cmd[1:])


def run_cli(args, parse_json=True):
    """The vramroom CLI with `args`: its stdout (parsed as JSON unless parse_json=False);
    a failure is a TraceError with the CLI's own message."""
    r = subprocess.run([find_binary()] + list(args), capture_output=True, text=True)
    if r.returncode != 0:
        raise TraceError("vramroom %s failed (%d): %s" % (args[0], r.returncode, r.stderr.strip()))
    return json.loads(r.stdout) if parse_json else r.stdout


class Trace:
    """One traced region: the events, their snapshot, and the replay."""

    def __init__(self, gpu="h100", capacity=None):
        from .gpus import get_gpu

        self.gpu = get_gpu(gpu)
        self.capacity = capacity
        self._rec = None
        self._mode = None
        self._api = None
        self._saved = []
        self.elapsed_s = None

    # -- context manager --------------------------------------------------------------
    def __enter__(self):
        import time

        torch = check_torch()
        from . import fakecuda
        from .capture import Recorder
        from .hidden import Hidden
        from .mode import make_mode
        from .sdpa import make_sdpa
        from .values import FINITE_PRESUMED

        self._t0 = time.perf_counter()
        # Autograd's device thread for the fake GPU runs the trace's Python (the mode's
        # dispatch, its hooks). At exit the engine wakes it to stop, and it then takes the
        # GIL back while the interpreter finalizes, which ends it with pthread_exit through a
        # noexcept frame: "terminate called without an active exception", exit 134, now and
        # then after the program's output is all written (test_trace's group-norm test, one
        # run in tens). With no wait limit the engine leaves its threads asleep at exit, as
        # PyTorch's TORCH_AUTOGRAD_SHUTDOWN_WAIT_LIMIT documents; a user's own value stays.
        os.environ.setdefault("TORCH_AUTOGRAD_SHUTDOWN_WAIT_LIMIT", "0")
        fakecuda.patch_cuda_hooks()
        self._seed_host_generators()
        rec = Recorder(self.gpu, None)
        rec.sdpa_choices = {}
        hid = Hidden(self.gpu, rec)
        rec.hidden = hid
        hid.rec = rec
        self._rec = rec
        self._api = fakecuda.CudaApi(rec, self.gpu).install()
        # SDPA: the backend the target GPU picks (sdpa.py).
        import torch.nn.functional as F
        from torch._subclasses.fake_tensor import FakeTensor

        orig = F.scaled_dot_product_attention
        new = make_sdpa(orig, rec, hid.row, lambda t: isinstance(t, FakeTensor))
        self._set(F, "scaled_dot_product_attention", new)
        self._set(F, "linear", _make_linear(F.linear, lambda t: isinstance(t, FakeTensor), rec))
        self._set(F, "binary_cross_entropy_with_logits", _make_bce_with_logits(
            F.binary_cross_entropy_with_logits, lambda t: isinstance(t, FakeTensor)))
        self._set(torch, "compile", _refuse_compile)
        # Each backward returns once autograd's device thread has dropped its graph, as on
        # the GPU (engine.py).
        from . import engine
        import torch.autograd.graph as autograd_graph

        run_backward = engine.barrier(autograd_graph._engine_run_backward)
        self._set(autograd_graph, "_engine_run_backward", run_backward)
        self._set(torch.autograd, "_engine_run_backward", run_backward)
        # TorchScript functions (transformers' DeBERTa scripts its relative-position buckets)
        # run op by op: the GPU fusers would compile a kernel, which needs the CUDA driver.
        # The GPU runs a function's first call op by op too, then may fuse its elementwise
        # ops; their transient intermediates are then counted where the GPU makes none.
        self._jit = (torch._C._jit_texpr_fuser_enabled(), torch._C._jit_can_fuse_on_gpu())
        torch._C._jit_set_texpr_fuser_enabled(False)
        torch._C._jit_override_can_fuse_on_gpu(False)
        self._set(FakeTensor, "__deepcopy__", _make_fake_deepcopy(FakeTensor.__deepcopy__))
        # fake mode's constant propagation, for the small CPU tensors mode.py keeps real
        import torch._subclasses.fake_tensor as fake_tensor_module

        from .mode import CPU_CONSTANT_LIMIT

        self._set(fake_tensor_module, "CONSTANT_NUMEL_LIMIT", CPU_CONSTANT_LIMIT)
        self._mode = make_mode(rec, hid)
        self._mode.__enter__()
        from .evidence import Collector  # evidence for the diagnosis (evidence.py)

        self._ev = Collector(rec).install()
        from .libs import LibraryPatches  # libraries that branch on fake tensors (libs.py)

        self._libs = LibraryPatches(self._mode._vals, rec.warn).install()
        self._set(torch.Tensor, "numpy", _make_numpy(torch.Tensor.numpy, self._mode._vals,
                                                      rec.warn))
        saved = {}
        self._set(torch, "save", _make_save(torch.save, saved, rec.warn))
        # isfinite is a composite ((self == self) * (self.abs() != inf)) that never reaches
        # the mode as itself: presumed healthy here; isnan/isinf & co. reach it (mode.py's
        # `finiteness`)
        for owner in (torch, torch.Tensor):
            self._set(owner, "isfinite", self._mode._vals.presuming(
                owner.isfinite, True, rec.warn, FINITE_PRESUMED, device="cuda"))
        self._set(torch, "load", _make_load(torch.load, saved))
        import torch.utils.data as tud

        self._set(tud.DataLoader, "__init__", _make_loader_init(tud.DataLoader.__init__,
                                                                rec.warn))
        from .lazy import LazySupport
        from .refuse import one_hot_checked  # refused by name
        from .rnn import PackVF, RnnVF  # nn.LSTM, nn.GRU, nn.RNN on cuDNN (rnn.py)

        import torch.nn.functional as nnf

        self._set(nnf, "one_hot", one_hot_checked(nnf.one_hot))

        RnnVF.install(rec)
        PackVF.install()
        from . import ctc  # torch.ctc_loss's plain-tensor path (ctc.py)

        ctc.install(self._mode._vals, rec.warn)
        LazySupport.install()
        return self

    def _seed_host_generators(self):
        """Python's and NumPy's global generators start from a fixed seed for the trace, so
        two traces of one program agree (a program's own seeding still rules): an unseeded
        draw that decides sizes or control flow (Wav2Vec2's SpecAugment span mask, from
        numpy.random) would otherwise change the events trace to trace. Restored on exit."""
        import random

        self._host_rng = [(random.setstate, random.getstate())]
        random.seed(0)
        try:
            import numpy
        except ImportError:
            return
        self._host_rng.append((numpy.random.set_state, numpy.random.get_state()))
        numpy.random.seed(0)

    def _set(self, obj, name, value):
        self._saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def __exit__(self, et, ev, tb):
        import time

        import torch

        try:
            self._mode.__exit__(et, ev, tb)
        finally:
            self._ev.uninstall()
            self._libs.uninstall()
            from .lazy import LazySupport
            from .rnn import PackVF, RnnVF

            RnnVF.uninstall()
            PackVF.uninstall()
            from . import ctc

            ctc.uninstall()
            LazySupport.uninstall()
            # Frees that Python's cycle collector would find: not the program's peak, but
            # keep the events of this region whole before closing it.
            self._rec.close()
            for obj, name, old in reversed(self._saved):
                setattr(obj, name, old)
            self._saved.clear()
            self._api.restore()
            for restore, state in getattr(self, "_host_rng", ()):
                restore(state)
            torch._C._jit_set_texpr_fuser_enabled(self._jit[0])
            torch._C._jit_override_can_fuse_on_gpu(self._jit[1])
            if self._rec.engine_thread_used:
                from . import engine

                engine.drain()
            self.elapsed_s = time.perf_counter() - self._t0
        return False

    # -- results -----------------------------------------------------------------------
    @property
    def events(self):
        """(action, addr, size, stream, frames) in program order; frames innermost first as
        (filename, line, function)."""
        return list(self._rec.events)

    @property
    def peak_allocated(self):
        """Peak of live allocations, each rounded as PyTorch's allocator rounds requests."""
        return self._rec.alloc_peak

    @property
    def warnings(self):
        return dict(self._rec.warnings)

    @property
    def hidden_stats(self):
        d = dict(self._rec.hidden.stats)
        d["sdpa"] = dict(self._rec.sdpa_choices)
        return d

    def default_capacity(self):
        """The target GPU's memory less the CUDA context (which PyTorch does not count)."""
        from .hidden import load_table

        ctx = load_table()["archs"][self.gpu.arch].get("cuda_context_bytes", 0)
        return self.gpu.total_memory - ctx

    def snapshot_dict(self):
        from . import snapshot

        return snapshot.build(self._rec.events, meta=self._rec.meta)

    def snapshot(self, path):
        from . import evidence, snapshot

        try:
            evidence.write(self.evidence(), evidence_path(path))
        except Exception as e:  # the diagnosis never costs the snapshot
            warnings.warn("vramroom.trace: no diagnosis evidence (%s: %s)" % (type(e).__name__, e))
        return snapshot.write(self._rec.events, path, meta=self._rec.meta)

    def evidence(self):
        """The diagnosis's evidence (evidence.py): categories, backward calls, iteration
        boundaries and the user's file:line of each; `vramroom replay --evidence` reads it."""
        return self._ev.evidence()

    def replay(self, capacity=None, alloc_conf=None, what_if=(), min_capacity=False):
        """`vramroom replay --json` on this trace: one dict per config (the first is
        `alloc_conf`, default PyTorch's)."""
        cap = capacity if capacity is not None else (self._rec.capacity or self.capacity)
        if cap is None:
            cap = self.default_capacity()
        fd, path = tempfile.mkstemp(suffix=".pickle", prefix="vramroom-trace-")
        os.close(fd)
        try:
            self.snapshot(path)
            return replay_snapshot(path, capacity=cap, alloc_conf=alloc_conf,
                                   what_if=what_if, min_capacity=min_capacity)
        finally:
            os.unlink(path)


def evidence_path(snapshot_path):
    """The evidence written beside a snapshot: `s.pickle` -> `s.evidence.json`."""
    return os.path.splitext(snapshot_path)[0] + ".evidence.json"


def _make_linear(orig, is_fake, rec):
    """F.linear as CUDA runs it on a non-contiguous input with a bias (MultiheadAttention's
    batch_first transposes): at::linear takes matmul, then adds the bias in place, except
    for tensor subclasses, which get an out-of-place add (composite compliance). Under the
    tracer every tensor is a subclass, so the fake run would allocate a second output that
    the GPU never does."""
    import torch

    def linear(input, weight, bias=None):
        if bias is None or not is_fake(input) or input.device.type != "cuda" \
                or input.dim() <= 2 or input.is_contiguous():
            return orig(input, weight, bias)
        if torch.is_autocast_enabled("cuda"):
            # Under autocast the bias added is the cast from autocast's cache, which Python
            # cannot read: at::linear itself runs, and the mode turns its bias add into the
            # add_ CUDA runs (ViT's attention under bf16 autocast: the bias grad then goes
            # through the cast's backward, in the engine's order, as in the real snapshot).
            rec.linear_bias_add = True
            try:
                return orig(input, weight, bias)
            finally:
                rec.linear_bias_add = False
        return torch.matmul(input, weight.t()).add_(bias)

    return linear


def _make_bce_with_logits(orig, is_fake):
    """F.binary_cross_entropy_with_logits whose backward runs as CUDA runs it for plain
    tensors: `input.sigmoid().sub_(target).mul_(grad)`, then `div_(numel)` for the mean,
    one input-sized block. For tensor subclasses autograd's formula is out of place
    (`(input.sigmoid() - target) * grad`), so a fake run would allocate three
    (ho_recsys_embbag_amp's real snapshot: one). Weighted losses, and a target that needs
    grad, keep PyTorch's own path."""
    import torch

    class BCEWithLogits(torch.autograd.Function):
        @staticmethod
        def forward(ctx, input, target, reduction):
            ctx.save_for_backward(input, target)
            ctx.reduction = reduction
            return torch.ops.aten.binary_cross_entropy_with_logits(input, target, None, None,
                                                                   reduction)

        @staticmethod
        def backward(ctx, grad):
            input, target = ctx.saved_tensors
            g = input.sigmoid().sub_(target).mul_(grad)
            if ctx.reduction == 1:  # mean
                g.div_(input.numel())
            return g, None, None

    reductions = {"none": 0, "mean": 1, "sum": 2}

    def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None,
                                         reduce=None, reduction="mean", pos_weight=None):
        if weight is not None or pos_weight is not None or size_average is not None or \
                reduce is not None or reduction not in reductions or not is_fake(input) or \
                input.device.type != "cuda" or target.requires_grad or \
                not torch.is_grad_enabled() or not input.requires_grad or \
                input.shape != target.shape:
            return orig(input, target, weight, size_average, reduce, reduction, pos_weight)
        if torch.is_autocast_enabled("cuda"):
            # an fp32 op under autocast: its arguments cast first, the last first
            f32 = lambda t: t.to(torch.float32) if t.is_floating_point() and \
                t.dtype != torch.float32 else t
            target = f32(target)
            input = f32(input)
        return BCEWithLogits.apply(input, target, reductions[reduction])

    binary_cross_entropy_with_logits.__doc__ = orig.__doc__
    return binary_cross_entropy_with_logits


def _make_fake_deepcopy(orig):
    """copy.deepcopy of a fake tensor that keeps a small CPU tensor's real values (mode.py's
    constants: LayerNorm's ones and zeros) copies those values with fake mode off; under it,
    copying a real storage dispatches to the fake kernels and fails (nn.TransformerDecoder
    deep-copies its layer)."""

    def __deepcopy__(self, memo):
        c = getattr(self, "constant", None)
        if c is not None and id(c) not in memo:
            from torch._subclasses.fake_tensor import unset_fake_temporarily

            with unset_fake_temporarily():
                memo[id(c)] = c.clone()
        return orig(self, memo)

    return __deepcopy__


def _make_numpy(orig, vals, warn):
    """Tensor.numpy() of a fake host tensor (an eval loop's `pred.cpu().numpy()` for its
    metrics): its values where the trace knows them, else zeros of its shape and dtype,
    counted in the warnings as `.item()`'s placeholders are. A fake CUDA tensor refuses, as
    a real one does."""
    from torch._subclasses.fake_tensor import FakeTensor

    def numpy(self, *, force=False):
        if not isinstance(self, FakeTensor) or self.device.type != "cpu":
            return orig(self, force=force)
        import numpy as np
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            real = vals._real(self) if vals._knowable(self) else None
            if real is not None:
                return real.detach().clone().numpy()
            warn("t.numpy() of a fake cpu tensor answered zeros")
            import torch

            return torch.zeros(self.shape, dtype=self.dtype).numpy() if self.dtype != \
                torch.bfloat16 else np.zeros(tuple(self.shape), dtype=np.float32)

    numpy.__doc__ = orig.__doc__
    return numpy


def _has_fake(obj):
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._pytree import tree_leaves

    import torch

    def fake(x):
        if isinstance(x, torch.nn.Module):  # torch.save(model)
            return any(isinstance(t, FakeTensor) for t in
                       list(x.parameters()) + list(x.buffers()))
        return isinstance(x, FakeTensor)

    try:
        return any(fake(x) for x in tree_leaves(obj))
    except Exception:  # noqa: BLE001 - an object pytree cannot walk: look no further
        return False


def _make_save(orig, saved, warn):
    """torch.save of fake tensors writes nothing: a fake run has no data, and the user's
    checkpoint on disk must not be replaced by one without it. The object is kept, so a
    torch.load of the same path later in the run gets it back (a GPU run copies the tensors
    to the host to save them: no device memory)."""
    import os

    def save(obj, f, *args, **kwargs):
        if not _has_fake(obj):
            return orig(obj, f, *args, **kwargs)
        warn("torch.save() of fake tensors not written (a fake run has no data)")
        if isinstance(f, (str, os.PathLike)):
            saved[os.path.abspath(os.fspath(f))] = obj
        return None

    save.__doc__ = orig.__doc__
    return save


def _make_load(orig, saved):
    """torch.load of a path this run saved (see _make_save): the saved tensors, each copied
    to its device or map_location's (as loading allocates them anew); anything else loads
    from disk."""
    import os

    def load(f, map_location=None, *args, **kwargs):
        key = os.path.abspath(os.fspath(f)) if isinstance(f, (str, os.PathLike)) else None
        if key is None or key not in saved:
            return orig(f, map_location, *args, **kwargs)
        import torch
        from torch.utils._pytree import tree_map_only

        def where(t):
            if isinstance(map_location, (str, torch.device)):
                return torch.device(map_location)
            if isinstance(map_location, dict):
                return torch.device(map_location.get(str(t.device), str(t.device)))
            return t.device

        def module(m):
            import copy

            m = copy.deepcopy(m)  # loading makes new parameters, on their saved device
            return m.to(torch.device(map_location)) if isinstance(
                map_location, (str, torch.device)) else m

        obj = tree_map_only(torch.nn.Module, module, saved[key])
        return tree_map_only(torch.Tensor, lambda t: t.detach().to(where(t), copy=True), obj)

    load.__doc__ = orig.__doc__
    return load


def _make_loader_init(orig, warn):
    """DataLoader with worker processes loads in the main process under the trace: a forked
    worker inherits fake mode and cannot collate into shared memory, and workers change host
    memory only (their batches reach the GPU through the main process either way)."""
    import inspect

    sig = inspect.signature(orig)

    def __init__(self, *args, **kwargs):
        b = sig.bind(self, *args, **kwargs)
        if b.arguments.get("num_workers", 0):
            warn("DataLoader(num_workers > 0) loaded in the main process")
            b.arguments["num_workers"] = 0
            for k in ("prefetch_factor", "multiprocessing_context", "worker_init_fn"):
                b.arguments.pop(k, None)
            b.arguments["persistent_workers"] = False
        return orig(*b.args, **b.kwargs)

    __init__.__signature__ = sig
    return __init__


def _refuse_compile(*a, **k):
    from .capture import UnsupportedOp

    raise UnsupportedOp("torch.compile", "compiled graphs (Inductor kernels, CUDA graphs) "
                        "allocate differently from the eager ops a fake run sees")


def trace(gpu="h100", capacity=None):
    """`with vramroom.trace.trace(gpu="h100") as t: ...`"""
    return Trace(gpu=gpu, capacity=capacity)


def run_script(path, argv=(), gpu="h100", snapshot_out=None, capacity=None):
    """Run a script unmodified (as `__main__`, with sys.argv set) under a trace."""
    if not os.path.exists(path):
        raise TraceError("no such script: %s" % path)
    check_torch()
    old_argv, old_path = sys.argv[:], sys.path[:]
    sys.argv = [path] + list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    t = Trace(gpu=gpu, capacity=capacity)
    try:
        with t:
            try:
                runpy.run_path(path, run_name="__main__")
            except SystemExit as e:
                if e.code not in (None, 0):
                    raise
    finally:
        sys.argv, sys.path[:] = old_argv, old_path
    if snapshot_out:
        t.snapshot(snapshot_out)
    return t
