#!/usr/bin/env bash
# The card's short name for a device run's file names (h100, h200; "gpu" when nvidia-smi does
# not say). Used by the device_run*.sh scripts:   G=$(bash scripts/device_gpu_tag.sh)
G=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -o "H[0-9][0-9]*" | head -1 | tr A-Z a-z)
echo "${G:-gpu}"
