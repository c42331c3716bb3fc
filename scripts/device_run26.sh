#!/usr/bin/env bash
# Device run 26 (issue 30): what sort, topk, multinomial, cumsum and accumulating index_put_
# allocate besides their outputs (trace_corpus/ops/measure.py), then four programs written for
# them (hs_*) recorded as the corpus is (record_real.py --all: default, expandable, capacity
# sweep). On the device, from the repository root:
#   COMMIT=abc1234 OUT=$OUT bash scripts/device_run26.sh
# Writes $OUT/HEADER, $OUT/ops-h100-run26.json, $OUT/real26/ (results.jsonl, summary.txt,
# snaps.tar.xz) and logs.
OUT=${OUT:-/tmp/run26}
mkdir -p "$OUT"
mkdir -p devcarry && echo "${COMMIT:-?}" > devcarry/COMMIT
bash scripts/device_header.sh 26 > "$OUT/HEADER" 2>&1
(cd scripts/trace_corpus && timeout 200 python3 ops/measure.py "$OUT/ops-h100-run26.json" \
  --budget 150) > "$OUT/ops.log" 2>&1
tail -2 "$OUT/ops.log"
(cd scripts/trace_corpus && timeout 330 python3 record_real.py --all --out "$OUT/real26" --jobs 4 \
  --budget 240 --programs hs_gpt2_sample_topk_topp,hs_retrieval_topk_sort,hs_llama_beam_bf16,hs_gnn_index_train) \
  > "$OUT/record.log" 2>&1
tail -25 "$OUT/record.log"
rm -rf "$OUT/real26/snaps"
ls -la "$OUT" "$OUT/real26"
