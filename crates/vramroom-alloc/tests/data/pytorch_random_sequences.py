"""Random allocator call sequences run on PyTorch's CUDA caching allocator, for
tests/pytorch_differential.rs, which replays every sequence on a SimDevice and compares.

For each (config, memory limit, seed) the script draws ops online (tensor allocations of
1 B .. 200 MiB on three streams, frees, record_stream, empty_cache) and records after every
op the `.current` stats and the counters; the data pointer of each allocation (or null on
OOM); the full 122 stats at the end; and the segment_alloc / segment_map addresses, so the
replay can place segments at the same addresses (best fit breaks ties by address).

record_stream uses idle streams and every malloc is preceded by torch.cuda.synchronize(),
so each recorded event has completed by the next malloc: the pending-free timing is
deterministic (the block is reused at the first malloc after its free).

Usage (on a CUDA machine): OUT=DIR python3 pytorch_random_sequences.py
Writes DIR/pytorch_random_sequences.json.
"""
import json
import os
import random

import torch

MB = 1 << 20
GB = 1 << 30
OUT = os.environ.get("OUT", "/tmp/out")
os.makedirs(OUT, exist_ok=True)
TOTAL = torch.cuda.get_device_properties(0).total_memory
STREAMS = [torch.cuda.current_stream(), torch.cuda.Stream(), torch.cuda.Stream()]

# expandable_segments is named in every string: `_set_allocator_settings` keeps its previous
# value otherwise.
CASES = [
    ("expandable_segments:False", None),
    ("expandable_segments:False", 512 * MB),
    ("expandable_segments:True", None),
    ("expandable_segments:True", 512 * MB),
    ("expandable_segments:False,max_split_size_mb:64", None),
    ("expandable_segments:False,max_split_size_mb:64", 512 * MB),
    ("expandable_segments:False,max_split_size_mb:20", 384 * MB),
    ("expandable_segments:False,roundup_power2_divisions:4", None),
    ("expandable_segments:False,roundup_power2_divisions:[1:8,64:2,256:1,>:4]", 768 * MB),
    ("expandable_segments:False,garbage_collection_threshold:0.5", 768 * MB),
    ("expandable_segments:False,garbage_collection_threshold:0.8,max_split_size_mb:32", 512 * MB),
    ("expandable_segments:True,garbage_collection_threshold:0.6", 512 * MB),
    ("expandable_segments:True,max_split_size_mb:40", 384 * MB),
]
# Set after every case.
END_CONF = "expandable_segments:False"
SEEDS = [1, 2]
N_OPS = 150
BOUNDARIES = [511, 512, 513, MB - 1, MB, MB + 1, 2 * MB, 10 * MB - 1, 10 * MB, 10 * MB + 1,
              19 * MB, 20 * MB, 21 * MB, 64 * MB, 100 * MB]


def size(rng):
    c = rng.random()
    if c < 0.3:
        return rng.randint(1, 4096)
    if c < 0.55:
        return rng.randint(4097, MB)
    if c < 0.75:
        return rng.randint(MB + 1, 10 * MB)
    if c < 0.9:
        return rng.randint(10 * MB, 200 * MB)
    return rng.choice(BOUNDARIES)


def keys():
    s = torch.cuda.memory_stats()
    return [k for k in sorted(s) if k.endswith(".current") or k.startswith("num_")]


def run_case(conf, allowed, seed, ks):
    torch.cuda.synchronize()
    torch.cuda.memory._set_allocator_settings(conf)
    torch.cuda.empty_cache()
    if allowed:
        torch.cuda.set_per_process_memory_fraction(allowed / TOTAL)
    torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=1_000_000)
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    rng = random.Random(f"{conf}/{allowed}/{seed}")
    live = {}
    ops, results, stats = [], [], []

    def record(op, result=None):
        ops.append(op)
        results.append(result)
        s = torch.cuda.memory_stats()
        stats.append([s[k] for k in ks])

    for i in range(N_OPS):
        r = rng.random()
        if r < 0.5 or not live:
            n, k = size(rng), rng.randrange(3)
            torch.cuda.synchronize()
            try:
                with torch.cuda.stream(STREAMS[k]):
                    t = torch.empty(n, dtype=torch.uint8, device="cuda")
                live[i] = t
                record(["alloc", n, k], t.data_ptr())
                del t
            except torch.OutOfMemoryError:
                record(["alloc", n, k], None)
        elif r < 0.80:
            j = rng.choice(sorted(live))
            del live[j]
            record(["free", j])
        elif r < 0.93:
            j = rng.choice(sorted(live))
            k = rng.randrange(3)
            live[j].record_stream(STREAMS[k])
            record(["record", j, k])
        else:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            record(["empty_cache"])
    for j in sorted(live):
        del live[j]
        record(["free", j])
    final_stats = dict(torch.cuda.memory_stats())
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    record(["empty_cache"])
    trace = torch.cuda.memory._snapshot()["device_traces"][0]
    segs = [[e["action"], e["addr"], e["size"]] for e in trace
            if e["action"] in ("segment_alloc", "segment_free", "segment_map", "segment_unmap")]
    torch.cuda.memory._record_memory_history(enabled=None)
    torch.cuda.set_per_process_memory_fraction(1.0)
    torch.cuda.memory._set_allocator_settings(END_CONF)
    assert torch.cuda.memory_reserved() == 0
    return {"conf": conf, "fraction": (allowed / TOTAL) if allowed else None, "seed": seed,
            "ops": ops, "results": results, "stats": stats, "final_stats": final_stats,
            "segments": segs, "end_conf": END_CONF}


def main():
    ks = keys()
    out = {"torch": torch.__version__, "total_memory": TOTAL, "keys": ks, "cases": []}
    for conf, allowed in CASES:
        for seed in SEEDS:
            out["cases"].append(run_case(conf, allowed, seed, ks))
            print("done", conf, allowed, seed, flush=True)
    with open(os.path.join(OUT, "pytorch_random_sequences.json"), "w") as f:
        json.dump(out, f, separators=(",", ":"))


main()
