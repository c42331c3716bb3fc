"""transformers GPT2LMHeadModel (4 layers) training, fp32, AdamW(fused=True)."""
import argparse
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=8)
p.add_argument("--seq", type=int, default=256)
p.add_argument("--layers", type=int, default=4)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

torch.manual_seed(0)
config = GPT2Config(n_layer=args.layers)
model = GPT2LMHeadModel(config).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01, fused=True)

model.train()
for step in range(args.steps):
    input_ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), device=device)
    outputs = model(input_ids=input_ids, labels=input_ids)
    loss = outputs.loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
if device == "cuda":
    torch.cuda.synchronize()
