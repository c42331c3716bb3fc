"""python -m vramroom.trace [--gpu G] [--snapshot-out F] [--capacity SIZE] [--alloc-conf C]
                          [--what-if C]... [--json] -- script.py ARGS

Runs the script unmodified on fake CUDA (no GPU needed), then replays its allocations on
Vramroom's allocator: peak allocated and reserved, OOM at the capacity (default: the target
GPU's memory less the CUDA context), and one row per --what-if config. The script's own
output is kept; the report goes to stderr (stdout with --json, after the script's output).
Exit 2 on bad input or an op the tracer cannot model.
"""

import argparse
import json
import os
import sys
import time


def _size(s):
    return s


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        i = argv.index("--")
        mine, rest = argv[:i], argv[i + 1:]
    else:
        mine, rest = [], argv
        # options before the script
        while rest and rest[0].startswith("-"):
            mine.append(rest.pop(0))
            if mine[-1] in ("--gpu", "--snapshot-out", "--capacity", "--alloc-conf", "--what-if", "--world-size") and rest:
                mine.append(rest.pop(0))
    p = argparse.ArgumentParser(prog="python -m vramroom.trace", description=__doc__.split("\n\n")[1])
    p.add_argument("--gpu", default="h100", help="target GPU: h100 (default), h200, a100, a100-40gb, l4")
    p.add_argument("--snapshot-out", help="write the traced snapshot (PyTorch format) here")
    p.add_argument("--capacity", help="GPU capacity for the OOM verdict, e.g. 24GiB (default: the GPU's, less the CUDA context)")
    p.add_argument("--alloc-conf", default=None, help="PYTORCH_CUDA_ALLOC_CONF to replay under (default: PyTorch's default)")
    p.add_argument("--what-if", action="append", default=[], help="another allocator config to compare (repeatable)")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.add_argument("--world-size", type=int, help="trace every rank of a DDP/FSDP2 job on a fake process group, then the per-rank table (vramroom.trace.ranks; snapshots in ./vramroom-ranks)")
    a = p.parse_args(mine)
    if not rest:
        p.error("no script given: python -m vramroom.trace [options] -- script.py ARGS")
    script, sargs = rest[0], rest[1:]
    if a.world_size:  # several ranks: vramroom.trace.ranks
        from .ranks import main as ranks_main
        return ranks_main(["--world-size", str(a.world_size), "--gpu", a.gpu] + (["--capacity", a.capacity] if a.capacity else []) + (["--json"] if a.json else []) + ["--"] + rest)

    from .api import TraceError, check_torch, replay_snapshot, run_script
    from .capture import UnsupportedOp
    from .gpus import get_gpu

    def fail(msg):
        print("vramroom.trace: error: %s" % msg, file=sys.stderr)
        return 2

    try:
        gpu = get_gpu(a.gpu)
        check_torch()
    except (ValueError, TraceError) as e:
        return fail(e)
    if not os.path.exists(script):
        return fail("no such script: %s" % script)
    from .hidden import load_table

    ctx = load_table()["archs"][gpu.arch].get("cuda_context_bytes", 0)
    capacity = a.capacity if a.capacity else str(gpu.total_memory - ctx)
    t0 = time.perf_counter()
    try:
        t = run_script(script, sargs, gpu=gpu)
    except UnsupportedOp as e:
        return fail(e)
    except TraceError as e:
        return fail(e)
    traced_s = time.perf_counter() - t0
    snap = a.snapshot_out
    tmp = None
    if not snap:
        import tempfile

        fd, tmp = tempfile.mkstemp(suffix=".pickle", prefix="vramroom-trace-")
        os.close(fd)
        snap = tmp
    t.snapshot(snap)
    from .api import evidence_path  # the diagnosis's evidence, written beside the snapshot

    try:
        if t.events:
            rows = replay_snapshot(snap, capacity=capacity, alloc_conf=a.alloc_conf or "",
                                   what_if=a.what_if, evidence=evidence_path(snap))
        else:  # nothing on the GPU: nothing to replay, and nothing runs out
            cap = int(capacity) if str(capacity).isdigit() else None
            rows = [{"alloc_conf": c or "default", "peak_allocated_bytes": 0,
                     "peak_reserved_bytes": 0, "num_ooms": 0, "num_alloc_retries": 0,
                     "capacity_bytes": cap}
                    for c in [a.alloc_conf or ""] + list(a.what_if or [])]
    except TraceError as e:
        return fail(e)
    finally:
        if tmp:
            os.unlink(tmp)
            if os.path.exists(evidence_path(tmp)):
                os.unlink(evidence_path(tmp))
    report = {
        "script": script,
        "gpu": gpu.name,
        "capacity_bytes": rows[0].get("capacity_bytes"),
        "cuda_context_bytes": ctx,
        "trace_seconds": round(traced_s, 3),
        "events": len(t.events),
        "snapshot": a.snapshot_out,
        "warnings": t.warnings,
        "hidden": t.hidden_stats,
        "configs": [
            {
                "alloc_conf": r.get("alloc_conf"),
                "peak_allocated_bytes": r.get("peak_allocated_bytes"),
                "peak_reserved_bytes": r.get("peak_reserved_bytes"),
                "oom": bool(r.get("num_ooms")),
                "num_alloc_retries": r.get("num_alloc_retries"),
            }
            for r in rows
        ],
        "findings": rows[0].get("findings", []),
    }
    if a.json:
        sys.stdout.flush()
        print(json.dumps(report, indent=2))
        return 0
    gib = lambda n: "%.2f GiB" % (n / 2**30) if n is not None else "-"
    out = sys.stderr
    print("vramroom.trace: %s on %s (traced in %.1fs, %d events, no GPU used)"
          % (script, gpu.name, traced_s, len(t.events)), file=out)
    print("capacity %s (the CUDA context's %s is outside it)" % (gib(report["capacity_bytes"]), gib(ctx)), file=out)
    print("%-32s %16s %16s %6s" % ("alloc_conf", "peak allocated", "peak reserved", "OOM"), file=out)
    for c in report["configs"]:
        print("%-32s %16s %16s %6s" % (c["alloc_conf"] or "default", gib(c["peak_allocated_bytes"]),
                                       gib(c["peak_reserved_bytes"]), "yes" if c["oom"] else "no"), file=out)
    from .evidence import print_findings

    print_findings(report["findings"], out)
    for w, n in t.warnings.items():
        print("warning: %s (%d times)" % (w, n), file=out)
    if a.snapshot_out:
        print("snapshot: %s" % a.snapshot_out, file=out)
    return 0


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The traced program's interpreter teardown (autograd's device threads, weakref
    # callbacks into a closed trace) has nothing left to report: leave without it.
    os._exit(rc)
