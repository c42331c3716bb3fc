"""Written for device run 24: torchvision's ResNet-50 in channels_last, trained under bf16
autocast with SGD and momentum, batch 32 at 224 x 224."""
import argparse
import os

import torch
import torchvision

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=32)
p.add_argument("--steps", type=int, default=2)
args = p.parse_args()

torch.manual_seed(0)
model = torchvision.models.resnet50().to(device).to(memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for step in range(args.steps):
    x = torch.randn(args.batch, 3, 224, 224, device=device).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (args.batch,), device=device)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
