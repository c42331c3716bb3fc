"""Tiny LM with a 128k-token embedding and untied head: cross-entropy over a large vocab, dense embedding backward, AdamW."""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=8)
p.add_argument("--seq", type=int, default=512)
p.add_argument("--vocab", type=int, default=128_000)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()


class TinyLM(nn.Module):
    def __init__(self, vocab, d=512):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.mix = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        h = self.embed(ids)
        h = h + self.mix(h)
        return self.lm_head(h)


torch.manual_seed(0)
model = TinyLM(args.vocab).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

for step in range(args.steps):
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    logits = model(inputs)
    loss = F.cross_entropy(logits.reshape(-1, args.vocab), targets.reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
if device == "cuda":
    torch.cuda.synchronize()
