"""vramroom.trace's cuDNN RNN sizes against device run 41's measurements (rnn/measure_rnn.py
on an H100, scripts/trace_corpus/rnn/runs) and device run 42's answers from cuDNN itself
(rnn/query_ws.py): the reserve-space formula for every measured training forward and every
swept shape, and the workspace lookup (exact points, and the line through a shape's points)
for every measured point. Pure data: needs torch only for dtypes."""

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="needs PyTorch for dtypes")

RUN = Path(__file__).resolve().parents[2] / "scripts" / "trace_corpus" / "rnn" / "runs" / \
    "rnn-h100-run41.json"
GATES = {"RNN_RELU": 0, "RNN_TANH": 1, "LSTM": 2, "GRU": 3}


def _cfg(c, e):
    rows = sum(e["lengths"]) if c["packed"] else c["N"] * c["T"]
    return dict(mode=GATES[c["mode"]], gates={0: 1, 1: 1, 2: 4, 3: 3}[GATES[c["mode"]]],
                I=c["I"], H=c["H"], P=c["P"], L=c["L"], D=2 if c["bi"] else 1, N=c["N"],
                T=max(e["lengths"]) if c["packed"] else c["T"], rows=rows,
                packed=c["packed"], drop=c["dp"] > 0, dtype=getattr(torch, c["dtype"]))


def _entries():
    if not RUN.exists():
        pytest.skip("device run 41's measurements are not in this checkout")
    return [e for e in json.loads(RUN.read_text())["entries"]
            if "error" not in e and not e["config"]["amp"]]


def test_the_reserve_formula_matches_the_measured_training_forwards():
    from vramroom.trace.rnn import reserve_bytes

    ok, off = 0, []
    for e in _entries():
        c = e["config"]
        fwd = [t for n, t in e["phases"]["train"] if n.startswith("_cudnn_rnn.")][0]
        ts = [i for i, (k, _) in enumerate(fwd) if k == "t"]
        measured = fwd[ts[-1] + 1][1]
        pred = reserve_bytes(_cfg(c, e), c["dp"])
        if pred == measured:
            ok += 1
        else:
            off.append((c, measured, pred))
    assert not off and ok >= 714, off[:3]


def _cudnn_sweeps():
    """Device run 42's swept rows (cuDNN's own answers, rnn/query_ws.py), each with the
    tracer's config for it."""
    import lzma

    path = RUN.parent / "cudnn-rnn-ws-h100-run42.json.xz"
    if not path.exists():
        pytest.skip("device run 42's cuDNN answers are not in this checkout")
    with lzma.open(path, "rt") as f:
        rows = json.load(f)["sweeps"]
    for r in rows:
        mode, dt, I, H, L, D, P, N, T, packed, drop, nrows = r[:12]
        yield r, dict(mode=GATES[mode], dtype=getattr(torch, dt), I=I, H=H, L=L, D=D, P=P, N=N,
                      T=T, rows=nrows, packed=bool(packed), drop=bool(drop))


def test_the_reserve_formula_matches_cudnns_own_answers():
    # device run 42: cudnnGetRNNTempSpaceSizes over ctypes (rnn/query_ws.py, which matched all
    # of run 41's measurements), one dimension swept at a time over 310,224 shapes: modes,
    # dtypes, hidden 1..1100, input 1..1100, batch and length 1..520, layers and directions,
    # dropout
    from vramroom.trace.rnn import reserve_bytes

    n, off = 0, []
    for r, c in _cudnn_sweeps():
        n += 1
        if reserve_bytes(c, 0.2 if c["drop"] else 0) != r[15]:
            off.append(r)
    assert n > 300000 and not off, off[:3]


def test_every_measured_workspace_is_looked_up_exactly():
    from vramroom.trace import rnn
    from vramroom.trace.hidden import load_table

    row = load_table()["archs"]["sm90"]

    class Rec:
        class hidden:
            stats = {}

    n = 0
    for e in _entries():
        c = e["config"]
        cfg = _cfg(c, e)
        for kind, phase, name in (("train", "train", "_cudnn_rnn."),
                                  ("eval", "eval", "_cudnn_rnn."),
                                  ("backward", "train", "_cudnn_rnn_backward")):
            toks = [t for nm, t in e["phases"][phase] if nm.startswith(name)][0]
            ts = [i for i, (k, _) in enumerate(toks) if k == "t"]
            first = next(toks[ts[v]][1] for k, v in toks if k == "f")
            assert rnn.workspace(cfg, kind, Rec, row) == first, (c, kind)
            n += 1
    assert n >= 3 * 700


