#!/usr/bin/env bash
# Builds the vramroom wheel (and sdist) into dist/: the CLI binary and libvramroom_torch.so,
# copied into python/vramroom/, then the PyO3 extension and the wheel (maturin). The sdist
# carries the whole workspace and the in-tree build backend (build_backend/), which does the
# same first steps with the host's cargo when the sdist is built; scripts/check_sdist.sh
# checks it here (`scripts/check_sdist.sh dist/vramroom-*.tar.gz --full` builds it).
#
# Usage: scripts/build_wheel.sh [--native] [MATURIN]
#   MATURIN: the maturin command (default: maturin).
#   default: everything is linked against glibc 2.28 through zig (cargo-zigbuild and
#     maturin --zig; `pip install ziglang cargo-zigbuild maturin`), so the wheel is
#     manylinux_2_28 — RHEL 8+/9, Amazon Linux 2023, Ubuntu 20.04, Debian 11, like
#     PyTorch's own wheels. The build fails if any binary needs a newer glibc than that.
#   --native: the host's own toolchain and glibc (faster to iterate; the tag is then whatever
#     the binaries need, e.g. manylinux_2_35 on a glibc 2.36 host).
set -euo pipefail
cd "$(dirname "$0")/.."
NATIVE=0
if [ "${1:-}" = "--native" ]; then
    NATIVE=1
    shift
fi
MATURIN=${1:-maturin}
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
BASELINE=28 # manylinux_2_28: the newest glibc symbol version the wheel may need
if [ "$NATIVE" = 0 ]; then
    if ! command -v cargo-zigbuild >/dev/null 2>&1; then
        echo "build_wheel.sh: cargo-zigbuild is not on PATH (pip install ziglang cargo-zigbuild)," \
            "or use --native" >&2
        exit 2
    fi
    TRIPLE=x86_64-unknown-linux-gnu
    cargo zigbuild --release --target "$TRIPLE.2.$BASELINE" -p vramroom -p vramroom-torch
    OUTDIR=$TARGET/$TRIPLE/release
    MATURIN_ARGS=(--zig --target "$TRIPLE" --compatibility "manylinux_2_$BASELINE")
else
    cargo build --release -p vramroom -p vramroom-torch
    OUTDIR=$TARGET/release
    MATURIN_ARGS=()
fi
for f in "$OUTDIR/vramroom" "$OUTDIR/libvramroom_torch.so"; do
    [ -f "$f" ] || { echo "build_wheel.sh: $f is missing" >&2; exit 2; }
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
strip_copy "$OUTDIR/vramroom" python/vramroom/_bin/vramroom 755
strip_copy "$OUTDIR/libvramroom_torch.so" python/vramroom/libvramroom_torch.so 644
rm -rf dist
# The manylinux tag is checked, not assumed. maturin audits the extension it builds; the CLI
# binary and the allocator library ride along as package data, so they are audited here the
# same way (PEP 600): they may link only the libraries every glibc system has, and the
# newest glibc symbol version any of them needs must not pass the tag's baseline.
MANYLINUX_LIBS=" libc.so.6 libm.so.6 libgcc_s.so.1 libpthread.so.0 libdl.so.2 librt.so.1 ld-linux-x86-64.so.2 "
if ! command -v readelf >/dev/null 2>&1 || ! command -v objdump >/dev/null 2>&1; then
    echo "build_wheel.sh: readelf/objdump (binutils) are needed to check the manylinux tag" >&2
    exit 2
fi
NEED=17
for f in python/vramroom/_bin/vramroom python/vramroom/libvramroom_torch.so; do
    for lib in $(readelf -d "$f" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p'); do
        case "$MANYLINUX_LIBS" in
        *" $lib "*) ;;
        *) echo "build_wheel.sh: $f links $lib, outside manylinux" >&2; exit 1 ;;
        esac
    done
    m=$(objdump -T "$f" | grep -o 'GLIBC_2\.[0-9]*' | sed 's/GLIBC_2\.//' | sort -n | tail -1)
    [ -n "$m" ] && [ "$m" -gt "$NEED" ] && NEED=$m
done
if [ "$NATIVE" = 0 ]; then
    if [ "$NEED" -gt "$BASELINE" ]; then
        echo "build_wheel.sh: the binaries need glibc 2.$NEED, newer than manylinux_2_$BASELINE" >&2
        exit 1
    fi
else
    MATURIN_ARGS=(--compatibility "manylinux_2_$NEED")
fi
echo "build_wheel.sh: binaries need glibc 2.$NEED; wheel tag ${MATURIN_ARGS[*]}"
CARGO_TARGET_DIR=$TARGET "$MATURIN" build --release "${MATURIN_ARGS[@]}" -o dist
CARGO_TARGET_DIR=$TARGET "$MATURIN" sdist -o dist
scripts/check_sdist.sh dist/vramroom-*.tar.gz
ls -l dist/
