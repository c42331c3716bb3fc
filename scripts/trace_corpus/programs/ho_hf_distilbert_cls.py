"""Written for device run 18: transformers' DistilBERT for sequence classification (random
weights, default config), fine-tuned with AdamW and a linear warmup schedule, under bf16
autocast."""
import argparse
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=16)
p.add_argument("--seq", type=int, default=256)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.DistilBertConfig(num_labels=3)
model = transformers.DistilBertForSequenceClassification(cfg).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
sched = transformers.get_linear_schedule_with_warmup(opt, 10, 100)
for step in range(args.steps):
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device=device)
    mask = torch.ones_like(ids)
    labels = torch.randint(0, 3, (args.batch,), device=device)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad()
