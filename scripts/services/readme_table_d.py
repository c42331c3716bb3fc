"""The README's corpus table (issue 32), generated from run d's results file.

    python3 scripts/services/readme_table_d.py RUN_D.jsonl            # print the table
    python3 scripts/services/readme_table_d.py --write README.md [RUN_D.jsonl]
    python3 scripts/services/readme_table_d.py --check README.md

The README holds the table between two markers; the first names the results file (a path
from the repository root), so the table and the file it came from are tied together:

    <!-- corpus-d-table: scripts/corpus-results/DIR/run_d.jsonl -->
    ...generated...
    <!-- /corpus-d-table -->

--write regenerates the table from that file (or from RUN_D.jsonl, which then becomes the
marker's path). --check exits 0 when the README's table is what the file gives, 1 when they
disagree (with a diff), and 3 with a reason when there is nothing to check yet (no marker,
or the results file is absent: before the GPU run). The HEADER beside the results file names
the commit and the card; the table's caption repeats them.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import collect_d  # noqa: E402
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import readme_blocks  # noqa: E402  (the block engine both README table scripts use)
SKIP = 3


def _v(x):
    return "—" if x is None else str(x)


def _yn(x):
    return {True: "yes", False: "**no**", None: "—"}[x]


def header_facts(results_path):
    """(commit, card) from the HEADER beside the results file."""
    commit, card = "?", "?"
    h = os.path.join(os.path.dirname(results_path), "HEADER")
    if os.path.exists(h):
        with open(h) as f:
            for line in f:
                if line.startswith("commit "):
                    commit = line.split(None, 1)[1].strip()
                elif line.startswith("GPU ") and card == "?":
                    card = line.split(":", 1)[1].split("(")[0].strip()
    return commit, card


def table(results_path, rel):
    recs = []
    with open(results_path) as f:
        for line in f:
            line = line.strip()
            if line:
                recs.append(json.loads(line))
    commit, card = header_facts(results_path)
    out = [
        "Run d (`scripts/services/gpu_run_d.sh`, commit `%s`, %s), from `%s`: each service "
        "under its own memory cap; predicted from one gentle run (`-c 1`), observed by three "
        "`--ramp-until-oom` ramps on fresh services; the what-if ramp restarts the service "
        "under the other allocator config. Steps: 1, 2, 4, 6, 8, 12, 16, 24, 32, 48, ..."
        % (commit, card, rel),
        "",
        "| service | cap GiB | step s | predicted | rests on (requests) | observed first OOM (3 ramps) "
        "| spread (steps) | within one step | what-if: config, predicted / observed | size cap (verified) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in recs:
        collect_d.judge(r)  # verdicts by the rule as it stands
        w = r.get("what_if_ramp") or {}
        cr = r.get("cap_ramp") or {}
        devs = r.get("devices") or [{}]
        cap = (devs[0] or {}).get("size_cap") or {}
        if cap.get("max_size"):
            capt = "%s %s at %s in flight (%s)" % (
                cap["max_size"], cap.get("unit"), cap.get("target_concurrency"),
                {True: "verified", False: "**not verified**", None: "not run"}[cr.get("verified")])
        else:
            capt = "none printed"
        firsts = r.get("observed_first_ooms") or []
        wif = "—"
        if w:
            wif = "%s: %s / %s (%s)" % (
                w.get("conf"), _v(w.get("predicted")), _v(w.get("first_oom")),
                {True: "within", False: "**off**", None: "—"}[w.get("within_one_step")])
        row = [
            r.get("service"), _v(r.get("cap_gib")), _v(r.get("step_s")),
            _v(r.get("predicted_first_oom")),
            "%s of %s" % (_v(r.get("prediction_requests")), _v(r.get("gentle_requests_sent"))),
            ", ".join(_v(x) for x in firsts) or "—", _v(r.get("spread_steps")),
            "%s (%s)" % (_yn(r.get("within_one_step_all")), r.get("within_one_step_count") or "0/0"),
            wif, capt,
        ]
        if r.get("error"):
            row[0] = "%s (error: %s)" % (row[0], str(r["error"])[:60].replace("|", "/"))
        out.append("| " + " | ".join(str(c).replace("|", "/") for c in row) + " |")
    return "\n".join(out)


def main(argv):
    if "--write" in argv or "--check" in argv:
        mode = "--write" if "--write" in argv else "--check"
        i = argv.index(mode)
        readme = argv[i + 1]
        rest = [a for j, a in enumerate(argv) if j not in (i, i + 1)]
        repoint = None
        if mode == "--write" and rest:  # RUN_D.jsonl becomes the marker's path
            rel = rest[0]
            repoint = {"corpus-d-table": os.path.relpath(rel, REPO) if os.path.isabs(rel) else rel}
        return readme_blocks.main(
            mode, readme,
            {"corpus-d-table": lambda rel: table(os.path.join(REPO, rel), rel) + "\n"},
            "corpus table", "python3 scripts/services/readme_table_d.py --write %s" % readme,
            SKIP, repoint)
    if not argv:
        print(__doc__)
        return 2
    print(table(argv[0], argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
