"""The `vramroom` console script: runs the CLI binary shipped inside the wheel.

Design note: the CLI is a Rust binary (crates/vramroom). A wheel cannot put a binary on PATH
by itself in a form every installer keeps executable, so the wheel carries it as package data
(vramroom/_bin/vramroom) and this console script replaces its own process with it (exec): the
binary sees the same argv, stdin, environment and signals, and its exit code is the command's.
Running the CLI's main in-process through PyO3 was the other way; it would make the extension
carry the whole CLI (tokio, clap, the server) and tie Ctrl-C and exit codes to the
interpreter, for no gain.
"""

import os
import stat
import sys


def binary():
    """The path of the `vramroom` binary inside this package."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "vramroom")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            "the vramroom binary is missing from the package (%s): install the vramroom wheel, "
            "or build one with scripts/build_wheel.sh" % path
        )
    mode = os.stat(path).st_mode
    if not mode & stat.S_IXUSR:
        # Some installers drop the executable bit of package data.
        try:
            os.chmod(path, mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        except OSError:
            pass
    return path


def main():
    try:
        path = binary()
    except FileNotFoundError as e:
        sys.stderr.write("error: %s\n" % e)
        return 2
    argv = [path] + sys.argv[1:]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, argv)


if __name__ == "__main__":
    sys.exit(main())
