#!/usr/bin/env bash
# Per-kernel GPU time of one `headroom bench models` case and of PyTorch's same case, with
# Nsight Compute (ncu), on the GPU machine (after `scripts/gpu-check.sh build`, devcarry/
# carried). Prints, for each side, the kernels by total time.
#
#   bash scripts/profile_gpu.sh "resnet50 bf16 bs1 infer" ["gpt2 bf16 8x512 infer" ...]
set -uo pipefail
cd "$(dirname "$0")/.."
R=${OUT:-/tmp/headroom-prof}
mkdir -p "$R"
HEADROOM_PYTHON_SITE=$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null)
export HEADROOM_PYTHON_SITE HEADROOM_CACHE_DIR=/tmp/headroom-cache
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu"; exit 1; }
summarize() {
  python3 - "$1" <<'PY'
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
hdr = None
tot = collections.defaultdict(lambda: [0, 0.0])
for r in rows:
    if "Kernel Name" in r and "Metric Value" in r:
        hdr = r
        continue
    if hdr is None or len(r) != len(hdr):
        continue
    d = dict(zip(hdr, r))
    if d.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(d["Metric Value"].replace(",", ""))
    unit = d.get("Metric Unit", "ns")
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(unit, 1e-3)
    k = d["Kernel Name"][:90]
    tot[k][0] += 1
    tot[k][1] += v * scale
all_us = sum(t for _, t in tot.values())
print("   total %.1f us in %d kernels" % (all_us, sum(c for c, _ in tot.values())))
for k, (c, t) in sorted(tot.items(), key=lambda x: -x[1][1])[:14]:
    print("   %9.1f us %5d  %s" % (t, c, k))
PY
}
for c in "$@"; do
  slug=$(echo "$c" | tr ' +' '__')
  echo "== $c: Headroom (one timed iteration after one warm-up; all kernels of the run) =="
  $NCU --metrics gpu__time_duration.sum --csv --clock-control none \
    devcarry/headroom bench models --case "$c" --iters 1 --warmup 1 --no-predict >"$R/hr_$slug.csv" 2>"$R/hr_$slug.err"
  summarize "$R/hr_$slug.csv"
  echo "== $c: PyTorch =="
  $NCU --metrics gpu__time_duration.sum --csv --clock-control none \
    python3 scripts/torch_models_bench.py /tmp/t.jsonl --iters 1 --warmup 1 --case "$c" >"$R/pt_$slug.csv" 2>"$R/pt_$slug.err"
  summarize "$R/pt_$slug.csv"
done
