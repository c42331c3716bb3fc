#!/usr/bin/env bash
# Device run 40 in one call, eight files back (the device tool's limit): the ht_* programs
# recorded (record_real.py --all, as device_record_run.sh), their 27 convs the table lacks
# (conv/convs_run40.json) and two convs the table holds only at smaller batches than
# hu_wgan_gp_double_backward runs (conv/convs_run40_beyond.json, harvest_prog.py --beyond)
# measured. From the repository root:
#   COMMIT=abc1234 OUT=$OUT bash scripts/device_run40.sh
set -u
OUT=${OUT:-/tmp/run40}
mkdir -p "$OUT"
bash scripts/device_header.sh 40 > "$OUT/HEADER" 2>&1
echo "commit ${COMMIT:-?}" >> "$OUT/HEADER"
cd scripts/trace_corpus
timeout 200 python3 conv/measure.py conv/convs_run40.json "$OUT/convs-h100-run40.json" \
  --budget 120 > "$OUT/conv.log" 2>&1
timeout 100 python3 conv/measure.py conv/convs_run40_beyond.json \
  "$OUT/convs-beyond-h100-run40.json" --budget 60 >> "$OUT/conv.log" 2>&1
tail -3 "$OUT/conv.log"
PROGS=$(cd programs && ls ht_*.py | sed 's/\.py$//' | paste -sd, -)
timeout 240 python3 record_real.py --all --out "$OUT/real40" --jobs 6 --budget 150 \
  --programs "$PROGS" > "$OUT/record.log" 2>&1
tail -10 "$OUT/record.log"
rm -rf "$OUT/real40/snaps" "$OUT/real40/logs"
find "$OUT" -type f | wc -l
