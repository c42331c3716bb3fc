"""Written for device run 18: torchvision's Swin-T (random weights) serving batches of images
under torch.inference_mode in fp16."""
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
model = torchvision.models.swin_t().to(device).half().eval()
with torch.inference_mode():
    for step in range(args.steps):
        x = torch.randn(args.batch, 3, 224, 224, device=device, dtype=torch.float16)
        top = model(x).softmax(-1).topk(5)
