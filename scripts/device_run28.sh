#!/usr/bin/env bash
# Device run 28 (issue 30): cuDNN attention's split-KV decode workspace by batch, heads, key
# length and mask (trace_corpus/ops/measure.py --set run28); which SDPA backend PyTorch picks
# inside real programs and why the others refuse (sdpa_probe/hook.py, T5's masks with a head
# dim among them); the convs of this run's programs the measured table lacks
# (conv/convs_run28.json, conv/measure.py); then eight programs written for this run (hq_*)
# recorded as the corpus is (record_real.py --all: default, expandable, capacity sweep), with
# five more written after a sweep of untried models (hq_mixtral_moe: transformers' MoE experts
# on torch's grouped GEMM; hr_*: Falcon, Gemma's head dim 256, Phi, RoBERTa). The recording
# runs first: it is what the corpus needs most, and a run cut short keeps it.
# On the device, from the repository root:
#   COMMIT=abc1234 OUT=$OUT bash scripts/device_run28.sh
OUT=${OUT:-/tmp/run28}
mkdir -p "$OUT"
mkdir -p devcarry && echo "${COMMIT:-?}" > devcarry/COMMIT
bash scripts/device_header.sh 28 > "$OUT/HEADER" 2>&1
OPS_BUDGET=${OPS_BUDGET:-40}
HOOK_BUDGET=${HOOK_BUDGET:-80}
CONV_BUDGET=${CONV_BUDGET:-40}
REC_BUDGET=${REC_BUDGET:-300}
PROGS=hq_bart_beam_fp16,hq_mistral_train_bf16_fused,hq_resnet34_amp_scaler,hq_vit_hf_cls_adamw,hq_gpt2_train_eval_loop,hq_bert_qa_ckpt_accum_bf16,hq_mobilenet_v2_infer_fp16_batches,hq_llama_long_prompt_generate,hq_mixtral_moe_fp32_bf16,hr_falcon_train_fp16_generate,hr_gemma_bf16_train_hd256,hr_phi_eval_perplexity,hr_roberta_cls_autocast_bf16
cd scripts/trace_corpus
timeout $((REC_BUDGET + 90)) python3 record_real.py --all --out "$OUT/real28" --jobs 6 \
  --budget "$REC_BUDGET" --programs "$PROGS" > "$OUT/record.log" 2>&1
tail -30 "$OUT/record.log"
rm -rf "$OUT/real28/snaps"
timeout $((OPS_BUDGET + 40)) python3 ops/measure.py "$OUT/ops-run28.json" --budget "$OPS_BUDGET" \
  --set run28 > "$OUT/ops.log" 2>&1
tail -2 "$OUT/ops.log"
timeout "$HOOK_BUDGET" python3 sdpa_probe/hook.py "$OUT/sdpa-hook-run28.json" hn_t5_beam_generate \
  hx_t5_train_bf16 hq_bart_beam_fp16 hq_vit_hf_cls_adamw hq_bert_qa_ckpt_accum_bf16 \
  hq_mistral_train_bf16_fused hq_llama_long_prompt_generate ho_mha_encoder_train \
  hf_t5_small_train_adafactor hr_gemma_bf16_train_hd256 hq_mixtral_moe_fp32_bf16 \
  hr_phi_eval_perplexity > "$OUT/hook.log" 2>&1
tail -2 "$OUT/hook.log"
timeout 60 python3 sdpa_probe/probe.py "$OUT/sdpa-probe-run28.json" > "$OUT/probe.log" 2>&1
tail -2 "$OUT/probe.log"
if [ -s conv/convs_run28.json ]; then
  timeout $((CONV_BUDGET + 30)) python3 conv/measure.py conv/convs_run28.json "$OUT/convs-run28.json" \
    --budget "$CONV_BUDGET" > "$OUT/conv.log" 2>&1
  tail -2 "$OUT/conv.log"
fi
ls -la "$OUT" "$OUT/real28"
