"""The PEP 517 build backend of the `vramroom` package: maturin, plus the two native build
outputs maturin cannot make itself.

Design note: the wheel ships three native files. maturin builds one of them, the PyO3
extension (crates/vramroom-py). The other two, the `vramroom` CLI binary (crates/vramroom)
and the allocator library libvramroom_torch.so (crates/vramroom-torch), are other crates of
the workspace that a pyo3 project cannot name as build targets, so they ride in the wheel as
package data (pyproject.toml's [tool.maturin] include). scripts/build_wheel.sh builds and
copies them before it calls maturin; a build from the sdist (`pip install vramroom-*.tar.gz`,
or `pip install .` in a checkout) goes through this backend instead, which does the same
with the host's own cargo, then hands over to maturin. Everything but `build_wheel` and
`build_editable` is maturin's unchanged. The copies land in python/vramroom/ of the tree being
built, which is also where an editable install (`pip install -e .`) looks for them.
"""

import json
import os
import shutil
import subprocess
import sys

import maturin
from maturin import (  # noqa: F401  (re-exported: the rest of the PEP 517 interface)
    build_sdist,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

# Where maturin's include (pyproject.toml) expects the two files, relative to the project root.
BINARY = os.path.join("python", "vramroom", "_bin", "vramroom")
LIBRARY = os.path.join("python", "vramroom", "libvramroom_torch.so")


class BuildError(Exception):
    pass


def native_artifacts(messages):
    """(binary, library) paths from cargo's --message-format=json lines.

    The paths come from cargo itself rather than from a guessed target/release/, so
    CARGO_TARGET_DIR, --target and build.target-dir all work.
    """
    binary = library = None
    for line in messages:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") != "compiler-artifact":
            continue
        target = msg.get("target") or {}
        kinds = target.get("kind") or []
        if target.get("name") == "vramroom" and "bin" in kinds and msg.get("executable"):
            binary = msg["executable"]
        elif target.get("name") == "vramroom_torch" and "cdylib" in kinds:
            for f in msg.get("filenames") or []:
                if f.endswith(".so"):
                    library = f
    missing = [n for n, p in (("the vramroom binary", binary),
                              ("libvramroom_torch.so", library)) if p is None]
    if missing:
        raise BuildError("cargo built no %s" % " and no ".join(missing))
    return binary, library


def _copy(src, dst, mode):
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if os.path.exists(dst):
        os.remove(dst)
    # The release profile keeps line tables (debug = 1) for profiling; an installed copy does
    # not need them. objcopy is where cargo's linker is (binutils); without it the file is
    # only bigger.
    objcopy = shutil.which("objcopy")
    if objcopy is None or subprocess.run([objcopy, "--strip-debug", src, dst]).returncode != 0:
        shutil.copyfile(src, dst)
    os.chmod(dst, mode)


def build_native():
    """Builds the CLI binary and the allocator library and copies them into the package."""
    cargo = os.environ.get("CARGO") or shutil.which("cargo")
    if cargo is None:
        raise BuildError("building vramroom from source needs Rust's cargo on PATH "
                         "(https://rustup.rs), or install the vramroom wheel instead")
    cmd = [cargo, "build", "--release", "--locked", "-p", "vramroom", "-p", "vramroom-torch",
           "--message-format=json-render-diagnostics"]
    sys.stderr.write("Running `%s`\n" % " ".join(cmd))
    sys.stderr.flush()
    # stdout is cargo's JSON; its diagnostics and progress go to stderr, which pip shows.
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise BuildError("`%s` failed (exit %d)" % (" ".join(cmd), p.returncode))
    binary, library = native_artifacts(p.stdout.splitlines())
    _copy(binary, BINARY, 0o755)
    _copy(library, LIBRARY, 0o644)


def _build_native_or_exit():
    try:
        build_native()
    except BuildError as e:
        # maturin's own hooks report a failed build the same way: a message and exit 1.
        sys.stderr.write("vramroom build: %s\n" % e)
        sys.exit(1)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _build_native_or_exit()
    return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _build_native_or_exit()
    return maturin.build_editable(wheel_directory, config_settings, metadata_directory)
