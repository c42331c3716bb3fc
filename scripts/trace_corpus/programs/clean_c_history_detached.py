"""Clean twin of mistake_c: keeps only detached per-step loss and accuracy scalars, no growing floor."""
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

history_acc = []
history_loss = []
for step in range(args.steps):
    x = torch.randn(args.batch, 1024, device=device)
    y = torch.randint(0, args.classes, (args.batch,), device=device)
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    history_acc.append((logits.detach().argmax(1) == y).float().mean())
    history_loss.append(loss.detach())
accuracy = torch.stack(history_acc).mean()
if device == "cuda":
    torch.cuda.synchronize()
