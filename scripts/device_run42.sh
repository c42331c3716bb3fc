#!/usr/bin/env bash
# Device run 42: the cuDNN RNN shapes the hp_* programs run that device run 41's grid lacks
# (rnn/harvest_prog.py -> rnn/configs_run42.json), each at the program's batch and length and
# at half of each, measured op by op (rnn/measure_rnn.py --configs). From the repository root:
#   COMMIT=abc1234 OUT=$OUT bash scripts/device_run42.sh
set -u
OUT=${OUT:-/tmp/run42}
mkdir -p "$OUT"
bash scripts/device_header.sh 42 > "$OUT/HEADER" 2>&1
echo "commit ${COMMIT:-?}" >> "$OUT/HEADER"
cd scripts/trace_corpus
timeout 200 python3 rnn/measure_rnn.py "$OUT/rnn-h100-run42.json" --budget 150 \
  --configs rnn/configs_run42.json > "$OUT/run.log" 2>&1
tail -2 "$OUT/run.log"
