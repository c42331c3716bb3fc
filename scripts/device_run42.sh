#!/usr/bin/env bash
# Device run 42. First cuDNN's own RNN workspace and reserve sizes (rnn/query_ws.py: checked
# against every config device run 41 measured, then one-dimension sweeps and random shapes),
# then the cuDNN RNN shapes the hp_* programs run that device run 41's grid lacks
# (rnn/harvest_prog.py -> rnn/configs_run42.json), each at the program's batch and length and
# at half of each, measured op by op (rnn/measure_rnn.py --configs). From the repository root:
#   COMMIT=abc1234 OUT=$OUT bash scripts/device_run42.sh
set -u
OUT=${OUT:-/tmp/run42}
mkdir -p "$OUT"
bash scripts/device_header.sh 42 > "$OUT/HEADER" 2>&1
echo "commit ${COMMIT:-?}" >> "$OUT/HEADER"
G=$(bash scripts/device_gpu_tag.sh)
cd scripts/trace_corpus
PYTHONUNBUFFERED=1 timeout 330 python3 rnn/query_ws.py "$OUT/cudnn-rnn-ws-$G-run42.json.xz" \
  --budget 150 --validate rnn/runs/rnn-h100-run41.json > "$OUT/query.log" 2>&1
cat "$OUT/query.log" | head -30
PYTHONUNBUFFERED=1 timeout 150 python3 rnn/measure_rnn.py "$OUT/rnn-$G-run42.json" --budget 110 \
  --configs rnn/configs_run42.json > "$OUT/run.log" 2>&1
tail -2 "$OUT/run.log"
