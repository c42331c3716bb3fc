"""Small hand-written CNN, gradient accumulation over 4 micro-batches per SGD(momentum) step, 2 steps."""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=64)
p.add_argument("--accum", type=int, default=4)
p.add_argument("--steps", type=int, default=2)
args = p.parse_args()


class Net(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(64)
        self.conv2 = nn.Conv2d(64, 128, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(128)
        self.conv3 = nn.Conv2d(128, 256, 3, padding=1)
        self.bn3 = nn.BatchNorm2d(256)
        self.fc = nn.Linear(256, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = F.relu(self.bn3(self.conv3(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


torch.manual_seed(0)
model = Net().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

for step in range(args.steps):
    optimizer.zero_grad()
    for micro in range(args.accum):
        x = torch.randn(args.batch, 3, 128, 128, device=device)
        y = torch.randint(0, 10, (args.batch,), device=device)
        loss = F.cross_entropy(model(x), y) / args.accum
        loss.backward()
    optimizer.step()
if device == "cuda":
    torch.cuda.synchronize()
