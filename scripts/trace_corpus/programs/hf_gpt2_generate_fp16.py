"""transformers GPT2LMHeadModel (6 layers) cast with .half(): greedy model.generate(), 24 new tokens, KV cache."""
import argparse
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=8)
p.add_argument("--prompt", type=int, default=64)
p.add_argument("--new", type=int, default=24)
args = p.parse_args()

torch.manual_seed(0)
config = GPT2Config(n_layer=6)
model = GPT2LMHeadModel(config).half().cuda() if device == "cuda" else GPT2LMHeadModel(config)
model.eval()

prompt = torch.randint(0, config.vocab_size, (args.batch, args.prompt), device=device)
out = model.generate(
    prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=args.new,
    min_new_tokens=args.new, do_sample=False, pad_token_id=config.eos_token_id,
)
if device == "cuda":
    torch.cuda.synchronize()
