"""Records one workload of workloads.py as a PyTorch memory snapshot, on a CUDA machine.

    python3 scripts/corpus/record.py WORKLOAD OUT.pickle [--record JSON] [--dev cuda|cpu]

`--record` is the keyword arguments of torch.cuda.memory._record_memory_history, as JSON:
    '{}'                                        PyTorch's defaults (context "all", stacks "all":
                                                Python and C++ frames), how most users record
    '{"context": "all", "stacks": "python"}'    the probe's settings
    '{"context": "alloc", "stacks": "python"}'  stacks on allocations only
    '{"context": null}'                         no frames
    '{"max_entries": 2000}'                     a ring buffer that wraps
Default: '{}'. Set PYTORCH_CUDA_ALLOC_CONF to record under another allocator config; run each
recording in a fresh process, so that its trace starts from an empty cache.

Prints one JSON line with PyTorch's own figures (from memory_stats() at the end), which a replay
of the snapshot under its own config must reproduce: peak allocated and reserved, device
allocations and frees, retries, OOMs, and the snapshot's size and event count.
ddp_gloo_2rank runs as two processes (gloo, both on cuda:0) and writes OUT.rank0.pickle and
OUT.rank1.pickle, one line each.
"""
import argparse
import json
import os
import pickle
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import workloads  # noqa: E402

STAT_KEYS = [
    "allocated_bytes.all.peak", "reserved_bytes.all.peak", "allocated_bytes.all.current",
    "reserved_bytes.all.current", "active_bytes.all.peak", "requested_bytes.all.peak",
    "num_device_alloc", "num_device_free", "num_alloc_retries", "num_ooms",
    "num_sync_all_streams", "segment.all.peak", "segment.all.current",
]


def dump(out, record, t0, extra=None):
    torch.cuda.synchronize()
    t1 = time.time()
    snap = torch.cuda.memory._snapshot()
    t_snap = time.time() - t1
    torch.cuda.memory._record_memory_history(enabled=None)
    with open(out, "wb") as f:
        pickle.dump(snap, f)
    st = torch.cuda.memory_stats()
    line = {
        "snapshot": os.path.basename(out),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "record": record,
        "bytes": os.path.getsize(out),
        "events": [len(t) for t in snap["device_traces"]],
        "segments_at_end": len(snap["segments"]),
        "pools_at_end": sorted({str(tuple(s["segment_pool_id"])) for s in snap["segments"]}),
        "fraction": torch.cuda.get_per_process_memory_fraction(0),
        "total_memory": torch.cuda.get_device_properties(0).total_memory,
        "stats": {k: st.get(k) for k in STAT_KEYS},
        "seconds_workload": round(t1 - t0, 3),
        "seconds_snapshot": round(t_snap, 3),
        "torch": torch.__version__,
    }
    if extra:
        line.update(extra)
    print(json.dumps(line), flush=True)


def ddp_rank(rank, out, record, dev):
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    if dev == "cuda":
        torch.cuda.init()
        torch.cuda.memory._record_memory_history(**record)
    t0 = time.time()
    workloads.ddp_rank_body(dev, rank, 2)
    if dev == "cuda":
        dump(out.replace(".pickle", f".rank{rank}.pickle"), record, t0, {"rank": rank})
    else:
        print(json.dumps({"workload": "ddp_gloo_2rank", "rank": rank, "cpu_smoke": "ok"}))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workload")
    ap.add_argument("out")
    ap.add_argument("--record", default="{}")
    ap.add_argument("--dev", default="cuda")
    a = ap.parse_args()
    record = json.loads(a.record)
    if a.workload == "ddp_gloo_2rank":
        import socket

        import torch.multiprocessing as mp

        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(s.getsockname()[1])
        s.close()
        mp.spawn(ddp_rank, args=(a.out, record, a.dev), nprocs=2, join=True)
        return
    fn = getattr(workloads, a.workload)
    if a.dev == "cpu":
        fn("cpu")
        print(json.dumps({"workload": a.workload, "cpu_smoke": "ok"}))
        return
    torch.cuda.init()
    torch.cuda.memory._record_memory_history(**record)
    t0 = time.time()
    fn("cuda")
    dump(a.out, record, t0)


if __name__ == "__main__":
    main()
