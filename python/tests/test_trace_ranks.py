"""vramroom.trace.ranks: DDP and FSDP2 scripts traced per rank on a fake process group, no GPU.

The per-rank allocations are checked against a hand computation from the model's shapes:
FSDP2's sharded parameters are each parameter's dim-0 chunk of ceil(d0 / N) rows, its
all-gather buffers N times a block's padded shards; DDP's gradient buckets add up to the
model's parameter bytes (one bucket first, then rebuilt under bucket_cap_mb). Each trace runs in
a fresh interpreter (the tracer patches torch.cuda and PyTorch's CUDA hooks for the process).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="vramroom.trace tests need PyTorch (CPU-only machine is fine)")
if not hasattr(torch, "_subclasses") or not torch.__version__.startswith("2.11"):
    pytest.skip("vramroom.trace supports PyTorch 2.11.x; this is %s" % getattr(torch, "__version__", "?"),
                allow_module_level=True)
if torch.version.cuda is None:
    pytest.skip("vramroom.trace needs a CUDA build of PyTorch (no GPU needed)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
PROGS = ROOT / "scripts" / "trace_corpus" / "programs"
DDP = PROGS / "dist_ddp_train.py"
FSDP = PROGS / "dist_fsdp2_train.py"


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    return env


# In the child: trace every rank in one process, one after another (run_script_ranks with
# isolate=False does the same), and summarise each rank's allocations by where they came from.
CHILD = r"""
import json, os, sys
from vramroom.trace.ranks import trace_rank
script, n, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
out = []
for r in range(n):
    t = trace_rank(script, argv, r, n)
    allocs = []
    for act, addr, size, stream, frames in (e[:5] for e in t.events):
        if act != "alloc":
            continue
        where = "user"
        for f in frames:
            if os.path.basename(f[0]) in ("_fsdp_param.py", "_fsdp_collectives.py", "distributed.py"):
                where = "%s:%s" % (os.path.basename(f[0]), f[2])
                break
        allocs.append([where, size])
    out.append({"peak": t.peak_allocated, "allocs": allocs})
