"""Several ranks, simulated: a DDP or FSDP2 script traced once per rank on fake CUDA.

    python -m vramroom.trace.ranks --world-size 4 [--gpu h100] [--out DIR] [--capacity SIZE] \
        -- train.py ARGS

Each rank r runs the script unmodified, as torchrun would start it (RANK=r, WORLD_SIZE=N,
LOCAL_RANK=0: N nodes of one GPU each; MASTER_ADDR/MASTER_PORT in the env), under `vramroom.trace.run_script`, with
`torch.distributed` on PyTorch's fake process group: the script's own
`init_process_group(...)` (nccl, gloo, env:// or tcp://, whatever it names) becomes
`init_process_group("fake", store=FakeStore(), rank=r, world_size=N)`. Collectives on the
fake group return at once and write nothing; the buffers they write into (FSDP2's all-gather
and reduce-scatter outputs, DDP's buckets) are allocated by PyTorch's own code and traced.
The snapshots go to DIR/rank{r}.pickle, then `vramroom replay DIR/rank0.pickle ...` prints
the per-rank table: peaks, imbalance, and the rank that runs out first.

DDP's reducer is C++ and records CUDA events on every iteration (its runtime-stats timer),
which no fake device can answer; it is replaced by `_TracedReducer`, which allocates what the
C++ reducer allocates through the caching allocator: one flat gradient buffer per bucket
(first iteration: one bucket per dtype, as DDP asks for `sys.maxsize`; then rebuilt in the
order the gradients became ready with `_DEFAULT_FIRST_BUCKET_BYTES` and `bucket_cap_mb`, old
buffers freed before the new ones are made), gradients copied into their bucket views (or, with
`gradient_as_bucket_view=True`, the gradients *are* the views). The all-reduce itself moves
no caching-allocator memory: NCCL's own buffers (channels, proxy, NVLS) come from cudaMalloc /
cuMem in NCCL itself, outside PyTorch's allocator, so they are not in a real snapshot either.
ProcessGroupNCCL's TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK (default off) only registers
the caching allocator's segments with NCCL, it allocates nothing; an NCCL MemPool
(ncclMemAlloc) is the user's explicit opt-in. Like the CUDA context, NCCL's memory is outside
the capacity the replay checks.

Each rank runs in its own Python process by default (`isolate=True`): the fake process
group, DDP's and FSDP2's module state, autograd's device threads and the tracer's patches all
start clean. `isolate=False` (`--in-process`) runs the ranks one after another in this process:
measured on the two example programs at world size 2, the same snapshots (same events, same
peaks) in about half the time (5-8 s against 13-16 s on 2 cores), since torch is imported once.

FSDP2 on the fake group: the device mesh is built outside the fake mode (its rank grid is a CPU
tensor it reads), with "cuda" as its device type (PyTorch would ask the accelerator, the CPU
here), and FSDP2's `alloc_storage`/`free_storage` (storage `resize_`, no dispatched op) are
reported to the tracer as the mallocs and frees they are on CUDA. Seen in the trace: the
sharded parameters (dim-0 chunks of ceil(d0/N) rows, at `fully_shard`), the all-gather
buffers on FSDP2's all-gather stream, the unsharded parameters per all-gather, the unsharded
gradients, the reduce-scatter input (default stream) and output (reduce-scatter stream; the
sharded gradients are views of it, freed at `zero_grad(set_to_none=True)`).

Torchrun's variables, as a job of N one-GPU nodes: RANK=r, WORLD_SIZE=N, LOCAL_RANK=0 (the
tracer fakes one CUDA device per process, device 0).
"""

import json
import os
import subprocess
import sys

from .api import TraceError, check_torch, run_cli

MASTER_ADDR = "127.0.0.1"
MASTER_PORT = "29500"


