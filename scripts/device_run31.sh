#!/usr/bin/env bash
# Device run 31 (issue 30): the composite and copy ops the tracer models from the source
# (ops/composites.py: cdist, isinf, logsumexp of integers, int32 indexing, host-GPU copies
# into another layout or dtype, a custom backward's sum), recorded call by call.
# On the device, from the repository root:  COMMIT=abc1234 OUT=$OUT bash scripts/device_run31.sh
OUT=${OUT:-/tmp/run31}
mkdir -p "$OUT"
bash scripts/device_header.sh 31 > "$OUT/HEADER" 2>&1
echo "commit ${COMMIT:-?}" >> "$OUT/HEADER"
cd scripts/trace_corpus/ops
timeout 120 python3 composites.py --out "$OUT/composites-h100-run31.json" > "$OUT/composites.log" 2>&1
tail -3 "$OUT/composites.log"
