#!/usr/bin/env bash
# Builds the headroom wheel into dist/: the CLI binary and libheadroom_torch.so (cargo, release),
# copied into python/headroom/, then the PyO3 extension and the wheel (maturin, release, the
# same target dir: the workspace's crates compile once for both).
# Usage: scripts/build_wheel.sh [--prebuilt] [MATURIN]
#   MATURIN: the maturin command (default: maturin).
#   --prebuilt: take target/release/headroom and libheadroom_torch.so as they are (CI: its
#   `cargo test --workspace --release` has just built both), instead of running cargo build,
#   whose different feature set would compile the workspace a second time.
set -euo pipefail
cd "$(dirname "$0")/.."
PREBUILT=0
if [ "${1:-}" = "--prebuilt" ]; then
    PREBUILT=1
    shift
fi
MATURIN=${1:-maturin}
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
if [ "$PREBUILT" = 0 ]; then
    cargo build --release -p headroom -p headroom-torch
fi
# `cargo test` builds the cdylib into release/deps/ but does not copy it up to release/ (only
# `cargo build` does), so the newer of the two is the one to ship.
LIB=$TARGET/release/libheadroom_torch.so
if [ -f "$TARGET/release/deps/libheadroom_torch.so" ] &&
    { [ ! -f "$LIB" ] || [ "$TARGET/release/deps/libheadroom_torch.so" -nt "$LIB" ]; }; then
    LIB=$TARGET/release/deps/libheadroom_torch.so
fi
for f in "$TARGET/release/headroom" "$LIB"; do
    [ -f "$f" ] || { echo "build_wheel.sh: $f is missing (run without --prebuilt)" >&2; exit 2; }
done
mkdir -p python/headroom/_bin
# The release profile keeps line tables (debug = 1) for profiling; the wheel does not need them.
strip_copy() {
    if command -v objcopy >/dev/null 2>&1; then
        objcopy --strip-debug "$1" "$2"
    else
        cp "$1" "$2"
    fi
    chmod "$3" "$2"
}
strip_copy "$TARGET/release/headroom" python/headroom/_bin/headroom 755
strip_copy "$LIB" python/headroom/libheadroom_torch.so 644
rm -rf dist
# --compatibility linux: the binary and the libraries link the build machine's glibc; the tag
# says so rather than claiming a manylinux baseline that was not checked.
CARGO_TARGET_DIR=$TARGET "$MATURIN" build --release --compatibility linux -o dist
ls -l dist/*.whl
