"""Written for device run 29: a plain CNN of 8 conv blocks run through
torch.utils.checkpoint.checkpoint_sequential in 4 segments with use_reentrant=True (the
older default), SGD with momentum, fp32, batch 32 at 96 x 96, 3 steps."""
import os

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint_sequential

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)


def block(i, o, stride):
    return nn.Sequential(nn.Conv2d(i, o, 3, stride, 1, bias=False), nn.BatchNorm2d(o), nn.ReLU())


chs = [(3, 32, 1), (32, 64, 2), (64, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2),
       (256, 256, 1), (256, 256, 1)]
body = nn.Sequential(*[block(*c) for c in chs]).to(device)
head = nn.Linear(256, 10).to(device)
opt = torch.optim.SGD(list(body.parameters()) + list(head.parameters()), lr=0.1, momentum=0.9)
for step in range(3):
    x = torch.randn(32, 3, 96, 96, device=device, requires_grad=True)
    y = torch.randint(0, 10, (32,), device=device)
    h = checkpoint_sequential(body, 4, x, use_reentrant=True)
    loss = nn.functional.cross_entropy(head(h.mean((2, 3))), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
print(float(loss))
