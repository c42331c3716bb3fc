"""Clean twin of mistake_a: the same evaluation under torch.no_grad(), outputs kept in a list."""
import argparse
import os

import torch
import torchvision

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=16)
p.add_argument("--steps", type=int, default=4)
args = p.parse_args()

torch.manual_seed(0)
model = torchvision.models.resnet50(weights=None).to(device)
model.eval()

all_logits = []
with torch.no_grad():
    for step in range(args.steps):
        x = torch.randn(args.batch, 3, 224, 224, device=device)
        logits = model(x)
        all_logits.append(logits)
predictions = torch.cat(all_logits).argmax(1)
if device == "cuda":
    torch.cuda.synchronize()
