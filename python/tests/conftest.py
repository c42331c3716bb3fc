"""Shared fixtures: the installed package's CLI, the reference traces, the torch stub.

These tests run against the installed wheel (.ci/run installs it into a fresh venv), never
the source tree: python/ is not on sys.path here.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[2]
# The CPU-side fake of torch.cuda that the probe's own tests use: a consistent model of one
# device's caching allocator, with memory_stats keys and _snapshot() as PyTorch 2.11 has them.
TORCH_STUB = REPO / "crates" / "vramroom-load" / "tests" / "fixtures" / "torch_stub"


def _traces_dir():
    for d in (os.environ.get("VRAMROOM_TRACES"), REPO / "shared" / "traces",
              REPO.parent / "shared" / "traces"):
        if d and Path(d).is_dir():
            return Path(d)
    return None


@pytest.fixture(scope="session")
def cli():
    """The installed `vramroom` console script, beside this interpreter."""
    path = Path(sys.executable).parent / "vramroom"
    assert path.exists(), "the vramroom command is not installed beside %s" % sys.executable
    return str(path)


@pytest.fixture(scope="session")
def traces():
    d = _traces_dir()
    if d is None:
        pytest.skip("no ../shared/traces/ (set VRAMROOM_TRACES)")
    found = sorted(d.glob("*.pickle"))
    assert found, "no *.pickle in %s" % d
    return found


def run(cmd, env=None, check=True):
    """Runs a command, with PYTORCH_CUDA_ALLOC_CONF unset unless `env` sets it."""
    e = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    e.update(env or {})
    p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError("%s exited %d:\n%s\n%s" % (cmd, p.returncode, p.stdout, p.stderr))
    return p
