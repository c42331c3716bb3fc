"""Compares the fake-CUDA tracer against the GPU ground truth of record_real.py.

    python compare.py --real REAL_DIR --traced TRACED_DIR [--out OUT_DIR]
                      [--bin target/release/vramroom] [--jobs N]

REAL_DIR is record_real.py's output: results.jsonl, and the real snapshots in REAL_DIR/snaps/
or packed in REAL_DIR/snaps.tar.xz (unpacked to REAL_DIR/snaps/ when needed; optional).
TRACED_DIR holds the tracer's snapshots, PROG__CONF.pickle (CONF "default", "expandable"),
and optionally times.json ({"PROG": seconds} or {"PROG__CONF": seconds}; a value may also be an
object with "seconds", "trace_s" or "wall_s") and failures.json ({"PROG": message}). A program with only PROG__default.pickle is
replayed under expandable_segments from that snapshot (the trace does not depend on the config;
marked "from default").

For every program and config recorded for real, `vramroom replay SNAP --json --alloc-conf C
--capacity TOTAL` (TOTAL: the real GPU's memory) of the traced snapshot gives the predicted peak
allocated / reserved, compared with memory_stats() of the real run: relative error, and pass
marks at 1% and 2%. The real snapshot is replayed too (column "replay(real)"), which separates the
allocator's error from the tracer's. For each capacity of the real sweep, the traced default
snapshot is replayed at exactly that capacity (the bytes the real run was limited to) and its OOM
(num_ooms > 0) is compared with the real run's.

Writes OUT_DIR/results.jsonl (one row per comparison) and OUT_DIR/report.md, and prints the report.
"""
import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import tarfile

CONF = {"default": "default", "expandable": "expandable_segments:True"}
SWEEP_ORDER = ["cap0.80", "cap0.95", "cap1.00", "cap1.00p2m", "cap1.10"]
MIB = 1 << 20


def load_rows(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return rows


def real_snaps_dir(real):
    d = os.path.join(real, "snaps")
    if os.path.isdir(d):
        return d
    arc = os.path.join(real, "snaps.tar.xz")
    if os.path.exists(arc):
        with tarfile.open(arc) as t:
            members = [m for m in t.getmembers() if m.name.startswith("snaps/") and m.isfile()]
            t.extractall(real, members=members)
        return d
    return None


def load_times(traced):
    p = os.path.join(traced, "times.json")
    if not os.path.exists(p):
        return {}
    with open(p) as f:
        t = json.load(f)
    out = {}
    for k, v in t.items():
        if isinstance(v, dict):
            v = next((v[k] for k in ("seconds", "trace_s", "wall_s") if v.get(k) is not None), None)
        if isinstance(v, (int, float)):
            out[k] = float(v)
    return out


def replay(binary, snap, alloc_conf, capacity):
    cmd = [binary, "replay", snap, "--json", "--alloc-conf", alloc_conf]
    if capacity:
        cmd += ["--capacity", str(int(capacity))]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout).strip()[-500:]}
    try:
        d = json.loads(r.stdout)
    except json.JSONDecodeError as e:
        return {"error": f"bad json: {e}"}
    d = d[0] if isinstance(d, list) else d
    return {
        "peak_allocated_bytes": d.get("peak_allocated_bytes"),
        "peak_reserved_bytes": d.get("peak_reserved_bytes"),
        "num_ooms": d.get("num_ooms"),
        "num_alloc_retries": d.get("num_alloc_retries"),
        # the program's OOM: a cuDNN conv whose workspace did not fit counts in num_ooms
        # but ran another plan (workspace_fallbacks), as the real run's num_ooms counts it
        "oom": d.get("oom") is not None,
        "workspace_fallbacks": d.get("workspace_fallbacks", 0),
        "capacity_bytes": d.get("capacity_bytes"),
    }


def rel(pred, real):
    if pred is None or not real:
        return None
    return (pred - real) / real


def pct(x):
    return "-" if x is None else f"{100 * x:+.2f}%"


