"""Written for device run 28: torchvision MobileNetV2 in fp16 inference under no_grad over
batches of 1, 8, 32 and 8 again at 224 x 224, softmax and top-5 of each."""
import argparse
import os

import torch
import torchvision

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batches", default="1,8,32,8")
args = p.parse_args()

torch.manual_seed(0)
model = torchvision.models.mobilenet_v2().to(device=device, dtype=torch.float16).eval()
tops = []
with torch.no_grad():
    for b in [int(s) for s in args.batches.split(",")]:
        x = torch.randn(b, 3, 224, 224, device=device, dtype=torch.float16)
        probs = model(x).float().softmax(-1)
        tops.append(probs.topk(5, dim=-1).indices)
print([t.shape for t in tops])
