"""torchvision efficientnet_b0 training under bf16 autocast, AdamW (fused), batch 48, 3 steps."""
import argparse
import os

import torch
import torch.nn.functional as F
import torchvision

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=48)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

torch.manual_seed(0)
model = torchvision.models.efficientnet_b0(weights=None).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device == "cuda")
model.train()
for step in range(args.steps):
    x = torch.randn(args.batch, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (args.batch,), device=device)
    with torch.autocast("cuda" if device == "cuda" else "cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
if device == "cuda":
    torch.cuda.synchronize()
