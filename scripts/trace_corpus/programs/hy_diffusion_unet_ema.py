"""Written for device run 29: a small diffusion U-Net (GroupNorm, SiLU, a timestep embedding,
self-attention at the lowest resolution through F.scaled_dot_product_attention, nearest
upsampling) trained to predict noise with MSE, bf16 autocast, AdamW, and an EMA copy of the
weights updated with torch._foreach_lerp_ after every step; batch 16 at 64 x 64, 3 steps."""
import copy
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
on = device == "cuda"
torch.manual_seed(0)


class Res(nn.Module):
    def __init__(self, i, o, temb):
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(8, i), nn.Conv2d(i, o, 3, padding=1)
        self.t = nn.Linear(temb, o)
        self.n2, self.c2 = nn.GroupNorm(8, o), nn.Conv2d(o, o, 3, padding=1)
        self.skip = nn.Conv2d(i, o, 1) if i != o else nn.Identity()

    def forward(self, x, t):
        h = self.c1(F.silu(self.n1(x))) + self.t(t)[:, :, None, None]
        return self.skip(x) + self.c2(F.silu(self.n2(h)))


class Attn(nn.Module):
    def __init__(self, c, heads=4):
        super().__init__()
        self.heads, self.norm = heads, nn.GroupNorm(8, c)
        self.qkv, self.out = nn.Conv2d(c, 3 * c, 1), nn.Conv2d(c, c, 1)

    def forward(self, x):
        b, c, hh, ww = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, self.heads, c // self.heads, hh * ww).unbind(1)
        o = F.scaled_dot_product_attention(q.transpose(-1, -2), k.transpose(-1, -2), v.transpose(-1, -2))
        return x + self.out(o.transpose(-1, -2).reshape(b, c, hh, ww))


class UNet(nn.Module):
    def __init__(self, ch=64, temb=256):
        super().__init__()
        self.temb = temb
        self.tmlp = nn.Sequential(nn.Linear(temb, temb), nn.SiLU(), nn.Linear(temb, temb))
        self.inp = nn.Conv2d(3, ch, 3, padding=1)
        self.d1, self.d2, self.d3 = Res(ch, ch, temb), Res(ch, 2 * ch, temb), Res(2 * ch, 4 * ch, temb)
        self.mid, self.attn = Res(4 * ch, 4 * ch, temb), Attn(4 * ch)
        self.u3, self.u2, self.u1 = Res(8 * ch, 2 * ch, temb), Res(4 * ch, ch, temb), Res(2 * ch, ch, temb)
        self.outp = nn.Sequential(nn.GroupNorm(8, ch), nn.SiLU(), nn.Conv2d(ch, 3, 3, padding=1))

    def forward(self, x, t):
        half = self.temb // 2
        f = torch.exp(-math.log(10000) * torch.arange(half, device=x.device) / half)
        e = self.tmlp(torch.cat([torch.sin(t[:, None] * f), torch.cos(t[:, None] * f)], 1))
        h1 = self.d1(self.inp(x), e)
        h2 = self.d2(F.avg_pool2d(h1, 2), e)
        h3 = self.d3(F.avg_pool2d(h2, 2), e)
        m = self.attn(self.mid(F.avg_pool2d(h3, 2), e))
        u = self.u3(torch.cat([F.interpolate(m, scale_factor=2.0, mode="nearest"), h3], 1), e)
        u = self.u2(torch.cat([F.interpolate(u, scale_factor=2.0, mode="nearest"), h2], 1), e)
        u = self.u1(torch.cat([F.interpolate(u, scale_factor=2.0, mode="nearest"), h1], 1), e)
        return self.outp(u)


model = UNet().to(device)
ema = copy.deepcopy(model).requires_grad_(False)
opt = torch.optim.AdamW(model.parameters(), lr=2e-4)
betas = torch.linspace(1e-4, 0.02, 1000, device=device)
abar = torch.cumprod(1 - betas, 0)
for step in range(3):
    x0 = torch.randn(16, 3, 64, 64, device=device)
    t = torch.randint(0, 1000, (16,), device=device)
    noise = torch.randn_like(x0)
    a = abar[t][:, None, None, None]
    xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=on):
        loss = F.mse_loss(model(xt, t.float()), noise)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        torch._foreach_lerp_(list(ema.parameters()), list(model.parameters()), 0.001)
print(float(loss))
