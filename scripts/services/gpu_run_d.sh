#!/usr/bin/env bash
# Device run d (issue 32): a corpus of nine PyTorch services, all at once on the one GPU, each
# under its own memory cap (1-4 GiB, sized by a calibration step): per service a gentle
# `vramroom http --predict -c 1`, three `--ramp-until-oom` ramps on fresh services, one ramp
# restarted under the other allocator config (the what-if), and a ramp with the size cap.
# See collect_d.py for the steps, the step durations and the verdicts.
#
#   COMMIT=<sha> bash scripts/services/gpu_run_d.sh   # on the GPU: repo root, devcarry/vramroom
#   DRY=1 bash scripts/services/gpu_run_d.sh          # on CPU: pre-flight, then the whole
#                                                     # pipeline against the torch-stub service
#
# VRAMROOM: the binary (default devcarry/vramroom). COMMIT names the commit in HEADER. The
# probe runs from the checkout (PYTHONPATH=python; no wheel needed).
# OUT: where results land (the device tool sets it; DRY defaults to /tmp/gpu_run_d_dry).
# Results, written as they land: $OUT/HEADER, $OUT/run_d.jsonl (one line per service, rewritten
# after every step), $OUT/summary.txt, $OUT/results.tgz (per service and step: results.json,
# record.json), $OUT/logs.tgz (service logs), $OUT/gentle.tar.xz (the gentle runs' probe
# snapshots, frames stripped, with their results.json: see pack_gentle.py). Reports stay in /tmp.
# Wall time: pre-flight under a minute (torch's import); collect_d.py stops starting steps at
# 440 s per service (a step in flight is interrupted: each pipeline ends by ~475 s) and writes
# everything by 490 s; it is killed at 505 s; the tarballs follow: under 9 minutes in all.
set -u
export PYTHONUNBUFFERED=1
export PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH}
HR=${VRAMROOM:-devcarry/vramroom}
DRY=${DRY:-0}
OUT=${OUT:-/tmp/gpu_run_d_out}
[ "$DRY" = 1 ] && OUT=${DRY_OUT:-/tmp/gpu_run_d_dry}
WORK=/tmp/run_d
rm -rf "$WORK"
mkdir -p "$OUT" "$WORK"
HERE=scripts/services
T0=$(date +%s)

fail=0
# Checks that need neither a GPU nor torch: the script, the Python, the binary's flags.
bash -n "$0" || fail=1
python3 -m py_compile $HERE/common.py $HERE/collect_d.py $HERE/fake_service.py \
  $HERE/bert_encoder.py $HERE/resnet_batch.py $HERE/gpt2_generate.py $HERE/llama_generate.py \
  $HERE/batcher_encoder.py $HERE/gpt2_score_expandable.py $HERE/encoder_empty_cache.py \
  $HERE/two_models.py python/vramroom/probe.py || fail=1
if [ ! -x "$HR" ]; then
  echo "no vramroom binary at $HR (set VRAMROOM=...)"; exit 2
fi
HR=$(cd "$(dirname "$HR")" && pwd)/$(basename "$HR")
help=$("$HR" http --help 2>&1)
for f in --predict --target-concurrency --what-if --ramp-until-oom --step-duration --stages \
         --predicted-from --metrics-url --no-probe --seed --json --quiet --out --timeout -c -n -d -H -m; do
  grep -q -- "$f" <<<"$help" || { echo "vramroom http --help lacks $f"; fail=1; }
done
python3 -c "import vramroom.probe" || { echo "python/vramroom/probe.py does not import"; fail=1; }
if [ "$DRY" != 1 ]; then
  timeout 60 python3 -c "import torch, torchvision, transformers; assert torch.cuda.is_available(); \
print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'transformers', transformers.__version__)" \
    || { echo "torch/torchvision/transformers or CUDA missing"; fail=1; }
fi
[ $fail = 0 ] || { echo "pre-flight checks failed"; exit 2; }
echo "pre-flight ok: $("$HR" --version 2>&1)"

{
  echo "commit ${COMMIT:-?}"
  echo "run d (issue 32), $( [ "$DRY" = 1 ] && echo 'DRY: torch stub' || echo 'GPU')"
  nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" 2>/dev/null || echo "no torch"
  "$HR" --version 2>&1
  echo "cores $(nproc)"
  date -u
} > "$OUT/HEADER"

if [ "$DRY" = 1 ]; then
  timeout -k 5 505 python3 $HERE/collect_d.py "$HR" "$WORK" "$OUT" --fake 2>&1 | tee "$OUT/summary.txt"
else
  timeout -k 5 505 python3 $HERE/collect_d.py "$HR" "$WORK" "$OUT" ${ONLY:+--only $ONLY} 2>&1 | tee "$OUT/summary.txt"
fi
echo "collect rc ${PIPESTATUS[0]}, $(( $(date +%s) - T0 )) s" | tee -a "$OUT/summary.txt"
# Services a killed collector left behind (they were started in sessions of their own).
if [ -f "$WORK/pids" ]; then
  while read -r pid; do kill -KILL -- "-$pid" 2>/dev/null; done < "$WORK/pids"
fi

(cd "$WORK" && find . -name results.json -o -name record.json | sort > /tmp/run_d_results.list
 tar czf "$OUT/results.tgz" -T /tmp/run_d_results.list 2>/dev/null
 find . -name '*.log' | sort > /tmp/run_d_logs.list
 tar czf "$OUT/logs.tgz" -T /tmp/run_d_logs.list 2>/dev/null)
# The gentle runs' probe snapshots, frames stripped: predictions can be recomputed from them.
python3 $HERE/pack_gentle.py "$WORK" "$OUT/gentle.tar.xz" || echo "pack_gentle failed"
ls -la "$OUT"
echo "done in $(( $(date +%s) - T0 )) s"
