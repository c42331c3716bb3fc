"""The pytest plugin on a machine with no CUDA and a real PyTorch: budgets are checked against
the fake-CUDA trace's predicted peak, and a test over its budget fails saying "predicted",
with the peak, the budget and the traced snapshot.

Needs PyTorch (scripts/test.sh runs this file again in its PyTorch venv); skips without it.
The predicted figures are checked against what PyTorch's allocator does on an H100 for these
shapes: each tensor is its bytes rounded up to 512, and the first matmul of a thread takes
cuBLAS's 32 MiB Hopper workspace from the caching allocator (the measured table,
python/vramroom/trace/cuda_hidden.json).
"""

import pickle

import pytest

torch = pytest.importorskip("torch")

MIB = 1 << 20

TESTS = """
import pytest, torch

@pytest.mark.max_cuda_memory("8MiB")
def test_matmul_over():
    x = torch.randn(1024, 1024, device="cuda")   # 4 MiB
    y = x @ x                                    # 4 MiB, and cuBLAS's 32 MiB workspace
    assert y.shape == (1024, 1024)

@pytest.mark.max_cuda_memory("9MiB")
def test_no_matmul_within():
    x = torch.zeros(1024, 1024, device="cuda")
    y = x + 1                                    # 8 MiB live at the peak
    del x, y

def test_fixture_budget(cuda_memory):
    cuda_memory.budget("100MiB")
    x = torch.zeros(10, 1024, 1024, device="cuda")
    assert not torch.cuda.is_initialized() or True
"""


def _run(pytester, *args):
    pytester.makepyfile(test_inner=TESTS)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", *args)


def test_budgets_are_checked_against_the_traced_prediction(pytester):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the plugin measures it instead of tracing")
    r = _run(pytester)
    r.assert_outcomes(passed=2, failed=1)
    out = r.stdout.str()
    # 4 MiB + 4 MiB + the 32 MiB cuBLAS workspace, all live at the end of the test.
    assert "test_matmul_over: CUDA memory over budget: predicted peak allocated 40.00 MiB" in out
    assert "fake-CUDA trace, no GPU used" in out
    assert "predicted peak allocated 8.00 MiB" in out  # test_no_matmul_within
    snaps = list(pytester.path.joinpath(".vramroom-pytest").glob("*test_matmul_over*.pickle"))
    assert len(snaps) == 1
    snap = pickle.loads(snaps[0].read_bytes())
    sizes = sorted(e["size"] for e in snap["device_traces"][0] if e["action"] == "alloc")
    assert sizes == [4 * MIB, 4 * MIB, 32 * MIB], sizes


def test_no_trace_keeps_the_old_warning(pytester):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    pytester.makepyfile(test_cpu="""
import pytest, torch
@pytest.mark.max_cuda_memory("1MiB")
def test_on_the_cpu():
    assert torch.zeros(1024).sum().item() == 0
""")
    r = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "default",
                                      "--max-cuda-memory-no-trace")
    r.assert_outcomes(passed=1, warnings=1)
    assert "not checked: no CUDA device, and tracing is off" in r.stdout.str()
