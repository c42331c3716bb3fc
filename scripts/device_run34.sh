#!/usr/bin/env bash
# Device run 34 (issue 30): the TCN's first Conv1d (on data: its input needs no grad) with
# convolution_backward's weight-only mask, which the table lacked (conv/convs_run34.json).
# On the device, from the repository root:  COMMIT=abc1234 OUT=$OUT bash scripts/device_run34.sh
OUT=${OUT:-/tmp/run34}
mkdir -p "$OUT"
bash scripts/device_header.sh 34 > "$OUT/HEADER" 2>&1
echo "commit ${COMMIT:-?}" >> "$OUT/HEADER"
cd scripts/trace_corpus
timeout 100 python3 conv/measure.py conv/convs_run34.json "$OUT/convs-h100-run34.json" \
  --budget 60 > "$OUT/conv.log" 2>&1
tail -2 "$OUT/conv.log"