def mib(n):
    return "-" if n is None else f"{n / MIB:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--real", required=True)
    ap.add_argument("--traced", required=True)
    ap.add_argument("--out", default="trace_compare")
    ap.add_argument("--bin", default="target/release/vramroom")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--no-real-replay", action="store_true", help="skip replaying the real snapshots")
    a = ap.parse_args()
    if not os.path.exists(a.bin):
        sys.exit(f"no vramroom binary at {a.bin} (cargo build --release -p vramroom, or --bin)")
    binary = os.path.abspath(a.bin)
    rows = load_rows(os.path.join(a.real, "results.jsonl"))
    snaps = None if a.no_real_replay else real_snaps_dir(a.real)
    times = load_times(a.traced)
    fp = os.path.join(a.traced, "failures.json")  # trace_all.py: {prog: the tracer's message}
    failures = json.load(open(fp)) if os.path.exists(fp) else {}
    os.makedirs(a.out, exist_ok=True)

    by = {}
    for r in rows:
        by.setdefault(r["program"], {})[r["conf"]] = r
    programs = sorted(by)

    def traced_snap(prog, conf):
        p = os.path.join(a.traced, f"{prog}__{conf}.pickle")
        if os.path.exists(p):
            return p, False
        p = os.path.join(a.traced, f"{prog}__default.pickle")
        return (p, True) if os.path.exists(p) else (None, False)

    jobs = []  # (key, snap, alloc_conf, capacity)
    plan = []
    for prog in programs:
        for conf in ("default", "expandable"):
            real = by[prog].get(conf)
            if not real or real.get("peak_reserved_bytes") is None:
                continue
            snap, fallback = traced_snap(prog, conf)
            total = real.get("total_memory")
            item = {"program": prog, "conf": conf, "kind": "peak", "real": real,
                    "traced_snapshot": snap, "from_default": fallback}
            if snap:
                item["tkey"] = ("t", prog, conf)
                jobs.append((item["tkey"], snap, CONF[conf], total))
            if snaps and real.get("snapshot"):
                rs = os.path.join(snaps, os.path.basename(real["snapshot"]))
                if os.path.exists(rs):
                    item["rkey"] = ("r", prog, conf)
                    jobs.append((item["rkey"], rs, CONF[conf], total))
            plan.append(item)
        for conf in SWEEP_ORDER + sorted(c for c in by[prog] if c.startswith("cap") and c not in SWEEP_ORDER):
            real = by[prog].get(conf)
            if not real or real.get("oom") is None or not real.get("capacity_bytes"):
                continue
            cap = real["capacity_bytes"]
            snap, _ = traced_snap(prog, "default")
            item = {"program": prog, "conf": conf, "kind": "capacity", "real": real, "traced_snapshot": snap}
            if snap:
                item["tkey"] = ("t", prog, conf)
                jobs.append((item["tkey"], snap, "default", cap))
            d = by[prog].get("default", {})
            if snaps and d.get("snapshot"):
                rs = os.path.join(snaps, os.path.basename(d["snapshot"]))
                if os.path.exists(rs):
                    item["rkey"] = ("r", prog, conf)
                    jobs.append((item["rkey"], rs, "default", cap))
            plan.append(item)

    print(f"{len(jobs)} replays, {a.jobs} at a time", file=sys.stderr, flush=True)
    res = {}
    with cf.ThreadPoolExecutor(a.jobs) as ex:
        futs = {ex.submit(replay, binary, s, c, cap): k for k, s, c, cap in jobs}
        for fu in cf.as_completed(futs):
            res[futs[fu]] = fu.result()

    out_rows = []
    for it in plan:
        real = it["real"]
        t = res.get(it.get("tkey"), {"error": "not traced: " + str(failures.get(it["program"], "no snapshot"))})
        rr = res.get(it.get("rkey"))
        row = {"program": it["program"], "conf": it["conf"], "kind": it["kind"],
               "traced_snapshot": it["traced_snapshot"], "traced_error": t.get("error"),
               "trace_s": times.get(f"{it['program']}__{it['conf']}", times.get(it["program"])),
               "real_error": real.get("error"), "real_wall_s": real.get("wall_s"),
               "device": real.get("device")}
        if it["kind"] == "peak":
            ra, rv = real.get("peak_allocated_bytes"), real.get("peak_reserved_bytes")
            ta, tv = t.get("peak_allocated_bytes"), t.get("peak_reserved_bytes")
            ea, ev = rel(ta, ra), rel(tv, rv)
            row.update({
                "from_default": it["from_default"], "real_oom": real.get("oom"),
                "real_peak_allocated": ra, "real_peak_reserved": rv,
                "traced_peak_allocated": ta, "traced_peak_reserved": tv,
                "rel_err_allocated": ea, "rel_err_reserved": ev,
                "pass_1pct": None if ea is None or ev is None else abs(ea) <= 0.01 and abs(ev) <= 0.01,
                "pass_2pct": None if ea is None or ev is None else abs(ea) <= 0.02 and abs(ev) <= 0.02,
                "traced_num_ooms": t.get("num_ooms"),
            })
            if rr:
                row.update({"replay_real_peak_allocated": rr.get("peak_allocated_bytes"),
                            "replay_real_peak_reserved": rr.get("peak_reserved_bytes"),
                            "replay_real_rel_err_reserved": rel(rr.get("peak_reserved_bytes"), rv),
                            "replay_real_error": rr.get("error")})
        else:
            row.update({"capacity_bytes": real["capacity_bytes"], "real_oom": real["oom"],
                        "traced_oom": t.get("oom"), "agree": None if t.get("oom") is None else t["oom"] == real["oom"]})
            if rr:
                row.update({"replay_real_oom": rr.get("oom"),
                            "replay_real_agree": None if rr.get("oom") is None else rr["oom"] == real["oom"]})
        out_rows.append(row)

    with open(os.path.join(a.out, "results.jsonl"), "w") as f:
        for r in out_rows:
            f.write(json.dumps(r) + "\n")

    md = report(out_rows, programs)
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write(md)
    print(md)


