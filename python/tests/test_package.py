"""The installed wheel holds what it promises: the CLI, the extension, the probe, the
allocator library, the pytest plugin."""

import os
import subprocess
import sys
from pathlib import Path

import vramroom
from conftest import run


def test_installed_from_the_wheel_not_the_source_tree():
    assert "site-packages" in vramroom.__file__, vramroom.__file__


def test_cli_runs_and_exits_2_on_bad_input(cli, tmp_path):
    assert run([cli, "--version"]).stdout.startswith("vramroom ")
    out = run([cli, "--help"]).stdout
    for cmd in ("replay", "summary", "predict", "loadtest", "http", "serve", "diff"):
        assert "\n  %s " % cmd in out, cmd
    p = run([cli, "replay", str(tmp_path / "missing.pickle")], check=False)
    assert p.returncode == 2 and "error:" in p.stderr


def test_the_allocator_library_is_inside_the_package():
    from vramroom import torch as ht

    lib = Path(ht.__file__).with_name("libvramroom_torch.so")
    assert lib.is_file()
    env = {k: v for k, v in os.environ.items() if k != "VRAMROOM_TORCH_LIB"}
    code = "from vramroom import torch as ht; ht.library(); print(ht._lib_path)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    assert Path(p.stdout.strip()).resolve() == lib.resolve()


def test_python_m_vramroom_probe_is_there():
    p = subprocess.run([sys.executable, "-m", "vramroom.probe", "--help"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "--port" in p.stdout


def test_the_pytest_plugin_is_registered(pytestconfig):
    assert pytestconfig.pluginmanager.has_plugin("vramroom")
