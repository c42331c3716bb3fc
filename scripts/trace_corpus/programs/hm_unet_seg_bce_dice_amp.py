"""Written for device run 46, traced before it ran (blind): a small 2-d U-Net (two 3x3 convs
with BatchNorm per level, max-pool down, ConvTranspose2d up, skip concatenation) for binary
segmentation, BCEWithLogits plus a soft Dice loss, fp16 autocast with a GradScaler, Adam;
batch 8 of 3 x 192 x 192, 3 steps. Its convs are not in the measured table (blind for
convnn.py's nearest-neighbour workspaces too)."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)


def block(i, o):
    return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(inplace=True),
                         nn.Conv2d(o, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(inplace=True))


class UNet(nn.Module):
    def __init__(self, ch=(24, 48, 96, 192)):
        super().__init__()
        self.downs = nn.ModuleList()
        c = 3
        for o in ch:
            self.downs.append(block(c, o))
            c = o
        self.ups = nn.ModuleList()
        self.upconv = nn.ModuleList()
        for o in reversed(ch[:-1]):
            self.upconv.append(nn.ConvTranspose2d(c, o, 2, stride=2))
            self.ups.append(block(2 * o, o))
            c = o
        self.head = nn.Conv2d(c, 1, 1)

    def forward(self, x):
        skips = []
        for i, d in enumerate(self.downs):
            x = d(x)
            if i < len(self.downs) - 1:
                skips.append(x)
                x = F.max_pool2d(x, 2)
        for up, blk in zip(self.upconv, self.ups):
            x = blk(torch.cat([up(x), skips.pop()], 1))
        return self.head(x)


model = UNet().to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cuda", enabled=device == "cuda")
for step in range(3):
    x = torch.randn(8, 3, 192, 192, device=device)
    y = (torch.rand(8, 1, 192, 192, device=device) > 0.5).float()
    with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=device == "cuda"):
        logits = model(x)
        bce = F.binary_cross_entropy_with_logits(logits, y)
    p = torch.sigmoid(logits.float())
    dice = 1 - (2 * (p * y).sum((1, 2, 3)) + 1) / (p.sum((1, 2, 3)) + y.sum((1, 2, 3)) + 1)
    loss = bce + dice.mean()
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
print(float(loss))
