"""`import vramroom`: the Python API against the CLI, on the reference traces."""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

import vramroom
from conftest import REPO, run

MIB2 = 2 << 20


def cli_rows(cli, args):
    return json.loads(run([cli, "replay", "--json"] + args).stdout)


def same_row(api, cli_row):
    # The CLI adds the snapshot's path; everything else is the same object.
    cli_row = dict(cli_row)
    cli_row.pop("snapshot")
    assert api == cli_row


def test_replay_matches_the_cli_on_every_reference_trace(cli, traces):
    for t in traces:
        (row,) = cli_rows(cli, [str(t)])
        same_row(vramroom.replay(str(t)), row)
        conf = "expandable_segments:True"
        (row,) = cli_rows(cli, [str(t), "--alloc-conf", conf, "--capacity", "8GiB"])
        same_row(vramroom.replay(t, alloc_conf=conf, capacity="8GiB"), row)
        assert row["peak_reserved_bytes"] > 0


def test_replay_of_bytes_equals_replay_of_the_path(traces):
    t = traces[0]
    assert vramroom.replay(t.read_bytes()) == vramroom.replay(str(t))


def test_capacity_as_int_or_string(traces):
    t = traces[0]
    assert vramroom.replay(t, capacity=8 << 30) == vramroom.replay(t, capacity="8GiB")


def test_min_capacity_matches_the_cli_and_never_ooms(cli, traces):
    t = min(traces, key=lambda p: p.stat().st_size)
    n = vramroom.min_capacity(t)
    (row,) = cli_rows(cli, [str(t), "--min-capacity"])
    assert row["min_capacity_bytes"] == n
    assert vramroom.replay(t, min_capacity=True)["min_capacity_bytes"] == n
    fits = vramroom.replay(t, capacity=n)
    assert fits["num_ooms"] == 0 and fits["oom_event"] is None
    if n - MIB2 > fits["peak_allocated_bytes"]:
        assert vramroom.replay(t, capacity=n - MIB2)["oom_event"] is not None


def test_min_capacity_printed_by_the_cli_never_ooms(cli, traces):
    # The table's figure, passed back as --capacity, must fit (it is printed exactly).
    t = min(traces, key=lambda p: p.stat().st_size)
    out = run([cli, "replay", str(t), "--min-capacity"]).stdout
    header, _, row = out.splitlines()[1:4]
    start = header.index("min capacity")
    printed = row[start - 4:].split("  ")[-1].strip()
    assert vramroom.parse_size(printed) == vramroom.min_capacity(t), (printed, out)
    (r,) = cli_rows(cli, [str(t), "--capacity", printed])
    assert r["num_ooms"] == 0 and r["oom_event"] is None, printed


def test_recommend_matches_the_cli(cli, traces):
    t = traces[0]
    api = vramroom.recommend(t)
    rows = cli_rows(cli, [str(t), "--recommend"])
    assert [r["alloc_conf"] for r in api["results"]] == [r["alloc_conf"] for r in rows]
    for a, c in zip(api["results"], rows):
        same_row(a, c)
    picked = [r["alloc_conf"] for r in rows if r["recommended"]]
    assert [api["recommended"]] == picked or (api["recommended"] is None and not picked)


def test_summary_matches_the_cli(cli, traces):
    t = traces[0]
    assert vramroom.summary(t) == run([cli, "summary", str(t)]).stdout
    assert vramroom.summary(t, abbreviated=True) == run(
        [cli, "summary", str(t), "--abbreviated"]).stdout


