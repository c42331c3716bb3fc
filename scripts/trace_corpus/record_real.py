"""Ground truth for the fake-CUDA tracer: runs the corpus programs on a real GPU and records them.

One program, in this process (what the driver runs in a fresh child per program and config):

    python record_real.py --one PROG [--out DIR] [--conf-name NAME] [--alloc-conf CONF]
                          [--capacity BYTES | --capacity-fraction F] [--stacks python|none]
                          [--no-snapshot]

  Starts torch.cuda.memory._record_memory_history(max_entries=1_000_000, context="alloc",
  stacks="python") (python frames on allocations; --context all puts them on frees too)
  before the program runs, runs programs/PROG.py as __main__ (runpy), synchronizes, then writes
  DIR/snaps/PROG__NAME.pickle (torch.cuda.memory._snapshot()) and prints one line
  `RESULT {json}` with memory_stats() figures, device, torch version, wall time, the
  PYTORCH_CUDA_ALLOC_CONF in force, the capacity limit and whether the program OOMed
  (torch.OutOfMemoryError is caught and recorded as "oom": true; the child still exits 0).
  A capacity is applied with torch.cuda.set_per_process_memory_fraction(cap / total) before
  the program; "capacity_bytes" is the limit PyTorch enforces, int(fraction * total).

Everything, on the GPU machine (from this folder):

    python record_real.py --all --out DIR [--jobs 6] [--programs a,b] [--budget 270]

  1. every program under the default config (NAME "default") and under
     expandable_segments:True (NAME "expandable"), N children at a time, 120 s each at most;
  2. a capacity sweep under the default config, no history recording: for each program whose
     default run finished without OOM, with R its peak reserved bytes, capacities
     0.8R, 0.95R, R, R+2MiB, 1.1R (NAME "cap0.80", "cap0.95", "cap1.00", "cap1.00p2m",
     "cap1.10"), each run recording OOM or not;
  3. DIR/results.jsonl (one row per run), DIR/summary.txt (the table printed at the end) and
     DIR/snaps.tar.xz (snaps/*.pickle and logs/*.log). If the archive would exceed
     --max-archive-mib (14), the stack frames are stripped from the biggest snapshots
     (events and sizes stay; snaps/STRIPPED.txt lists them). DIR/snaps and DIR/logs are then
     removed (--keep-snaps keeps them) so that DIR holds only the three files.
"""
import argparse
import concurrent.futures as cf
import json
import os
import pickle
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = os.environ.get("TRACE_CORPUS_PROGRAMS", os.path.join(HERE, "programs"))
EXPANDABLE = "expandable_segments:True"
MIB = 1 << 20
SWEEP = [("cap0.80", 0.80, 0), ("cap0.95", 0.95, 0), ("cap1.00", 1.0, 0),
         ("cap1.00p2m", 1.0, 2 * MIB), ("cap1.10", 1.10, 0)]
STAT_KEYS = [
    "allocated_bytes.all.peak", "reserved_bytes.all.peak", "active_bytes.all.peak",
    "requested_bytes.all.peak", "allocated_bytes.all.current", "reserved_bytes.all.current",
    "num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
    "num_sync_all_streams", "segment.all.peak", "segment.all.current",
    "segment.large_pool.peak", "segment.small_pool.peak",
    "reserved_bytes.large_pool.peak", "reserved_bytes.small_pool.peak",
]


def list_programs():
    return sorted(f[:-3] for f in os.listdir(PROGRAMS) if f.endswith(".py") and not f.startswith("_"))


