#!/usr/bin/env bash
# A device run that records corpus programs (record_real.py --all: default, expandable,
# capacity sweep) whose predictions are committed first (results/PREFIX-predicted.md).
# Device runs 32 (hz_*) and 35 (hw_*) ran it. On the device, from the repository root:
#   COMMIT=abc1234 OUT=$OUT bash scripts/device_record_run.sh RUN PREFIX
#   (RUN: the run's number, which names $OUT/realRUN; PREFIX: the programs' prefix, e.g. hw)
RUN=${1:?run number}
PREFIX=${2:?program prefix}
OUT=${OUT:-/tmp/run$RUN}
mkdir -p "$OUT"
bash scripts/device_header.sh "$RUN" > "$OUT/HEADER" 2>&1
echo "commit ${COMMIT:-?}" >> "$OUT/HEADER"
REC_BUDGET=${REC_BUDGET:-150}
PROGS=$(cd scripts/trace_corpus/programs && ls "${PREFIX}"_*.py | sed 's/\.py$//' | paste -sd, -)
cd scripts/trace_corpus
timeout $((REC_BUDGET + 90)) python3 record_real.py --all --out "$OUT/real$RUN" --jobs 6 \
  --budget "$REC_BUDGET" --programs "$PROGS" > "$OUT/record.log" 2>&1
tail -12 "$OUT/record.log"
rm -rf "$OUT/real$RUN/snaps"