def test_a_swept_shape_is_exact_between_its_measured_points():
    # LSTM(64, 128) fp32: device run 41 swept batch and length; a batch and length it did not
    # measure lie on the line through them (ws = a + b x rows + n x batch + 32 ceil(batch/4))
    from vramroom.trace import rnn
    from vramroom.trace.hidden import load_table

    row = load_table()["archs"]["sm90"]

    class Rec:
        class hidden:
            stats = {}

    c = dict(mode=2, gates=4, I=64, H=128, P=0, L=1, D=1, N=16, T=50, rows=800, packed=False,
             drop=False, dtype=torch.float32)
    measured = {(16, 50): 17654144, (1, 50): 9336608, (33, 77): None}
    assert rnn.workspace(c, "train", Rec, row) == measured[(16, 50)]
    c2 = dict(c, N=1, rows=50)
    assert rnn.workspace(c2, "train", Rec, row) == measured[(1, 50)]
    # 8782080 + 11008 rows + 4096 batch + 32 ceil(batch / 4): 6 x 40 was not measured
    c3 = dict(c, N=6, T=40, rows=240)
    assert rnn.workspace(c3, "train", Rec, row) == 8782080 + 11008 * 240 + 4096 * 6 + 64


def test_measured_rnn_steps_allocate_in_the_gpus_order(tmp_path):
    # One measured config per feature (no bias, dropout, packed, autocast, bfloat16,
    # projection, two bidirectional layers, GRU, ReLU RNN), run again on fake CUDA by
    # rnn/check_traced.py (all 725 take about 25 minutes on two cores; see its report)
    import subprocess
    import sys

    ents = _entries()
    want = [lambda c: not c["bias"], lambda c: c["dp"] > 0, lambda c: c["packed"],
            lambda c: c["amp"], lambda c: c["dtype"] == "bfloat16", lambda c: c["P"] > 0,
            lambda c: c["bi"] and c["L"] == 2, lambda c: c["mode"] == "GRU",
            lambda c: c["mode"] == "RNN_RELU"]
    doc = json.loads(RUN.read_text())
    every = [e for e in doc["entries"] if "error" not in e]
    pick = [next(e for e in every if f(e["config"])) for f in want]
    run = tmp_path / "run.json"
    run.write_text(json.dumps(dict(doc, entries=pick)))
    import os

    import vramroom

    script = RUN.parents[1] / "check_traced.py"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(vramroom.__file__).resolve().parents[1])] +
                                        [v for v in [env.get("PYTHONPATH")] if v])
    p = subprocess.run([sys.executable, str(script), str(run)], capture_output=True, text=True,
                       timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "identical in **%d**" % len(pick) in p.stdout, p.stdout
    assert len(ents) >= 700


def test_the_segments_table_matches_cudnns_own_answers():
    # device run 43's segments (cuDNN asked at batches 1 and 2, every length up to 512) against
    # device run 42's independent answers for every swept shape the table covers: each
    # lookup it answers is exact (a float16 batch that switches cuDNN to its persistent
    # kernel is not answered)
    from vramroom.trace import rnn
    from vramroom.trace.gpus import get_gpu
    from vramroom.trace.hidden import load_table

    row, gpu = load_table()["archs"]["sm90"], get_gpu("h100")
    n, off = 0, []
    for r, c in _cudnn_sweeps():
        for kind, col in (("train", 14), ("eval", 16), ("backward", 17)):
            got = rnn._segments(row, dict(c, drop=False) if kind == "eval" else c, kind, gpu)
            if got is not None:
                n += 1
                if got != r[col]:
                    off.append((r[:12], kind, r[col], got))
    assert n > 20000 and not off, (n, off[:3])
