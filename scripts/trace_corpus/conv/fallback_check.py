"""How the tracer does on real programs whose convs the table did not hold: each device run's
harvested convs (conv/convs_runNN.json) are taken out of the table again, the run's programs
traced with the nearest-neighbour workspaces (convnn.py) and with the fixed ratio used before
it, and both compared with the real runs.

    PYTHONPATH=python python scripts/trace_corpus/conv/fallback_check.py OUT_DIR [--jobs 2]

Writes OUT_DIR/report.md (a row per program and config). The exclusion works through
sitecustomize.py in OUT_DIR/site, on PYTHONPATH for the traced programs only."""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.dirname(HERE)
# device run: (its convs, its real recording)
RUNS = {"33": ("convs_run33.json", "real32"), "34": ("convs_run34.json", "real32"),
        "36": ("convs_run36.json", "real35"), "39": ("convs_run39.json", "real39"),
        "40": ("convs_run40.json", "real40"), "41": ("convs_run41.json", "real41"),
        "45": ("convs_run45.json", "real45")}

SITE = '''
import json, os
_ex = os.environ.get("VRAMROOM_CHECK_EXCLUDE")
if _ex:
    import vramroom.trace.hidden as _h
    from vramroom.trace import convnn as _nn
    _drop = set()
    for _p in _ex.split(os.pathsep):
        for c in json.load(open(_p)):
            _drop.add((tuple(c["input"]), tuple(c["weight"]), bool(c["bias"]), tuple(c["stride"]),
                       tuple(c["padding"]), tuple(c["dilation"]), bool(c["transposed"]),
                       tuple(c["output_padding"]), int(c["groups"])))
    _orig = _h._conv_events
    def _conv_events(name):
        return {k: v for k, v in _orig(name).items() if k[1:10] not in _drop}
    _h._conv_events = _conv_events
    if os.environ.get("VRAMROOM_CHECK_FIXED"):
        _nn.Neighbours.workspace = lambda self, *a, **k: None
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    site = os.path.join(a.out, "site")
    os.makedirs(site, exist_ok=True)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(SITE)
    by_real = {}
    for run, (convs, real) in RUNS.items():
        p = os.path.join(HERE, convs)
        progs = sorted({m.split("@")[0].replace(".py", "") for c in json.load(open(p))
                        for m in c["models"]})
        e = by_real.setdefault(real, [set(), set()])
        e[0].add(p)
        e[1].update(progs)
    rows = []
    for real, (convs, progs) in sorted(by_real.items()):
        for mode in ("nearest", "fixed"):
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join([site, env.get("PYTHONPATH", "")])
            env["VRAMROOM_CHECK_EXCLUDE"] = os.pathsep.join(sorted(convs))
            if mode == "fixed":
                env["VRAMROOM_CHECK_FIXED"] = "1"
            traced = os.path.join(a.out, real, mode)
            subprocess.run([sys.executable, os.path.join(CORPUS, "trace_all.py"), "--out", traced,
                            "--gpu", "h100", "--jobs", str(a.jobs), "--only"] + sorted(progs),
                           env=env, check=True, stdout=subprocess.DEVNULL)
            cmp_out = os.path.join(a.out, real, mode + "-cmp")
            subprocess.run([sys.executable, os.path.join(CORPUS, "compare.py"), "--real",
                            os.path.join(CORPUS, real), "--traced", traced, "--out", cmp_out,
                            "--jobs", str(a.jobs), "--no-real-replay"] +
                           (["--bin", os.environ["VRAMROOM_BIN"]] if "VRAMROOM_BIN" in os.environ
                            else []), check=True, stdout=subprocess.DEVNULL)
            for line in open(os.path.join(cmp_out, "results.jsonl")):
                r = json.loads(line)
                if r.get("kind") == "peak" and r["program"] in progs:
                    rows.append((r["program"], r["conf"], mode, r))
    md = ["| program | config | fallback | alloc err | reserved err |", "|---|---|---|---:|---:|"]
    for prog, conf, mode, r in sorted(rows, key=lambda x: (x[0], x[1], x[2])):
        fmt = lambda v: "-" if v is None else "%+.2f%%" % (100 * v)
        md.append("| %s | %s | %s | %s | %s |" % (prog, conf, mode,
                                                   fmt(r.get("rel_err_allocated")),
                                                   fmt(r.get("rel_err_reserved"))))
    for mode in ("nearest", "fixed"):
        rs = [r for _, _, m, r in rows if m == mode]
        md.append("")
        md.append("%s: %d of %d rows within 1%% allocated and 2%% reserved, %d within 2%%/2%%" % (
            mode, sum(bool(r.get("pass_1pct")) for r in rs), len(rs),
            sum(bool(r.get("pass_2pct")) for r in rs)))
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
