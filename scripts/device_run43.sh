#!/usr/bin/env bash
# Device run 43: cuDNN's RNN workspaces for common shapes at every batch and length up to 512
# steps, as checked segments (rnn/segments.py), for the tracer's RNN table. From the repository
# root:   COMMIT=abc1234 OUT=$OUT bash scripts/device_run43.sh
set -u
OUT=${OUT:-/tmp/run43}
mkdir -p "$OUT"
bash scripts/device_header.sh 43 > "$OUT/HEADER" 2>&1
echo "commit ${COMMIT:-?}" >> "$OUT/HEADER"
G=$(bash scripts/device_gpu_tag.sh)
cd scripts/trace_corpus
PYTHONUNBUFFERED=1 timeout 300 python3 rnn/segments.py "$OUT/rnn-segments-$G-run43.json" \
  --budget 200 > "$OUT/segments.log" 2>&1
cat "$OUT/segments.log"
