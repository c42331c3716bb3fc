"""The tables of scripts/gpu-check.sh, from the files its `gpu` half wrote.

    python3 scripts/gpu_report.py RESULTS_DIR

Reads tests.log (the GPU test binaries' output), bench.json (crates/vramroom-cuda/examples/
cuda_bench.rs), models.jsonl (`vramroom bench models`, with PyTorch's figures beside) and
workloads.jsonl (scripts/torch_workloads.py), and prints one report.
"""
import json
import os
import re
import sys

MIB = 1 << 20


def load_jsonl(path):
    out = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
    return out


def main():
    r = sys.argv[1] if len(sys.argv) > 1 else "/tmp/vramroom-gpu"
    print("GPU tests")
    tp = tf = ts = 0
    if os.path.exists(os.path.join(r, "tests.log")):
        with open(os.path.join(r, "tests.log")) as f:
            text = f.read()
        for m in re.finditer(r"test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored", text):
            tp += int(m.group(1))
            tf += int(m.group(2))
        ts = text.count("SKIP")
    print("  GPU test binaries: %d passed, %d failed (%d SKIP lines)" % (tp, tf, ts))
    wl = load_jsonl(os.path.join(r, "workloads.jsonl"))
    for rec in wl:
        if rec.get("workload") == "checks":
            print("  vramroom_torch checks (%s): %d passed, %d failed"
                  % (rec["mode"], rec["passed"], rec["failed"]))
    print()

    print("Allocator: ns per malloc+free pair (device 0, stream 0, one process)")
    bench = None
    bp = os.path.join(r, "bench.json")
    if os.path.exists(bp):
        with open(bp) as f:
            bench = json.load(f)
    py = {rec["mode"]: rec.get("ns", {}) for rec in wl if rec.get("workload") == "python_pair_ns"}
    hdr = "  %-16s %13s %15s %10s %15s %15s" % (
        "case", "vramroom C", "torch C++", "torch/hr", "hr via Python", "torch via Python")
    print(hdr)
    sizes = {"single_512B": "512", "single_4KiB": "4096", "single_1MiB": str(1 << 20),
             "single_8MiB": str(8 << 20), "single_64MiB": str(64 << 20)}
    for c in (bench or {}).get("cases", []):
        t = c.get("torch_cpp_ns")
        ratio = c.get("torch_over_vramroom")
        k = sizes.get(c["case"])
        hpy = py.get("vramroom", {}).get(k) if k else None
        tpy = py.get("native", {}).get(k) if k else None
        print("  %-16s %13.1f %15s %10s %15s %15s" % (
            c["case"], c["vramroom_ns"], "-" if t is None else "%.1f" % t,
            "-" if ratio is None else "%.2fx" % ratio,
            "-" if hpy is None else "%.0f" % hpy, "-" if tpy is None else "%.0f" % tpy))
    if bench is None:
        print("  (no bench.json)")
    if bench is not None:
        print("  medians of %s repeats of %s pairs, the two allocators' repeats alternating;"
              " torch/hr is the median of the per-repeat ratios" % (bench.get("repeats"), bench.get("pairs")))
    print("  vramroom C: CachingAllocator<CudaDevice> from Rust; torch C++: c10 raw_alloc/raw_delete;")
    print("  'via Python': one ctypes vramroom_malloc/free or torch.cuda.caching_allocator_alloc/delete")
    print("  pair per Python loop iteration (includes the interpreter's call overhead).")
    print()

    print("PyTorch workloads: native allocator vs vramroom_torch (peak reserved, step time)")
    print("  %-22s %-20s %12s %12s %9s %10s %8s" % (
        "workload", "allocator", "peak alloc", "peak resv", "resv/nat", "step ms", "t/nat"))
    by = {}
    rounds = {}
    for rec in wl:
        if "peak_reserved" in rec or ("error" in rec and rec.get("workload") not in ("checks",)):
            modes = by.setdefault(rec["workload"], {})
            prev = modes.get(rec["mode"])
            if "step_ms" in rec:
                rounds.setdefault((rec["workload"], rec["mode"]), []).append(rec["step_ms"])
            # Each mode's best round: step-time noise only ever adds. Peaks are the same in
            # every round (the same allocations in the same order), so the larger is kept.
            if prev is None or "error" in prev:
                modes[rec["mode"]] = dict(rec)
            elif "step_ms" in rec:
                prev["step_ms"] = min(prev["step_ms"], rec["step_ms"])
                prev["peak_reserved"] = max(prev["peak_reserved"], rec["peak_reserved"])
                prev["peak_allocated"] = max(prev["peak_allocated"], rec["peak_allocated"])
    names = {"native": "native default", "native-expandable": "native expandable",
             "native-record": "native (recording)",
             "vramroom": "vramroom default", "vramroom-expandable": "vramroom expandable",
             "vramroom-recommended": "vramroom recommended"}
    for w, modes in by.items():
        if w == "python_pair_ns":
            continue
        nat = modes.get("native", {})
        for m in ["native", "native-expandable", "vramroom", "vramroom-expandable",
                  "vramroom-recommended"]:
            rec = modes.get(m)
            if rec is None:
                continue
            if "error" in rec:
                print("  %-22s %-20s ERROR %s" % (w, names[m], rec["error"][:80]))
                continue
            rr = (rec["peak_reserved"] / nat["peak_reserved"]) if nat.get("peak_reserved") else None
            tr = (rec["step_ms"] / nat["step_ms"]) if nat.get("step_ms") else None
            print("  %-22s %-20s %9.1f MiB %9.1f MiB %9s %10.2f %8s" % (
                w, names[m], rec["peak_allocated"] / MIB, rec["peak_reserved"] / MIB,
                "-" if rr is None else "%.3f" % rr, rec["step_ms"],
                "-" if tr is None else "%.3f" % tr))
    units = {rec["workload"]: rec.get("unit") for rec in wl if rec.get("unit")}
    for w, u in units.items():
        print("  step ms of %s: %s" % (w, u))
    multi = {k: v for k, v in rounds.items() if len(v) > 1}
    if multi:
        print("  step ms is the best of %d rounds (round 2 in reverse mode order, round 3 forward); every round:"
              % max(len(v) for v in multi.values()))
        for (w, m), v in multi.items():
            print("    %-22s %-20s %s" % (w, names.get(m, m), " ".join("%.2f" % x for x in v)))
    rec_path = os.path.join(r, "recommend.txt")
    if os.path.exists(rec_path):
        with open(rec_path) as f:
            for line in f:
                if line.startswith("recommended:"):
                    print("  " + line.strip() + " (vramroom replay --recommend on the native trace)")
    print()

    models = load_jsonl(os.path.join(r, "models.jsonl"))
    if models:
        print("Models on the GPU: Vramroom vs PyTorch eager (median ms of CUDA-event timings, peak memory)")
        print("  %-28s %9s %9s %7s %11s %11s %7s %11s" % (
            "case", "hr ms", "torch ms", "t/hr", "hr alloc", "torch alloc", "hr/t", "predicted"))
        for m in models:
            tms, ta = m.get("torch_ms"), m.get("torch_peak_allocated")
            print("  %-28s %9.3f %9s %7s %9.1f Mi %9s Mi %7s %9s Mi" % (
                m["case"], m["ms"], "-" if tms is None else "%.3f" % tms,
                "-" if tms is None else "%.2fx" % (tms / m["ms"]),
                m["peak_allocated"] / MIB, "-" if ta is None else "%.1f" % (ta / MIB),
                "-" if not ta else "%.3f" % (m["peak_allocated"] / ta),
                "-" if m.get("predicted_peak_allocated") is None
                else "%.1f" % (m["predicted_peak_allocated"] / MIB)))
        print("  t/hr above 1: Vramroom faster; hr/t below 1: Vramroom's peak smaller; predicted: the")
        print("  meta device's peak for the case (no GPU).")
        torch_only = [t for t in load_jsonl(os.path.join(r, "torch_models.jsonl"))
                      if "(sdpa)" in t.get("case", "") and "ms" in t]
        for t in torch_only:
            print("  torch reference %-30s %9.3f ms %9.1f MiB" % (t["case"], t["ms"],
                                                                  t["peak_allocated"] / MIB))


if __name__ == "__main__":
    main()
