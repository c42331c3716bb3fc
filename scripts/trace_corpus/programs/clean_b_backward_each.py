"""Clean twin of mistake_b: gradient accumulation with (loss / accum).backward() on every micro-batch, one optimizer step."""
import argparse
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=4)
p.add_argument("--seq", type=int, default=512)
p.add_argument("--accum", type=int, default=4)
p.add_argument("--steps", type=int, default=2)
args = p.parse_args()

torch.manual_seed(0)
config = GPT2Config(n_layer=6)
model = GPT2LMHeadModel(config).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

model.train()
for step in range(args.steps):
    for micro in range(args.accum):
        ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), device=device)
        loss = model(input_ids=ids, labels=ids).loss
        (loss / args.accum).backward()
    optimizer.step()
    optimizer.zero_grad()
if device == "cuda":
    torch.cuda.synchronize()
