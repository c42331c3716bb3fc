"""Written for device run 45, traced before it ran (blind): ESPCN-style 3x super-resolution
(5x5 and 3x3 convs with tanh, a sub-pixel conv into F.pixel_shuffle), L1 loss against the
high-resolution target, Adam; batch 16 of 3 x 96 x 96 crops upscaled to 288, 3 steps."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
r = 3
model = nn.Sequential(nn.Conv2d(3, 64, 5, padding=2), nn.Tanh(),
                      nn.Conv2d(64, 32, 3, padding=1), nn.Tanh(),
                      nn.Conv2d(32, 3 * r * r, 3, padding=1), nn.PixelShuffle(r)).to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(3):
    lr_img = torch.rand(16, 3, 96, 96, device=device)
    hr_img = torch.rand(16, 3, 96 * r, 96 * r, device=device)
    loss = F.l1_loss(model(lr_img), hr_img)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(float(loss))
