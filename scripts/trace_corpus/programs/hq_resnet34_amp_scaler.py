"""Written for device run 28: torchvision ResNet-34 trained under fp16 autocast with a
GradScaler, SGD with Nesterov momentum and weight decay, 3 steps of batch 32 at 160 x 160,
then one eval batch under no_grad."""
import argparse
import os

import torch
import torchvision

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=32)
p.add_argument("--res", type=int, default=160)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

torch.manual_seed(0)
model = torchvision.models.resnet34(num_classes=100).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
scaler = torch.amp.GradScaler("cuda", enabled=device == "cuda")
loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
model.train()
for step in range(args.steps):
    x = torch.randn(args.batch, 3, args.res, args.res, device=device)
    y = torch.randint(0, 100, (args.batch,), device=device)
    with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=device == "cuda"):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
model.eval()
with torch.no_grad(), torch.autocast(device_type="cuda", dtype=torch.float16, enabled=device == "cuda"):
    acc = (model(torch.randn(args.batch, 3, args.res, args.res, device=device)).argmax(1) == y).float().mean()
print(float(loss), float(acc))
