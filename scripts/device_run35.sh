#!/usr/bin/env bash
# Device run 35 (issue 30): the four hw_* programs written after run 34 (their predictions
# are committed first: results/hw-predicted.md), recorded as the corpus is
# (record_real.py --all: default, expandable, capacity sweep).
# On the device, from the repository root:  COMMIT=abc1234 OUT=$OUT bash scripts/device_run35.sh
OUT=${OUT:-/tmp/run35}
mkdir -p "$OUT"
bash scripts/device_header.sh 35 > "$OUT/HEADER" 2>&1
echo "commit ${COMMIT:-?}" >> "$OUT/HEADER"
REC_BUDGET=${REC_BUDGET:-150}
PROGS=$(cd scripts/trace_corpus/programs && ls hw_*.py | sed 's/\.py$//' | paste -sd, -)
cd scripts/trace_corpus
timeout $((REC_BUDGET + 90)) python3 record_real.py --all --out "$OUT/real35" --jobs 6 \
  --budget "$REC_BUDGET" --programs "$PROGS" > "$OUT/record.log" 2>&1
tail -12 "$OUT/record.log"
rm -rf "$OUT/real35/snaps"
