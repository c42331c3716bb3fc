"""Written for device run 45, traced before it ran (blind): torchvision's video ResNet
r3d_18 (Conv3d throughout, 10 classes) trained on clips of 8 frames at 112 x 112 under fp16
autocast with a GradScaler, SGD with momentum; batch 4, 3 steps."""
import os

import torch
import torch.nn.functional as F
import torchvision

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
model = torchvision.models.video.r3d_18(num_classes=10).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
scaler = torch.amp.GradScaler("cuda", enabled=device == "cuda")
for step in range(3):
    x = torch.randn(4, 3, 8, 112, 112, device=device)
    y = torch.randint(0, 10, (4,), device=device)
    with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=device == "cuda"):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
print(float(loss))
