"""torchvision vit_b_16 training step with bf16 autocast and AdamW (foreach default), batch 16."""
import argparse
import os

import torch
import torch.nn.functional as F
import torchvision

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=16)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

torch.manual_seed(0)
model = torchvision.models.vit_b_16(weights=None).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)

model.train()
for step in range(args.steps):
    x = torch.randn(args.batch, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (args.batch,), device=device)
    with torch.autocast("cuda" if device == "cuda" else "cpu", dtype=torch.bfloat16):
        logits = model(x)
        loss = F.cross_entropy(logits, y, label_smoothing=0.1)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
if device == "cuda":
    torch.cuda.synchronize()
