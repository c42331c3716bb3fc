"""Written for device run 46, traced before it ran (blind): torchvision's ResNet-18 in
channels_last at 160 x 160, mixup (a Beta draw on the host, a randperm on the GPU) with
label smoothing 0.1, SGD with Nesterov momentum and a cosine schedule, bf16 autocast;
batch 64, 3 steps."""
import os

import torch
import torch.nn.functional as F
import torchvision

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
model = torchvision.models.resnet18(num_classes=100).to(device).to(
    memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True,
                      weight_decay=5e-5)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 100)
beta = torch.distributions.Beta(0.2, 0.2)
for step in range(3):
    x = torch.randn(64, 3, 160, 160, device=device).to(memory_format=torch.channels_last)
    y = torch.randint(0, 100, (64,), device=device)
    lam = float(beta.sample())
    perm = torch.randperm(64, device=device)
    x = lam * x + (1 - lam) * x[perm]
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        out = model(x)
        loss = lam * F.cross_entropy(out, y, label_smoothing=0.1) + \
            (1 - lam) * F.cross_entropy(out, y[perm], label_smoothing=0.1)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    sched.step()
print(float(loss))
