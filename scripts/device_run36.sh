#!/usr/bin/env bash
# Device run 36 (issue 30): the 3 convs of the hw_* programs the measured table lacks
# (conv/convs_run36.json, harvest_prog.py: a denoiser.s in and out convs, an MAE patch embedding
# ), forward and backward, every dtype, batches 1 to 64.
# On the device, from the repository root:  COMMIT=abc1234 OUT=$OUT bash scripts/device_run36.sh
OUT=${OUT:-/tmp/run36}
mkdir -p "$OUT"
bash scripts/device_header.sh 36 > "$OUT/HEADER" 2>&1
echo "commit ${COMMIT:-?}" >> "$OUT/HEADER"
cd scripts/trace_corpus
timeout 150 python3 conv/measure.py conv/convs_run36.json "$OUT/convs-h100-run36.json" \
  --budget 100 > "$OUT/conv.log" 2>&1
tail -2 "$OUT/conv.log"
