"""vramroom.trace.fft against device runs 45 and 46: every cuFFT transform measured on an H100
(scripts/trace_corpus/fft/runs/fft-h100-run4{5,6}.json: 9,894 calls of _fft_r2c, _fft_c2r and
_fft_c2c over 1-d, 2-d, 3-d and 4-d signals, strided, two-sided, half precision, stft frames,
audio lengths) replayed through the port with the committed work-area table, allocation for
allocation."""

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the port computes layouts on meta tensors")

RUNS = [Path(__file__).resolve().parents[2] / "scripts" / "trace_corpus" / "fft" / "runs" /
        ("fft-h100-run%d.json" % n) for n in (45, 46)]


def _rows():
    if not all(r.exists() for r in RUNS):
        pytest.skip("device runs 45 and 46's measurements are not in this checkout")
    return [row for r in RUNS for row in json.loads(r.read_text())["rows"]]


def _call(r):
    dt = getattr(torch, r["dtype"].split(".")[-1])
    x = torch.empty_strided(r["in_shape"], r["in_strides"], dtype=dt, device="meta")
    third = {"r2c": "onesided", "c2r": "lastdim", "c2c": "forward"}[r["op"]]
    return x, (r["dim"], 0, r[third])


def test_every_measured_transform_replays_exactly_with_the_table():
    from vramroom.trace import fft

    t = fft.table("fft_sm90.json")

    def look(kind, value, signal, batch, layout):
        return fft.work_area(t[(kind, str(value).replace("torch.", ""), tuple(signal), layout)],
                             batch)
    rows = _rows()
    bad = [r for r in rows if fft.tokens(r["op"], *_call(r), look) != r["tokens"]]
    assert not bad and len(rows) == 9894, [(r["op"], r["in_shape"], r["dim"]) for r in bad[:5]]


def test_between_measured_batches_the_work_area_is_on_the_line():
    from vramroom.trace.fft import work_area

    pts = [(1, 0), (4, 0), (8, 800), (16, 1600)]
    assert work_area(pts, 4) == 0 and work_area(pts, 2) == 0
    assert work_area(pts, 12) == 1200
    assert work_area(pts, 32) == 3200  # past the largest: scaled
