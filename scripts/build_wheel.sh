#!/usr/bin/env bash
# Builds the vramroom wheel into dist/: the CLI binary and libvramroom_torch.so (cargo, release),
# copied into python/vramroom/, then the PyO3 extension and the wheel (maturin, release, the
# same target dir: the workspace's crates compile once for both).
# Usage: scripts/build_wheel.sh [--prebuilt] [MATURIN]
#   MATURIN: the maturin command (default: maturin).
#   --prebuilt: take target/release/vramroom and libvramroom_torch.so as they are (CI: its
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
    cargo build --release -p vramroom -p vramroom-torch
fi
# `cargo test` builds the cdylib into release/deps/ but does not copy it up to release/ (only
# `cargo build` does), so the newer of the two is the one to ship.
LIB=$TARGET/release/libvramroom_torch.so
if [ -f "$TARGET/release/deps/libvramroom_torch.so" ] &&
    { [ ! -f "$LIB" ] || [ "$TARGET/release/deps/libvramroom_torch.so" -nt "$LIB" ]; }; then
    LIB=$TARGET/release/deps/libvramroom_torch.so
fi
for f in "$TARGET/release/vramroom" "$LIB"; do
    [ -f "$f" ] || { echo "build_wheel.sh: $f is missing (run without --prebuilt)" >&2; exit 2; }
done
mkdir -p python/vramroom/_bin
# The release profile keeps line tables (debug = 1) for profiling; the wheel does not need them.
strip_copy() {
    if command -v objcopy >/dev/null 2>&1; then
        objcopy --strip-debug "$1" "$2"
    else
        cp "$1" "$2"
    fi
    chmod "$3" "$2"
}
strip_copy "$TARGET/release/vramroom" python/vramroom/_bin/vramroom 755
strip_copy "$LIB" python/vramroom/libvramroom_torch.so 644
rm -rf dist
# The manylinux tag is checked, not assumed. maturin audits the extension it builds; the CLI
# binary and the allocator library ride along as package data, so they are audited here the
# same way (PEP 600): they may link only the libraries every glibc system has, and the
# newest glibc symbol version any of them needs is the tag's baseline. When readelf/objdump
# are missing, or a file fails the check, the wheel is tagged plain `linux` and says why.
COMPAT=linux
MANYLINUX_LIBS=" libc.so.6 libm.so.6 libgcc_s.so.1 libpthread.so.0 libdl.so.2 librt.so.1 ld-linux-x86-64.so.2 "
if command -v readelf >/dev/null 2>&1 && command -v objdump >/dev/null 2>&1 &&
    [ "$(uname -m)" = x86_64 ]; then
    GLIBC_MINOR=17
    for f in python/vramroom/_bin/vramroom python/vramroom/libvramroom_torch.so; do
        for lib in $(readelf -d "$f" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p'); do
            case "$MANYLINUX_LIBS" in
            *" $lib "*) ;;
            *) echo "build_wheel.sh: $f links $lib, outside manylinux: tagging linux" >&2
                GLIBC_MINOR= ;;
            esac
        done
        [ -n "$GLIBC_MINOR" ] || break
        m=$(objdump -T "$f" | grep -o 'GLIBC_2\.[0-9]*' | sed 's/GLIBC_2\.//' | sort -n | tail -1)
        [ -n "$m" ] && [ "$m" -gt "$GLIBC_MINOR" ] && GLIBC_MINOR=$m
    done
    [ -n "$GLIBC_MINOR" ] && COMPAT=manylinux_2_$GLIBC_MINOR
else
    echo "build_wheel.sh: no readelf/objdump (or not x86_64): tagging linux, not manylinux" >&2
fi
echo "build_wheel.sh: wheel tag $COMPAT"
CARGO_TARGET_DIR=$TARGET "$MATURIN" build --release --compatibility "$COMPAT" -o dist
ls -l dist/*.whl
