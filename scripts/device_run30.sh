#!/usr/bin/env bash
# Device run 30 (issue 30): the channels_last fp16 convs of hy_tv_resnet50_train_amp_cl_fused
# (ResNet-50 at 192 x 192 under fp16 autocast), whose channels_last events the measured table
# lacked (conv/harvest_prog.py --channels-last: 23 convs), forward and backward, batches 1 to
# 64 and the program's 24.
# On the device, from the repository root:  COMMIT=abc1234 OUT=$OUT bash scripts/device_run30.sh
OUT=${OUT:-/tmp/run30}
mkdir -p "$OUT"
bash scripts/device_header.sh 30 > "$OUT/HEADER" 2>&1
echo "commit ${COMMIT:-?}" >> "$OUT/HEADER"
cd scripts/trace_corpus
timeout 200 python3 conv/measure.py conv/convs_run30_cl.json "$OUT/convs-cl-run30.json" \
  --channels-last --dtypes float16 --batches 1,2,4,8,16,24,32,64 --budget 150 > "$OUT/conv.log" 2>&1
tail -2 "$OUT/conv.log"
