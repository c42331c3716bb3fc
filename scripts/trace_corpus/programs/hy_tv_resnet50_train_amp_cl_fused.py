"""Written for device run 29: torchvision ResNet-50 trained under fp16 autocast with a
GradScaler, channels_last inputs and model, AdamW(fused=True), gradients clipped after
unscale_, batch 24 at 192 x 192, 3 steps."""
import argparse
import os

import torch
import torchvision

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=24)
p.add_argument("--res", type=int, default=192)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

torch.manual_seed(0)
on = device == "cuda"
model = torchvision.models.resnet50(num_classes=200).to(device, memory_format=torch.channels_last)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=on)
scaler = torch.amp.GradScaler("cuda", enabled=on)
for step in range(args.steps):
    x = torch.randn(args.batch, 3, args.res, args.res, device=device).to(memory_format=torch.channels_last)
    y = torch.randint(0, 200, (args.batch,), device=device)
    with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=on):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
print(float(loss))
