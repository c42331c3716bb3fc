"""Vramroom's caching allocator inside PyTorch, with no change to the model.

    import vramroom_torch
    vramroom_torch.enable(alloc_conf="expandable_segments:True")   # before CUDA allocates
    ...                                                            # any PyTorch code
    print(vramroom_torch.memory_summary())
    vramroom_torch.dump_snapshot("snap.pickle")                    # opens in memory_viz

Design note: this module is pure Python over ctypes. `enable()` loads the cdylib built from
crates/vramroom-torch (libvramroom_torch.so), hands its `vramroom_malloc` / `vramroom_free` to
`torch.cuda.memory.CUDAPluggableAllocator` and installs it with `change_current_allocator`,
which PyTorch allows only before its own allocator has been initialised (the first CUDA
allocation, or `torch.cuda.init()`). Statistics, the summary and snapshots come from Vramroom's
allocator under torch.cuda's names, because PyTorch's own functions raise for a pluggable
allocator. Snapshots are the same pickle schema as `torch.cuda.memory._snapshot()`.

Limits that come from PyTorch's pluggable-allocator interface: it does not forward
`Tensor.record_stream` (use `record_stream(tensor, stream)` here) nor `torch.cuda.empty_cache()`
(use `empty_cache()` here), and it does not check the pointer the allocator returns, so an
out-of-memory cannot surface as `torch.OutOfMemoryError`. On OOM Vramroom prints PyTorch's
exact message, keeps it for `last_oom_message()`, and writes a snapshot when
`enable(oom_snapshot=path)` (or `set_oom_snapshot(path)`) asked for one; call
`raise_if_oom()` after a step to turn it into `torch.OutOfMemoryError`.
"""

import ctypes
import json
import os
import pickle

__all__ = [
    "enable",
    "enabled",
    "library",
    "memory_stats",
    "memory_summary",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "empty_cache",
    "record_stream",
    "set_per_process_memory_fraction",
    "snapshot",
    "dump_snapshot",
    "snapshot_json",
    "_record_memory_history",
    "set_oom_snapshot",
    "last_oom_message",
    "raise_if_oom",
]

_LIB_NAME = "libvramroom_torch.so"
_lib = None
_lib_path = None
_allocator = None


def _candidates(lib_path):
    if lib_path:
        yield lib_path
    env = os.environ.get("VRAMROOM_TORCH_LIB")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, _LIB_NAME)
    root = os.path.dirname(os.path.dirname(here))  # python/vramroom/ -> the workspace
    for sub in ("target/release", "target/debug"):
        yield os.path.join(root, sub, _LIB_NAME)


def _declare(lib):
    c = ctypes
    sig = {
        "vramroom_malloc": (c.c_void_p, [c.c_ssize_t, c.c_int, c.c_void_p]),
        "vramroom_free": (None, [c.c_void_p, c.c_ssize_t, c.c_int, c.c_void_p]),
        "vramroom_init": (c.c_int, [c.c_char_p]),
        "vramroom_record_stream": (c.c_int, [c.c_void_p, c.c_int, c.c_void_p]),
        "vramroom_empty_cache": (None, [c.c_int]),
        "vramroom_memory_stats_json": (c.c_void_p, [c.c_int]),
        "vramroom_memory_summary": (c.c_void_p, [c.c_int, c.c_int]),
        "vramroom_reset_peak_memory_stats": (c.c_int, [c.c_int]),
        "vramroom_set_memory_fraction": (c.c_int, [c.c_double, c.c_int]),
        "vramroom_record_memory_history": (None, [c.c_int, c.c_size_t]),
        "vramroom_snapshot_pickle": (c.c_void_p, [c.POINTER(c.c_size_t)]),
        "vramroom_snapshot_json": (c.c_void_p, []),
        "vramroom_dump_snapshot": (c.c_int, [c.c_char_p]),
        "vramroom_set_oom_snapshot": (c.c_int, [c.c_char_p]),
        "vramroom_last_error": (c.c_void_p, []),
        "vramroom_clear_error": (None, []),
        "vramroom_device_count": (c.c_int, []),
        "vramroom_string_free": (None, [c.c_void_p]),
        "vramroom_bytes_free": (None, [c.c_void_p, c.c_size_t]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args


def library(lib_path=None):
    """Load (once) and return the ctypes handle of libvramroom_torch.so."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    tried = []
    for p in _candidates(lib_path):
        if not os.path.exists(p):
            tried.append(p)
            continue
        lib = ctypes.CDLL(os.path.abspath(p))
        _declare(lib)
        _lib, _lib_path = lib, os.path.abspath(p)
        return lib
    raise FileNotFoundError(
        "libvramroom_torch.so not found (build it with `cargo build --release -p vramroom-torch` "
        "or pass lib_path=/ set VRAMROOM_TORCH_LIB); tried: " + ", ".join(tried))


def _take_string(ptr):
    if not ptr:
        return None
    try:
        return ctypes.string_at(ptr).decode("utf-8", "replace")
    finally:
        _lib.vramroom_string_free(ptr)


def _error():
    return _take_string(library().vramroom_last_error()) or "unknown error"


def enabled():
    """Whether Vramroom's allocator is PyTorch's current CUDA allocator."""
    return _allocator is not None


def enable(alloc_conf=None, lib_path=None, oom_snapshot=None):
    """Make Vramroom's caching allocator PyTorch's CUDA allocator.

    alloc_conf: PYTORCH_CUDA_ALLOC_CONF syntax (e.g. "expandable_segments:True"); None reads
    PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF. lib_path: the .so (default: beside this file,
    $VRAMROOM_TORCH_LIB, or the workspace's target/release). oom_snapshot: a path to write a
    snapshot pickle to when an allocation runs out of memory.

    Must run before CUDA first allocates; raises RuntimeError otherwise.
    """
    global _allocator
    import torch

    if _allocator is not None:
        return _allocator
    lib = library(lib_path)
    conf = alloc_conf
    if conf is None:
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", os.environ.get("PYTORCH_ALLOC_CONF"))
    if lib.vramroom_init(None if conf is None else conf.encode()) != 0:
        raise ValueError("vramroom_torch: bad allocator config %r: %s" % (conf, _error()))
    if oom_snapshot:
        set_oom_snapshot(oom_snapshot)
    alloc = torch.cuda.memory.CUDAPluggableAllocator(_lib_path, "vramroom_malloc", "vramroom_free")
    try:
        torch.cuda.memory.change_current_allocator(alloc)
    except RuntimeError as e:
        raise RuntimeError(
            "vramroom_torch.enable() must run before CUDA first allocates "
            "(PyTorch's allocator is already initialised): %s" % e) from e
    _allocator = alloc
    return alloc


def _device(device):
    import torch

    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, torch.device):
        return device.index if device.index is not None else torch.cuda.current_device()
    if isinstance(device, str):
        return _device(torch.device(device))
    return int(device)


def memory_stats(device=None):
    """torch.cuda.memory_stats(): the same 122 keys, sorted, from Vramroom's allocator."""
    import collections

    s = _take_string(library().vramroom_memory_stats_json(_device(device)))
    if s is None:
        raise RuntimeError("vramroom_torch.memory_stats: " + _error())
    return collections.OrderedDict(sorted(json.loads(s).items()))


def memory_summary(device=None, abbreviated=False):
    """torch.cuda.memory_summary(): the same table layout."""
    s = _take_string(library().vramroom_memory_summary(_device(device), int(bool(abbreviated))))
    if s is None:
        raise RuntimeError("vramroom_torch.memory_summary: " + _error())
    return s


def memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=None):
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device=None):
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device=None):
    if library().vramroom_reset_peak_memory_stats(_device(device)) != 0:
        raise RuntimeError("vramroom_torch.reset_peak_memory_stats: " + _error())


