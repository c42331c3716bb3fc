"""Stack of nn.TransformerEncoderLayer blocks, each under torch.utils.checkpoint.checkpoint(use_reentrant=False), AdamW."""
import argparse
import os

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=16)
p.add_argument("--seq", type=int, default=512)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()


class Encoder(nn.Module):
    def __init__(self, d=768, layers=8, heads=12):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, batch_first=True, norm_first=True)
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 1)

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return self.head(self.norm(x)).squeeze(-1)


torch.manual_seed(0)
model = Encoder().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

for step in range(args.steps):
    x = torch.randn(args.batch, args.seq, 768, device=device)
    target = torch.randn(args.batch, args.seq, device=device)
    loss = nn.functional.mse_loss(model(x), target)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
if device == "cuda":
    torch.cuda.synchronize()
