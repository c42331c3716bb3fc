#!/usr/bin/env bash
# Per-kernel GPU time of Headroom's `--model fixtures/hf/NAME` forward beside transformers'
# (SDPA), with Nsight Compute, on the GPU machine (after `scripts/gpu-check.sh build`,
# devcarry/ carried). Each side runs the forward 1 and 3 times; the difference is two
# forwards, so weight initialization and input creation drop out. Prints the kernels by
# time per forward.
#
#   bash scripts/profile_hf.sh "gpt2 bfloat16 32 1024" ["gpt2 float32 8 512" ...]
set -uo pipefail
cd "$(dirname "$0")/.."
R=${OUT:-/tmp/headroom-prof}
mkdir -p "$R"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu"; exit 1; }
ncu_csv() { "$NCU" --metrics gpu__time_duration.sum --csv --clock-control none "$@"; }
diff_summary() {
  python3 - "$1" "$2" <<'PY'
import csv, sys, collections
def load(p):
    rows = list(csv.reader(open(p, errors="replace")))
    hdr, tot = None, collections.defaultdict(lambda: [0, 0.0])
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
        scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(d.get("Metric Unit", "ns"), 1e-3)
        k = d["Kernel Name"][:100]
        tot[k][0] += 1
        tot[k][1] += v * scale
    return tot
one, three = load(sys.argv[1]), load(sys.argv[2])
per = {k: ((c - one.get(k, [0, 0])[0]) / 2, (t - one.get(k, [0, 0.0])[1]) / 2) for k, (c, t) in three.items()}
per = {k: v for k, v in per.items() if v[0] > 0}
all_us = sum(t for _, t in per.values())
print("   per forward: %.1f us of kernels, %d launches" % (all_us, sum(c for c, _ in per.values())))
for k, (c, t) in sorted(per.items(), key=lambda x: -x[1][1])[:16]:
    print("   %9.1f us %5d  %s" % (t, c, k))
PY
}
for c in "$@"; do
  read -r name dtype b s <<<"$c"
  slug=$(echo "$c" | tr ' ' '_')
  echo "== $c: Headroom =="
  for n in 1 3; do
    ncu_csv devcarry/headroom loadtest --device cuda -n $n -c 1 --no-search --quiet --json --out "$R/o" \
      --model "fixtures/hf/$name" --dtype "$dtype" --batch "$b" --seq "$s" --no-cache \
      >"$R/hr_${slug}_$n.csv" 2>"$R/hr_${slug}_$n.err"
  done
  diff_summary "$R/hr_${slug}_1.csv" "$R/hr_${slug}_3.csv"
  echo "== $c: transformers =="
  for n in 1 3; do
    ncu_csv python3 scripts/profile_hf.py "$name" "$dtype" "$b" "$s" $n >"$R/pt_${slug}_$n.csv" 2>"$R/pt_${slug}_$n.err"
  done
  diff_summary "$R/pt_${slug}_1.csv" "$R/pt_${slug}_3.csv"
done
