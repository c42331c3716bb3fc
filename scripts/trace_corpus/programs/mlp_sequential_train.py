"""Plain nn.Sequential MLP training loop, fp32, Adam, printing loss.item() each step (the corpus's one .item() user)."""
import argparse
import os

import torch
import torch.nn as nn

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=512)
p.add_argument("--steps", type=int, default=4)
args = p.parse_args()

torch.manual_seed(0)
model = nn.Sequential(
    nn.Linear(1024, 4096), nn.ReLU(),
    nn.Linear(4096, 4096), nn.ReLU(),
    nn.Dropout(0.1),
    nn.Linear(4096, 4096), nn.GELU(),
    nn.Linear(4096, 10),
).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()

for step in range(args.steps):
    x = torch.randn(args.batch, 1024, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
