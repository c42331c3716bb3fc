#!/usr/bin/env bash
# The facts a device run's HEADER starts with: which run, at which commit, on which card and
# software. Used by the device_run*.sh scripts.   bash scripts/device_header.sh RUN_NAME
C=$(cat devcarry/COMMIT 2>/dev/null || echo '?')
echo "device run ${1:-?} at commit $C"
nvidia-smi -L 2>/dev/null
python3 -c "import torch, torchvision, transformers; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'transformers', transformers.__version__, 'cudnn', torch.backends.cudnn.version())"
echo "cores $(nproc)"; date -u
