"""PLANTED MISTAKE (a): evaluation without no_grad keeps every batch's outputs, so their autograd graphs (saved activations) stay alive; clean twin: clean_a_infer_no_grad.py."""
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
for step in range(args.steps):
    x = torch.randn(args.batch, 3, 224, 224, device=device)
    logits = model(x)  # no torch.no_grad(): the graph is recorded
    all_logits.append(logits)
predictions = torch.cat(all_logits).argmax(1)
if device == "cuda":
    torch.cuda.synchronize()
