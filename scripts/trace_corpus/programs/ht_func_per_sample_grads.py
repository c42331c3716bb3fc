"""Written for device run 40: per-sample gradients with torch.func (vmap over grad of a
functional_call), as differential privacy does: a small CNN on 28 x 28 images, batch 64,
each sample's gradient clipped to norm 1, summed with Gaussian noise and applied by SGD,
3 steps."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Flatten(), nn.Linear(32 * 7 * 7, 10)).to(device)
params = {k: v.detach() for k, v in model.named_parameters()}


def loss_one(p, x, y):
    out = functional_call(model, p, (x.unsqueeze(0),))
    return F.cross_entropy(out, y.unsqueeze(0))


per_sample = vmap(grad(loss_one), in_dims=(None, 0, 0))
for step in range(3):
    x = torch.randn(64, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (64,), device=device)
    g = per_sample(params, x, y)
    norms = torch.stack([v.flatten(1).norm(dim=1) for v in g.values()], 1).norm(dim=1)
    factor = (1.0 / (norms + 1e-6)).clamp(max=1.0)
    for k in params:
        s = (g[k] * factor.view(-1, *[1] * (g[k].dim() - 1))).sum(0)
        s = s + torch.randn_like(s) * 1.0
        params[k] = params[k] - 0.1 * s / 64
print(float(norms.mean()))
