"""transformers GPT2LMHeadModel (8 layers) training with model.gradient_checkpointing_enable(), AdamW."""
import argparse
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=8)
p.add_argument("--seq", type=int, default=512)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

torch.manual_seed(0)
config = GPT2Config(n_layer=8, use_cache=False)
model = GPT2LMHeadModel(config)
model.gradient_checkpointing_enable()
model.to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

model.train()
for step in range(args.steps):
    batch = torch.randint(0, config.vocab_size, (args.batch, args.seq), device=device)
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
if device == "cuda":
    torch.cuda.synchronize()
