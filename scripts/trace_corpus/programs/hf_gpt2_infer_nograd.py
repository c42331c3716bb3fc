"""transformers GPT2LMHeadModel (6 layers, random init) inference, fp32, no_grad, batch 8 x 512 tokens."""
import argparse
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=8)
p.add_argument("--seq", type=int, default=512)
p.add_argument("--layers", type=int, default=6)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

torch.manual_seed(0)
config = GPT2Config(n_layer=args.layers, n_positions=1024)
model = GPT2LMHeadModel(config).to(device)
model.eval()

with torch.no_grad():
    for step in range(args.steps):
        input_ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), device=device)
        out = model(input_ids)
        next_token = out.logits[:, -1, :].argmax(dim=-1)
if device == "cuda":
    torch.cuda.synchronize()
