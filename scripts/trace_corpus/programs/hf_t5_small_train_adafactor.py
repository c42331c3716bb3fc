"""transformers T5ForConditionalGeneration (small config, random weights): seq2seq training step with labels, Adafactor, batch 16, 3 steps."""
import argparse
import os

import torch
from transformers import T5Config, T5ForConditionalGeneration
from transformers.optimization import Adafactor

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=16)
p.add_argument("--src", type=int, default=256)
p.add_argument("--tgt", type=int, default=64)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

torch.manual_seed(0)
config = T5Config(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8,
                  decoder_start_token_id=0, pad_token_id=0)
model = T5ForConditionalGeneration(config).to(device)
optimizer = Adafactor(model.parameters(), lr=1e-3, relative_step=False, scale_parameter=False)
model.train()
for step in range(args.steps):
    src = torch.randint(0, config.vocab_size, (args.batch, args.src), device=device)
    tgt = torch.randint(0, config.vocab_size, (args.batch, args.tgt), device=device)
    loss = model(input_ids=src, attention_mask=torch.ones_like(src), labels=tgt).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
if device == "cuda":
    torch.cuda.synchronize()
