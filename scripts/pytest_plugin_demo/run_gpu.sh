#!/usr/bin/env bash
# On the GPU machine (no network), from the repo root or anywhere: installs the headroom wheel
# from wheelhouse/ into a fresh venv that sees the system's torch, runs the demo tests with
# the plugin, and replays the over-budget test's snapshot with the wheel's `headroom`.
# Output under $OUT (default /tmp/headroom-pytest-demo): pytest.txt, junit.xml,
# snapshots/*.pickle, replay.txt.
set -uo pipefail
cd "$(dirname "$0")"
R=${OUT:-/tmp/headroom-pytest-demo}
mkdir -p "$R"
V=/tmp/headroom-demo-venv
rm -rf "$V"
python3 -m venv --system-site-packages "$V"
"$V/bin/python" -m pip install -q --no-index --find-links wheelhouse headroom pytest 2>&1 | tail -5
{
    echo "== machine"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1
    "$V/bin/python" -c 'import torch, headroom, pytest; print("torch", torch.__version__, "| headroom", headroom.__version__, headroom.__file__, "| pytest", pytest.__version__)'
    "$V/bin/headroom" --version
} 2>&1 | tee "$R/env.txt"
echo "== pytest (one test passes, one is over budget and fails: that is the demo)"
(cd "$R" && "$V/bin/python" -m pytest "$OLDPWD/test_model_budget.py" -v -rA -s -p no:cacheprovider \
    --max-cuda-memory-dir "$R/snapshots" --junitxml "$R/junit.xml") 2>&1 | tee "$R/pytest.txt"
echo "pytest exit code: ${PIPESTATUS[0]}" | tee -a "$R/pytest.txt"
echo "== the over-budget test's snapshot, replayed by the wheel's headroom"
for s in "$R"/snapshots/*.pickle; do
    [ -f "$s" ] || { echo "no snapshot written"; break; }
    "$V/bin/headroom" replay "$s" --min-capacity 2>&1 | tee -a "$R/replay.txt"
    "$V/bin/python" -c 'import sys, headroom; r = headroom.replay(sys.argv[1]); print("headroom.replay: peak_allocated_bytes", r["peak_allocated_bytes"], "peak_reserved_bytes", r["peak_reserved_bytes"])' "$s" 2>&1 | tee -a "$R/replay.txt"
done
