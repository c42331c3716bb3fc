#!/usr/bin/env bash
# Device run b: live-service ground truth (collect.py) and the transformers memory re-recorded
# with static caches left eager, side by side on one H200. Run from the repo root with
# devcarry/vramroom present; COMMIT names the commit. Results land in $OUT.
set -u
export PYTHONUNBUFFERED=1
mkdir -p /tmp/meta /tmp/svc /tmp/hf
echo "commit ${COMMIT:-?}" > /tmp/meta/HEADER
nvidia-smi -L >> /tmp/meta/HEADER
(timeout 500 python3 scripts/hf_memory.py /tmp/hf > /tmp/meta/hf_driver.log 2>&1; echo "hf rc $?" >> /tmp/meta/hf_driver.log) &
HF=$!
timeout 520 python3 scripts/services/collect.py devcarry/vramroom /tmp/svc > /tmp/meta/collect.log 2>&1
echo "collect rc $?" >> /tmp/meta/collect.log
wait $HF
cp /tmp/svc/services.jsonl /tmp/meta/ 2>/dev/null
for s in bert gpt2 resnet; do
  mkdir -p /tmp/meta/$s
  cp /tmp/svc/$s/*.txt /tmp/svc/$s/*.log /tmp/svc/$s/ramp.json /tmp/meta/$s/ 2>/dev/null
  for p in /tmp/svc/$s/*.pickle; do [ -f "$p" ] && cp "$p" /tmp/svc/${s}__$(basename $p); done
done
cp /tmp/hf/*.jsonl /tmp/hf/*.log /tmp/meta/ 2>/dev/null
python3 scripts/corpus/pack.py "$OUT" svc 3 15.8 /tmp/svc/*__*.pickle
python3 scripts/corpus/pack.py "$OUT" hf 2 15.8 /tmp/hf/hf_snaps/*.pickle
cp "$OUT"/*-left.txt /tmp/meta/ 2>/dev/null; rm -f "$OUT"/*-left.txt
tar czf "$OUT/meta.tgz" -C /tmp/meta .
ls -la "$OUT"; tail -3 /tmp/meta/collect.log; tail -12 /tmp/meta/hf_driver.log
