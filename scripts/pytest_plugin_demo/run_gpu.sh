#!/usr/bin/env bash
# On the GPU machine (no network), from the repo root or anywhere: installs the vramroom wheel
# from wheelhouse/ (made by build.sh) into a fresh venv that sees the system's torch, runs the
# demo tests with the plugin, and replays the over-budget test's snapshot with the wheel's
# `vramroom` and `vramroom.replay`. Output under $OUT (default /tmp/vramroom-pytest-demo):
# env.txt, pytest.txt, junit.xml, snapshots/*.pickle, replay.txt.
set -uo pipefail
cd "$(dirname "$0")"
HERE=$PWD
R=${OUT:-/tmp/vramroom-pytest-demo}
mkdir -p "$R"
V=/tmp/vramroom-demo-venv
rm -rf "$V"
if python3 -m venv --system-site-packages "$V" 2>/dev/null; then
    PY=$V/bin/python
    # When python3 is itself a virtual environment (or torch sits in a user site), the new
    # venv's --system-site-packages sees the base interpreter's packages, not torch: point it
    # at the folder python3 imports torch from.
    if ! "$PY" -c 'import torch' 2>/dev/null; then
        TORCH_SITE=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null)
        if [ -n "$TORCH_SITE" ]; then
            "$PY" -c 'import site, sys; open(site.getsitepackages()[0] + "/system-torch.pth", "w").write(sys.argv[1] + "\n")' "$TORCH_SITE"
            echo "(torch from $TORCH_SITE, through system-torch.pth)"
        fi
    fi
    "$PY" -m pip install -q --no-index --find-links wheelhouse vramroom pytest 2>&1 | tail -5
    HR=("$V/bin/vramroom")
else
    # No venv module here: a plain install into a folder on PYTHONPATH.
    echo "(python3 -m venv unavailable: installing with pip --target)"
    python3 -m pip install -q --no-index --find-links wheelhouse --target "$V" vramroom pytest 2>&1 | tail -5
    export PYTHONPATH=$V${PYTHONPATH:+:$PYTHONPATH}
    PY=python3
    HR=(python3 -m vramroom._cli)
fi
{
    echo "== machine"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1
    "$PY" -c 'import torch, vramroom, pytest; print("torch", torch.__version__, "| vramroom", vramroom.__version__, vramroom.__file__, "| pytest", pytest.__version__)'
    "${HR[@]}" --version
} 2>&1 | tee "$R/env.txt"
echo "== pytest (one test passes, one is over budget and fails: that is the demo)"
(cd "$R" && "$PY" -m pytest "$HERE/test_model_budget.py" -v -rA -s -p no:cacheprovider \
    --max-cuda-memory-dir "$R/snapshots" --junitxml "$R/junit.xml") 2>&1 | tee "$R/pytest.txt"
echo "pytest exit code: ${PIPESTATUS[0]} (1 expected: one test over budget)" | tee -a "$R/pytest.txt"
echo "== the over-budget test's snapshot, replayed by the wheel's vramroom"
for s in "$R"/snapshots/*.pickle; do
    [ -f "$s" ] || { echo "no snapshot written" | tee -a "$R/replay.txt"; break; }
    "${HR[@]}" replay "$s" --min-capacity 2>&1 | tee -a "$R/replay.txt"
    "$PY" -c 'import sys, vramroom; r = vramroom.replay(sys.argv[1]); print("vramroom.replay:", {k: r[k] for k in ("peak_allocated_bytes", "peak_reserved_bytes", "num_ooms")})' "$s" 2>&1 | tee -a "$R/replay.txt"
done