def test_predict_matches_the_cli(cli):
    api = vramroom.predict("mlp", batch=4)
    c = json.loads(run([cli, "predict", "--model", "mlp", "--batch", "4", "--json"]).stdout)
    assert api == c
    # The flags' vocabulary, in keyword form: a distribution, training, a planted mistake.
    api = vramroom.predict("zoo-gpt-tiny", batch=2, seq="uniform:8..32", mode="train",
                           optimizer="adamw", grad=False, alloc_conf="expandable_segments:True")
    c = json.loads(run([cli, "predict", "--model", "zoo-gpt-tiny", "--batch", "2", "--seq",
                        "uniform:8..32", "--mode", "train", "--optimizer", "adamw",
                        "--alloc-conf", "expandable_segments:True", "--json"]).stdout)
    assert api == c and api["size"] == 32
    assert vramroom.predict("zoo-gpt-tiny", seq=16, grad=True) == json.loads(run(
        [cli, "predict", "--model", "zoo-gpt-tiny", "--seq", "16", "--grad-on", "--json"]).stdout)
    assert api["peak_allocated_bytes"] > 0
    assert vramroom.predict("mlp", batch=8)["peak_allocated_bytes"] > api["peak_allocated_bytes"]


def test_predict_out_of_memory_raises_memory_error():
    with pytest.raises(MemoryError):
        vramroom.predict("mlp", batch=64, capacity="1MiB")


def test_diff_of_a_trace_with_itself_is_even(traces):
    d = vramroom.diff(traces[0], traces[0])
    assert d["base"]["figures"]["peak_reserved"] == d["new"]["figures"]["peak_reserved"] > 0
    assert d["thresholds"] == []
    # Bytes have no path; the figures are the same.
    b = vramroom.diff(traces[0].read_bytes(), traces[0])
    assert b["base"]["path"] is None and b["base"]["figures"] == d["base"]["figures"]


def _diff_cli():
    """The vramroom binary to compare with: $VRAMROOM_BIN, the installed one, the build's."""
    env = os.environ.get("VRAMROOM_BIN")
    for p in ([env] if env else []) + [str(Path(sys.executable).parent / "vramroom"),
                                      str(REPO / "target" / "release" / "vramroom"),
                                      shutil.which("vramroom") or ""]:
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def _keys(v, prefix=""):
    """Every key path of a JSON object, lists by their first element."""
    out = set()
    if isinstance(v, dict):
        for k, x in v.items():
            out.add(prefix + k)
            out |= _keys(x, prefix + k + ".")
    elif isinstance(v, list) and v:
        out |= _keys(v[0], prefix + "[].")
    return out


def test_diff_has_the_keys_of_the_cli_json(traces):
    cli = _diff_cli()
    if cli is None:
        pytest.skip("no vramroom binary (VRAMROOM_BIN, beside this Python, target/release, PATH)")
    stacks = REPO / "fixtures" / "snapshots"
    pairs = [(traces[0], traces[-1])]
    # With stacks, so top_sites has elements whose keys are compared too.
    if (stacks / "graph_release__default.pickle").exists():
        pairs.append((stacks / "graph_release__default.pickle",
                      stacks / "oom_recover__default.pickle"))
    for b, n in pairs:
        want = json.loads(run([cli, "diff", str(b), str(n), "--json"]).stdout)
        got = vramroom.diff(str(b), str(n))
        assert _keys(got) == _keys(want)
        assert got == want


def test_bad_input_raises_clear_errors(tmp_path, traces):
    with pytest.raises(ValueError, match="alloc_conf"):
        vramroom.replay(traces[0], alloc_conf="no_such_knob:1")
    with pytest.raises(ValueError, match="capacity"):
        vramroom.replay(traces[0], capacity="lots")
    with pytest.raises(ValueError, match="capacity"):
        vramroom.replay(traces[0], capacity=0)
    with pytest.raises(OSError):
        vramroom.replay(tmp_path / "missing.pickle")
    junk = tmp_path / "junk.pickle"
    junk.write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="snapshot"):
        vramroom.replay(junk)
    with pytest.raises(ValueError):
        vramroom.predict("no_such_model")


def test_predict_takes_a_hugging_face_config_as_the_cli_does(cli):
    config = Path(__file__).resolve().parents[2] / "fixtures" / "hf" / "llama-small"
    args = dict(mode="generate", seq=64, new=8, batch=2)
    api = vramroom.predict(config, **args)
    c = json.loads(run([cli, "predict", "--model", str(config), "--mode", "generate", "--seq",
                        "64", "--new", "8", "--batch", "2", "--json"]).stdout)
    assert api == c and api["peak_allocated_bytes"] > api["base_bytes"] > 0
