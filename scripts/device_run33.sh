#!/usr/bin/env bash
# Device run 33 (issue 30): the 9 convs of the hz_* programs the measured table lacks
# (conv/convs_run33.json, harvest_prog.py: a segmentation decoder's 3x3 and 1x1 convs, a TCN's
# dilated Conv1d), forward and backward, every dtype, batches 1 to 64.
# On the device, from the repository root:  COMMIT=abc1234 OUT=$OUT bash scripts/device_run33.sh
OUT=${OUT:-/tmp/run33}
mkdir -p "$OUT"
bash scripts/device_header.sh 33 > "$OUT/HEADER" 2>&1
echo "commit ${COMMIT:-?}" >> "$OUT/HEADER"
cd scripts/trace_corpus
timeout 150 python3 conv/measure.py conv/convs_run33.json "$OUT/convs-h100-run33.json" \
  --budget 100 > "$OUT/conv.log" 2>&1
tail -2 "$OUT/conv.log"