def rank_env(rank, world_size):
    """The variables torchrun sets for one rank, as a job of N nodes with one GPU each: every
    rank is its own simulated GPU, and the fake CUDA device is device 0 (the tracer models one
    device per process), so LOCAL_RANK is 0 and `torch.cuda.set_device(local_rank)`,
    `device_ids=[local_rank]` and `cuda:{local_rank}` all name it."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": str(rank),
        "ROLE_RANK": str(rank),
        "MASTER_ADDR": MASTER_ADDR,
        "MASTER_PORT": MASTER_PORT,
    }


# -- DDP's reducer, as far as memory goes ----------------------------------------------------

class _Nothing:
    """DDP's C++ Logger stand-in: every method is a no-op."""

    def __getattr__(self, name):
        return lambda *a, **k: None


class _TracedReducer:
    """What `torch.distributed.Reducer` allocates through the caching allocator, in Python."""

    def __init__(self, params, bucket_indices, per_bucket_size_limits, process_group,
                 expect_sparse_gradient=None, bucket_bytes_cap=25 * 2**20,
                 find_unused_parameters=False, gradient_as_bucket_view=False,
                 param_names=None, first_bucket_bytes_cap=None, *rest):
        import torch.distributed as dist

        self.params = list(params)
        self.pg = process_group
        self.bucket_bytes_cap = bucket_bytes_cap
        self.first_bucket_bytes_cap = (first_bucket_bytes_cap if first_bucket_bytes_cap is not None
                                       else dist._DEFAULT_FIRST_BUCKET_BYTES)
        self.as_view = gradient_as_bucket_view
        self.ready_order = []
        self.rebuilt = False
        self.hooks = []
        self._build(bucket_indices)
        for i, p in enumerate(self.params):
            if p.requires_grad:
                self.hooks.append(p.register_post_accumulate_grad_hook(
                    lambda p, i=i: self._ready(i)))

    def _build(self, bucket_indices):
        import torch

        # initialize_buckets: buckets_.clear() first, then one at::empty per bucket.
        self.buckets = None
        self.buckets, self.where = [], {}
        for b, idx in enumerate(bucket_indices):
            ps = [self.params[i] for i in idx]
            n = sum(p.numel() for p in ps)
            buf = torch.empty(n, dtype=ps[0].dtype, device=ps[0].device)
            off = 0
            for i, p in zip(idx, ps):
                self.where[i] = (b, off)
                off += p.numel()
            self.buckets.append({"buf": buf, "idx": list(idx), "pending": len(idx)})
        if self.as_view:
            for i, (b, off) in self.where.items():
                p = self.params[i]
                if p.grad is not None:
                    p.grad = self._view(i)

    def _view(self, i):
        b, off = self.where[i]
        p = self.params[i]
        return self.buckets[b]["buf"][off:off + p.numel()].view(p.shape)

    def _ready(self, i):
        if not self.rebuilt:
            self.ready_order.append(i)
        p = self.params[i]
        view = self._view(i)
        if self.as_view:
            if p.grad is not view:
                view.copy_(p.grad)
                p.grad = view      # the engine's own gradient is dropped; the view stays
        else:
            view.copy_(p.grad)
        bk = self.buckets[self.where[i][0]]
        bk["pending"] -= 1
        if bk["pending"] == 0:
            bk["pending"] = len(bk["idx"])
            # all-reduce on the fake group: no caching-allocator memory either way
            if not self.as_view:
                for j in bk["idx"]:
                    if self.params[j].grad is not None:
                        self.params[j].grad.copy_(self._view(j))

    # DDP's calls
    def prepare_for_forward(self):
        pass

    def prepare_for_backward(self, outputs=()):
        pass

    def _rebuild_buckets(self):
        import torch.distributed as dist

        if self.rebuilt or not self.ready_order:
            return False
        self.rebuilt = True
        order = list(dict.fromkeys(self.ready_order))
        params = [self.params[i] for i in order]
        idx, _ = dist._compute_bucket_assignment_by_size(
            params, [self.first_bucket_bytes_cap, self.bucket_bytes_cap], [False] * len(params))
        self._build([[order[j] for j in b] for b in idx])
        return True

    def _remove_autograd_hooks(self):
        for h in self.hooks:
            h.remove()
        self.hooks = []

    def __getattr__(self, name):
        return lambda *a, **k: None


