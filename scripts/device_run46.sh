#!/usr/bin/env bash
# Device run 46 in one call: the hm_* and hh_* programs' convs the table lacks
# (conv/convs_run46.json, harvest_prog.py), a TorchScript function's allocations call by call
# (ops/jit_fusion.py), cuFFT's transforms over a wider grid (fft/measure_fft.py: audio
# lengths, C2C stages of 4-d transforms), then the eight hm_* and two hh_* (cuFFT) programs recorded with
# record_real.py --all, after their blind predictions were committed (results/hm-predicted.md,
# results/hh-predicted.md).
# From the repository root:   COMMIT=abc1234 OUT=$OUT bash scripts/device_run46.sh
set -u
OUT=${OUT:-/tmp/run46}
mkdir -p "$OUT"
bash scripts/device_header.sh 46 > "$OUT/HEADER" 2>&1
echo "commit ${COMMIT:-?}" >> "$OUT/HEADER"
cd scripts/trace_corpus
timeout 160 python3 conv/measure.py conv/convs_run46.json "$OUT/convs-h100-run46.json" \
  --budget 130 > "$OUT/run.log" 2>&1
timeout 60 python3 ops/jit_fusion.py >> "$OUT/run.log" 2>&1
timeout 90 python3 fft/measure_fft.py "$OUT/fft-h100-run46.json" --budget 70 \
  >> "$OUT/run.log" 2>&1
tail -8 "$OUT/run.log"
PROGS=$(cd programs && ls hm_*.py hh_*.py | sed 's/\.py$//' | paste -sd, -)
timeout 260 python3 record_real.py --all --out "$OUT/real46" --jobs 8 --budget 150 \
  --programs "$PROGS" > "$OUT/record.log" 2>&1
tail -14 "$OUT/record.log"
rm -rf "$OUT/real46/snaps" "$OUT/real46/logs"
find "$OUT" -type f | wc -l
