"""Written for device run 32: a hand-written decoder LM with torch.nn.RMSNorm, SwiGLU MLPs
and causal F.scaled_dot_product_attention under bf16 autocast; cross-entropy plus a
logsumexp z-loss on the logits; fused AdamW; gradients clipped; batch 4 x 256, 3 steps."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
V, D, H, L, T = 8000, 512, 8, 4, 256


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.n1, self.n2 = nn.RMSNorm(D), nn.RMSNorm(D)
        self.qkv, self.o = nn.Linear(D, 3 * D, bias=False), nn.Linear(D, D, bias=False)
        self.w1, self.w3 = nn.Linear(D, 1408, bias=False), nn.Linear(D, 1408, bias=False)
        self.w2 = nn.Linear(1408, D, bias=False)

    def forward(self, x):
        B = x.shape[0]
        q, k, v = self.qkv(self.n1(x)).view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, D))
        h = self.n2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.norm, self.head = nn.RMSNorm(D), nn.Linear(D, V, bias=False)

    def forward(self, ids):
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))


model = LM().to(device)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device == "cuda")
for step in range(3):
    ids = torch.randint(0, V, (4, T + 1), device=device)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        logits = model(ids[:, :-1])
    logits = logits.float()
    ce = F.cross_entropy(logits.view(-1, V), ids[:, 1:].reshape(-1))
    z = torch.logsumexp(logits, dim=-1).pow(2).mean()
    (ce + 1e-4 * z).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(ce))