def empty_cache(device=None):
    """torch.cuda.empty_cache() for Vramroom's allocator (None: every device)."""
    library().vramroom_empty_cache(-1 if device is None else _device(device))


def record_stream(tensor, stream):
    """Tensor.record_stream(stream), which PyTorch does not forward to pluggable allocators."""
    ptr = tensor.untyped_storage().data_ptr()
    dev = tensor.device.index if tensor.device.index is not None else _device(None)
    if library().vramroom_record_stream(ptr, dev, stream.cuda_stream) != 0:
        raise RuntimeError("vramroom_torch.record_stream: " + _error())


def set_per_process_memory_fraction(fraction, device=None):
    if library().vramroom_set_memory_fraction(float(fraction), _device(device)) != 0:
        raise RuntimeError("vramroom_torch.set_per_process_memory_fraction: " + _error())


def _record_memory_history(enabled="all", max_entries=100000, **_ignored):
    """torch.cuda.memory._record_memory_history(enabled, max_entries): None, "state" or "all".
    Stacks are not recorded (the allocator sees no Python frames)."""
    mode = {None: 0, False: 0, "state": 1, "all": 2, True: 2}.get(enabled)
    if mode is None:
        raise ValueError("enabled must be None, 'state' or 'all'")
    library().vramroom_record_memory_history(mode, int(max_entries))


def _snapshot_bytes():
    lib = library()
    n = ctypes.c_size_t(0)
    p = lib.vramroom_snapshot_pickle(ctypes.byref(n))
    if not p:
        raise RuntimeError("vramroom_torch.snapshot: " + _error())
    try:
        return ctypes.string_at(p, n.value)
    finally:
        lib.vramroom_bytes_free(p, n.value)


def snapshot():
    """torch.cuda.memory._snapshot(): {"segments", "device_traces", "allocator_settings", ...}."""
    return pickle.loads(_snapshot_bytes())


def snapshot_json():
    """The snapshot as JSON text (Vramroom's field names)."""
    s = _take_string(library().vramroom_snapshot_json())
    if s is None:
        raise RuntimeError("vramroom_torch.snapshot_json: " + _error())
    return s


def dump_snapshot(path="dump_snapshot.pickle"):
    """torch.cuda.memory._dump_snapshot(path): a pickle that memory_viz opens."""
    if library().vramroom_dump_snapshot(os.fspath(path).encode()) != 0:
        raise RuntimeError("vramroom_torch.dump_snapshot: " + _error())


def set_oom_snapshot(path):
    """Write a snapshot to `path` whenever an allocation runs out of memory (None: off)."""
    arg = None if path is None else os.fspath(path).encode()
    if library().vramroom_set_oom_snapshot(arg) != 0:
        raise RuntimeError("vramroom_torch.set_oom_snapshot: " + _error())


def last_oom_message(clear=False):
    """PyTorch's OOM message from the last failed allocation, or None."""
    lib = library()
    s = _take_string(lib.vramroom_last_error())
    if clear:
        lib.vramroom_clear_error()
    if s is not None and s.startswith("CUDA out of memory"):
        return s
    return None


def raise_if_oom():
    """Raise torch.OutOfMemoryError if an allocation failed since the last call."""
    import torch

    msg = last_oom_message(clear=True)
    if msg is not None:
        raise torch.OutOfMemoryError(msg)
