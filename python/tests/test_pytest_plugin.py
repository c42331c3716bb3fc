"""The pytest plugin (`@pytest.mark.max_cuda_memory`, the `cuda_memory` fixture) on a
CPU-side fake of its inputs: the torch stub the probe's tests use (a consistent model of one
device's caching allocator), given PyTorch's reset_peak_memory_stats where it lacks it.

Each case runs an inner pytest in a subprocess (pytester), so the fake torch never leaks into
this session, and the plugin is found the way users get it: the wheel's pytest11 entry point.
"""

import pickle

import pytest

from conftest import TORCH_STUB

# The inner session's conftest: the stub first on sys.path, and the two calls the plugin
# needs that the probe does not (reset_peak_memory_stats: peaks back to current, as PyTorch).
INNER_CONFTEST = """
import sys
sys.path.insert(0, %r)
import torch
cuda = torch.cuda
if not hasattr(cuda, "reset_peak_memory_stats"):
    def reset_peak_memory_stats(device=None):
        st = cuda._state
        with st.lock:
            for k in list(st.stats):
                if k.endswith(".peak"):
                    st.stats[k] = st.stats[k[:-len("peak")] + "current"]
    cuda.reset_peak_memory_stats = reset_peak_memory_stats
if not hasattr(cuda, "synchronize"):
    cuda.synchronize = lambda device=None: None
""" % str(TORCH_STUB)

TESTS = """
import pytest
import torch

MIB = 1 << 20

@pytest.mark.max_cuda_memory("64MiB")
def test_under():
    a = torch.cuda._stub_alloc(40 * MIB)
    torch.cuda._stub_free(a)

@pytest.mark.max_cuda_memory("64MiB")
def test_over():
    a = torch.cuda._stub_alloc(48 * MIB)
    b = torch.cuda._stub_alloc(48 * MIB)   # 96 MiB live at once
    torch.cuda._stub_free(a)
    torch.cuda._stub_free(b)

@pytest.mark.max_cuda_memory("64MiB")
def test_sequential_frees_keep_the_peak_low():
    for _ in range(4):                      # 4 x 40 MiB, never two live: peak 40 MiB
        torch.cuda._stub_free(torch.cuda._stub_alloc(40 * MIB))

def test_fixture(cuda_memory):
    cuda_memory.budget("10MiB")
    a = torch.cuda._stub_alloc(20 * MIB)
    torch.cuda._stub_free(a)
    assert cuda_memory.peak_allocated >= 20 * MIB

def test_fixture_figures(cuda_memory):
    a = torch.cuda._stub_alloc(6 * MIB)
    assert cuda_memory.peak_allocated - cuda_memory.start_allocated >= 6 * MIB
    torch.cuda._stub_free(a)
"""


def _run(pytester, tests=TESTS, *args):
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyfile(test_inner=tests)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", *args)


def test_budgets_pass_and_fail_on_the_peak(pytester):
    r = _run(pytester)
    r.assert_outcomes(passed=3, failed=2)
    out = r.stdout.str()
    assert "test_over" in out and "CUDA memory over budget" in out
    # The message names the peak and the budget.
    assert "96.00 MiB" in out and "budget 64.00 MiB" in out
    assert "test_fixture " in out or "test_inner.py::test_fixture " in out


def test_failure_leaves_a_snapshot_that_holds_the_test(pytester):
    r = _run(pytester, TESTS, "--max-cuda-memory-dir", "snaps", "-k", "test_over")
    r.assert_outcomes(failed=1, deselected=4)
    (snap,) = (pytester.path / "snaps").glob("*.pickle")
    with open(snap, "rb") as f:
        s = pickle.load(f)
    trace = s["device_traces"][0]
    allocs = [e for e in trace if e["action"] == "alloc"]
    assert sorted(e["size"] for e in allocs)[-2:] == [48 << 20, 48 << 20]
    assert str(snap) in r.stdout.str() or snap.name in r.stdout.str()


def test_the_snapshot_replays_in_vramroom(pytester):
    vramroom = pytest.importorskip("vramroom")
    r = _run(pytester, TESTS, "--max-cuda-memory-dir", "snaps", "-k", "test_over")
    r.assert_outcomes(failed=1, deselected=4)
    (snap,) = (pytester.path / "snaps").glob("*.pickle")
    row = vramroom.replay(snap)
    assert row["peak_allocated_bytes"] >= 96 << 20


def test_scale_option_tightens_or_loosens_every_budget(pytester):
    r = _run(pytester, TESTS, "--max-cuda-memory-scale", "2", "-k", "test_over")
    r.assert_outcomes(passed=1, deselected=4)
    r = _run(pytester, TESTS, "--max-cuda-memory-scale", "0.5", "-k", "test_under")
    r.assert_outcomes(failed=1, deselected=4)


def test_increase_measures_above_the_start(pytester):
    tests = """
import pytest, torch
MIB = 1 << 20
held = torch.cuda._stub_alloc(100 * MIB)     # a module-level model

@pytest.mark.max_cuda_memory("50MiB", increase=True)
def test_increase_ok():
    torch.cuda._stub_free(torch.cuda._stub_alloc(30 * MIB))

@pytest.mark.max_cuda_memory("50MiB")
def test_absolute_counts_the_model():
    torch.cuda._stub_free(torch.cuda._stub_alloc(30 * MIB))
"""
    r = _run(pytester, tests)
    r.assert_outcomes(passed=1, failed=1)
    assert "test_absolute_counts_the_model" in r.stdout.str()


def test_bad_budget_is_a_usage_error(pytester):
    tests = """
import pytest
@pytest.mark.max_cuda_memory("lots")
def test_x():
    pass
"""
    r = _run(pytester, tests)
    assert r.ret != 0
    assert "bad memory budget 'lots'" in r.stdout.str() + r.stderr.str()


def test_without_cuda_the_test_runs_and_says_the_budget_was_not_checked(pytester):
    conftest = INNER_CONFTEST + "\ncuda.is_available = lambda: False\n"
    pytester.makeconftest(conftest)
    pytester.makepyfile(test_inner="""
import pytest
@pytest.mark.max_cuda_memory("1MiB")
def test_cpu_only():
    pass
""")
    r = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "default")
    r.assert_outcomes(passed=1, warnings=1)
    assert "not checked" in r.stdout.str()


def test_parse_size_reads_vramroom_sizes():
    from vramroom.pytest_plugin import parse_size

    assert parse_size("2GiB") == 2 << 30
    assert parse_size("512 MiB") == 512 << 20
    assert parse_size("1.5GB") == 1_500_000_000
    assert parse_size(4096) == 4096
    for bad in ("", "lots", "-1GiB", 0, True, None, "2XB"):
        with pytest.raises(ValueError):
            parse_size(bad)
