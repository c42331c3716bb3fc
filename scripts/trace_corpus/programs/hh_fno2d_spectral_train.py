"""Written for device run 46, traced before it ran (blind): a 2-d Fourier neural operator
(four spectral convolutions: rfft2 of the 64 x 64 field, complex weights on the lowest 16 x 16
modes by einsum, irfft2 back, plus a pointwise Conv2d), GELU, MSE, Adam; batch 16 of 32
channels, 3 steps."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)


class Spectral(nn.Module):
    def __init__(self, c, m):
        super().__init__()
        self.m = m
        self.w1 = nn.Parameter(torch.randn(c, c, m, m, dtype=torch.cfloat) / c)
        self.w2 = nn.Parameter(torch.randn(c, c, m, m, dtype=torch.cfloat) / c)

    def forward(self, x):
        b, c, h, w = x.shape
        xf = torch.fft.rfft2(x)
        out = torch.zeros(b, c, h, w // 2 + 1, dtype=torch.cfloat, device=x.device)
        m = self.m
        out[:, :, :m, :m] = torch.einsum("bixy,ioxy->boxy", xf[:, :, :m, :m], self.w1)
        out[:, :, -m:, :m] = torch.einsum("bixy,ioxy->boxy", xf[:, :, -m:, :m], self.w2)
        return torch.fft.irfft2(out, s=(h, w))


class FNO(nn.Module):
    def __init__(self, c=32, m=16):
        super().__init__()
        self.lift = nn.Conv2d(3, c, 1)
        self.spec = nn.ModuleList(Spectral(c, m) for _ in range(4))
        self.point = nn.ModuleList(nn.Conv2d(c, c, 1) for _ in range(4))
        self.proj = nn.Conv2d(c, 1, 1)

    def forward(self, x):
        x = self.lift(x)
        for s, p in zip(self.spec, self.point):
            x = F.gelu(s(x) + p(x))
        return self.proj(x)


model = FNO().to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(3):
    a = torch.randn(16, 3, 64, 64, device=device)
    u = torch.randn(16, 1, 64, 64, device=device)
    loss = F.mse_loss(model(a), u)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(float(loss))
