"""Written for device run 40: a ViT-style encoder built from nn.MultiheadAttention with
need_weights=True (averaged attention maps, so the math path, not SDPA's fused kernels),
pre-norm blocks, a key padding mask, and an attention-entropy regulariser on the returned
weights; AdamW (fused), batch 32 x 197 tokens of 384, 6 heads, 4 blocks, 3 steps."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, h, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, pad):
        h = self.n1(x)
        a, w = self.attn(h, h, h, key_padding_mask=pad, need_weights=True)
        x = x + a
        return x + self.mlp(self.n2(x)), w


blocks = nn.ModuleList(Block(384, 6) for _ in range(4)).to(device)
head = nn.Linear(384, 10).to(device)
params = list(blocks.parameters()) + list(head.parameters())
opt = torch.optim.AdamW(params, lr=3e-4, fused=True)
for step in range(3):
    x = torch.randn(32, 197, 384, device=device)
    pad = torch.zeros(32, 197, dtype=torch.bool, device=device)
    pad[:, 180:] = True
    ent = 0
    for b in blocks:
        x, w = b(x, pad)
        ent = ent - (w.clamp_min(1e-9).log() * w).sum(-1).mean()
    loss = F.cross_entropy(head(x[:, 0]), torch.randint(0, 10, (32,), device=device)) + \
        1e-3 * ent
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
