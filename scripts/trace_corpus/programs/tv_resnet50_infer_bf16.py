"""torchvision resnet50 inference with the model cast to bfloat16 (model.to(torch.bfloat16)), no_grad."""
import argparse
import os

import torch
import torchvision

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=64)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

torch.manual_seed(0)
model = torchvision.models.resnet50(weights=None).to(device)
model = model.to(torch.bfloat16).eval()

with torch.no_grad():
    for step in range(args.steps):
        x = torch.randn(args.batch, 3, 224, 224, device=device, dtype=torch.bfloat16)
        out = model(x)
        preds = out.float().argmax(dim=1)
if device == "cuda":
    torch.cuda.synchronize()
