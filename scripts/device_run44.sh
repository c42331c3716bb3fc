#!/usr/bin/env bash
# Device run 44: the four hg_* RNN programs recorded for real (record_real.py --all: default and
# expandable_segments, then the capacity sweep), after their blind predictions were committed
# (results/hg-predicted.md). Their shapes are in device run 43's segments only. From the
# repository root:   COMMIT=abc1234 OUT=$OUT bash scripts/device_run44.sh
set -u
OUT=${OUT:-/tmp/run44}
mkdir -p "$OUT"
bash scripts/device_header.sh 44 > "$OUT/HEADER" 2>&1
echo "commit ${COMMIT:-?}" >> "$OUT/HEADER"
cd scripts/trace_corpus
PROGS=$(cd programs && ls hg_*.py | sed 's/\.py$//' | paste -sd, -)
timeout 200 python3 record_real.py --all --out "$OUT/real44" --jobs 8 --budget 120 \
  --programs "$PROGS" > "$OUT/record.log" 2>&1
tail -12 "$OUT/record.log"
rm -rf "$OUT/real44/snaps" "$OUT/real44/logs"
find "$OUT" -type f | wc -l
