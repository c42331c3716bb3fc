"""Written for device run 46, traced before it ran (blind): DDPM ancestral sampling, 40
steps, of a small conv denoiser with sinusoidal time embeddings and GroupNorm in fp16,
under no_grad; batch 16 of 3 x 64 x 64 (a loop of forwards, no backward)."""
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)


class Res(nn.Module):
    def __init__(self, c, t):
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(8, c), nn.Conv2d(c, c, 3, padding=1)
        self.t = nn.Linear(t, c)
        self.n2, self.c2 = nn.GroupNorm(8, c), nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x, te):
        h = self.c1(F.silu(self.n1(x))) + self.t(te)[:, :, None, None]
        return x + self.c2(F.silu(self.n2(h)))


class Denoiser(nn.Module):
    def __init__(self, c=64, t=128):
        super().__init__()
        self.t = t
        self.inp = nn.Conv2d(3, c, 3, padding=1)
        self.mlp = nn.Sequential(nn.Linear(t, t), nn.SiLU(), nn.Linear(t, t))
        self.blocks = nn.ModuleList(Res(c, t) for _ in range(4))
        self.out = nn.Conv2d(c, 3, 3, padding=1)

    def forward(self, x, step):
        half = self.t // 2
        f = torch.exp(-math.log(10000) * torch.arange(half, device=x.device) / half)
        a = step[:, None].float() * f[None]
        te = self.mlp(torch.cat([a.sin(), a.cos()], 1).to(x.dtype))
        h = self.inp(x)
        for b in self.blocks:
            h = b(h, te)
        return self.out(h)


T = 40
betas = torch.linspace(1e-4, 0.02, T, device=device)
alphas = 1 - betas
abar = torch.cumprod(alphas, 0)
model = Denoiser().to(device).half().eval()
with torch.no_grad():
    x = torch.randn(16, 3, 64, 64, device=device, dtype=torch.float16)
    for t in reversed(range(T)):
        eps = model(x, torch.full((16,), t, device=device))
        mean = (x - betas[t] / (1 - abar[t]).sqrt() * eps) / alphas[t].sqrt()
        x = mean + (betas[t].sqrt() * torch.randn_like(x) if t > 0 else 0)
print(x.shape)
