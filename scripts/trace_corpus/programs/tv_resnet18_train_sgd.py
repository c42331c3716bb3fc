"""torchvision resnet18 training, fp32, SGD with momentum and weight decay, batch 64, 3 steps."""
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
model = torchvision.models.resnet18(weights=None, num_classes=100).to(device)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)

model.train()
for step in range(args.steps):
    images = torch.randn(args.batch, 3, 224, 224, device=device)
    labels = torch.randint(0, 100, (args.batch,), device=device)
    optimizer.zero_grad()
    outputs = model(images)
    loss = criterion(outputs, labels)
    loss.backward()
    optimizer.step()
if device == "cuda":
    torch.cuda.synchronize()
