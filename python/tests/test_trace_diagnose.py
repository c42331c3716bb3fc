"""The seed's mistakes found in a traced program (#30 Deliver 3): each planted mistake gets
its finding at the right file:line of the program and no other critical finding; each clean
twin gets no critical finding.

Each program is a tiny MLP written below, traced by `python -m vramroom.trace --json` in a
fresh interpreter (the tracer patches torch for the process), whose report carries the
findings of `vramroom replay --evidence` (the load tester's diagnosis engine). Needs a CUDA
build of PyTorch 2.11 (no GPU) and the vramroom binary; skipped without them.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="vramroom.trace tests need PyTorch (CPU-only machine is fine)")
if not torch.__version__.startswith("2.11") or torch.version.cuda is None:
    pytest.skip("vramroom.trace needs a CUDA build of PyTorch 2.11.x (no GPU needed)", allow_module_level=True)


def _binary():
    env = os.environ.get("VRAMROOM_BIN")
    if env and os.path.exists(env):
        return env
    p = Path(__file__).resolve().parents[2] / "target" / "release" / "vramroom"
    return str(p) if p.exists() else shutil.which("vramroom")


BIN = _binary()
if not BIN:
    pytest.skip("the vramroom binary is needed (cargo build --release -p vramroom)", allow_module_level=True)

HEAD = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 4096), nn.GELU(),
                      nn.Linear(4096, 1000)).cuda()
"""

# Each program: its body after HEAD, and the line (a marker comment) its finding must name.
PROGRAMS = {
    "mistake_a": ("autograd_in_inference", """\
model.eval()
outs = []
for step in range(4):
    x = torch.randn(4096, 1024, device="cuda")
    out = model(x)  # FIND
    outs.append(out.argmax(1))
"""),
    "clean_a": (None, """\
model.eval()
outs = []
with torch.no_grad():
    for step in range(4):
        x = torch.randn(4096, 1024, device="cuda")
        out = model(x)
        outs.append(out.argmax(1))
"""),
    "mistake_b": ("graph_accumulated", """\
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    total = 0
    for micro in range(4):
        x = torch.randn(4096, 1024, device="cuda")
        y = torch.randint(0, 1000, (4096,), device="cuda")
        loss = F.cross_entropy(model(x), y)
        total = total + loss / 4  # FIND
    total.backward()
    opt.step()
    opt.zero_grad()
"""),
    "clean_b": (None, """\
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    for micro in range(4):
        x = torch.randn(4096, 1024, device="cuda")
        y = torch.randint(0, 1000, (4096,), device="cuda")
        loss = F.cross_entropy(model(x), y)
        (loss / 4).backward()
    opt.step()
    opt.zero_grad()
"""),
    "mistake_c": ("leak", """\
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
history = []
for step in range(5):
    x = torch.randn(4096, 1024, device="cuda")
    y = torch.randint(0, 1000, (4096,), device="cuda")
    h = model[:4](x)  # FIND
    loss = F.cross_entropy(model[4](h), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    history.append(h)
"""),
    "clean_c": (None, """\
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
history = []
for step in range(5):
    x = torch.randn(4096, 1024, device="cuda")
    y = torch.randint(0, 1000, (4096,), device="cuda")
    h = model[:4](x)
    loss = F.cross_entropy(model[4](h), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    history.append(loss.detach())
"""),
    # Training at a large batch, then evaluation at a small one with the training's cache
    # still reserved (no empty_cache() between): cache_held, info, at the evaluation's line.
    "cache_d": ("cache_held", """\
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(2):
    x = torch.randn(16384, 1024, device="cuda")
    y = torch.randint(0, 1000, (16384,), device="cuda")
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
del x, y, loss
preds = []
with torch.no_grad():
    for step in range(3):
        xe = torch.randn(256, 1024, device="cuda")
        preds.append(model(xe).argmax(1))  # FIND
"""),
}


