"""torchvision resnet50 inference, fp32, torch.inference_mode(), CPU batches moved with .to(device)."""
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
model = torchvision.models.resnet50(weights=None)
model = model.to(device).eval()

results = []
with torch.inference_mode():
    for step in range(args.steps):
        images = torch.rand(args.batch, 3, 224, 224)  # as a DataLoader would give them
        images = images.to(device)
        images = (images - 0.45) / 0.225
        out = model(images)
        top5 = out.topk(5, dim=1).indices
        results.append(top5)
if device == "cuda":
    torch.cuda.synchronize()
