"""Written for device run 45, traced before it ran (blind): a spatial transformer network, a
localisation CNN regressing a 2 x 3 affine matrix (F.affine_grid, F.grid_sample bilinear,
zeros padding) in front of a small classifier, Adam; batch 64 of 1 x 96 x 96, 3 steps, then
an evaluation batch of 256 under no_grad."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)


class STN(nn.Module):
    def __init__(self):
        super().__init__()
        self.loc = nn.Sequential(nn.Conv2d(1, 16, 7), nn.MaxPool2d(2), nn.ReLU(),
                                 nn.Conv2d(16, 32, 5), nn.MaxPool2d(2), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(512, 64),
                                 nn.ReLU(), nn.Linear(64, 6))
        nn.init.zeros_(self.loc[-1].weight)
        with torch.no_grad():
            self.loc[-1].bias.copy_(torch.tensor([1.0, 0, 0, 0, 1, 0]))
        self.cls = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Flatten(), nn.Linear(64 * 24 * 24, 10))

    def forward(self, x):
        theta = self.loc(x).view(-1, 2, 3)
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        return self.cls(F.grid_sample(x, grid, align_corners=False))


model = STN().to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(3):
    x = torch.randn(64, 1, 96, 96, device=device)
    y = torch.randint(0, 10, (64,), device=device)
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
model.eval()
with torch.no_grad():
    pred = model(torch.randn(256, 1, 96, 96, device=device)).argmax(1)
print(float(loss), pred.shape)
