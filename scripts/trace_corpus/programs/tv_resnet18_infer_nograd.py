"""torchvision resnet18 inference, fp32, under torch.no_grad(), batch 64, 3 batches."""
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
model = torchvision.models.resnet18(weights=None).to(device)
model.eval()

with torch.no_grad():
    for step in range(args.steps):
        x = torch.randn(args.batch, 3, 224, 224, device=device)
        logits = model(x)
        probs = logits.softmax(dim=1)
        preds = probs.argmax(dim=1)
if device == "cuda":
    torch.cuda.synchronize()
