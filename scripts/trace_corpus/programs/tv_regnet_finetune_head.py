"""torchvision regnet_y_400mf fine-tuning: the backbone frozen (requires_grad False), a new head trained with Adam, batch 64, 3 steps."""
import argparse
import os

import torch
import torch.nn as nn
import torchvision

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=64)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

torch.manual_seed(0)
model = torchvision.models.regnet_y_400mf(weights=None)
for prm in model.parameters():
    prm.requires_grad_(False)
model.fc = nn.Linear(model.fc.in_features, 37)
model = model.to(device)
optimizer = torch.optim.Adam(model.fc.parameters(), lr=1e-3)
model.train()
for step in range(args.steps):
    x = torch.randn(args.batch, 3, 224, 224, device=device)
    y = torch.randint(0, 37, (args.batch,), device=device)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
if device == "cuda":
    torch.cuda.synchronize()
