#!/usr/bin/env bash
# Device runs 16 and 17: issue 32's service corpus again, keeping the gentle runs' probe
# snapshots (so a prediction can be recomputed without the GPU) and with the probe's thread
# and worker tags; beside it, issue 30's per-rank check (ranks_real.py: DDP and FSDP2 ranks
# at world sizes 2, 4, 8 on the fake process group, one real GPU) and more of the resolution
# convs (conv/measure.py from config CONV_SKIP of convs_res.json). Memory is per process, so
# one does not change another's numbers; only their timings share the cores.
#
#   bash scripts/device_run16.sh                        # run 16: convs from 332
#   RUN=17 CONV_SKIP=1052 bash scripts/device_run16.sh  # run 17 (its own device_run17.sh at
#                                                       # commit cd59823 said the same)
#   SIDE=embbwd RUN=20 CONV_SKIP=2547 bash scripts/device_run16.sh
#       # run 20: the embedding backward's allocations (embbwd/measure.py) instead of the
#       # ranks (its own device_run20.sh at commit f75ad83 said the same)
# On the GPU, repo root; devcarry/{vramroom,COMMIT}.
#
# $OUT (8 files): svc/{HEADER,run_d.jsonl,summary.txt,results.tgz,logs.tgz,gentle.tar.xz},
# conv_res_events.json, corpus$RUN.tgz (HEADER, ranks.jsonl, ranks_snaps.tar.xz, ranks.log,
# conv.log). Under 9 minutes.
set -u
export PYTHONUNBUFFERED=1
C=$(cat devcarry/COMMIT 2>/dev/null || echo '?')
RUN=${RUN:-16}
CONV_SKIP=${CONV_SKIP:-332}
OUT=${OUT:-/tmp/run$RUN}
CORP=/tmp/corp$RUN
rm -rf "$CORP"; mkdir -p "$OUT/svc" "$CORP"
bash scripts/device_header.sh "$RUN" > "$CORP/HEADER" 2>&1
(OUT=$OUT/svc COMMIT=$C VRAMROOM=devcarry/vramroom RUN_D_BUDGET_S=400 RUN_D_DEADLINE_S=450 \
   bash scripts/services/gpu_run_d.sh > /tmp/svc.log 2>&1) & S=$!
SIDE=${SIDE:-ranks}
if [ "$SIDE" = embbwd ]; then
  (cd scripts/trace_corpus && timeout 200 python3 embbwd/measure.py "$CORP/embbwd.json" \
     --budget 150 > "$CORP/embbwd.log" 2>&1) & R=$!
  KEEP="embbwd.json embbwd.log"
else
  (cd scripts/trace_corpus && timeout 300 python3 ranks_real.py --out "$CORP/ranks" --budget 200 \
     > "$CORP/ranks.log" 2>&1) & R=$!
  KEEP="ranks.jsonl ranks_snaps.tar.xz ranks.log"
fi
(cd scripts/trace_corpus && timeout 470 python3 conv/measure.py conv/convs_res.json \
   "$OUT/conv_res_events.json" --skip "$CONV_SKIP" --budget 400 > "$CORP/conv.log" 2>&1) & M=$!
wait $R
cp "$CORP/ranks/ranks.jsonl" "$CORP/ranks/ranks_snaps.tar.xz" "$CORP/" 2>/dev/null
wait $M
# shellcheck disable=SC2086
tar czf "$OUT/corpus$RUN.tgz" -C "$CORP" HEADER $KEEP conv.log 2>/dev/null
wait $S
cat "$CORP/HEADER"; cat "$CORP/ranks.log" "$CORP/embbwd.log" 2>/dev/null; tail -3 "$CORP/conv.log"; tail -45 /tmp/svc.log
ls -la "$OUT" "$OUT/svc"
