#!/usr/bin/env bash
# Device run 17: issue 32's service corpus again, live at the batcher fix (a service whose one
# worker thread runs every request), with up to five ramp lanes (so llama's three ramps fit),
# keeping the gentle runs' probe snapshots, with the probe's thread
# and worker tags; beside it, issue 30's per-rank check (ranks_real.py: DDP and FSDP2 ranks
# at world sizes 2, 4, 8 on the fake process group, one real GPU) and more of the resolution
# convs (conv/measure.py from config 1052 of convs_res.json). Memory is per process, so one
# does not change another's numbers; only their timings share the cores.
#
#   bash scripts/device_run17.sh      # on the GPU, repo root; devcarry/{vramroom,COMMIT}
#
# $OUT (8 files): svc/{HEADER,run_d.jsonl,summary.txt,results.tgz,logs.tgz,gentle.tar.xz},
# conv_res_events.json, corpus17.tgz (HEADER, ranks.jsonl, ranks_snaps.tar.xz, ranks.log,
# conv.log). Under 9 minutes.
set -u
export PYTHONUNBUFFERED=1
C=$(cat devcarry/COMMIT 2>/dev/null || echo '?')
OUT=${OUT:-/tmp/run17}
CORP=/tmp/corp17
rm -rf "$CORP"; mkdir -p "$OUT/svc" "$CORP"
{
  echo "device run 17 at commit $C"
  nvidia-smi -L 2>/dev/null
  python3 -c "import torch, torchvision, transformers; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'transformers', transformers.__version__, 'cudnn', torch.backends.cudnn.version())"
  echo "cores $(nproc)"; date -u
} > "$CORP/HEADER" 2>&1
(OUT=$OUT/svc COMMIT=$C VRAMROOM=devcarry/vramroom RUN_D_BUDGET_S=400 RUN_D_DEADLINE_S=450 \
   bash scripts/services/gpu_run_d.sh > /tmp/svc.log 2>&1) & S=$!
(cd scripts/trace_corpus && timeout 300 python3 ranks_real.py --out "$CORP/ranks" --budget 200 \
   > "$CORP/ranks.log" 2>&1) & R=$!
(cd scripts/trace_corpus && timeout 470 python3 conv/measure.py conv/convs_res.json \
   "$OUT/conv_res_events.json" --skip 1052 --budget 400 > "$CORP/conv.log" 2>&1) & M=$!
wait $R
cp "$CORP/ranks/ranks.jsonl" "$CORP/ranks/ranks_snaps.tar.xz" "$CORP/" 2>/dev/null
wait $M
tar czf "$OUT/corpus17.tgz" -C "$CORP" HEADER ranks.jsonl ranks_snaps.tar.xz ranks.log conv.log 2>/dev/null
wait $S
cat "$CORP/HEADER"; cat "$CORP/ranks.log"; tail -3 "$CORP/conv.log"; tail -45 /tmp/svc.log
ls -la "$OUT" "$OUT/svc"
