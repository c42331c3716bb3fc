"""Hand-written causal transformer calling F.scaled_dot_product_attention directly, bf16 autocast training, AdamW."""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=8)
p.add_argument("--seq", type=int, default=1024)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=-1)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab=8192, d=512, layers=6, heads=8, max_len=2048):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        return self.head(self.ln(self.blocks(x)))


torch.manual_seed(0)
model = GPT().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95))

for step in range(args.steps):
    idx = torch.randint(0, 8192, (args.batch, args.seq), device=device)
    with torch.autocast(device_type="cuda" if device == "cuda" else "cpu", dtype=torch.bfloat16):
        logits = model(idx)
    loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), idx.roll(-1, 1).view(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
if device == "cuda":
    torch.cuda.synchronize()
