"""Written for device run 24: transformers' GPT-2 (4 layers) trained on 16 x 512 tokens in
two micro-batches of 8, gradient clipping (clip_grad_norm_) before a fused AdamW step."""
import argparse
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=8)
p.add_argument("--seq", type=int, default=512)
p.add_argument("--accum", type=int, default=2)
p.add_argument("--steps", type=int, default=2)
args = p.parse_args()

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.GPT2Config(n_layer=4)
model = transformers.GPT2LMHeadModel(cfg).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device == "cuda")
for step in range(args.steps):
    for _ in range(args.accum):
        ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device=device)
        loss = model(input_ids=ids, labels=ids).loss / args.accum
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
