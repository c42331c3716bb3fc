#!/usr/bin/env bash
# Device run 27 (issue 30): isin, reductions over another dtype and cuDNN attention's forward
# workspace by query length (trace_corpus/ops/measure.py --set run27). On the device, from the
# repository root:
#   COMMIT=abc1234 OUT=$OUT bash scripts/device_run27.sh
# Writes $OUT/HEADER, $OUT/ops-h100-run27.json and the log.
OUT=${OUT:-/tmp/run27}
mkdir -p "$OUT"
mkdir -p devcarry && echo "${COMMIT:-?}" > devcarry/COMMIT
bash scripts/device_header.sh 27 > "$OUT/HEADER" 2>&1
(cd scripts/trace_corpus && timeout 400 python3 ops/measure.py "$OUT/ops-h100-run27.json" \
  --budget 300 --set run27) > "$OUT/ops.log" 2>&1
tail -3 "$OUT/ops.log"
ls -la "$OUT"
