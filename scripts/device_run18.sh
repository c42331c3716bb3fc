#!/usr/bin/env bash
# Device run 18: six programs written after the tracer's last fixes (scripts/trace_corpus/
# programs/ho_*.py: nn.MultiheadAttention training, a U-Net with ConvTranspose2d and
# GroupNorm, EmbeddingBag under fp16 AMP, gather/scatter/einsum, DistilBERT fine-tuning
# under bf16, Swin-T fp16 inference), recorded as the corpus is (record_real.py: default,
# expandable_segments and the capacity sweep), and beside them more of the resolution convs
# (conv/measure.py from config 1585 of convs_res.json).
#
#   bash scripts/device_run18.sh      # on the GPU, repo root; devcarry/COMMIT
#
# $OUT: HEADER, results.jsonl, summary.txt, snaps.tar.xz, record.log, conv_res_events.json,
# conv.log. Under 7 minutes.
set -u
export PYTHONUNBUFFERED=1
C=$(cat devcarry/COMMIT 2>/dev/null || echo '?')
OUT=${OUT:-/tmp/run18}
mkdir -p "$OUT"
bash scripts/device_header.sh "18" > "$OUT/HEADER" 2>&1
PROGS=ho_mha_encoder_train,ho_unet_decoder_sgd,ho_recsys_embbag_amp,ho_gather_scatter_einsum,ho_hf_distilbert_cls,ho_tv_swin_infer
(cd scripts/trace_corpus && timeout 380 python3 conv/measure.py conv/convs_res.json \
   "$OUT/conv_res_events.json" --skip 1585 --budget 330 > "$OUT/conv.log" 2>&1) & M=$!
(cd scripts/trace_corpus && timeout 390 python3 record_real.py --all --programs "$PROGS" \
   --out /tmp/real18 --jobs 6 --budget 300 > "$OUT/record.log" 2>&1)
cp /tmp/real18/results.jsonl /tmp/real18/summary.txt /tmp/real18/snaps.tar.xz "$OUT/" 2>/dev/null
wait $M
cat "$OUT/HEADER"; tail -30 "$OUT/record.log"; tail -2 "$OUT/conv.log"; ls -la "$OUT"
