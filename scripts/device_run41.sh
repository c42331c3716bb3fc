#!/usr/bin/env bash
# Device run 41 in one call, eight files back (the device tool's limit): cuDNN RNNs and CTC
# measured op by op (rnn/measure_rnn.py), the CRNN's four convs the table lacks
# (conv/convs_run41.json), and the hp_* programs (LSTM, GRU, RNN, CTC) recorded with
# record_real.py --all. From the repository root:
#   COMMIT=abc1234 OUT=$OUT bash scripts/device_run41.sh
set -u
OUT=${OUT:-/tmp/run41}
mkdir -p "$OUT"
bash scripts/device_header.sh 41 > "$OUT/HEADER" 2>&1
echo "commit ${COMMIT:-?}" >> "$OUT/HEADER"
cd scripts/trace_corpus
timeout 260 python3 rnn/measure_rnn.py "$OUT/rnn-h100-run41.json" --budget 150 \
  > "$OUT/run.log" 2>&1
timeout 60 python3 conv/measure.py conv/convs_run41.json "$OUT/convs-h100-run41.json" \
  --budget 40 >> "$OUT/run.log" 2>&1
tail -3 "$OUT/run.log"
PROGS=$(cd programs && ls hp_*.py | sed 's/\.py$//' | paste -sd, -)
timeout 230 python3 record_real.py --all --out "$OUT/real41" --jobs 6 --budget 140 \
  --programs "$PROGS" > "$OUT/record.log" 2>&1
tail -12 "$OUT/record.log"
rm -rf "$OUT/real41/snaps" "$OUT/real41/logs"
find "$OUT" -type f | wc -l
