"""Written for device run 32: a small segmentation net (conv encoder, bilinear F.interpolate
up, skip concat, GroupNorm), cross_entropy over [N, C, H, W] logits with ignore_index and
class weights, AdamW (foreach), fp32, batch 8 at 128 x 128, 3 steps."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
K = 21


def block(i, o):
    return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.GroupNorm(8, o), nn.ReLU())


class Seg(nn.Module):
    def __init__(self):
        super().__init__()
        self.e1, self.e2, self.e3 = block(3, 32), block(32, 64), block(64, 128)
        self.d2, self.d1 = block(128 + 64, 64), block(64 + 32, 32)
        self.head = nn.Conv2d(32, K, 1)

    def forward(self, x):
        a = self.e1(x)
        b = self.e2(F.max_pool2d(a, 2))
        c = self.e3(F.max_pool2d(b, 2))
        c = F.interpolate(c, scale_factor=2, mode="bilinear", align_corners=False)
        b = self.d2(torch.cat([c, b], 1))
        b = F.interpolate(b, scale_factor=2, mode="bilinear", align_corners=False)
        return self.head(self.d1(torch.cat([b, a], 1)))


model = Seg().to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
weight = torch.linspace(0.5, 1.5, K, device=device)
for step in range(3):
    x = torch.randn(8, 3, 128, 128, device=device)
    y = torch.randint(0, K, (8, 128, 128), device=device)
    y[:, :8] = 255
    loss = F.cross_entropy(model(x), y, weight=weight, ignore_index=255)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
