#!/usr/bin/env bash
# Device run 29 (issue 30): nineteen programs written for this run before any was compared
# (hy_*: ResNet-50 AMP channels_last with fused AdamW and clipping, GPT-2 with frozen blocks,
# padded BERT classification with a GradScaler and a schedule, a hand-written decoder LM with
# the single-tensor AdamW, a conv VAE, a diffusion U-Net with an EMA, ViT bf16 inference and
# nn.TransformerEncoder/MultiheadAttention on their inference fast paths, Qwen2 with in-place
# zeroing, OPT sampling with num_return_sequences, CLIP's contrastive loss, BLOOM's ALiBi, a
# hand-written KV-cache sampling loop, reentrant checkpoint_sequential, a pinned DataLoader,
# a DPO-style loss over three index tensors, transformers' Trainer, accelerate's loop,
# ResNet-18 under cudnn.benchmark)
# and, since the session after it, the reductions of ops/measure.py --set run30
# recorded as the corpus is (record_real.py --all: default, expandable, capacity sweep);
# then the convs of these programs the measured table lacks (conv/convs_run29.json,
# conv/measure.py). The recording runs first: it is what the corpus needs most, and a run
# cut short keeps it.
# Before it, here: python3 -m pip download -q --no-deps accelerate==1.16.0 -d devcarry/wheels
# On the device, from the repository root (run's carry: ["devcarry"]):
#   COMMIT=abc1234 OUT=$OUT bash scripts/device_run29.sh
OUT=${OUT:-/tmp/run29}
mkdir -p "$OUT"
mkdir -p devcarry && echo "${COMMIT:-?}" > devcarry/COMMIT
bash scripts/device_header.sh 29 > "$OUT/HEADER" 2>&1
# transformers' Trainer and hy_accelerate_mlp_bf16 need accelerate, which the device may lack
# and cannot download: its wheel travels in devcarry/wheels (carry it)
python3 -c "import accelerate" 2>/dev/null || python3 -m pip install -q --no-deps devcarry/wheels/accelerate-*.whl >> "$OUT/HEADER" 2>&1
python3 -c "import accelerate; print('accelerate', accelerate.__version__)" >> "$OUT/HEADER" 2>&1
CONV_BUDGET=${CONV_BUDGET:-60}
REC_BUDGET=${REC_BUDGET:-300}
OPS_BUDGET=${OPS_BUDGET:-40}
PROGS=$(cd scripts/trace_corpus/programs && ls hy_*.py | sed 's/\.py$//' | paste -sd, -)
cd scripts/trace_corpus
timeout $((REC_BUDGET + 90)) python3 record_real.py --all --out "$OUT/real29" --jobs 6 \
  --budget "$REC_BUDGET" --programs "$PROGS" > "$OUT/record.log" 2>&1
tail -30 "$OUT/record.log"
rm -rf "$OUT/real29/snaps"
# the reductions whose partials are not one float, and logsumexp's temporaries (ops/measure.py
# --set run30): small calls, 784 of them
timeout $((OPS_BUDGET + 25)) python3 ops/measure.py "$OUT/ops-run30.json" --set run30 \
  --budget "$OPS_BUDGET" > "$OUT/ops.log" 2>&1
tail -2 "$OUT/ops.log"
if [ -s conv/convs_run29.json ]; then
  timeout $((CONV_BUDGET + 30)) python3 conv/measure.py conv/convs_run29.json "$OUT/convs-run29.json" \
    --budget "$CONV_BUDGET" > "$OUT/conv.log" 2>&1
  tail -2 "$OUT/conv.log"
fi
ls -la "$OUT" "$OUT/real29"
