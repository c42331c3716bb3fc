#!/usr/bin/env bash
# Device run 27 (issue 30): isin, reductions over another dtype and cuDNN attention's forward
# workspace by query length (trace_corpus/ops/measure.py --set run27), then six programs written
# for this run (hn_*: encoder-decoder beam search, sampling with a repetition penalty, a masked
# loss, padded BERT, left-padded Qwen2, Llama with checkpointing) recorded as the corpus is
# (record_real.py --all: default, expandable, capacity sweep). On the device, from the
# repository root:
#   COMMIT=abc1234 OUT=$OUT bash scripts/device_run27.sh
# Writes $OUT/HEADER, $OUT/ops-h100-run27.json, $OUT/real27/ (results.jsonl, summary.txt,
# snaps.tar.xz) and logs.
OUT=${OUT:-/tmp/run27}
mkdir -p "$OUT"
mkdir -p devcarry && echo "${COMMIT:-?}" > devcarry/COMMIT
bash scripts/device_header.sh 27 > "$OUT/HEADER" 2>&1
# OPS_BUDGET and REC_BUDGET (seconds) shorten the run when little device time is left
OPS_BUDGET=${OPS_BUDGET:-120}
REC_BUDGET=${REC_BUDGET:-280}
(cd scripts/trace_corpus && timeout $((OPS_BUDGET + 40)) python3 ops/measure.py "$OUT/ops-h100-run27.json" \
  --budget "$OPS_BUDGET" --set run27) > "$OUT/ops.log" 2>&1
tail -3 "$OUT/ops.log"
(cd scripts/trace_corpus && timeout $((REC_BUDGET + 90)) python3 record_real.py --all --out "$OUT/real27" --jobs 6 \
  --budget "$REC_BUDGET" --programs hn_t5_beam_generate,hn_llama_sample_reppen_bf16,hn_lm_masked_loss_train,hn_bert_padded_infer_fp16,hn_qwen2_greedy_fp16,hn_llama_train_ckpt_bf16) \
  > "$OUT/record.log" 2>&1
tail -25 "$OUT/record.log"
rm -rf "$OUT/real27/snaps"
ls -la "$OUT" "$OUT/real27"
