#!/usr/bin/env bash
# Per-kernel GPU time of Vramroom's `--model fixtures/hf/NAME` forward beside transformers'
# (SDPA), with Nsight Compute, on the GPU machine (after `scripts/gpu-check.sh build`,
# devcarry/ carried). Each side runs the forward 1 and 3 times; the difference is two
# forwards, so weight initialization and input creation drop out. Prints the kernels by
# time per forward.
#
#   bash scripts/profile_hf.sh "gpt2 bfloat16 32 1024" ["gpt2 float32 8 512" ...]
#   VRAMROOM_ONLY=1 bash scripts/profile_hf.sh ...   # Vramroom's side only (transformers'
#                                                    # quicker: scripts/torch_kernels.py)
set -uo pipefail
cd "$(dirname "$0")/.."
R=${OUT:-/tmp/vramroom-prof}
mkdir -p "$R"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu"; exit 1; }
ncu_csv() { "$NCU" --metrics gpu__time_duration.sum --csv --clock-control none "$@"; }
diff_summary() { python3 scripts/ncu_summary.py "$1" "$2"; }
for c in "$@"; do
  read -r name dtype b s <<<"$c"
  slug=$(echo "$c" | tr ' ' '_')
  echo "== $c: Vramroom =="
  for n in 1 3; do
    ncu_csv devcarry/vramroom loadtest --device cuda -n $n -c 1 --no-search --quiet --json --out "$R/o" \
      --model "fixtures/hf/$name" --dtype "$dtype" --batch "$b" --seq "$s" --no-cache \
      >"$R/hr_${slug}_$n.csv" 2>"$R/hr_${slug}_$n.err"
  done
  diff_summary "$R/hr_${slug}_1.csv" "$R/hr_${slug}_3.csv"
  [ "${VRAMROOM_ONLY:-}" = 1 ] && continue
  echo "== $c: transformers =="
  for n in 1 3; do
    ncu_csv python3 scripts/profile_hf.py "$name" "$dtype" "$b" "$s" $n >"$R/pt_${slug}_$n.csv" 2>"$R/pt_${slug}_$n.err"
  done
  diff_summary "$R/pt_${slug}_1.csv" "$R/pt_${slug}_3.csv"
done
