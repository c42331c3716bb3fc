"""torchvision mobilenet_v3_large training with fp16 autocast and torch.amp.GradScaler, SGD momentum."""
import argparse
import os

import torch
import torch.nn as nn
import torchvision

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=64)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

torch.manual_seed(0)
model = torchvision.models.mobilenet_v3_large(weights=None).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
scaler = torch.amp.GradScaler(device)
criterion = nn.CrossEntropyLoss()

model.train()
for step in range(args.steps):
    x = torch.randn(args.batch, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (args.batch,), device=device)
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device, dtype=torch.float16):
        out = model(x)
        loss = criterion(out, y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
if device == "cuda":
    torch.cuda.synchronize()
