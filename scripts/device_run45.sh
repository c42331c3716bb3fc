#!/usr/bin/env bash
# Device run 45 in one call: the hk_* programs' 27 convs the table lacks
# (conv/convs_run45.json, harvest_prog.py), cuFFT's transforms call by call
# (fft/measure_fft.py), then the nine hk_* programs recorded with
# record_real.py --all, after their blind predictions were committed (results/hk-predicted.md).
# From the repository root:   COMMIT=abc1234 OUT=$OUT bash scripts/device_run45.sh
set -u
OUT=${OUT:-/tmp/run45}
mkdir -p "$OUT"
bash scripts/device_header.sh 45 > "$OUT/HEADER" 2>&1
echo "commit ${COMMIT:-?}" >> "$OUT/HEADER"
cd scripts/trace_corpus
timeout 160 python3 conv/measure.py conv/convs_run45.json "$OUT/convs-h100-run45.json" \
  --budget 130 > "$OUT/run.log" 2>&1
timeout 120 python3 fft/measure_fft.py "$OUT/fft-h100-run45.json" --budget 90 \
  >> "$OUT/run.log" 2>&1
tail -4 "$OUT/run.log"
PROGS=$(cd programs && ls hk_*.py | sed 's/\.py$//' | paste -sd, -)
timeout 260 python3 record_real.py --all --out "$OUT/real45" --jobs 8 --budget 150 \
  --programs "$PROGS" > "$OUT/record.log" 2>&1
tail -14 "$OUT/record.log"
rm -rf "$OUT/real45/snaps" "$OUT/real45/logs"
find "$OUT" -type f | wc -l
