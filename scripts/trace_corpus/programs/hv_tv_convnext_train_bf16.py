"""Written for device run 37: torchvision convnext_tiny trained under bf16 autocast with
label-smoothed cross-entropy, AdamW (foreach) with weight decay, batch 16 at 160 x 160,
3 steps."""
import os

import torch
import torch.nn.functional as F
import torchvision

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
model = torchvision.models.convnext_tiny(num_classes=100).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
for step in range(3):
    x = torch.randn(16, 3, 160, 160, device=device)
    y = torch.randint(0, 100, (16,), device=device)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
