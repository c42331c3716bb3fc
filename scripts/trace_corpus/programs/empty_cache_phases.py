"""Two phases: resnet18 training at batch 96, then del + torch.cuda.empty_cache(), then no_grad evaluation at batch 256."""
import argparse
import os

import torch
import torch.nn.functional as F
import torchvision

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=96)
p.add_argument("--eval-batch", type=int, default=256)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

torch.manual_seed(0)
model = torchvision.models.resnet18(weights=None).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

model.train()
for step in range(args.steps):
    x = torch.randn(args.batch, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (args.batch,), device=device)
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

# free the optimizer state and the cached blocks before evaluation
del optimizer, loss, x, y
torch.cuda.empty_cache()

model.eval()
with torch.no_grad():
    for step in range(2):
        x = torch.randn(args.eval_batch, 3, 224, 224, device=device)
        preds = model(x).argmax(1)
torch.cuda.empty_cache()
if device == "cuda":
    torch.cuda.synchronize()
