#!/usr/bin/env bash
# Device run 47 in one call: what the data-dependent ops allocate on inputs of known count
# (ops/measure.py --set run47: nonzero, masked_select, x[mask], unique, repeat_interleave,
# bincount), then the three hd_* programs recorded with record_real.py --all, after their
# blind predictions were committed (results/hd-predicted.md).
# From the repository root:   COMMIT=abc1234 OUT=$OUT bash scripts/device_run47.sh
set -u
OUT=${OUT:-/tmp/run47}
mkdir -p "$OUT"
bash scripts/device_header.sh 47 > "$OUT/HEADER" 2>&1
echo "commit ${COMMIT:-?}" >> "$OUT/HEADER"
cd scripts/trace_corpus
timeout 150 python3 ops/measure.py "$OUT/ops-h100-run47.json" --set run47 --budget 120 \
  > "$OUT/run.log" 2>&1
tail -3 "$OUT/run.log"
PROGS=$(cd programs && ls hd_*.py | sed 's/\.py$//' | paste -sd, -)
timeout 260 python3 record_real.py --all --out "$OUT/real47" --jobs 8 --budget 150 \
  --programs "$PROGS" > "$OUT/record.log" 2>&1
tail -14 "$OUT/record.log"
rm -rf "$OUT/real47/snaps" "$OUT/real47/logs"
find "$OUT" -type f | wc -l
