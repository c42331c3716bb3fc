"""MLP regression trained with torch.optim.Adam(capturable=True) (step counters on the device), fp32."""
import argparse
import os

import torch
import torch.nn as nn

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=1024)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

torch.manual_seed(0)
model = nn.Sequential(
    nn.Linear(2048, 8192), nn.SiLU(), nn.Linear(8192, 8192), nn.SiLU(), nn.Linear(8192, 2048)
).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, capturable=(device == "cuda"))

for step in range(args.steps):
    x = torch.randn(args.batch, 2048, device=device)
    target = torch.randn(args.batch, 2048, device=device)
    loss = nn.functional.smooth_l1_loss(model(x), target)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
if device == "cuda":
    torch.cuda.synchronize()
