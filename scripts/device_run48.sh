#!/usr/bin/env bash
# Device run 48 in one call: the two hm_* convs the table lacked after run 46 — the patch
# embedding at the batch hm_clip_grad_param_groups_amsgrad runs (128, beyond the table's 64:
# conv/convs_run48_beyond.json, harvest_prog.py --beyond) and ResNet-18's channels_last bf16
# convs of hm_resnet18_mixup_ls_160_cl (conv/convs_run48_cl.json, harvest_prog.py
# --channels-last).
# From the repository root:   COMMIT=abc1234 OUT=$OUT bash scripts/device_run48.sh
set -u
OUT=${OUT:-/tmp/run48}
mkdir -p "$OUT"
bash scripts/device_header.sh 48 > "$OUT/HEADER" 2>&1
echo "commit ${COMMIT:-?}" >> "$OUT/HEADER"
cd scripts/trace_corpus
timeout 100 python3 conv/measure.py conv/convs_run48_beyond.json "$OUT/convs-beyond-h100-run48.json" \
  --budget 60 > "$OUT/run.log" 2>&1
timeout 200 python3 conv/measure.py conv/convs_run48_cl.json "$OUT/convs-cl-h100-run48.json" \
  --channels-last --dtypes bfloat16 --budget 150 >> "$OUT/run.log" 2>&1
cat "$OUT/run.log" | tail -4
