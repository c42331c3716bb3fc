#!/usr/bin/env bash
# A device run that measures conv configs the table lacks (conv/harvest_prog.py's output)
# with conv/measure.py; extra arguments go to measure.py (--channels-last, --dtypes, ...).
# Device runs 30 (channels_last), 33, 34 and 36 ran it. On the device, from the repository root:
#   COMMIT=abc1234 OUT=$OUT bash scripts/device_conv_run.sh RUN CONVS.json [MEASURE ARGS...]
#   (CONVS.json relative to scripts/trace_corpus, e.g. conv/convs_run36.json)
RUN=${1:?run number}
CONVS=${2:?conv configs}
shift 2
OUT=${OUT:-/tmp/run$RUN}
mkdir -p "$OUT"
bash scripts/device_header.sh "$RUN" > "$OUT/HEADER" 2>&1
echo "commit ${COMMIT:-?}" >> "$OUT/HEADER"
cd scripts/trace_corpus
timeout 200 python3 conv/measure.py "$CONVS" "$OUT/convs-h100-run$RUN.json" --budget 100 "$@" \
  > "$OUT/conv.log" 2>&1
tail -2 "$OUT/conv.log"
