"""PLANTED MISTAKE (c): training loop appends each step's logits and loss (not detached, no .item()) to Python lists, a floor that grows every step; clean twin: clean_c_history_detached.py."""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=2048)
p.add_argument("--classes", type=int, default=32000)
p.add_argument("--steps", type=int, default=4)
args = p.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 2048), nn.GELU(), nn.Linear(2048, args.classes)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

history_logits = []
history_loss = []
for step in range(args.steps):
    x = torch.randn(args.batch, 1024, device=device)
    y = torch.randint(0, args.classes, (args.batch,), device=device)
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    history_logits.append(logits)  # kept for "metrics later": the whole logits tensor stays
    history_loss.append(loss)
accuracy = torch.stack([l.argmax(1) for l in history_logits]).float().mean()
if device == "cuda":
    torch.cuda.synchronize()
