"""Written for device run 35: a text-conditioned denoiser: conv blocks with GroupNorm and SiLU,
sinusoidal timestep embeddings, cross-attention from image tokens to a text context through
nn.MultiheadAttention (training: not the fast path), fp16 autocast with a GradScaler,
AdamW(fused=True), batch 16 at 32 x 32 latents with 4 channels, 3 steps."""
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
on = device == "cuda"
torch.manual_seed(0)
C, T, E = 128, 77, 256


def timestep_embedding(t, dim):
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Conv2d(4, C, 3, padding=1)
        self.temb = nn.Sequential(nn.Linear(C, C), nn.SiLU(), nn.Linear(C, C))
        self.b1 = nn.Sequential(nn.GroupNorm(32, C), nn.SiLU(), nn.Conv2d(C, C, 3, padding=1))
        self.attn = nn.MultiheadAttention(C, 4, kdim=E, vdim=E, batch_first=True)
        self.b2 = nn.Sequential(nn.GroupNorm(32, C), nn.SiLU(), nn.Conv2d(C, C, 3, padding=1))
        self.out = nn.Conv2d(C, 4, 3, padding=1)

    def forward(self, x, t, ctx):
        h = self.inp(x) + self.temb(timestep_embedding(t, C))[:, :, None, None]
        h = h + self.b1(h)
        B, _, H, W = h.shape
        tok = h.flatten(2).transpose(1, 2)
        a, _ = self.attn(tok, ctx, ctx, need_weights=False)
        h = h + a.transpose(1, 2).reshape(B, C, H, W)
        return self.out(h + self.b2(h))


net = Net().to(device)
opt = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=on)
scaler = torch.amp.GradScaler("cuda", enabled=on)
for step in range(3):
    x0 = torch.randn(16, 4, 32, 32, device=device)
    ctx = torch.randn(16, T, E, device=device)
    t = torch.randint(0, 1000, (16,), device=device)
    noise = torch.randn_like(x0)
    with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=on):
        pred = net(x0 + noise, t, ctx)
        loss = F.mse_loss(pred.float(), noise)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
print(float(loss))
