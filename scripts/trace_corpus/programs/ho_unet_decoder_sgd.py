"""Written for device run 18: a small U-Net-like segmentation net (conv, BatchNorm, max pool,
ConvTranspose2d, bilinear upsampling, GroupNorm, skip concatenation), SGD with momentum,
per-pixel cross-entropy, fp32."""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=8)
p.add_argument("--size", type=int, default=128)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()


def cbr(i, o):
    return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(inplace=True))


class UNet(nn.Module):
    def __init__(self, classes=5):
        super().__init__()
        self.e1, self.e2, self.e3 = cbr(3, 32), cbr(32, 64), cbr(64, 128)
        self.up2 = nn.ConvTranspose2d(128, 64, 2, stride=2)
        self.d2 = nn.Sequential(nn.Conv2d(128, 64, 3, padding=1), nn.GroupNorm(8, 64), nn.ReLU())
        self.d1 = nn.Sequential(nn.Conv2d(96, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.ReLU())
        self.head = nn.Conv2d(32, classes, 1)

    def forward(self, x):
        a = self.e1(x)
        b = self.e2(F.max_pool2d(a, 2))
        c = self.e3(F.max_pool2d(b, 2))
        d = self.d2(torch.cat([self.up2(c), b], 1))
        d = F.interpolate(d, scale_factor=2, mode="bilinear", align_corners=False)
        return self.head(self.d1(torch.cat([d, a], 1)))


torch.manual_seed(0)
model = UNet().to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
for step in range(args.steps):
    x = torch.randn(args.batch, 3, args.size, args.size, device=device)
    y = torch.randint(0, 5, (args.batch, args.size, args.size), device=device)
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
