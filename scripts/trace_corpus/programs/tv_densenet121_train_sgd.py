"""torchvision densenet121 training, fp32, SGD with momentum, batch 24, 2 steps (many concatenations)."""
import argparse
import os

import torch
import torch.nn as nn
import torchvision

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=24)
p.add_argument("--steps", type=int, default=2)
args = p.parse_args()

torch.manual_seed(0)
model = torchvision.models.densenet121(weights=None).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
model.train()
for step in range(args.steps):
    x = torch.randn(args.batch, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (args.batch,), device=device)
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
if device == "cuda":
    torch.cuda.synchronize()