def _install_fake_pg(rank, world_size):
    """Route the script's init_process_group to the fake backend; stand in for DDP's reducer."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.testing._internal.distributed.fake_pg import FakeStore

    orig = getattr(c10d.init_process_group, "_vramroom_orig", c10d.init_process_group)

    def init_process_group(backend=None, init_method=None, timeout=None, world_size_=-1,
                           rank_=-1, store=None, *a, **k):
        kw = {}
        if timeout is not None:
            kw["timeout"] = timeout
        return orig("fake", store=FakeStore(), rank=rank, world_size=world_size, **kw)

    init_process_group._vramroom_orig = orig
    dist.init_process_group = init_process_group
    c10d.init_process_group = init_process_group
    # DDP's construction checks: _verify_params_across_processes reads the parameters' data
    # (there is none); the broadcast of module states is a no-op on the fake group anyway.
    dist._verify_params_across_processes = lambda *a, **k: None
    dist.Reducer = _TracedReducer
    dist.Logger = lambda reducer: _Nothing()
    _real_device_mesh()
    _fsdp_storage_resizes()
    return orig


def _recorder():
    import torch

    mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    return getattr(mode, "_vr", None)


def _fsdp_storage_resizes():
    """FSDP2 allocates and frees its unsharded parameters (the all-gather outputs) with
    `untyped_storage().resize_(n)` / `resize_(0)` (`alloc_storage` / `free_storage`): on CUDA
    each is a caching-allocator malloc or free. A storage resize is no dispatched op, so the
    tracer learns of it here, at once, in program order."""
    try:
        import torch.distributed.fsdp._fully_shard._fsdp_param as fp
        import torch.distributed.fsdp._fully_shard._fsdp_param_group as fg
    except ImportError:
        return
    if getattr(fp.alloc_storage, "_vramroom", False):
        return
    orig_alloc, orig_free = fp.alloc_storage, fp.free_storage

    def seen(fn):
        def wrapper(tensor):
            fn(tensor)
            rec = _recorder()
            if rec is not None:
                rec.see_storage(tensor.untyped_storage())

        wrapper._vramroom = True
        return wrapper

    fp.alloc_storage, fp.free_storage = seen(orig_alloc), seen(orig_free)
    for m in (fg,):
        if hasattr(m, "alloc_storage"):
            m.alloc_storage = fp.alloc_storage
        if hasattr(m, "free_storage"):
            m.free_storage = fp.free_storage


def _real_device_mesh():
    """A DeviceMesh's rank grid is a small CPU tensor whose values it reads (`nonzero`): build
    meshes outside the fake mode, as the real run does. Their GPU memory is none."""
    import functools

    import torch.distributed as dist
    import torch.distributed.device_mesh as dm
    import torch.distributed.tensor as dt
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    orig = dm.init_device_mesh
    if getattr(orig, "_vramroom", False):
        return

    @functools.wraps(orig)
    def init_device_mesh(*a, **k):
        with unset_fake_temporarily():
            return orig(*a, **k)

    init_device_mesh._vramroom = True
    dm.init_device_mesh = init_device_mesh
    dt.init_device_mesh = init_device_mesh
    try:
        import torch.distributed.fsdp._fully_shard._fsdp_init as fi

        import torch.distributed.fsdp._fully_shard._fully_shard as fs
    except ImportError:
        return
    fi.init_device_mesh = init_device_mesh

    def _init_default_mesh(mesh_dim_names=None):
        # PyTorch asks torch._C._get_accelerator(), which is the CPU on a machine with no
        # GPU; the traced run's accelerator is CUDA.
        if not dist.distributed_c10d.is_initialized():
            dist.distributed_c10d.init_process_group()
        pg = dist.distributed_c10d._get_default_group()
        return init_device_mesh("cuda", mesh_shape=(pg.size(),), mesh_dim_names=mesh_dim_names)

    for m in (fi, fs):
        for name in ("_init_default_mesh", "_init_default_fully_shard_mesh"):
            if hasattr(m, name):
                setattr(m, name, _init_default_mesh)


def trace_rank(path, argv, rank, world_size, gpu="h100", snapshot_out=None, capacity=None):
    """Trace one rank in this process; the `Trace`."""
    from .api import run_script

    check_torch()
    old = {k: os.environ.get(k) for k in rank_env(rank, world_size)}
    os.environ.update(rank_env(rank, world_size))
    _install_fake_pg(rank, world_size)
    import torch.distributed as dist

    try:
        return run_script(path, argv, gpu=gpu, snapshot_out=snapshot_out, capacity=capacity)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_script_ranks(path, argv=(), world_size=2, gpu="h100", out_dir=None, capacity=None,
                     isolate=True, timeout=None):
    """Trace `path` once per rank; the snapshot paths out_dir/rank{r}.pickle, rank order."""
    if not os.path.exists(path):
        raise TraceError("no such script: %s" % path)
    world_size = int(world_size)
    if not 1 <= world_size <= 1024:
        raise TraceError("world size must be 1 to 1024, not %d" % world_size)
    out_dir = out_dir or "vramroom-ranks"
    os.makedirs(out_dir, exist_ok=True)
    gname = gpu if isinstance(gpu, str) else gpu.name
    paths = []
    for r in range(world_size):
        snap = os.path.join(out_dir, "rank%d.pickle" % r)
        if isolate:
            code = ("import os, sys; from vramroom.trace.ranks import trace_rank; "
                    "t = trace_rank(%r, %r, %d, %d, gpu=%r, snapshot_out=%r); "
                    "sys.stdout.flush(); sys.stderr.flush(); os._exit(0)"
                    % (os.path.abspath(path), list(argv), r, world_size, gname, snap))
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(
                [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))]
                + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
            p = subprocess.run([sys.executable, "-c", code], env=env, timeout=timeout,
                               stdout=None if r == 0 else subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
            if p.returncode != 0:
                raise TraceError("rank %d of %d failed (%d): %s" % (
                    r, world_size, p.returncode, p.stderr.strip()[-3000:]))
        else:
            trace_rank(path, argv, r, world_size, gpu=gpu, snapshot_out=snap, capacity=capacity)
        paths.append(snap)
    return paths


def replay_ranks(paths, capacity=None, json_out=False):
    """`vramroom replay rank0.pickle rank1.pickle ...`: its table (text), or the JSON."""
    args = ["replay"] + list(paths)
    if capacity is not None:
        args += ["--capacity", str(capacity)]
    if json_out:
        args.append("--json")
    return run_cli(args, parse_json=json_out)


def main(argv=None):
    import argparse

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: python -m vramroom.trace.ranks --world-size N [--gpu G] [--out DIR] "
              "[--capacity SIZE] [--in-process] -- script.py ARGS", file=sys.stderr)
        return 2
    i = argv.index("--")
    mine, rest = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="python -m vramroom.trace.ranks")
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--gpu", default="h100")
    p.add_argument("--out", default="vramroom-ranks")
    p.add_argument("--capacity", default=None)
    p.add_argument("--json", action="store_true")
    p.add_argument("--in-process", action="store_true",
                   help="trace the ranks one after another in this process")
    a = p.parse_args(mine)
    if not rest:
        p.error("no script given")
    from .gpus import get_gpu

    try:
        gpu = get_gpu(a.gpu)
        check_torch()
        from .hidden import load_table

        ctx = load_table()["archs"][gpu.arch].get("cuda_context_bytes", 0)
        cap = a.capacity if a.capacity else str(gpu.total_memory - ctx)
        paths = run_script_ranks(rest[0], rest[1:], a.world_size, gpu=a.gpu, out_dir=a.out,
                                 isolate=not a.in_process)
        out = replay_ranks(paths, capacity=cap, json_out=a.json)
    except (ValueError, TraceError) as e:
        print("vramroom.trace.ranks: error: %s" % e, file=sys.stderr)
        return 2
    sys.stdout.flush()
    print(json.dumps(out, indent=1) if a.json else out, end="" if not a.json else "\n")
    return 0


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
