#!/usr/bin/env bash
# Every test, on a machine with no GPU: the README's test command, and what `.ci/run` runs.
#
# 1. Setup, each step cached: Chromium (Debian's package) for the report's browser tests;
#    NVRTC from PyPI (no GPU needed) so the CUDA kernels are compiled; PyTorch 2.11 with
#    torchvision and transformers from PyPI, in a venv outside the checkout
#    ($VRAMROOM_CI_CACHE, default ~/.cache/vramroom-ci) for the fake-CUDA tracer's tests.
# 2. `cargo test --workspace --release`, then the NVRTC-only tests when NVRTC was found.
# 3. The wheel (scripts/build_wheel.sh, manylinux_2_28), installed into a fresh venv with no Rust
#    and no torch on its path, and python/tests run against it from outside the tree; then
#    the tracer's tests again in the torch venv, where they do not skip (two xdist workers).
# 4. A count of every test that did not run, by reason: GPU tests are `#[ignore]`d with the
#    reason and listed, never passed unrun.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
LOG=$(mktemp -d)
trap 'rm -rf "$LOG"' EXIT

command -v chromium >/dev/null 2>&1 || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
}
NVRTC_DIR=$ROOT/.ci-cache/nvrtc
if [ ! -f "$NVRTC_DIR/lib/libnvrtc.so.13" ]; then
    tmp=$(mktemp -d)
    if python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        "nvidia-cuda-nvrtc==13.0.*" -d "$tmp" >/dev/null 2>&1; then
        mkdir -p "$NVRTC_DIR"
        python3 -m zipfile -e "$tmp"/nvidia_cuda_nvrtc-*.whl "$tmp/x" &&
            cp -r "$tmp/x/nvidia/cu13/lib" "$NVRTC_DIR/" || true
    fi
    rm -rf "$tmp"
fi
HAVE_NVRTC=0
if [ -f "$NVRTC_DIR/lib/libnvrtc.so.13" ]; then
    export VRAMROOM_CUDA_LIB_DIRS=$NVRTC_DIR/lib
    HAVE_NVRTC=1
fi
# PyTorch for the tracer: pinned to the versions the GPU comparisons ran (scripts/trace_corpus/real/HEADER).
CACHE=${VRAMROOM_CI_CACHE:-$HOME/.cache/vramroom-ci}
TORCH_VENV=$CACHE/venv-torch
# pytest-xdist: each tracer test traces in a fresh interpreter (seconds of import), so two
# workers halve that step (603 s -> 328 s here); CI has two cores.
TORCH_PINS="torch==2.11.0 torchvision==0.26.0 transformers==5.17.0 pytest pytest-xdist"
if [ "$(cat "$TORCH_VENV/.pins" 2>/dev/null)" != "$TORCH_PINS" ]; then
    rm -rf "$TORCH_VENV"
    python3 -m venv "$TORCH_VENV"
    # shellcheck disable=SC2086
    if "$TORCH_VENV/bin/python" -m pip install -q $TORCH_PINS; then
        echo "$TORCH_PINS" >"$TORCH_VENV/.pins"
    else
        echo "test.sh: PyTorch could not be installed; the tracer's tests will skip" >&2
    fi
fi

cargo test --workspace --release 2>&1 | tee "$LOG/cargo.log"
if [ "$HAVE_NVRTC" = 1 ]; then
    cargo test --release -p vramroom-cuda --test kernels -- --include-ignored 2>&1 | tee "$LOG/nvrtc.log"
fi

# The Python package: the manylinux_2_28 wheel, its binaries linked against glibc 2.28 by
# zig (scripts/build_wheel.sh; a second build of the CLI's crates, for that target).
PYCACHE=$ROOT/.ci-cache
if [ ! -x "$PYCACHE/venv-build/bin/cargo-zigbuild" ]; then
    python3 -m venv "$PYCACHE/venv-build"
    "$PYCACHE/venv-build/bin/python" -m pip install -q "maturin>=1.5,<2" ziglang cargo-zigbuild
fi
PATH="$PYCACHE/venv-build/bin:$PATH" scripts/build_wheel.sh "$PYCACHE/venv-build/bin/maturin"
# pytest in VENV, from outside the source tree, with a PATH that has no cargo (what a user
# has); its output also goes to LOG/NAME.log for the count at the end.
run_pytest() {
    local venv=$1 name=$2
    shift 2
    (cd "$PYCACHE" && env PATH="$venv/bin:/usr/bin:/bin" \
        "$venv/bin/python" -m pytest "$@" -q -p no:cacheprovider -rs) 2>&1 | tee "$LOG/$name.log"
}
rm -rf "$PYCACHE/venv-test"
python3 -m venv "$PYCACHE/venv-test"
"$PYCACHE/venv-test/bin/python" -m pip install -q dist/vramroom-*.whl pytest
run_pytest "$PYCACHE/venv-test" pytest "$ROOT/python/tests"
# The tests that need PyTorch (python/tests/test_trace*.py) again, where PyTorch is.
TORCH_TESTS=$(ls "$ROOT"/python/tests/test_trace*.py 2>/dev/null || true)
TORCH_RAN=0
if [ -f "$TORCH_VENV/.pins" ] && [ -n "$TORCH_TESTS" ]; then
    "$TORCH_VENV/bin/python" -m pip install -q --force-reinstall --no-deps dist/vramroom-*.whl
    # shellcheck disable=SC2086
    run_pytest "$TORCH_VENV" pytest-torch -n 2 $TORCH_TESTS
    TORCH_RAN=1
fi

# What did not run, and why: libtest prints "test NAME ... ignored, REASON".
echo
echo "== not run here =="
sed -n 's/^test .* \.\.\. ignored, //p' "$LOG/cargo.log" | sort | uniq -c |
    awk '{n=$1; $1=""; printf "%4d cargo test(s) ignored:%s\n", n, $0}'
if [ "$HAVE_NVRTC" = 1 ]; then
    echo "     (the NVRTC tests among them ran in the second cargo test above)"
fi
grep -h '^SKIPPED' "$LOG"/pytest*.log 2>/dev/null | sed 's/^SKIPPED \[[0-9]*\] //' | sort | uniq -c |
    awk '{n=$1; $1=""; printf "%4d pytest test(s) skipped:%s\n", n, $0}' || true
if [ "$TORCH_RAN" = 1 ]; then
    echo "     (the pytest files that need PyTorch ran again in the PyTorch venv)"
fi
