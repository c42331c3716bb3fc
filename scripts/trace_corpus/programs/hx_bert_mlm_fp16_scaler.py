"""Written for device run 24: transformers' BERT (6 layers) masked-LM training under fp16
autocast with a GradScaler (unscale, inf checks, skipped steps), AdamW."""
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
cfg = transformers.BertConfig(num_hidden_layers=6)
model = transformers.BertForMaskedLM(cfg).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
scaler = torch.amp.GradScaler("cuda", enabled=device == "cuda")
for step in range(args.steps):
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device=device)
    labels = ids.clone()
    labels[:, ::2] = -100
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(input_ids=ids, token_type_ids=torch.zeros_like(ids), labels=labels).loss
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
