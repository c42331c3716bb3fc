#!/usr/bin/env bash
# Device run 39 in one call: the hu_* programs recorded (device_record_run.sh), their 14 convs
# the table lacks (conv/convs_run39.json) and ConvNeXt-Tiny's NHWC-input convs
# (conv/convs_run38_cli.json, planned as run 38) measured. From the repository root:
#   COMMIT=abc1234 OUT=$OUT bash scripts/device_run39.sh
# It wrote nine files and the device tool brings back eight: the recording's snaps.tar.xz stayed
# behind, so the recording ran again alone (device_record_run.sh 39 hu, five files).
set -u
OUT=${OUT:-/tmp/run39}
OUT=$OUT bash scripts/device_conv_run.sh 39 conv/convs_run39.json
mkdir -p "$OUT/cli" && OUT=$OUT/cli bash scripts/device_conv_run.sh 38 conv/convs_run38_cli.json \
  --channels-last-input --dtypes bfloat16
OUT=$OUT bash scripts/device_record_run.sh 39 hu