def report(out_rows, programs):
    L = []
    dev = next((r["device"] for r in out_rows if r.get("device")), "?")
    peaks = [r for r in out_rows if r["kind"] == "peak"]
    caps = [r for r in out_rows if r["kind"] == "capacity"]
    ok1 = sum(1 for r in peaks if r.get("pass_1pct"))
    ok2 = sum(1 for r in peaks if r.get("pass_2pct"))
    n = sum(1 for r in peaks if r.get("pass_1pct") is not None)
    agree = [r for r in caps if r.get("agree") is not None]
    L.append("# Fake-CUDA tracer vs real GPU\n")
    L.append(f"Real runs on {dev}. Peaks: traced snapshot replayed by `vramroom replay` vs "
             "`torch.cuda.memory_stats()` of the real run; error = (traced - real) / real; a pass needs "
             "both peak allocated and peak reserved within the bound. replay(real): the real snapshot "
             "replayed the same way (the allocator's own error).\n")
    L.append(f"- peaks within 1%: **{ok1}/{n}**, within 2%: **{ok2}/{n}** "
             f"(of {len(peaks)} program x config rows; {len(peaks) - n} without a traced result)")
    L.append(f"- capacity sweep OOM agreement: **{sum(1 for r in agree if r['agree'])}/{len(agree)}** "
             f"(of {len(caps)} swept runs)")
    rra = [r for r in caps if r.get("replay_real_agree") is not None]
    if rra:
        L.append(f"- capacity sweep, real snapshot replayed: {sum(1 for r in rra if r['replay_real_agree'])}/{len(rra)}")
    tt = [r["trace_s"] for r in peaks if r.get("trace_s") is not None and r["conf"] == "default"]
    if tt:
        L.append(f"- trace time: total {sum(tt):.1f}s, max {max(tt):.1f}s over {len(tt)} programs")
    L.append("")
    L.append("## Peaks\n")
    L.append("| program | conf | real alloc MiB | traced alloc MiB | err | real resv MiB | traced resv MiB | err "
             "| 1% | 2% | replay(real) resv err | trace s | real s |")
    L.append("|---|---|---:|---:|---:|---:|---:|---:|:-:|:-:|---:|---:|---:|")
    for r in peaks:
        mark = lambda v: "-" if v is None else ("✓" if v else "✗")  # noqa: E731
        note = []
        if r.get("from_default"):
            note.append("from default")
        if r.get("real_oom"):
            note.append("real OOM")
        if r.get("real_error"):
            note.append("real error")
        if r.get("traced_error"):
            note.append("traced: " + r["traced_error"][:60].replace("|", "/").replace("\n", " "))
        conf = r["conf"] + (f" ({', '.join(note)})" if note else "")
        ts = "-" if r.get("trace_s") is None else f"{r['trace_s']:.1f}"
        L.append(f"| {r['program']} | {conf} | {mib(r.get('real_peak_allocated'))} | {mib(r.get('traced_peak_allocated'))} "
                 f"| {pct(r.get('rel_err_allocated'))} | {mib(r.get('real_peak_reserved'))} | "
                 f"{mib(r.get('traced_peak_reserved'))} | {pct(r.get('rel_err_reserved'))} | {mark(r.get('pass_1pct'))} "
                 f"| {mark(r.get('pass_2pct'))} | {pct(r.get('replay_real_rel_err_reserved'))} | {ts} | "
                 f"{r.get('real_wall_s') if r.get('real_wall_s') is not None else '-'} |")
    L.append("")
    L.append("## Capacity sweep (default config)\n")
    L.append("Each cell: real / traced OOM at the capacity (R = real peak reserved), ✓ when they agree; "
             "[replay(real)] in brackets when it differs from the real run.\n")
    names = [c for c in SWEEP_ORDER if any(r["conf"] == c for r in caps)]
    L.append("| program | " + " | ".join(names) + " |")
    L.append("|---|" + "|".join(":-:" for _ in names) + "|")
    cell = {(r["program"], r["conf"]): r for r in caps}
    yn = lambda v: "?" if v is None else ("OOM" if v else "ok")  # noqa: E731
    for p in programs:
        if not any((p, c) in cell for c in names):
            continue
        cs = []
        for c in names:
            r = cell.get((p, c))
            if not r:
                cs.append("-")
                continue
            s = f"{yn(r['real_oom'])}/{yn(r.get('traced_oom'))} " + ("✓" if r.get("agree") else ("✗" if r.get("agree") is False else ""))
            if r.get("replay_real_agree") is False:
                s += f" [{yn(r.get('replay_real_oom'))}]"
            cs.append(s.strip())
        L.append(f"| {p} | " + " | ".join(cs) + " |")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    main()