# --------------------------------------------------------------------------- child
def _fake_process_group():
    """RECORD_FAKE_PG=1 (with torchrun's RANK and WORLD_SIZE): the script's own
    init_process_group becomes PyTorch's fake group, so one real GPU runs one rank of an
    N-rank job with that rank's real shapes (sharded parameters, buckets, all-gather outputs)
    on the real caching allocator. Collectives return at once and move no data; everything
    else (DDP's C++ reducer, FSDP2, the device mesh) is PyTorch's own. ranks_real.py uses it."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.testing._internal.distributed.fake_pg import FakeStore

    orig = c10d.init_process_group
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    def init_process_group(*a, **k):
        return orig("fake", store=FakeStore(), rank=rank, world_size=world)

    dist.init_process_group = c10d.init_process_group = init_process_group

    # DDP's C++ reducer reads the all-reduce's future value as the bucket's result; the fake
    # group's future holds none (device run 16: an INTERNAL ASSERT in comm.cpp). A comm hook
    # that hands the bucket back as it is stands in: the default hook's all-reduce and
    # division work in place on the bucket, so neither allocates.
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    orig_ddp_init = DDP.__init__

    def ddp_init(self, *a, **k):
        orig_ddp_init(self, *a, **k)

        def same_bucket(state, bucket):
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        self.register_comm_hook(None, same_bucket)

    DDP.__init__ = ddp_init


def run_one(a):
    if a.alloc_conf is not None:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = a.alloc_conf
    import runpy

    import torch

    if os.environ.get("RECORD_FAKE_PG"):
        _fake_process_group()
    path = os.path.join(PROGRAMS, a.one + ".py")
    if not os.path.exists(path):
        path = a.one if a.one.endswith(".py") else a.one + ".py"
    prog = os.path.basename(path)[:-3]
    torch.cuda.init()
    free0, total = torch.cuda.mem_get_info()
    fraction, cap_bytes = None, None
    if a.capacity is not None or a.capacity_fraction is not None:
        fraction = a.capacity_fraction if a.capacity_fraction is not None else a.capacity / total
        fraction = min(fraction, 1.0)
        torch.cuda.set_per_process_memory_fraction(fraction)
        cap_bytes = int(fraction * total)  # what the allocator's size_t cast of fraction*total gives
    history = not a.no_snapshot
    if history:
        if a.stacks == "none":
            torch.cuda.memory._record_memory_history(max_entries=1_000_000, context=None)
        else:
            torch.cuda.memory._record_memory_history(
                max_entries=1_000_000, context=a.context, stacks=a.stacks)

    oom, error, oom_msg = False, None, None
    old_argv = sys.argv
    sys.argv = [path] + (a.prog_args.split() if a.prog_args else [])
    t0 = time.time()
    try:
        runpy.run_path(path, run_name="__main__")
    except torch.OutOfMemoryError as e:
        oom, oom_msg = True, str(e).splitlines()[0][:300]
    except SystemExit as e:
        if e.code not in (None, 0):
            error = f"SystemExit({e.code})"
    except Exception as e:  # noqa: BLE001 - recorded, not hidden
        import traceback

        traceback.print_exc()
        error = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    sys.argv = old_argv
    try:
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        error = error or f"synchronize: {e}"
    wall = time.time() - t0
    st = torch.cuda.memory_stats()
    row = {
        "program": prog,
        "conf": a.conf_name,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "capacity_bytes": cap_bytes,
        "capacity_request": a.capacity,
        "fraction": fraction,
        "oom": oom,
        "oom_message": oom_msg,
        "error": error,
        "peak_allocated_bytes": st.get("allocated_bytes.all.peak"),
        "peak_reserved_bytes": st.get("reserved_bytes.all.peak"),
        "num_alloc_retries": st.get("num_alloc_retries"),
        "num_ooms": st.get("num_ooms"),
        "stats": {k: st.get(k) for k in STAT_KEYS},
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "device": torch.cuda.get_device_name(0),
        "total_memory": total,
        "free_at_start": free0,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "wall_s": round(wall, 3),
        "prog_args": a.prog_args or "",
        "stacks": (a.stacks if a.stacks == "none" else f"{a.stacks}/{a.context}") if history else None,
    }
    if history:
        t1 = time.time()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        os.makedirs(os.path.join(a.out, "snaps"), exist_ok=True)
        sp = os.path.join(a.out, "snaps", f"{prog}__{a.conf_name}.pickle")
        with open(sp, "wb") as f:
            pickle.dump(snap, f)
        row["snapshot"] = os.path.relpath(sp, a.out)
        row["snapshot_bytes"] = os.path.getsize(sp)
        row["trace_events"] = sum(len(t) for t in snap.get("device_traces", []))
        row["segments_at_end"] = len(snap.get("segments", []))
        row["snapshot_s"] = round(time.time() - t1, 3)
    print("\nRESULT " + json.dumps(row), flush=True)
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown surprises; the row is out


# --------------------------------------------------------------------------- driver
def spawn(a, prog, conf, alloc_conf=None, capacity=None, no_snapshot=False):
    os.makedirs(os.path.join(a.out, "logs"), exist_ok=True)
    log = os.path.join(a.out, "logs", f"{prog}__{conf}.log")
    cmd = [sys.executable, os.path.abspath(__file__), "--one", prog, "--out", a.out,
           "--conf-name", conf, "--stacks", a.stacks, "--context", a.context]
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    # N children share the CPUs: keep each one's CPU thread pool small (no effect on GPU memory)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 8) // max(1, a.jobs))))
    if alloc_conf:
        cmd += ["--alloc-conf", alloc_conf]
        env["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
    if capacity is not None:
        cmd += ["--capacity", str(int(capacity))]
    if no_snapshot:
        cmd.append("--no-snapshot")
    t0 = time.time()
    row = None
    with open(log, "w") as lf:
        try:
            subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env,
                           timeout=a.timeout, cwd=HERE)
            status = None
        except subprocess.TimeoutExpired:
            status = f"timeout after {a.timeout}s"
    with open(log, errors="replace") as lf:
        for line in lf:
            if line.startswith("RESULT "):
                row = json.loads(line[7:])
    if row is None:
        tail = open(log, errors="replace").read()[-400:].strip().replace("\n", " | ")
        row = {"program": prog, "conf": conf, "alloc_conf": alloc_conf or "",
               "capacity_bytes": capacity, "oom": None,
               "error": status or f"child died: {tail}"}
    row["child_s"] = round(time.time() - t0, 2)
    return row


def fmt_b(n):
    return "-" if n is None else f"{n / MIB:.1f}"


def _xz_size(path):
    import lzma

    with open(path, "rb") as f:
        return len(lzma.compress(f.read(), preset=6))


def _strip(path):
    with open(path, "rb") as f:
        s = pickle.load(f)
    for seg in s.get("segments", []):
        for b in seg.get("blocks", []):
            b["frames"] = []
    for tr in s.get("device_traces", []):
        for e in tr:
            e["frames"] = []
    with open(path, "wb") as f:
        pickle.dump(s, f)
    return _xz_size(path)


def pack(a, rows):
    """snaps/ and logs/ into DIR/snaps.tar.xz, stripping stack frames from the biggest
    snapshots while the per-file xz estimate of the whole exceeds --max-archive-mib."""
    snaps = os.path.join(a.out, "snaps")
    logs = os.path.join(a.out, "logs")
    arc = os.path.join(a.out, "snaps.tar.xz")
    limit = a.max_archive_mib * MIB
    pickles = [os.path.join(snaps, f) for f in os.listdir(snaps) if f.endswith(".pickle")] \
        if os.path.isdir(snaps) else []
    raw = sum(os.path.getsize(p) for p in pickles)
    t0 = time.time()
    workers = max(1, min(len(pickles), os.cpu_count() or 4))
    stripped = []
    with cf.ProcessPoolExecutor(workers) as ex:
        est = dict(zip(pickles, ex.map(_xz_size, pickles))) if pickles else {}
        total = sum(est.values())
        print(f"[pack] {len(pickles)} snapshots, {raw / MIB:.1f} MiB raw, ~{total / MIB:.2f} MiB as xz "
              f"({time.time() - t0:.0f}s)", flush=True)
        # strip stacks: first every snapshot over 3 MiB raw, then the biggest (xz) halves of the rest
        rest = sorted(pickles, key=lambda p: est[p], reverse=True)
        first = [p for p in rest if os.path.getsize(p) > 3 * MIB]
        while total > limit and rest:
            batch = first or rest[:max(1, len(rest) // 2)]
            first = []
            for p, n in zip(batch, ex.map(_strip, batch)):
                est[p] = n
                rest.remove(p)
                stripped.append(os.path.basename(p))
            total = sum(est.values())
            print(f"[pack] stripped frames from {len(stripped)} snapshots -> ~{total / MIB:.2f} MiB", flush=True)
    if stripped:
        with open(os.path.join(snaps, "STRIPPED.txt"), "w") as f:
            f.write("stack frames stripped (events kept) to fit the archive:\n" + "\n".join(sorted(stripped)) + "\n")
    if os.path.exists(arc):
        os.remove(arc)
    members = [d for d in ("snaps", "logs") if os.path.isdir(os.path.join(a.out, d))]
    r = subprocess.run(["tar", "-C", a.out, "-cJf", arc] + members, env=dict(os.environ, XZ_OPT="-6 -T0"))
    if r.returncode != 0:  # no xz binary: Python's lzma (one thread)
        with tarfile.open(arc, "w:xz") as t:
            for m in members:
                t.add(os.path.join(a.out, m), arcname=m)
    size = os.path.getsize(arc)
    print(f"[pack] snaps.tar.xz {size / MIB:.2f} MiB ({time.time() - t0:.0f}s)", flush=True)
    for row in rows:
        if row.get("snapshot") and os.path.basename(row["snapshot"]) in stripped:
            row["stacks_stripped"] = True
    if not a.keep_snaps and size <= 16 * MIB:
        import shutil

        shutil.rmtree(snaps, ignore_errors=True)
        shutil.rmtree(logs, ignore_errors=True)
    return size


def run_all(a):
    os.makedirs(a.out, exist_ok=True)
    progs = a.programs.split(",") if a.programs else list_programs()
    t_start = time.time()
    deadline = t_start + a.budget
    rows = []
    res_path = os.path.join(a.out, "results.jsonl")
    open(res_path, "w").close()

    def record(r):
        rows.append(r)
        with open(res_path, "a") as f:
            f.write(json.dumps(r) + "\n")
        cap = f" cap={fmt_b(r.get('capacity_bytes'))}MiB" if r.get("capacity_bytes") else ""
        print(f"[{time.time() - t_start:6.1f}s] {r['program']:34s} {r['conf']:11s}{cap} "
              f"alloc={fmt_b(r.get('peak_allocated_bytes'))}MiB "
              f"reserved={fmt_b(r.get('peak_reserved_bytes'))}MiB oom={r.get('oom')} "
              f"wall={r.get('wall_s')}s child={r.get('child_s')}s"
              + (f" ERROR {r['error']}" if r.get("error") else ""), flush=True)

    def run_tasks(tasks):
        with cf.ThreadPoolExecutor(a.jobs) as ex:
            futs = []
            for t in tasks:
                futs.append(ex.submit(lambda t=t: None if time.time() > deadline else spawn(a, *t[:2], **t[2])))
            for fu in cf.as_completed(futs):
                r = fu.result()
                if r is not None:
                    record(r)
        skipped = [t for t, fu in zip(tasks, futs) if fu.result() is None]
        for t in skipped:
            record({"program": t[0], "conf": t[1], "oom": None, "error": "skipped: budget",
                    "capacity_bytes": t[2].get("capacity")})

    print(f"[phase 1] {len(progs)} programs x (default, expandable), {a.jobs} jobs", flush=True)
    tasks = []
    for p in progs:
        tasks.append((p, "default", {}))
        tasks.append((p, "expandable", {"alloc_conf": EXPANDABLE}))
    run_tasks(tasks)

    base = {r["program"]: r for r in rows if r["conf"] == "default"}
    tasks = []
    # the capacities nearest the peak first, so that a run out of --budget loses the outer ones
    for name, f, plus in sorted(SWEEP, key=lambda s: abs(s[1] - 1.0) + s[2] / 1e9):
        for p in progs:
            r = base.get(p)
            if not r or r.get("oom") is not False or r.get("error") or not r.get("peak_reserved_bytes"):
                continue
            R = r["peak_reserved_bytes"]
            tasks.append((p, name, {"capacity": int(R * f) + plus, "no_snapshot": True}))
    print(f"[phase 2] capacity sweep: {len(tasks)} runs", flush=True)
    run_tasks(tasks)

    size = pack(a, rows)
    # rewrite results.jsonl in a stable order (program, conf), with the stripped flags
    order = {n: i for i, n in enumerate(["default", "expandable"] + [s[0] for s in SWEEP])}
    rows.sort(key=lambda r: (r["program"], order.get(r["conf"], 99)))
    with open(res_path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")

    lines = []
    dev = next((r.get("device") for r in rows if r.get("device")), "?")
    tv = next((r.get("torch") for r in rows if r.get("torch")), "?")
    lines.append(f"device: {dev}   torch {tv}   total {time.time() - t_start:.0f}s   "
                 f"archive {size / MIB:.2f} MiB")
    hdr = (f"{'program':34s} {'alloc MiB':>10s} {'resv MiB':>10s} {'exp resv':>10s} {'retries':>7s} "
           f"{'wall s':>6s}  sweep OOM (0.80 0.95 1.00 +2M 1.10)")
    lines += [hdr, "-" * len(hdr)]
    by = {}
    for r in rows:
        by.setdefault(r["program"], {})[r["conf"]] = r
    for p in progs:
        d = by.get(p, {}).get("default", {})
        e = by.get(p, {}).get("expandable", {})
        sw = []
        for name, _, _ in SWEEP:
            s = by.get(p, {}).get(name)
            sw.append("-" if not s else ("E" if s.get("error") else ("OOM" if s.get("oom") else "ok")))
        flag = " ERROR: " + str(d.get("error")) if d.get("error") else (" OOM" if d.get("oom") else "")
        lines.append(f"{p:34s} {fmt_b(d.get('peak_allocated_bytes')):>10s} "
                     f"{fmt_b(d.get('peak_reserved_bytes')):>10s} {fmt_b(e.get('peak_reserved_bytes')):>10s} "
                     f"{str(d.get('num_alloc_retries', '-')):>7s} {str(d.get('wall_s', '-')):>6s}  "
                     + " ".join(f"{x:>4s}" for x in sw) + flag)
    errs = [r for r in rows if r.get("error")]
    lines.append(f"{len(rows)} runs, {len(errs)} with errors")
    text = "\n".join(lines)
    print(text, flush=True)
    with open(os.path.join(a.out, "summary.txt"), "w") as f:
        f.write(text + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", help="program name (programs/NAME.py) or a path")
    ap.add_argument("--all", action="store_true")
    ap.add_argument("--out", default="out_real")
    ap.add_argument("--conf-name", default="default")
    ap.add_argument("--alloc-conf", default=None)
    ap.add_argument("--capacity", type=int, default=None, help="bytes")
    ap.add_argument("--capacity-fraction", type=float, default=None)
    ap.add_argument("--stacks", default="python", choices=["python", "all", "none"])
    ap.add_argument("--context", default="alloc", choices=["alloc", "all", "state"],
                    help="which events carry stack frames (alloc: allocations only, half the size)")
    ap.add_argument("--no-snapshot", action="store_true", help="no history recording, no snapshot")
    ap.add_argument("--prog-args", default="", help="arguments for the program (--one)")
    ap.add_argument("--programs", default="", help="comma-separated subset (--all)")
    ap.add_argument("--jobs", type=int, default=6)
    ap.add_argument("--timeout", type=int, default=120, help="seconds per child")
    ap.add_argument("--budget", type=int, default=270, help="seconds after which no new run starts")
    ap.add_argument("--max-archive-mib", type=float, default=14.0)
    ap.add_argument("--keep-snaps", action="store_true")
    a = ap.parse_args()
    a.out = os.path.abspath(a.out)
    if a.one:
        run_one(a)
    elif a.all:
        run_all(a)
    else:
        ap.error("give --one PROG or --all")


if __name__ == "__main__":
    main()
