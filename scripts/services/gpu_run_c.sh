#!/usr/bin/env bash
# Device run c (issue 19): for bert, gpt2 and resnet, each under its memory fraction, in
# parallel: `vramroom http --predict` from a gentle run (-c 1, a fixed request sequence),
# `vramroom http --ramp-until-oom` on a fresh service (stops at the first OOM), and an
# expandable_segments:True rerun of the same sequence (what-if peak reserved vs real).
# See collect_c.py for the steps.
#
#   bash scripts/services/gpu_run_c.sh            # on the H200: repo root, devcarry/vramroom
#   DRY=1 bash scripts/services/gpu_run_c.sh      # on CPU: syntax, flags, and the whole
#                                                 # pipeline against the torch-stub service
#
# VRAMROOM: the binary (default devcarry/vramroom). COMMIT names the commit in HEADER.
# OUT: where results land (the device tool sets it; DRY defaults to /tmp/gpu_run_c_dry).
# Results: $OUT/run_c.jsonl (one line per service: predicted, observed, agrees, expandable
# what-if vs real), $OUT/summary.txt, $OUT/<service>/{gentle,ramp,expandable}/results.json
# and report.html, $OUT/logs.tgz (service logs). Snapshots stay in /tmp (too big to return).
set -u
export PYTHONUNBUFFERED=1
HR=${VRAMROOM:-devcarry/vramroom}
DRY=${DRY:-0}
OUT=${OUT:-/tmp/gpu_run_c_out}
[ "$DRY" = 1 ] && OUT=${DRY_OUT:-/tmp/gpu_run_c_dry}
WORK=/tmp/run_c
rm -rf "$WORK"
mkdir -p "$OUT" "$WORK"
HERE=scripts/services

fail=0
# Checks that need neither a GPU nor torch: the script, the Python, the binary's flags.
bash -n "$0" || fail=1
python3 -m py_compile $HERE/common.py $HERE/collect_c.py $HERE/fake_service.py \
  $HERE/bert_encoder.py $HERE/gpt2_generate.py $HERE/resnet_batch.py python/vramroom/probe.py || fail=1
if [ ! -x "$HR" ]; then
  echo "no vramroom binary at $HR (set VRAMROOM=...)"; exit 2
fi
help=$("$HR" http --help 2>&1)
for f in --predict --target-concurrency --what-if --ramp-until-oom --step-duration \
         --predicted-from --metrics-url --seed --json --quiet --out --timeout -c -n -d -H -m; do
  grep -q -- "$f" <<<"$help" || { echo "vramroom http --help lacks $f"; fail=1; }
done
[ $fail = 0 ] || { echo "pre-flight checks failed"; exit 2; }
echo "pre-flight ok: $("$HR" --version 2>&1)"

{
  echo "commit ${COMMIT:-?}"
  nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"
  python3 -c "import torch; print('torch', torch.__version__)" 2>/dev/null || echo "no torch"
  date -u
} > "$OUT/HEADER"

if [ "$DRY" = 1 ]; then
  timeout 300 python3 $HERE/collect_c.py "$HR" "$WORK" --fake 2>&1 | tee "$OUT/summary.txt"
else
  timeout 580 python3 $HERE/collect_c.py "$HR" "$WORK" 2>&1 | tee "$OUT/summary.txt"
fi
echo "collect rc ${PIPESTATUS[0]}" | tee -a "$OUT/summary.txt"

cp "$WORK/run_c.jsonl" "$OUT/" 2>/dev/null
for d in "$WORK"/*/; do
  s=$(basename "$d")
  for step in gentle ramp expandable; do
    if [ -d "$d/$step" ]; then
      mkdir -p "$OUT/$s/$step"
      cp "$d/$step/results.json" "$d/$step/report.html" "$OUT/$s/$step/" 2>/dev/null
    fi
  done
done
tar czf "$OUT/logs.tgz" -C "$WORK" $(cd "$WORK" && ls -d */*.log 2>/dev/null) 2>/dev/null
ls -la "$OUT"
