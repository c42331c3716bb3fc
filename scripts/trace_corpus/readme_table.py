"""README's tracer accuracy tables, generated from the committed comparison files.

    python3 scripts/trace_corpus/readme_table.py --write README.md   # regenerate
    python3 scripts/trace_corpus/readme_table.py --check README.md   # exit 1 if they differ

The hidden allocations' table sits between `<!-- hidden-table: PATH -->` and
`<!-- /hidden-table -->`, PATH the tracer's own table (python/vramroom/trace/cuda_hidden.json):
the README quotes what the code applies. Each accuracy table sits between
`<!-- trace-table: PATH -->` and `<!-- /trace-table -->`, PATH the results file it is made from (relative to the repository root): the rows of
scripts/trace_corpus/compare.py (the corpus recorded for this tracer, `results.jsonl`) or of
compare_existing.py (the project's older H200 recordings). The ranks table sits between
`<!-- ranks-table: A.jsonl,B.jsonl -->` and `<!-- /ranks-table -->`: ranks_compare.py's rows
(each rank traced on fake CUDA against the same rank run on one real GPU), a later file's
row replacing an earlier one's for the same program, world size and rank when it ran. The
pass mark is the issue's:
peak allocated within 1% and peak reserved within 2% of the real GPU run. --check exits 3
(a skip, with the reason) when a marker's file is not there.
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import readme_blocks  # noqa: E402  (the block engine both README table scripts use)
MIB = 1 << 20


def rows_of(path):
    out = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if "workload" in r:  # compare_existing.py
                why = None if r.get("status") == "ok" else "%s (%s)" % (r.get("op") or r.get("status"), r.get("status"))
                out.append(dict(program=r["workload"], conf=r.get("conf", "all"), error=why,
                                ra=r.get("real_alloc"), rv=r.get("real_reserved"), ta=r.get("traced_alloc"),
                                tv=r.get("traced_reserved"), ts=r.get("trace_s"), rs=r.get("real_s"),
                                device="NVIDIA H200", commit=r.get("commit")))
            elif r.get("kind") == "peak":  # compare.py
                out.append(dict(program=r["program"], conf=r["conf"], error=r.get("traced_error"),
                                ra=r.get("real_peak_allocated"), rv=r.get("real_peak_reserved"),
                                ta=r.get("traced_peak_allocated"), tv=r.get("traced_peak_reserved"),
                                ts=r.get("trace_s"), rs=r.get("real_wall_s"), device=r.get("device"),
                                commit=r.get("commit")))
    return out


def sweep_line(path):
    """compare.py's capacity rows: the real run under a capacity limit, OOM or not, against
    the traced snapshot replayed at exactly that limit."""
    caps = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("kind") == "capacity" and r.get("agree") is not None:
                caps.append(r)
    if not caps:
        return ""
    bad = sorted("%s at %.0f MiB (real %s, traced %s)" % (
        r["program"], r["capacity_bytes"] / MIB, "OOM" if r["real_oom"] else "ok",
        "OOM" if r["traced_oom"] else "ok") for r in caps if not r["agree"])
    own = sum(1 for r in caps if not r["agree"] and r.get("replay_real_agree") is False)
    return (" Capacity sweep (each program at 0.8, 0.95, 1.0, 1.0 + 2 MiB and 1.1 x its real "
            "peak reserved): the traced prediction gives the real run's answer, OOM or not, in "
            "%d of %d runs%s%s." % (
                len(caps) - len(bad), len(caps), ("; not in " + ", ".join(bad)) if bad else "",
                (" (in %d of these the real snapshot, replayed at that capacity, misses too: the "
                 "allocator's behaviour at the limit, not the trace)" % own) if own else ""))


def err(t, r):
    return None if t is None or not r else (t - r) / r


def table(path):
    rows = rows_of(os.path.join(ROOT, path))
    L = []
    n = ok = 0
    body = []
    for r in rows:
        ea, ev = err(r["ta"], r["ra"]), err(r["tv"], r["rv"])
        if ea is None or ev is None:
            why = (r["error"] or "no traced result").splitlines()[0][:90].replace("|", "/")
            body.append("| %s | %s | %s | – | – | %s | – | – | refused: %s |" % (
                r["program"], r["conf"], fm(r["ra"]), fm(r["rv"]), why))
            continue
        n += 1
        good = abs(ea) <= 0.01 and abs(ev) <= 0.02
        ok += good
        body.append("| %s | %s | %s | %s | %+.2f%% | %s | %s | %+.2f%% | %s |" % (
            r["program"], r["conf"], fm(r["ra"]), fm(r["ta"]), 100 * ea, fm(r["rv"]), fm(r["tv"]),
            100 * ev, "yes" if good else "**no**"))
    dev = next((r["device"] for r in rows if r.get("device")), "?")
    L.append("From `%s` (real runs on %s): %d of %d traced program × config rows within 1%% "
             "allocated and 2%% reserved; %d rows refused by the tracer (an op it names)."
             % (path, dev, ok, n, len(rows) - n) + sweep_line(os.path.join(ROOT, path)))
    L.append("")
    L.append("| program | config | real alloc MiB | traced alloc MiB | err | real reserved MiB | traced reserved MiB | err | within |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    L.extend(body)
    return "\n".join(L) + "\n"


def hidden(path):
    t = json.load(open(os.path.join(ROOT, path)))
    L = ["From `%s` (PyTorch %s), applied by `vramroom.trace`:" % (path, t["pytorch"]), "",
         "| arch | cuBLAS workspace per (thread, stream) | cuBLASLt | cuDNN attention fwd | SDPA tries cuDNN first | conv workspaces | CUDA context (outside the allocator) | source |",
         "|---|---|---|---|---|---|---|---|"]
    for arch, a in t["archs"].items():
        tables = [t for t in (a.get("conv_events_table"), a.get("conv_workspace_table")) if t]
        conv = ("measured: %s; else ratios" % ", then ".join("`%s`" % t for t in tables)) if tables else "ratios"
        L.append("| %s | %d B | %d B | %d B | %s | %s | %d MiB | %s |" % (
            arch, a["cublas_handle_workspace"], a["cublaslt_workspace"], a["cudnn_attention_fwd_workspace"],
            "yes" if a["sdpa_cudnn_first"] else "no", conv, a["cuda_context_bytes"] >> 20,
            a["source"].replace("|", "/")))
    L.append("")
    for k, v in t["rules"].items():
        L.append("- **%s**: %s" % (k, v))
    return "\n".join(L) + "\n"


def fm(b):
    return "–" if b is None else "%.1f" % (b / MIB)


def ranks(paths):
    """The per-rank table from ranks_compare.py's files, and its count line."""
    by = {}
    for path in paths.split(","):
        with open(os.path.join(ROOT, path)) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        for r in rows:
            k = (r["program"], r["world_size"], r["rank"])
            if k not in by or not r.get("real_error"):
                by[k] = r
    L = ["| program | world size | rank | real peak allocated MiB | traced | real peak reserved MiB | traced | within 1%/2% |",
         "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for k in sorted(by):
        r = by[k]
        L.append("| %s | %d | %d | %s | %s | %s | %s | %s |" % (
            k[0], k[1], k[2], fm(r.get("real_peak_allocated")), fm(r.get("traced_peak_allocated")),
            fm(r.get("real_peak_reserved")), fm(r.get("traced_peak_reserved")),
            {True: "yes", False: "**no**", None: "not run"}[r.get("pass")]))
    ok = [r for r in by.values() if r.get("pass") is not None]
    L.append("")
    L.append("%d of %d ranks within 1%% on peak allocated and 2%% on peak reserved." % (
        sum(1 for r in ok if r["pass"]), len(ok)))
    return "\n".join(L) + "\n"


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("--write", "--check"):
        sys.exit(__doc__)
    return readme_blocks.main(
        sys.argv[1], sys.argv[2], {"trace-table": table, "hidden-table": hidden, "ranks-table": ranks},
        "tracer tables", "python3 scripts/trace_corpus/readme_table.py --write README.md", 1)


if __name__ == "__main__":
    sys.exit(main())
