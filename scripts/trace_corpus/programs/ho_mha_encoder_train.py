"""Written after the tracer's fixes of run 14 (device run 18): a small encoder of
nn.MultiheadAttention + LayerNorm + MLP blocks, trained with AdamW (foreach) and gradient
clipping, fp32."""
import argparse
import os

import torch
import torch.nn as nn

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=16)
p.add_argument("--seq", type=int, default=256)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()


class Block(nn.Module):
    def __init__(self, d=512, h=8):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, h, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        y = self.ln1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


torch.manual_seed(0)
model = nn.Sequential(*[Block() for _ in range(4)], nn.LayerNorm(512), nn.Linear(512, 1000)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(args.steps):
    x = torch.randn(args.batch, args.seq, 512, device=device)
    y = torch.randint(0, 1000, (args.batch, args.seq), device=device)
    loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
