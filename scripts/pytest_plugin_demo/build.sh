#!/usr/bin/env bash
# Here (no GPU): the vramroom wheel and pytest's wheels into wheelhouse/ (ignored by git), the
# folder the GPU machine installs from, having no network.
set -euo pipefail
cd "$(dirname "$0")"
HERE=$PWD
ROOT=$(cd ../.. && pwd)
MATURIN=${MATURIN:-maturin}
(cd "$ROOT" && scripts/build_wheel.sh "$MATURIN")
rm -rf "$HERE/wheelhouse" && mkdir -p "$HERE/wheelhouse"
cp "$ROOT"/dist/vramroom-*.whl "$HERE/wheelhouse/"
# pytest and its dependencies for any CPython the GPU machine may have (pure-Python wheels;
# the 3.9 download adds the backports older Pythons need).
for v in 3.9 3.12; do
    python3 -m pip download -q --only-binary=:all: --python-version "$v" --platform any \
        --platform manylinux2014_x86_64 -d "$HERE/wheelhouse" pytest
done
# pip reads pytest's markers with this interpreter's version: the backports by name.
python3 -m pip download -q --only-binary=:all: --python-version 3.9 --platform any \
    -d "$HERE/wheelhouse" exceptiongroup tomli typing_extensions
ls -l "$HERE/wheelhouse"
du -sh "$HERE/wheelhouse"