print("\nJSON" + json.dumps(out))
sys.stdout.flush(); os._exit(0)
"""


def _trace(script, n, *argv):
    p = subprocess.run([sys.executable, "-c", CHILD, str(script), str(n)] + [str(a) for a in argv],
                       capture_output=True, text=True, env=_env(), cwd=str(PROGS), timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.split("\nJSON", 1)[1])


def _fsdp_shapes(h, layers):
    """(dim0, rest) of each parameter of dist_fsdp2_train.Net, per fully_shard group."""
    block = [(4 * h, h), (4 * h, 1), (h, 4 * h), (h, 1)]
    root = [(h, 1024), (h, 1), (10, h), (10, 1)]
    return root, block


def _ceil(a, b):
    return -(-a // b)


@pytest.mark.parametrize("n", [2, 4])
def test_fsdp2_sharded_params_and_all_gather_buffers(n):
    h, layers = 256, 2
    ranks = _trace(FSDP, n, "--hidden", h, "--layers", layers, "--batch", 64, "--steps", 2)
    assert len(ranks) == n
    root, block = _fsdp_shapes(h, layers)
    shard = lambda ps: sum(_ceil(d0, n) * rest * 4 for d0, rest in ps)  # fp32, padded dim-0 chunk
    full = lambda ps: sum(d0 * rest * 4 for d0, rest in ps)
    for r in ranks:
        sharded = [s for w, s in r["allocs"] if w == "_fsdp_param.py:_init_sharded_param"]
        # 1/N of every parameter (the padded shard), once, at fully_shard
        assert sum(sharded) == shard(root) + layers * shard(block)
        assert sum(sharded) < (full(root) + layers * full(block)) / n + 4 * 1024 * n
        coll = [s for w, s in r["allocs"] if w.startswith("_fsdp_collectives.py")]
        # the all-gather output of a block: N padded shards, written by the (fake) collective
        assert coll.count(n * shard(block)) >= layers * 2, sorted(set(coll))
        # the reduce-scatter output: one padded shard of the block's gradients, per block per step
        assert coll.count(shard(block)) >= layers * 2, sorted(set(coll))
        # the unsharded parameters are allocated and freed per all-gather (storage resize_)
        ag_out = [s for w, s in r["allocs"] if w == "_fsdp_param.py:alloc_all_gather_outputs"]
        assert ag_out, "FSDP2's unsharded parameters (alloc_storage) were not seen"
    # same data on every rank: the same peak, but for uneven shards: `out` has 10 rows, so at
    # N=4 ranks 0-2 hold 3 rows of it and rank 3 one (its gradient and AdamW states are the
    # unpadded shard): a few KiB apart
    peaks = [r["peak"] for r in ranks]
    assert max(peaks) - min(peaks) <= 3 * 10 * h * 4 // n * 4, peaks
    if n == 2:
        assert len(set(peaks)) == 1, peaks


def test_fsdp2_peak_shrinks_with_world_size():
    h = 512
    p2 = _trace(FSDP, 2, "--hidden", h, "--layers", 2, "--batch", 32, "--steps", 2)[0]["peak"]
    p4 = _trace(FSDP, 4, "--hidden", h, "--layers", 2, "--batch", 32, "--steps", 2)[0]["peak"]
    assert p4 < p2


def test_ddp_buckets_are_the_model_size():
    h = 256
    ranks = _trace(DDP, 2, "--hidden", h, "--batch", 64, "--batch-step", 64, "--steps", 3,
                   "--bucket-cap-mb", 0.25)
    params = (1024 * h + h) + 2 * (h * h + h) + (h * 10 + 10)
    pbytes = params * 4
    for r in ranks:
        # DDP's construction: one bucket holding every gradient (DDP asks for sys.maxsize
        # until the first backward has shown the order gradients become ready)
        first = [s for w, s in r["allocs"] if w == "distributed.py:_ddp_init_helper"]
        assert first == [pbytes]
        # the rebuild before the second forward, in that order under bucket_cap_mb (0.25
        # MiB here): the same bytes in several buckets, each near the cap
        rebuilt = [s for w, s in r["allocs"] if w == "distributed.py:_pre_forward"]
        assert sum(rebuilt) == pbytes and len(rebuilt) >= 3, rebuilt
    # rank 1 has 64 more rows of data: a higher peak; the buckets are the same
    assert ranks[1]["peak"] > ranks[0]["peak"]


def test_cli_table_names_the_rank_that_runs_out_first(tmp_path):
    from vramroom.trace.api import find_binary

    try:
        find_binary()
    except Exception:
        pytest.skip("no vramroom binary")
    out = tmp_path / "ranks"
    p = subprocess.run([sys.executable, "-m", "vramroom.trace.ranks", "--world-size", "2", "--out", str(out),
                        "--json", "--", str(FSDP), "--hidden", "256", "--layers", "2", "--batch", "64",
                        "--batch-step", "512", "--steps", "2"],
                       capture_output=True, text=True, env=_env(), cwd=str(PROGS), timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["rank0.evidence.json", "rank0.pickle",
                                       "rank1.evidence.json", "rank1.pickle"]
    j = json.loads(p.stdout[p.stdout.index("\n[") + 1:] if not p.stdout.startswith("[") else p.stdout)
    rows = j[0]["rows"]
    assert [r["rank"] for r in rows] == ["rank0.pickle", "rank1.pickle"]
    assert j[0]["worst"] == 1  # rank 1 has the most data
    assert rows[1]["peak_allocated_bytes"] > rows[0]["peak_allocated_bytes"]


def test_trace_world_size_flag(tmp_path):
    from vramroom.trace.api import find_binary

    try:
        find_binary()
    except Exception:
        pytest.skip("no vramroom binary")
    p = subprocess.run([sys.executable, "-m", "vramroom.trace", "--world-size", "2", "--capacity", "8GiB", "--",
                        str(DDP), "--hidden", "128", "--batch", "32", "--steps", "2"],
                       capture_output=True, text=True, env=_env(), cwd=str(tmp_path), timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "2 ranks" in p.stdout and "rank1.pickle" in p.stdout and "imbalance" in p.stdout
    assert (tmp_path / "vramroom-ranks" / "rank1.pickle").exists()
