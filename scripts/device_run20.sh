#!/usr/bin/env bash
# Device run 20: issue 32's service corpus with the staggered replay and the per-thread cuBLAS
# workspaces (concurrency.rs), live; beside it, issue 30's last resolution convs
# (conv/measure.py from CONV_SKIP) and the embedding backward's temporaries (embbwd/measure.py).
# Memory is per process, so one does not change another's numbers; only timings share cores.
#
#   bash scripts/device_run20.sh     # on the GPU, repo root; devcarry/{vramroom,COMMIT}
#
# $OUT (8 files): svc/{HEADER,run_d.jsonl,summary.txt,results.tgz,logs.tgz,gentle.tar.xz},
# conv_res_events.json, corpus20.tgz (HEADER, conv.log, embbwd.json, embbwd.log). Under 9 min.
set -u
export PYTHONUNBUFFERED=1
C=$(cat devcarry/COMMIT 2>/dev/null || echo '?')
RUN=${RUN:-20}
CONV_SKIP=${CONV_SKIP:-2547}
OUT=${OUT:-/tmp/run$RUN}
CORP=/tmp/corp$RUN
rm -rf "$CORP"; mkdir -p "$OUT/svc" "$CORP"
bash scripts/device_header.sh "$RUN" > "$CORP/HEADER" 2>&1
(OUT=$OUT/svc COMMIT=$C VRAMROOM=devcarry/vramroom RUN_D_BUDGET_S=400 RUN_D_DEADLINE_S=450 \
   bash scripts/services/gpu_run_d.sh > /tmp/svc.log 2>&1) & S=$!
(cd scripts/trace_corpus && timeout 200 python3 embbwd/measure.py "$CORP/embbwd.json" \
   --budget 150 > "$CORP/embbwd.log" 2>&1) & E=$!
(cd scripts/trace_corpus && timeout 470 python3 conv/measure.py conv/convs_res.json \
   "$OUT/conv_res_events.json" --skip "$CONV_SKIP" --budget 400 > "$CORP/conv.log" 2>&1) & M=$!
wait $E
wait $M
tar czf "$OUT/corpus$RUN.tgz" -C "$CORP" HEADER conv.log embbwd.json embbwd.log 2>/dev/null
wait $S
cat "$CORP/HEADER"; cat "$CORP/embbwd.log"; tail -3 "$CORP/conv.log"; tail -45 /tmp/svc.log
ls -la "$OUT" "$OUT/svc"
