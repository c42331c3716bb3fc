#!/usr/bin/env bash
# Per-kernel GPU time of one `vramroom bench models` case and of PyTorch's same case, with
# Nsight Compute (ncu), on the GPU machine (after `scripts/gpu-check.sh build`, devcarry/
# carried). Prints, for each side, the kernels by total time.
#
#   bash scripts/profile_gpu.sh "resnet50 bf16 bs1 infer" ["gpt2 bf16 8x512 infer" ...]
set -uo pipefail
cd "$(dirname "$0")/.."
R=${OUT:-/tmp/vramroom-prof}
mkdir -p "$R"
VRAMROOM_PYTHON_SITE=$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null)
export VRAMROOM_PYTHON_SITE VRAMROOM_CACHE_DIR=/tmp/vramroom-cache
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu"; exit 1; }
summarize() { python3 scripts/ncu_summary.py "$1"; }
for c in "$@"; do
  slug=$(echo "$c" | tr ' +' '__')
  echo "== $c: Vramroom (one timed iteration after one warm-up; all kernels of the run) =="
  $NCU --metrics gpu__time_duration.sum --csv --clock-control none \
    devcarry/vramroom bench models --case "$c" --iters 1 --warmup 1 --no-predict >"$R/hr_$slug.csv" 2>"$R/hr_$slug.err"
  summarize "$R/hr_$slug.csv"
  echo "== $c: PyTorch =="
  $NCU --metrics gpu__time_duration.sum --csv --clock-control none \
    python3 scripts/torch_models_bench.py /tmp/t.jsonl --iters 1 --warmup 1 --case "$c" >"$R/pt_$slug.csv" 2>"$R/pt_$slug.err"
  summarize "$R/pt_$slug.csv"
done