def trace_report(tmp_path, name):
    _, body = PROGRAMS[name]
    src = HEAD + body
    prog = tmp_path / ("%s.py" % name)
    prog.write_text(src)
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    import vramroom

    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(vramroom.__file__).resolve().parents[1])] + [p for p in [env.get("PYTHONPATH")] if p])
    env["VRAMROOM_BIN"] = BIN
    snap = tmp_path / ("%s.pickle" % name)
    r = subprocess.run([sys.executable, "-m", "vramroom.trace", "--json", "--snapshot-out", str(snap),
                        "--", str(prog)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout[r.stdout.index("{"):])
    marked = [i + 1 for i, l in enumerate(src.splitlines()) if l.endswith("# FIND")]
    return report, prog, marked, snap


@pytest.mark.parametrize("name", sorted(n for n in PROGRAMS if PROGRAMS[n][0] != "cache_held"))
def test_the_planted_mistake_is_found_at_its_line(tmp_path, name):
    want, _ = PROGRAMS[name]
    report, prog, marked, snap = trace_report(tmp_path, name)
    findings = report["findings"]
    critical = [f for f in findings if f["severity"] == "critical"]
    if want is None:
        assert critical == [], findings
        return
    assert [f["id"] for f in critical] == [want], findings
    f = critical[0]
    assert os.path.samefile(f["file"], prog), f
    assert f["line"] == marked[0], (f, marked)
    assert f["location"] == "%s:%d" % (f["file"], f["line"])
    assert "%s:%d" % (f["file"], f["line"]) in f["evidence"], f
    assert f["predicted_saving_bytes"] > 0
    # The evidence is written beside the snapshot, and `vramroom replay --evidence` reads it.
    ev = snap.with_suffix(".evidence.json")
    assert ev.exists()
    r = subprocess.run([BIN, "replay", str(snap), "--evidence", str(ev), "--capacity", "80GiB"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "Findings:" in r.stdout and ("%s at %s" % (want, f["location"])) in r.stdout, r.stdout


def test_evidence_categories_of_a_training_step():
    """Trace.evidence() in process: parameters, gradients and optimizer state by category,
    backward calls with the user's line, boundaries at optimizer steps."""
    code = textwrap.dedent("""
        import json, torch, vramroom.trace as vt
        import torch.nn.functional as F
        with vt.trace(gpu="h100") as t:
            model = torch.nn.Linear(1024, 1024).cuda()
            opt = torch.optim.AdamW(model.parameters())
            for _ in range(3):
                loss = model(torch.randn(64, 1024, device="cuda")).square().mean()
                loss.backward()  # BACKWARD
                opt.step()
        print(json.dumps(t.evidence()))
    """)
    env = dict(os.environ)
    import vramroom

    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(vramroom.__file__).resolve().parents[1])] + [p for p in [env.get("PYTHONPATH")] if p])
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    ev = json.loads(r.stdout.strip().splitlines()[-1])
    w = 1024 * 1024 * 4 + 1024 * 4
    last = ev["boundaries"][-1]["categories"]
    assert ev["boundary_kind"] == "optimizer_step" and len(ev["boundaries"]) == 3
    assert last["parameter"] == w and last["gradient"] == w and last["optimizer_state"] >= 2 * w
    assert len(ev["backwards"]) == 3
    line = [i + 1 for i, l in enumerate(code.splitlines()) if l.endswith("# BACKWARD")][0]
    assert ev["sites"][ev["backwards"][0]["site"]]["line"] == line
    assert all(b["saved_bytes"] > 0 and b["passes"][0]["count"] == 1 for b in ev["backwards"])


def test_a_later_phase_under_the_training_cache_is_cache_held(tmp_path):
    report, prog, marked, _ = trace_report(tmp_path, "cache_d")
    findings = report["findings"]
    assert [f["severity"] for f in findings if f["severity"] == "critical"] == [], findings
    held = [f for f in findings if f["id"] == "cache_held"]
    assert held and held[0]["severity"] == "info", findings
    assert held[0]["line"] == marked[0] and os.path.samefile(held[0]["file"], prog), held
    assert held[0]["numbers"]["empty_cache_returns_bytes"] > 0, held
