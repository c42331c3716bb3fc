"""torchvision convnext_tiny cast to fp16, inference under torch.no_grad(), batch 32, 3 batches."""
import argparse
import os

import torch
import torchvision

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=32)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

torch.manual_seed(0)
model = torchvision.models.convnext_tiny(weights=None).half().to(device).eval()
with torch.no_grad():
    for step in range(args.steps):
        x = torch.randn(args.batch, 3, 224, 224, device=device, dtype=torch.float16)
        top = model(x).float().softmax(-1).topk(5).indices
if device == "cuda":
    torch.cuda.synchronize()
