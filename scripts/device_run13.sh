#!/usr/bin/env bash
# Device run 13: issue 32's service corpus and issue 30's trace corpus, side by side on one
# GPU in one call (device time is scarce): the services (scripts/services/gpu_run_d.sh),
# the conv measurement (scripts/trace_corpus/conv/measure.py) and the corpus programs with
# their capacity sweep (scripts/trace_corpus/record_real.py). Memory is per process, so one
# does not change another's numbers; only their timings share the cores.
#
#   bash scripts/device_run13.sh      # on the GPU, repo root; devcarry/{vramroom,COMMIT}
#
# $OUT (8 files): svc/{HEADER,run_d.jsonl,summary.txt,results.tgz,logs.tgz},
# snaps.tar.xz (the corpus snapshots), conv_events_sm90.json, corpus.tgz (HEADER,
# results.jsonl, summary.txt, record.log, conv.log). Under 9 minutes.
set -u
export PYTHONUNBUFFERED=1
C=$(cat devcarry/COMMIT 2>/dev/null || echo '?')
OUT=${OUT:-/tmp/run13}
CORP=/tmp/corp
rm -rf "$CORP"; mkdir -p "$OUT/svc" "$CORP"
bash scripts/device_header.sh "13" > "$CORP/HEADER" 2>&1
(OUT=$OUT/svc COMMIT=$C VRAMROOM=devcarry/vramroom RUN_D_BUDGET_S=400 RUN_D_DEADLINE_S=450 \
   bash scripts/services/gpu_run_d.sh > /tmp/svc.log 2>&1) & S=$!
(cd scripts/trace_corpus && timeout 300 python3 conv/measure.py conv/convs.json \
   "$OUT/conv_events_sm90.json" --budget 240 > "$CORP/conv.log" 2>&1) & M=$!
(cd scripts/trace_corpus && timeout 470 python3 record_real.py --all --out "$CORP/real" --jobs 4 \
   --budget 350 > "$CORP/record.log" 2>&1) & R=$!
wait $M; wait $R
mv "$CORP/real/snaps.tar.xz" "$OUT/" 2>/dev/null
cp "$CORP/real/results.jsonl" "$CORP/real/summary.txt" "$CORP/" 2>/dev/null
tar czf "$OUT/corpus.tgz" -C "$CORP" HEADER results.jsonl summary.txt record.log conv.log 2>/dev/null
wait $S
cat "$CORP/HEADER"; tail -2 "$CORP/conv.log"; tail -40 "$CORP/record.log"; tail -45 /tmp/svc.log
ls -la "$OUT" "$OUT/svc"
